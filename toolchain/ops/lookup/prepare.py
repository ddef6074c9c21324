"""GATHER_ND, EMBEDDING_LOOKUP and DYNAMIC_UPDATE_SLICE: params every backend runs from.

Their indices are an input, read when the model runs, so each is checked where it is read, as
LiteRT's kernels check it: GATHER_ND fails when a coordinate lies outside its dimension,
EMBEDDING_LOOKUP when an id is not a row of the value. A failure fails the invoke: runtime_py
raises, and the C's invoke returns NAME_ERROR_INDEX_OUT_OF_RANGE with the outputs
unspecified. DYNAMIC_UPDATE_SLICE never fails: as LiteRT (and XLA) it clamps each start so the
update fits. We follow LiteRT where TFLite Micro's GATHER_ND checks only the slice's flat
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


@dataclass(frozen=True)
class DynamicUpdateSliceParams:
    """The operand's `shape` copied, then the update of `update_shape` written from a start
    that the model computes, each coordinate clamped into [0, shape[k] - update_shape[k]]."""

    shape: tuple[int, ...]
    update_shape: tuple[int, ...]


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


def prepare_dynamic_update_slice(graph: Graph, op: Operator) -> DynamicUpdateSliceParams:
    operand = required_input(graph, op, 0, "operand")
    update = required_input(graph, op, 1, "update")
    start = required_input(graph, op, 2, "start_indices")
    out = _output(graph, op)
    rank = len(operand.shape)
    if start.shape != (rank,):
        raise ModelError(f"its start indices have shape {list(start.shape)}, not [{rank}] (one "
                         "per dimension of the operand)")
    if len(update.shape) != rank or any(u > d for u, d in zip(update.shape, operand.shape,
                                                               strict=True)):
        raise ModelError(f"its update {list(update.shape)} does not fit in the operand "
                         f"{list(operand.shape)}")
    _expect_shape(out, operand.shape)
    return DynamicUpdateSliceParams(operand.shape, update.shape)
