"""ZEROS_LIKE, FILL and SHAPE: outputs that do not depend on the inputs' values (but FILL's one
value).

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from typing import Any

from toolchain.ir import Graph, Operator
from toolchain.ops.fill.emit import emit_fill, emit_shape, emit_zeros_like
from toolchain.ops.fill.prepare import prepare_fill, prepare_shape, prepare_zeros_like
from toolchain.ops.overlaps import OverlapRule, Rule
from toolchain.ops.spec import OpSpec, kernels


def unread(position: int) -> Rule:
    """The input at `position` is read (if at all) before the first output element is written:
    the output may lie anywhere over it."""

    def rule(graph: Graph, op: Operator, params: Any) -> list[OverlapRule]:
        return [OverlapRule(position, 0, 0, any_offset=True)]

    return rule


SPECS: tuple[OpSpec, ...] = (
    OpSpec("ZEROS_LIKE", kernels("T -> T", T=("float32", "int32", "int64")), prepare_zeros_like,
           emit_zeros_like, overlaps=unread(0)),
    OpSpec("FILL", kernels("I, T -> T", I=("int32", "int64"),
                           T=("bool", "float32", "int8", "int16", "int32", "int64")),
           prepare_fill, emit_fill, overlaps=unread(1)),
    OpSpec("SHAPE", kernels("T -> I", I=("int32", "int64"),
                            T=("bool", "float32", "int8", "uint8", "int16", "int32", "int64")),
           prepare_shape, emit_shape, overlaps=unread(0)),
)
