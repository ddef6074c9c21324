"""GATHER_ND and EMBEDDING_LOOKUP: params every backend runs from.

Their indices are an input, read when the model runs, so each is checked where it is read, as
LiteRT's kernels check it: GATHER_ND fails when a coordinate lies outside its dimension,
EMBEDDING_LOOKUP when an id is not a row of the value. A failure fails the invoke: runtime_py
raises, and the C's invoke returns NAME_ERROR_INDEX_OUT_OF_RANGE with the outputs
unspecified. We follow LiteRT where TFLite Micro's GATHER_ND checks only the slice's flat
position: for a coordinate past its dimension whose position still lies within the params
(index [0, 5] of a [3, 4] tensor), TFLite Micro reads another element where LiteRT fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops.spec import required_input


@dataclass(frozen=True)
class GatherNdParams:
    """`slices` index vectors of `len(dims)` coordinates each; coordinate j lies in
    [0, dims[j]) and moves `strides[j]` elements into params, and each vector picks the slice
    of `slice_size` elements it starts."""

    dims: tuple[int, ...]
    strides: tuple[int, ...]
    slices: int
    slice_size: int


@dataclass(frozen=True)
class EmbeddingLookupParams:
    """Row ids[i] of the value's `rows` rows of `row_size` elements is output row i; an int8
    value feeding a float32 output is multiplied by `scale` (LiteRT's hybrid lookup), else the
    row is copied (`scale` None)."""

    ids: int
    rows: int
    row_size: int
    scale: float | None


def _output(graph: Graph, op: Operator) -> Tensor:
    if len(op.outputs) != 1:
        raise ModelError(f"has {len(op.outputs)} outputs, not 1")
    return graph.tensors[op.outputs[0]]


def _expect_shape(out: Tensor, shape: tuple[int, ...]) -> None:
    if out.shape != shape:
        raise ModelError(f"output shape {list(out.shape)} is not the {list(shape)} its inputs "
                         "give")


def prepare_gather_nd(graph: Graph, op: Operator) -> GatherNdParams:
    params = required_input(graph, op, 0, "params")
    indices = required_input(graph, op, 1, "indices")
    out = _output(graph, op)
    if not indices.shape:
        raise ModelError("its indices are a scalar: they need a last axis of coordinates")
    depth = indices.shape[-1]
    if depth == 0:
        raise UnsupportedOpError("index vectors of no coordinates (LiteRT fails on them)")
    if depth > len(params.shape):
        raise ModelError(f"index vectors of {depth} coordinates into params of rank "
                         f"{len(params.shape)}")
    _expect_shape(out, (*indices.shape[:-1], *params.shape[depth:]))
    slice_size = math.prod(params.shape[depth:])
    strides = tuple(math.prod(params.shape[j + 1:]) for j in range(depth))
    return GatherNdParams(tuple(params.shape[:depth]), strides, math.prod(indices.shape[:-1]),
                          slice_size)


def prepare_embedding_lookup(graph: Graph, op: Operator) -> EmbeddingLookupParams:
    """The hybrid lookup takes a per-tensor scale and zero point 0, as LiteRT reads it (it
    ignores a zero point, and TFLite Micro reads one scale)."""
    ids = required_input(graph, op, 0, "ids")
    value = required_input(graph, op, 1, "value")
    out = _output(graph, op)
    if len(ids.shape) != 1:
        raise ModelError(f"its ids have shape {list(ids.shape)}, not one dimension")
    if len(value.shape) < 2:
        raise ModelError(f"its value has shape {list(value.shape)}: it needs rows")
    _expect_shape(out, (ids.shape[0], *value.shape[1:]))
    scale = None
    if value.dtype != out.dtype:
        q = value.quantization
        if q is None or len(q.scale) != 1:
            raise UnsupportedOpError("an int8 value read into float32 needs one scale")
        if any(q.zero_point):
            raise UnsupportedOpError(f"an int8 value with zero point {q.zero_point[0]} (LiteRT "
                                     "would ignore it)")
        scale = float(q.scale[0])
    return EmbeddingLookupParams(ids.shape[0], value.shape[0], math.prod(value.shape[1:]), scale)
