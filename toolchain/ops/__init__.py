"""Op knowledge, once: per operator type, the dtypes it runs on and how its constants are derived.

Each family module lists `SPECS`; runtime_py (and later codegen) look kernels up by opcode and
receive the params computed here, so the backends cannot drift apart.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

import numpy as np

from toolchain.errors import ArenacError, ModelError, UnsupportedOpError
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

# Element types the backends store (a C type each); an operand of any other type is refused
# before a kernel or an emitter sees it, whatever role the op gives it.
OPERAND_DTYPES = frozenset({"float32", "int8", "uint8", "int16", "int32", "int64", "bool"})


def support_key(graph: Graph, op: Operator) -> tuple[str, str]:
    """(opcode, dtype of its data input): what the list of supported pairs speaks of."""
    if op.opcode == "CUSTOM":
        return op.custom_code or "CUSTOM", "none"
    spec = REGISTRY.get(op.opcode)
    position = spec.dtype_input if spec else 0
    tensor = op.inputs[position] if position < len(op.inputs) else -1
    return op.opcode, graph.tensors[tensor].dtype if tensor >= 0 else "none"


def prepare_graph(graph: Graph, source: str | None = None) -> list[Any]:
    """Params for every operator, or one error naming every operator that fails.

    A prepare raises UnsupportedOpError for a variant no backend runs and ModelError for an
    invalid model; any other exception is a check a prepare lacks, and still becomes one line
    naming the op rather than a traceback. Invalid ops are reported alone when there are any.
    """
    params, problems, invalid = [], _unstorable(graph), []
    for op in graph.operators:
        opcode, dtype = support_key(graph, op)
        if (opcode, dtype) not in SUPPORTED:
            problems.append(f"op {op.index} {opcode} ({dtype})")
            continue
        try:
            _check_operands(graph, op)
            with np.errstate(all="ignore"):  # a float overflow surfaces as a refused value
                params.append(REGISTRY[opcode].prepare(graph, op))
        except ModelError as e:
            invalid.append(f"op {op.index} {opcode} ({dtype}): {e.message}")
        except ArenacError as e:
            problems.append(f"op {op.index} {opcode} ({dtype}): {e.message}")
        except Exception as e:  # the last line of defense: still one line naming the op
            problems.append(f"op {op.index} {opcode} ({dtype}): cannot prepare "
                            f"({type(e).__name__}: {_first_line(e)})")
    if invalid:
        raise ModelError("invalid: " + "; ".join(invalid), source)
    if problems:
        raise UnsupportedOpError("unsupported: " + "; ".join(problems), source)
    return params


def _unstorable(graph: Graph) -> list[str]:
    """Graph inputs, outputs and variables that no backend can hold, whatever reads them."""
    roles = [*((f"graph input {i}", t) for i, t in enumerate(graph.inputs)),
             *((f"graph output {i}", t) for i, t in enumerate(graph.outputs)),
             *(("a variable", t.index) for t in graph.tensors if t.is_variable)]
    return [f"{role} (tensor {t} {graph.tensors[t].name!r}) is of type {graph.tensors[t].dtype}"
            for role, t in roles if graph.tensors[t].dtype not in OPERAND_DTYPES]


def _check_operands(graph: Graph, op: Operator) -> None:
    """What every backend assumes of every op: outputs exist and operands have a C type."""
    if not op.outputs:
        raise ModelError("has no outputs")
    for t in (*op.inputs, *op.outputs):
        if t >= 0 and graph.tensors[t].dtype not in OPERAND_DTYPES:
            tensor = graph.tensors[t]
            raise UnsupportedOpError(f"tensor {t} ({tensor.name!r}) of type {tensor.dtype}")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:200]


def unsupported_ops(graph: Graph) -> set[int]:
    """Indices of operators that no backend can run, for `inspect` to mark."""
    return {op.index for op in graph.operators if support_key(graph, op) not in SUPPORTED}
