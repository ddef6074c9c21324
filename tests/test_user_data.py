"""`check` on the user's own data (--input, --dataset), top-1 agreement, and --per-layer on
every backend (the C and the firmware dump every intermediate tensor)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import toolchain.lab.check as check_module
from runtime_py.interpreter import ArenaInterpreter
from tests.conftest import SHARED_MODELS, needs_shared_models
from toolchain.c.generate import generate, traced_tensors
from toolchain.cli import build_parser, main
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model, read_model
from toolchain.lab import qemu_backend
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import is_classifier, runtime_py_tracer
from toolchain.lab.samples import load_dataset, load_samples
from toolchain.lower.plan import plan_model

KWS = SHARED_MODELS / "kws_ref_model.tflite"


def run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(list(args))
    except SystemExit as e:  # a usage error
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def two_inputs() -> bytes:
    """x, y -> conv(x) + y -> fc -> softmax: two int8 inputs, a classifier output."""
    b = ModelBuilder("int8", seed=5)
    x = b.input("x", (1, 6, 6, 3), "int8", scale=0.05, zero_point=-3)
    y = b.input("y", (1, 6, 6, 4), "int8", scale=0.05, zero_point=2)
    c = b.conv_2d(x, 4, 3, padding="SAME", activation="RELU")
    s = b.add(c, y)
    flat = b.reshape(s, (1, 144))
    b.output(b.softmax(b.fully_connected(flat, 5)))
    return b.build()


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "two.tflite"
    path.write_bytes(two_inputs())
    return path


def samples(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(-128, 128, (count, 1, 6, 6, 3), dtype=np.int8),
            rng.integers(-128, 128, (count, 1, 6, 6, 4), dtype=np.int8))


@pytest.fixture
def no_random(monkeypatch):
    """Random inputs must not be drawn when the user gave data."""
    def refuse(*_):
        raise AssertionError("random inputs drawn")

    monkeypatch.setattr(check_module, "random_inputs", refuse)


def test_npz_by_name_and_by_index_and_directory_read_the_same_sets(model, tmp_path):
    graph = parse_model(model.read_bytes()).main
    xs, ys = samples(3)
    np.savez(tmp_path / "named.npz", x=xs, y=ys)
    np.savez(tmp_path / "positional.npz", xs, ys)  # arr_0, arr_1
    folder = tmp_path / "one"
    folder.mkdir()
    np.save(folder / "0.npy", xs[1])
    np.savetxt(folder / "1.csv", ys[1].reshape(1, -1), fmt="%d", delimiter=",")
    for name in ("named.npz", "positional.npz"):
        sets = load_samples(graph, str(tmp_path / name))
        assert len(sets) == 3
        for k, (x, y) in enumerate(sets):
            assert x.dtype == np.int8 and np.array_equal(x, xs[k]) and np.array_equal(y, ys[k])
    ((x, y),) = load_samples(graph, str(folder))
    assert np.array_equal(x, xs[1]) and np.array_equal(y, ys[1]) and y.dtype == np.int8


def test_dataset_reads_every_sample_in_name_order(model, tmp_path):
    graph = parse_model(model.read_bytes()).main
    xs, ys = samples(4, seed=1)
    data = tmp_path / "data"
    data.mkdir()
    np.savez(data / "a.npz", x=xs[:3], y=ys[:3])
    sub = data / "b"
    sub.mkdir()
    np.save(sub / "x.npy", xs[3])
    np.save(sub / "y.npy", ys[3])
    (data / "notes.txt").write_text("not a sample")
    sets = load_dataset(graph, str(data))
    assert len(sets) == 4
    for k, (x, y) in enumerate(sets):
        assert np.array_equal(x, xs[k]) and np.array_equal(y, ys[k])


def test_check_dataset_reports_top1_agreement(capsys, model, tmp_path, no_random):
    xs, ys = samples(5, seed=2)
    data = tmp_path / "data"
    data.mkdir()
    for k in range(5):
        np.savez(data / f"s{k}.npz", x=xs[k], y=ys[k])
    code, out, err = run(capsys, "check", str(model), "--dataset", str(data), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["ok"] and report["data"] == str(data) and report["sequences"] == 5
    assert [o["name"].split(":")[0] for o in report["outputs"]] == ["runtime_py", "c"]
    for o in report["outputs"]:
        assert o["invokes"] == 5 and o["top1_agree"] == 5 and o["mismatches"] == 0
    code, out, _ = run(capsys, "check", str(model), "--dataset", str(data))
    assert code == 0 and f"5 input set(s) from {data}" in out and "5/5" in out


def test_top1_counts_a_backend_that_picks_another_class(capsys, model, tmp_path, monkeypatch):
    """A backend whose scores differ counts as disagreeing on top-1 exactly where its class
    differs: the C's scores of invoke 1 are reversed."""
    xs, ys = samples(3, seed=3)
    np.savez(tmp_path / "s.npz", x=xs, y=ys)
    real = CBackend.invoke_many

    def reversed_second(self, sets, sequence=None):
        outputs = real(self, sets, sequence)
        outputs[1] = [o[..., ::-1].copy() for o in outputs[1]]
        return outputs

    monkeypatch.setattr(CBackend, "invoke_many", reversed_second)
    code, out, _ = run(capsys, "check", str(model), "--input", str(tmp_path / "s.npz"), "--json")
    assert code == 1
    c_row = next(o for o in json.loads(out)["outputs"] if o["name"].startswith("c:"))
    mp = plan_model(parse_model(model.read_bytes()))
    (scores,) = ArenaInterpreter(mp).invoke([xs[1], ys[1]])
    picks_other = int(np.argmax(scores)) != int(np.argmax(scores[..., ::-1]))
    assert c_row["top1_agree"] == 3 - picks_other and c_row["first_mismatch"] == [1, 0]


def test_is_classifier():
    from toolchain.ir import Tensor

    def tensor(shape):
        return Tensor(0, "t", "int8", shape, None, None, False, 0)

    assert is_classifier(tensor((1, 12))) and is_classifier(tensor((10,)))
    assert not is_classifier(tensor((1, 1))) and not is_classifier(tensor((2, 5)))
    assert not is_classifier(tensor(()))


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda d: np.savez(d / "f.npz", x=samples(1)[0][0]), "no array for input 1 ('y')"),
        (lambda d: np.savez(d / "f.npz", x=samples(1)[0][0], y=samples(1)[1][0], z=1),
         "arrays z name no input"),
        (lambda d: np.savez(d / "f.npz", x=samples(2)[0], y=samples(3)[1]),
         "different numbers of samples (2, 3)"),
        (lambda d: np.savez(d / "f.npz", x=np.zeros((1, 6, 6, 2), np.int8), y=samples(1)[1][0]),
         "input 0 ('x') takes int8[1, 6, 6, 3]"),
        (lambda d: np.savez(d / "f.npz", x=np.zeros((1, 6, 6, 3)), y=samples(1)[1][0]),
         "holds float64 values; input 'x' is int8 (quantize them first)"),
        (lambda d: np.savez(d / "f.npz", x=np.full((1, 6, 6, 3), 300), y=samples(1)[1][0]),
         "values from 300 to 300 do not fit input 'x', int8"),
        (lambda d: (d / "f.npz").write_bytes(b"not a zip"), "not a readable .npz archive"),
    ],
)
def test_bad_data_is_one_line_naming_the_file(capsys, model, tmp_path, make, said):
    make(tmp_path)
    code, out, err = run(capsys, "check", str(model), "--input", str(tmp_path / "f.npz"))
    assert code == 2 and not out
    assert err.count("\n") == 1 and str(tmp_path / "f.npz") in err and said in err, err


def test_one_input_formats_need_a_one_input_model(capsys, model, tmp_path):
    np.save(tmp_path / "x.npy", samples(1)[0][0])
    code, _, err = run(capsys, "check", str(model), "--input", str(tmp_path / "x.npy"))
    assert code == 2 and "takes 2 inputs: give them in one .npz" in err
    code, _, err = run(capsys, "check", str(model), "--input", str(tmp_path / "none.npy"))
    assert code == 2 and "none.npy: no such file" in err
    code, _, err = run(capsys, "check", str(model), "--dataset", str(tmp_path / "x.npy"))
    assert code == 2 and "x.npy: not a directory" in err
    code, _, err = run(capsys, "check", str(model), "--dataset", str(tmp_path))
    assert code == 2 and f"{tmp_path}{os.sep}x.npy: the model takes 2 inputs" in err
    for other in (("--dataset", "d"), ("--inputs", "3")):
        code, _, err = run(capsys, "check", str(model), "--input", "a.npy", *other)
        assert code == 2 and "not allowed with argument" in err


def test_input_is_never_taken_for_inputs_nor_any_abbreviation(capsys, model):
    """Regression: `check M --input x.npy` was read as `--inputs x.npy`."""
    code, _, err = run(capsys, "check", str(model), "--inp", "3")
    assert code == 2 and "unrecognized arguments: --inp" in err
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and "check" in a.choices)
    assert parser.allow_abbrev is False
    assert all(p.allow_abbrev is False for p in subparsers.choices.values())


@needs_shared_models
def test_check_input_on_a_saved_kws_input(capsys, tmp_path, no_random):
    """A real model and its real input layout: one saved .npy, a CSV of the same values, and
    a stack of three: top-1 in agreement and bit-exact, runtime_py with the oracle for each
    file, every backend for the stack (a loaded array reaches every backend alike)."""
    graph = read_model(KWS).main
    tensor = graph.tensors[graph.inputs[0]]
    rng = np.random.default_rng(7)
    stack = rng.integers(-128, 128, (3, *tensor.shape), dtype=np.int8)
    np.save(tmp_path / "x.npy", stack[0])
    np.save(tmp_path / "stack.npy", stack)
    np.savetxt(tmp_path / "x.csv", stack[0].reshape(1, -1), fmt="%d", delimiter=",")
    for name, count, backends in (("x.npy", 1, ["--backends", "runtime_py"]),
                                  ("x.csv", 1, ["--backends", "runtime_py"]),
                                  ("stack.npy", 3, [])):
        code, out, err = run(capsys, "check", str(KWS), "--input", str(tmp_path / name),
                             *backends, "--json")
        assert code == 0, err
        report = json.loads(out)
        assert report["ok"] and report["sequences"] == count
        assert all(o["top1_agree"] == o["invokes"] == count and o["max_abs_diff"] == 0
                   for o in report["outputs"])


def test_the_c_trace_is_every_intermediate_tensor_bit_exact(model):
    """The C backend's per-layer dump holds the same values as runtime_py's observer."""
    mp = plan_model(parse_model(model.read_bytes()))
    xs, ys = samples(1, seed=4)
    values = [xs[0], ys[0]]
    expected = runtime_py_tracer(mp)(values)
    with CBackend(mp, trace=True) as backend:
        got = backend.trace(values)
        outputs = backend.invoke_many([values, values])
    assert sorted(got) == sorted(t for _, t in traced_tensors(mp)) == sorted(expected)
    for t, value in expected.items():
        assert got[t].dtype == value.dtype and np.array_equal(got[t], value), t
    assert len(outputs) == 2 and np.array_equal(outputs[1][0], expected[mp.graph.outputs[0]])
    assert not any("_trace" in text for text in generate(mp, "model").values())  # gen's files


def test_per_layer_uses_the_backends_asked_for(capsys, model, tmp_path):
    """Regression: --per-layer ignored --backends c."""
    xs, ys = samples(1, seed=5)
    np.savez(tmp_path / "s.npz", x=xs[0], y=ys[0])
    code, out, err = run(capsys, "check", str(model), "--per-layer", "--backends", "c",
                         "--input", str(tmp_path / "s.npz"), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["backends"] == ["c"] and report["first_divergence"] == {"c": None}
    assert len(report["layers"]) == 5
    assert all(set(layer["backends"]) == {"c"} for layer in report["layers"])


def test_per_layer_names_the_first_diverging_op_and_tensor(capsys, model, monkeypatch):
    """One element of the C's ADD output is off by one: the C's column names that op and its
    tensor, runtime_py's agrees."""
    mp = plan_model(parse_model(model.read_bytes()))
    add = next(i for i, op in enumerate(mp.graph.operators) if op.opcode == "ADD")
    tensor = mp.graph.operators[add].outputs[0]
    real = CBackend.trace

    def off_by_one(self, values):
        got = real(self, values)
        flat = got[tensor].reshape(-1)
        flat[7] = np.int8(flat[7] + 1 if flat[7] < 127 else flat[7] - 1)
        return got

    monkeypatch.setattr(CBackend, "trace", off_by_one)
    code, out, _ = run(capsys, "check", str(model), "--per-layer")
    assert code == 1
    name = mp.graph.tensors[tensor].name
    assert f"c: first divergence at op {add} (ADD), tensor {tensor} {name!r}" in out
    assert "runtime_py: every layer agrees" in out
    code, out, _ = run(capsys, "check", str(model), "--per-layer", "--json")
    first = json.loads(out)["first_divergence"]
    assert first["runtime_py"] is None
    assert first["c"]["op"] == add and first["c"]["tensor"] == tensor
    assert first["c"]["mismatches"] == 1 and first["c"]["max_abs_diff"] == 1


@pytest.mark.skipif(not qemu_backend.available(), reason="arm-none-eabi-gcc or QEMU missing")
def test_per_layer_under_qemu(capsys, model):
    code, out, err = run(capsys, "check", str(model), "--per-layer", "--target", "cortex-m4",
                         "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["backends"] == ["runtime_py", "qemu"] and report["ok"]
    mp = plan_model(parse_model(model.read_bytes()), target="cortex-m4")
    with qemu_backend.QemuBackend(mp, trace=True) as backend:
        xs, ys = samples(1, seed=6)
        got = backend.trace([xs[0], ys[0]])
    expected = runtime_py_tracer(mp)([xs[0], ys[0]])
    assert sorted(got) == sorted(expected)
    assert all(np.array_equal(got[t], v) for t, v in expected.items())


def bomb_npy(shape=(2**40, 768)) -> bytes:
    """An .npy whose header declares far more than the few bytes that follow it."""
    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        stream, {"descr": "|i1", "fortran_order": False, "shape": shape})
    return stream.getvalue() + bytes(16)


def one_input(tmp_path) -> str:
    b = ModelBuilder("int8", seed=2)
    x = b.input("x", (1, 4), "int8", scale=0.05, zero_point=0)
    b.output(b.fully_connected(x, 3))
    path = tmp_path / "one.tflite"
    path.write_bytes(b.build())
    return str(path)


def test_array_headers_are_held_against_the_file_before_anything_is_read(capsys, model,
                                                                          tmp_path):
    (tmp_path / "bomb.npy").write_bytes(bomb_npy())
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w") as archive:
        archive.writestr("x.npy", bomb_npy())
        archive.writestr("y.npy", bomb_npy())
    for command, data in (("run", "bomb.npy"), ("check", "bomb.npy"), ("check", "bomb.npz")):
        target = one_input(tmp_path) if data.endswith(".npy") else str(model)
        code, out, err = run(capsys, command, target, "--input", str(tmp_path / data))
        assert code == 2 and not out and err.count("\n") == 1, err
        assert "header declares [1099511627776, 768] of int8" in err and data in err, err


def test_run_refuses_an_archive_in_one_line(capsys, tmp_path):
    np.savez(tmp_path / "x.npz", x=np.zeros((1, 4), np.int8))
    code, out, err = run(capsys, "run", one_input(tmp_path), "--input", str(tmp_path / "x.npz"))
    assert code == 2 and not out and err.count("\n") == 1
    assert "x.npz: an .npz archive: --input takes one .npy array per model input" in err


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_devices_are_refused_as_data_memory_and_problem_files(capsys, tmp_path):
    for name in ("zero.npy", "zero.json", "zero.csv"):
        os.symlink("/dev/zero", tmp_path / name)
    said = "not a regular file (a device, a pipe or a socket)"
    for args in (["run", one_input(tmp_path), "--input", str(tmp_path / "zero.npy")],
                 ["plan", one_input(tmp_path), "--memory", str(tmp_path / "zero.json")],
                 ["solve", str(tmp_path / "zero.csv")]):
        code, out, err = run(capsys, *args)
        assert code == 2 and not out and err.count("\n") == 1 and said in err, (args, err)


def test_a_fifo_in_a_dataset_is_refused_without_blocking(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "a.npy")  # opening it would wait for a writer forever
    result = subprocess.run(
        [sys.executable, "-m", "toolchain.cli", "check", one_input(tmp_path), "--dataset",
         str(data)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "a.npy: not a regular file" in result.stderr


@pytest.mark.parametrize("text, said", [
    ('{"pools": [{"name": "fast", "size": 1024, "section": 5}]}', "section 5 must be a linker"),
    ('{"pools": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
])
def test_memory_files_of_the_wrong_shape_are_one_line(capsys, tmp_path, text, said):
    (tmp_path / "memory.json").write_text(text)
    code, out, err = run(capsys, "plan", one_input(tmp_path), "--memory",
                         str(tmp_path / "memory.json"))
    assert code == 2 and not out and err.count("\n") == 1 and said in err, err


def test_pool_names_that_differ_only_in_case_are_refused(capsys, tmp_path):
    code, out, err = run(capsys, "plan", one_input(tmp_path), "--pool", "fast:1K",
                         "--pool", "FAST:64K")
    assert code == 2 and not out and err.count("\n") == 1
    assert "differ only in case" in err


def test_a_fifo_given_as_the_model_is_refused_at_once(tmp_path):
    """Opening a FIFO blocks until a writer comes: the model is read as any user file is."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "model.tflite"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "toolchain.cli", "inspect", str(fifo)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == f"arenac: {fifo}: not a regular file (a device, a pipe or a socket)\n"
