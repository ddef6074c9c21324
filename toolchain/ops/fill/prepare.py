"""ZEROS_LIKE, FILL and SHAPE: params every backend runs from.

Their outputs do not depend on their inputs' values but FILL's one value: ZEROS_LIKE writes
zeros of its input's shape, SHAPE that shape itself (known when planning), FILL its scalar value
input over the shape its constant dims input gives. The value is read once before any element
is written, so each output may take its input's place.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.front.schema import DTYPE_NAMES
from toolchain.ir import Graph, Operator
from toolchain.ops.spec import input_and_output_alike, required_input


@dataclass(frozen=True)
class ZerosLikeParams:
    """Zero the `nbytes` bytes of the output: all-zero bits are 0, 0.0f and false alike."""

    nbytes: int


@dataclass(frozen=True)
class FillParams:
    """Each of `elements` output elements is a copy of the value input's one element."""

    elements: int


def prepare_zeros_like(graph: Graph, op: Operator) -> ZerosLikeParams:
    _, out = input_and_output_alike(graph, op)
    return ZerosLikeParams(out.nbytes)


def prepare_fill(graph: Graph, op: Operator) -> FillParams:
    """The output's shape is the dims input's values, which must be known when planning: a
    constant, as converters write it."""
    dims = required_input(graph, op, 0, "dims")
    value = required_input(graph, op, 1, "value")
    out = graph.tensors[op.outputs[0]]
    if dims.data is None:
        raise UnsupportedOpError("its dims must be a constant tensor: the output's shape is "
                                 "planned before the model runs")
    if len(dims.shape) != 1:
        raise ModelError(f"its dims have shape {list(dims.shape)}, not one dimension")
    if tuple(int(d) for d in dims.data) != out.shape:
        raise ModelError(f"its dims {[int(d) for d in dims.data]} are not the output's shape "
                         f"{list(out.shape)}")
    if value.shape != ():
        raise ModelError(f"its value has shape {list(value.shape)}, not a scalar's []")
    return FillParams(out.num_elements)


@dataclass(frozen=True)
class ShapeParams:
    """The input's dimensions, each an element of the output."""

    dims: tuple[int, ...]


def prepare_shape(graph: Graph, op: Operator) -> ShapeParams:
    """The output is int32 or int64, as its out_type option says (TFLite's kernel refuses any
    other)."""
    x = required_input(graph, op, 0, "input")
    out = graph.tensors[op.outputs[0]]
    declared = DTYPE_NAMES.get(op.options.get("out_type", -1))
    if declared != out.dtype:
        raise UnsupportedOpError(f"out_type {declared} with an output tensor of {out.dtype}")
    if out.shape != (len(x.shape),):
        raise ModelError(f"output shape {list(out.shape)} is not [{len(x.shape)}], the input's "
                         "rank")
    return ShapeParams(x.shape)


@dataclass(frozen=True)
class BroadcastArgsParams:
    """Two shapes of `lengths` dimensions broadcast into one of `out` dimensions (the longer
    length), right-aligned as TFLite broadcasts."""

    lengths: tuple[int, int]
    out: int


def prepare_broadcast_args(graph: Graph, op: Operator) -> BroadcastArgsParams:
    a = required_input(graph, op, 0, "shape1")
    b = required_input(graph, op, 1, "shape2")
    out = graph.tensors[op.outputs[0]]
    if len(a.shape) != 1 or len(b.shape) != 1:
        raise ModelError(f"its shapes are {list(a.shape)} and {list(b.shape)}, not vectors")
    n = max(a.shape[0], b.shape[0])
    if out.shape != (n,):
        raise ModelError(f"output shape {list(out.shape)} is not [{n}], the longer shape's")
    return BroadcastArgsParams((a.shape[0], b.shape[0]), n)
