"""CUMSUM: params every backend runs from.

LiteRT's kernel sums along the axis from 0 (so a first element of -0.0 gives +0.0), each
element in turn, in the tensor's type (int32 and int64 wrap); `exclusive` stores the sum before
the element is added, `reverse` walks the axis from its end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import Graph, Operator
from toolchain.ops.spec import input_and_output_alike, required_input


@dataclass(frozen=True)
class CumSumParams:
    """The input as [outer, depth, inner], summed along depth."""

    outer: int
    depth: int
    inner: int
    exclusive: bool
    reverse: bool


def prepare_cumsum(graph: Graph, op: Operator) -> CumSumParams:
    x, _ = input_and_output_alike(graph, op)  # one dtype: the signature says so
    axis_tensor = required_input(graph, op, 1, "axis")
    if axis_tensor.data is None or axis_tensor.data.size != 1:
        raise UnsupportedOpError("its axis must be a constant scalar")
    rank = len(x.shape)
    axis = int(axis_tensor.data.reshape(-1)[0])
    if not -rank <= axis < rank:
        raise ModelError(f"axis {axis} for an input of rank {rank}")
    axis %= rank
    return CumSumParams(math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:]),
                        bool(op.options.get("exclusive", False)),
                        bool(op.options.get("reverse", False)))
