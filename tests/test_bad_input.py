"""Bad input: one clear line on stderr naming the file, exit status 2, no partial output."""

from __future__ import annotations

import subprocess
import sys

import flatbuffers
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolchain.errors import ArenacError
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model
from toolchain.front.schema import fb
from toolchain.lower.plan import plan_model

GOOD = EXAMPLES["tiny_cnn_int8"]()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolchain.cli", *args], capture_output=True, text=True, timeout=60
    )


def assert_clean_failure(result: subprocess.CompletedProcess, path, words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0] and words in lines[0], lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


def edited(edit) -> bytes:
    """The good model with one field changed through the generated object API."""
    model = fb.ModelT.InitFromPackedBuf(GOOD, 0)
    edit(model)
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def set_dims(model, dims):
    model.subgraphs[0].tensors[model.subgraphs[0].operators[0].outputs[0]].shape = dims


def external_buffer(model):
    weights = model.buffers[
        model.subgraphs[0].tensors[model.subgraphs[0].operators[0].inputs[1]].buffer
    ]
    weights.data, weights.offset, weights.size = None, 10**6, 64


def wrong_data_size(model):
    weights = model.buffers[
        model.subgraphs[0].tensors[model.subgraphs[0].operators[0].inputs[1]].buffer
    ]
    weights.data = bytes(weights.data[:5])


def unknown_opcode(model):
    model.operatorCodes[0].builtinCode = 4000
    model.operatorCodes[0].deprecatedBuiltinCode = 127


def tensor_out_of_range(model):
    op = model.subgraphs[0].operators[0]
    op.inputs = [999, *list(op.inputs)[1:]]


def opcode_index_out_of_range(model):
    model.subgraphs[0].operators[0].opcodeIndex = 77


CASES = {
    "not-a-model": (b"hello, this is text and not a flatbuffer\n", "not a TFLite model"),
    "empty": (b"", "not a TFLite model"),
    "truncated": (GOOD[: len(GOOD) // 3], "corrupt"),
    "negative-dim": (edited(lambda m: set_dims(m, [1, -4, 4, 8])), "negative dimension"),
    "absurd-dim": (edited(lambda m: set_dims(m, [1 << 20, 1 << 20, 1 << 20, 8])), "absurd shape"),
    "buffer-outside-file": (edited(external_buffer), "outside the file"),
    "data-size-mismatch": (edited(wrong_data_size), "bytes of data"),
    "unknown-op-code": (edited(unknown_opcode), "unknown builtin operator code 4000"),
    "tensor-index": (edited(tensor_out_of_range), "tensor 999"),
    "opcode-index": (edited(opcode_index_out_of_range), "operator code 77"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", ["inspect", "plan"])
def test_bad_model_file(tmp_path, case, command):
    data, words = CASES[case]
    path = tmp_path / f"{case}.tflite"
    path.write_bytes(data)
    svg = tmp_path / "map.svg"
    extra = ["--svg", str(svg)] if command == "plan" else []
    assert_clean_failure(run_cli(command, str(path), *extra), path, words)
    assert not svg.exists()


def test_missing_file(tmp_path):
    path = tmp_path / "nope.tflite"
    assert_clean_failure(run_cli("plan", str(path)), path, "no such file")


def test_directory(tmp_path):
    assert_clean_failure(run_cli("inspect", str(tmp_path)), tmp_path, "directory")


def test_bad_alignment_is_one_line(tmp_path):
    path = tmp_path / "good.tflite"
    path.write_bytes(GOOD)
    result = run_cli("plan", str(path), "--align", "24")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "power of two" in result.stderr


def test_svg_into_missing_directory_leaves_nothing(tmp_path):
    path = tmp_path / "good.tflite"
    path.write_bytes(GOOD)
    result = run_cli("plan", str(path), "--svg", str(tmp_path / "no" / "map.svg"))
    assert_clean_failure(result, tmp_path / "no" / "map.svg", "cannot write")


def parses_cleanly_or_fails_cleanly(data: bytes) -> None:
    try:
        plan_model(parse_model(data, "fuzzed.tflite"), "greedy")
    except ArenacError as e:
        assert e.source == "fuzzed.tflite" and "\n" not in str(e)


FUZZ = settings(
    max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)


@FUZZ
@given(
    st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)), min_size=1, max_size=8)
)
def test_mutated_models(edits):
    data = bytearray(GOOD)
    for position, value in edits:
        data[position] = value
    parses_cleanly_or_fails_cleanly(bytes(data))


@FUZZ
@given(st.integers(0, len(GOOD)), st.binary(max_size=16))
def test_truncated_models(length, tail):
    parses_cleanly_or_fails_cleanly(GOOD[:length] + tail)
