"""The registry entry every op family fills in, and the checks every family's prepare shares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolchain.errors import ModelError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops.overlaps import OverlapRule

INT32_MAX = 2**31 - 1
# Most elements of the padded plane a windowed op (convolution, pooling) slides over.
# runtime_py builds that plane (in float64 for convolutions: at most 512 MiB); the generated C
# never builds it, but computes its indices in int32.
MAX_PLANE_ELEMENTS = 2**26


@dataclass(frozen=True)
class MemoryRequest:
    """Bytes a kernel needs beyond its tensors. Scratch lives during its op's step only and is
    planned in the arena like any buffer, so a window copy never hides on the stack."""

    size: int
    purpose: str


@dataclass(frozen=True)
class Binding:
    """One operator bound to its kernel before anything is planned: what every backend runs
    from (`params`), the memory the kernel asks for (`scratch`), and the outputs its loop order
    lets share an input's memory (`overlaps`, every rule; the techniques switched on pick)."""

    op: int
    opcode: str
    params: Any
    scratch: tuple[MemoryRequest, ...] = ()
    overlaps: tuple[OverlapRule, ...] = ()


@dataclass(frozen=True)
class OpSpec:
    """What the toolchain knows of one operator type.

    `dtypes`: the dtypes of its data input (`dtype_input`, usually the first) it runs on.
    `prepare(graph, op)` returns the op's params (a frozen dataclass: shapes, options and
    quantization constants such as multipliers, shifts and clamps) that every backend executes
    from; it raises UnsupportedOpError for a variant it cannot run and ModelError for an op the
    model cannot mean (a required input or option missing).
    """

    opcode: str
    dtypes: frozenset[str]
    prepare: Callable[[Graph, Operator], Any]
    dtype_input: int = 0  # which input's dtype `dtypes` speaks of (SPLIT's data is input 1)
    # The scratch the C kernel asks for, from the op's params; none by default.
    scratch: Callable[[Any], tuple[MemoryRequest, ...]] | None = None


def required_input(graph: Graph, op: Operator, position: int, what: str) -> Tensor:
    """Input `position` of the op, which TFLite's kernel requires to be present."""
    if position >= len(op.inputs) or op.inputs[position] < 0:
        raise ModelError(f"the required {what} (input {position}) is missing")
    return graph.tensors[op.inputs[position]]


def required_options(op: Operator, *keys: str) -> dict[str, Any]:
    """The op's options, which must hold `keys`: without its options table an op such as a
    pooling has no window, and TFLite's zeroed defaults describe none."""
    missing = [k for k in keys if k not in op.options]
    if missing:
        raise ModelError(f"its options lack {', '.join(missing)}")
    return dict(op.options)
