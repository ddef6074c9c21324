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

Real multipliers are derived as there: `a / b` and `a * b / c` of float scales are float32
expressions widened to double; only SOFTMAX's beta * scale is multiplied in double.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops.spec import OpSpec
from toolchain.ops.tables import int8_lookup_table, logistic_float32, tanhf
from toolchain.quant import (
    ACTIVATION_FLOAT_RANGE,
    activation_range_quantized,
    int8_quantization,
    quantize_multiplier,
)

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


# -- params ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FloatClampParams:
    """float RELU / RELU6 / RELU_N1_TO_1: min(max(x, low), high)."""

    low: float
    high: float


@dataclass(frozen=True)
class FloatFunctionParams:
    """float LOGISTIC / TANH / HARD_SWISH: the reference kernel's float32 formula by name."""

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
    """int8 LEAKY_RELU: v = x - input_zero_point; out = output_zero_point + (v >= 0 ?
    rescale_identity(v) : rescale_alpha(v)), clamped; a negative alpha gives a negative
    alpha multiplier, applied as the negated product of its magnitude."""

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
    """int8 PRELU: v = x - input_zero_point; out = output_zero_point + (v >= 0 ?
    rescale_identity(v) : rescale_alpha(v * (alpha - alpha_zero_point))), clamped."""

    input_shape: tuple[int, ...]
    alpha_shape: tuple[int, ...]
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
class FloatSoftmaxParams:
    """float SOFTMAX over the last axis of `depth`: exp((x - max) * beta) / sum."""

    depth: int
    beta: float


@dataclass(frozen=True)
class QuantizedSoftmaxParams:
    """int8 SOFTMAX over the last axis: differences to the row's maximum at or above diff_min
    are scaled by input_multiplier * 2^input_left_shift into Q5.26 for gemmlowp's exp; the
    output is fixed at scale 1/256, zero point -128. TFLite aborts on a row whose exponentials
    sum to 512 or more (possible from 512 classes on), and so the kernel fails there."""

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
    (in_scale, in_zp), (out_scale, out_zp) = int8_quantization(x), int8_quantization(out)
    multiplier, shift = quantize_multiplier(_ratio(in_scale, out_scale))
    low, high = activation_range_quantized(op.opcode, out)
    return RequantizeClampParams(in_zp, out_zp, multiplier, shift, low, high)


# -- LOGISTIC, TANH, HARD_SWISH -------------------------------------------------------------


def _prepare_lookup(graph: Graph, op: Operator, function: Callable[[np.ndarray], np.ndarray],
                    required_output_scale: float | None) -> FloatFunctionParams | LookupTableParams:
    x, out = _operands(graph, op)
    if out.dtype == "float32":
        return FloatFunctionParams(op.opcode)
    (in_scale, in_zp), (out_scale, out_zp) = int8_quantization(x), int8_quantization(out)
    if required_output_scale is not None and out_scale != required_output_scale:
        raise UnsupportedOpError(f"int8 output scale must be {required_output_scale}")
    return LookupTableParams(int8_lookup_table(in_scale, in_zp, out_scale, out_zp, function))


def prepare_logistic(graph: Graph, op: Operator) -> FloatFunctionParams | LookupTableParams:
    """TFLite requires the int8 output scale 1/256 (any zero point)."""
    return _prepare_lookup(graph, op, logistic_float32, LOGISTIC_INT8_OUTPUT_SCALE)


def prepare_tanh(graph: Graph, op: Operator) -> FloatFunctionParams | LookupTableParams:
    return _prepare_lookup(graph, op, tanhf, None)


def _int16_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier, then DownScaleInt32ToInt16Multiplier (rounding, saturating)."""
    multiplier, exponent = quantize_multiplier(real)
    if multiplier >= 2**31 - 1 - (1 << 15):
        return 2**15 - 1, exponent
    return (multiplier + (1 << 15)) >> 16, exponent


def prepare_hard_swish(graph: Graph,
                       op: Operator) -> FloatFunctionParams | QuantizedHardSwishParams:
    """HardSwishPrepare: both multipliers are float32 quotients of float32 scales."""
    x, out = _operands(graph, op)
    if out.dtype == "float32":
        return FloatFunctionParams(op.opcode)
    (in_scale, in_zp), (out_scale, out_zp) = int8_quantization(x), int8_quantization(out)
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
    (in_scale, in_zp), (out_scale, out_zp) = int8_quantization(x), int8_quantization(out)
    identity_multiplier, identity_shift = quantize_multiplier(_ratio(in_scale, out_scale))
    alpha_multiplier, alpha_shift = quantize_multiplier(_product_ratio(in_scale, alpha, out_scale))
    return QuantizedLeakyReluParams(in_zp, out_zp, identity_multiplier, identity_shift,
                                    alpha_multiplier, alpha_shift)


def prepare_prelu(graph: Graph, op: Operator) -> FloatPreluParams | QuantizedPreluParams:
    """Alpha broadcasts to the input (numpy rules, which are TFLite's); TFLite's broadcasting
    kernel stops at rank 4."""
    x, alpha, out = _operands(graph, op, inputs=2)
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
        int8_quantization(t) for t in (x, alpha, out))
    identity_multiplier, identity_shift = quantize_multiplier(_ratio(in_scale, out_scale))
    alpha_multiplier, alpha_shift = quantize_multiplier(
        _product_ratio(in_scale, alpha_scale, out_scale))
    return QuantizedPreluParams(x.shape, alpha.shape, in_zp, alpha_zp, out_zp,
                                identity_multiplier, identity_shift, alpha_multiplier, alpha_shift)


# -- SOFTMAX, L2_NORMALIZATION --------------------------------------------------------------


def prepare_softmax(graph: Graph, op: Operator) -> FloatSoftmaxParams | QuantizedSoftmaxParams:
    """int8: PreprocessSoftmaxScaling(beta, input_scale) in double, and the radius of input
    differences that can still contribute (CalculateInputRadius)."""
    x, out = _operands(graph, op)
    depth, beta = _last_axis(x), _finite_option(op, "beta", 0.0)  # the schema's default
    if out.dtype == "float32":
        return FloatSoftmaxParams(depth, beta)
    in_scale, _ = int8_quantization(x)
    out_scale, out_zp = int8_quantization(out)
    if out_zp != SOFTMAX_INT8_OUTPUT[1] or abs(out_scale - SOFTMAX_INT8_OUTPUT[0]) > 0.001 / 256:
        raise UnsupportedOpError("int8 output must have scale 1/256 and zero point -128")
    bits = SOFTMAX_SCALED_DIFF_INTEGER_BITS
    real = min(beta * in_scale * (1 << (31 - bits)), 2.0**31 - 1.0)
    if not real > 1.0:
        raise UnsupportedOpError(f"beta * input scale {beta * in_scale} is too small")
    multiplier, left_shift = quantize_multiplier(real, max_shift=SOFTMAX_MAX_LEFT_SHIFT)
    radius = math.floor(((1 << bits) - 1) * (1 << (31 - bits)) / (1 << left_shift))
    return QuantizedSoftmaxParams(depth, multiplier, left_shift, -radius)


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
    _, in_zp = int8_quantization(x)
    if int8_quantization(out) != L2_NORMALIZATION_INT8_OUTPUT:
        raise UnsupportedOpError("int8 output must have scale 1/128 and zero point 0")
    return QuantizedL2NormalizationParams(depth, in_zp)


_PREPARE: dict[str, Callable[[Graph, Operator], object]] = {
    "RELU": prepare_relu,
    "RELU6": prepare_relu,
    "RELU_N1_TO_1": prepare_relu,
    "LOGISTIC": prepare_logistic,
    "TANH": prepare_tanh,
    "HARD_SWISH": prepare_hard_swish,
    "LEAKY_RELU": prepare_leaky_relu,
    "PRELU": prepare_prelu,
    "SOFTMAX": prepare_softmax,
    "L2_NORMALIZATION": prepare_l2_normalization,
}

SPECS: tuple[OpSpec, ...] = tuple(
    OpSpec(opcode, frozenset({"float32", "int8"}), prepare) for opcode, prepare in _PREPARE.items()
)
