"""numpy kernels for the reductions, one function per arithmetic path TFLite's reference takes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier
from toolchain.ops.reductions.prepare import ArgParams, ReduceParams


def ordered_sum(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The float32 sum over `axes`, each output's terms added one by one in increasing address
    order from 0.0, as TFLite's reference loops do: numpy's pairwise np.sum rounds (and
    overflows to infinity) differently."""
    axes = tuple(a % x.ndim for a in axes)
    kept = [a for a in range(x.ndim) if a not in axes]
    terms = np.transpose(x, kept + list(axes)).reshape(*(x.shape[a] for a in kept), -1)
    if terms.shape[-1] == 0:
        return np.zeros(terms.shape[:-1], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.cumsum(terms, axis=-1, dtype=np.float32)[..., -1] + np.float32(0.0)


def _sum(params: ReduceParams, x: np.ndarray) -> np.ndarray:
    """In the input's own dtype: integer sums wrap around as TFLite's do, float sums add in
    order."""
    if x.dtype.kind == "f":
        return ordered_sum(x, params.axes)
    return np.sum(x, axis=params.axes, dtype=x.dtype)


def _max(params: ReduceParams, x: np.ndarray) -> np.ndarray:
    """Floats start from -FLT_MAX and NaN never wins, as in TFLite's reducer."""
    if x.dtype.kind == "f":
        return np.fmax.reduce(x, axis=params.axes, initial=-np.finfo(x.dtype).max)
    return np.max(x, axis=params.axes)


def _min(params: ReduceParams, x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "f":
        return np.fmin.reduce(x, axis=params.axes, initial=np.finfo(x.dtype).max)
    return np.min(x, axis=params.axes)


def _mean(params: ReduceParams, x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return ordered_sum(x.astype(np.float32), params.axes) / np.float32(params.count)


def _mean_truncate(params: ReduceParams, x: np.ndarray) -> np.ndarray:
    """int64 sum, then C's division: toward zero."""
    total = np.sum(x, axis=params.axes, dtype=np.int64)
    return np.sign(total) * (np.abs(total) // params.count)


def _requantized_sum(params: ReduceParams, x: np.ndarray) -> np.ndarray:
    total = np.sum(x, axis=params.axes, dtype=np.int64)
    # The zero points' share leaves the sum in int64 and comes back as int32, as in C.
    centered = (total - params.count * params.input_zero_point).astype(np.int32)
    scaled = multiply_by_quantized_multiplier(centered, params.multiplier, params.shift)
    return np.clip(scaled + params.output_zero_point, params.output_min, params.output_max)


_METHODS: dict[str, Callable[[ReduceParams, np.ndarray], np.ndarray]] = {
    "sum": _sum,
    "max": _max,
    "min": _min,
    "mean": _mean,
    "mean_truncate": _mean_truncate,
    "requantized_sum": _requantized_sum,
}


def reduce(params: ReduceParams, inputs: list[np.ndarray | None],
           outputs: list[np.ndarray]) -> None:
    out = outputs[0]
    result = _METHODS[params.method](params, inputs[0])
    out[...] = np.asarray(result).astype(out.dtype).reshape(out.shape)


def arg_extreme(params: ArgParams, inputs: list[np.ndarray | None],
                outputs: list[np.ndarray]) -> None:
    """TFLite's scan: the running extreme changes only on a strictly better element, so ties
    keep the first index (and NaN never wins unless it comes first)."""
    along = np.moveaxis(inputs[0], params.axis, 0)
    best, index = along[0].copy(), np.zeros(along.shape[1:], np.int64)
    for i in range(1, along.shape[0]):
        better = along[i] > best if params.maximize else along[i] < best
        best = np.where(better, along[i], best)
        index[better] = i
    outputs[0][...] = index


KERNELS: dict = {
    "MEAN": reduce,
    "SUM": reduce,
    "REDUCE_MAX": reduce,
    "REDUCE_MIN": reduce,
    "REDUCE_ANY": reduce,
    "REDUCE_ALL": reduce,
    "ARG_MAX": arg_extreme,
    "ARG_MIN": arg_extreme,
}
