"""TFLite's fixed-point primitives, vectorized over numpy int64 arrays.

The values stay in int32 range as in C; int64 storage only gives room for the intermediate
products. C's integer division truncates toward zero and Python's floors, so the code spells
out the truncation where TFLite relies on it.
"""

from __future__ import annotations

import numpy as np

from toolchain.ir import INT32_MAX, INT32_MIN


def _as_int64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def saturating_rounding_doubling_high_mul(a, b) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul on int32 values."""
    a, b = _as_int64(a), _as_int64(b)
    product = a * b
    nudge = np.where(product >= 0, 1 << 30, 1 - (1 << 30))
    total = product + nudge
    high = np.where(total >= 0, total >> 31, -((-total) >> 31))  # C division: toward zero
    overflow = (a == INT32_MIN) & (b == INT32_MIN)
    return np.where(overflow, INT32_MAX, high)


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT: x / 2^exponent, rounding halves away from zero."""
    x, exponent = _as_int64(x), _as_int64(exponent)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def multiply_by_quantized_multiplier(x, multiplier, shift) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier (double rounding): x * multiplier * 2^(shift-31).

    `multiplier` and `shift` may be per-channel arrays broadcasting against x.
    """
    x, shift = _as_int64(x), _as_int64(shift)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    scaled = wrap_int32(x * (np.int64(1) << left))
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(scaled, multiplier), right)


def wrap_int32(x: np.ndarray) -> np.ndarray:
    """Two's complement wrap to int32, as C's int32 arithmetic does in practice."""
    return ((x + 2**31) & 0xFFFFFFFF) - 2**31
