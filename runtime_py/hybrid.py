"""The input quantization of TFLite's dynamic-range (hybrid) kernels in numpy, as its x86
reference build computes it (toolchain/ops/hybrid.py describes it and writes it in C)."""

from __future__ import annotations

import numpy as np

from toolchain.ops.hybrid import SATURATED as _SATURATED

f32 = np.float32
SATURATED = f32(_SATURATED)  # NaN and +-inf defined where TFLite's are not (ops/hybrid.py)


def saturated(p: np.ndarray) -> np.ndarray:
    """Scaled values clamped to +-SATURATED, NaN as 0, before rounding."""
    return np.where(np.isnan(p), f32(0), np.clip(p, -SATURATED, SATURATED)).astype(f32)


def ends(row: np.ndarray) -> tuple[np.float32, np.float32]:
    """min(0, x) and max(0, x), NaN left out."""
    values = row[~np.isnan(row)]
    return f32(min(f32(0), values.min(initial=0))), f32(max(f32(0), values.max(initial=0)))


def round_as_tflite_x86(p: np.ndarray) -> np.ndarray:
    """The x86 build's rounding of scaled float32 values: the first 8 * floor(n / 8) as
    trunc(p +- 0.5f) with the addition in float32, the rest half away from zero."""
    head = (p.size // 8) * 8
    half = np.where(p[:head] < 0, f32(-0.5), f32(0.5)).astype(f32)
    rounded = np.empty(p.size, np.int64)
    rounded[:head] = np.trunc((p[:head] + half).astype(f32))
    rounded[head:] = np.sign(p[head:]) * np.floor(np.abs(p[head:].astype(np.float64)) + 0.5)
    return rounded


def quantize_symmetric(row: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    """float32 values -> (int8 values as int64, scale, zero point 0)."""
    low, high = ends(row)
    extent = f32(max(-low, high))
    if extent == 0:
        return np.zeros(row.size, np.int64), f32(1.0), 0
    with np.errstate(over="ignore", invalid="ignore"):
        scale, inverse = f32(extent / f32(127)), f32(f32(127) / extent)
        p = saturated((row * inverse).astype(f32))
    return np.clip(round_as_tflite_x86(p), -127, 127), scale, 0


def quantize_asymmetric(row: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    """float32 values -> (int8 values as int64, scale, zero point)."""
    low, high = ends(row)
    if low == high:
        return np.zeros(row.size, np.int64), f32(1.0), 0
    with np.errstate(over="ignore"):
        step = float(f32(high - low)) / 255.0  # the difference in float, the division in double
    from_low, from_high = -128.0 - float(low) / step, 127.0 - float(high) / step
    z = from_low if 128.0 + abs(float(low) / step) < 127.0 + abs(float(high) / step) else from_high
    zero_point = -128 if z <= -128 else 127 if z >= 127 else 0 if np.isnan(z) else int(
        np.sign(z) * np.floor(abs(z) + 0.5))
    scale = f32(step)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        inverse = f32(np.float64(1.0) / np.float64(scale))
        p = saturated((row * inverse).astype(f32))
    rounded = round_as_tflite_x86(p)
    return np.clip(zero_point + rounded, -128, 127), scale, zero_point
