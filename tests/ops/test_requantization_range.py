"""Operators with odd but legal quantization, every operator that requantizes: where a
requantization is out of range, LiteRT's kernels shift by more bits than an int32 holds, or cast
a float past int32 to int32 (undefined in C++: it gives different garbage on different machines,
different builds, or aborts), so we refuse with the reason; where it is only tiny, both flush it
to zero and agree. The fully connected requantization is in double and saturates as x86 casts
(toolchain/numerics/rounding.py): that one agrees at every scale. Never code that differs from
the oracle silently."""

from __future__ import annotations

import numpy as np
import pytest

from tests.opcheck import refusal
from toolchain.cli import main
from toolchain.front.builder import ModelBuilder

SHAPE = (1, 4, 4, 4)


def one_op_model(opcode: str, dtype: str, out_scale: float) -> bytes:
    """`opcode` over inputs of scale 0.5 (and its constants), its output of `out_scale`."""
    b = ModelBuilder()
    zero_point = 128 if dtype == "uint8" else 0
    x = b.input("x", SHAPE, dtype, 0.5, zero_point)
    inputs, options, out_shape = [x], {}, SHAPE
    weight = {"CONV_2D": (3, 1, 1, 4), "DEPTHWISE_CONV_2D": (1, 1, 1, 4),
              "FULLY_CONNECTED": (3, 4)}.get(opcode)
    if opcode in ("ADD", "SUB", "MUL", "SQUARED_DIFFERENCE", "BATCH_MATMUL"):
        inputs.append(b.input("y", SHAPE, dtype, 0.5, zero_point))
    elif opcode == "CONCATENATION":
        inputs.append(b.input("y", SHAPE, dtype, 0.5, zero_point))
        options, out_shape = {"axis": 3}, (1, 4, 4, 8)
    elif opcode == "PRELU":
        inputs.append(b.const("alpha", np.full(4, 3, np.int8), 0.01, 0))
    elif opcode in ("MEAN", "SUM"):
        inputs.append(b.const("axis", np.array([1, 2], np.int32)))
        options, out_shape = {"keep_dims": True}, (1, 1, 1, 4)
    elif opcode == "LEAKY_RELU":
        options = {"alpha": 0.3}
    elif weight:
        units = weight[0] if opcode != "DEPTHWISE_CONV_2D" else weight[-1]
        inputs += [b.const("w", np.full(weight, 5, np.int8), 0.02, 0),
                   b.const("bias", np.zeros(units, np.int32), 0.01, 0)]
        options = {"padding": "VALID", "stride_h": 1, "stride_w": 1}
        if opcode == "DEPTHWISE_CONV_2D":
            options["depth_multiplier"] = 1
        out_shape = {"CONV_2D": (1, 4, 4, 3), "FULLY_CONNECTED": (16, 3)}.get(opcode, SHAPE)
        if opcode == "FULLY_CONNECTED":
            options = {}
    z = b.tensor("z", out_shape, dtype, out_scale, zero_point)
    b.op(opcode, inputs, [z], options)
    b.output(z)
    return b.build()


# Every int8/uint8 kernel that requantizes to its output's scale: (opcode, dtype).
REQUANTIZING = [(opcode, dtype) for opcode in ("ADD", "SUB", "MUL", "QUANTIZE", "MEAN", "SUM",
                                               "RELU", "RELU6", "TANH")
                for dtype in ("int8", "uint8")] + [
    (opcode, "int8") for opcode in ("CONV_2D", "DEPTHWISE_CONV_2D", "LEAKY_RELU", "HARD_SWISH",
                                    "ELU", "PRELU", "SQUARED_DIFFERENCE", "BATCH_MATMUL")
] + [("CONCATENATION", "uint8")]
# Those that run the tiny scales LiteRT does, the same way (see the module's docstring).
AGREE_AT_EVERY_SCALE = [("FULLY_CONNECTED", "int8")]


@pytest.mark.parametrize("opcode, dtype", REQUANTIZING)
@pytest.mark.parametrize("out_scale", [1e-35, 1e-12])
def test_an_output_scale_no_int32_requantization_reaches_is_refused(opcode, dtype, out_scale):
    reason = refusal(one_op_model(opcode, dtype, out_scale))
    assert any(words in reason for words in (
        "requantization by", "multiplier", "leaves int32", "pass int32")), reason


@pytest.mark.parametrize("opcode, dtype", REQUANTIZING + AGREE_AT_EVERY_SCALE)
def test_a_vanishing_requantization_agrees_with_the_oracle(opcode, dtype, tmp_path, capsys):
    path = tmp_path / "m.tflite"
    path.write_bytes(one_op_model(opcode, dtype, 1e30))
    assert main(["check", str(path), "--inputs", "2"]) == 0
    assert "verdict: all backends agree" in capsys.readouterr().out


@pytest.mark.parametrize("out_scale", [1e-35, 1e-12])
def test_fully_connected_past_int32_agrees_with_the_oracle(out_scale, tmp_path, capsys):
    path = tmp_path / "m.tflite"
    path.write_bytes(one_op_model("FULLY_CONNECTED", "int8", out_scale))
    assert main(["check", str(path), "--inputs", "2"]) == 0
    assert "verdict: all backends agree" in capsys.readouterr().out
