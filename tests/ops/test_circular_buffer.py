"""CIRCULAR_BUFFER (toolchain/ops/circular_buffer), TFLite Micro's streaming buffer, against
TFLite Micro (LiteRT has no such op): sequences of invokes through `arenac check` on runtime_py,
the sanitized host C and the C on a Cortex-M4 under QEMU. An invoke the buffer ends early must
end early everywhere (TFLite Micro's kTfLiteAbort; check compares that alone, there being no
outputs), and every output of an invoke that ran is TFLite Micro's, bit for bit, across resets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import refusal
from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab import qemu_backend
from toolchain.lab.c_backend import CBackend
from toolchain.lower.plan import plan_model

OP = "CIRCULAR_BUFFER"


def buffered(slots: int, frame: tuple[int, int], options: dict | None = None, buffers: int = 1,
             batch: int = 1, head: bool = True) -> bytes:
    """`buffers` circular buffers one after the other, each over its own input frame; after
    each, a RELU of its frames (`head`), else the frames are the outputs themselves."""
    b = ModelBuilder("int8")
    frames = []
    for k in range(buffers):
        x = b.input(f"frame{k}", (batch, 1, *frame), "int8", 0.1, 2)
        held = b.variable(f"frames{k}", np.zeros((batch, slots, *frame), np.int8), 0.1, 2)
        b.custom(OP, [x], [held], options=options or {})
        frames.append(held)
        if head:
            y = b.tensor(f"y{k}", (batch, slots, *frame), "int8", 0.1, 2)
            b.op("RELU", [held], [y])
            b.output(y)
        else:
            b.output(held)
    return b.build()


def check(model: bytes, tmp_path, capsys, *flags: str) -> dict:
    path = tmp_path / "buffered.tflite"
    path.write_bytes(model)
    code = main(["check", str(path), "--inputs", "2", "--sequence", "7", "--json", *flags])
    out, err = capsys.readouterr()
    assert code == 0, err + out
    report = json.loads(out)
    assert report["ok"] and report["backends"][0] == "tflm", report
    return report


CASES = {  # (slots, frame, options, buffers, batch, invokes of 14 that end early)
    "guessed period 2": (4, (1, 3), None, 1, 1, 8),
    "guessed period 1 (5 slots)": (5, (2, 4), None, 1, 1, 0),
    "guessed period 1 (13 slots)": (13, (1, 2), None, 1, 1, 0),
    "cycles_max 3": (3, (2, 2), {"cycles_max": 3}, 1, 1, 10),
    "cycles_max 1": (4, (1, 3), {"cycles_max": 1}, 1, 1, 0),
    "zero cycles_max is guessed": (4, (1, 3), {"cycles_max": 0}, 1, 1, 8),
    "one slot": (1, (1, 5), {"cycles_max": 2}, 1, 1, 8),
    "batch 2 (TFLite Micro shifts the first's bytes)": (3, (1, 4), None, 1, 2, 8),
    "two buffers, the second waits behind the first": (3, (1, 2), None, 2, 1, 12),
    "the fifth 2 x 96 guess is 1": (2, (2, 96), None, 5, 1, None),
}


@pytest.mark.parametrize("name", CASES)
def test_circular_buffer_matches_tflite_micro(name, tmp_path, capsys):
    slots, frame, options, buffers, batch, ended = CASES[name]
    model = buffered(slots, frame, options, buffers, batch)
    report = check(model, tmp_path, capsys, "--sanitize")
    if ended is not None:
        assert report["ended"] == ended


def test_the_guesses_are_tflite_micros():
    model = parse_model(buffered(2, (2, 96), None, 6), "m")
    periods = [b.params.period for b in plan_model(model).program.bindings if b.opcode == OP]
    assert periods == [2, 2, 2, 2, 1, 2]


@pytest.mark.skipif(bool(qemu_backend.missing()), reason="no Cortex-M toolchain or QEMU")
@pytest.mark.parametrize("head", [True, False])
def test_on_a_cortex_m4(head, tmp_path, capsys):
    check(buffered(4, (1, 6), None, 2, head=head), tmp_path, capsys,
          "--backends", "runtime_py,c,qemu")


def test_an_invoke_that_ends_early_gives_no_outputs_everywhere():
    mp = plan_model(parse_model(buffered(3, (1, 4), {"cycles_max": 3}), "m"))
    values = [[np.full((1, 1, 1, 4), 10 * k, np.int8)] for k in range(1, 7)]
    runtime = ArenaInterpreter(mp)
    mine = [runtime.invoke(v) for v in values]
    with CBackend(mp) as backend:
        c_outputs = backend.invoke_many(values)
    assert [bool(m) for m in mine] == [bool(c) for c in c_outputs] == [False, False, True] * 2
    frames = np.repeat([[10], [20], [30]], 4, axis=1)
    assert np.array_equal(mine[2][0].reshape(3, 4), frames)
    assert np.array_equal(c_outputs[5][0].reshape(3, 4), frames + 30)


def test_the_generated_invoke_returns_waiting():
    from toolchain.c.generate import generate

    files = generate(plan_model(parse_model(buffered(2, (1, 2)), "m")), "kws")
    assert "#define KWS_WAITING 15" in files["kws.h"]
    assert "return KWS_WAITING;" in files["kws.c"]
    plain = generate(plan_model(parse_model(buffered(2, (1, 2), {"cycles_max": 1}), "m")), "kws")
    assert "KWS_WAITING" in plain["kws.h"]  # period 1 still ends no invoke, but may by design


@pytest.mark.parametrize("change, reason", [
    ("not variable", "not a variable tensor"),
    ("option before cycles_max", "first option"),
    ("float", "no kernel"),
])
def test_what_tflite_micro_would_not_run_is_refused(change, reason):
    b = ModelBuilder("int8")
    dtype = "float32" if change == "float" else "int8"
    quant = (None, None) if dtype == "float32" else (0.1, 0)
    x = b.input("frame", (1, 1, 1, 4), dtype, *quant)
    if change == "not variable":
        held = b.tensor("frames", (1, 3, 1, 4), dtype, *quant)
    else:
        held = b.variable("frames", np.zeros((1, 3, 1, 4), dtype), *quant)
    options = {"a_first": 1, "cycles_max": 2} if change == "option before cycles_max" else {}
    b.custom(OP, [x], [held], options=options)
    b.output(held)
    assert reason in refusal(b.build())


def test_run_stacks_the_outputs_of_the_invokes_that_ran(tmp_path, capsys):
    path = tmp_path / "buffered.tflite"
    path.write_bytes(buffered(3, (1, 4), {"cycles_max": 2}))
    steps = tmp_path / "frames.npy"
    np.save(steps, np.arange(5 * 4, dtype=np.int8).reshape(5, 1, 1, 1, 4) + 10)
    out = tmp_path / "out"
    assert main(["run", str(path), "--input", str(steps), "--output-dir", str(out)]) == 0
    assert "3 of them ended early" in capsys.readouterr().out
    ran = np.load(out / "output_0.npy")
    assert ran.shape == (2, 1, 3, 1, 4)
    one = tmp_path / "frame.npy"
    np.save(one, np.zeros((1, 1, 1, 4), np.int8))
    assert main(["run", str(path), "--input", str(one), "--output-dir", str(out)]) == 2
    assert "ended early" in capsys.readouterr().err


def test_bench_says_it_cannot_measure_an_invoke_that_ends_early(tmp_path, capsys):
    path = tmp_path / "buffered.tflite"
    path.write_bytes(buffered(3, (1, 4)))
    assert main(["bench", str(path), "--target", "cortex-m4"]) == 2
    assert "CIRCULAR_BUFFER" in capsys.readouterr().err
