"""Op knowledge, once: per operator type, the dtypes it runs on and how its constants are derived.

Each family module lists `SPECS`; runtime_py (and later codegen) look kernels up by opcode and
receive the params computed here, so the backends cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any

import numpy as np

from toolchain.errors import ArenacError, ModelError, UnsupportedOpError
from toolchain.ir import Graph, Operator
from toolchain.ops.overlaps import declared_overlaps
from toolchain.ops.spec import Binding, OpSpec

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


@dataclass(frozen=True)
class Refusal:
    """Why one operator has no binding: `invalid` for a model that cannot mean the op, else a
    variant no kernel runs."""

    op: int
    message: str
    invalid: bool = False


def bind(graph: Graph, op: Operator) -> Binding:
    """The op bound to its kernel; raises UnsupportedOpError or ModelError (without the file)."""
    opcode, dtype = support_key(graph, op)
    if (opcode, dtype) not in SUPPORTED:
        raise UnsupportedOpError(f"no kernel for {dtype}")
    _check_operands(graph, op)
    spec = REGISTRY[opcode]
    with np.errstate(all="ignore"):  # a float overflow surfaces as a refused value
        params = spec.prepare(graph, op)
    scratch = spec.scratch(params) if spec.scratch else ()
    return Binding(op.index, opcode, params, tuple(scratch), tuple(declared_overlaps(graph, op)))


def bind_graph(graph: Graph) -> tuple[tuple[Binding | None, ...], tuple[Refusal, ...]]:
    """Every op's binding (None where it has none) and every refusal, graph-wide ones first.

    Any exception other than the toolchain's own is a check a prepare lacks, and still becomes
    one refusal naming the op rather than a traceback.
    """
    bindings: list[Binding | None] = []
    refusals = [Refusal(-1, problem) for problem in _unstorable(graph)]
    for op in graph.operators:
        opcode, dtype = support_key(graph, op)
        where = f"op {op.index} {opcode} ({dtype})"
        try:
            bindings.append(bind(graph, op))
            continue
        except ModelError as e:
            refusals.append(Refusal(op.index, f"{where}: {e.message}", invalid=True))
        except ArenacError as e:
            message = where if (opcode, dtype) not in SUPPORTED else f"{where}: {e.message}"
            refusals.append(Refusal(op.index, message))
        except Exception as e:  # the last line of defense: still one line naming the op
            refusals.append(Refusal(op.index, f"{where}: cannot prepare "
                                              f"({type(e).__name__}: {_first_line(e)})"))
        bindings.append(None)
    return tuple(bindings), tuple(refusals)


def refusal_error(refusals: tuple[Refusal, ...], source: str | None) -> ArenacError:
    """One error for all refusals; invalid ops are reported alone when there are any."""
    invalid = [r.message for r in refusals if r.invalid]
    if invalid:
        return ModelError("invalid: " + "; ".join(invalid), source)
    return UnsupportedOpError("unsupported: " + "; ".join(r.message for r in refusals), source)


def prepare_graph(graph: Graph, source: str | None = None) -> list[Any]:
    """Params for every operator, or one error naming every operator that fails."""
    bindings, refusals = bind_graph(graph)
    if refusals:
        raise refusal_error(refusals, source)
    return [b.params for b in bindings]


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


def unsupported_ops(graph: Graph) -> dict[int, str]:
    """Operators that no backend can run, with the reason: what `inspect` marks is exactly what
    `run`, `gen` and `check` refuse, since all of them ask the same `bind`."""
    return {r.op: r.message for r in bind_graph(graph)[1] if r.op >= 0}
