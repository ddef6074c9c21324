"""numpy kernels for the pooling family: AVERAGE_POOL_2D and MAX_POOL_2D (NHWC).

Every window is read at once through a strided view of the input, padded with a value that
cannot change the result (0 for sums, the dtype's lowest for maxima), and reduced tap by tap in
TFLite's loop order, so float sums round (and overflow) as TFLite's do and NaN never wins a
maximum; averages divide by the in-bounds count from the params, as TFLite's reference kernels do.
A global pool's band of a striped segment adds its rows to accumulators in the arena, pixel by
pixel in the same order, and the last band turns them into the output.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from toolchain.ops.pooling.prepare import Pool2DParams


def windows(p: Pool2DParams, x: np.ndarray, fill) -> np.ndarray:
    """(batch, out_h, out_w, channels, filter_h, filter_w) view of every pooling window."""
    _, height, width, _ = x.shape
    bottom = max((p.output_height - 1) * p.stride_height + p.filter_height - height - p.pad_top, 0)
    right = max((p.output_width - 1) * p.stride_width + p.filter_width - width - p.pad_left, 0)
    padded = np.pad(x, ((0, 0), (p.pad_top, bottom), (p.pad_left, right), (0, 0)),
                    constant_values=fill)
    view = sliding_window_view(padded, (p.filter_height, p.filter_width), axis=(1, 2))
    return view[:, ::p.stride_height, ::p.stride_width][:, :p.output_height, :p.output_width]


def _counts(p: Pool2DParams) -> np.ndarray:
    return p.window_counts[None, :, :, None]


def _taps(view: np.ndarray) -> Iterator[np.ndarray]:
    """Each window position's values over all windows, row by row: TFLite's loop order."""
    for fy in range(view.shape[-2]):
        for fx in range(view.shape[-1]):
            yield view[..., fy, fx]


def average_pool_float(p: Pool2DParams, x: np.ndarray) -> np.ndarray:
    """The float32 sum from 0.0 taken tap by tap, as TFLite's loop adds them (the zeros of the
    padding change no sum that starts at 0.0)."""
    view = windows(p, x, 0.0)
    total = np.zeros(view.shape[:-2], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for tap in _taps(view):
            total += tap
        return total / _counts(p).astype(np.float32)


def average_pool_integer(p: Pool2DParams, x: np.ndarray) -> np.ndarray:
    """int8, uint8 and int16: the int32 sum divided by the count, rounding halves away from zero (C
    division of acc +- count / 2, which truncates toward zero; uint8 sums are never negative)."""
    return rounded_average(windows(p, x, 0).sum(axis=(-2, -1), dtype=np.int64), _counts(p))


def rounded_average(total: np.ndarray, counts) -> np.ndarray:
    """TFLite's integer average: halves rounded away from zero."""
    return np.sign(total) * ((np.abs(total) + counts // 2) // counts)


def l2_pool(p: Pool2DParams, x: np.ndarray) -> np.ndarray:
    """float32: the sum of squares from 0.0 tap by tap (each square rounded, then added, as
    TFLite's loop), its mean over the window's in-bounds elements, its square root."""
    view = windows(p, x, 0.0)
    total = np.zeros(view.shape[:-2], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for tap in _taps(view):
            total += tap * tap
        return np.sqrt(total / _counts(p).astype(np.float32))


def max_pool(p: Pool2DParams, x: np.ndarray) -> np.ndarray:
    """TFLite's scan from the dtype's lowest finite value: an element replaces the maximum only
    when greater, so NaN never does (np.max would return it) and a window of -inf gives the
    lowest float."""
    lowest = np.finfo(x.dtype).min if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    view = windows(p, x, lowest)
    best = np.full(view.shape[:-2], lowest, x.dtype)
    for tap in _taps(view):
        best = np.where(tap > best, tap, best)
    return best


_AVERAGE = {np.dtype(np.float32): average_pool_float,
            **dict.fromkeys(map(np.dtype, (np.int8, np.uint8, np.int16)), average_pool_integer)}
_MAX = dict.fromkeys(map(np.dtype, (np.float32, np.int8, np.uint8, np.int16)), max_pool)


def reduced_band(kind: str, p: Pool2DParams, x: np.ndarray, accumulators: np.ndarray,
                 out: np.ndarray) -> None:
    """A global pool's band (p.reduction): its rows added to the accumulators (the arena bytes
    `accumulators`, int32 or float32 per channel), pixel by pixel as the whole window's loop
    adds them; the last band writes the output from them."""
    floating = x.dtype.kind == "f"
    acc = accumulators.view(np.float32 if floating else np.int32)
    lowest = np.finfo(x.dtype).min if floating else np.iinfo(x.dtype).min
    if p.reduction.starts:
        acc[...] = lowest if kind == "max" else 0
    with np.errstate(over="ignore", invalid="ignore"):
        for pixel in x.reshape(-1, p.channels).astype(acc.dtype):
            if kind == "max":
                acc[...] = np.where(pixel > acc, pixel, acc)
            else:
                acc += pixel * pixel if kind == "l2" else pixel
        if not p.reduction.finishes:
            return
        count = int(p.window_counts[0, 0])
        if kind == "max":
            pooled = acc
        elif floating:
            pooled = acc / np.float32(count)
            pooled = np.sqrt(pooled) if kind == "l2" else pooled
        else:
            pooled = rounded_average(acc.astype(np.int64), count)
    out[...] = np.clip(pooled, p.activation_min, p.activation_max).astype(x.dtype).reshape(
        out.shape)


def _pool_kernel(kind: str, pool_by_dtype):
    """A kernel that pools with the function for its input's dtype, then applies the clamp (a
    band of a global pool: reduced_band, its accumulators after its inputs)."""

    def kernel(p: Pool2DParams, inputs, outputs) -> None:
        x = inputs[0]
        if p.reduction is not None:
            reduced_band(kind, p, x, inputs[-1], outputs[0])
            return
        pooled = pool_by_dtype[x.dtype](p, x)
        outputs[0][...] = np.clip(pooled, p.activation_min, p.activation_max).astype(x.dtype)

    return kernel


KERNELS: dict = {
    "AVERAGE_POOL_2D": _pool_kernel("average", _AVERAGE),
    "MAX_POOL_2D": _pool_kernel("max", _MAX),
    "L2_POOL_2D": _pool_kernel("l2", {np.dtype(np.float32): l2_pool}),
}
