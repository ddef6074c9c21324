"""Control flow: IF and WHILE, which run subgraphs of the model.

toolchain.lower.program lays the subgraphs they run into one program with their caller's: their
steps follow the op's step, their inputs are the tensors the op passes (no copy), and what they
hand back is copied out after their steps (toolchain.lower.program.Control). The backends run
those steps: runtime_py (runtime_py.interpreter) and the C of `emit_if` / `emit_while`, which
wrap the calls of the steps in an `if`/`else` and a loop. What the copies need of the plan (their
sources alive until they run, the loop values across the whole loop) is planned with every other
tensor.

The operand checks TFLite makes (a bool condition, subgraphs whose inputs and outputs match the
op's in number, type and shape) are the model's (toolchain.front.validate.check_calls); what TFLite
would run with tensors resized at run time is refused by toolchain.lower.program.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolchain.ir import Graph, Operator
from toolchain.ops.variables.prepare import VALUE_DTYPES

# Any operand a subgraph may take: a value of a stored type, or a resource variable's handle.
OPERAND = VALUE_DTYPES | {"resource"}


@dataclass(frozen=True)
class IfParams:
    """IF: the subgraph run when the condition holds, and the one run when it does not."""

    then_subgraph: int
    else_subgraph: int


@dataclass(frozen=True)
class WhileParams:
    """WHILE: the subgraph that tests the loop values, and the one that computes the next."""

    cond_subgraph: int
    body_subgraph: int


def prepare_if(graph: Graph, op: Operator) -> IfParams:
    """The subgraphs and operands were validated with the model."""
    return IfParams(op.options["then_subgraph_index"], op.options["else_subgraph_index"])


def prepare_while(graph: Graph, op: Operator) -> WhileParams:
    return WhileParams(op.options["cond_subgraph_index"], op.options["body_subgraph_index"])
