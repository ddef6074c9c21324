"""The registry entry every op family fills in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolchain.ir import Graph, Operator


@dataclass(frozen=True)
class OpSpec:
    """What the toolchain knows of one operator type.

    `dtypes`: the dtypes of its data input (`dtype_input`, usually the first) it runs on.
    `prepare(graph, op)` returns the op's params (a frozen dataclass: shapes, options and
    quantization constants such as multipliers, shifts and clamps) that every backend executes
    from; it raises UnsupportedOpError for a variant it cannot run.
    """

    opcode: str
    dtypes: frozenset[str]
    prepare: Callable[[Graph, Operator], Any]
    dtype_input: int = 0  # which input's dtype `dtypes` speaks of (SPLIT's data is input 1)
