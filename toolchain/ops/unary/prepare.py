"""The float32 elementwise math functions (ABS, NEG, SQUARE, SQRT, RSQRT, FLOOR, CEIL, ROUND,
EXP, LOG, SIN, COS): params every backend runs from.

Each function is one IEEE operation (or two, for RSQRT's 1 / sqrt(x)), correctly rounded by C
and numpy alike, or, for ROUND, TFLite's own steps of such operations (floor, a difference, a
comparison), so the C, runtime_py and TFLite's reference kernels agree bit for bit on every
input, NaN and infinities included. EXP, LOG, SIN and COS are the C library's expf, logf, sinf
and cosf, which no standard rounds correctly: runtime_py calls the host's, as LiteRT's kernels
do, so the three agree bit for bit on one machine; a device's C library may differ from the
host's by an ulp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolchain.ir import Graph, Operator
from toolchain.ops.spec import input_and_output_alike

FUNCTIONS = ("ABS", "NEG", "SQUARE", "SQRT", "RSQRT", "FLOOR", "CEIL", "ROUND",
             "EXP", "LOG", "SIN", "COS")


@dataclass(frozen=True)
class UnaryMathParams:
    """`function` (an opcode of FUNCTIONS) of each of `elements` values (float32; NEG also
    int32 or int64)."""

    function: str
    elements: int


def prepare_unary_math(graph: Graph, op: Operator) -> UnaryMathParams:
    x, _ = input_and_output_alike(graph, op)
    return UnaryMathParams(op.opcode, math.prod(x.shape))
