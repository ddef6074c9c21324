"""A model's arena plan: lifetimes of one graph, planned offsets, and the figures beside them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from toolchain.ir import Model
from toolchain.lifetimes import Lifetimes, ScratchRequest, compute_lifetimes
from toolchain.planners import Plan, align_up, lower_bound, make_plan, naive_sum

STATE_ALIGNMENT = 16


@dataclass(frozen=True)
class BufferRow:
    """One planned buffer as users see it."""

    buffer: int
    tensor: int | None
    name: str
    bytes: int
    first_op: int
    last_op: int
    offset: int


@dataclass(frozen=True)
class ModelPlan:
    """Everything `plan`, the runtime and codegen need to place a graph's tensors."""

    model: Model
    graph_index: int
    lifetimes: Lifetimes
    plan: Plan
    lower_bound_bytes: int
    naive_bytes: int

    @property
    def arena_bytes(self) -> int:
        return self.plan.arena_bytes

    @property
    def graph(self):
        return self.model.graphs[self.graph_index]

    def offset_of_tensor(self) -> dict[int, int]:
        """Tensor index -> arena offset, for every planned tensor."""
        return {
            t: off for t, off in zip(self.lifetimes.tensor_of, self.plan.offsets) if t is not None
        }

    def state_layout(self) -> tuple[dict[int, int], int]:
        """Variables persist in a block of their own: tensor -> offset there, and its size."""
        offsets, size = {}, 0
        for t in self.lifetimes.variables:
            offsets[t] = size
            size += align_up(self.graph.tensors[t].nbytes, STATE_ALIGNMENT)
        return offsets, size

    def rows(self) -> list[BufferRow]:
        tensors = self.graph.tensors
        rows = []
        for buf, tensor, off in zip(self.plan.buffers, self.lifetimes.tensor_of, self.plan.offsets):
            name = tensors[tensor].name if tensor is not None else "<scratch>"
            rows.append(BufferRow(buf.id, tensor, name, buf.size, buf.first, buf.last, off))
        return rows


def plan_model(
    model: Model,
    planner: str = "greedy",
    alignment: int = 16,
    graph_index: int = 0,
    order: Sequence[int] | None = None,
    scratch: Sequence[ScratchRequest] = (),
    external_io: bool = False,
    **options,
) -> ModelPlan:
    """Plan one graph of `model` with a named planner; the result is verified.

    With `external_io` the graph's inputs and outputs live in the caller's buffers, not the arena.
    """
    graph = model.graphs[graph_index]
    outside = set(graph.inputs) | set(graph.outputs) if external_io else set()
    lifetimes = compute_lifetimes(graph, order, scratch, model.source, outside)
    plan = make_plan(lifetimes.buffers, planner, alignment, **options)
    return ModelPlan(
        model=model,
        graph_index=graph_index,
        lifetimes=lifetimes,
        plan=plan,
        lower_bound_bytes=lower_bound(lifetimes.buffers, alignment),
        naive_bytes=naive_sum(lifetimes.buffers, alignment),
    )
