"""Op knowledge, once: per operator type, the dtypes it runs on and how its constants are derived.

Each family module lists `SPECS`; runtime_py (and later codegen) look kernels up by opcode and
receive the params computed here, so the backends cannot drift apart.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from toolchain.errors import UnsupportedOpError
from toolchain.ir import Graph, Operator
from toolchain.ops.spec import OpSpec

# The op families: each has toolchain/ops/<family>.py (SPECS), runtime_py/kernels/<family>.py
# (KERNELS) and toolchain/codegen/<family>.py (EMITTERS). A new family is one name here.
FAMILY_NAMES = (
    "conv",
    "fully_connected",
    "pooling",
    "elementwise",
    "activations",
    "quantize",
    "shape",
    "reductions",
    "resize",
)
FAMILIES = tuple(import_module(f"toolchain.ops.{name}") for name in FAMILY_NAMES)

REGISTRY: dict[str, OpSpec] = {spec.opcode: spec for family in FAMILIES for spec in family.SPECS}

# The one list of supported (op, dtype) pairs; dtype is that of the op's first input.
SUPPORTED: frozenset[tuple[str, str]] = frozenset(
    (spec.opcode, dtype) for spec in REGISTRY.values() for dtype in spec.dtypes
)


def support_key(graph: Graph, op: Operator) -> tuple[str, str]:
    """(opcode, dtype of its data input): what the list of supported pairs speaks of."""
    if op.opcode == "CUSTOM":
        return op.custom_code or "CUSTOM", "none"
    spec = REGISTRY.get(op.opcode)
    position = spec.dtype_input if spec else 0
    tensor = op.inputs[position] if position < len(op.inputs) else -1
    return op.opcode, graph.tensors[tensor].dtype if tensor >= 0 else "none"


def prepare_graph(graph: Graph, source: str | None = None) -> list[Any]:
    """Params for every operator, or one UnsupportedOpError naming every operator that fails."""
    params, problems = [], []
    for op in graph.operators:
        opcode, dtype = support_key(graph, op)
        if (opcode, dtype) not in SUPPORTED:
            problems.append(f"op {op.index} {opcode} ({dtype})")
            continue
        try:
            params.append(REGISTRY[opcode].prepare(graph, op))
        except UnsupportedOpError as e:
            problems.append(f"op {op.index} {opcode} ({dtype}): {e.message}")
    if problems:
        raise UnsupportedOpError("unsupported: " + "; ".join(problems), source)
    return params


def unsupported_ops(graph: Graph) -> set[int]:
    """Indices of operators that no backend can run, for `inspect` to mark."""
    return {op.index for op in graph.operators if support_key(graph, op) not in SUPPORTED}
