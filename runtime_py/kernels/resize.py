"""numpy kernels for the resize ops: gathers and blends from the tables prepare computed."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from toolchain.ops.resize.prepare import BilinearParams, Interpolation, NearestParams

FIXED_SHIFT = 20  # the int8 and int16 blend carries two 10-bit weights


def resize_nearest(params: NearestParams, inputs: list[np.ndarray | None],
                   outputs: list[np.ndarray]) -> None:
    outputs[0][...] = inputs[0][:, params.rows][:, :, params.cols]


def _corners(x: np.ndarray, rows: Interpolation, cols: Interpolation) -> list[np.ndarray]:
    """The four neighbours of every output pixel: top-left, bottom-left, top-right, bottom-right."""
    return [x[:, r][:, :, c] for c in (cols.low, cols.high) for r in (rows.low, rows.high)]


def _weights(rows: Interpolation, cols: Interpolation, dtype) -> list[tuple[np.ndarray, ...]]:
    """(row weight, column weight) per corner, shaped to broadcast over N, H, W, C."""
    row = [np.asarray(w, dtype).reshape(1, -1, 1, 1) for w in (rows.low_weight, rows.high_weight)]
    col = [np.asarray(w, dtype).reshape(1, 1, -1, 1) for w in (cols.low_weight, cols.high_weight)]
    return [(row[0], col[0]), (row[1], col[0]), (row[0], col[1]), (row[1], col[1])]


def _blend_float32(params: BilinearParams, x: np.ndarray) -> np.ndarray:
    """Float32 throughout, in the reference's order: ((v · wy) · wx) summed left to right."""
    return sum(corner * wy * wx for corner, (wy, wx) in zip(
        _corners(x, params.rows, params.cols), _weights(params.rows, params.cols, np.float32),
        strict=True))


def _blend_fixed10(params: BilinearParams, x: np.ndarray) -> np.ndarray:
    total = sum(corner.astype(np.int64) * wy * wx for corner, (wy, wx) in zip(
        _corners(x, params.rows, params.cols), _weights(params.rows, params.cols, np.int64),
        strict=True))
    rounded = total + np.where(total > 0, 1 << (FIXED_SHIFT - 1), -(1 << (FIXED_SHIFT - 1)))
    return np.sign(rounded) * (np.abs(rounded) >> FIXED_SHIFT)  # C division: toward zero


def _blend_float32_rounded(params: BilinearParams, x: np.ndarray) -> np.ndarray:
    """The float32 blend of integer values, + 0.5f; the caller's cast truncates."""
    return _blend_float32(params, x) + np.float32(0.5)


_BLENDS: dict[str, Callable[[BilinearParams, np.ndarray], np.ndarray]] = {
    "float32": _blend_float32,
    "float32_rounded": _blend_float32_rounded,
    "fixed10": _blend_fixed10,
}


def resize_bilinear(params: BilinearParams, inputs: list[np.ndarray | None],
                    outputs: list[np.ndarray]) -> None:
    out = outputs[0]
    out[...] = _BLENDS[params.method](params, inputs[0]).astype(out.dtype)


KERNELS: dict = {
    "RESIZE_NEAREST_NEIGHBOR": resize_nearest,
    "RESIZE_BILINEAR": resize_bilinear,
}
