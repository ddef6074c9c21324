"""Params for the elementwise binary ops: ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, SQUARED_DIFFERENCE.

Three arithmetic shapes, following TFLite's reference kernels:
- `PlainParams`: float32 and int32 (and int8 MAXIMUM/MINIMUM, which compare stored values): the
  op in the tensor's own type, then the fused activation's clamp.
- `RescaledParams`: int8 ADD, SUB and SQUARED_DIFFERENCE: each input is shifted left and
  rescaled to a common scale by its own multiplier, combined, then rescaled to the output.
- `ScaledProductParams`: int8 MUL: the product of the offset inputs, rescaled once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops.spec import OpSpec
from toolchain.quant import (
    ACTIVATION_FLOAT_RANGE,
    INT_RANGES,
    activation_range_quantized,
    int8_quantization,
    quantize_multiplier,
)

# The fused activations TFLite clamps with; it silently ignores any other for float and int32
# (and rejects it for int8), so we refuse them rather than compute something else.
CLAMPING_ACTIVATIONS = frozenset(ACTIVATION_FLOAT_RANGE)

# Left shift that gives int8 inputs headroom before rescaling (add.cc, sub.cc).
ADD_LEFT_SHIFT = 20
# squared_difference.cc shifts less so that the square of the difference fits in int32.
SQUARED_DIFFERENCE_LEFT_SHIFT = 7

# Ops whose options carry a fused activation.
FUSED_ACTIVATION_OPS = frozenset({"ADD", "SUB", "MUL", "DIV"})

# Most dimensions a broadcast (unequal input shapes) may have: the reference kernels' 6-D loops,
# and what a generated C loop nest spells out. Equal shapes run flat at any rank.
MAX_BROADCAST_RANK = 6


@dataclass(frozen=True)
class BinaryOpParams:
    """What every elementwise binary op knows: which op, and the (numpy-broadcast) shapes."""

    opcode: str
    input1_shape: tuple[int, ...]
    input2_shape: tuple[int, ...]
    output_shape: tuple[int, ...]


@dataclass(frozen=True)
class PlainParams(BinaryOpParams):
    """The op computed in the tensors' own type (int32 wrapping as C does), then clamped to
    [clamp_min, clamp_max]; `clamp_min` is None for ops without a fused activation."""

    dtype: str
    clamp_min: float | int | None
    clamp_max: float | int | None


@dataclass(frozen=True)
class RescaledParams(BinaryOpParams):
    """int8 ADD/SUB/SQUARED_DIFFERENCE: each input, offset and shifted left, is rescaled by its
    own multiplier to a common scale; the two are combined (sum, difference, squared
    difference) and the result is rescaled to the output, offset and clamped."""

    left_shift: int
    input1_offset: int
    input1_multiplier: int
    input1_shift: int
    input2_offset: int
    input2_multiplier: int
    input2_shift: int
    output_offset: int
    output_multiplier: int
    output_shift: int
    activation_min: int
    activation_max: int


@dataclass(frozen=True)
class ScaledProductParams(BinaryOpParams):
    """int8 MUL: out = offset + rescale((in1 + off1) * (in2 + off2)), clamped."""

    input1_offset: int
    input2_offset: int
    output_offset: int
    output_multiplier: int
    output_shift: int
    activation_min: int
    activation_max: int


def _operands(graph: Graph, op: Operator) -> tuple[Tensor, Tensor, Tensor]:
    if len(op.inputs) != 2 or len(op.outputs) != 1 or min(op.inputs) < 0:
        raise UnsupportedOpError(f"{op.opcode} needs exactly two inputs and one output")
    a, b = (graph.tensors[i] for i in op.inputs)
    out = graph.tensors[op.outputs[0]]
    if not a.dtype == b.dtype == out.dtype:
        raise UnsupportedOpError(
            f"{op.opcode} with mixed dtypes {a.dtype}, {b.dtype} -> {out.dtype}")
    return a, b, out


def _shapes(op: Operator, a: Tensor, b: Tensor, out: Tensor) -> dict:
    """The shape fields of the params, once the inputs are known to broadcast to the output."""
    try:
        broadcast = tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise UnsupportedOpError(f"shapes {a.shape} and {b.shape} do not broadcast") from None
    if broadcast != out.shape:
        raise UnsupportedOpError(f"output shape {out.shape} is not the broadcast {broadcast}")
    if a.shape != b.shape and len(broadcast) > MAX_BROADCAST_RANK:
        raise UnsupportedOpError(f"broadcasting over more than {MAX_BROADCAST_RANK} dimensions")
    return {"opcode": op.opcode, "input1_shape": a.shape, "input2_shape": b.shape,
            "output_shape": out.shape}


def _activation(op: Operator) -> str:
    activation = op.options.get("fused_activation_function", "NONE")
    if activation not in CLAMPING_ACTIVATIONS:
        raise UnsupportedOpError(f"fused activation {activation}")
    return activation


def _plain_clamp(activation: str, dtype: str) -> tuple[float | int, float | int]:
    """CalculateActivationRange<T>: unbounded ends become the type's extremes, so float results
    of +-inf are clamped to +-FLT_MAX even without an activation."""
    low, high = ACTIVATION_FLOAT_RANGE[activation]
    if dtype == "float32":
        extreme = float(np.finfo(np.float32).max)
        return max(low, -extreme), min(high, extreme)
    type_min, type_max = INT_RANGES[dtype]
    return int(max(low, type_min)), int(min(high, type_max))


def _multiplier_below_one(real: float, what: str) -> tuple[int, int]:
    """QuantizeMultiplierSmallerThanOneExp, which TFLite asserts is given a value in (0, 1)."""
    multiplier, shift = quantize_multiplier(real)
    if not 0.0 < real < 1.0 or shift > 0:
        raise UnsupportedOpError(f"{what} multiplier {real} is outside (0, 1)")
    return multiplier, shift


def _prepare_plain(op: Operator, a: Tensor, b: Tensor, out: Tensor) -> PlainParams:
    """float32 and int32: the op in their own type, clamped by the fused activation if any."""
    if op.opcode in FUSED_ACTIVATION_OPS:
        clamp_min, clamp_max = _plain_clamp(_activation(op), out.dtype)
    else:
        clamp_min = clamp_max = None
    return PlainParams(**_shapes(op, a, b, out), dtype=out.dtype,
                       clamp_min=clamp_min, clamp_max=clamp_max)


def _prepare_int8_select(op: Operator, a: Tensor, b: Tensor, out: Tensor) -> PlainParams:
    """int8 MAXIMUM/MINIMUM compare stored values, which means something only when both inputs
    and the output share one quantization (TFLite does not check; we refuse otherwise)."""
    if len({int8_quantization(t) for t in (a, b, out)}) != 1:
        raise UnsupportedOpError("int8 inputs and output need identical quantization")
    return PlainParams(**_shapes(op, a, b, out), dtype=out.dtype, clamp_min=None, clamp_max=None)


def _prepare_int8_rescaled(op: Operator, a: Tensor, b: Tensor, out: Tensor, left_shift: int,
                           output_scale_power: int) -> RescaledParams:
    """The common-scale pipeline of add.cc / sub.cc / squared_difference.cc, in double as there:
    both inputs go to half the larger input scale and the output multiplier undoes that
    (squared for SQUARED_DIFFERENCE: `output_scale_power` 2)."""
    (scale1, zp1), (scale2, zp2), (scale_out, zp_out) = map(int8_quantization, (a, b, out))
    twice_max_input_scale = 2.0 * max(scale1, scale2)
    real_output = twice_max_input_scale**output_scale_power / (
        (1 << (left_shift * output_scale_power)) * scale_out)
    m1, s1 = _multiplier_below_one(scale1 / twice_max_input_scale, "input1")
    m2, s2 = _multiplier_below_one(scale2 / twice_max_input_scale, "input2")
    m_out, s_out = _multiplier_below_one(real_output, "output")
    if op.opcode in FUSED_ACTIVATION_OPS:
        act_min, act_max = activation_range_quantized(_activation(op), out)
    else:
        act_min, act_max = INT_RANGES["int8"]
    return RescaledParams(
        **_shapes(op, a, b, out), left_shift=left_shift,
        input1_offset=-zp1, input1_multiplier=m1, input1_shift=s1,
        input2_offset=-zp2, input2_multiplier=m2, input2_shift=s2,
        output_offset=zp_out, output_multiplier=m_out, output_shift=s_out,
        activation_min=act_min, activation_max=act_max)


def _prepare_int8_product(op: Operator, a: Tensor, b: Tensor, out: Tensor) -> ScaledProductParams:
    """mul.cc: real multiplier in1_scale * in2_scale / out_scale, evaluated in float (the
    scales are floats and the expression is not cast) before it is widened to double."""
    (scale1, zp1), (scale2, zp2), (scale_out, zp_out) = map(int8_quantization, (a, b, out))
    real = float(np.float32(scale1) * np.float32(scale2) / np.float32(scale_out))
    multiplier, shift = quantize_multiplier(real)
    act_min, act_max = activation_range_quantized(_activation(op), out)
    return ScaledProductParams(
        **_shapes(op, a, b, out), input1_offset=-zp1, input2_offset=-zp2, output_offset=zp_out,
        output_multiplier=multiplier, output_shift=shift,
        activation_min=act_min, activation_max=act_max)


# int8 pipeline of each op that runs on int8.
_INT8_PREPARE = {
    "ADD": partial(_prepare_int8_rescaled, left_shift=ADD_LEFT_SHIFT, output_scale_power=1),
    "SUB": partial(_prepare_int8_rescaled, left_shift=ADD_LEFT_SHIFT, output_scale_power=1),
    "SQUARED_DIFFERENCE": partial(_prepare_int8_rescaled, left_shift=SQUARED_DIFFERENCE_LEFT_SHIFT,
                                  output_scale_power=2),
    "MUL": _prepare_int8_product,
    "MAXIMUM": _prepare_int8_select,
    "MINIMUM": _prepare_int8_select,
}


OPCODES = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE")

# dtypes each op runs on: float32 and int32 everywhere, int8 where it has a pipeline.
DTYPES: dict[str, frozenset[str]] = {
    opcode: frozenset({"float32", "int32"} | ({"int8"} if opcode in _INT8_PREPARE else set()))
    for opcode in OPCODES
}


def prepare(graph: Graph, op: Operator) -> BinaryOpParams:
    """int8 takes its op's quantized pipeline; float32 and int32 the plain one."""
    a, b, out = _operands(graph, op)
    if out.dtype not in DTYPES[op.opcode]:
        raise UnsupportedOpError(f"{op.opcode} on {out.dtype}")
    if out.dtype == "int8":
        return _INT8_PREPARE[op.opcode](op, a, b, out)
    return _prepare_plain(op, a, b, out)


SPECS: tuple[OpSpec, ...] = tuple(OpSpec(opcode, DTYPES[opcode], prepare) for opcode in OPCODES)
