"""A graph lowered for planning: every operator bound to its kernel before any byte is placed.

The planner, runtime_py and the C generator all read the same Program, so the memory a kernel
asks for (scratch) is planned with the tensors, the overlaps a planner may use are the ones the
bound kernel's loop order makes safe, and what `inspect` marks unsupported is exactly what the
backends refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolchain.ir import Graph, Model
from toolchain.lifetimes import ScratchRequest
from toolchain.ops import Refusal, bind_graph, refusal_error
from toolchain.ops.spec import Binding
from toolchain.targets import GENERIC, get_target


@dataclass(frozen=True, eq=False)
class Program:
    """One graph of a model with each operator's binding (None where no kernel binds it, with
    the reason among `refusals`). A plan can be made for a graph with refused operators, so
    that `plan` shows a model it cannot run; the backends ask `params()`, which refuses.
    `target` (toolchain.targets) is what the kernels were bound for; with `portable`, its
    portable kernels only (the baseline its own kernels are measured against)."""

    model: Model
    graph_index: int
    bindings: tuple[Binding | None, ...]
    refusals: tuple[Refusal, ...]
    target: str = GENERIC
    portable: bool = False

    @property
    def graph(self) -> Graph:
        return self.model.graphs[self.graph_index]

    def params(self) -> list[Any]:
        """Every operator's params, or one error naming every operator no kernel binds."""
        if self.refusals:
            raise refusal_error(self.refusals, self.model.source)
        return [b.params for b in self.bindings]

    def scratch(self) -> tuple[ScratchRequest, ...]:
        """Every kernel's scratch, as buffers living during their op's step."""
        return tuple(
            ScratchRequest(b.op, request.size, request.purpose)
            for b in self.bindings
            if b is not None
            for request in b.scratch
        )


def lower(model: Model, graph_index: int = 0, target: str = GENERIC,
          portable: bool = False) -> Program:
    """Bind every operator of one graph for `target` (with `portable`, to its portable
    kernels only); an op the model cannot mean fails here, before any planning (a variant no
    kernel runs is kept as a refusal)."""
    get_target(target, model.source)  # an unknown name is one clear error
    bindings, refusals = bind_graph(model.graphs[graph_index], GENERIC if portable else target)
    if any(r.invalid for r in refusals):
        raise refusal_error(refusals, model.source)
    return Program(model, graph_index, bindings, refusals, target, portable)
