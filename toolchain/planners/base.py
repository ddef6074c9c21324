"""What every memory planner shares: plain buffers in, offsets out.

Planners never see TFLite types, so the same code plans tensors from a model, buffers read from a
MiniMalloc CSV, or random buffers in a test.
"""

from __future__ import annotations

import heapq
import math
import time
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from toolchain.errors import PlanError


@dataclass(frozen=True)
class Deadline:
    """When planning work must stop, on the `time.monotonic` clock. Work that finds it passed
    keeps the best result it already has, so one time limit bounds the whole plan."""

    at: float = math.inf

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def passed(self) -> bool:
        return time.monotonic() >= self.at

    def left(self) -> float:
        """Seconds to go, 0 once passed (infinite for `NEVER`)."""
        return max(0.0, self.at - time.monotonic())

    def share(self, fraction: float) -> Deadline:
        """The deadline for a part of the work that may use `fraction` (> 0) of the time left."""
        return Deadline.after(self.left() * fraction)

    def earlier(self, seconds: float) -> Deadline:
        """This deadline moved `seconds` earlier, but never by more than half the time left:
        the time kept back for the work that follows (a verify, say)."""
        return Deadline(self.at - min(seconds, self.left() / 2))

    def allows(self, seconds: float) -> bool:
        """Whether `seconds` more work would still end by this deadline."""
        return time.monotonic() + seconds <= self.at


NEVER = Deadline()
# Buffers a heuristic places between two looks at the clock.
CLOCK_EVERY = 256
# What `verify` costs per buffer, with margin (0.15 s for 100,000 random buffers on a 2-core
# machine): kept back from a planner's deadline so that the verified plan arrives by it.
VERIFY_SECONDS_PER_BUFFER = 4e-6


class OutOfTime(PlanError):
    """A planner reached its deadline before it had a whole plan; callers fall back to a
    faster planner, or complete the buffers it had `placed` (index -> offset) with
    `stacked_above`."""

    def __init__(self, message: str, source: str | None = None,
                 placed: dict[int, int] | None = None):
        super().__init__(message, source)
        self.placed = placed or {}


def stacked_above(buffers: Sequence[Buffer], placed: dict[int, int], alignment: int) -> list[int]:
    """A whole plan from a partial one: the buffers not `placed` go above its top, one on
    another. A planner that places the largest first leaves the smallest to stack."""
    top = max((placed[i] + align_up(buffers[i].size, alignment) for i in placed), default=0)
    offsets = []
    for i, b in enumerate(buffers):
        if i in placed:
            offsets.append(placed[i])
        else:
            offsets.append(top)
            top += align_up(b.size, alignment)
    return offsets


@dataclass(frozen=True)
class Buffer:
    """`size` bytes needed from op `first` to op `last`, both inclusive (so `first <= last`)."""

    id: int
    size: int
    first: int
    last: int


@dataclass(frozen=True)
class Overlap:
    """Buffers `below` and `above` may share bytes when offset(below) + shift <= offset(above).

    `below` is an op's output and `above` one of its inputs that dies at that op: the kernel
    writes the output in increasing address order, always behind its reads of the input, so the
    output may start `shift` bytes (or more) below the input's start and overlap the input's
    bytes above that. shift=0 allows the exact same offset (in-place). `any_offset=True` means
    any overlap at all is safe (a memmove copy or zero-copy alias such as RESHAPE).

    Because the pair shares only that op, their lives must meet there: `below.first ==
    above.last`. Ids are buffer ids, like `Buffer.id`.
    """

    below: int
    above: int
    shift: int = 0
    any_offset: bool = False


@dataclass(frozen=True)
class Placement:
    """Where each buffer lives in one arena; `offsets[i]` belongs to `buffers[i]`.

    `overlaps` are the sharings the plan was allowed (and `verify` accepts). An exact planner
    also reports `bound_bytes`, an arena size it proved no plan can go below, and
    `proven_optimal` (the arena meets that bound); heuristics leave both None.
    """

    planner: str
    alignment: int
    buffers: tuple[Buffer, ...]
    offsets: tuple[int, ...]
    arena_bytes: int
    overlaps: tuple[Overlap, ...] = ()
    proven_optimal: bool | None = None
    bound_bytes: int | None = None

    @classmethod
    def from_offsets(
        cls,
        planner: str,
        alignment: int,
        buffers: Sequence[Buffer],
        offsets: Sequence[int],
        overlaps: Sequence[Overlap] = (),
    ) -> Placement:
        """Wraps offsets from anywhere (a planner, a MiniMalloc solution) with the arena needed."""
        return cls(
            planner=planner,
            alignment=alignment,
            buffers=tuple(buffers),
            offsets=tuple(offsets),
            arena_bytes=arena_end(buffers, offsets, alignment),
            overlaps=tuple(overlaps),
        )

    @property
    def gap_bytes(self) -> int | None:
        """How far the arena may still be from the best possible (0 once proven optimal)."""
        return None if self.bound_bytes is None else self.arena_bytes - self.bound_bytes

    @cached_property
    def _offset_by_id(self) -> dict[int, int]:
        return {
            buffer.id: offset for buffer, offset in zip(self.buffers, self.offsets, strict=True)
        }

    def offset_of(self, buffer_id: int) -> int:
        try:
            return self._offset_by_id[buffer_id]
        except KeyError:
            raise PlanError(f"plan has no buffer with id {buffer_id}") from None


def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def arena_end(buffers: Sequence[Buffer], offsets: Sequence[int], alignment: int) -> int:
    """The first byte past every buffer, counting each buffer's padding up to the alignment."""
    return max(
        (offset + align_up(b.size, alignment) for b, offset in zip(buffers, offsets, strict=True)),
        default=0,
    )


def naive_sum(buffers: Sequence[Buffer], alignment: int) -> int:
    """The arena if nothing shared memory: the ceiling any planner must stay under."""
    return sum(align_up(b.size, alignment) for b in buffers)


def lower_bound(buffers: Sequence[Buffer], alignment: int) -> int:
    """The most bytes live at any one op: no planner can use a smaller arena without overlaps.

    A sweep over life starts and ends; at equal op indices the ends (at `last + 1`) sort before
    the starts because their delta is negative, so a buffer that ends is not counted with one
    that starts at the next op.
    """
    if not buffers:
        return 0
    lives = np.array([(b.first, b.last + 1, b.size) for b in buffers], np.int64)
    size = -(-lives[:, 2] // alignment) * alignment
    times = np.concatenate([lives[:, 0], lives[:, 1]])
    deltas = np.concatenate([size, -size])
    order = np.lexsort((deltas, times))  # by op, the ends (negative) first
    return max(0, int(np.cumsum(deltas[order]).max()))


def lower_bound_with_overlaps(
    buffers: Sequence[Buffer], overlaps: Sequence[Overlap], alignment: int
) -> int:
    """`lower_bound` when declared pairs may share bytes: never above the best arena possible.

    At each op, walk the live buffers in a fixed order (`charge_order`). The bytes in use are
    the sum of what each buffer adds beyond the buffers before it; a buffer shares bytes only
    with its declared partners, at most `pair_saving` with each, so it adds at least its size
    less its savings with earlier partners, and never less than 0. So each pair counts as
    max(size_above + shift, size_below) (max of the sizes for `any_offset`) when it is alone,
    a buffer in several pairs is never discounted below nothing, and any order gives a valid
    bound. The bound is also at least the largest buffer.
    """
    size = [align_up(b.size, alignment) for b in buffers]
    if not overlaps:  # the sweep alone, at once
        return max(lower_bound(buffers, alignment), max(size, default=0))
    return max(max(step_loads(buffers, overlaps, alignment).values(), default=0),
               max(size, default=0))


def step_loads(
    buffers: Sequence[Buffer], overlaps: Sequence[Overlap], alignment: int
) -> dict[int, int]:
    """Op -> the fewest padded bytes the buffers live there can take, the declared overlaps
    counted as `lower_bound_with_overlaps` says; only ops where the load changes are keys, and
    the load holds until the next key."""
    return running_loads(step_deltas(buffers, overlaps, alignment))


def step_deltas(
    buffers: Sequence[Buffer], overlaps: Sequence[Overlap], alignment: int
) -> defaultdict[int, int]:
    """Op -> by how much `step_loads` changes there. Kept apart so that a caller may add
    buffers of one op each to the deltas of a problem it laid out before."""
    check_overlaps(buffers, overlaps)
    by_id = {b.id: b for b in buffers}
    size = {b.id: align_up(b.size, alignment) for b in buffers}
    deltas: dict[int, int] = defaultdict(int)
    for b in buffers:
        deltas[b.first] += size[b.id]
        deltas[b.last + 1] -= size[b.id]
    savings: dict[tuple[int, int], int] = defaultdict(int)  # (later buffer, op) -> with earlier
    for o in overlaps:
        below, above = by_id[o.below], by_id[o.above]
        later = max(below, above, key=charge_order)
        saving = pair_saving(o, size[o.below], size[o.above], alignment)
        savings[later.id, below.first] += max(0, saving)
    for (later, op), saving in savings.items():
        cut = min(size[later], saving)  # The pair is alive together at this op only.
        deltas[op] -= cut
        deltas[op + 1] += cut
    return deltas


def running_loads(deltas: Mapping[int, int]) -> dict[int, int]:
    """The loads `step_deltas` changes by, at each op where it names a change."""
    loads, live = {}, 0
    for op in sorted(deltas):
        live += deltas[op]
        loads[op] = live
    return loads


def charge_order(b: Buffer) -> tuple[int, int, int]:
    """The order in which overlap bounds count buffers: by first op, then last op, then id, so
    a pair's input (which dies at the op) mostly comes before its output (born there)."""
    return (b.first, b.last, b.id)


def pair_saving(overlap: Overlap, below_size: int, above_size: int, alignment: int) -> int:
    """The most padded bytes a declared pair can share (negative if it cannot share any): the
    output starts at least the padded shift below the input, so covers at most below - shift."""
    shift = 0 if overlap.any_offset else align_up(overlap.shift, alignment)
    return min(above_size, below_size - shift)


def overlap_problem(overlap: Overlap, below: Buffer | None, above: Buffer | None) -> str | None:
    """Why `overlap` cannot hold between these buffers (None if it can), duplicates aside."""
    if below is None or above is None:
        return (
            f"overlap names buffer id {overlap.below if below is None else overlap.above}, "
            "which is not planned"
        )
    if overlap.below == overlap.above:
        return f"overlap pairs buffer {overlap.below} with itself"
    if overlap.shift < 0:
        return (
            f"overlap of buffers {overlap.below} and {overlap.above} has negative shift "
            f"{overlap.shift}"
        )
    if below.first != above.last:
        return (
            f"overlap of buffer {overlap.below} below buffer {overlap.above} needs "
            f"{overlap.above}'s life to end at the op where {overlap.below}'s starts, but they "
            f"are [{above.first}, {above.last}] and [{below.first}, {below.last}]"
        )
    return None


def check_overlaps(buffers: Sequence[Buffer], overlaps: Sequence[Overlap]) -> None:
    """Raises PlanError unless every overlap holds (`overlap_problem`) and no pair of buffers
    is declared twice, in either order: one rule per pair keeps the forbidden ranges simple."""
    by_id = {b.id: b for b in buffers}
    pairs: set[frozenset[int]] = set()
    for o in overlaps:
        problem = overlap_problem(o, by_id.get(o.below), by_id.get(o.above))
        if problem:
            raise PlanError(problem)
        pair = frozenset((o.below, o.above))
        if pair in pairs:
            raise PlanError(f"overlap of buffers {o.below} and {o.above} is declared twice")
        pairs.add(pair)


@dataclass(frozen=True)
class Window:
    """Where a buffer may start beside a placed partner at offset o: anywhere but strictly
    between o + low and o + high. `snug` is the allowed start that overlaps the partner most.

    For buffers that must not share, low = -size and high = the placed buffer's size; a
    declared overlap narrows that range on one side (which side depends on which of the pair
    is placed first) or, for `any_offset`, closes it.
    """

    low: int
    high: int
    snug: int


def overlap_windows(
    sizes: Sequence[int], overlaps: Sequence[Overlap], alignment: int
) -> dict[tuple[int, int], Window]:
    """(buffer, placed partner) -> Window, both ways round for each declared pair; `sizes` are
    padded and indexed by buffer id, and shifts are padded too (offsets are aligned, so
    offset(below) + shift <= offset(above) holds exactly when it holds for the padded shift)."""
    windows = {}
    for o in overlaps:
        below, above = sizes[o.below], sizes[o.above]
        if o.any_offset:
            windows[o.below, o.above] = windows[o.above, o.below] = Window(0, 0, 0)
            continue
        shift = align_up(o.shift, alignment)
        low = max(-below, -shift)  # below may start at offset(above) - shift or lower
        windows[o.below, o.above] = Window(low, above, low)
        high = min(below, shift)  # above may start at offset(below) + shift or higher
        windows[o.above, o.below] = Window(-above, high, high)
    return windows


class Planner(ABC):
    """TFLite Micro's MicroMemoryPlanner interface: add buffers (and the overlaps allowed between
    them), plan, then ask for the arena size and each offset. Subclasses only decide offsets, in
    `_place`.

    Sizes are padded up to `alignment` before placing, so every offset a planner derives from
    other buffers' ends is aligned too.
    """

    name: ClassVar[str]

    def __init__(
        self, alignment: int = 16, *, deadline: Deadline = NEVER, **options: object
    ) -> None:
        if options:
            raise PlanError(f"planner {self.name!r} has no option {', '.join(sorted(options))}")
        if alignment < 1:
            raise PlanError(f"alignment must be a positive number of bytes, not {alignment}")
        self.alignment = alignment
        self.deadline = deadline  # planners that may run long give up or stop early there
        self._buffers: list[Buffer] = []
        self._overlaps: list[Overlap] = []
        self._paired: set[frozenset[int]] = set()
        self._offsets: list[int] | None = None

    def add_buffer(self, size: int, first: int, last: int) -> int:
        """Registers a buffer and returns its id, which is its position in adding order."""
        if size < 0:
            raise PlanError(f"buffer size must not be negative, got {size}")
        if first > last:
            raise PlanError(f"buffer life [{first}, {last}] ends before it starts")
        buffer_id = len(self._buffers)
        self._buffers.append(Buffer(buffer_id, size, first, last))
        self._offsets = None
        return buffer_id

    def add_overlap(self, below: int, above: int, shift: int = 0, any_offset: bool = False) -> None:
        """Lets two added buffers share bytes as `Overlap(below, above, shift, any_offset)` says.

        Planners that ignore overlaps stay correct: sharing is allowed, never required.
        """
        overlap = Overlap(below, above, shift, any_offset)
        known = range(len(self._buffers))
        problem = overlap_problem(
            overlap, *(self._buffers[i] if i in known else None for i in (below, above))
        )
        if problem:
            raise PlanError(problem)
        pair = frozenset((below, above))
        if pair in self._paired:
            raise PlanError(f"overlap of buffers {below} and {above} is declared twice")
        self._paired.add(pair)
        self._overlaps.append(overlap)
        self._offsets = None

    def plan(self) -> None:
        """Computes the offsets now; asking for a size or an offset would compute them anyway."""
        self._planned_offsets()

    def arena_bytes(self) -> int:
        return arena_end(self._buffers, self._planned_offsets(), self.alignment)

    def offset(self, buffer_id: int) -> int:
        offsets = self._planned_offsets()
        if not 0 <= buffer_id < len(offsets):
            raise PlanError(f"no buffer with id {buffer_id}; {len(offsets)} were added")
        return offsets[buffer_id]

    def result(self) -> Placement:
        return Placement.from_offsets(
            self.name, self.alignment, self._buffers, self._planned_offsets(), self._overlaps
        )

    def _planned_offsets(self) -> list[int]:
        """Plans on first use after any change, as TFLite Micro does, so answers are never stale."""
        if self._offsets is None:
            self._offsets = self._place(list(self._buffers), list(self._overlaps))
        return self._offsets

    @abstractmethod
    def _place(self, buffers: list[Buffer], overlaps: list[Overlap]) -> list[int]:
        """Returns one aligned offset per buffer, in the same order; `buffers[i].id == i`, and
        `overlaps` are valid, name buffers by that id and pair no two buffers twice."""


def preorder(
    items: list[int], key: Callable[[int], tuple[int, ...]], before: list[tuple[int, int]]
) -> tuple[list[int], bool]:
    """`items` by `key`, except that each (x, y) in `before` puts x ahead of y; returns the
    order and whether every such constraint held (only a cycle can break one)."""
    waiting = {i: 0 for i in items}
    after: dict[int, list[int]] = {i: [] for i in items}
    for x, y in before:
        after[x].append(y)
        waiting[y] += 1
    ready = [(key(i), i) for i in items if not waiting[i]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for j in after[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, (key(j), j))
    if len(order) == len(items):
        return order, True
    placed = set(order)
    return order + sorted((i for i in items if i not in placed), key=key), False
