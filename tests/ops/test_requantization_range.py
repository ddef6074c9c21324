"""Operators with odd but legal quantization: where a requantization is out of range, LiteRT's
kernels shift by more bits than an int32 holds (undefined in C++: it gives different garbage on
different machines, or aborts), so we refuse with the reason; where it is only tiny, both flush
it to zero and agree. Never code that differs from the oracle silently."""

from __future__ import annotations

import pytest

from tests.opcheck import refusal
from toolchain.cli import main
from toolchain.front.builder import ModelBuilder


def binary_model(opcode: str, dtype: str, out_scale: float) -> bytes:
    b = ModelBuilder()
    zero_point = 128 if dtype == "uint8" else 0
    x = b.input("x", (1, 8), dtype, 0.5, zero_point)
    y = b.input("y", (1, 8), dtype, 0.5, zero_point)
    z = b.tensor("z", (1, 8), dtype, out_scale, zero_point)
    b.op(opcode, [x, y], [z], {"fused_activation_function": "NONE"})
    b.output(z)
    return b.build()


CASES = [(opcode, dtype) for opcode in ("ADD", "SUB", "MUL") for dtype in ("uint8", "int8")]


@pytest.mark.parametrize("opcode, dtype", CASES)
@pytest.mark.parametrize("out_scale", [1e-35, 1e-12])
def test_an_output_scale_no_int32_shift_reaches_is_refused(opcode, dtype, out_scale):
    reason = refusal(binary_model(opcode, dtype, out_scale))
    assert "requantization by" in reason or "multiplier" in reason, reason


@pytest.mark.parametrize("opcode, dtype", CASES)
def test_a_vanishing_requantization_agrees_with_the_oracle(opcode, dtype, tmp_path, capsys):
    path = tmp_path / "m.tflite"
    path.write_bytes(binary_model(opcode, dtype, 1e30))
    assert main(["check", str(path), "--inputs", "2"]) == 0
    assert "verdict: all backends agree" in capsys.readouterr().out
