"""Params for the activation ops, following the kernels TFLite's BUILTIN_REF resolver registers
(activations.cc, l2norm.cc) for float32 and int8:

- RELU, RELU6, RELU_N1_TO_1: float clamps; int8 requantizes `x - zp_in` to the output scale
  (QuantizedReluX) and clamps to the activation's range in output integers.
- LOGISTIC, TANH: int8 looks up a 256-entry table built in float in Prepare (the reference and
  generic kernels; only kFixedPointOptimized, which no resolver registers, computes in 16-bit
  fixed point).
- SOFTMAX: int8 runs gemmlowp fixed point with constants from PreprocessSoftmaxScaling (5 integer
  bits for the scaled difference); the float LUT belongs to the optimized kernel only.
- LEAKY_RELU, PRELU: int8 rescales the non-negative and the negative side with their own
  multipliers; PRELU multiplies by the quantized alpha (broadcast to the input) first.
- HARD_SWISH: int8 in 16-bit fixed point with an output and a "reluish" multiplier.
- L2_NORMALIZATION: int8 through gemmlowp's inverse square root, output fixed at 1/128.

int16 (16x8, zero points 0): RELU, RELU6 and LEAKY_RELU requantize as int8 does; LOGISTIC and
TANH rescale the input to 1/(3 * 4096) per step and interpolate in a fixed sigmoid table
(reference_integer_ops::Logistic / Tanh); SOFTMAX looks up exp and 1 / (1 + x) in two 513-entry
tables (reference_ops::SoftmaxInt16); PRELU takes an int8 alpha and rescales as int8 does.
TFLite has no int16 kernel for RELU_N1_TO_1 or HARD_SWISH.

Real multipliers are derived as there: `a / b` and `a * b / c` of float scales are float32
expressions widened to double; only int8 SOFTMAX's beta * scale is multiplied in double (int16
SOFTMAX's in float32).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.ir import INT32_MAX, Graph, Operator, Tensor
from toolchain.numerics.quant import (
    ACTIVATION_FLOAT_RANGE,
    INT_RANGES,
    activation_range_quantized,
    per_tensor_quantization,
    quantize_multiplier,
    require_int16_zero_points,
)
from toolchain.numerics.tables import (
    checked_log2,
    elu_float32,
    logistic_float32,
    lookup_table,
    tanhf,
)
from toolchain.ops.spec import required_input

f32 = np.float32

# Integer bits of the scaled input difference in the int8 softmax (Q5.26).
SOFTMAX_SCALED_DIFF_INTEGER_BITS = 5
# Its input scaling is capped below 2^31, so its left shift reaches 31 (a requantization's, 30).
SOFTMAX_MAX_LEFT_SHIFT = 31
SOFTMAX_INT8_OUTPUT = (1.0 / 256.0, -128)
LOGISTIC_INT8_OUTPUT_SCALE = 1.0 / 256.0
L2_NORMALIZATION_INT8_OUTPUT = (1.0 / 128.0, 0)
# The reference float L2 normalization divides by max(norm, this).
L2_NORMALIZATION_EPSILON = 1e-6
# HARD_SWISH works on the input shifted left by 7 bits, and represents 3.0 by 2^15.
HARD_SWISH_HIRES_SHIFT = 7
HARD_SWISH_RELUISH_SCALE = f32(3.0) / f32(32768.0)
# Its right shifts run on int16 values, where gemmlowp's rounding shift works up to 15 bits.
HARD_SWISH_MAX_RIGHT_SHIFT = 15
# int16 LOGISTIC and TANH: the input is rescaled to steps of 1 / (3 * 4096) (2^17 steps are
# about 10.7) by a multiplier and a rounding right shift; TFLite doubles its multiplier (from
# in_scale * 4096 * 3) until it exceeds this, at most 31 times.
INT16_SIGMOID_STEPS_PER_UNIT = 3 * 4096
INT16_SIGMOID_MULTIPLIER_FLOOR = 32767.0 / 2.0
INT16_SIGMOID_MAX_SHIFT = 31
# A power-of-two input scale 2^(k - 12) (12 fractional bits: 3 integer bits of 15) skips the
# loop when k is one of these (TFLite's input_left_shift): the multiplier is then 3 * 2^k, with
# no shift.
INT16_SIGMOID_POT_FRACTION_BITS = 12
INT16_POT_SHIFTS = {"LOGISTIC": (0,), "TANH": (0, 1)}
# Its output has 15 fractional bits; LOGISTIC's output scale must be exactly 2^-15.
INT16_SIGMOID_OUTPUT_LOG2 = -15
# The input times the multiplier is an int32 product in TFLite: within range for every int16
# input below this multiplier.
INT16_SIGMOID_MULTIPLIER_LIMIT = 1 << 16
# int16 SOFTMAX: differences to the row's max rescaled so that [-65535, 0] is [-10, 0], the
# scale of its exp table's input; its output must be 1/32768 to within a thousandth.
INT16_SOFTMAX_DIFF_SCALE = 10.0 / 65535.0
INT16_SOFTMAX_OUTPUT_SCALE = f32(1.0) / f32(32768.0)
INT16_SOFTMAX_OUTPUT_TOLERANCE = f32(0.001) * f32(1.0) / f32(32768.0)
# Each exponential is at most 32767, so a row of at most this many sums within int32.
INT16_SOFTMAX_MAX_DEPTH = 1 << 16


# -- params ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FloatClampParams:
    """float RELU / RELU6 / RELU_N1_TO_1: min(max(x, low), high)."""

    low: float
    high: float


@dataclass(frozen=True)
class FloatFunctionParams:
    """float LOGISTIC / TANH / HARD_SWISH / ELU: the reference kernel's float32 formula by name."""

    function: str


@dataclass(frozen=True)
class RequantizeClampParams:
    """int8 RELU family: out = clamp(output_zero_point + rescale(x - input_zero_point))."""

    input_zero_point: int
    output_zero_point: int
    multiplier: int
    shift: int
    low: int
    high: int


@dataclass(frozen=True)
class LookupTableParams:
    """int8 LOGISTIC / TANH: out = table[x viewed as uint8]."""

    table: np.ndarray  # int8[256]


@dataclass(frozen=True)
class FloatLeakyReluParams:
    """float LEAKY_RELU: x > 0 ? x : x * alpha."""

    alpha: float


@dataclass(frozen=True)
class QuantizedLeakyReluParams:
    """int8 or int16 LEAKY_RELU: v = x - input_zero_point; out = output_zero_point + (v >= 0 ?
    rescale_identity(v) : rescale_alpha(v)), clamped to the type's [low, high]; a negative
    alpha gives a negative alpha multiplier, applied as the negated product of its magnitude."""

    low: int
    high: int
    input_zero_point: int
    output_zero_point: int
    identity_multiplier: int
    identity_shift: int
    alpha_multiplier: int
    alpha_shift: int


@dataclass(frozen=True)
class FloatPreluParams:
    """float PRELU: x >= 0 ? x : x * alpha, alpha broadcast to the input's shape."""

    input_shape: tuple[int, ...]
    alpha_shape: tuple[int, ...]


@dataclass(frozen=True)
class QuantizedPreluParams:
    """int8 PRELU, or int16 with an int8 alpha: v = x - input_zero_point; out =
    output_zero_point + (v >= 0 ? rescale_identity(v) : rescale_alpha(v * (alpha -
    alpha_zero_point))), clamped to the output type's [low, high]."""

    input_shape: tuple[int, ...]
    alpha_shape: tuple[int, ...]
    low: int
    high: int
    input_zero_point: int
    alpha_zero_point: int
    output_zero_point: int
    identity_multiplier: int
    identity_shift: int
    alpha_multiplier: int
    alpha_shift: int


@dataclass(frozen=True)
class QuantizedHardSwishParams:
    """int8 HARD_SWISH (reference_ops::HardSwish): int16 multipliers with their exponents, one
    taking the 2^7-scaled input to the output scale, one to the [-3, 3] -> [-1, 1] "reluish"
    scale; output_exponent is <= 0."""

    input_zero_point: int
    output_zero_point: int
    output_multiplier: int
    output_exponent: int
    reluish_multiplier: int
    reluish_exponent: int


@dataclass(frozen=True)
class Int16SigmoidParams:
    """int16 LOGISTIC or TANH (`function`): v = (x * multiplier + rounding) >> shift is the
    input in steps of 1 / (3 * 4096), interpolated in the sigmoid table (tables.
    sigmoid_table_uint16) with 9 fractional bits (LOGISTIC) or 8 (TANH, as 2 sigmoid(2x) - 1);
    the output scale is 2^-15. TFLite's power-of-two case is the multiplier 3 * 2^k, shift 0."""

    function: str
    multiplier: int
    shift: int

    @property
    def rounding(self) -> int:
        return 1 << (self.shift - 1) if self.shift else 0


@dataclass(frozen=True)
class Int16SoftmaxParams:
    """int16 SOFTMAX over the last axis of `depth` (reference_ops::SoftmaxInt16): each
    difference to the row's max rescaled by the multiplier (so [-65535, 0] is [-10, 0]) and
    looked up in tables.softmax_exp_lut, their int32 sum's reciprocal in tables.
    softmax_reciprocal_lut; output scale 1/32768, zero point 0."""

    depth: int
    input_multiplier: int
    input_shift: int


@dataclass(frozen=True)
class QuantizedLogSoftmaxParams:
    """int8 LOG_SOFTMAX over the last axis (TFLite's LogSoftmaxQuantized): differences to the
    row's maximum at or above diff_min scaled by input_multiplier * 2^input_left_shift into
    Q5.26; their exponentials summed in Q12.19; the sum's log in Q5.26 subtracted from each
    difference that stays above the bound the reverse scaling (reverse_multiplier,
    reverse_shift) gives; the output fixed at scale 16/256, zero point 127."""

    depth: int
    input_multiplier: int
    input_left_shift: int
    reverse_multiplier: int
    reverse_shift: int  # <= 0: a right shift
    diff_min: int


@dataclass(frozen=True)
class FloatLogSoftmaxParams:
    """float LOG_SOFTMAX over the last axis of `depth`: x - max - log(sum of exp(x - max))."""

    depth: int


@dataclass(frozen=True)
class FloatSoftmaxParams:
    """float SOFTMAX over the last axis of `depth`: exp((x - max) * beta) / sum."""

    depth: int
    beta: float


@dataclass(frozen=True)
class QuantizedSoftmaxParams:
    """int8 or uint8 SOFTMAX over the last axis: differences to the row's maximum at or above
    diff_min are scaled by input_multiplier * 2^input_left_shift into Q5.26 for gemmlowp's exp;
    the output is fixed at scale 1/256 and zero point the type's lowest value (-128 for int8,
    0 for uint8). TFLite aborts on a row whose exponentials sum to 512 or more (possible from
    512 classes on), and so the kernel fails there."""

    dtype: str
    depth: int
    input_multiplier: int
    input_left_shift: int
    diff_min: int


@dataclass(frozen=True)
class FloatL2NormalizationParams:
    """float L2_NORMALIZATION over the last axis: x / max(sqrt(sum(x^2)), epsilon)."""

    depth: int
    epsilon: float


@dataclass(frozen=True)
class QuantizedL2NormalizationParams:
    """int8 L2_NORMALIZATION over the last axis of `x - input_zero_point`; output 1/128, 0."""

    depth: int
    input_zero_point: int


# -- helpers --------------------------------------------------------------------------------


def _operands(graph: Graph, op: Operator, inputs: int = 1) -> tuple[Tensor, ...]:
    """The op's input tensors and then its output, of one dtype."""
    if len(op.inputs) != inputs or len(op.outputs) != 1 or min(op.inputs) < 0:
        raise UnsupportedOpError(f"{op.opcode} needs {inputs} input(s) and one output")
    tensors = tuple(graph.tensors[i] for i in (*op.inputs, op.outputs[0]))
    if len({t.dtype for t in tensors}) != 1:
        raise UnsupportedOpError(
            f"{op.opcode} with mixed dtypes {', '.join(t.dtype for t in tensors)}")
    if tensors[0].shape != tensors[-1].shape:
        raise UnsupportedOpError(
            f"output shape {tensors[-1].shape} differs from input shape {tensors[0].shape}")
    require_int16_zero_points(*tensors)
    return tensors


def _ratio(numerator: float, denominator: float) -> float:
    """`a->params.scale / b->params.scale`: a float32 division, widened to double."""
    return float(f32(numerator) / f32(denominator))


def _product_ratio(a: float, b: float, denominator: float) -> float:
    """`a * b / c` of float32 values, evaluated in float32 and widened to double."""
    return float(f32(a) * f32(b) / f32(denominator))


def _finite_option(op: Operator, key: str, default: float) -> float:
    value = float(op.options.get(key, default))
    if not math.isfinite(value):
        raise UnsupportedOpError(f"{key} {value}")
    return value


def _last_axis(t: Tensor) -> int:
    if not t.shape:
        raise UnsupportedOpError("needs a tensor of rank >= 1")
    return t.shape[-1]


# -- RELU, RELU6, RELU_N1_TO_1 --------------------------------------------------------------


def prepare_relu(graph: Graph, op: Operator) -> FloatClampParams | RequantizeClampParams:
    """The op's own name is its clamp in quant.ACTIVATION_FLOAT_RANGE."""
    x, out = _operands(graph, op)
    if out.dtype == "float32":
        return FloatClampParams(*ACTIVATION_FLOAT_RANGE[op.opcode])
    (in_scale, in_zp), (out_scale, out_zp) = map(per_tensor_quantization, (x, out))
    multiplier, shift = quantize_multiplier(_ratio(in_scale, out_scale))
    low, high = activation_range_quantized(op.opcode, out)
    return RequantizeClampParams(in_zp, out_zp, multiplier, shift, low, high)


# -- LOGISTIC, TANH, HARD_SWISH -------------------------------------------------------------


def _prepare_lookup(
        graph: Graph, op: Operator, function: Callable[[np.ndarray], np.ndarray],
        required_output_scale: float | None
) -> FloatFunctionParams | LookupTableParams | Int16SigmoidParams:
    x, out = _operands(graph, op)
    if out.dtype == "float32":
        return FloatFunctionParams(op.opcode)
    if out.dtype == "int16":
        return _prepare_int16_sigmoid(op.opcode, x, out)
    (in_scale, in_zp), (out_scale, out_zp) = map(per_tensor_quantization, (x, out))
    if required_output_scale is not None and out_scale != required_output_scale:
        raise UnsupportedOpError(f"{out.dtype} output scale must be {required_output_scale}")
    return LookupTableParams(lookup_table(out.dtype, in_scale, in_zp, out_scale, out_zp, function))


def prepare_logistic(
        graph: Graph, op: Operator) -> FloatFunctionParams | LookupTableParams | Int16SigmoidParams:
    """TFLite requires the int8 or uint8 output scale 1/256 (any zero point)."""
    return _prepare_lookup(graph, op, logistic_float32, LOGISTIC_INT8_OUTPUT_SCALE)


def prepare_tanh(
        graph: Graph, op: Operator) -> FloatFunctionParams | LookupTableParams | Int16SigmoidParams:
    return _prepare_lookup(graph, op, tanhf, None)


def prepare_elu(
        graph: Graph, op: Operator) -> FloatFunctionParams | LookupTableParams | Int16SigmoidParams:
    """int8 is a table of exp(x) - 1 below zero, as LiteRT's and TFLite Micro's Prepare fill it."""
    return _prepare_lookup(graph, op, elu_float32, None)


def _prepare_int16_sigmoid(opcode: str, x: Tensor, out: Tensor) -> Int16SigmoidParams:
    """SigmoidPrepare / TanhPrepare for int16: LOGISTIC's output scale must be 2^-15 exactly,
    TANH's a power of two within CheckedLog2's tolerance whose log2 rounds to -15 (and is then
    taken as 2^-15)."""
    in_scale, _ = per_tensor_quantization(x)
    out_scale, _ = per_tensor_quantization(out)
    if opcode == "LOGISTIC" and out_scale != 2.0**INT16_SIGMOID_OUTPUT_LOG2:
        raise UnsupportedOpError("int16 LOGISTIC needs output scale 1/32768 (TFLite requires it)")
    if checked_log2(out_scale) != (True, INT16_SIGMOID_OUTPUT_LOG2):
        raise UnsupportedOpError(f"int16 {opcode} needs output scale 2^-15 (TFLite requires a "
                                 f"power of two of log2 -15, this is {out_scale:.6g})")
    is_pot, log2 = checked_log2(in_scale)
    pot_shift = INT16_SIGMOID_POT_FRACTION_BITS + log2
    if is_pot and pot_shift in INT16_POT_SHIFTS[opcode]:
        return Int16SigmoidParams(opcode, 3 << pot_shift, 0)
    real = in_scale * INT16_SIGMOID_STEPS_PER_UNIT  # double, as TFLite (the same rounding)
    shift = 0
    while real <= INT16_SIGMOID_MULTIPLIER_FLOOR and shift < INT16_SIGMOID_MAX_SHIFT:
        shift += 1
        real *= 2.0
    multiplier = int(real)
    if multiplier == 0:
        raise UnsupportedOpError(f"int16 {opcode} input scale {in_scale:.6g} is too small "
                                 "(TFLite's multiplier truncates to 0)")
    if multiplier >= INT16_SIGMOID_MULTIPLIER_LIMIT:
        raise UnsupportedOpError(f"int16 {opcode} input scale {in_scale:.6g} is too large: "
                                 "TFLite's int32 input * multiplier would overflow")
    return Int16SigmoidParams(opcode, multiplier, shift)


def _int16_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier, then DownScaleInt32ToInt16Multiplier (rounding, saturating)."""
    multiplier, exponent = quantize_multiplier(real)
    if multiplier >= INT32_MAX - (1 << 15):
        return 2**15 - 1, exponent
    return (multiplier + (1 << 15)) >> 16, exponent


def prepare_hard_swish(graph: Graph,
                       op: Operator) -> FloatFunctionParams | QuantizedHardSwishParams:
    """HardSwishPrepare: both multipliers are float32 quotients of float32 scales."""
    x, out = _operands(graph, op)
    if out.dtype == "float32":
        return FloatFunctionParams(op.opcode)
    (in_scale, in_zp), (out_scale, out_zp) = map(per_tensor_quantization, (x, out))
    hires_input_scale = f32(1.0 / (1 << HARD_SWISH_HIRES_SHIFT)) * f32(in_scale)
    output_multiplier, output_exponent = _int16_multiplier(
        float(hires_input_scale / f32(out_scale)))
    reluish_multiplier, reluish_exponent = _int16_multiplier(
        float(hires_input_scale / HARD_SWISH_RELUISH_SCALE))
    if output_exponent > 0:
        raise UnsupportedOpError("output scale below input scale / 128 (TFLite requires above)")
    if min(output_exponent, reluish_exponent) < -HARD_SWISH_MAX_RIGHT_SHIFT:
        raise UnsupportedOpError("scales need int16 right shifts beyond 15 bits")
    return QuantizedHardSwishParams(in_zp, out_zp, output_multiplier, output_exponent,
                                    reluish_multiplier, reluish_exponent)


# -- LEAKY_RELU, PRELU ----------------------------------------------------------------------


def prepare_leaky_relu(graph: Graph,
                       op: Operator) -> FloatLeakyReluParams | QuantizedLeakyReluParams:
    x, out = _operands(graph, op)
    alpha = _finite_option(op, "alpha", 0.0)
    if out.dtype == "float32":
        return FloatLeakyReluParams(alpha)
    (in_scale, in_zp), (out_scale, out_zp) = map(per_tensor_quantization, (x, out))
    identity_multiplier, identity_shift = quantize_multiplier(_ratio(in_scale, out_scale))
    alpha_multiplier, alpha_shift = quantize_multiplier(_product_ratio(in_scale, alpha, out_scale))
    return QuantizedLeakyReluParams(*INT_RANGES[out.dtype], in_zp, out_zp, identity_multiplier,
                                    identity_shift, alpha_multiplier, alpha_shift)


# int16 PRELU reads its alpha as int8 whatever its type, and rescales as int8 does.
INT16_PRELU_DTYPES = ("int16", "int8", "int16")


def _prelu_operands(graph: Graph, op: Operator) -> tuple[Tensor, Tensor, Tensor]:
    """PRELU's input, alpha and output: of one dtype, or int16 with an int8 alpha, which
    TFLite runs with any zero points (it checks none for PRELU)."""
    if len(op.inputs) != 2 or len(op.outputs) != 1 or min(op.inputs) < 0:
        raise UnsupportedOpError("PRELU needs 2 input(s) and one output")
    x, alpha, out = (graph.tensors[i] for i in (*op.inputs, op.outputs[0]))
    if (x.dtype, alpha.dtype, out.dtype) != INT16_PRELU_DTYPES:
        return _operands(graph, op, inputs=2)
    if x.shape != out.shape:
        raise UnsupportedOpError(f"output shape {out.shape} differs from input shape {x.shape}")
    return x, alpha, out


def prepare_prelu(graph: Graph, op: Operator) -> FloatPreluParams | QuantizedPreluParams:
    """Alpha broadcasts to the input (numpy rules, which are TFLite's); TFLite's broadcasting
    kernel stops at rank 4."""
    x, alpha, out = _prelu_operands(graph, op)
    try:
        broadcast = tuple(np.broadcast_shapes(x.shape, alpha.shape))
    except ValueError:
        raise UnsupportedOpError(f"alpha shape {alpha.shape} does not broadcast") from None
    if broadcast != x.shape:
        raise UnsupportedOpError(f"alpha shape {alpha.shape} broadcasts beyond the input")
    if alpha.shape != x.shape and len(x.shape) > 4:
        raise UnsupportedOpError("broadcasting beyond rank 4 (TFLite's reference kernel stops)")
    if out.dtype == "float32":
        return FloatPreluParams(x.shape, alpha.shape)
    (in_scale, in_zp), (alpha_scale, alpha_zp), (out_scale, out_zp) = (
        per_tensor_quantization(t) for t in (x, alpha, out))
    identity_multiplier, identity_shift = quantize_multiplier(_ratio(in_scale, out_scale))
    alpha_multiplier, alpha_shift = quantize_multiplier(
        _product_ratio(in_scale, alpha_scale, out_scale))
    return QuantizedPreluParams(x.shape, alpha.shape, *INT_RANGES[out.dtype], in_zp, alpha_zp,
                                out_zp, identity_multiplier, identity_shift, alpha_multiplier,
                                alpha_shift)


# -- SOFTMAX, L2_NORMALIZATION --------------------------------------------------------------


def prepare_softmax(graph: Graph, op: Operator
                    ) -> FloatSoftmaxParams | QuantizedSoftmaxParams | Int16SoftmaxParams:
    """int8: PreprocessSoftmaxScaling(beta, input_scale) in double, and the radius of input
    differences that can still contribute (CalculateInputRadius)."""
    x, out = _softmax_operands(graph, op)
    depth, beta = _last_axis(x), _finite_option(op, "beta", 0.0)  # the schema's default
    if out.dtype == "float32":
        return FloatSoftmaxParams(depth, beta)
    if x.dtype == "int16":
        return _prepare_int16_softmax(x, out, depth, beta)
    in_scale, _ = per_tensor_quantization(x)
    out_scale, out_zp = per_tensor_quantization(out)
    # TFLite checks an int8 output's quantization; a uint8 or int16 one it ignores, writing
    # 1/256 and 0 (uint8) or 1/65536 and -32768 (int16).
    if out.dtype == "int8" and (out_zp != SOFTMAX_INT8_OUTPUT[1]
                                or abs(out_scale - SOFTMAX_INT8_OUTPUT[0]) > 0.001 / 256):
        raise UnsupportedOpError("int8 output must have scale 1/256 and zero point -128")
    bits = SOFTMAX_SCALED_DIFF_INTEGER_BITS
    real = min(beta * in_scale * (1 << (31 - bits)), 2.0**31 - 1.0)
    if not real > 1.0:
        raise UnsupportedOpError(f"beta * input scale {beta * in_scale} is too small")
    multiplier, left_shift = quantize_multiplier(real, max_shift=SOFTMAX_MAX_LEFT_SHIFT)
    radius = math.floor(((1 << bits) - 1) * (1 << (31 - bits)) / (1 << left_shift))
    return QuantizedSoftmaxParams(out.dtype, depth, multiplier, left_shift, -radius)


# What TFLite's int8 LOG_SOFTMAX fixes: the output's quantization, and the rows its Q12.19
# sum of exponentials holds (2^12 terms of at most 1).
LOG_SOFTMAX_INT8_OUTPUT = (16.0 / 256, 127)
LOG_SOFTMAX_OUTPUT_INTEGER_BITS = 4  # the output's Q4 before its zero point
LOG_SOFTMAX_MAX_DEPTH = 1 << 12


def prepare_log_softmax(graph: Graph, op: Operator
                        ) -> FloatLogSoftmaxParams | QuantizedLogSoftmaxParams:
    """int8: PreprocessLogSoftmaxScalingExp(beta 1, input_scale) in double, as TFLite's
    Prepare: the input scaling of SOFTMAX, and its reverse as a multiplier below one."""
    x, out = _operands(graph, op)
    depth = _last_axis(x)
    if out.dtype == "float32":
        return FloatLogSoftmaxParams(depth)
    in_scale, _ = per_tensor_quantization(x)
    out_scale, out_zp = per_tensor_quantization(out)
    if (out_scale, out_zp) != LOG_SOFTMAX_INT8_OUTPUT:
        raise UnsupportedOpError(f"int8 output quantized ({out_scale}, {out_zp}), not "
                                 f"(16/256, 127) as TFLite requires")
    if depth > LOG_SOFTMAX_MAX_DEPTH:
        raise UnsupportedOpError(f"rows of {depth} (TFLite's Q12.19 sum holds "
                                 f"{LOG_SOFTMAX_MAX_DEPTH})")
    bits = SOFTMAX_SCALED_DIFF_INTEGER_BITS
    real = min(in_scale * (1 << (31 - bits)), 2.0**31 - 1.0)
    if not real > 1.0:
        raise UnsupportedOpError(f"input scale {in_scale} is too small")
    multiplier, left_shift = quantize_multiplier(real, max_shift=SOFTMAX_MAX_LEFT_SHIFT)
    reverse_multiplier, reverse_shift = quantize_multiplier(
        (1 << (31 - left_shift)) / multiplier)
    radius = math.floor(((1 << bits) - 1) * (1 << (31 - bits)) / (1 << left_shift))
    return QuantizedLogSoftmaxParams(depth, multiplier, left_shift, reverse_multiplier,
                                     reverse_shift, -radius)


def _prepare_int16_softmax(x: Tensor, out: Tensor, depth: int, beta: float) -> Int16SoftmaxParams:
    """SoftmaxPrepare for int16: the output scale checked in float32; the multiplier from
    in_scale * beta in float32, divided by 10 / 65535 in double."""
    in_scale, _ = per_tensor_quantization(x)
    out_scale, _ = per_tensor_quantization(out)
    if abs(f32(out_scale) - INT16_SOFTMAX_OUTPUT_SCALE) > INT16_SOFTMAX_OUTPUT_TOLERANCE:
        raise UnsupportedOpError("int16 SOFTMAX needs output scale 1/32768 (TFLite requires it "
                                 "to within 0.001/32768)")
    if depth > INT16_SOFTMAX_MAX_DEPTH:
        raise UnsupportedOpError(f"int16 SOFTMAX over {depth} classes: TFLite's int32 sum of "
                                 f"exponentials could overflow (at most {INT16_SOFTMAX_MAX_DEPTH})")
    multiplier, shift = quantize_multiplier(
        float(f32(in_scale) * f32(beta)) / INT16_SOFTMAX_DIFF_SCALE)
    return Int16SoftmaxParams(depth, multiplier, shift)


def _softmax_operands(graph: Graph, op: Operator) -> tuple[Tensor, Tensor]:
    """SOFTMAX's input and output: of one dtype, or int8 in and int16 out."""
    x, out = required_input(graph, op, 0, "input"), graph.tensors[op.outputs[0]]
    if (x.dtype, out.dtype) == ("int8", "int16") and len(op.inputs) == len(op.outputs) == 1:
        if x.shape != out.shape:
            raise UnsupportedOpError(f"output shape {out.shape} differs from input {x.shape}")
        return x, out
    return _operands(graph, op)


def prepare_l2_normalization(
        graph: Graph, op: Operator) -> FloatL2NormalizationParams | QuantizedL2NormalizationParams:
    x, out = _operands(graph, op)
    if op.options.get("fused_activation_function", "NONE") != "NONE":
        raise UnsupportedOpError("fused activation (TFLite's kernel takes none)")
    if len(x.shape) > 4:
        raise UnsupportedOpError("rank above 4")
    depth = _last_axis(x)
    if out.dtype == "float32":
        return FloatL2NormalizationParams(depth, L2_NORMALIZATION_EPSILON)
    _, in_zp = per_tensor_quantization(x)
    if per_tensor_quantization(out) != L2_NORMALIZATION_INT8_OUTPUT:
        raise UnsupportedOpError("int8 output must have scale 1/128 and zero point 0")
    if depth > L2_INT32_SUM_DEPTH:
        raise UnsupportedOpError(f"int8 L2_NORMALIZATION over {depth} values: the C kernel's "
                                 "int32 sum of squares could overflow")
    return QuantizedL2NormalizationParams(depth, in_zp)


# The int8 L2 normalization sums squares of values within 255 in an int32_t, as TFLite does.
L2_INT32_SUM_DEPTH = INT32_MAX // (255 * 255)
