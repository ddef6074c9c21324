"""Execute a planned graph inside ONE arena laid out exactly as its plan says, proving the plan
safe as it goes.

Every activation is a numpy view into a single uint8 buffer of `arena_bytes` at its planned
offset, so two live tensors that a wrong plan lets overlap really do overwrite each other.

Two independent proofs guard a run. The constructor verifies the plan (toolchain.planners.verify)
unless told not to. And while running, an owner map records which buffer holds each arena byte:
before an op writes an output (or uses a scratch buffer), every byte it covers must be free, or
belong to one of the op's inputs that dies at this op and that both the plan's declared overlaps
and the op's own overlap rule let the output cover. Anything else raises PlanError at that step,
naming the op, the buffer written and the buffer it would clobber, whatever the values. This check
takes lives from the graph and the execution order and sizes from the tensors, never from the
plan's buffers, so a plan that misstates either is caught too.

Free bytes always hold POISON: the arena is poisoned before every run and a buffer's bytes are
poisoned once its last reader has run, so a kernel that reads bytes nobody wrote for it sees
poison instead of a lucky leftover.

State persists across invocations in a block of its own, as the plan lays it out
(ModelPlan.state_slots): variable tensors, resource variables (a handle operand is the view of
its variable there), the memory stateful kernels keep (their kernel takes it after the op's
inputs) and one flag byte per subgraph CALL_ONCE runs. `reset` returns the block to
its initial values; the steps of CALL_ONCE's subgraph, which follow its step, run only while its
flag is clear.

IF and WHILE run the steps of their subgraphs that follow their step (toolchain.lower.program): IF
one branch's, WHILE its condition's and body's as long as the condition holds, with the copies
their Control lists. Steps that do not run are passed over: their outputs are never claimed,
but what dies there is released as the plan says. A tensor such a copy or test reads, and a
loop value, is held while its block runs: its release waits until the copy or test has read it
(the plan keeps it alive that long), and a loop value's until the loop ends.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from runtime_py.kernels import KERNELS
from runtime_py.kernels.circular_buffer import InvokeEnds
from toolchain.errors import PlanError, RuntimeBackendError
from toolchain.front.validate import DEFAULT_MAX_ITERATIONS
from toolchain.ir import Operator, Tensor
from toolchain.lower.folding import Elided
from toolchain.lower.lifetimes import STRIPE, BufferKey
from toolchain.lower.plan import ModelPlan, StateSlot
from toolchain.lower.program import Control, Copy
from toolchain.lower.steps import CallOnce, RunIf, RunOp, RunSegment, RunWhile, Step
from toolchain.lower.tiling import Segment, StripeBuffer, Tile, striped_params, tile_params
from toolchain.ops import planned_shape_values
from toolchain.ops.overlaps import OverlapRule
from toolchain.planners import PooledPlacement, verify, verify_pools

POISON = 0xA5
FREE = -1  # the owner of a byte no live buffer holds

Observer = Callable[[int, list[np.ndarray]], None]


@dataclass(frozen=True)
class Claim:
    """Buffer `holder` (a position in the plan) takes arena bytes [start, end); of the bytes it
    finds taken, it may cover only those of the buffers in `may_cover`."""

    holder: int
    start: int
    end: int
    may_cover: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Ownership:
    """What the owner map does around one op: claims before it runs, releases after."""

    op_index: int
    claims: tuple[Claim, ...]
    releases: tuple[int, ...]


class ArenaInterpreter:
    """runtime_py: runs a ModelPlan; it never plans.

    `verify_plan=False` skips the static proof, so that the check made while running can be
    shown to catch an unsafe plan on its own. A WHILE that would run its body more than
    `max_iterations` times in one invoke raises RuntimeBackendError: work is bounded by a
    count, never by the clock.
    """

    def __init__(self, model_plan: ModelPlan, verify_plan: bool = True,
                 max_iterations: int = DEFAULT_MAX_ITERATIONS):
        self.model_plan = model_plan
        self.max_iterations = max_iterations
        self.graph = graph = model_plan.graph
        self.source = model_plan.model.source
        self.shape_values = planned_shape_values(graph)
        if verify_plan:
            try:
                verify(model_plan.plan)
                if model_plan.pools:
                    verify_pools(PooledPlacement(model_plan.plan, model_plan.pools,
                                                 model_plan.pool_of))
            except PlanError as e:
                raise PlanError(e.message, self.source) from None
        self.params = model_plan.program.params()  # fails before anything runs
        self.layout = ArenaLayout(model_plan)
        # One poisoned array per memory pool (one arena without pools); the owner map and
        # the layout count bytes through the pools joined, each pool from its base.
        self.arenas = [np.full(a.bytes, POISON, dtype=np.uint8) for a in model_plan.pools] \
            or [np.full(model_plan.arena_bytes, POISON, dtype=np.uint8)]
        self.bases = [a.base for a in model_plan.pools] or [0]
        self.arena = self.arenas[0]
        holders = len(model_plan.lifetimes.keys)
        self.owner = np.full(model_plan.arena_bytes, FREE,
                             dtype=np.int16 if holders < 2**15 else np.int32)
        self.state = self.state_block(model_plan.state_bytes)
        self.views: dict[int, np.ndarray] = {}
        for tensor, position in model_plan.lifetimes.tensor_buffers.items():
            k, offset = model_plan.place(position)
            self.views[tensor] = self._view(self.arenas[k or 0], offset, graph.tensors[tensor])
        self.kernel_state: dict[int, list[np.ndarray]] = {}  # op -> its kernel's state
        for slot in model_plan.state_slots:
            if slot.tensor is not None:
                self.views[slot.tensor] = self._view(self.state, slot.offset, slot)
            elif slot.op is not None:
                self.kernel_state.setdefault(slot.op, []).append(
                    self._view(self.state, slot.offset, slot))
        for t in graph.tensors:
            if t.is_constant:
                self.views[t.index] = t.data
            elif t.is_handle:  # the view of the variable it names, which its ops copy from or to
                slot = model_plan.state_of_handle(t.index)
                self.views[t.index] = (np.zeros(0, np.uint8) if slot is None
                                       else self._view(self.state, slot.offset, slot))
        self.held: Counter[int] = Counter()  # holders whose release waits, and how many wait
        self.deferred: set[int] = set()  # held holders whose release came
        self.observe: Observer | None = None
        # Streamed inputs stay outside the arena, as the firmware holds them; their segment
        # fetches their rows (toolchain.lower.tiling).
        self.streamed: dict[int, np.ndarray | None] = {
            s.input: None for s in model_plan.tiling.segments if s.streamed}
        # Streamed outputs too: their segment hands their rows on, here into an array of the
        # firmware's side (poison until handed), each row once and in order.
        self.handed = {s.output for s in model_plan.tiling.segments if s.streamed_output}
        for t in self.handed:
            self.views[t] = np.empty(graph.tensors[t].shape, graph.tensors[t].dtype)
        self.reset()

    def state_block(self, nbytes: int) -> np.ndarray:
        """The persistent block state lives in: its own memory, never the arena."""
        return np.zeros(nbytes, dtype=np.uint8)

    @staticmethod
    def _view(block: np.ndarray, offset: int, tensor: Tensor | StateSlot) -> np.ndarray:
        return (
            block[offset : offset + tensor.nbytes]
            .view(np.dtype(tensor.dtype))
            .reshape(tensor.shape)
        )

    def reset(self) -> None:
        """Return the state block to its initial values: every variable tensor as the file
        gives it (zeros, or the zero point of int8, where it gives none), resource variables
        unassigned, and every CALL_ONCE due to run its subgraph again."""
        for slot in self.model_plan.state_slots:
            self.state[slot.offset : slot.offset + slot.nbytes] = np.frombuffer(slot.init,
                                                                                np.uint8)

    def invoke(
        self, inputs: Sequence[np.ndarray], observe: Observer | None = None
    ) -> list[np.ndarray]:
        """Run once; `observe(op_index, outputs)` sees each op's outputs right after it runs.
        An invoke a kernel ends early (a CIRCULAR_BUFFER still gathering frames: OpSpec.stops)
        returns no outputs, [], as TFLite Micro's returns kTfLiteAbort."""
        graph = self.graph
        if len(inputs) != len(graph.inputs):
            raise RuntimeBackendError(
                f"model takes {len(graph.inputs)} inputs, got {len(inputs)}", self.source
            )
        values = [np.asarray(value) for value in inputs]
        for i, (t, value) in enumerate(zip(graph.inputs, values, strict=True)):
            expected = graph.tensors[t]
            if value.dtype != np.dtype(expected.dtype) or tuple(value.shape) != expected.shape:
                raise RuntimeBackendError(
                    f"input {i} ({expected.name!r}) must be "
                    f"{expected.dtype}{list(expected.shape)}, "
                    f"got {value.dtype}{list(value.shape)}",
                    self.source,
                )
            if t in self.shape_values and not np.array_equal(value, self.shape_values[t]):
                raise RuntimeBackendError(
                    f"input {i} ({expected.name!r}) is an output shape, "
                    f"{self.shape_values[t].tolist()} when planned, got {value.tolist()}",
                    self.source,
                )
        for arena in self.arenas:
            arena.fill(POISON)
        for t in self.handed:
            self.views[t].view(np.uint8)[...] = POISON
        self.owner.fill(FREE)
        self.held.clear()
        self.deferred.clear()
        self.observe = observe
        for claim in self.layout.input_claims:
            self._claim(claim, 0, None)
        for t, value in zip(graph.inputs, values, strict=True):
            if t in self.streamed:
                self.streamed[t] = value.copy()  # the firmware's side: fetched row by row
            else:
                self.views[t][...] = value
        try:
            self._run(self.model_plan.steps, True)
        except InvokeEnds:
            return []
        return [self.views[t].copy() for t in graph.outputs]

    def _run(self, steps: Sequence[Step], active: bool) -> None:
        """Runs the steps of one block (`active`), or passes over them."""
        for step in steps:
            RUNNERS[type(step)](self, step, active)

    def _op(self, step: RunOp, active: bool) -> None:
        self._kernel(step.step, step.op, active)
        self._finish(step.step)
        self._observe(step.op, active)

    def _kernel(self, step: int, op_index: int, active: bool) -> None:
        """The op's kernel on its operands, once its outputs and scratch are claimed."""
        plan = self.layout.steps[step]
        op = self.graph.operators[op_index]
        params = self.params[op_index]
        if active and not isinstance(params, Elided):  # fused or folded: nothing to run
            for claim in plan.claims:
                self._claim(claim, step, op)
            ins = [self.views[t] if t >= 0 else None for t in op.inputs]
            ins += self.kernel_state.get(op_index, [])
            KERNELS[op.kind](params, ins, [self.views[t] for t in op.outputs])

    def _observe(self, op_index: int, active: bool) -> None:
        """What an op hands on, after its subgraphs ran, to whoever watches."""
        if active and self.observe is not None:
            op = self.graph.operators[op_index]
            self.observe(op_index, [self.views[t].copy() for t in op.outputs])

    def _striped(self, step: RunSegment, active: bool) -> None:
        if active:
            self._segment(step.segment)
        else:
            for passed in range(step.segment.first, step.segment.last + 1):
                self._finish(passed)

    def _call_once(self, step: CallOnce, active: bool) -> None:
        """CALL_ONCE: its subgraph, unless it ran since the last reset."""
        self._kernel(step.step, step.op, active)
        ran = bool(self.state[step.flag])
        if active:
            self.state[step.flag] = 1
        self._finish(step.step)
        self._run(step.body, active and not ran)
        self._observe(step.op, active)

    def _segment(self, segment: Segment) -> None:
        """A striped segment (toolchain.lower.tiling): its stripes in order, each op on the rows the
        stripe gives it. The output's rows are claimed as they are written and the input's rows
        released as soon as no window reads them, so a plan that lets the output grow over rows
        still needed fails here (before each op: the rows that op and the ops after it in the
        stripe read, and later stripes read, stay); the stripe buffers' rows not yet written
        hold poison. A streamed input's rows are fetched into its stripe buffer before each
        stripe, as the stripe says; reading a row not fetched yet fails. A streamed output's
        rows are handed on from its stripe buffer after each stripe, each row once and in order.
        A segment in column tiles runs its stripes once per tile, on each tensor's columns in
        that tile (the ops' params cut to them), its output claimed whole first and each tile's
        rows copied into their columns of it, each row once per tile and in order.
        """
        layout, graph = self.layout, self.graph
        x, y = layout.holder_of.get(segment.input), layout.holder_of.get(segment.output)
        steps = range(segment.first, segment.last + 1)
        for step in steps:
            op = graph.operators[layout.steps[step].op_index]
            for claim in layout.steps[step].claims:
                if claim.holder != y or segment.tiles:
                    self._claim(claim, step, op)
        for tile in segment.tiles or (None,):
            self._stripes(segment, tile, x, y)
        for step in steps:
            self._finish(step)
        if self.observe is not None:
            op = graph.operators[segment.ops[-1]]
            self.observe(op.index, [self.views[t].copy() for t in op.outputs])

    def _stripes(self, segment: Segment, tile: Tile | None, x: int | None, y: int | None
                 ) -> None:
        """The segment's stripes, in one column tile (`tile`) or across the whole width."""
        graph = self.graph
        params = self.params if tile is None else tile_params(segment, tile, graph, self.params)
        buffers = [self._stripe_view(b, tile) for b in segment.buffers]
        dies = x is not None and segment.first <= self.layout.death.get(x, -1) <= segment.last
        whole = set() if tile else {
            t for t, streamed in ((segment.input, segment.streamed),
                                  (segment.output, segment.streamed_output)) if not streamed}
        where = {b.tensor: i for i, b in enumerate(segment.buffers)}
        written, handed = 0, 0
        for stripe in segment.stripes:
            for view, base, kept, previous in zip(buffers, stripe.bases, stripe.kept,
                                                  self._previous_bases(segment, stripe),
                                                  strict=True):
                if kept and base != previous:
                    view[:, :kept] = view[:, base - previous:base - previous + kept].copy()
                view[:, kept:].view(np.uint8)[...] = POISON
            if segment.streamed:
                self._fetch(segment, stripe, buffers[0], tile)

            def rows(t: int, lo: int, hi: int, stripe=stripe) -> np.ndarray:
                if t in whole:
                    return self.views[t][:, lo:hi]
                if t == segment.input and hi > stripe.fetch[1]:
                    raise PlanError(f"rows {lo}-{hi - 1} of input tensor {t} are read before "
                                    f"they are fetched (rows up to {stripe.fetch[1] - 1} are)",
                                    self.source)
                base, view = stripe.bases[where[t]], buffers[where[t]]
                if not 0 <= lo - base <= hi - base <= view.shape[1]:
                    raise PlanError(f"rows {lo}-{hi - 1} of tensor {t} lie outside its stripe "
                                    f"buffer (rows {base}-{base + view.shape[1] - 1})",
                                    self.source)
                return view[:, lo - base:hi - base]

            for k, work in enumerate(stripe.ops):
                op = graph.operators[work.op]
                if dies:
                    self._release_rows(x, segment.input, stripe.input_alive_from(k, segment.input))
                reduces = work.op == segment.reducer
                if work.op == segment.ops[-1] and y is not None and tile is None:
                    # a reducing op writes its output (of any shape) whole, in its last band
                    made = (graph.tensors[segment.output].shape[1] if reduces and work.out_hi
                            else work.out_hi)
                    self._claim_rows(y, segment.output, written, made, op)
                    written = made
                _, in_lo, in_hi = work.reads[0]
                cut = striped_params(op.kind, params[work.op], work.out_lo, work.out_hi, in_lo,
                                     in_hi)
                ins = [rows(t, lo, hi) for t, lo, hi in work.reads]
                ins += [self.views[t] for t in op.inputs[len(ins):] if t >= 0]
                if reduces:
                    ins.append(self._accumulators(segment.buffers[-1]))
                out = (self.views[segment.output] if reduces
                       else rows(op.outputs[0], work.out_lo, work.out_hi))
                KERNELS[op.kind](cut, ins, [out])
            if segment.emits:
                handed = self._hand_on(segment, stripe, buffers[-1], tile, handed)
            if dies:
                self._release_rows(x, segment.input, stripe.input_done_to)
        rows_made = graph.tensors[segment.output].shape[1]
        if segment.emits and handed != rows_made:
            raise PlanError(f"output tensor {segment.output} has {rows_made} rows; its stripes "
                            f"hand on {handed}", self.source)

    def _fetch(self, segment: Segment, stripe, view: np.ndarray, tile: Tile | None) -> None:
        """A streamed input's rows for the stripe, from where the firmware holds it into its
        stripe buffer (cut to the tile's columns): the C's NAME_input_rows() call."""
        lo, hi = stripe.fetch
        base = stripe.bases[0]
        if not 0 <= lo - base <= hi - base <= view.shape[1]:
            raise PlanError(f"rows {lo}-{hi - 1} of input tensor {segment.input} are fetched "
                            f"outside its stripe buffer (rows {base}-{base + view.shape[1] - 1})",
                            self.source)
        first, end = tile.span(segment.input) if tile else (0, view.shape[2])
        view[:, lo - base:hi - base] = self.streamed[segment.input][:, lo:hi, first:end]

    def _hand_on(self, segment: Segment, stripe, view: np.ndarray, tile: Tile | None,
                 handed: int) -> int:
        """The output rows the stripe made final, from its stripe buffer to where the firmware
        takes them (the C's NAME_output_rows() call), or into the tile's columns of the output
        held whole; the rows handed on so far, after them."""
        lo, hi = stripe.emit
        base, y = stripe.bases[-1], segment.output
        if lo != handed or hi < lo:
            raise PlanError(f"rows {lo}-{hi - 1} of output tensor {y} are handed on out of "
                            f"order (rows up to {handed - 1} are)", self.source)
        if not 0 <= lo - base <= hi - base <= view.shape[1]:
            raise PlanError(f"rows {lo}-{hi - 1} of output tensor {y} are handed on from "
                            f"outside its stripe buffer (rows {base}-{base + view.shape[1] - 1})",
                            self.source)
        first, end = tile.span(y) if tile else (0, view.shape[2])
        self.views[y][:, lo:hi, first:end] = view[:, lo - base:hi - base]
        return hi

    @staticmethod
    def _previous_bases(segment: Segment, stripe) -> tuple[int, ...]:
        k = segment.stripes.index(stripe)
        return segment.stripes[k - 1].bases if k else stripe.bases

    def _stripe_view(self, buffer: StripeBuffer, tile: Tile | None) -> np.ndarray:
        """The arena rows of an intermediate's stripe buffer, as NHWC rows of its dtype (of the
        tile's columns in a column tile)."""
        holder = self.layout.holder_of_key[BufferKey(STRIPE, buffer.tensor)]
        start, _ = self.layout.spans[holder]
        tensor = self.graph.tensors[buffer.tensor]
        lo, hi = tile.span(buffer.tensor) if tile else (0, tensor.shape[2])
        shape = (1, buffer.rows, hi - lo, *tensor.shape[3:])
        size = int(np.prod(shape)) * np.dtype(tensor.dtype).itemsize
        return self.arena[start:start + size].view(np.dtype(tensor.dtype)).reshape(shape)

    def _accumulators(self, buffer: StripeBuffer) -> np.ndarray:
        """The arena bytes of a reducing op's accumulators, after its input's stripe rows."""
        holder = self.layout.holder_of_key[BufferKey(STRIPE, buffer.tensor)]
        start = self.layout.spans[holder][0] + buffer.accumulator_at
        return self.arena[start:start + buffer.accumulator]

    def _row_bytes(self, tensor: int) -> int:
        t = self.graph.tensors[tensor]
        return t.nbytes // t.shape[1]

    def _claim_rows(self, holder: int, tensor: int, lo: int, hi: int, op: Operator) -> None:
        start = self.layout.spans[holder][0]
        row = self._row_bytes(tensor)
        self._claim(Claim(holder, start + lo * row, start + hi * row),
                    self.layout.step_of[op.index], op)

    def _release_rows(self, holder: int, tensor: int, rows: int) -> None:
        """Poisons and frees the bytes of the input's first `rows` rows it still owns."""
        start = self.layout.spans[holder][0]
        end = start + rows * self._row_bytes(tensor)
        owners = self.owner[start:end]
        mine = owners == holder
        self.arena[start:end][mine] = POISON
        owners[mine] = FREE

    def _if(self, step: RunIf, active: bool) -> None:
        """IF: the chosen branch's steps, the other's passed over."""
        self._kernel(step.step, step.op, active)
        control = step.control
        chosen = (0 if self._holds(control.condition) else 1) if active else None
        if chosen is not None and not step.branches[chosen]:
            self._copy(control.blocks[chosen].copies)  # nothing to run: its values as they are
        self._finish(step.step)
        for k, (block, steps) in enumerate(zip(control.blocks, step.branches, strict=True)):
            with self._hold(c.src for c in block.copies):
                self._run(steps, k == chosen)
                if k == chosen and steps:
                    self._copy(block.copies)
        self._observe(step.op, active)

    def _while(self, step: RunWhile, active: bool) -> None:
        """WHILE: the condition's and the body's steps, again as long as the condition holds."""
        self._kernel(step.step, step.op, active)
        control = step.control
        body = control.blocks[1]
        if active:
            self._copy(control.entry)
        with self._hold(control.carried):
            self._finish(step.step)
            iterations = 0
            while True:
                with self._hold((control.condition,)):
                    self._run(step.test, active)
                    going = active and self._holds(control.condition)
                if going:
                    iterations += 1
                    if iterations > self.max_iterations:
                        raise self._endless(control)
                with self._hold(c.src for c in body.copies):
                    self._run(step.body, going)
                    if not going:
                        break
                    self._copy(body.copies)
        self._observe(step.op, active)

    def _endless(self, control: Control) -> RuntimeBackendError:
        label = self.model_plan.program.op_label(control.op)
        return RuntimeBackendError(f"{label} WHILE: its condition still holds after "
                                   f"{self.max_iterations} iterations, the limit "
                                   "(--max-iterations)", self.source)

    def _finish(self, step: int) -> None:
        """Releases what dies at a step, but what is held only once nothing holds it."""
        for holder in self.layout.steps[step].releases:
            if self.held[holder]:
                self.deferred.add(holder)
            else:
                self._release(holder)

    @contextmanager
    def _hold(self, tensors: Iterable[int]) -> Iterator[None]:
        holders = [self.layout.holder_of[t] for t in tensors if t in self.layout.holder_of]
        self.held.update(holders)
        yield
        self.held.subtract(holders)
        for holder in holders:
            if not self.held[holder] and holder in self.deferred:
                self.deferred.discard(holder)
                self._release(holder)

    def _holds(self, tensor: int) -> bool:
        """Whether a condition holds, read where the plan keeps it."""
        self._check_owned(tensor, "tests")
        return bool(self.views[tensor].reshape(-1)[0])

    def _copy(self, copies: Iterable[Copy]) -> None:
        """An IF's or WHILE's copies: the bytes of each source into its destination, both
        still held where the plan put them."""
        for c in copies:
            self._check_owned(c.src, "copies")
            self._check_owned(c.dst, "copies into")
            self.views[c.dst][...] = self.views[c.src].reshape(self.views[c.dst].shape)

    def _check_owned(self, tensor: int, what: str) -> None:
        """A tensor an IF or WHILE reads or writes itself still holds its bytes."""
        holder = self.layout.holder_of.get(tensor)
        if holder is None:
            return  # a constant
        start, end = self.layout.spans[holder]
        if not (self.owner[start:end] == holder).all():
            raise PlanError(f"an IF or WHILE {what} {self.layout.labels[holder]}, whose bytes "
                            "the plan gave to another tensor by then", self.source)

    def _claim(self, claim: Claim, step: int, op: Operator | None) -> None:
        """Gives `claim.holder` its bytes, or raises PlanError if they hold what must survive;
        `op` is the op about to run (None while the graph inputs are written)."""
        owners = self.owner[claim.start : claim.end]
        busy = owners != FREE
        if busy.any():
            taken = owners[busy]
            for coverable in claim.may_cover:
                taken = taken[taken != coverable]
            if taken.size:
                raise self._clobber_error(claim, int(taken[0]), step, op)
        owners[...] = claim.holder

    def _release(self, holder: int) -> None:
        """Poisons and frees the bytes `holder` still owns (an in-place output keeps its own)."""
        start, end = self.layout.spans[holder]
        owners = self.owner[start:end]
        mine = owners == holder
        k = bisect_right(self.bases, start) - 1  # a buffer lies in one pool (verify_pools)
        block = self.arenas[k][start - self.bases[k] : end - self.bases[k]]
        if mine.all():
            block[...] = POISON
            owners[...] = FREE
        else:
            block[mine] = POISON
            owners[mine] = FREE

    def _clobber_error(
        self, claim: Claim, victim: int, step: int, op: Operator | None
    ) -> PlanError:
        layout = self.layout
        hit = np.flatnonzero(self.owner[claim.start : claim.end] == victim)
        first, last = claim.start + int(hit[0]), claim.start + int(hit[-1]) + 1
        writer = "writing the graph inputs" if op is None else f"op {op.index} ({op.opcode})"
        return PlanError(
            f"step {step}, {writer}: {layout.labels[claim.holder]} at arena bytes "
            f"[{first}, {last}) would clobber {layout.labels[victim]}, "
            f"{layout.why_not_coverable(claim.holder, victim, step, op)}",
            self.source,
        )


# The runner of each kind of step (toolchain.lower.steps).
RUNNERS: dict[type, Callable[[ArenaInterpreter, Step, bool], None]] = {
    RunOp: ArenaInterpreter._op,
    RunSegment: ArenaInterpreter._striped,
    CallOnce: ArenaInterpreter._call_once,
    RunIf: ArenaInterpreter._if,
    RunWhile: ArenaInterpreter._while,
}


class ArenaLayout:
    """The owner map's script for a plan: each buffer's arena bytes and label, and per step
    the claims and releases, derived from the graph and the execution order."""

    def __init__(self, model_plan: ModelPlan):
        graph, lifetimes, plan = model_plan.graph, model_plan.lifetimes, model_plan.plan
        bindings = model_plan.program.bindings
        self.graph = graph
        self.source = source = model_plan.model.source
        if len(plan.offsets) != len(lifetimes.keys):
            raise PlanError(
                f"plan has {len(plan.offsets)} offsets for {len(lifetimes.keys)} buffers",
                source,
            )
        self.holder_of = lifetimes.tensor_buffers
        self.holder_of_key = lifetimes.buffer_of
        order = lifetimes.order
        self.death = death = self._deaths(model_plan)
        self.spans: list[tuple[int, int]] = [(0, 0)] * len(lifetimes.keys)
        self.labels: list[str] = [""] * len(lifetimes.keys)
        for t, holder in self.holder_of.items():
            self.spans[holder] = self._span(plan.offsets[holder], graph.tensors[t].nbytes,
                                            model_plan.arena_bytes)
            self.labels[holder] = f"tensor {t} ({graph.tensors[t].name!r})"
        self.step_of = step_of = {op: step for step, op in enumerate(order)}
        scratch_at: dict[int, list[Claim]] = {}
        # a shared buffer is claimed whole, as planned: its ops take turns in it (one step)
        for request in (*(r for r in lifetimes.scratch if r.key not in lifetimes.within),
                        *lifetimes.shared):
            holder = lifetimes.buffer_of[request.key]
            self.spans[holder] = self._span(plan.offsets[holder], request.size,
                                            model_plan.arena_bytes)
            self.labels[holder] = f"the scratch buffer of op {request.op} ({request.purpose})"
            scratch_at.setdefault(step_of[request.op], []).append(Claim(holder,
                                                                        *self.spans[holder]))
            death[holder] = step_of[request.op]
        declared = self._declared(model_plan)
        self.refusals: dict[tuple[int, int], str] = {}
        self.input_claims = tuple(
            Claim(self.holder_of[t], *self.spans[self.holder_of[t]])
            for t in graph.inputs
            if t in self.holder_of
        )
        releases_at: dict[int, list[int]] = {}
        for holder, end in death.items():
            releases_at.setdefault(end, []).append(holder)
        self.steps: list[Ownership] = []
        for step, op_index in enumerate(order):
            op = graph.operators[op_index]
            rules = bindings[op_index].overlaps  # what the op's kernel allows, not the plan
            claims = [
                Claim(self.holder_of[t], *self.spans[self.holder_of[t]],
                      self._coverable(op, rules, t, step, declared, plan.offsets))
                for t in op.outputs
                if t in self.holder_of
            ]
            self.steps.append(Ownership(op_index, (*claims, *scratch_at.get(step, ())),
                                   tuple(releases_at.get(step, ()))))

    def _span(self, offset: int, size: int, arena_bytes: int) -> tuple[int, int]:
        if offset < 0 or offset + size > arena_bytes:
            raise PlanError(
                f"a buffer at bytes [{offset}, {offset + size}) lies outside the arena "
                f"[0, {arena_bytes})",
                self.source,
            )
        return offset, offset + size

    def _deaths(self, model_plan: ModelPlan) -> dict[int, int]:
        """Planned tensor's buffer -> the step after which nothing reads it (graph outputs are
        absent: they never die); a tensor nobody reads dies at the step that writes it."""
        graph = model_plan.graph
        death: dict[int, int] = {self.holder_of[t]: 0 for t in graph.inputs if t in self.holder_of}
        for step, op_index in enumerate(model_plan.lifetimes.order):
            op = graph.operators[op_index]
            for t in (*op.inputs, *op.outputs):
                if t in self.holder_of:
                    death[self.holder_of[t]] = step
        lives, _ = model_plan.program.control_lives(model_plan.lifetimes.order)
        self.controlled = {self.holder_of[t] for t in lives if t in self.holder_of}
        for t, step in lives.items():  # what IF and WHILE copy or test after their readers
            if t in self.holder_of:
                death[self.holder_of[t]] = max(death.get(self.holder_of[t], step), step)
        for t in graph.outputs:
            if t in self.holder_of:
                death.pop(self.holder_of[t], None)
        return death

    @staticmethod
    def _declared(model_plan: ModelPlan) -> dict[tuple[int, int], tuple[int, bool]]:
        """(below, above) by plan position -> the declared (shift, any_offset)."""
        position = {b.id: i for i, b in enumerate(model_plan.plan.buffers)}
        return {
            (position[o.below], position[o.above]): (o.shift, o.any_offset)
            for o in model_plan.plan.overlaps
            if o.below in position and o.above in position
        }

    def _coverable(
        self,
        op: Operator,
        rules: Sequence[OverlapRule],
        output: int,
        step: int,
        declared: dict[tuple[int, int], tuple[int, bool]],
        offsets: Sequence[int],
    ) -> frozenset[int]:
        """The inputs whose bytes `output` may cover: each dies at this op, and the plan declares
        the overlap and the op's kernel rule allows it, both at the planned offsets. Why each
        other dying input may not be covered goes to `refusals`."""
        below = self.holder_of[output]
        coverable = set()
        for rule in rules:
            above = self.holder_of.get(op.inputs[rule.input])
            if op.outputs[rule.output] != output or above is None or self.death.get(above) != step:
                continue
            if (below, above) not in declared:
                self.refusals[below, above] = "the plan declares no overlap between them"
                continue
            declared_shift, declared_any = declared[below, above]
            starts = f"but they start at {offsets[below]} and {offsets[above]}"
            if not (rule.any_offset or offsets[below] + rule.shift <= offsets[above]):
                self.refusals[below, above] = (
                    f"its kernel needs the output {rule.shift} bytes or more below the input, "
                    + starts
                )
            elif not (declared_any or offsets[below] + declared_shift <= offsets[above]):
                self.refusals[below, above] = (
                    f"the plan's overlap needs the output {declared_shift} bytes or more below "
                    "the input, " + starts
                )
            else:
                coverable.add(above)
        return frozenset(coverable)

    def why_not_coverable(self, holder: int, victim: int, step: int,
                          op: Operator | None) -> str:
        end = self.death.get(victim)
        if end is None:
            return "a graph output"
        if end > step:
            return f"which is read until step {end}"
        if op is None:
            return "another graph input"
        if victim in self.controlled:
            return "which an IF or WHILE copies or tests after this step"
        if victim not in {self.holder_of.get(t) for t in op.inputs}:
            return "which is written at this step too"
        return "an input of this op; " + self.refusals.get(
            (holder, victim), "its kernel does not let this output cover it"
        )
