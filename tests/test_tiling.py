"""Striped execution (toolchain.tiling): chains of windowed ops run stripe by stripe, bit-exact
against LiteRT in runtime_py and in C, and a stripe plan that is unsafe by one row fails."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from runtime_py.interpreter import ArenaInterpreter
from toolchain.builder import ModelBuilder
from toolchain.checking.c_backend import CBackend
from toolchain.checking.check import check_plan, random_inputs
from toolchain.cli import main
from toolchain.errors import PlanError
from toolchain.plan import Techniques, plan_model
from toolchain.planners import verify
from toolchain.reader import parse_model, read_model

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


def striped_plan(data: bytes):
    model = parse_model(data, "built.tflite")
    mp = plan_model(model)
    plain = plan_model(model, techniques=Techniques(tiling="off"))
    assert mp.tiling.segments, "the chain should be striped"
    assert mp.arena_bytes < plain.arena_bytes
    assert mp.overlap_bound_bytes <= mp.arena_bytes and mp.untiled_bound_bytes is not None
    return mp, plain


@pytest.mark.parametrize("build", [mobilenet_stem, residual_block])
def test_striped_chain_matches_litert_in_runtime_py_and_c(build):
    data = build()
    mp, _ = striped_plan(data)
    with CBackend(mp) as backend:
        report = check_plan(mp, data, inputs=3, extra=[("c", backend.invoke_many)])
    assert report.ok, [(o.name, o.mismatches) for o in report.outputs]


def test_residual_segment_holds_the_skip_and_both_branches():
    mp, _ = striped_plan(residual_block())
    skips = [s for s in mp.tiling.segments for op in s.ops
             if mp.graph.operators[op].opcode == "ADD" and s.input in mp.graph.operators[op].inputs]
    assert skips, "a residual ADD reads its segment's input"
    for s in mp.tiling.segments:
        for b in s.buffers:  # an intermediate keeps fewer rows than it has
            assert b.rows < mp.graph.tensors[b.tensor].shape[1]


def test_striped_values_equal_the_whole_tensor_run():
    """Every output of a striped plan equals the plan without tiling, in runtime_py."""
    data = mobilenet_stem()
    mp, plain = striped_plan(data)
    inputs = random_inputs(mp.graph, 3)
    striped = ArenaInterpreter(mp).invoke(inputs)
    whole = ArenaInterpreter(plain).invoke(inputs)
    assert all((a == b).all() for a, b in zip(striped, whole))


def unsafe_by_one_row(mp):
    """The plan with the segment output one input row higher than its shift allows."""
    segment = mp.tiling.segments[0]
    (pair,) = [o for o in mp.plan.overlaps
               if mp.lifetimes.tensor_of[o.below] == segment.output]
    offsets = list(mp.plan.offsets)
    row = mp.graph.tensors[segment.input].nbytes // mp.graph.tensors[segment.input].shape[1]
    offsets[pair.below] = offsets[pair.above] - pair.shift + row
    return replace(mp, plan=replace(mp.plan, offsets=tuple(offsets)))


def test_releasing_input_rows_a_stripe_too_early_fails_verify_and_the_runtime():
    data = mobilenet_stem()
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


def test_a_stripe_buffer_one_row_short_fails_the_runtime():
    """Stripe buffers are planned with their rows; one row fewer and the rows of the next
    stripe buffer get written."""
    mp, _ = striped_plan(mobilenet_stem())
    segment = mp.tiling.segments[0]
    short = replace(segment, buffers=(replace(segment.buffers[0],
                                              rows=segment.buffers[0].rows - 1),
                                      *segment.buffers[1:]))
    unsafe = replace(mp, tiling=replace(mp.tiling, segments=(short, *mp.tiling.segments[1:])))
    with pytest.raises((PlanError, ValueError)):
        ArenaInterpreter(unsafe).invoke(random_inputs(mp.graph, 0))


def test_tiling_off_and_the_plan_report(capsys, tmp_path):
    path = tmp_path / "stem.tflite"
    path.write_bytes(mobilenet_stem())
    assert main(["plan", str(path)]) == 0
    text = capsys.readouterr().out
    assert "with the segments striped" in text and "striped      ops" in text
    assert main(["plan", str(path), "--tiling", "off"]) == 0
    assert "striped" not in capsys.readouterr().out


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/models is absent")
def test_shared_models_meet_the_tiling_goals():
    models = sorted(SHARED.glob("*.tflite"))
    tiled, plain = {}, {}
    for m in models:
        model = read_model(str(m))
        tiled[m.stem] = plan_model(model).arena_bytes
        plain[m.stem] = plan_model(model, techniques=Techniques(tiling="off")).arena_bytes
        assert tiled[m.stem] <= plain[m.stem]
    assert tiled["vww_96_int8"] <= 30720 and tiled["person_detect"] <= 30720
    assert tiled["pretrainedResnet_quant"] < plain["pretrainedResnet_quant"]


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/models is absent")
@pytest.mark.parametrize("name", ["vww_96_int8", "pretrainedResnet_quant"])
def test_shared_striped_models_match_litert_in_c(name):
    path = SHARED / f"{name}.tflite"
    mp = plan_model(read_model(str(path)))
    assert mp.tiling.segments
    with CBackend(mp) as backend:
        report = check_plan(mp, path.read_bytes(), inputs=2,
                            extra=[("c", backend.invoke_many)])
    assert report.ok
