"""Quantization constants, computed once in toolchain code for runtime_py and codegen alike.

Each function follows the TensorFlow Lite reference code that derives the same constant, so
that both backends inherit TFLite's exact integer pipeline.
"""

from __future__ import annotations

import math

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.ir import INT32_MAX, INT32_MIN, Tensor

INT_RANGES: dict[str, tuple[int, int]] = {
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "int32": (INT32_MIN, INT32_MAX),
}


def tflite_round(x: float) -> int:
    """std::round: halves away from zero (Python's round() goes to even)."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


# Shifts a requantization may use: below -31 every bit is shifted out (TFLite flushes the
# multiplier to zero), and MultiplyByQuantizedMultiplier's int `1 << shift` overflows above 30.
MIN_SHIFT, MAX_SHIFT = -31, 30


def quantize_multiplier(real: float, max_shift: int = MAX_SHIFT) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier: real = multiplier * 2^(shift-31), multiplier in [2^30, 2^31).

    A ratio too small for any shift flushes to zero, as in TFLite; one that needs a shift
    above `max_shift` (or is not a number) comes from scales no kernel can requantize
    between, and is refused. (SOFTMAX's input scaling, capped below 2^31, may shift by 31.)
    """
    if real == 0.0:
        return 0, 0
    if not math.isfinite(real):
        raise UnsupportedOpError(f"requantization by {real}: the scales' ratio is not finite")
    fraction, shift = math.frexp(real)
    fixed = tflite_round(fraction * (1 << 31))
    if fixed == 1 << 31:
        fixed //= 2
        shift += 1
    if shift < MIN_SHIFT:
        return 0, 0
    if shift > max_shift:
        raise UnsupportedOpError(
            f"requantization by {real:.6g} needs a left shift of {shift} bits "
            f"(at most {max_shift}): the scales are too far apart"
        )
    return fixed, shift


def scale_of(t: Tensor) -> float:
    return t.quantization.scale[0] if t.quantization else 1.0


def zero_point_of(t: Tensor) -> int:
    return t.quantization.zero_point[0] if t.quantization else 0


def variable_fill(t: Tensor) -> int:
    """The value every element of a variable tensor without data starts at, and returns to on
    reset: its zero point for int8 (TFLite's interpreters memset an int8 variable to it), zero
    for every other type."""
    return zero_point_of(t) if t.dtype == "int8" else 0


def scales_of(t: Tensor) -> tuple[float, ...]:
    return t.quantization.scale if t.quantization else (1.0,)


def per_tensor_quantization(t: Tensor) -> tuple[float, int]:
    """(scale, zero point) of a per-tensor quantized int8 or uint8 tensor, the zero point within
    the type's range; anything else is unsupported."""
    q = t.quantization
    if q is None or len(q.scale) != 1 or len(q.zero_point) != 1:
        raise UnsupportedOpError(f"{t.dtype} tensor {t.name!r} needs per-tensor quantization")
    scale, zero_point = float(q.scale[0]), int(q.zero_point[0])
    low, high = INT_RANGES.get(t.dtype, (0, -1))
    if not (scale > 0 and low <= zero_point <= high):
        raise UnsupportedOpError(
            f"{t.dtype} tensor {t.name!r}: scale {scale}, zero point {zero_point}")
    return scale, zero_point


def require_int16_zero_points(*tensors: Tensor) -> None:
    """TFLite's 16x8 scheme: every int16 tensor among `tensors` has zero point 0."""
    for t in tensors:
        if t.dtype == "int16" and t.quantization is not None and any(t.quantization.zero_point):
            raise UnsupportedOpError(f"int16 tensor {t.name!r} needs zero point 0 (TFLite's "
                                     "16x8 scheme)")


def quantize_value(value: float, scale: float, zero_point: int) -> int:
    """TFLite's Quantize(f): zero_point + round(f / scale), the division done in float32."""
    return zero_point + tflite_round(float(np.float32(value) / np.float32(scale)))


def activation_range_quantized(activation: str, out: Tensor) -> tuple[int, int]:
    """CalculateActivationRangeQuantized: the fused activation's clamp in the output's integers."""
    qmin, qmax = INT_RANGES[out.dtype]
    if activation in ("NONE", None):
        return qmin, qmax
    scale, zp = scale_of(out), zero_point_of(out)
    low, high = ACTIVATION_FLOAT_RANGE[activation]
    lo = qmin if low == -math.inf else max(qmin, quantize_value(low, scale, zp))
    hi = qmax if high == math.inf else min(qmax, quantize_value(high, scale, zp))
    return lo, hi


ACTIVATION_FLOAT_RANGE: dict[str, tuple[float, float]] = {
    "NONE": (-math.inf, math.inf),
    "RELU": (0.0, math.inf),
    "RELU6": (0.0, 6.0),
    "RELU_N1_TO_1": (-1.0, 1.0),
}


FLOAT32_MAX = float(np.finfo(np.float32).max)


def activation_range_float(activation: str) -> tuple[float, float]:
    """CalculateActivationRange for float: the fused activation's clamp, never wider than the
    finite floats (an infinite result becomes +-FLT_MAX, as in TFLite)."""
    if activation not in ACTIVATION_FLOAT_RANGE:
        raise ValueError(f"fused activation {activation} is not supported")
    low, high = ACTIVATION_FLOAT_RANGE[activation]
    return max(low, -FLOAT32_MAX), min(high, FLOAT32_MAX)
