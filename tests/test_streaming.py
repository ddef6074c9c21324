"""Streamed input (`--stream-input`, toolchain.lower.tiling): the input never lies in the arena
whole; its segment fetches its rows as the stripes first need them, through the firmware's
NAME_input_rows() in the C. Bit-exact against LiteRT in runtime_py, in C and under QEMU; a
stripe that reads a row before it is fetched fails; what cannot stream is refused in one line."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import toolchain.lower.plan as plan_module
from runtime_py.interpreter import ArenaInterpreter
from tests.conftest import SHARED_MODELS, needs_shared_models
from tests.test_codegen import style_problems
from tests.test_mcu import mcu_tools, needs_mcu  # noqa: F401 (the fixture needs_mcu uses)
from tests.test_project import printed_outputs, same_as_run
from tests.test_tiling import float_pool_chain, int16_chain, mobilenet_stem, residual_block
from toolchain.c.generate import generate
from toolchain.cli import main
from toolchain.errors import ArenacError, PlanError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model, read_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import check_plan, random_inputs
from toolchain.lab.qemu_backend import QemuBackend
from toolchain.lower.plan import plan_model
from toolchain.lower.tiling import model_macs, stripe_chain


def streamed(data: bytes, **options):
    """The model planned with its input streamed, and planned as usual."""
    model = parse_model(data, "built.tflite")
    mp = plan_model(model, stream_input=True, **options)
    (x,) = mp.graph.inputs
    assert mp.streamed_inputs == {x}
    assert x not in mp.lifetimes.tensor_buffers, "a streamed input has no whole buffer"
    return mp, plan_model(model, **options)


def camera_stem() -> bytes:
    """A camera's frame into a strided stem: the input is the largest tensor."""
    b = ModelBuilder("int8", seed=13)
    x = b.input("x", (1, 48, 40, 3), "int8", scale=0.04, zero_point=-5)
    y = b.conv_2d(x, 8, 3, stride=2, activation="RELU6")
    y = b.depthwise_conv_2d(y, 3, stride=2, activation="RELU6")
    y = b.conv_2d(y, 16, 1, activation="RELU6")
    b.output(b.softmax(flat_dense(b, y, 16)))
    return b.build()


def flat_dense(b: ModelBuilder, y: int, units: int) -> int:
    """`y` flattened through a dense layer of `units`: a classifier's head that keeps `y` whole
    (a global pool would add it up as the stripes make it, ending the stem's segment)."""
    return b.fully_connected(b.reshape(y, (1, -1)), units)


def deep_stem() -> bytes:
    """A chain two strides deep: made on demand, its first stripe makes every op's whole
    reach at once."""
    b = ModelBuilder("int8", seed=17)
    x = b.input("x", (1, 40, 12, 4), "int8", scale=0.05, zero_point=1)
    y = b.conv_2d(x, 16, 3, stride=1, activation="RELU6")
    y = b.depthwise_conv_2d(y, 3, stride=2, activation="RELU6")
    y = b.conv_2d(y, 24, 1, activation="RELU6")
    y = b.depthwise_conv_2d(y, 3, stride=2, activation="RELU6")
    y = b.conv_2d(y, 8, 1)
    b.output(b.softmax(flat_dense(b, y, 8)))
    return b.build()


def assert_bit_exact_under_qemu(mp, data: bytes, inputs: int = 2) -> None:
    """The plan's C built for its target and run under QEMU gives LiteRT's outputs."""
    with QemuBackend(mp) as backend:
        report = check_plan(mp, data, inputs=inputs, extra=[("qemu", backend.invoke_many)])
    assert report.ok, report.as_dict()


def fetched_rows(mp) -> list[int]:
    """Every input row the streamed segment fetches, in the order it fetches them."""
    (segment,) = [s for s in mp.tiling.segments if s.streamed]
    return [row for stripe in segment.stripes for row in range(*stripe.fetch)]


@pytest.mark.parametrize("build", [mobilenet_stem, residual_block, float_pool_chain, int16_chain,
                                   camera_stem, deep_stem])
def test_a_streamed_input_matches_litert_in_runtime_py_and_c(build):
    data = build()
    mp, _ = streamed(data)
    rows = mp.graph.tensors[mp.graph.inputs[0]].shape[1]
    assert fetched_rows(mp) == list(range(rows)), "each row once, in order"
    with CBackend(mp, sanitize=True) as backend:
        report = check_plan(mp, data, inputs=3, extra=[("c", backend.invoke_many)])
    assert report.ok, report.as_dict()


def test_streaming_takes_the_input_out_of_the_arena():
    """The frame is the largest tensor: streamed, the arena is smaller than with the input
    held whole, and the outputs are the same."""
    mp, whole = streamed(camera_stem())
    x = mp.graph.tensors[mp.graph.inputs[0]]
    assert mp.arena_bytes < whole.arena_bytes
    assert mp.arena_bytes < whole.arena_bytes - x.nbytes // 2
    inputs = random_inputs(mp.graph, 1)
    got, wanted = ArenaInterpreter(mp).invoke(inputs), ArenaInterpreter(whole).invoke(inputs)
    assert all((a == b).all() for a, b in zip(got, wanted, strict=True))


def test_a_wavefront_fills_a_deep_chain_a_share_at_a_time(monkeypatch):
    """The wavefront's stripe buffers keep the steady state's rows, not the first stripe's
    whole reach: the plan is smaller than with stripes on demand only, no MAC repeats, and
    the outputs are the same."""
    mp, _ = streamed(deep_stem())
    (segment,) = [s for s in mp.tiling.segments if s.wavefront]
    assert segment.macs == segment.whole_macs

    def on_demand(chain, height, graph, bindings, wavefront=False):
        return None if wavefront else stripe_chain(chain, height, graph, bindings)

    monkeypatch.setattr(plan_module, "stripe_chain", on_demand)
    demand, _ = streamed(deep_stem())
    assert not any(s.wavefront for s in demand.tiling.segments)
    assert mp.arena_bytes < demand.arena_bytes
    inputs = random_inputs(mp.graph, 2)
    got, wanted = ArenaInterpreter(mp).invoke(inputs), ArenaInterpreter(demand).invoke(inputs)
    assert all((a == b).all() for a, b in zip(got, wanted, strict=True))


def short_fetch(mp):
    """The plan with one stripe fetching one input row fewer (the next fetches it)."""
    (segment,) = [s for s in mp.tiling.segments if s.streamed]
    stripes = list(segment.stripes)
    k = next(k for k, s in enumerate(stripes[:-1]) if s.fetch[1] - s.fetch[0] > 1
             and stripes[k + 1].fetch[1] > stripes[k + 1].fetch[0])
    lo, hi = stripes[k].fetch
    stripes[k] = replace(stripes[k], fetch=(lo, hi - 1))
    stripes[k + 1] = replace(stripes[k + 1], fetch=(hi - 1, stripes[k + 1].fetch[1]))
    unsafe = replace(segment, stripes=tuple(stripes))
    return replace(mp, tiling=replace(mp.tiling, segments=tuple(
        unsafe if s is segment else s for s in mp.tiling.segments)))


def test_reading_a_row_before_it_is_fetched_fails():
    data = mobilenet_stem()
    mp, _ = streamed(data)
    with pytest.raises(PlanError, match="read before they are fetched"):
        ArenaInterpreter(short_fetch(mp)).invoke(random_inputs(mp.graph, 0))
    with pytest.raises(PlanError, match="read before they are fetched"):
        check_plan(short_fetch(mp), data, inputs=1)
    assert check_plan(mp, data, inputs=1).ok


def test_the_c_fetches_through_the_firmwares_function():
    mp, _ = streamed(mobilenet_stem())
    files = generate(mp, "stem")
    header, source = files["stem.h"], files["stem.c"]
    assert "void stem_input_rows(int i, int first_row, int rows, void *dst);" in header
    assert "case 0: return (void *)NULL;" in source
    calls = re.findall(r"stem_input_rows\(0, ([^,]+), (\d+), rows\d+(?: \+ \d+)?\);", source)
    assert calls, "the stripes fetch the input's rows"
    (segment,) = [s for s in mp.tiling.segments if s.streamed]
    assert len(calls) <= len(segment.stripes)
    # the harness gen writes keeps the input whole and hands out its rows
    assert "void stem_input_rows(int i, int first_row, int rows, void *dst) {" \
        in files["stem_main.c"]


def no_window_model() -> bytes:
    """The input goes straight to a fully connected layer: nothing reads it row by row."""
    b = ModelBuilder("int8", seed=3)
    x = b.input("x", (1, 16), "int8", scale=0.05, zero_point=0)
    b.output(b.fully_connected(x, 8))
    return b.build()


@pytest.mark.parametrize("args, said", [
    (["--tiling", "off"], "it needs striping"),
    (["--external-io"], "choose one"),
], ids=["tiling-off", "external-io"])
def test_what_cannot_stream_is_one_line(capsys, tmp_path, args, said):
    path = tmp_path / "stem.tflite"
    path.write_bytes(mobilenet_stem())
    out = tmp_path / "c"
    assert main(["gen", str(path), "-o", str(out), "--stream-input", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and said in err and str(path) in err
    assert "Traceback" not in err and not out.exists()


def test_an_input_no_window_reads_is_refused(capsys, tmp_path):
    path = tmp_path / "fc.tflite"
    path.write_bytes(no_window_model())
    assert main(["plan", str(path), "--stream-input"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(path) in err
    assert "input 0 ('x') cannot be fetched row by row" in err
    with pytest.raises(ArenacError):
        plan_model(read_model(str(path)), stream_input=True)


def test_plan_reports_the_streamed_segment(capsys, tmp_path):
    path = tmp_path / "stem.tflite"
    path.write_bytes(mobilenet_stem())
    assert main(["plan", str(path), "--stream-input"]) == 0
    assert "streamed input: tensor 0's rows fetched" in " ".join(capsys.readouterr().out.split())


@needs_mcu
@pytest.mark.parametrize("target", ["generic", "cortex-m4"])
def test_a_streamed_input_matches_litert_under_qemu(target):
    data = mobilenet_stem()
    mp, _ = streamed(data, target=target)
    assert_bit_exact_under_qemu(mp, data, inputs=2)


@needs_mcu
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_streamed_project_builds_and_runs_as_arenac_run(capsys, tmp_path):
    assert_streamed_project_runs(capsys, tmp_path, "stem", mobilenet_stem(),
                                 ["--stream-input"], "stem_input_rows")


def assert_streamed_project_runs(capsys, tmp_path: Path, name: str, data: bytes,
                                 flags: list[str], function: str) -> None:
    """`arenac project NAME.tflite FLAGS` for mps2-an386 defines `function` for the firmware,
    builds with make and prints under QEMU what `arenac run` gives."""
    model = tmp_path / f"{name}.tflite"
    model.write_bytes(data)
    project = tmp_path / "project"
    assert main(["project", str(model), "-o", str(project), "--board", "mps2-an386",
                 *flags]) == 0
    capsys.readouterr()
    assert function in (project / "main.c").read_text()
    built = subprocess.run(["make", "-C", str(project), "run"], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr
    assert same_as_run(printed_outputs(built.stdout + built.stderr), tmp_path, model,
                       "mps2-an386")


@needs_shared_models
def test_shared_models_stream_their_input_bit_exact_in_c():
    """vww_96_int8 streamed: in column tiles (tests/test_patches.py), at most 12,288 arena
    bytes with at most 10% of its MACs computed twice; its C bit-exact and as a careful hand
    would write it."""
    path = Path(SHARED_MODELS) / "vww_96_int8.tflite"
    model = read_model(str(path))
    mp = plan_model(model, stream_input=True)
    assert mp.arena_bytes <= 12288
    twice = sum(s.recomputed for s in mp.tiling.segments)
    assert 0 < twice <= 0.10 * model_macs(mp.graph, mp.program.bindings)
    for name, text in generate(mp, "m").items():
        assert style_problems(text) == [], name
    with CBackend(mp) as backend:
        report = check_plan(mp, path.read_bytes(), inputs=2, extra=[("c", backend.invoke_many)])
    assert report.ok
    assert np.array_equal(fetched_rows(mp), np.arange(96))
