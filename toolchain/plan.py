"""A model's arena plan: lifetimes of one graph (with the subgraphs it calls), planned offsets,
the state block beside the arena, and the figures beside them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from toolchain.errors import ArenacError
from toolchain.ir import Model
from toolchain.lifetimes import (
    Lifetimes,
    ScratchRequest,
    TensorRoles,
    check_order,
    compute_lifetimes,
    overlap_pairs,
)
from toolchain.planners import (
    Deadline,
    Placement,
    align_up,
    lower_bound,
    lower_bound_with_overlaps,
    naive_sum,
    smallest_plan,
    verify,
)
from toolchain.planners.csvio import load_offsets
from toolchain.program import Program, lower
from toolchain.quant import variable_fill
from toolchain.schedule import schedule
from toolchain.targets import GENERIC

STATE_ALIGNMENT = 16
# The most of the time limit the schedule search may take; the planners have the rest.
SCHEDULE_SHARE = 0.5


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
class StateSlot:
    """One piece of the state block, the memory that persists across invocations (outside the
    arena, never reused): a variable tensor, a resource variable, the memory a kernel keeps
    (StateRequest), or the flag byte recording that CALL_ONCE ran a subgraph. `init` is what
    the block starts as and what a reset restores (`nbytes` bytes)."""

    kind: str  # "variable", "resource", "call_once" or "kernel"
    name: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    init: bytes
    tensor: int | None = None  # a variable tensor's index
    resource: int | None = None  # a resource variable's position in Program.resources
    subgraph: int | None = None  # the subgraph whose run a call_once flag records
    op: int | None = None  # the op whose kernel keeps a kernel slot

    @property
    def fill(self) -> int | None:
        """The byte every byte of `init` is, or None when they differ."""
        return self.init[0] if self.init and self.init == self.init[:1] * self.nbytes else None


@dataclass(frozen=True)
class ModelPlan:
    """A planned Program: everything runtime_py and codegen need to run a graph in its arena."""

    program: Program
    lifetimes: Lifetimes
    plan: Placement
    lower_bound_bytes: int  # the classic bound: no two live tensors share a byte
    naive_bytes: int
    overlap_bound_bytes: int  # the bound when the declared overlaps may be used

    @property
    def arena_bytes(self) -> int:
        return self.plan.arena_bytes

    @property
    def model(self) -> Model:
        return self.program.model

    @property
    def graph_index(self) -> int:
        return self.program.graph_index

    @property
    def graph(self):
        return self.program.graph

    def offset_of_tensor(self) -> dict[int, int]:
        """Tensor index -> arena offset, for every planned tensor."""
        return {
            t: off for t, off in zip(self.lifetimes.tensor_of, self.plan.offsets) if t is not None
        }

    def scratch_offsets(self) -> list[tuple[ScratchRequest, int]]:
        """Every kernel's scratch with its arena offset, in the order the kernels asked."""
        offsets = [off for t, off in zip(self.lifetimes.tensor_of, self.plan.offsets) if t is None]
        return list(zip(self.lifetimes.scratch, offsets))

    @property
    def state_slots(self) -> tuple[StateSlot, ...]:
        """The state block's layout: variable tensors, resource variables and the state of
        kernels, each aligned to STATE_ALIGNMENT, then one flag byte per subgraph that CALL_ONCE
        runs."""
        return self._state[0]

    @property
    def state_bytes(self) -> int:
        return self._state[1]

    @cached_property
    def _state(self) -> tuple[tuple[StateSlot, ...], int]:
        program, tensors = self.program, self.graph.tensors
        slots, offset = [], 0
        for t in self.lifetimes.variables:
            tensor = tensors[t]
            slots.append(StateSlot("variable", tensor.name, offset, tensor.nbytes, tensor.dtype,
                                   tensor.shape, initial_bytes(tensor), tensor=t))
            offset += align_up(tensor.nbytes, STATE_ALIGNMENT)
        for i, v in enumerate(program.resources):
            slots.append(StateSlot("resource", v.name, offset, v.nbytes, v.dtype, v.shape,
                                   bytes(v.nbytes), resource=i))
            offset += align_up(v.nbytes, STATE_ALIGNMENT)
        for b in program.bindings:
            for request in b.state if b is not None else ():
                nbytes = math.prod(request.shape) * np.dtype(request.dtype).itemsize
                slots.append(StateSlot("kernel", f"{program.op_label(b.op)} {b.opcode}: "
                                       f"{request.purpose}", offset, nbytes, request.dtype,
                                       request.shape, bytes(nbytes), op=b.op))
                offset += align_up(nbytes, STATE_ALIGNMENT)
        for g in dict.fromkeys(program.calls.values()):
            slots.append(StateSlot("call_once", f"subgraph {program.subgraph_label(g)} ran",
                                   offset, 1, "uint8", (), bytes(1), subgraph=g))
            offset += 1
        return tuple(slots), offset

    def state_layout(self) -> tuple[dict[int, int], int]:
        """Variable tensors persist in the state block: tensor -> offset there, and the block's
        size (resource variables and CALL_ONCE flags included)."""
        offsets = {s.tensor: s.offset for s in self.state_slots if s.kind == "variable"}
        return offsets, self.state_bytes

    def state_of_handle(self, tensor: int) -> StateSlot | None:
        """The slot of the resource variable a handle tensor names (None if it names one that
        nothing assigns)."""
        index = self.program.handles.get(tensor)
        return next((s for s in self.state_slots if s.resource == index), None) \
            if index is not None else None

    def call_once_slot(self, subgraph: int) -> StateSlot:
        return next(s for s in self.state_slots if s.subgraph == subgraph)

    @cached_property
    def call_spans(self) -> dict[int, int]:
        """Step of each CALL_ONCE that runs a subgraph -> the step after that subgraph's last."""
        return self.program.call_spans(self.lifetimes.order)

    def step_label(self, step: int) -> str:
        """"op 3 ADD", "subgraph 1 op 0 VAR_HANDLE": the op that runs at a step."""
        op = self.lifetimes.order[step]
        return f"{self.program.op_label(op)} {self.graph.operators[op].kind}"

    def rows(self) -> list[BufferRow]:
        tensors = self.graph.tensors
        rows = []
        for buf, tensor, off in zip(self.plan.buffers, self.lifetimes.tensor_of, self.plan.offsets):
            name = tensors[tensor].name if tensor is not None else "<scratch>"
            rows.append(BufferRow(buf.id, tensor, name, buf.size, buf.first, buf.last, off))
        return rows


@dataclass(frozen=True)
class Techniques:
    """What a plan may use beyond the patent's method; each can be switched off on its own."""

    inplace: bool = True  # outputs over dying inputs: aliases and elementwise ops
    overlap: bool = True  # convolution and pooling outputs over the rows they have consumed
    schedule: str = "auto"  # "auto": memory-aware operator order; "model": the file's order


NO_TECHNIQUES = Techniques(inplace=False, overlap=False, schedule="model")

BEST = "best"


def best_candidates(time_limit: float) -> tuple[tuple[str, dict], ...]:
    """What `best` tries: every planner and its options; the smallest verified plan wins."""
    return (
        ("optimal", {"time_limit": time_limit}),
        ("greedy", {}),
        ("freelist", {"fit": "first"}),
        ("freelist", {"fit": "best"}),
    )


def plan_model(
    model: Model,
    planner: str = BEST,
    alignment: int = 16,
    graph_index: int = 0,
    order: Sequence[int] | None = None,
    scratch: Sequence[ScratchRequest] = (),
    external_io: bool = False,
    techniques: Techniques = Techniques(),
    offsets_csv: str | None = None,
    time_limit: float = 2.0,
    target: str = GENERIC,
    portable: bool = False,
    **options,
) -> ModelPlan:
    """Plan one graph of `model`; the result is verified.

    `planner="best"` tries every planner and keeps the smallest arena. `time_limit` (seconds)
    bounds the whole search, the schedule's and every planner's: each returns the best it
    found by then, and a planner with nothing by then gives way to the first-fit free list, so
    only reading, lifetimes and checks (all near-linear) come on top. With `external_io` the
    graph's inputs and outputs live in the caller's buffers, not the arena. `order` overrides
    the schedule the techniques would choose. `offsets_csv` takes the offsets from an external
    solver's solution (MiniMalloc CSV) instead of a planner; they are verified like any plan.
    The graph is lowered to a Program first, so the scratch its kernels request is planned
    with the tensors; `scratch` adds requests beyond those (TFLite Micro's own kernels', when
    a plan is made for it). The subgraphs the graph calls (CALL_ONCE) are planned with it,
    their steps right after their call: `order` then runs over the program's ops
    (toolchain.program), and must keep each called subgraph's steps together after its call.
    `target` (toolchain.targets) picks the kernels, whose scratch and overlaps the plan
    follows; `portable` keeps to its portable kernels.
    """
    deadline = Deadline.after(time_limit)
    program = lower(model, graph_index, target, portable)
    needed = max((b.variant.scratch_alignment for b in program.bindings
                  if b is not None and b.variant is not None), default=1)
    if alignment < needed:
        raise ArenacError(f"the {target} kernels read their scratch in {needed}-byte words: "
                          f"plan with an alignment of at least {needed} (not {alignment})",
                          model.source)
    graph = program.graph
    scratch = (*program.scratch(), *scratch)
    roles = TensorRoles.of(graph, model.source)  # derived once, for every step below
    if order is None:
        check_order(graph, program.file_order(), model.source, roles)  # TFLite runs this order
        order = schedule_program(program, techniques.schedule, alignment,
                                 deadline.share(SCHEDULE_SHARE), scratch, roles)
    program.call_spans(order)  # a called subgraph's steps must follow its call
    outside = set(graph.inputs) | set(graph.outputs) if external_io else set()
    lifetimes = compute_lifetimes(graph, order, scratch, model.source, outside, roles)
    overlaps = overlap_pairs(
        graph, lifetimes, program.bindings, techniques.inplace, techniques.overlap
    )
    if offsets_csv is not None:
        plan = loaded_plan(offsets_csv, lifetimes.buffers, overlaps, alignment)
    else:
        if planner == "optimal":
            options.setdefault("time_limit", time_limit)
        candidates = best_candidates(time_limit) if planner == BEST else ((planner, options),)
        plan = smallest_plan(lifetimes.buffers, candidates, alignment, overlaps, deadline)
    return ModelPlan(
        program=program,
        lifetimes=lifetimes,
        plan=plan,
        lower_bound_bytes=lower_bound(lifetimes.buffers, alignment),
        naive_bytes=naive_sum(lifetimes.buffers, alignment),
        overlap_bound_bytes=lower_bound_with_overlaps(lifetimes.buffers, overlaps, alignment),
    )


def schedule_program(program: Program, mode: str, alignment: int, deadline: Deadline,
                     scratch: Sequence[ScratchRequest], roles: TensorRoles) -> tuple[int, ...]:
    """The execution order: each subgraph scheduled on its own (toolchain.schedule), the steps
    of a called subgraph right after the CALL_ONCE that runs them."""
    if not program.calls:
        return schedule(program.graph, mode, alignment, deadline, scratch, roles)
    orders = {}
    for g in program.subgraphs:
        ops = program.ops_of(g)
        local = [ScratchRequest(r.op - ops.start, r.size, r.purpose)
                 for r in scratch if r.op in ops]
        orders[g] = schedule(program.model.graphs[g], mode, alignment, deadline, local)
    return program.flatten(orders)


def initial_bytes(tensor) -> bytes:
    """What a variable tensor starts as: its data when the file gives some, else its fill (the
    zero point of int8, as TFLite and TFLite Micro reset it; zeros otherwise)."""
    if tensor.data is not None:
        return tensor.data.tobytes()
    return np.full(tensor.num_elements, variable_fill(tensor), np.dtype(tensor.dtype)).tobytes()


def loaded_plan(path: str, buffers, overlaps, alignment: int) -> Placement:
    """A plan from an external solver's offsets, accepted only once `verify` passes."""
    by_id = load_offsets(path, buffers)
    plan = Placement.from_offsets("external", alignment, buffers, [by_id[b.id] for b in buffers],
                             overlaps)
    verify(plan)
    return plan
