"""Streamed output (`--stream-output`, toolchain.lower.tiling): a graph output made by a striped
segment never lies in the arena whole; the segment hands its rows on as each stripe makes them
final, through the firmware's NAME_output_rows() in the C. Bit-exact against LiteRT in
runtime_py, in C and under QEMU; a stripe that hands a row on out of order or not at all fails;
what cannot stream is refused in one line."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace

import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.test_mcu import mcu_tools, needs_mcu  # noqa: F401 (the fixture needs_mcu uses)
from tests.test_streaming import assert_bit_exact_under_qemu, assert_streamed_project_runs
from toolchain.c.generate import generate
from toolchain.cli import main
from toolchain.errors import PlanError, UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import check_plan, random_inputs
from toolchain.lower.plan import plan_model


def dense_head() -> bytes:
    """A dense-prediction head: a strided stem, then layers that widen to the output, the
    largest tensor (as a segmentation model's is)."""
    b = ModelBuilder("int8", seed=21)
    x = b.input("x", (1, 24, 20, 4), "int8", scale=0.05, zero_point=2)
    y = b.conv_2d(x, 8, 3, stride=2, activation="RELU6")
    y = b.depthwise_conv_2d(y, 3, activation="RELU6")
    y = b.conv_2d(y, 16, 1, activation="RELU6")
    b.output(b.conv_2d(y, 24, 3))
    return b.build()


def pooled_head() -> bytes:
    """A float chain ending in a pool: the output is made by a pooling op."""
    b = ModelBuilder("float32", seed=5)
    x = b.input("x", (1, 16, 12, 3), "float32")
    y = b.conv_2d(x, 12, 3, activation="RELU")
    b.output(b.max_pool_2d(y, 2, 1, "SAME"))
    return b.build()


def streamed(data: bytes, **options):
    """The model planned with its output streamed, and planned as usual."""
    model = parse_model(data, "built.tflite")
    mp = plan_model(model, stream_output=True, **options)
    (y,) = mp.graph.outputs
    assert mp.streamed_outputs == {y}
    assert y not in mp.lifetimes.tensor_buffers, "a streamed output has no whole buffer"
    return mp, plan_model(model, **options)


def handed_rows(mp) -> list[int]:
    """Every output row the streamed segment hands on, in the order it hands them on."""
    (segment,) = [s for s in mp.tiling.segments if s.streamed_output]
    return [row for stripe in segment.stripes for row in range(*stripe.emit)]


@pytest.mark.parametrize("build", [dense_head, pooled_head])
def test_a_streamed_output_matches_litert_in_runtime_py_and_c(build):
    data = build()
    mp, whole = streamed(data)
    rows = mp.graph.tensors[mp.graph.outputs[0]].shape[1]
    assert handed_rows(mp) == list(range(rows)), "each row once, in order"
    assert mp.arena_bytes < whole.arena_bytes
    with CBackend(mp, sanitize=True) as backend:
        report = check_plan(mp, data, inputs=3, extra=[("c", backend.invoke_many)])
    assert report.ok, report.as_dict()


def test_input_and_output_stream_together():
    """Both ends out of the arena: the arena holds stripe buffers only, smaller than with either
    end whole, and the outputs are those of the plan holding both whole."""
    data = dense_head()
    model = parse_model(data, "built.tflite")
    both = plan_model(model, stream_input=True, stream_output=True)
    out_only = plan_model(model, stream_output=True)
    whole = plan_model(model)
    assert both.streamed_inputs == set(both.graph.inputs)
    assert both.streamed_outputs == set(both.graph.outputs)
    assert both.arena_bytes < out_only.arena_bytes < whole.arena_bytes
    inputs = random_inputs(both.graph, 1)
    got, wanted = ArenaInterpreter(both).invoke(inputs), ArenaInterpreter(whole).invoke(inputs)
    assert all((a == b).all() for a, b in zip(got, wanted, strict=True))


def unsafe(mp, emit):
    """The plan with the streamed segment's stripes handing on the rows `emit` gives."""
    (segment,) = [s for s in mp.tiling.segments if s.streamed_output]
    stripes = tuple(replace(s, emit=e) for s, e in zip(segment.stripes, emit(segment.stripes),
                                                        strict=True))
    changed = replace(segment, stripes=stripes)
    return replace(mp, tiling=replace(mp.tiling, segments=tuple(
        changed if s is segment else s for s in mp.tiling.segments)))


def one_row_late(stripes):
    """A stripe hands its last row on with the next stripe's (by then it is overwritten)."""
    emit = [s.emit for s in stripes]
    k = next(k for k in range(len(emit) - 1) if emit[k][1] > emit[k][0])
    emit[k] = (emit[k][0], emit[k][1] - 1)
    emit[k + 1] = (emit[k][1], emit[k + 1][1])
    return emit


def last_row_never(stripes):
    emit = [s.emit for s in stripes]
    emit[-1] = (emit[-1][0], emit[-1][1] - 1)
    return emit


@pytest.mark.parametrize("emit, said", [(one_row_late, "outside its stripe buffer"),
                                        (last_row_never, "hand on")])
def test_a_row_handed_on_late_or_never_fails(emit, said):
    data = dense_head()
    mp, _ = streamed(data)
    with pytest.raises(PlanError, match=said):
        ArenaInterpreter(unsafe(mp, emit)).invoke(random_inputs(mp.graph, 0))
    with pytest.raises(PlanError, match=said):
        check_plan(unsafe(mp, emit), data, inputs=1)


def test_the_c_hands_rows_to_the_firmwares_function():
    mp, _ = streamed(dense_head())
    files = generate(mp, "head")
    header, source = files["head.h"], files["head.c"]
    assert "void head_output_rows(int i, int first_row, int rows, const void *src);" in header
    calls = re.findall(r"head_output_rows\(0, ([^,]+), (\d+), rows\d+(?: \+ \d+)?\);", source)
    assert calls, "the stripes hand the output's rows on"
    (segment,) = [s for s in mp.tiling.segments if s.streamed_output]
    assert len(calls) <= len(segment.stripes)
    # the harness gen writes keeps the output whole as it takes its rows
    assert "void head_output_rows(int i, int first_row, int rows, const void *src) {" \
        in files["head_main.c"]


def twice_listed() -> bytes:
    """The graph lists its one output twice: each place gets the rows."""
    b = ModelBuilder("int8", seed=9)
    x = b.input("x", (1, 10, 8, 3), "int8", scale=0.05, zero_point=1)
    y = b.conv_2d(b.conv_2d(x, 6, 3, activation="RELU6"), 6, 3)
    b.output(y)
    b.output(y)
    return b.build()


def test_an_output_listed_twice_is_handed_on_to_both_places():
    data = twice_listed()
    mp = plan_model(parse_model(data, "built.tflite"), stream_output=True)
    assert mp.streamed_outputs
    source = generate(mp, "twice")["twice.c"]
    assert re.search(r"twice_output_rows\(0, ", source) and re.search(r"twice_output_rows\(1, ",
                                                                       source)
    with CBackend(mp) as backend:
        report = check_plan(mp, data, inputs=2, extra=[("c", backend.invoke_many)])
    assert report.ok, report.as_dict()


def test_external_io_refuses_a_streamed_plan():
    mp = plan_model(parse_model(dense_head(), "built.tflite"), stream_input=True,
                    stream_output=True)
    with pytest.raises(UnsupportedOpError, match="streams some"):
        generate(mp, "head", external_io=True)


def read_twice_model() -> bytes:
    """The output is also read by another op: it must exist whole."""
    b = ModelBuilder("int8", seed=3)
    x = b.input("x", (1, 8, 8, 4), "int8", scale=0.05, zero_point=0)
    y = b.conv_2d(x, 4, 3, activation="RELU6")
    b.output(y)
    b.output(b.conv_2d(y, 4, 1))
    return b.build()


def test_an_output_an_op_reads_is_refused(capsys, tmp_path):
    path = tmp_path / "twice.tflite"
    path.write_bytes(read_twice_model())
    assert main(["plan", str(path), "--stream-output"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(path) in err
    assert "output 0 ('" in err and "cannot be handed on row by row" in err


@pytest.mark.parametrize("args, said", [
    (["gen", "--tiling", "off"], "it needs striping"),
    (["gen", "--external-io"], "choose one"),
], ids=["tiling-off", "external-io"])
def test_what_cannot_stream_is_one_line(capsys, tmp_path, args, said):
    path = tmp_path / "head.tflite"
    path.write_bytes(dense_head())
    out = tmp_path / "c"
    command, *rest = args
    assert main([command, str(path), "-o", str(out), "--stream-output", *rest]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and said in err and str(path) in err
    assert "Traceback" not in err and not out.exists()


def test_per_layer_check_of_a_streamed_output_is_one_line(capsys, tmp_path):
    path = tmp_path / "head.tflite"
    path.write_bytes(dense_head())
    assert main(["check", str(path), "--stream-output", "--per-layer", "--inputs", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(path) in err
    assert "a streamed output never is" in " ".join(err.split())


def test_plan_reports_the_streamed_output(capsys, tmp_path):
    path = tmp_path / "head.tflite"
    path.write_bytes(dense_head())
    assert main(["plan", str(path), "--stream-output"]) == 0
    assert "rows handed on as made" in " ".join(capsys.readouterr().out.split())


@needs_mcu
@pytest.mark.parametrize("target", ["generic", "cortex-m4"])
def test_streamed_input_and_output_match_litert_under_qemu(target):
    data = dense_head()
    mp = plan_model(parse_model(data, "built.tflite"), target=target, stream_input=True,
                    stream_output=True)
    assert mp.streamed_outputs and mp.streamed_inputs
    assert_bit_exact_under_qemu(mp, data, inputs=2)


@needs_mcu
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_a_streamed_output_project_builds_and_runs_as_arenac_run(capsys, tmp_path):
    assert_streamed_project_runs(capsys, tmp_path, "head", dense_head(),
                                 ["--stream-input", "--stream-output"], "head_output_rows")
