"""numpy kernels for QUANTIZE, DEQUANTIZE and CAST, element for element as TFLite computes them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from toolchain.ir import INT32_MAX, INT32_MIN
from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier, wrap_int32
from toolchain.ops.quantize.prepare import (
    AffineQuantizeParams,
    CastParams,
    DequantizeParams,
    PerChannelQuantizeParams,
    RequantizeParams,
)


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """TfLiteRound on float32 values; float64 holds x + 0.5 exactly, so no double rounding."""
    x = x.astype(np.float64)
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def _affine(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, low: int, high: int
            ) -> np.ndarray:
    """The rounded quotient goes through C's float -> int32 conversion before the zero point is
    added in int32: on x86 out of range and NaN become INT32_MIN, and the addition wraps."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        quotient = x.astype(np.float32) / scale.astype(np.float32)
    rounded = _round_half_away(quotient)
    in_range = (rounded >= INT32_MIN) & (rounded <= INT32_MAX)
    as_int32 = np.where(in_range, rounded, INT32_MIN).astype(np.int64)
    q = (as_int32 + zero_point).astype(np.int32)  # modular, like the C addition
    return np.clip(q, low, high)


def _affine_quantize(params: AffineQuantizeParams, x: np.ndarray) -> np.ndarray:
    return _affine(x, np.float32(params.scale), np.int64(params.zero_point), params.output_min,
                   params.output_max)


def _per_channel_quantize(params: PerChannelQuantizeParams, x: np.ndarray) -> np.ndarray:
    shape = [1] * x.ndim
    shape[params.channel_axis] = -1
    return _affine(x, np.asarray(params.scales, np.float32).reshape(shape),
                   np.asarray(params.zero_points, np.int64).reshape(shape), params.output_min,
                   params.output_max)


def _requantize(params: RequantizeParams, x: np.ndarray) -> np.ndarray:
    """The zero points' subtraction and addition wrap around in int32, as TFLite's do (for
    int32 inputs, or products at the ends of int32)."""
    shifted = wrap_int32(x.astype(np.int64) - params.input_zero_point)
    scaled = multiply_by_quantized_multiplier(shifted, params.multiplier, params.shift)
    return np.clip(wrap_int32(scaled + params.output_zero_point), params.output_min,
                   params.output_max)


_QUANTIZERS: dict[type, Callable[..., np.ndarray]] = {
    AffineQuantizeParams: _affine_quantize,
    PerChannelQuantizeParams: _per_channel_quantize,
    RequantizeParams: _requantize,
}


def quantize(params: AffineQuantizeParams | PerChannelQuantizeParams | RequantizeParams,
             inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> None:
    out = outputs[0]
    out[...] = _QUANTIZERS[type(params)](params, inputs[0]).astype(out.dtype)


def dequantize(params: DequantizeParams, inputs: list[np.ndarray | None],
               outputs: list[np.ndarray]) -> None:
    """The product is exact in double and rounds once to float32, per tensor or channel."""
    x = inputs[0]
    shape = [1] * x.ndim
    if params.channel_axis is not None:
        shape[params.channel_axis] = -1
    scales = np.asarray(params.scales, np.float64).reshape(shape)
    zero_points = np.asarray(params.zero_points, np.int64).reshape(shape)
    outputs[0][...] = (scales * (x.astype(np.int64) - zero_points)).astype(np.float32)


def _nonzero(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return x != 0


def _convert(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Exact or round-to-nearest widening, modular narrowing: C's conversions between these."""
    return x.astype(dtype)


def _saturate(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """TFLite's float -> integer: truncate toward zero, clamp to the dtype, NaN -> maximum."""
    info = np.iinfo(dtype)
    t = np.trunc(x.astype(np.float64))
    too_high = np.isnan(t) | (t >= float(info.max) + 1.0)  # the bound is exact in float64
    inside = np.where(too_high | (t < info.min), 0, t).astype(np.int64)
    return np.where(too_high, info.max, np.where(t < info.min, info.min, inside))


_CASTS: dict[str, Callable[[np.ndarray, np.dtype], np.ndarray]] = {
    "nonzero": _nonzero,
    "convert": _convert,
    "saturate": _saturate,
}


def cast(params: CastParams, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> None:
    out = outputs[0]
    with np.errstate(invalid="ignore", over="ignore"):
        out[...] = _CASTS[params.method](inputs[0], out.dtype).astype(out.dtype)


KERNELS: dict = {"QUANTIZE": quantize, "DEQUANTIZE": dequantize, "CAST": cast}
