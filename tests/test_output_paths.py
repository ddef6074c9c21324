"""Every output path a user gives that cannot be written ends in one line naming it and exit
status 2, with nothing written: `run --output-dir`, `gen -o`, `plan --svg` and
`--dump-buffers`, `embed -o`. (Regression: `run --output-dir` on a read-only place ended in a
traceback and exit 1.)"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model

GOOD = EXAMPLES["tiny_cnn_int8"]()


@pytest.fixture
def read_only(tmp_path):
    """A directory nobody may write to here: a chmod 555 one, or for root (whom permissions
    do not stop) /sys, which the kernel keeps closed to new files."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (str(folder), "/sys"):
        try:
            os.close(tempfile.mkstemp(dir=candidate)[0])
        except OSError:
            yield candidate
            break
    else:
        pytest.skip("no directory here refuses new files")
    folder.chmod(0o755)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "good.tflite"
    path.write_bytes(GOOD)
    graph = parse_model(GOOD).main
    tensor = graph.tensors[graph.inputs[0]]
    np.save(tmp_path / "x.npy", np.zeros(tensor.shape, np.dtype(tensor.dtype)))
    return path


COMMANDS = {
    "run": lambda m, out: ["run", m, "--input", os.path.join(os.path.dirname(m), "x.npy"),
                           "--output-dir", out],
    "gen": lambda m, out: ["gen", m, "-o", out],
    "plan --svg": lambda m, out: ["plan", m, "--svg", os.path.join(out, "map.svg")],
    "plan --dump-buffers": lambda m, out: ["plan", m, "--dump-buffers",
                                           os.path.join(out, "b.csv")],
    "embed": lambda m, out: ["embed", m, "-o", os.path.join(out, "e.tflite")],
}


def assert_one_line(result: subprocess.CompletedProcess, path: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and path in lines[0] and "cannot" in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolchain.cli", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_read_only_place(command, model, read_only):
    out = os.path.join(read_only, "out") if command in ("run", "gen") else read_only
    before = set(os.listdir(read_only))
    result = run_cli(*COMMANDS[command](str(model), out))
    assert_one_line(result, read_only)
    assert set(os.listdir(read_only)) == before


@pytest.mark.parametrize("command", COMMANDS)
def test_a_path_through_a_file(command, model, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = run_cli(*COMMANDS[command](str(model), str(blocker / "out")))
    assert_one_line(result, str(blocker))
    assert blocker.read_text() == "not a directory"


def test_run_into_the_read_only_place_itself(model, read_only):
    result = run_cli(*COMMANDS["run"](str(model), read_only))
    assert_one_line(result, os.path.join(read_only, "output_0.npy"))


@pytest.mark.parametrize("names, said", [
    (("a", "a_main"), "two models' files would both be a_main.c"),
    (("Kws", "KWS"), "differ only in case"),
    (("net", "arenac_SHARED"), "is the shared arena's"),
])
def test_names_whose_files_or_macros_collide_are_refused(model, tmp_path, names, said):
    out = tmp_path / "out"
    result = run_cli("gen", str(model), str(model), "-o", str(out),
                     *[arg for n in names for arg in ("--name", n)])
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr
    assert not out.exists()


@pytest.mark.parametrize("name", ["string", "stdio", "stdint", "Math"])
def test_a_name_that_would_shadow_a_c_library_header_is_refused(model, tmp_path, name):
    result = run_cli("gen", str(model), "-o", str(tmp_path / "out"), "--name", name)
    assert result.returncode == 2 and f"shadow the C library's <{name.lower()}.h>" in \
        result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_a_model_file_named_like_a_c_library_header_gets_its_own_name(tmp_path):
    path = tmp_path / "string.tflite"
    path.write_bytes(GOOD)
    result = run_cli("gen", str(path), "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(tmp_path / "out")) == [
        "m_string.c", "m_string.cmake", "m_string.h", "m_string.mk", "m_string_main.c"]
