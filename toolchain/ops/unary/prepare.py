"""The float32 elementwise math functions (ABS, NEG, SQUARE, SQRT, RSQRT, FLOOR, CEIL, ROUND):
params every backend runs from.

Each function is one IEEE operation (or two, for RSQRT's 1 / sqrt(x)), correctly rounded by C
and numpy alike, or, for ROUND, TFLite's own steps of such operations (floor, a difference, a
comparison), so the C, runtime_py and TFLite's reference kernels agree bit for bit on every
input, NaN and infinities included.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolchain.errors import ModelError
from toolchain.ir import Graph, Operator
from toolchain.ops.spec import required_input

FUNCTIONS = ("ABS", "NEG", "SQUARE", "SQRT", "RSQRT", "FLOOR", "CEIL", "ROUND")


@dataclass(frozen=True)
class UnaryMathParams:
    """`function` (an opcode of FUNCTIONS) of each of `elements` values (float32; NEG also
    int32 or int64)."""

    function: str
    elements: int


def prepare_unary_math(graph: Graph, op: Operator) -> UnaryMathParams:
    """The op's input and output are one shape: TFLite's kernels resize the output to it."""
    x = required_input(graph, op, 0, "input")
    out = graph.tensors[op.outputs[0]]
    if x.shape != out.shape:
        raise ModelError(f"output shape {list(out.shape)} is not the input's {list(x.shape)}")
    return UnaryMathParams(op.opcode, math.prod(x.shape))
