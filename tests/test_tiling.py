"""Striped execution (toolchain.lower.tiling): chains of windowed ops run stripe by stripe,
bit-exact against LiteRT in runtime_py and in C, and a stripe plan that is unsafe by one row
fails."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

import toolchain.lower.plan as plan_module
from runtime_py.interpreter import ArenaInterpreter
from tests.conftest import tflm_head_figures
from tests.opcheck import assert_matches_oracle, assert_varied
from tests.test_mcu import mcu_tools, needs_mcu  # noqa: F401 (the fixture needs_mcu uses)
from toolchain.c.generate import generate
from toolchain.cli import main
from toolchain.errors import PlanError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model, read_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import check_plan, random_inputs
from toolchain.lab.qemu_backend import QemuBackend
from toolchain.lower.plan import Techniques, plan_model
from toolchain.lower.tiling import ROW_BY_ROW, stripe_runs
from toolchain.planners import verify

SHARED = Path(__file__).resolve().parents[2] / "shared" / "models"


def mobilenet_stem() -> bytes:
    """A MobileNet-like stem: the wide pointwise output is the peak unless it is striped."""
    b = ModelBuilder("int8", seed=7)
    x = b.input("x", (1, 24, 20, 3), "int8", scale=0.05, zero_point=-3)
    y = b.conv_2d(x, 8, 3, stride=2, activation="RELU6")
    y = b.depthwise_conv_2d(y, 3, activation="RELU6")
    y = b.conv_2d(y, 32, 1, activation="RELU6")
    y = b.depthwise_conv_2d(y, 3, stride=2, activation="RELU6")
    y = b.max_pool_2d(y, 2, 1, "SAME")
    y = b.conv_2d(y, 8, 1)
    b.output(b.softmax(b.reshape(b.average_pool_2d(y, (6, 5), 1, "VALID"), (1, 8))))
    return b.build()


def residual_block() -> bytes:
    """Two 3x3 convolutions and a skip ADD of the block's input, then a strided block with a
    1x1 strided shortcut: the input is read by two branches."""
    b = ModelBuilder("int8", seed=11)
    x = b.input("x", (1, 16, 12, 4), "int8", scale=0.04, zero_point=2)
    s = b.conv_2d(x, 16, 3, activation="RELU")
    y = b.conv_2d(s, 16, 3, activation="RELU")
    y = b.conv_2d(y, 16, 3)
    r = b.add(s, y, activation="RELU")
    a = b.conv_2d(r, 16, 3, stride=2, activation="RELU")
    a = b.conv_2d(a, 16, 3)
    c = b.conv_2d(r, 16, 1, stride=2)
    r = b.add(c, a, activation="RELU")
    r = b.average_pool_2d(r, 3, 1, "SAME")
    b.output(b.softmax(b.reshape(b.average_pool_2d(r, (8, 6), 1, "VALID"), (1, 16))))
    return b.build()


def striped_plan(data: bytes, techniques: Techniques | None = None):
    model = parse_model(data, "built.tflite")
    techniques = techniques or Techniques()
    mp = plan_model(model, techniques=techniques)
    plain = plan_model(model, techniques=replace(techniques, tiling="off"))
    assert mp.tiling.segments, "the chain should be striped"
    assert mp.arena_bytes < plain.arena_bytes
    assert mp.overlap_bound_bytes <= mp.arena_bytes and mp.untiled_bound_bytes is not None
    return mp, plain


def float_pool_chain() -> bytes:
    """float32: a dilated convolution, average and max pooling with SAME padding, a MUL."""
    b = ModelBuilder("float32", seed=5)
    x = b.input("x", (1, 20, 9, 6), "float32")
    y = b.conv_2d(x, 24, 3, dilation=2, activation="RELU")
    y = b.average_pool_2d(y, 3, 1, "SAME")
    y = b.max_pool_2d(y, 3, 2, "SAME")
    y = b.conv_2d(y, 4, 3)
    b.output(b.reshape(y, (1, 10 * 5 * 4)))
    return b.build()


def int16_chain() -> bytes:
    """16x8: a convolution, a depthwise convolution and max pooling."""
    b = ModelBuilder("int16", seed=3)
    x = b.input("x", (1, 18, 8, 4), "int16", scale=0.002)
    y = b.conv_2d(x, 32, 3, activation="RELU")
    y = b.depthwise_conv_2d(y, 3, stride=2)
    y = b.max_pool_2d(y, 3, 1, "SAME")
    b.output(b.conv_2d(y, 4, 1))
    return b.build()


def strided_pointwise() -> bytes:
    """A 1x1 convolution read by a strided 1x1 convolution: the rows between its windows are
    never needed, so no stripe makes them."""
    b = ModelBuilder("int8", seed=9)
    x = b.input("x", (1, 15, 7, 6), "int8", scale=0.05, zero_point=3)
    y = b.conv_2d(x, 40, 1, activation="RELU")
    y = b.conv_2d(y, 8, 1, stride=2)
    y = b.depthwise_conv_2d(y, 3, stride=2)
    b.output(b.reshape(y, (1, 4 * 2 * 8)))
    return b.build()


def ds_cnn() -> bytes:
    """A keyword-spotting DS-CNN: a tall strided first convolution, then depthwise and pointwise
    pairs, every output a little below its input: the shifts of a run of them stack."""
    b = ModelBuilder("int8", seed=5)
    x = b.input("x", (1, 25, 8, 1), "int8", scale=0.05, zero_point=-3)
    y = b.conv_2d(x, 16, (10, 4), stride=2, activation="RELU")
    for _ in range(3):
        y = b.depthwise_conv_2d(y, 3, activation="RELU")
        y = b.conv_2d(y, 16, 1, activation="RELU")
    b.output(b.softmax(b.reshape(b.average_pool_2d(y, (13, 4), 1, "VALID"), (1, 16))))
    return b.build()


@pytest.mark.parametrize("build", [mobilenet_stem, residual_block, float_pool_chain, int16_chain,
                                   strided_pointwise, ds_cnn])
def test_striped_chain_matches_litert_in_runtime_py_and_c(build):
    data = build()
    striped_plan(data)
    assert_varied(data)
    assert_matches_oracle(data, planner="best", striped=True)


def float_global_pool() -> bytes:
    """float32 into a global average pool: its sums must add in the whole window's order."""
    b = ModelBuilder("float32", seed=21)
    x = b.input("x", (1, 14, 9, 3), "float32")
    y = b.conv_2d(x, 8, 3, activation="RELU")
    y = b.depthwise_conv_2d(y, 3)
    b.output(b.reshape(b.average_pool_2d(y, (14, 9), 1, "VALID"), (1, 8)))
    return b.build()


def int8_global_average() -> bytes:
    """int8 into a global average pool, on channels the DSP kernels take four at a time."""
    b = ModelBuilder("int8", seed=24)
    x = b.input("x", (1, 18, 6, 2), "int8", scale=0.05, zero_point=-3)
    y = b.conv_2d(x, 16, 3, activation="RELU6")
    y = b.depthwise_conv_2d(y, 3, activation="RELU6")
    b.output(b.softmax(b.reshape(b.average_pool_2d(y, (18, 6), 1, "VALID"), (1, 16))))
    return b.build()


def uint8_global_max() -> bytes:
    """uint8 into a global max pool."""
    b = ModelBuilder("uint8", seed=22)
    x = b.input("x", (1, 16, 7, 2), "uint8", scale=0.04, zero_point=128)
    y = b.conv_2d(x, 12, 3, stride=2, activation="RELU6")
    y = b.depthwise_conv_2d(y, 3, activation="RELU6")
    b.output(b.reshape(b.max_pool_2d(y, (8, 4), 1, "VALID"), (1, 12)))
    return b.build()


def dense_on_rows(dtype: str) -> Callable[[], bytes]:
    """A convolution read whole by a dense layer, as micro_speech's (int8: per-channel weights;
    uint8: a filter zero point)."""
    def build() -> bytes:
        b = ModelBuilder(dtype, seed=23)
        x = b.input("x", (1, 21, 10, 1), dtype, scale=0.05,
                    zero_point=128 if dtype == "uint8" else -3)
        y = b.conv_2d(x, 8, (6, 4), stride=2, activation="RELU")
        b.output(b.softmax(b.fully_connected(y, 5, flatten=True)))
        return b.build()
    build.__name__ = f"{dtype}_dense_on_rows"
    return build


REDUCED = [ds_cnn, int8_global_average, float_global_pool, uint8_global_max,
           dense_on_rows("int8"), dense_on_rows("uint8")]


@pytest.mark.parametrize("build", REDUCED, ids=[b.__name__ for b in REDUCED])
def test_a_segment_adds_up_its_last_ops_input_stripe_by_stripe(build):
    """A global pool or a dense layer ends a segment: its input never exists whole, only one
    stripe's rows and the accumulators after them, and the arena is smaller than with that
    input held (as --max-arena plans it); bit-exact in runtime_py and in C."""
    data = build()
    mp, _ = striped_plan(data)
    (segment,) = [s for s in mp.tiling.segments if s.reduces]
    added = segment.buffers[-1]
    assert added.accumulator and added.rows < mp.graph.tensors[added.tensor].shape[1]
    assert added.tensor not in mp.lifetimes.tensor_buffers
    held = plan_model(parse_model(data, "built.tflite"),
                      techniques=Techniques(extra_stripes=False))
    assert not any(s.reduces for s in held.tiling.segments)
    assert mp.arena_bytes < held.arena_bytes
    assert_matches_oracle(data, planner="best", striped=True)


def test_a_dense_layer_of_a_rank_one_output_is_not_added_up():
    """A dense layer writing a vector (no rows) plans whole after the convolution's segment."""
    b = ModelBuilder("int8", seed=3)
    x = b.input("x", (1, 12, 6, 1), "int8", scale=0.05, zero_point=-3)
    y = b.conv_2d(x, 4, 3, activation="RELU")
    rng = np.random.default_rng(0)
    w = b.const("w", rng.integers(-127, 128, (3, 12 * 6 * 4)).astype(np.int8), 0.01, 0)
    bias = b.const("bias", rng.integers(-50, 50, 3).astype(np.int32), 0.0005, 0)
    out = b.tensor("out", (3,), "int8", 0.1, 0)
    b.op("FULLY_CONNECTED", [y, w, bias], [out])
    b.output(out)
    mp = plan_model(parse_model(b.build(), "built.tflite"))
    assert not any(s.reduces for s in mp.tiling.segments)


@pytest.mark.parametrize("build", [int8_global_average, dense_on_rows("int8")],
                         ids=["int8_global_average", "int8_dense_on_rows"])
def test_a_streamed_input_is_added_up_to_the_end_in_one_segment(build):
    """With the input streamed, one segment fetches its rows and adds the last op's input up:
    none of its tensors but the output is ever whole; bit-exact in runtime_py and in C."""
    data = build()
    mp = plan_model(parse_model(data, "built.tflite"), stream_input=True)
    (segment,) = mp.tiling.segments
    assert segment.streamed and segment.reduces
    inside = {segment.input, *(mp.graph.operators[o].outputs[0] for o in segment.ops[:-1])}
    assert not inside & set(mp.lifetimes.tensor_buffers)
    assert segment.output in mp.lifetimes.tensor_buffers
    with CBackend(mp) as backend:
        report = check_plan(mp, data, inputs=2, extra=[("c", backend.invoke_many)])
    assert report.ok, report.as_dict()


@needs_mcu
def test_reducing_bands_match_litert_on_a_cortex_m4():
    """The DSP kernels of the pool and the dense layer add their bands up as the portable
    ones."""
    for build in (int8_global_average, dense_on_rows("int8")):
        data = build()
        mp = plan_model(parse_model(data, "built.tflite"), target="cortex-m4")
        (segment,) = [s for s in mp.tiling.segments if s.reduces]
        assert mp.program.bindings[segment.ops[-1]].variant.name == "dsp"
        with QemuBackend(mp) as backend:
            report = check_plan(mp, data, inputs=2, extra=[("qemu", backend.invoke_many)])
        assert report.ok, report.as_dict()


def test_residual_segment_holds_the_skip_and_both_branches():
    # (row by row, one segment takes both blocks: each skip is then an intermediate)
    mp, _ = striped_plan(residual_block(), techniques=Techniques(extra_stripes=False))
    skips = [s for s in mp.tiling.segments for op in s.ops
             if mp.graph.operators[op].opcode == "ADD" and s.input in mp.graph.operators[op].inputs]
    assert skips, "a residual ADD reads its segment's input"
    for s in mp.tiling.segments:
        for b in s.buffers:  # an intermediate keeps fewer rows than it has
            assert b.rows < mp.graph.tensors[b.tensor].shape[1]


def test_rows_made_row_by_row_keep_only_their_readers_windows():
    """A residual block before a strided one: stripes of one output row make two rows of every
    tensor before the stride, so a 3x3 window's input keeps four; row by row, an op makes at
    most one row a stripe and the ops after the stride every other stripe, so it keeps three,
    a 1x1's input one, and the arena is smaller, with no MAC computed twice. --max-arena
    (`extra_stripes` off) plans without it. Its C and runtime_py are bit-exact against LiteRT
    (test_striped_chain_matches_litert_in_runtime_py_and_c)."""
    model = parse_model(residual_block(), "residual.tflite")
    rowwise = plan_model(model)
    (segment,) = rowwise.tiling.segments
    assert segment.pace == ROW_BY_ROW and segment.height == 1
    output_rows = rowwise.graph.tensors[segment.output].shape[1]
    tallest = max(rowwise.graph.tensors[b.tensor].shape[1] for b in segment.buffers)
    assert output_rows < len(segment.stripes) <= tallest + 4
    assert max(b.rows for b in segment.buffers) == 3 and min(b.rows for b in segment.buffers) == 1
    assert segment.macs == segment.whole_macs
    shares = plan_model(model, techniques=Techniques(extra_stripes=False))
    assert all(s.pace != ROW_BY_ROW for s in shares.tiling.segments)
    assert rowwise.arena_bytes < shares.arena_bytes
    assert all(s.pace != ROW_BY_ROW for s in plan_model(model, max_arena=1 << 20).tiling.segments)


def test_stripes_that_alternate_run_as_one_loop_over_pairs():
    """Row by row, the ops after a stride make their row every other stripe: the stripes
    alternate, and the C runs them as one loop over pairs of stripes, each op's kernel once
    per phase, not each stripe written out (the values: the LiteRT tests above)."""
    mp = plan_model(parse_model(residual_block(), "residual.tflite"))
    (segment,) = mp.tiling.segments
    runs = stripe_runs(segment, mp.graph, mp.program.params(),
                       {o: mp.graph.operators[o].outputs[0] for o in segment.ops})
    pairs = [r for r in runs if r.period == 2]
    assert [r.start for r in pairs][1::2] == [r.start + 1 for r in pairs][::2]
    assert sum(2 * r.count for r in pairs) > len(segment.stripes) // 2
    c = generate(mp, "m")["m.c"]
    assert len(re.findall(r"for \(m_pair0 = 0; m_pair0 < \d+; \+\+m_pair0\)", c)) == 1
    assert "every other stripe from" in c and "each written out" not in c
    kernels = len(re.findall(r"^static void m_\w+_stripes\d+\(void\)", c, re.M))
    assert kernels < sum(len(stripe.ops) for stripe in segment.stripes)


def test_striped_values_equal_the_whole_tensor_run():
    """Every output of a striped plan equals the plan without tiling, in runtime_py."""
    data = mobilenet_stem()
    mp, plain = striped_plan(data)
    inputs = random_inputs(mp.graph, 3)
    striped = ArenaInterpreter(mp).invoke(inputs)
    whole = ArenaInterpreter(plain).invoke(inputs)
    assert all((a == b).all() for a, b in zip(striped, whole, strict=True))


def test_a_neighbouring_tiling_that_plans_smaller_wins(monkeypatch):
    """The bound picks a segment, but the shifts a run of outputs stacks show only in a plan:
    a neighbour of the chosen segment plans smaller, and so does one more segment away from
    it, and the smallest is kept; under --max-arena, no segment is added."""
    model = parse_model(ds_cnn(), "ds_cnn.tflite")
    found = plan_model(model)
    unlimited = plan_model(model, max_arena=1 << 20)  # trades arena for speed: adds none
    monkeypatch.setattr(plan_module, "ADDED_TILINGS", 0)
    changed = plan_model(model)
    assert unlimited.tiling == changed.tiling
    monkeypatch.setattr(plan_module, "NEARBY_TILINGS", 0)
    chosen = plan_model(model)
    # a segment added away from the chosen ones, then one changed: each walk lowers the arena
    assert found.arena_bytes < changed.arena_bytes < chosen.arena_bytes
    assert len(found.tiling.segments) > len(chosen.tiling.segments)
    assert found.overlap_bound_bytes <= found.arena_bytes
    assert found.tiling != chosen.tiling
    inputs = random_inputs(found.graph, 2)
    striped = ArenaInterpreter(found).invoke(inputs)
    whole = ArenaInterpreter(plan_model(model, techniques=Techniques(tiling="off"))).invoke(inputs)
    assert all((a == b).all() for a, b in zip(striped, whole, strict=True))


def unsafe_by_one_row(mp):
    """The plan with the segment output one input row higher than its shift allows."""
    segment = mp.tiling.segments[0]
    (pair,) = [o for o in mp.plan.overlaps
               if mp.lifetimes.keys[o.below].index == segment.output]
    offsets = list(mp.plan.offsets)
    row = mp.graph.tensors[segment.input].nbytes // mp.graph.tensors[segment.input].shape[1]
    offsets[pair.below] = offsets[pair.above] - pair.shift + row
    return replace(mp, plan=replace(mp.plan, offsets=tuple(offsets)))


def test_releasing_input_rows_a_stripe_too_early_fails_verify_and_the_runtime():
    data = float_pool_chain()
    mp, _ = striped_plan(data)
    segment = mp.tiling.segments[0]
    assert segment.shift > 0
    unsafe = unsafe_by_one_row(mp)
    with pytest.raises(PlanError):
        verify(unsafe.plan)
    # runtime_py's own owner map, without verify: the output's rows clobber input rows a
    # window of a later stripe still reads.
    with pytest.raises(PlanError, match="would clobber"):
        ArenaInterpreter(unsafe, verify_plan=False).invoke(random_inputs(mp.graph, 0))


def test_releasing_input_rows_one_stripe_early_fails_check():
    """A segment whose stripes let the input's rows die one stripe before the last window that
    reads them: runtime_py poisons them, and its outputs no longer match LiteRT's."""
    data = mobilenet_stem()
    mp, _ = striped_plan(data)
    segment = mp.tiling.segments[0]
    stripes = list(segment.stripes)
    early = [replace(s, input_done_to=after.input_done_to)
             for s, after in pairwise(stripes)]
    assert any(a.input_done_to != b.input_done_to for a, b in zip(early, stripes, strict=True))
    hasty = replace(segment, stripes=(*early, stripes[-1]))
    unsafe = replace(mp, tiling=replace(mp.tiling, segments=(hasty, *mp.tiling.segments[1:])))
    assert not check_plan(unsafe, data, inputs=2).ok
    assert check_plan(mp, data, inputs=2).ok


def test_tiling_off_and_the_plan_report(capsys, tmp_path):
    path = tmp_path / "stem.tflite"
    path.write_bytes(mobilenet_stem())
    assert main(["plan", str(path)]) == 0
    text = capsys.readouterr().out
    assert "bytes, striped: the most that must coexist" in text and "striped      steps" in text
    assert main(["plan", str(path), "--tiling", "off"]) == 0
    assert "striped" not in capsys.readouterr().out


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/models is absent")
def test_shared_models_meet_the_tiling_goals():
    """The default plans' arenas, striped and not. These plans (vww_96_int8's and the ResNet's
    run stripe by stripe) are checked bit-exact in C against LiteRT on ten inputs by
    test_runtime's check of every shared model."""
    models = sorted(SHARED.glob("*.tflite"))
    tiled, plain, striped = {}, {}, set()
    for m in models:
        model = read_model(str(m))
        default = plan_model(model)
        tiled[m.stem] = default.arena_bytes
        if default.tiling.segments:
            striped.add(m.stem)
        plain[m.stem] = plan_model(model, techniques=Techniques(tiling="off")).arena_bytes
        assert tiled[m.stem] <= plain[m.stem]
    assert {"vww_96_int8", "pretrainedResnet_quant"} <= striped
    # The exact stripe shifts and the neighbouring tilings: vww's output over its input no
    # further down than the stripe schedule needs; wavefronts take person_detect below its
    # floor of one-row stripes on demand (16,896) and the ResNet's blocks to 19,040.
    assert tiled["vww_96_int8"] <= 28672 and tiled["person_detect"] <= 16128
    assert tiled["pretrainedResnet_quant"] <= 19040
    # the global pool and the dense layer add their inputs up stripe by stripe
    assert tiled["kws_ref_model"] <= 6192 and tiled["micro_speech_quantized"] <= 2160
    heads = tflm_head_figures()
    assert sum(tiled.values()) <= 0.42 * sum(heads[name] for name in tiled)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/models is absent")
def test_the_ops_sharing_a_segments_scratch_alike_give_it_up_in_one_replan(monkeypatch):
    """kws_ref_model on cortex-m4: its nine convolutions take turns in one segment's scratch
    buffer, which keeps its size until each gives its scratch up; the hold gives up those of
    one size together, so it plans the model four times, not thirteen, to the generic arena;
    --max-arena too."""
    replans = []
    narrowed = plan_module.narrowed

    def counted(model_plan, portable_arena, replan):
        return narrowed(model_plan, portable_arena,
                        lambda given_up: replans.append(dict(given_up)) or replan(given_up))

    monkeypatch.setattr(plan_module, "narrowed", counted)
    model = read_model(str(SHARED / "kws_ref_model.tflite"))
    held = plan_model(model, target="cortex-m4")
    assert held.arena_bytes == held.portable_arena == plan_model(model).arena_bytes
    assert len(held.program.given_up) == 9 and len(replans) == 4
    assert len(replans[0]) > 1  # the first replan gives up several ops at once
    # --max-arena gives them up together too: 18 plans, not 27, to the same arena
    limited = []
    within = plan_module.within_arena
    monkeypatch.setattr(plan_module, "within_arena", lambda mp, limit, replan: within(
        mp, limit, lambda given_up: limited.append(len(given_up)) or replan(given_up)))
    assert plan_model(model, target="cortex-m4", max_arena=held.arena_bytes).arena_bytes \
        == held.arena_bytes
    assert len(limited) == 18 and any(b - a > 1 for a, b in zip(limited, limited[1:], strict=False))


def padded_stem() -> bytes:
    """The converter's MobileNet stem: explicit PADs before the strided windows (fused into
    them), the wide pointwise output between them."""
    b = ModelBuilder("int8", seed=3)
    x = b.input("x", (1, 24, 20, 3), "int8", scale=0.05, zero_point=-128)
    bottom_right = ((0, 0), (0, 1), (0, 1), (0, 0))
    y = b.conv_2d(b.pad(x, bottom_right), 8, 3, stride=2, padding="VALID", activation="RELU6")
    y = b.depthwise_conv_2d(y, 3, activation="RELU6")
    y = b.conv_2d(y, 32, 1, activation="RELU6")
    y = b.depthwise_conv_2d(b.pad(y, bottom_right), 3, stride=2, padding="VALID",
                            activation="RELU6")
    b.output(b.reshape(b.average_pool_2d(y, (6, 5), 1, "VALID"), (1, 32)))
    return b.build()


def test_a_fused_pad_stripes_with_its_window():
    """A fused PAD's step does nothing: a segment runs through it, exact."""
    data = padded_stem()
    mp, _ = striped_plan(data)
    pads = {f.pad for f in mp.program.fused_pads}
    assert len(pads) == 2, "both PADs should be fused"
    order = list(mp.lifetimes.order)
    assert any(s.first < order.index(p) < s.last for s in mp.tiling.segments for p in pads)
    assert_matches_oracle(data, planner="best", striped=True)


def wide_residual_block() -> bytes:
    """A ResNet block on a 32x32 image: its stripes' kernels differ at the image's borders."""
    b = ModelBuilder("int8", seed=11)
    x = b.input("x", (1, 32, 32, 3), "int8", scale=0.04, zero_point=2)
    s = b.conv_2d(x, 16, 3, activation="RELU")
    y = b.conv_2d(s, 16, 3, activation="RELU")
    y = b.conv_2d(y, 16, 3)
    r = b.add(s, y, activation="RELU")
    b.output(b.reshape(b.average_pool_2d(r, (32, 32), 1, "VALID"), (1, 16)))
    return b.build()


@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m55"])
def test_the_stripes_of_an_op_define_its_tables_once(target):
    """The kernels of an op's runs of stripes share its filter and per-channel tables: only
    what differs between them (here the im2col window helpers at the borders) is defined
    again, so striping adds code, not weights."""
    # not held (the kernels given up say which run): held to the generic arena, the
    # convolutions would run without scratch; here through im2col, whose window helpers
    # differ at the borders (not from widened rows)
    mp = plan_model(parse_model(wide_residual_block(), "built.tflite"), target=target,
                    given_up={1: ("dsp-rows",), 2: ("dsp-rows",)})
    assert mp.tiling.segments
    text = generate(mp, "model")["model.c"]
    again = re.findall(r"^static \w+ \w+ (model_op\d+s\d+_\w+)\(", text, re.M)
    assert again, "some stripe's kernel should differ from its op's first"
    tables = re.findall(r"^(?:ARENAC_ALIGN\(\d+\) )?static const \w+ (\w+)\[", text, re.M)
    assert not [t for t in tables if re.match(r"model_op\d+s\d+_", t)]


def test_the_searchs_loads_are_those_of_the_whole_problem(monkeypatch):
    """The tiling search bounds each tiling from the whole-op problem's deltas and what each of
    its segments changes in them, each laid out once (the tensors' for every replan of the
    hold), the kernels' scratch likewise (tiled_loads): on every tiling it bounds, the loads
    are exactly those of the whole striped problem (step_loads), at the same steps, where
    segments share their ops' scratch, where a reducing op's scratch is not planned, where
    a segment streams the input, and where many segments stand side by side."""
    from tests.deep import alike_layers
    from toolchain.front.examples import EXAMPLES
    from toolchain.planners.base import step_loads

    made, seen = plan_module.tiling_loads, []

    def checked(program, order, scratch, layout, memo):
        loads = made(program, order, scratch, layout, memo)

        def compared(tiling):
            lifetimes, overlaps = plan_module.tiled_problem(program, order, scratch, *layout,
                                                            tiling)
            assert loads(tiling) == step_loads(lifetimes.buffers, overlaps, layout[-1])
            seen.append((tiling, lifetimes.shared))
            return loads(tiling)
        return compared

    monkeypatch.setattr(plan_module, "tiling_loads", checked)
    for data, options in ((EXAMPLES["residual_cnn_int8"](), {}), (int8_global_average(), {}),
                          (dense_on_rows("int8")(), {}), (alike_layers(14), {}),
                          (EXAMPLES["residual_cnn_int8"](), {"stream_input": True})):
        plan_model(parse_model(data, "built.tflite"), target="cortex-m4", **options)
    assert len(seen) > 100
    assert max(len(tiling.segments) for tiling, _ in seen) >= 3
    assert any(s.streamed for tiling, _ in seen for s in tiling.segments)
    assert any(shared for _, shared in seen)  # a segment's ops share one scratch buffer
    assert any(s.reduces for tiling, _ in seen for s in tiling.segments)
