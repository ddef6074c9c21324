"""The free-list method of patent CN114201298A: replay the ops in order like a heap allocator.

Unlike the greedy planner it never looks ahead: at each op it frees what died and allocates what
is born, as a runtime allocator with coalescing would, but decided offline.

Declared overlaps extend the method the way an allocator with in-place support would: a buffer
born beside a live partner may take the snug spot (`Window.snug`: the dying input's offset
minus the shift for an output, plus it for an input) instead of the usual fit, when that spot
shares bytes with the partner, every byte there is free, still the partner's alone or above
the top, and it raises the top no more than the fit would. Bytes a pair shares are freed by
the one that dies last (the output), the rest of each block by its own buffer.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator
from itertools import compress, count
from operator import itemgetter

from toolchain.errors import PlanError
from toolchain.planners.base import (
    CLOCK_EVERY,
    Buffer,
    Overlap,
    Planner,
    align_up,
    overlap_windows,
)

SECOND = itemgetter(1)


class Runs:
    """Pairs kept sorted, in runs of at most 2 * RUN, each run with the largest second field of
    its pairs: adding or removing one moves a run's entries rather than all of them, and the
    search for the first pair whose second field is large enough skips whole runs."""

    RUN = 64

    def __init__(self) -> None:
        self.runs: list[list[tuple[int, int]]] = []
        self.firsts: list[tuple[int, int]] = []  # each run's first pair
        self.most: list[int] = []  # each run's largest second field

    def _run(self, pair: tuple[int, int]) -> int:
        """The run that holds `pair`, or would: the last whose first pair is not above it."""
        return max(bisect_right(self.firsts, pair) - 1, 0)

    def add(self, pair: tuple[int, int]) -> None:
        if not self.runs:
            self.runs, self.firsts, self.most = [[pair]], [pair], [pair[1]]
            return
        r = self._run(pair)
        run = self.runs[r]
        insort(run, pair)
        self.firsts[r] = run[0]
        if pair[1] > self.most[r]:
            self.most[r] = pair[1]
        if len(run) > 2 * self.RUN:
            halves = [run[: self.RUN], run[self.RUN :]]
            self.runs[r : r + 1] = halves
            self.firsts[r : r + 1] = [half[0] for half in halves]
            self.most[r : r + 1] = [max(half, key=SECOND)[1] for half in halves]

    def remove(self, pair: tuple[int, int]) -> None:
        r = self._run(pair)
        run = self.runs[r]
        del run[bisect_left(run, pair)]
        if not run:
            del self.runs[r], self.firsts[r], self.most[r]
            return
        self.firsts[r] = run[0]
        if pair[1] == self.most[r]:
            self.most[r] = max(run, key=SECOND)[1]

    def last(self) -> tuple[int, int] | None:
        return self.runs[-1][-1] if self.runs else None

    def before(self, pair: tuple[int, int]) -> tuple[int, int] | None:
        """The last pair below `pair`, if any."""
        r = bisect_left(self.firsts, pair) - 1
        if r < 0:
            return None
        run = self.runs[r]
        return run[bisect_left(run, pair) - 1]

    def after(self, pair: tuple[int, int]) -> tuple[int, int] | None:
        """The first pair not below `pair`, if any."""
        if not self.runs:
            return None
        r = self._run(pair)
        run = self.runs[r]
        i = bisect_left(run, pair)
        if i < len(run):
            return run[i]
        return self.runs[r + 1][0] if r + 1 < len(self.runs) else None

    def ascending_from(self, pair: tuple[int, int]) -> Iterator[tuple[int, int]]:
        """The pairs from `pair` on, ascending (the set must not change meanwhile)."""
        if not self.runs:
            return
        r = self._run(pair)
        i = bisect_left(self.runs[r], pair)
        for run in self.runs[r:]:
            yield from run[i:]
            i = 0

    def first_with(self, least: int) -> tuple[int, int] | None:
        """The first pair whose second field is at least `least` (both scans run in C)."""
        r = next(compress(count(), map(least.__le__, self.most)), None)
        if r is None:
            return None
        run = self.runs[r]
        return next(compress(run, map(least.__le__, map(SECOND, run))))


class FreeList:
    """The free blocks below the arena's top, sorted by offset and never adjacent to each other
    (adjacent blocks merge as they are returned), as (start, size) pairs and, for the best
    fit, as (size, start) too: no operation looks at every block, which made a fragmented
    arena quadratic."""

    def __init__(self, fit: str) -> None:
        self.fit = fit
        self.by_start = Runs()
        self.by_size = Runs()  # kept for the best fit only

    def _add(self, start: int, size: int) -> None:
        self.by_start.add((start, size))
        if self.fit == "best":
            self.by_size.add((size, start))

    def _remove(self, start: int, size: int) -> None:
        self.by_start.remove((start, size))
        if self.fit == "best":
            self.by_size.remove((size, start))

    def fitting(self, size: int) -> tuple[int, int] | None:
        """The block (start, size) a buffer of `size` bytes goes into, if any fits. First fit:
        the lowest, which is cheap and keeps the arena's low end packed; best fit: the
        smallest (lowest on ties), which leaves big blocks for big buffers."""
        if self.fit == "first":
            return self.by_start.first_with(size)
        block = self.by_size.after((size, 0))
        return None if block is None else (block[1], block[0])

    def give_back(self, start: int, size: int) -> None:
        """Returns a block, merging it with the free blocks that touch it on either side."""
        if size == 0:
            return
        after = self.by_start.after((start, 0))
        if after is not None and start + size == after[0]:
            self._remove(*after)
            size += after[1]
        before = self.by_start.before((start, 0))
        if before is not None and before[0] + before[1] == start:
            self._remove(*before)
            start, size = before[0], before[1] + size
        self._add(start, size)

    def top_block(self, top: int) -> tuple[int, int] | None:
        """The highest free block if it ends at `top`, so that a buffer placed there can
        overhang."""
        last = self.by_start.last()
        return last if last is not None and last[0] + last[1] == top else None

    def _meeting(self, start: int, end: int) -> list[tuple[int, int]]:
        """The blocks that hold any byte of [start, end)."""
        before = self.by_start.before((start + 1, 0))  # the block starting at or below start
        meeting = []
        for block_start, block_size in self.by_start.ascending_from(before or (start, 0)):
            if block_start >= end:
                break
            if block_start + block_size > start:
                meeting.append((block_start, block_size))
        return meeting

    def bytes_in(self, start: int, end: int) -> int:
        """How many bytes of [start, end) are free."""
        return sum(
            min(end, block_start + block_size) - max(start, block_start)
            for block_start, block_size in self._meeting(start, end)
        )

    def take_range(self, start: int, end: int) -> None:
        """Removes [start, end) from the free blocks wherever they meet it."""
        for block_start, block_size in self._meeting(start, end):
            self._remove(block_start, block_size)
            block_end = block_start + block_size
            for a, b in ((block_start, start), (end, block_end)):
                if a < b:
                    self._add(a, b - a)

    def take(self, block: tuple[int, int], size: int) -> None:
        """Cuts `size` bytes from the front of free `block` (start, size)."""
        start, block_size = block
        self._remove(start, block_size)
        if block_size > size:
            self._add(start + size, block_size - size)


FITS = ("first", "best")


class FreeListPlanner(Planner):
    """Walks the ops in order; at each op frees the blocks of buffers that died before it, then
    places the buffers born at it, larger padded size first (ties by id), into a free block
    chosen by `fit` or else at the top of the arena, or at the snug spot beside a placed overlap
    partner when that is usable and no worse.

    It never gives up: at its deadline the buffers not yet placed go above the arena's top,
    one on another, so there is a plan by the deadline (as good as the time allowed) on any
    input. Up to CLOCK_EVERY buffers are always placed properly."""

    name = "freelist"

    def __init__(self, alignment: int = 16, *, fit: str = "first", **options: object) -> None:
        super().__init__(alignment, **options)
        if fit not in FITS:
            raise PlanError(
                f"unknown fit {fit!r} for planner 'freelist'; choose one of {', '.join(FITS)}"
            )
        self.fit = fit

    def _place(self, buffers: list[Buffer], overlaps: list[Overlap]) -> list[int]:
        sizes = [align_up(b.size, self.alignment) for b in buffers]
        windows = overlap_windows(sizes, overlaps, self.alignment)
        partners: dict[int, list[int]] = {}
        for new, placed in windows:
            partners.setdefault(new, []).append(placed)
        # Only ops where something is born matter: a free at an op where nothing is placed
        # changes nothing before the next birth, so frees are applied lazily just before it.
        firsts = [b.first for b in buffers]
        births = sorted(range(len(buffers)), key=lambda i: (firsts[i], -sizes[i], i))
        deaths = sorted(range(len(buffers)), key=[b.last for b in buffers].__getitem__)
        ends = [buffers[i].last for i in deaths] + [float("inf")]  # the op each death follows
        offsets: dict[int, int] = {}
        # The byte ranges each placed buffer frees when it dies: its block, less bytes it shares
        # with a partner that dies later (the pair's `below`, which frees them in turn).
        owned: list[list[tuple[int, int]]] = [[] for _ in buffers]
        below_of = {(o.below, o.above) for o in overlaps}

        def alone(p: int, op: int) -> list[tuple[int, int]]:
            """The bytes of partner p's block that no other buffer alive at `op` uses."""
            block = [(offsets[p], offsets[p] + sizes[p])]
            for r in partners[p]:
                if r in offsets and buffers[r].last >= op:
                    block = without(block, offsets[r], offsets[r] + sizes[r])
            return block

        def snug_spot(i: int, op: int, fit: int) -> tuple[int, int] | None:
            """(partner, offset) of the first placed partner's snug spot that shares bytes with
            it, is usable and tops out no higher than the fit would; the pair's lives meet at
            this op, since the partner is placed and so alive now."""
            size = sizes[i]
            for p in partners[i]:
                if p not in offsets:
                    continue
                at = offsets[p] + windows[i, p].snug
                if (
                    at >= 0
                    and at < offsets[p] + sizes[p]
                    and offsets[p] < at + size
                    and at + size <= max(top, fit + size)
                    and usable(free, top, alone(p, op), at, at + size)
                ):
                    return p, at
            return None

        free = FreeList(self.fit)
        top = 0
        dead = 0
        for placed, i in enumerate(births):
            if placed and not placed % CLOCK_EVERY and self.deadline.passed():
                for late in births[placed:]:  # out of time: the rest go above, one on another
                    offsets[late] = top
                    top += sizes[late]
                break
            op = firsts[i]
            while ends[dead] < op:
                for start, end in owned[deaths[dead]]:
                    free.give_back(start, end - start)
                dead += 1
            size = sizes[i]
            block = free.fitting(size)
            top_block = free.top_block(top) if block is None else None
            if block is not None:
                fit = block[0]
            elif top_block is not None:
                fit = top_block[0]  # grow the free block that touches the top
            else:
                fit = top
            spot = snug_spot(i, op, fit) if i in partners else None
            if spot is not None:
                partner, offset = spot
                free.take_range(offset, offset + size)
                owned[i] = [(offset, offset + size)]
                if (i, partner) in below_of:
                    owned[partner] = without(owned[partner], offset, offset + size)
                else:
                    owned[i] = without(
                        owned[i], offsets[partner], offsets[partner] + sizes[partner]
                    )
            else:
                offset = fit
                if block is not None:
                    free.take(block, size)
                elif top_block is not None:
                    free.take(top_block, top_block[1])
                owned[i] = [(offset, offset + size)]
            offsets[i] = offset
            top = max(top, offset + size)
        return [offsets[i] for i in range(len(buffers))]


def usable(free: FreeList, top: int, partner: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether every byte of [start, end) is free, the partner's alone or above the top (three
    disjoint sets, so counting the bytes in each is enough)."""
    bytes_there = free.bytes_in(start, end) + max(0, end - max(start, top))
    bytes_there += sum(max(0, min(end, b) - max(start, a)) for a, b in partner)
    return bytes_there == end - start


def without(ranges: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """`ranges` less the bytes [start, end)."""
    return [
        (a, b) for lo, hi in ranges for a, b in ((lo, min(hi, start)), (max(lo, end), hi)) if a < b
    ]
