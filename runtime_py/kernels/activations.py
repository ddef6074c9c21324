"""numpy kernels for the activation ops; each params type from toolchain.ops.activations.prepare has
its own function, so one dispatcher serves every opcode.

float32 follows the reference kernels' float32 formulas (exp and tanh evaluated in float64 and
rounded, within an ulp of the C library's); int8 and int16 reproduce their integer pipelines bit
for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from runtime_py.kernels.reductions import ordered_sum
from toolchain.errors import RuntimeBackendError
from toolchain.ir import INT32_MIN
from toolchain.numerics import gemmlowp
from toolchain.numerics.fixedpoint import (
    multiply_by_quantized_multiplier,
    rounding_divide_by_pot,
    saturating_rounding_doubling_high_mul,
)
from toolchain.numerics.quant import INT_RANGES
from toolchain.numerics.tables import (
    expf,
    expm1f,
    logf,
    lut_lookup_int16,
    sigmoid_table_uint16,
    softmax_exp_lut,
    softmax_reciprocal_lut,
)
from toolchain.ops.activations import SPECS
from toolchain.ops.activations.prepare import (
    HARD_SWISH_HIRES_SHIFT,
    LOG_SOFTMAX_INT8_OUTPUT,
    LOG_SOFTMAX_OUTPUT_INTEGER_BITS,
    SOFTMAX_SCALED_DIFF_INTEGER_BITS,
    FloatClampParams,
    FloatFunctionParams,
    FloatL2NormalizationParams,
    FloatLeakyReluParams,
    FloatLogSoftmaxParams,
    FloatPreluParams,
    FloatSoftmaxParams,
    Int16SigmoidParams,
    Int16SoftmaxParams,
    LookupTableParams,
    QuantizedHardSwishParams,
    QuantizedL2NormalizationParams,
    QuantizedLeakyReluParams,
    QuantizedLogSoftmaxParams,
    QuantizedPreluParams,
    QuantizedSoftmaxParams,
    RequantizeClampParams,
)

f32 = np.float32
INT8_MIN, INT8_MAX = -128, 127
# The int8 softmax sums exponentials in Q12.19; TFLite checks that the shift taking their
# reciprocal times an exponential to 8 bits is at most 31, which fails from this sum on.
SOFTMAX_ACCUMULATION_INTEGER_BITS = 12
SOFTMAX_ABORTING_SUM = 512
# The int8 L2 normalization's output scale is 2^-7.
L2_NORMALIZATION_OUTPUT_SHIFT = 7
# reference_ops::Logistic in float: 1 above this, exp(x) below LOGISTIC_CUTOFF_LOW.
LOGISTIC_CUTOFF_HIGH = f32(16.619047164916992188)
LOGISTIC_CUTOFF_LOW = f32(-9.0)


def _to_int8(x: np.ndarray) -> np.ndarray:
    return np.clip(x, INT8_MIN, INT8_MAX).astype(np.int8)


def _exp_float32(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.exp(x.astype(np.float64)).astype(np.float32)


def _rows(x: np.ndarray, depth: int) -> np.ndarray:
    """The tensor as rows along its last axis."""
    return x.reshape(-1, depth)


# -- float32 --------------------------------------------------------------------------------


def _float_clamp(p: FloatClampParams, x: np.ndarray) -> np.ndarray:
    return np.minimum(np.maximum(x, f32(p.low)), f32(p.high))


def _float_logistic(x: np.ndarray) -> np.ndarray:
    """reference_ops::Logistic: 1 / (1 + exp(-x)) between the cutoffs."""
    return np.where(x > LOGISTIC_CUTOFF_HIGH, f32(1.0),
                    np.where(x < LOGISTIC_CUTOFF_LOW, _exp_float32(x),
                             f32(1.0) / (f32(1.0) + _exp_float32(-x))))


def _float_tanh(x: np.ndarray) -> np.ndarray:
    return np.tanh(x.astype(np.float64)).astype(np.float32)


def _float_hard_swish(x: np.ndarray) -> np.ndarray:
    """x * min(6, max(0, x + 3)) / 6, multiplied before dividing, as the reference does."""
    with np.errstate(over="ignore", invalid="ignore"):  # IEEE results, as in C
        return x * np.minimum(f32(6.0), np.maximum(f32(0.0), x + f32(3.0))) / f32(6.0)


def _float_elu(x: np.ndarray) -> np.ndarray:
    """reference_ops::Elu: expm1(x) below zero (the C library's, as LiteRT calls it), else x."""
    return np.where(x < f32(0.0), expm1f(x), x)


FLOAT_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "LOGISTIC": _float_logistic,
    "ELU": _float_elu,
    "TANH": _float_tanh,
    "HARD_SWISH": _float_hard_swish,
}


def _float_function(p: FloatFunctionParams, x: np.ndarray) -> np.ndarray:
    return FLOAT_FUNCTIONS[p.function](x)


def _float_leaky_relu(p: FloatLeakyReluParams, x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x, x * f32(p.alpha))


def _float_prelu(p: FloatPreluParams, x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    return np.where(x >= 0, x, x * alpha)


def _float_softmax(p: FloatSoftmaxParams, x: np.ndarray) -> np.ndarray:
    """The row's exponentials summed in order, as the reference loop does."""
    rows = _rows(x, p.depth)
    with np.errstate(invalid="ignore"):
        exps = _exp_float32((rows - rows.max(axis=1, keepdims=True)) * f32(p.beta))
        return (exps / ordered_sum(exps, (1,))[:, None]).reshape(x.shape)


def _quantized_log_softmax(p: QuantizedLogSoftmaxParams, x: np.ndarray) -> np.ndarray:
    """reference_ops::LogSoftmax for int8: the exponentials of the scaled differences to the
    row's maximum summed in Q12.19, their log in Q5.26 subtracted from each difference above
    the bound the reverse scaling gives, in Q4 plus 127; -128 below it."""
    rows = _rows(x, p.depth).astype(np.int64)
    diff = rows - np.maximum(rows.max(axis=1, keepdims=True), -128)
    counted = diff >= p.diff_min
    scaled = saturating_rounding_doubling_high_mul(
        np.where(counted, diff, 0) << p.input_left_shift, p.input_multiplier)
    exps = gemmlowp.exp_on_negative_values(scaled, SOFTMAX_SCALED_DIFF_INTEGER_BITS)
    sums = np.where(counted, gemmlowp.rescale(exps, 0, SOFTMAX_ACCUMULATION_INTEGER_BITS),
                    0).sum(axis=1, keepdims=True)
    log_sum = gemmlowp.log_x_for_x_greater_than_or_equal_to_1(
        sums, SOFTMAX_ACCUMULATION_INTEGER_BITS, SOFTMAX_SCALED_DIFF_INTEGER_BITS)
    bound = np.maximum(p.diff_min - 1, multiply_by_quantized_multiplier(
        log_sum + INT32_MIN, p.reverse_multiplier, p.reverse_shift))
    shift = 31 - SOFTMAX_SCALED_DIFF_INTEGER_BITS - LOG_SOFTMAX_OUTPUT_INTEGER_BITS
    values = np.clip(rounding_divide_by_pot(scaled - log_sum, shift)
                     + LOG_SOFTMAX_INT8_OUTPUT[1], -128, 127)
    return np.where(diff > bound, values, -128).astype(np.int8).reshape(x.shape)


def _float_log_softmax(p: FloatLogSoftmaxParams, x: np.ndarray) -> np.ndarray:
    """The row's max (NaNs passed over, as std::max from the lowest float), the C library's
    expf of each difference summed in order, then x - max - logf(sum)."""
    rows = _rows(x, p.depth)
    with np.errstate(invalid="ignore", over="ignore"):
        peak = np.fmax.reduce(rows, axis=1, initial=-np.finfo(np.float32).max)[:, None]
        diffs = (rows - peak).astype(f32)
        log_sum = logf(ordered_sum(expf(diffs), (1,)))[:, None]
        return (diffs - log_sum).astype(f32).reshape(x.shape)


def _float_l2_normalization(p: FloatL2NormalizationParams, x: np.ndarray) -> np.ndarray:
    """The squares summed in order, as the reference loop does."""
    rows = _rows(x, p.depth)
    with np.errstate(over="ignore", invalid="ignore"):
        norm = np.sqrt(ordered_sum(rows * rows, (1,)))[:, None]
        return (rows / np.maximum(norm, f32(p.epsilon))).reshape(x.shape)


# -- int8 -----------------------------------------------------------------------------------


def _requantize_clamp(p: RequantizeClampParams, x: np.ndarray) -> np.ndarray:
    rescaled = multiply_by_quantized_multiplier(
        x.astype(np.int64) - p.input_zero_point, p.multiplier, p.shift)
    return np.clip(p.output_zero_point + rescaled, p.low, p.high)


def _lookup(p: LookupTableParams, x: np.ndarray) -> np.ndarray:
    return p.table[x.view(np.uint8)]


def _signed_rescale(x: np.ndarray, multiplier: int, shift: int) -> np.ndarray:
    """QuantizeLeakyRelu's treatment of a negative multiplier: rescale by its magnitude, then
    negate."""
    rescaled = multiply_by_quantized_multiplier(x, abs(multiplier), shift)
    return -rescaled if multiplier < 0 else rescaled


def _quantized_leaky_relu(p: QuantizedLeakyReluParams, x: np.ndarray) -> np.ndarray:
    v = x.astype(np.int64) - p.input_zero_point
    rescaled = np.where(
        v >= 0,
        multiply_by_quantized_multiplier(v, p.identity_multiplier, p.identity_shift),
        _signed_rescale(v, p.alpha_multiplier, p.alpha_shift))
    return np.clip(p.output_zero_point + rescaled, p.low, p.high)


def _quantized_prelu(p: QuantizedPreluParams, x: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    v = x.astype(np.int64) - p.input_zero_point
    scaled_alpha = np.broadcast_to(alpha.astype(np.int64) - p.alpha_zero_point, v.shape)
    rescaled = np.where(
        v >= 0,
        multiply_by_quantized_multiplier(v, p.identity_multiplier, p.identity_shift),
        multiply_by_quantized_multiplier(v * scaled_alpha, p.alpha_multiplier, p.alpha_shift))
    return np.clip(p.output_zero_point + rescaled, p.low, p.high)


def _saturating_left_shift_int16(x: np.ndarray, amount: int) -> np.ndarray:
    return np.clip(x << amount, gemmlowp.INT16_MIN, gemmlowp.INT16_MAX)


def _reluish(p: QuantizedHardSwishParams, hires_input: np.ndarray) -> np.ndarray:
    """The input on a scale where [-3, 3] maps to [-1, 1] in Q0.15 (saturating), then moved to
    [0, 1]; a left shift is split around the multiplication so only its last bit saturates."""
    value = hires_input
    if p.reluish_exponent > 0:
        value = _saturating_left_shift_int16(value, p.reluish_exponent - 1)
    value = gemmlowp.saturating_rounding_doubling_high_mul_int16(value, p.reluish_multiplier)
    if p.reluish_exponent > 0:
        value = _saturating_left_shift_int16(value, 1)
    if p.reluish_exponent < 0:
        value = rounding_divide_by_pot(value, -p.reluish_exponent)
    return (value + (1 << 15)) >> 1


def _quantized_hard_swish(p: QuantizedHardSwishParams, x: np.ndarray) -> np.ndarray:
    """reference_ops::HardSwish in int16: x on the output scale (before its final shift) times
    the reluish factor in [0, 1], truncating (which cancels the earlier roundings' bias)."""
    hires_input = (x.astype(np.int64) - p.input_zero_point) << HARD_SWISH_HIRES_SHIFT
    preshift_output = gemmlowp.saturating_rounding_doubling_high_mul_int16(
        hires_input, p.output_multiplier)
    product = gemmlowp.saturating_doubling_high_mul_int16(_reluish(p, hires_input),
                                                          preshift_output)
    output = rounding_divide_by_pot(product, -p.output_exponent) + p.output_zero_point
    wrapped = ((output - gemmlowp.INT16_MIN) & 0xFFFF) + gemmlowp.INT16_MIN  # int16 sum
    return _to_int8(wrapped)


def _quantized_softmax(p: QuantizedSoftmaxParams, x: np.ndarray) -> np.ndarray:
    """reference_ops::Softmax for int8: exp of each scaled difference to the row's maximum in
    gemmlowp fixed point, times the reciprocal of their Q12.19 sum; differences below diff_min
    contribute nothing and give the lowest output."""
    rows = _rows(x, p.depth).astype(np.int64)
    diff = rows - rows.max(axis=1, keepdims=True)
    counted = diff >= p.diff_min
    scaled_diff = saturating_rounding_doubling_high_mul(
        np.where(counted, diff, 0) << p.input_left_shift, p.input_multiplier)
    exps = gemmlowp.exp_on_negative_values(scaled_diff, SOFTMAX_SCALED_DIFF_INTEGER_BITS)
    terms = gemmlowp.rescale(exps, 0, SOFTMAX_ACCUMULATION_INTEGER_BITS)
    sums = np.where(counted, terms, 0).sum(axis=1, keepdims=True)
    output_bits = 8 * np.dtype(p.dtype).itemsize
    if output_bits == 8 and np.any(
            sums >= SOFTMAX_ABORTING_SUM << (31 - SOFTMAX_ACCUMULATION_INTEGER_BITS)):
        raise RuntimeBackendError(f"int8 SOFTMAX: a row's exponentials sum to "
                                  f"{SOFTMAX_ABORTING_SUM} or more, where TFLite aborts")
    scale, bits_over_unit = gemmlowp.reciprocal(sums, SOFTMAX_ACCUMULATION_INTEGER_BITS)
    exponent = bits_over_unit + 31 - output_bits
    unsaturated = rounding_divide_by_pot(saturating_rounding_doubling_high_mul(scale, exps),
                                         exponent)
    low, high = INT_RANGES[p.dtype]  # the output's zero point is the type's lowest value
    result = np.where(counted, np.clip(unsaturated + low, low, high), low)
    return result.astype(p.dtype).reshape(x.shape)


# -- int16 ----------------------------------------------------------------------------------

# The sigmoid table's last segment: beyond it the kernels saturate.
SIGMOID_LAST_SEGMENT = 255


def _int16_sigmoid(p: Int16SigmoidParams, x: np.ndarray) -> np.ndarray:
    """reference_integer_ops::Logistic / Tanh: x in steps of 1 / (3 * 4096), |x| interpolated
    in the sigmoid table on its low 9 bits (LOGISTIC) or 8 (TANH, whose argument is doubled),
    mirrored for negative x and rounded to 2^-15."""
    v = (x.astype(np.int64) * p.multiplier + p.rounding) >> p.shift
    a = np.abs(v)
    bits = 9 if p.function == "LOGISTIC" else 8
    segment = a >> bits
    inside = segment < SIGMOID_LAST_SEGMENT
    table = sigmoid_table_uint16().astype(np.int64)
    low = table[np.minimum(segment, SIGMOID_LAST_SEGMENT - 1)]
    high = table[np.minimum(segment, SIGMOID_LAST_SEGMENT - 1) + 1]
    interpolated = (low << bits) + (a & ((1 << bits) - 1)) * (high - low)
    if p.function == "LOGISTIC":  # 0.16 << 9, mirrored as 1 - sigmoid
        r = np.where(inside, interpolated, 0x7FFF << 10)
        r = np.where(v >= 0, r + (1 << 9), (1 << 25) - r + (1 << 9) - 1) >> 10
    else:  # 2 sigmoid - 1 in 0.16 << 8, mirrored as -tanh
        r = np.where(inside, interpolated, 0xFFFF << 8)
        r = np.where(v >= 0, r - (1 << 23) + (1 << 7), (1 << 23) + (1 << 7) - 1 - r) >> 8
    return r.astype(np.int16)


def _int16_softmax(p: Int16SoftmaxParams, x: np.ndarray) -> np.ndarray:
    """reference_ops::SoftmaxInt16: the exp table at each rescaled difference to the row's max
    (recentred on the int16 range), times the reciprocal table at their sum normalized by its
    leading zeros, shifted back to Q0.15."""
    rows = _rows(x, p.depth).astype(np.int64)
    scaled = multiply_by_quantized_multiplier(rows - rows.max(axis=1, keepdims=True),
                                              p.input_multiplier, p.input_shift)
    exps = lut_lookup_int16(softmax_exp_lut(),
                            np.clip(scaled + gemmlowp.INT16_MAX, gemmlowp.INT16_MIN,
                                    gemmlowp.INT16_MAX))
    sums = exps.sum(axis=1, keepdims=True)  # int32 for rows of at most 2^16 classes
    headroom = 32 - np.frexp(sums.astype(np.float64))[1]  # leading zeros of a 32-bit sum > 0
    normalized = ((sums << (headroom - 1)) + (1 << 13)) >> 14
    reciprocal = lut_lookup_int16(softmax_reciprocal_lut(),
                                  np.clip(normalized - ((1 << 15) + (1 << 16)),
                                          gemmlowp.INT16_MIN, gemmlowp.INT16_MAX))
    right_shift = 31 - headroom
    result = (exps * reciprocal + (np.int64(1) << (right_shift - 1))) >> right_shift
    return np.clip(result, 0, gemmlowp.INT16_MAX).astype(np.int16).reshape(x.shape)


def _quantized_l2_normalization(p: QuantizedL2NormalizationParams, x: np.ndarray) -> np.ndarray:
    """reference_integer_ops::L2Normalization: each row times its inverse norm from
    gemmlowp's fixed-point inverse square root, rescaled to 1/128."""
    rows = _rows(x, p.depth).astype(np.int64) - p.input_zero_point
    sum_of_squares = (rows * rows).sum(axis=1, keepdims=True)
    multiplier, shift = gemmlowp.inv_sqrt_quantized_multiplier_exp(sum_of_squares, -1)
    scaled = multiply_by_quantized_multiplier(rows, multiplier,
                                              shift + L2_NORMALIZATION_OUTPUT_SHIFT)
    return _to_int8(scaled).reshape(x.shape)


_BY_PARAMS: dict[type, Callable[..., np.ndarray]] = {
    FloatClampParams: _float_clamp,
    FloatFunctionParams: _float_function,
    FloatLeakyReluParams: _float_leaky_relu,
    FloatPreluParams: _float_prelu,
    FloatSoftmaxParams: _float_softmax,
    FloatLogSoftmaxParams: _float_log_softmax,
    QuantizedLogSoftmaxParams: _quantized_log_softmax,
    FloatL2NormalizationParams: _float_l2_normalization,
    RequantizeClampParams: _requantize_clamp,
    LookupTableParams: _lookup,
    QuantizedLeakyReluParams: _quantized_leaky_relu,
    QuantizedPreluParams: _quantized_prelu,
    QuantizedHardSwishParams: _quantized_hard_swish,
    QuantizedSoftmaxParams: _quantized_softmax,
    QuantizedL2NormalizationParams: _quantized_l2_normalization,
    Int16SigmoidParams: _int16_sigmoid,
    Int16SoftmaxParams: _int16_softmax,
}


def activation(params: Any, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> None:
    """Every activation op: the function for its params type, on all its inputs."""
    outputs[0][...] = _BY_PARAMS[type(params)](params, *inputs)


KERNELS: dict[str, Callable[..., None]] = {spec.opcode: activation for spec in SPECS}
