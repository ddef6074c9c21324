"""gemmlowp's fixed-point functions (fixedpoint/fixedpoint.h) and the TFLite helpers built on them,
vectorized over numpy int64 arrays that hold int32 (or int16) raw values.

A fixed-point value with `integer_bits` m is a raw int32 r meaning r / 2^(31 - m). Products are
SaturatingRoundingDoublingHighMul, sums plain int32 additions (which stay in range for the inputs
these functions accept), and changes of format are saturating or rounding power-of-two shifts,
exactly as in gemmlowp, so that results match TFLite bit for bit.
"""

from __future__ import annotations

import numpy as np

from toolchain.ir import INT32_MAX, INT32_MIN
from toolchain.numerics.fixedpoint import rounding_divide_by_pot
from toolchain.numerics.fixedpoint import (
    saturating_rounding_doubling_high_mul as mul,
)

INT16_MIN = -(2**15)
INT16_MAX = 2**15 - 1

# Raw constants of gemmlowp, in Q0.31 unless noted.
EXP_MINUS_ONE_EIGHTH = 1895147668
ONE_THIRD = 715827883
# exp(-2^k) for k = -2..4, applied for each bit of the input above its lowest quarter.
EXP_BARREL_SHIFTER = (
    (-2, 1672461947),
    (-1, 1302514674),
    (0, 790015084),
    (1, 290630308),
    (2, 39332535),
    (3, 720401),
    (4, 242),
)
FORTY_EIGHT_OVER_SEVENTEEN_Q2 = 1515870810
MINUS_THIRTY_TWO_OVER_SEVENTEEN_Q2 = -1010580540
HALF_SQRT_TWO = 1518500250  # also sqrt(1/2)
THREE_HALVES_Q3 = (1 << 28) + (1 << 27)
# TFLite's log_x_for_x_greater_than_or_equal_to_1 (kernels/internal/common.h), Q0.31
LOG_2 = 1488522236
SQRT_SQRT_HALF = 1805811301
ONE_QUARTER = 1 << 29
LOG_ALPHA_N = 117049297  # 11/240 * 2^(1/4)
LOG_ALPHA_D = 127690142  # 1/20 * 2^(1/4)
LOG_ALPHA_I = 1057819769  # 2 / 2^(1/4) - 2^(1/4)
LOG_ALPHA_F = 638450708  # 1/4 * 2^(1/4)


def one(integer_bits: int) -> int:
    """Raw 1.0; with no integer bits 1.0 is not representable and saturates to the maximum."""
    return INT32_MAX if integer_bits == 0 else 1 << (31 - integer_bits)


def saturating_left_shift(x, exponent: int) -> np.ndarray:
    """SaturatingRoundingMultiplyByPOT with a positive exponent: x * 2^exponent, saturated."""
    x = np.asarray(x, dtype=np.int64)
    threshold = (1 << (31 - exponent)) - 1
    return np.where(x > threshold, INT32_MAX, np.where(x < -threshold, INT32_MIN, x << exponent))


def multiply_by_pot(x, exponent: int) -> np.ndarray:
    """SaturatingRoundingMultiplyByPOT: saturating left shift or rounding right shift."""
    if exponent > 0:
        return saturating_left_shift(x, exponent)
    return rounding_divide_by_pot(x, -exponent)


def rescale(x, from_integer_bits: int, to_integer_bits: int) -> np.ndarray:
    """gemmlowp::Rescale: the same value with another number of integer bits."""
    return multiply_by_pot(x, from_integer_bits - to_integer_bits)


def rounding_half_sum(a, b) -> np.ndarray:
    """(a + b) / 2 rounded half away from zero; C division truncates toward zero."""
    total = np.asarray(a, dtype=np.int64) + np.asarray(b, dtype=np.int64)
    nudged = total + np.where(total >= 0, 1, -1)
    return np.where(nudged >= 0, nudged // 2, -((-nudged) // 2))


def exp_on_interval_between_negative_one_quarter_and_0_excl(a) -> np.ndarray:
    """exp(a) for Q0.31 a in [-1/4, 0): Taylor expansion around -1/8."""
    x = np.asarray(a, dtype=np.int64) + (1 << 28)
    x2 = mul(x, x)
    x3 = mul(x2, x)
    x4 = mul(x2, x2)
    x4_over_4 = rounding_divide_by_pot(x4, 2)
    polynomial = rounding_divide_by_pot(mul(x4_over_4 + x3, ONE_THIRD) + x2, 1)
    return EXP_MINUS_ONE_EIGHTH + mul(EXP_MINUS_ONE_EIGHTH, x + polynomial)


def exp_on_negative_values(a, integer_bits: int) -> np.ndarray:
    """exp(a) in Q0.31 for a <= 0 with `integer_bits`: the lowest quarter by polynomial, each
    higher bit of -a by a multiplication with exp(-2^k)."""
    a = np.asarray(a, dtype=np.int64)
    fractional_bits = 31 - integer_bits
    one_quarter = 1 << (fractional_bits - 2)
    a_mod_quarter_minus_one_quarter = (a & (one_quarter - 1)) - one_quarter
    result = exp_on_interval_between_negative_one_quarter_and_0_excl(
        rescale(a_mod_quarter_minus_one_quarter, integer_bits, 0)
    )
    remainder = a_mod_quarter_minus_one_quarter - a
    for exponent, multiplier in EXP_BARREL_SHIFTER:
        if integer_bits > exponent:
            bit = (remainder >> (fractional_bits + exponent)) & 1
            result = np.where(bit == 1, mul(result, multiplier), result)
    if integer_bits > 5:
        result = np.where(a < -(1 << (36 - integer_bits)), 0, result)
    return np.where(a == 0, one(0), result)


def one_over_one_plus_x_for_x_in_0_1(a) -> np.ndarray:
    """1 / (1 + a) in Q0.31 for Q0.31 a in [0, 1): three Newton-Raphson steps in Q2.29."""
    half_denominator = rounding_half_sum(a, one(0))
    x = FORTY_EIGHT_OVER_SEVENTEEN_Q2 + mul(half_denominator, MINUS_THIRTY_TWO_OVER_SEVENTEEN_Q2)
    for _ in range(3):
        one_minus_half_denominator_times_x = one(2) - mul(half_denominator, x)
        x = x + rescale(mul(x, one_minus_half_denominator_times_x), 4, 2)
    return rescale(x, 1, 0)  # x / 2, read as Q1.30, brought to Q0.31


def count_leading_zeros32(x) -> np.ndarray:
    """Leading zero bits of x read as uint32 (32 for zero)."""
    unsigned = np.asarray(x, dtype=np.int64) & 0xFFFFFFFF
    _, bit_length = np.frexp(unsigned.astype(np.float64))  # exact below 2^53
    return 32 - bit_length.astype(np.int64)


def reciprocal(x, integer_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's GetReciprocal: (1/x as Q0.31 of x normalized to [1, 2), how many bits x had
    above 1.0), with the shift and subtraction done in uint32 as there."""
    headroom_plus_one = count_leading_zeros32(x)
    num_bits_over_unit = integer_bits - headroom_plus_one
    unsigned = np.asarray(x, dtype=np.int64) & 0xFFFFFFFF
    shifted_minus_one = ((unsigned << headroom_plus_one) - (1 << 31)) & 0xFFFFFFFF
    as_int32 = np.where(
        shifted_minus_one > INT32_MAX, shifted_minus_one - (1 << 32), shifted_minus_one
    )
    return one_over_one_plus_x_for_x_in_0_1(as_int32), num_bits_over_unit


def inv_sqrt_quantized_multiplier_exp(x, reverse_shift: int) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's GetInvSqrtQuantizedMultiplierExp: 1/sqrt(x) as (multiplier, shift) for
    non-negative int32 x, by five Newton-Raphson steps in Q3.28 (x <= 1 gives (INT32_MAX, 0))."""
    x = np.asarray(x, dtype=np.int64)
    small = x <= 1
    value = np.where(small, 1 << 28, x)
    shift = np.full(value.shape, 11, dtype=np.int64)
    while np.any(value >= 1 << 29):
        large = value >= 1 << 29
        value = np.where(large, value // 4, value)
        shift = shift + large
    left_shift_bit_pairs = (count_leading_zeros32(value) - 1) // 2 - 1
    shift = shift - left_shift_bit_pairs
    value = value << (2 * left_shift_bit_pairs)
    half_input = rounding_divide_by_pot(value >> 1, 1)
    estimate = np.full(value.shape, one(3), dtype=np.int64)
    for _ in range(5):
        cube = rescale(mul(mul(estimate, estimate), estimate), 9, 3)
        estimate = rescale(mul(THREE_HALVES_Q3, estimate) - mul(half_input, cube), 6, 3)
    multiplier = mul(estimate, HALF_SQRT_TWO)
    multiplier = np.where(shift < 0, multiplier << np.maximum(-shift, 0), multiplier)
    shift = np.maximum(shift, 0) * reverse_shift
    return np.where(small, INT32_MAX, multiplier), np.where(small, 0, shift)


def saturating_rounding_doubling_high_mul_int16(a, b) -> np.ndarray:
    """The int16 SaturatingRoundingDoublingHighMul: a * b / 2^15 rounded half away from zero."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    product = a * b
    total = product + np.where(product >= 0, 1 << 14, 1 - (1 << 14))
    high = np.where(total >= 0, total >> 15, -((-total) >> 15))
    return np.where((a == INT16_MIN) & (b == INT16_MIN), INT16_MAX, high)


def saturating_doubling_high_mul_int16(a, b) -> np.ndarray:
    """TFLite's int16 SaturatingDoublingHighMul (SQDMULH): a * b / 2^15 truncated toward zero."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    product = a * b
    high = np.where(product >= 0, product >> 15, -((-product) >> 15))
    return np.where((a == INT16_MIN) & (b == INT16_MIN), INT16_MAX, high)


def saturating_shift_param(x, exponent) -> np.ndarray:
    """TFLite's SaturatingRoundingMultiplyByPOTParam for exponents >= 0 (each element its own):
    x * 2^exponent, saturated; x itself for 0."""
    x, exponent = np.asarray(x, dtype=np.int64), np.asarray(exponent, dtype=np.int64)
    threshold = (np.int64(1) << np.clip(31 - exponent, 0, 31)) - 1
    shifted = np.where(x > threshold, INT32_MAX, np.where(x < -threshold, INT32_MIN,
                                                          x << exponent))
    return np.where(exponent == 0, x, shifted)


def saturating_add(a, b) -> np.ndarray:
    return np.clip(np.asarray(a, np.int64) + np.asarray(b, np.int64), INT32_MIN, INT32_MAX)


def saturating_sub(a, b) -> np.ndarray:
    return np.clip(np.asarray(a, np.int64) - np.asarray(b, np.int64), INT32_MIN, INT32_MAX)


def log_x_for_x_greater_than_or_equal_to_1(x, input_bits: int, output_bits: int) -> np.ndarray:
    """log(x) of a fixed-point x >= 1 with `input_bits`, with `output_bits`: the power of two
    from x's leading zeros (two ways, a quarter apart, the larger kept), the mantissa's log by
    a rational approximation, summed with an extra integer bit of headroom."""
    accum_bits = output_bits + 1
    quarter = rescale(ONE_QUARTER, 0, accum_bits)
    z_a = np.asarray(x, dtype=np.int64)
    headroom_a = count_leading_zeros32(z_a)
    r_a = saturating_shift_param(mul(saturating_shift_param(z_a, headroom_a - 1),
                                     HALF_SQRT_TWO), 1)
    pow_a = saturating_add(saturating_shift_param(input_bits - headroom_a, 31 - accum_bits),
                           quarter)
    headroom_b = count_leading_zeros32(mul(z_a, HALF_SQRT_TWO)) - 1
    r_b = saturating_shift_param(z_a, headroom_b)
    pow_b = saturating_sub(saturating_shift_param(input_bits - headroom_b, 31 - accum_bits),
                           quarter)
    r, power = np.minimum(r_a, r_b), np.maximum(pow_a, pow_b)
    p = rounding_half_sum(r, SQRT_SQRT_HALF)
    q = 2 * (r - SQRT_SQRT_HALF)
    common_sq = mul(q, q)
    num = mul(q, r) + mul(mul(q, common_sq), LOG_ALPHA_N)
    denominator_minus_one = (mul(p, LOG_ALPHA_I + q + mul(LOG_ALPHA_D, common_sq))
                             + mul(LOG_ALPHA_F, q))
    reciprocal = one_over_one_plus_x_for_x_in_0_1(denominator_minus_one)
    num_scaled = rescale(num, 0, accum_bits)
    return rescale(mul(power, LOG_2) + mul(num_scaled, reciprocal), accum_bits, output_bits)
