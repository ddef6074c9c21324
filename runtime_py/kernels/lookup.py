"""numpy kernels of GATHER_ND and EMBEDDING_LOOKUP (toolchain.ops.lookup), which check each
index where they read it and fail the invoke as LiteRT does when one is out of range, and of
DYNAMIC_UPDATE_SLICE, which clamps its start as LiteRT does."""

from __future__ import annotations

import numpy as np

from toolchain.errors import RuntimeBackendError
from toolchain.ops.lookup.prepare import (
    DynamicUpdateSliceParams,
    EmbeddingLookupParams,
    GatherNdParams,
)


def gather_nd(p: GatherNdParams, inputs, outputs) -> None:
    params = inputs[0].reshape(-1)
    vectors = inputs[1].reshape(p.slices, len(p.dims)).astype(np.int64)
    if ((vectors < 0) | (vectors >= np.array(p.dims, np.int64))).any():
        raise RuntimeBackendError("GATHER_ND: a coordinate lies outside its dimension")
    starts = vectors @ np.array(p.strides, np.int64)
    picks = starts[:, None] + np.arange(p.slice_size)
    outputs[0][...] = params[picks].reshape(outputs[0].shape)


def embedding_lookup(p: EmbeddingLookupParams, inputs, outputs) -> None:
    ids, rows = inputs[0], inputs[1].reshape(p.rows, p.row_size)
    if ((ids < 0) | (ids >= p.rows)).any():
        raise RuntimeBackendError(f"EMBEDDING_LOOKUP: an id lies outside [0, {p.rows})")
    picked = rows[ids]
    if p.scale is not None:  # float(value) * scale in float32, as LiteRT's hybrid lookup
        picked = picked.astype(np.float32) * np.float32(p.scale)
    outputs[0][...] = picked.reshape(outputs[0].shape)


def dynamic_update_slice(p: DynamicUpdateSliceParams, inputs, outputs) -> None:
    operand, update, start = inputs
    result = operand.copy()
    at = tuple(slice(s, s + u) for s, u in (
        (min(max(0, int(i)), d - u), u)
        for i, d, u in zip(start.reshape(-1), p.shape, p.update_shape, strict=True)))
    result[at] = update
    outputs[0][...] = result


KERNELS = {"GATHER_ND": gather_nd, "EMBEDDING_LOOKUP": embedding_lookup,
           "DYNAMIC_UPDATE_SLICE": dynamic_update_slice}
