"""Column tiles (toolchain.lower.tiling): a streamed segment run once per tile of its output's
width, its stripe buffers a tile wide, the columns where tiles meet computed twice within
`--max-recompute`. Bit-exact against LiteRT in runtime_py, in C and under QEMU on generic and
cortex-m4; a tile one column short fails `check`; the cap holds."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.conftest import SHARED_MODELS, needs_shared_models
from tests.test_codegen import style_problems
from tests.test_mcu import mcu_tools, needs_mcu  # noqa: F401 (the fixture needs_mcu uses)
from tests.test_streaming import (
    assert_bit_exact_under_qemu,
    assert_streamed_project_runs,
    camera_stem,
    deep_stem,
    flat_dense,
)
from tests.test_tiling import int16_chain, mobilenet_stem
from toolchain.c.generate import generate
from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model, read_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import check_plan, random_inputs
from toolchain.lower.plan import Techniques, narrow_ops, plan_model
from toolchain.lower.tiling import Tile, candidates, column_tiled, model_macs, stripe_chain


def pooled_frame() -> bytes:
    """A frame through a convolution, a max pool and a depthwise layer: a pool inside tiles."""
    b = ModelBuilder("int8", seed=23)
    x = b.input("x", (1, 40, 36, 2), "int8", scale=0.05, zero_point=3)
    y = b.conv_2d(x, 8, 3, stride=1, activation="RELU6")
    y = b.max_pool_2d(y, 2, 2, "VALID")
    y = b.depthwise_conv_2d(y, 3, stride=1, activation="RELU6")
    y = b.conv_2d(y, 4, 1)
    return classified(b, y)


def tiled_plan(data: bytes, cap: float, **options):
    """The model planned with its input streamed and at most `cap` percent of its MACs
    computed twice, and its one segment in column tiles."""
    mp = plan_model(parse_model(data, "built.tflite"), stream_input=True,
                    techniques=Techniques(max_recompute=cap), **options)
    (segment,) = [s for s in mp.tiling.segments if s.tiles]
    return mp, segment


def macs_of(mp) -> int:
    return model_macs(mp.graph, mp.program.bindings)


def classified(b: ModelBuilder, y) -> bytes:
    """The model with a classifier's head on `y`: flattened, a dense layer and a softmax."""
    b.output(b.softmax(flat_dense(b, y, 4)))
    return b.build()


def dilated_frame() -> bytes:
    """A dilated convolution before a strided depthwise one."""
    b = ModelBuilder("int8", seed=3)
    x = b.input("x", (1, 30, 37, 3), "int8", scale=0.04, zero_point=-5)
    y = b.conv_2d(x, 8, 3, stride=1, activation="RELU6", dilation=2)
    y = b.depthwise_conv_2d(y, 3, stride=2, activation="RELU6")
    y = b.conv_2d(y, 8, 1, activation="RELU6")
    return classified(b, y)


def odd_strides() -> bytes:
    """Stride 2 twice over odd widths, a 5x5 depthwise filter."""
    b = ModelBuilder("int8", seed=5)
    x = b.input("x", (1, 33, 37, 3), "int8", scale=0.04, zero_point=2)
    y = b.conv_2d(x, 8, 3, stride=2, activation="RELU6")
    y = b.depthwise_conv_2d(y, 5, stride=2, activation="RELU6")
    y = b.conv_2d(y, 8, 1, activation="RELU6")
    return classified(b, y)


def same_pools() -> bytes:
    """Average and max pools with SAME padding between the convolutions."""
    b = ModelBuilder("int8", seed=7)
    x = b.input("x", (1, 31, 35, 2), "int8", scale=0.05, zero_point=3)
    y = b.conv_2d(x, 8, 3, stride=1, activation="RELU6")
    y = b.average_pool_2d(y, 3, 2, "SAME")
    y = b.depthwise_conv_2d(y, 3, stride=1, activation="RELU6")
    y = b.max_pool_2d(y, 3, 2, "SAME")
    y = b.conv_2d(y, 4, 1)
    return classified(b, y)


def float_frame() -> bytes:
    """float32, a 3x5 filter strided and dilated across the width only."""
    b = ModelBuilder("float32", seed=9)
    x = b.input("x", (1, 29, 33, 3), "float32")
    y = b.conv_2d(x, 8, (3, 5), stride=(1, 2), activation="RELU", dilation=(1, 2))
    y = b.average_pool_2d(y, 3, 2, "SAME")
    y = b.conv_2d(y, 8, 3, stride=1, activation="RELU")
    b.output(flat_dense(b, y, 8))
    return b.build()


def uint8_frame() -> bytes:
    """uint8, a max pool, a depthwise filter of depth multiplier 2."""
    b = ModelBuilder("uint8", seed=13)
    x = b.input("x", (1, 30, 37, 3), "uint8", scale=0.04, zero_point=128)
    y = b.conv_2d(x, 8, 3, stride=2, activation="RELU6")
    y = b.max_pool_2d(y, 2, 2, "SAME")
    y = b.depthwise_conv_2d(y, 3, stride=1, depth_multiplier=2, activation="RELU6")
    b.output(flat_dense(b, y, 16))
    return b.build()


def padded_frame() -> bytes:
    """A PAD fused into the strided convolution after it."""
    b = ModelBuilder("int8", seed=11)
    x = b.input("x", (1, 30, 36, 3), "int8", scale=0.04, zero_point=-5)
    y = b.pad(x, [[0, 0], [0, 1], [0, 1], [0, 0]])
    y = b.conv_2d(y, 8, 3, stride=2, padding="VALID", activation="RELU6")
    y = b.depthwise_conv_2d(y, 3, stride=1, activation="RELU6")
    y = b.conv_2d(y, 8, 1, activation="RELU6")
    return classified(b, y)


# Shapes whose tiles' edges the kernels must get right (every one in column tiles at a cap of 100)
SHAPES = [dilated_frame, odd_strides, same_pools, float_frame, uint8_frame, padded_frame]


@pytest.mark.parametrize("build", SHAPES, ids=[b.__name__ for b in SHAPES])
def test_tiles_of_every_shape_match_litert_in_c(build):
    data = build()
    mp = plan_model(parse_model(data, "built.tflite"), stream_input=True,
                    techniques=Techniques(max_recompute=100))
    assert any(s.tiles for s in mp.tiling.segments)
    with CBackend(mp, sanitize=True) as backend:
        report = check_plan(mp, data, inputs=2, extra=[("c", backend.invoke_many)])
    assert report.ok, report.as_dict()


# on cortex-m4 at its fastest, the segments of the fused PAD and of the dilated convolution are
# smaller in whole rows
M4_SHAPES = [b for b in SHAPES if b not in (padded_frame, dilated_frame)]


@needs_mcu
@pytest.mark.parametrize("build", M4_SHAPES, ids=[b.__name__ for b in M4_SHAPES])
def test_tiles_of_every_shape_match_litert_on_a_cortex_m4(build):
    data = build()
    mp = plan_model(parse_model(data, "built.tflite"), stream_input=True, target="cortex-m4",
                    max_arena=1 << 20, techniques=Techniques(max_recompute=100))
    assert any(s.tiles for s in mp.tiling.segments)
    assert_bit_exact_under_qemu(mp, data, inputs=2)


# (model, cap): the default cap tiles camera_stem; the others tile at a higher one
CASES = [(camera_stem, 10), (pooled_frame, 10), (mobilenet_stem, 30), (deep_stem, 30),
         (int16_chain, 30)]


@pytest.mark.parametrize("build, cap", CASES, ids=[b.__name__ for b, _ in CASES])
def test_column_tiles_match_litert_in_runtime_py_and_c(build, cap):
    data = build()
    mp, segment = tiled_plan(data, cap)
    assert len(segment.tiles) > 1
    with CBackend(mp, sanitize=True) as backend:
        report = check_plan(mp, data, inputs=3, extra=[("c", backend.invoke_many)])
    assert report.ok, report.as_dict()


def test_tiles_lower_the_arena_and_count_what_they_compute_twice():
    """camera_stem's segment in tiles: a smaller arena than in whole rows, the same outputs,
    and the MACs where tiles meet counted, within the cap and above none."""
    data = camera_stem()
    mp, segment = tiled_plan(data, 10)
    rows = plan_model(parse_model(data, "built.tflite"), stream_input=True,
                      techniques=Techniques(max_recompute=0))
    assert not any(s.tiles for s in rows.tiling.segments)
    assert mp.arena_bytes < rows.arena_bytes
    assert 0 < segment.recomputed <= 0.10 * macs_of(mp)
    # the tiles cover the output's columns once, left to right
    spans = [tile.span(segment.output) for tile in segment.tiles]
    width = mp.graph.tensors[segment.output].shape[2]
    assert [lo for lo, _ in spans] == [0, *(hi for _, hi in spans[:-1])]
    assert spans[-1][1] == width
    inputs = random_inputs(mp.graph, 2)
    got, wanted = ArenaInterpreter(mp).invoke(inputs), ArenaInterpreter(rows).invoke(inputs)
    assert all((a == b).all() for a, b in zip(got, wanted, strict=True))


def test_the_cap_keeps_tiles_that_compute_more_twice_out():
    data = mobilenet_stem()
    mp, segment = tiled_plan(data, 30)
    share = 100 * segment.recomputed / macs_of(mp)
    below = plan_model(parse_model(data, "built.tflite"), stream_input=True,
                       techniques=Techniques(max_recompute=share * 0.99))
    assert 100 * sum(s.recomputed for s in below.tiling.segments) / macs_of(below) \
        <= share * 0.99
    assert segment not in below.tiling.segments


def two_cameras() -> bytes:
    """Two streamed inputs, each into its own stem: the cap is on both stems' tiles together."""
    b = ModelBuilder("int8", seed=13)
    outs = []
    for k in range(2):
        x = b.input(f"x{k}", (1, 48, 40, 3), "int8", scale=0.04, zero_point=-5)
        y = b.conv_2d(x, 8, 3, stride=2, activation="RELU6")
        y = b.depthwise_conv_2d(y, 3, stride=2, activation="RELU6")
        y = b.conv_2d(y, 16, 1, activation="RELU6")
        outs.append(flat_dense(b, y, 16))
    b.output(b.softmax(b.add(outs[0], outs[1])))
    return b.build()


def test_the_cap_is_on_the_whole_model():
    data = two_cameras()
    mp = plan_model(parse_model(data, "built.tflite"), stream_input=True,
                    techniques=Techniques(max_recompute=10))
    assert any(s.tiles for s in mp.tiling.segments)
    assert sum(s.recomputed for s in mp.tiling.segments) <= 0.10 * macs_of(mp)
    assert check_plan(mp, data, inputs=1).ok


def constant_add() -> bytes:
    """A convolution's output plus a constant of its shape, inside a chain of windowed ops."""
    b = ModelBuilder("int8", seed=12)
    x = b.input("x", (1, 48, 48, 3), "int8", scale=0.04, zero_point=-5)
    y = b.conv_2d(x, 16, 3, stride=1, activation="RELU6")
    c = b.const("c", np.random.default_rng(1).integers(-100, 100, b.shape(y)).astype(np.int8),
                scale=0.05, zero_point=0)
    y = b.depthwise_conv_2d(b.add(y, c), 3, stride=2, activation="RELU6")
    y = b.conv_2d(y, 8, 1, activation="RELU6")
    b.output(b.softmax(b.reshape(b.average_pool_2d(y, (24, 24), 1, "VALID"), (1, 8))))
    return b.build()


def test_an_op_reading_a_whole_constant_is_never_striped():
    """ADD reads each input row for row; a constant operand would be read whole beside a band
    of the other: the op runs whole, and the plans stay bit-exact."""
    data = constant_add()
    for options in ({}, {"stream_input": True, "techniques": Techniques(max_recompute=100)}):
        mp = plan_model(parse_model(data, "built.tflite"), **options)
        assert all(1 not in s.ops for s in mp.tiling.segments)
        with CBackend(mp) as backend:
            assert check_plan(mp, data, inputs=1, extra=[("c", backend.invoke_many)]).ok


def test_what_tiles_compute_twice_is_the_columns_they_share():
    """A 1x1 convolution into a 3x3 one (SAME) across 12 columns, in two tiles of 6: the 1x1's
    output columns 5 and 6 are made in both tiles, every row of them; nothing else twice."""
    b = ModelBuilder("int8", seed=5)
    x = b.input("x", (1, 16, 12, 4), "int8", scale=0.05, zero_point=1)
    y = b.conv_2d(x, 8, 1, activation="RELU6")
    y = b.conv_2d(y, 8, 3, activation="RELU6")
    b.output(b.softmax(b.reshape(b.average_pool_2d(y, (16, 12), 1, "VALID"), (1, 8))))
    model = parse_model(b.build(), "built.tflite")
    program = plan_model(model).program
    graph, bindings = program.graph, program.bindings
    (chain,) = [c for c in candidates(graph, bindings, range(len(graph.operators)),
                                      streams=frozenset(graph.inputs)) if c.ops == (0, 1)]
    rows = stripe_chain(replace(chain, streamed_output=True), 1, graph, bindings, True)
    tiles = column_tiled(rows, chain, 2, graph, bindings)
    assert [t.span(chain.produced[0]) for t in tiles.tiles] == [(0, 7), (5, 12)]
    assert tiles.recomputed == 2 * 16 * (4 * 8)


def one_column_short(mp, segment):
    """The plan with tile 1 reading one column of the streamed input fewer on its left: the
    first op then takes that column for padding."""
    tile = segment.tiles[1]
    x = segment.input
    short = Tile(tuple((t, lo + 1 if t == x else lo, hi) for t, lo, hi in tile.columns))
    unsafe = replace(segment, tiles=(segment.tiles[0], short, *segment.tiles[2:]))
    return replace(mp, tiling=replace(mp.tiling, segments=tuple(
        unsafe if s is segment else s for s in mp.tiling.segments)))


def test_a_tile_one_column_short_fails_check():
    data = camera_stem()
    mp, segment = tiled_plan(data, 10)
    assert check_plan(mp, data, inputs=2).ok
    assert not check_plan(one_column_short(mp, segment), data, inputs=2).ok


def test_the_c_fetches_each_tiles_columns_through_the_firmwares_function():
    mp, segment = tiled_plan(camera_stem(), 10)
    files = generate(mp, "stem")
    header, source = files["stem.h"], files["stem.c"]
    assert "once per column tile" in " ".join(header.split())
    assert "stem_input_rows(0, first_row + r, 1, staging);" in source
    fetches = re.findall(r"stem_input_columns0\([^;]+\);", source)
    stores = re.findall(r"stem_output_columns0\([^;]+\);", source)
    assert fetches and stores
    tiles = re.findall(r"/\* column tile (\d+): output columns", source)
    assert tiles == [str(k) for k in range(len(segment.tiles))]
    assert style_problems(source) == []


def test_plan_reports_the_tiles_and_their_recomputation(capsys, tmp_path):
    path = tmp_path / "stem.tflite"
    path.write_bytes(camera_stem())
    assert main(["plan", str(path), "--stream-input", "--json"]) == 0
    (segment,) = json.loads(capsys.readouterr().out)["tiling"]
    assert len(segment["tiles"]) > 1 and segment["recomputed_macs"] > 0
    assert main(["plan", str(path), "--stream-input"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert re.search(r"in each of \d column tiles \(output columns [\d, ]+\)", text)
    assert re.search(r"\d+ MACs recomputed \(\d+\.\d% of the model's\)", text)
    assert main(["plan", str(path), "--stream-input", "--max-recompute", "0"]) == 0
    assert "column tiles" not in capsys.readouterr().out


@pytest.mark.parametrize("value", ["-1", "101", "ten"])
def test_a_bad_cap_is_one_line(capsys, tmp_path, value):
    path = tmp_path / "stem.tflite"
    path.write_bytes(camera_stem())
    with pytest.raises(SystemExit) as exit_:
        main(["plan", str(path), "--stream-input", "--max-recompute", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--max-recompute" in err and len(err.splitlines()) == 1


def staged_head() -> bytes:
    """A streamed stem into two 1x1 convolutions of a small input, which dsp-1x1-staged takes:
    in tiles, their widened inputs set the cortex-m4 arena."""
    b = ModelBuilder("int8", seed=29)
    x = b.input("x", (1, 48, 40, 3), "int8", scale=0.04, zero_point=-5)
    y = b.conv_2d(x, 8, 3, stride=2, activation="RELU6")
    y = b.depthwise_conv_2d(y, 3, stride=2, activation="RELU6")
    y = b.conv_2d(y, 16, 1, activation="RELU6")
    y = b.depthwise_conv_2d(y, 3, stride=2, activation="RELU6")
    y = b.conv_2d(y, 64, 1, activation="RELU6")
    y = b.conv_2d(y, 64, 1, activation="RELU6")
    b.output(b.softmax(b.reshape(b.average_pool_2d(y, (6, 5), 1, "VALID"), (1, 64))))
    return b.build()


def test_a_streamed_cortex_m4_plan_gives_staged_scratch_up_where_it_peaks():
    """The hold gives the staged 1x1 kernels up for dsp-1x1 (and that for its form without
    scratch) where their scratch sets the arena, and so reaches the generic streamed arena;
    its tries away from the peak never take that narrow form."""
    model = parse_model(staged_head(), "head.tflite")
    generic = plan_model(model, stream_input=True)
    fast = plan_model(model, stream_input=True, target="cortex-m4", max_arena=1 << 20)
    held = plan_model(model, stream_input=True, target="cortex-m4")
    assert fast.arena_bytes > generic.arena_bytes >= held.arena_bytes
    staged = {op for op, name in narrow_ops(fast).items() if name == "dsp-1x1-staged"}
    assert staged and all(held.program.given_up[op][0] == "dsp-1x1-staged" for op in staged)
    assert not staged & set(narrow_ops(fast, anywhere=True))


@needs_mcu
@pytest.mark.parametrize("target", ["generic", "cortex-m4"])
@pytest.mark.parametrize("build, cap", [(camera_stem, 10), (mobilenet_stem, 30)],
                         ids=["camera_stem", "mobilenet_stem"])
def test_column_tiles_match_litert_under_qemu(target, build, cap):
    data = build()
    mp, _ = tiled_plan(data, cap, target=target)
    assert_bit_exact_under_qemu(mp, data, inputs=2)


@needs_mcu
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_tiled_project_builds_and_runs_as_arenac_run(capsys, tmp_path):
    """`arenac project` for a board: its main.c gives each tile the rows it asks for again."""
    tiled_plan(camera_stem(), 10, target="cortex-m4")  # the plan the project runs is in tiles
    assert_streamed_project_runs(capsys, tmp_path, "stem", camera_stem(), ["--stream-input"],
                                 "stem_input_rows")


@needs_mcu
@needs_shared_models
def test_vwws_tiles_are_bit_exact_on_a_cortex_m4():
    """Its tiles' rows are not whole words (the first tile's input rows are 111 bytes): the
    DSP kernels read them as they are."""
    path = Path(SHARED_MODELS) / "vww_96_int8.tflite"
    mp = plan_model(read_model(str(path)), stream_input=True, target="cortex-m4",
                    max_arena=1 << 20)  # its fastest kernels: the hold replans it five times
    assert any(s.tiles for s in mp.tiling.segments)
    assert_bit_exact_under_qemu(mp, path.read_bytes(), inputs=1)
