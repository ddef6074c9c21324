"""Column tiles (toolchain.lower.tiling): a streamed segment run once per tile of its output's
width, its stripe buffers a tile wide, the columns where tiles meet computed twice within
`--max-recompute`. Bit-exact against LiteRT in runtime_py, in C and under QEMU on generic and
cortex-m4; a tile one column short fails `check`; the cap holds."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.conftest import SHARED_MODELS, needs_shared_models
from tests.test_codegen import style_problems
from tests.test_mcu import mcu_tools, needs_mcu  # noqa: F401 (the fixture needs_mcu uses)
from tests.test_streaming import camera_stem, deep_stem
from tests.test_tiling import int16_chain, mobilenet_stem
from toolchain.c.generate import generate
from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model, read_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import check_plan, random_inputs
from toolchain.lab.qemu_backend import QemuBackend
from toolchain.lower.plan import Techniques, plan_model
from toolchain.lower.tiling import Tile, op_macs


def pooled_frame() -> bytes:
    """A frame through a convolution, a max pool and a depthwise layer: a pool inside tiles."""
    b = ModelBuilder("int8", seed=23)
    x = b.input("x", (1, 40, 36, 2), "int8", scale=0.05, zero_point=3)
    y = b.conv_2d(x, 8, 3, stride=1, activation="RELU6")
    y = b.max_pool_2d(y, 2, 2, "VALID")
    y = b.depthwise_conv_2d(y, 3, stride=1, activation="RELU6")
    y = b.conv_2d(y, 4, 1)
    b.output(b.softmax(b.reshape(b.average_pool_2d(y, (20, 18), 1, "VALID"), (1, 4))))
    return b.build()


def tiled_plan(data: bytes, cap: float, **options):
    """The model planned with its input streamed and at most `cap` percent of its MACs
    computed twice, and its one segment in column tiles."""
    mp = plan_model(parse_model(data, "built.tflite"), stream_input=True,
                    techniques=Techniques(max_recompute=cap), **options)
    (segment,) = [s for s in mp.tiling.segments if s.tiles]
    return mp, segment


def model_macs(mp) -> int:
    return sum(op_macs(mp.graph, b) for b in mp.program.bindings)


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
    twice = segment.macs - segment.whole_macs
    assert 0 < twice <= 0.10 * model_macs(mp)
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
    share = 100 * (segment.macs - segment.whole_macs) / model_macs(mp)
    below = plan_model(parse_model(data, "built.tflite"), stream_input=True,
                       techniques=Techniques(max_recompute=share * 0.99))
    assert all(100 * (s.macs - s.whole_macs) / model_macs(below) <= share * 0.99
               for s in below.tiling.segments)
    assert segment not in below.tiling.segments


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


@needs_mcu
@pytest.mark.parametrize("target", ["generic", "cortex-m4"])
@pytest.mark.parametrize("build, cap", [(camera_stem, 10), (mobilenet_stem, 30)],
                         ids=["camera_stem", "mobilenet_stem"])
def test_column_tiles_match_litert_under_qemu(target, build, cap):
    data = build()
    mp, _ = tiled_plan(data, cap, target=target)
    with QemuBackend(mp) as backend:
        report = check_plan(mp, data, inputs=2, extra=[("qemu", backend.invoke_many)])
    assert report.ok, report.as_dict()


@needs_shared_models
def test_vww_streams_into_12k_within_the_recompute_cap():
    """vww_96_int8 with its input streamed in at most 12,288 arena bytes, at most 10% of its
    MACs computed twice (its C in tests/test_streaming.py)."""
    path = Path(SHARED_MODELS) / "vww_96_int8.tflite"
    mp = plan_model(read_model(str(path)), stream_input=True)
    assert mp.arena_bytes <= 12288
    twice = sum(s.macs - s.whole_macs for s in mp.tiling.segments if s.tiles)
    assert 0 < twice <= 0.10 * model_macs(mp)


@needs_mcu
@needs_shared_models
def test_vwws_tiles_are_bit_exact_on_a_cortex_m4():
    """Its tiles' rows are not whole words (the first tile's input rows are 111 bytes): the
    DSP kernels read them as they are."""
    path = Path(SHARED_MODELS) / "vww_96_int8.tflite"
    mp = plan_model(read_model(str(path)), stream_input=True, target="cortex-m4")
    assert any(s.tiles for s in mp.tiling.segments)
    with QemuBackend(mp) as backend:
        report = check_plan(mp, path.read_bytes(), inputs=1,
                            extra=[("qemu", backend.invoke_many)])
    assert report.ok, report.as_dict()
