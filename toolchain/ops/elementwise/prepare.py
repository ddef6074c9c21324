"""Params for the elementwise binary ops: ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, SQUARED_DIFFERENCE,
FLOOR_DIV, FLOOR_MOD; and for ADD_N, the sum of any number of same-shaped inputs (`AddNParams`).

Four arithmetic shapes, following TFLite's reference kernels:
- `PlainParams`: float32 and int32 (and int8/uint8/int16 MAXIMUM/MINIMUM, which compare stored
  values): the op in the tensor's own type, then the fused activation's clamp.
- `RescaledParams`: int8, uint8 and int16 ADD and SUB, int8 SQUARED_DIFFERENCE: each input is
  shifted left and rescaled to a common scale by its own multiplier, combined, then rescaled to
  the output. The legacy uint8 kernels compute exactly as the int8 ones, in their own range.
- `ShiftedParams`: int16 ADD and SUB whose scales are all powers of two (TFLite's
  `pot_scale_int16` path): the input with the finer scale is divided by a power of two, the
  sum or difference saturates to int16.
- `ScaledProductParams`: int8, uint8 and int16 MUL: the product of the offset inputs, rescaled
  once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.numerics.quant import (
    ACTIVATION_FLOAT_RANGE,
    INT_RANGES,
    activation_range_quantized,
    per_tensor_quantization,
    quantize_multiplier,
    require_int16_zero_points,
)
from toolchain.ops.striping import ONE_TO_ONE, RowMap, Striping, with_columns, with_rows

# The fused activations TFLite clamps with; it silently ignores any other for float and int32
# (and rejects it for int8), so we refuse them rather than compute something else.
CLAMPING_ACTIVATIONS = frozenset(ACTIVATION_FLOAT_RANGE)

# Left shift that gives int8 inputs headroom before rescaling (add.cc, sub.cc); int16 inputs
# have less room to grow.
ADD_LEFT_SHIFT = 20
INT16_ADD_LEFT_SHIFT = 15
# CheckedLog2's tolerance: a scale this close to a power of two counts as one.
POWER_OF_TWO_TOLERANCE = 1e-3
# gemmlowp's rounding division of an int16 value takes exponents up to 31.
MAX_POWER_OF_TWO_SHIFT = 31
# From this many bits on, that division's 16-bit mask is all ones: every value rounds to 1, or
# to -1 if negative (0 too rounds to 1), as LiteRT computes.
INT16_MASK_BITS = 16
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
class RescaledInputs(BinaryOpParams):
    """Two quantized inputs brought to a common scale: input n becomes
    MultiplyByQuantizedMultiplier((x + offset_n) << left_shift, multiplier_n, shift_n)."""

    dtype: str  # of the inputs
    left_shift: int
    input1_offset: int
    input1_multiplier: int
    input1_shift: int
    input2_offset: int
    input2_multiplier: int
    input2_shift: int


@dataclass(frozen=True)
class RescaledParams(RescaledInputs):
    """int8 and uint8 ADD/SUB (int8 SQUARED_DIFFERENCE): the inputs at a common scale
    (RescaledInputs) are combined (sum, difference, squared difference) and the result is
    rescaled to the output (of the inputs' dtype), offset and clamped."""

    output_offset: int
    output_multiplier: int
    output_shift: int
    activation_min: int
    activation_max: int


@dataclass(frozen=True)
class ShiftedParams(BinaryOpParams):
    """int16 ADD/SUB with power-of-two scales (zero points 0): each input divided by
    2^input<n>_shift with rounding (at most one shift is not 0), then their sum or difference,
    saturated to int16 and clamped."""

    input1_shift: int
    input2_shift: int
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


def _shapes(op: Operator, a: Tensor, b: Tensor, out: Tensor,
            max_rank: int = MAX_BROADCAST_RANK) -> dict:
    """The shape fields of the params, once the inputs are known to broadcast to the output
    (over at most `max_rank` dimensions where their shapes differ)."""
    try:
        broadcast = tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise UnsupportedOpError(f"shapes {a.shape} and {b.shape} do not broadcast") from None
    if broadcast != out.shape:
        raise UnsupportedOpError(f"output shape {out.shape} is not the broadcast {broadcast}")
    if a.shape != b.shape and len(broadcast) > max_rank:
        raise UnsupportedOpError(f"broadcasting over more than {max_rank} dimensions")
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
    """int8, uint8 and int16 MAXIMUM/MINIMUM compare stored values, which means something only
    when both inputs and the output share one quantization (TFLite checks neither scales nor
    zero points, int16 ones included; we refuse otherwise)."""
    if len({per_tensor_quantization(t) for t in (a, b, out)}) != 1:
        raise UnsupportedOpError(f"{out.dtype} inputs and output need identical quantization")
    return PlainParams(**_shapes(op, a, b, out), dtype=out.dtype, clamp_min=None, clamp_max=None)


def _checked_log2(scale: float) -> int | None:
    """CheckedLog2 in float32: the rounded log2 of the scale if that is within 1e-3 of it (the
    scale is a power of two, near enough), else None."""
    log2 = float(np.float32(np.log(np.float32(scale))) * np.float32(1.0 / np.log(2.0)))
    rounded = round(log2)
    return rounded if abs(log2 - rounded) < POWER_OF_TWO_TOLERANCE else None


def _int16_power_of_two_log2s(op: Operator, a: Tensor, b: Tensor,
                              out: Tensor) -> tuple[int, int, int] | None:
    """TFLite's choice between the two 16x8 ADD/SUB paths: the shift path when the options set
    `pot_scale_int16` (the schema's default once the options table is there; an op without
    one reads false) and every scale is a power of two. Then the scales' log2, else None."""
    if not op.options.get("pot_scale_int16", False):
        return None
    log2s = tuple(_checked_log2(per_tensor_quantization(t)[0]) for t in (a, b, out))
    return None if None in log2s else log2s


def _prepare_int16_shifted(op: Operator, a: Tensor, b: Tensor, out: Tensor,
                           log2s: tuple[int, int, int]) -> ShiftedParams:
    """add.cc / sub.cc on power-of-two scales: an input whose scale is 2^k times finer than the
    output's is divided by 2^k; TFLite requires the other input to be at the output's scale."""
    log2_1, log2_2, log2_out = log2s
    shift1, shift2 = log2_out - log2_1, log2_out - log2_2
    if min(shift1, shift2) < 0:
        raise UnsupportedOpError("int16 power-of-two scales: an input scale is coarser than "
                                 "the output's (TFLite refuses it)")
    if shift1 and shift2:
        raise UnsupportedOpError("int16 power-of-two scales: both input scales differ from "
                                 "the output's (TFLite refuses it)")
    if max(shift1, shift2) > MAX_POWER_OF_TWO_SHIFT:
        raise UnsupportedOpError(f"int16 power-of-two scales: an input shift of more than "
                                 f"{MAX_POWER_OF_TWO_SHIFT} bits")
    if op.opcode == "ADD" and not a.num_elements == b.num_elements == out.num_elements:
        raise UnsupportedOpError("int16 ADD with power-of-two scales does not broadcast "
                                 "(TFLite aborts)")
    act_min, act_max = activation_range_quantized(_activation(op), out)
    return ShiftedParams(**_shapes(op, a, b, out), input1_shift=shift1, input2_shift=shift2,
                         activation_min=act_min, activation_max=act_max)


def _prepare_int8_rescaled(op: Operator, a: Tensor, b: Tensor, out: Tensor, left_shift: int,
                           output_scale_power: int) -> RescaledParams | ShiftedParams:
    """The common-scale pipeline of add.cc / sub.cc / squared_difference.cc, in double as there:
    both inputs go to half the larger input scale and the output multiplier undoes that
    (squared for SQUARED_DIFFERENCE: `output_scale_power` 2). int16 ADD and SUB (zero points
    0) shift less, or take the shift path of power-of-two scales."""
    if out.dtype == "int16":
        require_int16_zero_points(a, b, out)
        log2s = _int16_power_of_two_log2s(op, a, b, out)
        if log2s is not None:
            return _prepare_int16_shifted(op, a, b, out, log2s)
        left_shift = INT16_ADD_LEFT_SHIFT
    (scale1, zp1), (scale2, zp2), (scale_out, zp_out) = map(per_tensor_quantization, (a, b, out))
    twice_max_input_scale = 2.0 * max(scale1, scale2)
    real_output = twice_max_input_scale**output_scale_power / (
        (1 << (left_shift * output_scale_power)) * scale_out)
    m1, s1 = _multiplier_below_one(scale1 / twice_max_input_scale, "input1")
    m2, s2 = _multiplier_below_one(scale2 / twice_max_input_scale, "input2")
    m_out, s_out = _multiplier_below_one(real_output, "output")
    if op.opcode in FUSED_ACTIVATION_OPS:
        act_min, act_max = activation_range_quantized(_activation(op), out)
    else:
        act_min, act_max = INT_RANGES[out.dtype]
    return RescaledParams(
        **_shapes(op, a, b, out), dtype=out.dtype, left_shift=left_shift,
        input1_offset=-zp1, input1_multiplier=m1, input1_shift=s1,
        input2_offset=-zp2, input2_multiplier=m2, input2_shift=s2,
        output_offset=zp_out, output_multiplier=m_out, output_shift=s_out,
        activation_min=act_min, activation_max=act_max)


def _prepare_int8_product(op: Operator, a: Tensor, b: Tensor, out: Tensor) -> ScaledProductParams:
    """mul.cc: real multiplier in1_scale * in2_scale / out_scale, evaluated in float (the
    scales are floats and the expression is not cast) before it is widened to double."""
    require_int16_zero_points(a, b, out)
    (scale1, zp1), (scale2, zp2), (scale_out, zp_out) = map(per_tensor_quantization, (a, b, out))
    real = float(np.float32(scale1) * np.float32(scale2) / np.float32(scale_out))
    multiplier, shift = quantize_multiplier(real)
    act_min, act_max = activation_range_quantized(_activation(op), out)
    return ScaledProductParams(
        **_shapes(op, a, b, out), input1_offset=-zp1, input2_offset=-zp2, output_offset=zp_out,
        output_multiplier=multiplier, output_shift=shift,
        activation_min=act_min, activation_max=act_max)


# The quantized pipeline of each op that runs on int8 (and on uint8 and int16, but
# SQUARED_DIFFERENCE: its TFLite kernel computes int8 only).
_QUANTIZED_PREPARE = {
    "ADD": partial(_prepare_int8_rescaled, left_shift=ADD_LEFT_SHIFT, output_scale_power=1),
    "SUB": partial(_prepare_int8_rescaled, left_shift=ADD_LEFT_SHIFT, output_scale_power=1),
    "SQUARED_DIFFERENCE": partial(_prepare_int8_rescaled, left_shift=SQUARED_DIFFERENCE_LEFT_SHIFT,
                                  output_scale_power=2),
    "MUL": _prepare_int8_product,
    "MAXIMUM": _prepare_int8_select,
    "MINIMUM": _prepare_int8_select,
}


OPCODES = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "FLOOR_DIV",
           "FLOOR_MOD")

# dtypes each op runs on: float32 and int32 everywhere, the quantized types where it has a
# pipeline. TFLite's SQUARED_DIFFERENCE takes neither uint8 nor int16: its Eval fails on any
# other output type than float32, int32 and int8.
_QUANTIZED_DTYPES = {"ADD": {"int8", "uint8", "int16"}, "SUB": {"int8", "uint8", "int16"},
                     "MUL": {"int8", "uint8", "int16"}, "MAXIMUM": {"int8", "uint8", "int16"},
                     "MINIMUM": {"int8", "uint8", "int16"}, "SQUARED_DIFFERENCE": {"int8"}}
DTYPES: dict[str, frozenset[str]] = {
    opcode: frozenset({"float32", "int32", *_QUANTIZED_DTYPES.get(opcode, ())})
    for opcode in OPCODES
}


def prepare(graph: Graph, op: Operator) -> BinaryOpParams:
    """int8, uint8 and int16 take the op's quantized pipeline; float32 and int32 the plain
    one."""
    a, b, out = _operands(graph, op)
    if out.dtype not in DTYPES[op.opcode]:
        raise UnsupportedOpError(f"{op.opcode} on {out.dtype}")
    if out.dtype in ("int8", "uint8", "int16"):
        return _QUANTIZED_PREPARE[op.opcode](op, a, b, out)
    return _prepare_plain(op, a, b, out)


# -- by bands of output rows (toolchain.ops.striping) -------------------------------------------


def binary_rows(p: BinaryOpParams) -> RowMap | None:
    """Row r of the output reads row r of each input, when neither broadcasts."""
    return _binary_axis(p, 1)


def binary_band(p: BinaryOpParams, out_lo: int, out_hi: int, in_lo: int,
                in_hi: int) -> BinaryOpParams:
    """The op on output rows [out_lo, out_hi), the same rows of each input."""
    return _binary_cut(p, with_rows, out_hi - out_lo)


def binary_columns(p: BinaryOpParams) -> RowMap | None:
    """Column c of the output reads column c of each input, when neither broadcasts."""
    return _binary_axis(p, 2)


def binary_column_band(p: BinaryOpParams, out_lo: int, out_hi: int, in_lo: int,
                       in_hi: int) -> BinaryOpParams:
    """The op on output columns [out_lo, out_hi), the same columns of each input."""
    return _binary_cut(p, with_columns, out_hi - out_lo)


def _binary_axis(p: BinaryOpParams, axis: int) -> RowMap | None:
    same = p.input1_shape == p.input2_shape == p.output_shape
    return replace(ONE_TO_ONE, rows=p.output_shape[axis]) if same else None


def _binary_cut(p: BinaryOpParams, cut, size: int) -> BinaryOpParams:
    return replace(p, input1_shape=cut(p.input1_shape, size),
                   input2_shape=cut(p.input2_shape, size), output_shape=cut(p.output_shape, size))


def binary_band_key(p: BinaryOpParams) -> tuple:
    return (p.input1_shape, p.input2_shape, p.output_shape)


BINARY_STRIPING = Striping(binary_rows, binary_band, binary_band_key, every_input=True,
                           columns=binary_columns, column_band=binary_column_band)


@dataclass(frozen=True)
class AddNParams:
    """ADD_N of `inputs` tensors of `elements` each, in `dtype` (float32 or int32): LiteRT's sum,
    the first input plus each other in turn, int32 wrapping. (TFLite Micro's starts from 0, so
    there -0.0 + -0.0 gives +0.0, where LiteRT, and arenac, give -0.0.)"""

    dtype: str
    inputs: int
    elements: int


def prepare_add_n(graph: Graph, op: Operator) -> AddNParams:
    """Every input and the output have one shape: ADD_N does not broadcast."""
    if len(op.inputs) < 2:
        raise UnsupportedOpError(f"ADD_N of {len(op.inputs)} input(s): TFLite's kernel takes two "
                                 "or more")
    tensors = [graph.tensors[i] for i in op.inputs]
    out = graph.tensors[op.outputs[0]]
    for t in tensors:
        if t.shape != out.shape:
            raise UnsupportedOpError(f"input '{t.name}' of shape {list(t.shape)}: ADD_N adds "
                                     f"inputs of the output's shape {list(out.shape)}")
    return AddNParams(out.dtype, len(tensors), out.num_elements)
