"""A model's arena plan: lifetimes of one graph (with the subgraphs it calls), planned offsets,
the state block beside the arena, and the figures beside them."""

from __future__ import annotations

import inspect
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial

import numpy as np

from toolchain.errors import ArenacError, PlanError
from toolchain.front.validate import DEFAULT_MAX_BYTES
from toolchain.ir import Model
from toolchain.lower.lifetimes import (
    SCRATCH,
    SHARED,
    STRIPE,
    TENSOR,
    BufferKey,
    Lifetimes,
    ScratchRequest,
    TensorRoles,
    check_order,
    compute_lifetimes,
    overlap_pairs,
    shared_scratch,
)
from toolchain.lower.program import Program, lower
from toolchain.lower.schedule import schedule
from toolchain.lower.steps import Step, execution_steps
from toolchain.lower.tiling import (
    NO_TILING,
    ON_DEMAND,
    ROW_BY_ROW,
    WAVEFRONT,
    Chain,
    Schedule,
    Score,
    Segment,
    Tiling,
    TilingMemo,
    choose_tiling,
    column_tiled,
    fits_scratch,
    kernel_name,
    model_macs,
    neighbours,
    stripe_chain,
    trials,
)
from toolchain.lower.tiling import candidates as stripe_candidates
from toolchain.numerics.quant import variable_fill
from toolchain.ops import target_kernel
from toolchain.ops.striping import DEFAULT_MAX_RECOMPUTE
from toolchain.planners import (
    NEVER,
    PLANNERS,
    Deadline,
    Overlap,
    Placement,
    Pool,
    PoolArena,
    PoolsDoNotFit,
    align_up,
    lower_bound,
    lower_bound_with_overlaps,
    naive_sum,
    plan_pools,
    smallest_plan,
    verify,
)
from toolchain.planners.base import Buffer, running_loads, step_deltas
from toolchain.planners.csvio import load_offsets
from toolchain.planners.optimal import DEFAULT_NODES
from toolchain.planners.tflm import TFLMPlanner
from toolchain.progress import step
from toolchain.targets import GENERIC, get_target

# The least alignment of each piece of the state block and of the weights' copy in RAM, and of
# the blocks themselves: a plan made with a larger --align aligns them to that instead.
STATE_ALIGNMENT = 16


def block_alignment(alignment: int) -> int:
    """The alignment of the state block, the weights' copy and each piece of them, for a plan
    whose buffers are aligned to `alignment`."""
    return max(alignment, STATE_ALIGNMENT)
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
    # With memory pools: what the plan takes of each (the plan's offsets run through them
    # one after the other, toolchain.planners.pools), each buffer's pool, and the state
    # block's pool (None: its own array, as without pools). No pools: one arena.
    pools: tuple[PoolArena, ...] = ()
    pool_of: tuple[int, ...] = ()
    state_pool: int | None = None
    weights_pool: int | None = None  # where the weights are copied at the first invoke
    # The segments run stripe by stripe (toolchain.lower.tiling); the bounds above are then those of
    # the striped buffers, and `untiled_bound_bytes` the overlap bound without tiling.
    tiling: Tiling = NO_TILING
    untiled_bound_bytes: int | None = None
    # The caller's --time-limit ran out before the search ended: this plan may differ on
    # another machine or under another load (without one, the plan depends on work alone).
    clock_cut: bool = False
    # A target's plan held to the same model's arena on the portable kernels (that arena's
    # bytes) through narrow kernels (`narrowed`); None when no hold applied.
    portable_arena: int | None = None

    def reserved_in(self, k: int) -> str:
        """What pool k holds besides buffers, in words ("" for nothing)."""
        held = [what for what, pool, nbytes in (
            ("the state block", self.state_pool, self.state_bytes),
            ("the weights", self.weights_pool, self.weights_layout[1])) if pool == k and nbytes]
        return " and ".join(held)

    @cached_property
    def weights_layout(self) -> tuple[dict[int, int], int]:
        """With the weights in a RAM pool: constant tensor -> offset in their copy there, and
        the copy's size."""
        return weight_layout(self.graph, self.plan.alignment)

    @property
    def arena_bytes(self) -> int:
        return self.plan.arena_bytes

    @property
    def streamed_inputs(self) -> frozenset[int]:
        """Graph inputs never held whole: their segments fetch their rows (--stream-input)."""
        return frozenset(s.input for s in self.tiling.segments if s.streamed)

    @property
    def streamed_outputs(self) -> frozenset[int]:
        """Graph outputs never held whole: their segments hand their rows on (--stream-output)."""
        return frozenset(s.output for s in self.tiling.segments if s.streamed_output)

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
        offsets = self.plan.offsets
        return {t: offsets[i] for t, i in self.lifetimes.tensor_buffers.items()}

    def address(self, key: BufferKey) -> tuple[int | None, int]:
        """Where the buffer that holds `key` lives: its pool (None without pools) and its
        offset there."""
        position, within = self.lifetimes.holder(key)
        pool, offset = self.place(position)
        return pool, offset + within

    def place(self, position: int) -> tuple[int | None, int]:
        """Where the plan's buffer at `position` lives: its pool (None without pools) and its
        offset there."""
        offset = self.plan.offsets[position]
        if not self.pools:
            return None, offset
        k = self.pool_of[position]
        return k, offset - self.pools[k].base

    def scratch_offsets(self) -> list[tuple[ScratchRequest, int]]:
        """Every scratch request with its arena offset, in the order they were asked for."""
        places = [self.lifetimes.holder(r.key) for r in self.lifetimes.scratch]
        return [(r, self.plan.offsets[position] + within)
                for r, (position, within) in zip(self.lifetimes.scratch, places, strict=True)]

    @property
    def state_slots(self) -> tuple[StateSlot, ...]:
        """The state block's layout: variable tensors, resource variables and the state of
        kernels, each aligned to block_alignment, then one flag byte per subgraph that CALL_ONCE
        runs."""
        return self._state[0]

    @property
    def state_bytes(self) -> int:
        return self._state[1]

    @cached_property
    def _state(self) -> tuple[tuple[StateSlot, ...], int]:
        return state_layout(self.program, self.lifetimes, self.plan.alignment)

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
    def steps(self) -> tuple[Step, ...]:
        """What runs, in what order and in which block (toolchain.lower.steps): every backend
        visits these."""
        return execution_steps(self.program, self.lifetimes.order, self.tiling,
                               lambda subgraph: self.call_once_slot(subgraph).offset)

    def step_label(self, step: int) -> str:
        """"op 3 ADD", "subgraph 1 op 0 VAR_HANDLE": the op that runs at a step."""
        return step_label(self.program, self.lifetimes.order, step)

    def arena_tops(self) -> list[int]:
        """Per step of the order, the arena's top then: the highest byte a live buffer reaches.

        Buffers are taken highest top first and each fills only the steps of its life no
        higher one filled, found by skipping filled runs (`unfilled`, with its paths halved):
        near-linear, where visiting every step of every life is quadratic in a wide graph
        (100,000 buffers alive together).
        """
        steps = len(self.lifetimes.order)
        tops = [0] * steps
        unfilled = list(range(steps + 1))  # step -> the first unfilled step at or after it

        def first_unfilled(at: int) -> int:
            while unfilled[at] != at:
                unfilled[at] = unfilled[unfilled[at]]
                at = unfilled[at]
            return at

        lives = sorted(((offset + b.size, b.first, b.last)
                        for b, offset in zip(self.plan.buffers, self.plan.offsets, strict=True)),
                       reverse=True)
        for top, first, last in lives:
            at = first_unfilled(first)
            while at <= last:
                tops[at] = top
                unfilled[at] = at + 1
                at = first_unfilled(at + 1)
        return tops

    def rows(self) -> list[BufferRow]:
        tensors = self.graph.tensors
        purposes = {r.key: r.purpose for r in (*self.lifetimes.scratch, *self.lifetimes.shared)}
        rows = []
        for buf, key, off in zip(self.plan.buffers, self.lifetimes.keys, self.plan.offsets,
                                 strict=True):
            tensor = key.index if key.kind == TENSOR else None
            if key.kind == TENSOR:
                name = tensors[key.index].name
            else:
                name = f"<{purposes[key]}>" if key.kind == STRIPE else "<scratch>"
            rows.append(BufferRow(buf.id, tensor, name, buf.size, buf.first, buf.last, off))
        return rows


def step_label(program: Program, order: Sequence[int], step: int) -> str:
    op = order[step]
    return f"{program.op_label(op)} {program.graph.operators[op].kind}"


def weight_layout(graph, alignment: int) -> tuple[dict[int, int], int]:
    """The constant tensors operators read, one after the other (each aligned to
    block_alignment), as a copy of them in RAM lays them out; and the copy's size."""
    align = block_alignment(alignment)
    offsets, end = {}, 0
    for op in graph.operators:
        for t in op.inputs:
            tensor = graph.tensors[t] if t >= 0 else None
            if tensor is not None and tensor.is_constant \
                    and t not in offsets:
                offsets[t] = end
                end += align_up(tensor.nbytes, align)
    return offsets, end


def state_layout(program: Program, lifetimes: Lifetimes, alignment: int
                 ) -> tuple[tuple[StateSlot, ...], int]:
    """The state block's slots and size (ModelPlan.state_slots), for a plan aligned to
    `alignment`."""
    align = block_alignment(alignment)
    tensors = program.graph.tensors
    slots, offset = [], 0
    for t in lifetimes.variables:
        tensor = tensors[t]
        slots.append(StateSlot("variable", tensor.name, offset, tensor.nbytes, tensor.dtype,
                               tensor.shape, initial_bytes(tensor), tensor=t))
        offset += align_up(tensor.nbytes, align)
    for i, v in enumerate(program.resources):
        slots.append(StateSlot("resource", v.name, offset, v.nbytes, v.dtype, v.shape,
                               bytes(v.nbytes), resource=i))
        offset += align_up(v.nbytes, align)
    for b in program.bindings:
        for request in b.state if b is not None else ():
            nbytes = math.prod(request.shape) * np.dtype(request.dtype).itemsize
            slots.append(StateSlot("kernel", f"{program.op_label(b.op)} {b.opcode}: "
                                   f"{request.purpose}", offset, nbytes, request.dtype,
                                   request.shape, bytes(nbytes), op=b.op))
            offset += align_up(nbytes, align)
    for g in dict.fromkeys(program.calls.values()):
        slots.append(StateSlot("call_once", f"subgraph {program.subgraph_label(g)} ran",
                               offset, 1, "uint8", (), bytes(1), subgraph=g))
        offset += 1
    return tuple(slots), offset

@dataclass(frozen=True)
class Techniques:
    """What a plan may use beyond the patent's method; each can be switched off on its own."""

    inplace: bool = True  # outputs over dying inputs: aliases and elementwise ops
    overlap: bool = True  # convolution and pooling outputs over the rows they have consumed
    schedule: str = "auto"  # "auto": memory-aware operator order; "model": the file's order
    fuse_padding: bool = True  # a PAD's padding applied by the windowed op reading it
    tiling: str = "auto"  # "auto": striped segments where they lower the arena; "off": none
    # The most MACs a plan may compute twice (column tiles), in percent of the model's.
    max_recompute: float = DEFAULT_MAX_RECOMPUTE
    # Stripes that save bytes at a cost in cycles: a segment more, away from the others, where
    # the shifts of a run of outputs stack (nearby_tiling), and rows made row by row
    # (toolchain.lower.tiling.ROW_BY_ROW). Off under --max-arena, which trades arena for speed.
    extra_stripes: bool = True


NO_TECHNIQUES = Techniques(inplace=False, overlap=False, schedule="model", fuse_padding=False,
                           tiling="off")

BEST = "best"
# Every planner a user may name, `best` first: the one default is `best`, everywhere.
PLANNER_NAMES = (BEST, *sorted(PLANNERS))


def best_candidates(nodes: int = DEFAULT_NODES) -> tuple[tuple[str, dict], ...]:
    """What `best` tries: every planner and its options (the exact planner within `nodes`
    search nodes); the smallest verified plan wins."""
    return (
        ("optimal", {"nodes": nodes}),
        ("greedy", {}),
        ("freelist", {"fit": "first"}),
        ("freelist", {"fit": "best"}),
    )


def plan_model(model: Model, *args, max_bytes: int = DEFAULT_MAX_BYTES,
               max_arena: int | None = None, **kwargs) -> ModelPlan:
    """Plan one graph of `model` (`planned_model` says how), refused with one PlanError when
    its arena and state block together exceed `max_bytes`: checked on the plan itself, before
    any backend allocates the arena or writes it as C. With `max_arena`, the arena must fit
    in that many bytes: target kernels give up their scratch for it (`within_arena`)."""
    if max_arena is not None and kwargs.get("pools"):
        raise ArenacError("--max-arena limits the one arena; with --pool each pool has its own "
                          "size", model.source)
    kwargs = {**inspect.signature(planned_model).bind(model, *args, **kwargs).arguments}
    del kwargs["model"]
    kwargs.update(kwargs.pop("options", {}))
    kwargs.setdefault("memo", TilingMemo())  # the replans below share the segments built
    if max_arena is not None:
        model_plan = limited_plan(model, kwargs, max_arena)
        check_budget(model_plan, max_bytes)
        return model_plan
    model_plan = planned_model(model, **kwargs)

    def replan(given_up: dict[int, tuple[str, ...]]) -> ModelPlan:
        return planned_model(model, **{**kwargs, "given_up": given_up})

    if not (kwargs.get("given_up") or kwargs.get("offsets_csv") or kwargs.get("pools")
            or kwargs.get("time_limit") is not None):
        # a target's plan held to the portable kernels' arena as far as narrow kernels hold it
        # (it plans the model again, so not within a --time-limit, which bounds one planning)
        model_plan = narrowed(model_plan, lambda: planned_model(
            model, **{**kwargs, "target": GENERIC, "memo": None}).arena_bytes, replan)
    check_budget(model_plan, max_bytes)
    return model_plan


def narrow_ops(model_plan: ModelPlan, anywhere: bool = False) -> dict[int, str]:
    """The ops whose target kernel has a narrow form (TargetKernel.narrows) that takes the op:
    op -> the name of the kernel it runs now (`anywhere`: only those whose narrow form may be
    tried away from the arena's peak)."""
    program = model_plan.program
    found = {}
    for binding in program.bindings:
        if binding is None or binding.variant is None:
            continue
        skipped = frozenset((*program.given_up.get(binding.op, ()), binding.variant.name))
        after = target_kernel(program.graph, program.graph.operators[binding.op],
                              binding.params, program.target, skipped)
        if after is not None and binding.variant.name in after.variant.narrows \
                and not (anywhere and after.variant.narrows_at_peak):
            found[binding.op] = binding.variant.name
    return found


def narrowed(model_plan: ModelPlan, portable_arena: Callable[[], int],
             replan: Callable[[dict[int, tuple[str, ...]]], ModelPlan]) -> ModelPlan:
    """A target's plan held to the arena of the same model on portable kernels, the kernels'
    scratch at the arena's peak given up for their narrow forms (less scratch or none) one op
    at a time (with the ops whose scratch is as large in the same shared buffer,
    sharing_alike), never for the portable kernel (that is --max-arena's choice): the first plan of
    the smallest arena, so that a narrow form which does not lower the arena is not kept. With
    no scratch left at the peak, the largest elsewhere, which can keep a segment from its best
    striping, up to OFF_PEAK_TRIES times. After STALE_REPLANS replans in a row that do not
    lower the arena (equal peaks in many segments, each of which must narrow before the arena
    drops), the next replan gives up every narrow form's scratch at the peak at once, and the
    hold ends when that one does not lower it either: a model of many alike layers would
    otherwise be planned again once for each. The portable arena is planned only when some
    narrow form could lower the peak; else the plan is returned as it is, without
    `portable_arena`."""
    best = model_plan
    given_up: dict[int, tuple[str, ...]] = {}
    bound = None
    off_peak = stale = 0
    while (bound is None or model_plan.arena_bytes > bound) and stale <= STALE_REPLANS:
        narrow = narrow_ops(model_plan)
        op = scratch_to_give_up(model_plan, among=set(narrow), peak_only=True)
        if op is None and bound is not None and off_peak < OFF_PEAK_TRIES:
            op = scratch_to_give_up(model_plan, among=set(narrow_ops(model_plan, anywhere=True)))
            off_peak += 1
        if op is None:
            break
        if bound is None:
            bound = portable_arena()
            if model_plan.arena_bytes <= bound:
                break
        ops = sorted(scratch_at_peak(model_plan, among=set(narrow))) \
            if stale == STALE_REPLANS else []
        given_up = {**given_up, **{o: (*given_up.get(o, ()), narrow[o]) for first in (ops or [op])
                                   for o in sharing_alike(model_plan, first, set(narrow))}}
        model_plan = replan(given_up)
        stale = 0 if model_plan.arena_bytes < best.arena_bytes else stale + 1
        best = min(best, model_plan, key=lambda p: p.arena_bytes)
    return best if bound is None else replace(best, portable_arena=bound)


OFF_PEAK_TRIES = 2  # narrow forms the hold tries for scratch away from the arena's peak
# Replans in a row that may leave the arena where it was before the hold gives up all the
# scratch at the peak at once: more than any shared model or example takes (four) before a
# replan lowers it, so their plans are those of one op at a time.
STALE_REPLANS = 5


def limited_plan(model: Model, kwargs: dict, max_arena: int) -> ModelPlan:
    """The plan within `max_arena` bytes (`within_arena`), the fastest that fits: on a target
    whose kernels run whole ops fastest (Target.whole_ops_fastest), whole ops, every kernel
    keeping its scratch, where they fit; else without the extra stripes
    (Techniques.extra_stripes), which cost cycles, unless no choice of kernels fits without
    them. A streamed plan, or one of loaded offsets, is striped as asked."""
    techniques = kwargs.get("techniques", Techniques())
    whole_first = get_target(kwargs.get("target", GENERIC)).whole_ops_fastest
    if whole_first and techniques.tiling != "off" and not (
            kwargs.get("stream_input") or kwargs.get("stream_output") or kwargs.get("offsets_csv")):
        whole = planned_model(model, **{**kwargs, "techniques": replace(techniques, tiling="off")})
        if whole.arena_bytes <= max_arena:
            return whole

    def fitted(tried: Techniques) -> ModelPlan:
        args = {**kwargs, "techniques": tried}
        return within_arena(planned_model(model, **args), max_arena,
                            lambda given_up: planned_model(model, **{**args, "given_up": given_up}))

    try:
        return fitted(replace(techniques, extra_stripes=False))
    except PlanError:
        if not techniques.extra_stripes:
            raise
    return fitted(techniques)


def within_arena(model_plan: ModelPlan, max_arena: int,
                 replan: Callable[[dict[int, tuple[str, ...]]], ModelPlan]) -> ModelPlan:
    """The plan within `max_arena` bytes of arena, giving up target kernels one at a time
    (`scratch_to_give_up`, with the ops whose scratch is as large in the same shared buffer,
    sharing_alike) for the next one that takes the op (dsp-rows for dsp-im2col) or the
    portable one (whose scratch is smaller, or none), the model planned again after each;
    after STALE_REPLANS replans in a row that do not lower the arena, every op with a target
    kernel's scratch at the peak gives it up at once, as in the hold. Refused when no target
    kernel with scratch is left."""
    given_up: dict[int, tuple[str, ...]] = {}
    lowest, stale = model_plan.arena_bytes, 0
    while model_plan.arena_bytes > max_arena:
        op = scratch_to_give_up(model_plan)
        if op is None:
            ops = ", ".join(f"op {o} {'/'.join(names)}" for o, names in sorted(given_up.items()))
            tried = f" without the kernels {ops}" if given_up else ""
            raise PlanError(f"the plan needs a {model_plan.arena_bytes}-byte arena{tried}, "
                            f"over the limit of {max_arena} (--max-arena)", model_plan.model.source)
        bindings = model_plan.program.bindings
        targeted = {b.op for b in bindings if b.variant is not None}
        ops = sorted(scratch_at_peak(model_plan)) if stale >= STALE_REPLANS else []
        given_up = {**given_up, **{o: (*given_up.get(o, ()), bindings[o].variant.name)
                                   for first in (ops or [op])
                                   for o in sharing_alike(model_plan, first, targeted)}}
        model_plan = replan(given_up)
        stale = 0 if model_plan.arena_bytes < lowest else stale + 1
        lowest = min(lowest, model_plan.arena_bytes)
    return model_plan


def scratch_to_give_up(model_plan: ModelPlan, among: set[int] | None = None,
                       peak_only: bool = False) -> int | None:
    """The op running a target kernel with scratch whose scratch is the largest of those live
    at a step where the arena's top is the highest; if none is, the largest anywhere (a
    segment that the target kernels' scratch keeps from being striped, the drift of a run of
    steps, can set the arena where no scratch is live), unless `peak_only`. Only the ops
    `among`, when given. None when no target kernel has any."""
    scratch = target_scratch(model_plan, among)
    if peak_only:
        scratch = {op: value for op, value in scratch.items() if value[0]}
    return max(scratch, key=lambda op: (*scratch[op], -op), default=None)


def scratch_at_peak(model_plan: ModelPlan, among: set[int] | None = None) -> set[int]:
    """The ops running a target kernel whose scratch is live at a step where the arena's top
    is the highest (only those `among`, when given)."""
    return {op for op, (at_peak, _) in target_scratch(model_plan, among).items() if at_peak}


def target_scratch(model_plan: ModelPlan, among: set[int] | None = None
                   ) -> dict[int, tuple[bool, int]]:
    """Op -> (whether its scratch is live at a step where the arena's top is the highest, its
    scratch's bytes), for the ops running a target kernel with scratch (those `among`)."""
    lifetimes, bindings = model_plan.lifetimes, model_plan.program.bindings
    held: dict[int, tuple[list[Buffer], int]] = {}  # op -> its scratch's buffers and bytes
    for request in lifetimes.scratch:  # a shared buffer's life is each of its requests'
        binding = bindings[request.op] if request.key.kind == SCRATCH else None
        if among is not None and request.op not in among:
            continue
        if binding is not None and binding.variant is not None:
            buffers, size = held.get(request.op, ([], 0))
            buffers.append(model_plan.plan.buffers[lifetimes.holder(request.key)[0]])
            held[request.op] = (buffers, size + request.size)
    if not held:
        return {}
    tops = model_plan.arena_tops()
    peak = max(tops, default=0)
    at_peak = {at for at, top in enumerate(tops) if top == peak}
    return {op: (any(b.first <= at <= b.last for b in buffers for at in at_peak), size)
            for op, (buffers, size) in held.items()}


def sharing_alike(model_plan: ModelPlan, op: int, among: set[int]) -> list[int]:
    """`op`, and the ops `among` whose scratch lies in the same shared buffer as op's (the
    ops of one segment take turns in it) and is as large: the buffer keeps its size until
    all of them give their scratch up, so the hold gives them up in one replan."""
    lifetimes = model_plan.lifetimes
    asked: dict[int, list[tuple[int, int]]] = {}  # op -> (holding buffer, bytes) per request
    for request in lifetimes.scratch:
        if request.key.kind == SCRATCH:
            asked.setdefault(request.op, []).append((lifetimes.holder(request.key)[0],
                                                     request.size))
    mine = asked.get(op, [])
    shared = {buffer for buffer, _ in mine
              if lifetimes.keys[buffer].kind == SHARED}
    largest = max((size for _, size in mine), default=0)
    return [op, *(o for o in sorted(among - {op})
                  if any(b in shared and size == largest for b, size in asked.get(o, [])))]


def check_budget(model_plan: ModelPlan, max_bytes: int) -> None:
    """The memory a run takes at once: the arena (every nested subgraph's tensors and all
    scratch) and the state block (variables, resource variables, kernel state)."""
    arena, state = model_plan.arena_bytes, model_plan.state_bytes
    if arena + state > max_bytes:
        raise PlanError(f"the plan needs a {arena}-byte arena and a {state}-byte state block, "
                        f"{arena + state} bytes together, over the limit of {max_bytes} "
                        "(--max-bytes)", model_plan.model.source)


def planned_model(
    model: Model,
    planner: str = BEST,
    alignment: int = 16,
    graph_index: int = 0,
    order: Sequence[int] | None = None,
    scratch: Sequence[ScratchRequest] = (),
    external_io: bool = False,
    techniques: Techniques = Techniques(),
    offsets_csv: str | None = None,
    time_limit: float | None = None,
    nodes: int = DEFAULT_NODES,
    target: str = GENERIC,
    portable: bool = False,
    pools: Sequence[Pool] = (),
    pins: Mapping[str, str] | None = None,
    given_up: Mapping[int, tuple[str, ...]] | None = None,
    stream_input: bool = False,
    stream_output: bool = False,
    memo: TilingMemo | None = None,
    **options,
) -> ModelPlan:
    """Plan one graph of `model`; the result is verified.

    `planner="best"` tries every planner and keeps the smallest arena. The searches are bounded
    by work, so the plan is the same on any machine: the exact planner by `nodes` search nodes
    (each of the striped and the whole-op problems), the scheduler by its own count of states.
    `time_limit` (seconds), when given, also bounds the whole search by the clock: each part
    returns the best it found by then, a planner with nothing by then gives way to the
    first-fit free list, and the plan records whether the clock ran out (`clock_cut`). With
    `external_io` the graph's inputs and outputs live in the caller's buffers, not the arena.
    `order` overrides the schedule the techniques would choose. `offsets_csv` takes the offsets
    from an external solver's solution (MiniMalloc CSV) instead of a planner; they are verified
    like any plan. The graph is lowered to a Program first, so the scratch its kernels request
    is planned with the tensors (with `planner="tflm"`, the scratch TFLite Micro's kernels
    request, ours riding in it: Program.tflm_scratch); `scratch` adds requests beyond those.
    The subgraphs the graph calls (CALL_ONCE) are planned with it, their steps right after
    their call: `order` then runs over the program's ops (toolchain.lower.program), and must
    keep each called subgraph's steps together after its call. `target` (toolchain.targets)
    picks the kernels, whose scratch and overlaps the plan follows; `portable` keeps to its
    portable kernels (`given_up`: an op to none of the target kernels it names). `pools`
    (fastest first) take the buffers instead of one arena (toolchain.planners.pools); `pins`
    force a tensor (by index or name) or the state block ("state") into the pool named. With
    `stream_input` the graph's inputs never exist whole: each is fetched row by row into the
    stripe buffer of a segment that reads it (toolchain.lower.tiling), refused when no segment
    can; with `stream_output` the outputs neither: each is handed on row by row from the
    stripe buffer of the segment that makes it. `memo` keeps what the search built (segments,
    their tensors laid out) for the model's other plans on the target (the hold's replans).
    """
    if planner not in PLANNER_NAMES:
        raise ArenacError(f"unknown planner {planner!r}; choose one of {', '.join(PLANNER_NAMES)}")
    deadline = NEVER if time_limit is None else Deadline.after(time_limit)
    if planner == TFLMPlanner.name:  # TFLM's graph as TFLM runs it: file order, PADs their own
        techniques = replace(techniques, schedule="model", fuse_padding=False)
    program = lowered(model, graph_index, target, portable, techniques, alignment, given_up)
    graph = program.graph
    # TFLM's planner is shown on the buffers TFLM plans: its kernels' scratch, not ours.
    own = program.tflm_scratch() if planner == TFLMPlanner.name else program.scratch()
    scratch = (*own, *scratch)
    kernelless = [op for op, binding in enumerate(program.bindings) if binding is None]
    roles = TensorRoles.of(graph, model.source, kernelless)  # derived once, for every step below
    if order is None:
        check_order(graph, program.file_order(), model.source, roles)  # TFLite runs this order
        with step("scheduling"):
            order = schedule_program(program, techniques.schedule, alignment,
                                     deadline.share(SCHEDULE_SHARE), scratch, roles)
    lives, kept = program.control_lives(order)  # a called subgraph's steps follow its call
    outside = set(graph.inputs) | set(graph.outputs) if external_io else set()  # own buffers
    layout = (outside, roles, lives, kept, techniques, alignment)
    problem = partial(tiled_problem, program, order, scratch, *layout)
    lifetimes, overlaps = whole = problem(NO_TILING)
    # Striping is an overlap of the segment output over its input, and TFLite Micro's
    # planner takes none: `--no-overlap` and `--planner tflm` plan whole ops.
    tiles = techniques.tiling != "off" and techniques.overlap and planner != "tflm" \
        and program.layout is None and not pools
    streams = tensors_to_stream(program, stream_input, stream_output, tiles, external_io,
                                offsets_csv)
    tilings = []
    if tiles:
        with step("tiling"):
            loads = tiling_loads(program, order, scratch, layout, memo)
            found = tiling_for(program, order, kept, loads, alignment, streams, memo,
                               techniques.max_recompute, techniques.extra_stripes)
            tilings = [(t, walk) for t, walk in found if t.segments]
    if streams:
        check_streamed(program, tilings[0][0] if tilings else NO_TILING, streams)
    tiled = best_striped(program, keeping_whole(problem, whole), tilings,
                         lower_bound_with_overlaps(lifetimes.buffers, overlaps, alignment),
                         planner, options, offsets_csv, nodes, alignment, deadline)
    if tiled is not None and offsets_csv is not None:  # the solution was of this problem
        return tiled
    if streams:  # the whole-op plan holds the inputs and outputs whole: not a choice
        return replace(tiled, clock_cut=time_limit is not None and deadline.passed())
    plan, pooled = place(program, lifetimes, overlaps, planner, options, offsets_csv, pools,
                         pins, nodes, alignment, deadline)
    clock_cut = time_limit is not None and deadline.passed()
    if tiled is not None and tiled.arena_bytes < plan.arena_bytes:
        return replace(tiled, clock_cut=clock_cut)
    return ModelPlan(program=program, lifetimes=lifetimes, plan=plan,
                     **bound_figures(lifetimes, overlaps, alignment), **pooled, clock_cut=clock_cut)


def tensors_to_stream(program: Program, stream_input: bool, stream_output: bool, tiles: bool,
                      external_io: bool, offsets_csv: str | None) -> frozenset[int]:
    """The graph inputs to fetch row by row (all with `stream_input`) and the graph outputs to
    hand on row by row (all with `stream_output`), refused where a plan does not stripe."""
    source = program.model.source
    streams = frozenset()
    for flag, asked, tensors, what, how in (
            ("--stream-input", stream_input, program.graph.inputs, "inputs", "fetches"),
            ("--stream-output", stream_output, program.graph.outputs, "outputs", "hands on")):
        if not asked:
            continue
        if external_io:
            raise ArenacError(f"{flag} and --external-io both take the {what} out of the "
                              "arena: choose one", source)
        if offsets_csv is not None:
            raise ArenacError(f"{flag} plans the striped problem; offsets loaded from a file "
                              "are not for it", source)
        if not tiles:
            raise ArenacError(f"{flag} {how} the {what} stripe by stripe: it needs striping "
                              "(not --tiling off, --no-overlap, --planner tflm, --pool or a "
                              "control-flow graph)", source)
        streams |= frozenset(tensors)
    return streams


def streamed_tensors(tiling: Tiling) -> frozenset[int]:
    """The graph inputs and outputs the tiling's segments stream."""
    return frozenset({*(s.input for s in tiling.segments if s.streamed),
                      *(s.output for s in tiling.segments if s.streamed_output)})


def check_streamed(program: Program, tiling: Tiling, streams: frozenset[int]) -> None:
    """Refused unless every tensor in `streams` is the input or output of a segment that
    streams it."""
    graph, streamed = program.graph, streamed_tensors(tiling)
    for flag, what, tensors, why in (
            ("--stream-input", "input", graph.inputs, "be fetched row by row: the ops reading "
             "it are not a chain of convolutions, pooling and elementwise ops on NHWC rows "
             "that reads it alone"),
            ("--stream-output", "output", graph.outputs, "be handed on row by row: it is not "
             "made by a chain of convolutions, pooling and elementwise ops on NHWC rows, or an "
             "op reads it")):
        for i, t in enumerate(tensors):
            if t in streams and t not in streamed:
                raise ArenacError(f"{flag}: {what} {i} ({graph.tensors[t].name!r}) cannot "
                                  f"{why}", program.model.source)


def lowered(model: Model, graph_index: int, target: str, portable: bool,
            techniques: Techniques, alignment: int,
            given_up: Mapping[int, tuple[str, ...]] | None = None) -> Program:
    """The graph lowered for `target` (toolchain.lower.program), refused when its kernels read
    their scratch in words wider than `alignment` keeps whole."""
    program = lower(model, graph_index, target, portable, techniques.fuse_padding, given_up)
    needed = max((b.variant.scratch_alignment for b in program.bindings
                  if b is not None and b.variant is not None), default=1)
    if alignment < needed:
        raise ArenacError(f"the {target} kernels read their scratch in {needed}-byte words: "
                          f"plan with an alignment of at least {needed} (not {alignment})",
                          model.source)
    return program


def bound_figures(lifetimes: Lifetimes, overlaps: Sequence[Overlap], alignment: int) -> dict:
    """The figures every plan is shown beside: the bounds below it and the naive sum above."""
    return dict(lower_bound_bytes=lower_bound(lifetimes.buffers, alignment),
                naive_bytes=naive_sum(lifetimes.buffers, alignment),
                overlap_bound_bytes=lower_bound_with_overlaps(lifetimes.buffers, overlaps,
                                                              alignment))


def best_striped(program: Program, problem, tilings, untiled_bound: int, planner: str,
                 options: dict, offsets_csv: str | None, nodes: int, alignment: int,
                 deadline: Deadline) -> ModelPlan | None:
    """The smallest plan of the tilings found (each with what walks to its neighbours),
    each planned and walked from (the bound does not rank them as plans do); with
    `offsets_csv`, the plan of the first tiling whose problem the solution is of."""
    tiled = None
    for tiling, others in tilings:
        trial = striped_plan(program, problem(tiling), tiling, untiled_bound, planner,
                             dict(options), offsets_csv, nodes, alignment,
                             deadline.share(0.5 / len(tilings)))
        if trial is not None and offsets_csv is not None:
            return trial
        if trial is not None and trial.arena_bytes > trial.overlap_bound_bytes:
            with step("tiling"):
                trial = nearby_tiling(program, problem, trial, others, untiled_bound,
                                      planner, options, nodes, alignment, deadline)
        if trial is not None and (tiled is None or trial.arena_bytes < tiled.arena_bytes):
            tiled = trial
    return tiled


def striped_plan(program: Program, tiled: tuple[Lifetimes, tuple[Overlap, ...]], tiling: Tiling,
                 untiled_bound: int, planner: str, options: dict, offsets_csv: str | None,
                 nodes: int, alignment: int, deadline: Deadline) -> ModelPlan | None:
    """The plan of the striped problem: an external solution of it (None when the solution is
    of the whole-op problem instead), or the planners' best."""
    lifetimes, overlaps = tiled
    if offsets_csv is not None:
        try:
            placement = loaded_plan(offsets_csv, lifetimes.buffers, overlaps, alignment)
        except ArenacError:
            return None
    else:
        placement, _ = place(program, lifetimes, overlaps, planner, options, None, (), {},
                             nodes, alignment, deadline)
    return ModelPlan(program=program, lifetimes=lifetimes, plan=placement,
                     **bound_figures(lifetimes, overlaps, alignment), tiling=tiling,
                     untiled_bound_bytes=untiled_bound)


# The streamed segments the tiling search starts from, at most (the best by their bound): the
# search is greedy, and the best first segment alone is not always the best start.
STREAMED_STARTS = 4
# The score of a tiling that holds a streamed input whole, or computes more MACs twice than
# --max-recompute allows: worse than any other.
UNSTREAMED = (1 << 62, 0)

# Neighbouring tilings planned in full after the one the bound chose, at most: each is a
# whole plan, so this bounds the work (and the result does not depend on the clock).
NEARBY_TILINGS = 12
# The same for neighbours with one segment more, away from the others (each tried in one
# schedule only, toolchain.lower.tiling.ADDED_SCHEDULE).
ADDED_TILINGS = 3
# An added segment's plan is screened first with this fraction of the exact planner's work,
# and planned in full only when that is smaller already: most are not, and a model's
# plans that the exact planner cannot prove take all of it.
SCREENING = 8


def nearby_tiling(program: Program, problem, tiled: ModelPlan,
                  others: Callable[..., list[tuple[Score, Tiling]]],
                  untiled_bound: int, planner: str, options: dict, nodes: int, alignment: int,
                  deadline: Deadline) -> ModelPlan:
    """The smallest plan found by walking from the chosen tiling to better neighbours
    (toolchain.lower.tiling.neighbours), best bound first, within NEARBY_TILINGS plans and
    ADDED_TILINGS with a segment more: the bound does not see the shifts a run of outputs
    stacks, a plan does. An added segment is tried before a changed one: it keeps what the
    chosen ones save where they are (on a DS-CNN, a changed segment first ends higher)."""
    best, tried, budget = tiled, {tiled.tiling}, {False: NEARBY_TILINGS, True: ADDED_TILINGS}
    improved = True
    while improved and any(budget.values()):
        improved = False
        for apart in (True, False):  # a segment added before segments changed
            for score, tiling in others(best.tiling, below=best.arena_bytes, apart=apart):
                if not budget[apart] or score[0] >= best.arena_bytes:
                    break
                if tiling in tried:
                    continue
                tried.add(tiling)
                budget[apart] -= 1
                trial = striped_plan(program, problem(tiling), tiling, untiled_bound, planner,
                                     dict(options), None, nodes // (SCREENING if apart else 1),
                                     alignment, deadline.share(0.1))
                if apart and trial.arena_bytes < best.arena_bytes:  # screened: plan it in full
                    trial = striped_plan(program, problem(tiling), tiling, untiled_bound,
                                         planner, dict(options), None, nodes, alignment,
                                         deadline.share(0.1))
                if trial.arena_bytes < best.arena_bytes:
                    best, improved = trial, True
                    break
            if improved:
                break
    return best


def tiling_for(program: Program, order: Sequence[int], kept,
               loads: Callable[[Tiling], Mapping[int, int]], alignment: int,
               streams: frozenset[int] = frozenset(), memo: TilingMemo | None = None,
               max_recompute: float = DEFAULT_MAX_RECOMPUTE, extra_stripes: bool = True
               ) -> list[tuple[Tiling, Callable[..., list[tuple[Score, Tiling]]]]]:
    """The striped segments that lower the bound of the plan (toolchain.lower.tiling), and
    what gives their neighbours whose bound is below an arena. Three searches, each greedy:
    one with stripes on demand only, one with wavefronts too, one with rows row by row too
    (and a fourth with column tiles where they may be); every result is to be planned and
    walked from (a search with more choices may still end higher). Inputs in `streams` are
    fetched row by row and outputs handed on row by row: the search starts from the best
    segments streaming them, and never leaves one without them; a segment streaming an input
    may run in column tiles, if the MACs it computes twice are at most `max_recompute` percent
    of the model's. `memo` keeps the segments built for the next plan of the model on the same
    target. Without `extra_stripes`, no segment runs row by row, and the neighbours have no
    segment more than the tiling."""
    graph = program.graph
    memo = TilingMemo() if memo is None else memo
    scores: dict[tuple, tuple[tuple[int, int], int]] = {}

    def key(tiling: Tiling) -> tuple:
        return tuple((s.first, s.last, s.schedule) for s in tiling.segments)

    def bound(tiling: Tiling) -> tuple[tuple[int, int], int]:
        if key(tiling) not in scores:
            at = loads(tiling)
            peak = max(at, key=lambda s: (at[s], -s), default=0)
            scores[key(tiling)] = (at.get(peak, 0), sum(at.values())), peak
        return scores[key(tiling)]

    def evaluate(tiling: Tiling) -> tuple[tuple[int, int], int]:
        if not streams <= streamed_tensors(tiling) or not within_cap(tiling):
            return UNSTREAMED, 0
        return bound(tiling)

    def within_cap(tiling: Tiling) -> bool:
        return sum(s.recomputed for s in tiling.segments) <= recompute

    def start_rank(tiling: Tiling) -> tuple:  # the more streams it streams, the better
        return -len(streams & streamed_tensors(tiling)), bound(tiling)[0], key(tiling)

    chains = stripe_candidates(graph, program.bindings, order, frozenset(kept), streams)
    if not chains:  # nothing stripes: no need to lay out the whole-op problem again
        return []

    params = [b.params if b is not None else None for b in program.bindings]
    recompute = max_recompute / 100 * model_macs(graph, program.bindings)

    def build(chain, schedule: Schedule) -> Segment | None:
        """The segment, unless a stripe's kernel would ask for more scratch than its op's, or
        its column tiles compute more MACs twice than the cap allows."""
        height, pace, tiles = schedule
        if (tiles > 1 and not max_recompute) or (
                (pace == ROW_BY_ROW or chain.accumulator) and not extra_stripes):
            return None
        at = (chain.first, chain.last, chain.ops, chain.input, chain.output, chain.streamed,
              chain.streamed_output, schedule)
        if at not in memo.segments:  # the same whatever kernels the ops run
            segment = stripe_chain(replace(chain, streamed_output=True) if tiles > 1 else chain,
                                   height, graph, program.bindings, pace)
            if segment is not None and tiles > 1:
                segment = column_tiled(segment, chain, tiles, graph, program.bindings)
            memo.segments[at] = segment
        segment = memo.segments[at]
        if segment is None or segment.recomputed > recompute:
            return None
        kernels = (*at, tuple(kernel_name(program.bindings[o]) for o in chain.ops))
        if kernels not in memo.fits:
            memo.fits[kernels] = fits_scratch(segment, graph, program.bindings, params,
                                              memo.bands)
        return segment if memo.fits[kernels] else None

    def starts_for(builder) -> list[Tiling]:
        """The best few tilings streaming every stream, one segment a stream (`builder`'s)."""
        starts = [NO_TILING]
        for x in sorted(streams):  # the best few segments streaming x, after the others'
            streaming = {trial for start in starts for chain in chains
                         if (chain.streamed and chain.input == x)
                         or (chain.streamed_output and chain.output == x)
                         for trial in trials(start, chain, builder) if within_cap(trial)}
            starts = sorted(streaming, key=start_rank)[:STREAMED_STARTS] \
                or starts  # none: check_streamed refuses
        return starts

    whole_rows = in_whole_rows(build, (ON_DEMAND, WAVEFRONT, ROW_BY_ROW))
    wavefronts = in_whole_rows(build, (ON_DEMAND, WAVEFRONT))
    on_demand = in_whole_rows(build, (ON_DEMAND,))
    found: dict[Tiling, Callable[..., list[tuple[Score, Tiling]]]] = {}
    # rows row by row, then column tiles, are more choices still: a search may end higher
    searches = (on_demand, wavefronts, *((whole_rows,) if extra_stripes else ()),
                *((build,) if max_recompute and streams else ()))
    wavefront_starts, chosen = starts_for(wavefronts), NO_TILING
    for builder in searches:  # row by row, on from the wavefronts' segments (but streamed)
        starts = (wavefront_starts if builder in (on_demand, wavefronts) else
                  [chosen] if builder is whole_rows and not streams else starts_for(builder))
        chosen = min((choose_tiling(chains, builder, evaluate, start) for start in starts),
                     key=lambda t: (evaluate(t)[0], key(t)))
        found.setdefault(chosen, partial(neighbours, chains=chains, build=builder,
                                         evaluate=evaluate, added=extra_stripes))
    return list(found.items())


def in_whole_rows(build: Callable[[Chain, Schedule], Segment | None], paces: tuple[int, ...]
                  ) -> Callable[[Chain, Schedule], Segment | None]:
    """`build`, only for schedules in whole rows (no column tiles) at one of `paces`."""
    def builder(chain: Chain, schedule: Schedule) -> Segment | None:
        return build(chain, schedule) if schedule[1] in paces and schedule[2] == 1 else None
    return builder


def keeping_whole(problem: Callable[[Tiling], tuple[Lifetimes, tuple[Overlap, ...]]],
                  whole: tuple[Lifetimes, tuple[Overlap, ...]]
                  ) -> Callable[[Tiling], tuple[Lifetimes, tuple[Overlap, ...]]]:
    """`problem`, giving the whole-op problem (`whole`, laid out already) where a tiling has no
    segments rather than laying it out again."""
    return lambda tiling: problem(tiling) if tiling.segments else whole


def tiled_problem(program: Program, order: Sequence[int], scratch, outside, roles, lives,
                  kept, techniques: Techniques, alignment: int, tiling: Tiling
                  ) -> tuple[Lifetimes, tuple[Overlap, ...]]:
    """The planner's buffers and overlaps for `tiling`: a segment's steps all count at its
    first, its intermediates give way to their stripe buffers (scratch of its first op), its
    ops' kernels take turns in one scratch buffer, and its output may start `shift` bytes below
    its input when the input dies there. An op that reduces a segment's rows keeps its
    accumulators in its input's stripe buffer, so its own scratch is not planned there."""
    graph, source = program.graph, program.model.source
    reducing = {s.reducer for s in tiling.segments if s.reduces}
    scratch = tuple(r for r in scratch if r.op not in reducing)
    stripes = tuple(ScratchRequest(order[s.first], b.size, f"stripe rows of tensor {b.tensor}",
                                   BufferKey(STRIPE, b.tensor))
                    for s in tiling.segments for b in s.buffers)
    lifetimes = compute_lifetimes(graph, order, (*scratch, *stripes), source,
                                  set(outside) | tiling.intermediates(), roles, lives,
                                  tiling.merged_steps(), [s.ops for s in tiling.segments],
                                  alignment)
    overlaps = overlap_pairs(graph, lifetimes, program.bindings, techniques.inplace,
                             techniques.overlap, kept)
    return lifetimes, (*overlaps, *segment_overlaps(lifetimes, tiling, kept))


def tiling_loads(program: Program, order: Sequence[int], scratch: Sequence[ScratchRequest],
                 layout: tuple, memo: TilingMemo | None) -> Callable[[Tiling], dict[int, int]]:
    """`tiled_loads` of this plan's problem (`layout`: what `tiled_problem` takes between the
    scratch and the tiling). The segments' tensors laid out are shared with the memo's other
    plans of the model wherever all that lays them out agrees (the hold's replans, where their
    kernels' overlap rules agree)."""
    outside, _, lives, kept, techniques, alignment = layout
    rules = tuple(None if b is None else b.overlaps for b in program.bindings)
    key = (tuple(order), rules, frozenset(outside), tuple(sorted(lives.items())),
           frozenset(kept), techniques.inplace, techniques.overlap, alignment)
    laid_out = partial(tiled_problem, program, order, (), *layout)
    step_of = {op: step for step, op in enumerate(order)}
    return partial(tiled_loads, (
        ({} if memo is None else memo.deltas.setdefault(key, {}),
         lambda segments: tensor_deltas(laid_out(Tiling(segments)), alignment), None),
        ({}, partial(scratch_deltas, scratch, step_of, alignment),
         partial(scratch_change, scratch, step_of, alignment))), {})


# Step -> by how much the loads change there (planners.base.step_deltas), and step -> how many
# ends of lives and pairs name it: the search's score sums the loads at every step named.
Deltas = tuple[dict[int, int], dict[int, int]]


def tiled_loads(parts: Sequence[tuple[dict[tuple, Deltas], Callable[[tuple], Deltas],
                                     Callable[[Segment], Deltas] | None]],
                summed: dict[tuple, Deltas], tiling: Tiling) -> dict[int, int]:
    """The step loads of `tiled_problem` for `tiling` (planners.base.step_loads), from its
    parts' deltas (the tensors and stripe buffers, then the kernels' scratch), each the
    whole-op problem's plus what each segment changes in it, each laid out once in its memo
    (the tensors' is shared by the hold's replans) and `summed` over the parts: the search
    bounds thousands of tilings of far fewer segments. A part's change of a segment is its own
    function's where it has one (the scratch's: only the requests at the segment's steps
    change), else the problem laid out with the segment alone less the whole. The changes add
    up: a segment moves to its first step the ends of the lives that begin or end in it, and
    only those (each end of a life is a delta and a step named on its own), takes its
    intermediates out for its stripe buffers, its ops' scratch into its shared buffer, and
    pairs an output over an input only at its own steps (which holds while a chain's
    intermediates and streamed input are read only inside it:
    toolchain.lower.tiling.chain_at)."""
    if () not in summed:
        for known, lay_out, _ in parts:
            if () not in known:
                known[()] = lay_out(())
        summed[()] = added(known[()] for known, _, _ in parts)
    keys = [segment_key(s) for s in tiling.segments]
    for segment, key in zip(tiling.segments, keys, strict=True):
        if key not in summed:
            for known, lay_out, change in parts:
                if key not in known:
                    known[key] = change(segment) if change is not None else tuple(
                        changes(alone, whole)
                        for alone, whole in zip(lay_out((segment,)), known[()], strict=True))
            summed[key] = added(known[key] for known, _, _ in parts)
    deltas, named = totals = (dict(summed[()][0]), dict(summed[()][1]))
    for key in keys:
        add_to(totals, summed[key])
    return running_loads({at: deltas.get(at, 0) for at, count in named.items() if count})


def added(parts: Iterable[Deltas]) -> Deltas:
    """The deltas of `parts` together, and the steps they name."""
    totals: Deltas = ({}, {})
    for part in parts:
        add_to(totals, part)
    return totals


def add_to(totals: Deltas, part: Deltas) -> None:
    """`part` added to `totals`, in place: a tiling's totals start from a copy of the whole."""
    for total, change in zip(totals, part, strict=True):
        for at, by in change.items():
            total[at] = total.get(at, 0) + by


def segment_key(segment: Segment) -> tuple:
    """What lays a segment out: its steps, schedule and the tensors it streams."""
    return (segment.first, segment.last, segment.schedule, segment.input, segment.output,
            segment.streamed, segment.streamed_output)


def tensor_deltas(problem: tuple[Lifetimes, tuple[Overlap, ...]], alignment: int) -> Deltas:
    """The deltas of a laid-out problem's buffers and pairs, and the steps they name."""
    lifetimes, overlaps = problem
    named: dict[int, int] = defaultdict(int)
    first = {b.id: b.first for b in lifetimes.buffers}
    for at in (*(s for b in lifetimes.buffers for s in (b.first, b.last + 1)),
               *(s for o in overlaps for s in (first[o.below], first[o.below] + 1))):
        named[at] += 1
    return step_deltas(lifetimes.buffers, overlaps, alignment), named


def scratch_deltas(scratch: Sequence[ScratchRequest], step_of: Mapping[int, int],
                   alignment: int, segments: tuple[Segment, ...]) -> Deltas:
    """The deltas of the kernels' scratch with these segments striped (as tiled_problem lays
    it out: a segment's ops share one buffer, a reducing op's accumulators take its own
    place), each a buffer of its op's step, and the steps they name."""
    deltas: dict[int, int] = defaultdict(int)
    named: dict[int, int] = defaultdict(int)
    tiling = Tiling(segments)
    reducing = {s.reducer for s in segments if s.reduces}
    scratch = tuple(r for r in scratch if r.op not in reducing)
    within, shared = shared_scratch(scratch, [s.ops for s in segments], alignment)
    merged = tiling.merged_steps()
    for request in (*(r for r in scratch if r.key not in within), *shared):
        step = merged.get(step_of[request.op], step_of[request.op])
        size = align_up(request.size, alignment)
        for at, by in ((step, size), (step + 1, -size)):
            deltas[at] += by
            named[at] += 1
    return deltas, named


def scratch_change(scratch: Sequence[ScratchRequest], step_of: Mapping[int, int],
                   alignment: int, segment: Segment) -> Deltas:
    """What striping `segment` changes in the scratch's deltas (scratch_deltas): only the
    requests of the ops at its steps move or merge, so theirs with the segment less theirs
    without, the others' cancelling out."""
    steps = range(segment.first, segment.last + 1)
    own = tuple(r for r in scratch if step_of[r.op] in steps)
    after = scratch_deltas(own, step_of, alignment, (segment,))
    before = scratch_deltas(own, step_of, alignment, ())
    return tuple(changes(a, b) for a, b in zip(after, before, strict=True))


def changes(after: Mapping[int, int], before: Mapping[int, int]) -> dict[int, int]:
    """What to add to `before` to make `after`, at the steps where it differs."""
    return {at: after.get(at, 0) - before.get(at, 0) for at in sorted({*after, *before})
            if after.get(at, 0) != before.get(at, 0)}


def segment_overlaps(lifetimes: Lifetimes, tiling: Tiling, kept) -> tuple[Overlap, ...]:
    """Each striped segment's output over its input, when the input dies in the segment: the
    output may start `shift` bytes below it (toolchain.lower.tiling)."""
    buffer_of = lifetimes.tensor_buffers
    pairs = []
    for s in tiling.segments:
        above, below = buffer_of.get(s.input), buffer_of.get(s.output)
        if above is None or below is None or s.input in kept:
            continue
        if lifetimes.buffers[above].last == s.first == lifetimes.buffers[below].first:
            pairs.append(Overlap(below, above, s.shift))
    return tuple(pairs)


def place(program: Program, lifetimes: Lifetimes, overlaps, planner: str, options: dict,
          offsets_csv: str | None, pools: Sequence[Pool], pins, nodes: int,
          alignment: int, deadline: Deadline) -> tuple[Placement, dict]:
    """The planners' placement of one problem (with the pools' fields, if any)."""
    pooled = {}
    if offsets_csv is not None:
        if pools:
            raise ArenacError("offsets loaded from a file are for one arena, not pools",
                              offsets_csv)
        plan = loaded_plan(offsets_csv, lifetimes.buffers, overlaps, alignment)
    else:
        if planner == "optimal":
            options = {"nodes": nodes, **options}
        candidates = best_candidates(nodes) if planner == BEST else ((planner, options),)
        clock = "" if deadline == NEVER else f", at most {deadline.left():.3g} s"
        with step(f"planning ({planner}, at most {nodes:,} search nodes{clock})"):
            if pools:
                pooled = pool_plan(program, lifetimes, overlaps, pools, pins or {}, candidates,
                                   alignment, deadline)
                plan = pooled.pop("plan")
            else:
                plan = smallest_plan(lifetimes.buffers, candidates, alignment, overlaps, deadline)
    return plan, pooled


def pool_plan(program: Program, lifetimes: Lifetimes, overlaps, pools: Sequence[Pool],
              pins: Mapping[str, str], candidates, alignment: int, deadline: Deadline) -> dict:
    """The ModelPlan fields of a plan over memory pools: the pins resolved to buffers, the
    state block's bytes reserved in its pool, and a refusal that names the peak step."""
    source = program.model.source
    index = {p.name: k for k, p in enumerate(pools)}
    if len({p.name.upper() for p in pools}) != len(pools):  # NAME_<POOL>_BYTES macros
        raise ArenacError("two pools have the same name (or names that differ only in case, "
                          "which the C's macros spell alike)", source)
    buffer_of = lifetimes.tensor_buffers
    tensors = program.graph.tensors
    by_name = {}
    for t in tensors:
        by_name.setdefault(t.name, t.index)
    buffer_pins, blocks = {}, {}  # "state" / "weights" -> pool index
    for key, pool in pins.items():
        if pool not in index:
            raise ArenacError(f"--pin {key}={pool}: no pool named {pool!r} (the pools are "
                              f"{', '.join(index)})", source)
        if key in ("state", "weights"):
            blocks[key] = index[pool]
            continue
        t = int(key) if key.isdigit() else by_name.get(key)
        if t is None or t >= len(tensors):
            raise ArenacError(f"--pin {key}={pool}: the graph has no tensor {key!r}", source)
        if t not in buffer_of:
            raise ArenacError(
                f"--pin {key}={pool}: tensor {t} ({tensors[t].name!r}) is not planned (a "
                "constant stays in flash; variables live in the state block: pin state=POOL)",
                source)
        buffer_pins[lifetimes.buffers[buffer_of[t]].id] = index[pool]
    align = block_alignment(alignment)
    sizes = {"state": align_up(state_layout(program, lifetimes, alignment)[1], align),
             "weights": weight_layout(program.graph, alignment)[1]}
    reserved = [0] * len(pools)
    for key, k in blocks.items():
        reserved[k] += sizes[key]
    for k in blocks.values():
        if reserved[k] > pools[k].capacity:
            what = " and ".join(f"the {b} ({sizes[b]} bytes)" for b in blocks if blocks[b] == k)
            raise PlanError(f"{what}, aligned to {align}, do not fit pool "
                            f"{pools[k].name} ({pools[k].capacity} bytes)", source)
    try:
        pooled = plan_pools(lifetimes.buffers, overlaps, pools, candidates, alignment,
                            buffer_pins, reserved, deadline)
    except PoolsDoNotFit as e:
        label = step_label(program, lifetimes.order, e.step)
        if e.pool is not None:
            raise PlanError(f"the tensors pinned to pool {pools[e.pool].name} need {e.needed} "
                            f"bytes at step {e.step} ({label}); it holds "
                            f"{pools[e.pool].capacity - reserved[e.pool]}", source) from None
        given = ", ".join(f"{p.name} {p.capacity}" for p in pools)
        state = "".join(f", {key} {sizes[key]} bytes pinned to {pools[k].name}"
                        for key, k in blocks.items())
        raise PlanError(f"does not fit the pools: step {e.step} ({label}) needs {e.needed} "
                        f"bytes; the pools hold {given} bytes{state}", source) from None
    return {"plan": pooled.placement, "pools": pooled.arenas, "pool_of": pooled.pool_of,
            "state_pool": blocks.get("state"), "weights_pool": blocks.get("weights")}


def schedule_program(program: Program, mode: str, alignment: int, deadline: Deadline,
                     scratch: Sequence[ScratchRequest], roles: TensorRoles) -> tuple[int, ...]:
    """The execution order: each subgraph scheduled on its own (toolchain.lower.schedule), the steps
    of a called subgraph right after the op that runs them (CALL_ONCE, IF, WHILE)."""
    if program.layout is None:
        return schedule(program.graph, mode, alignment, deadline, scratch, roles)
    orders = {}
    for g in program.subgraphs:
        ops = program.ops_of(g)
        local = [replace(r, op=r.op - ops.start) for r in scratch if r.op in ops]
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
