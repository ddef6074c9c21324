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

from bisect import bisect_left, bisect_right
from collections.abc import Callable

from toolchain.errors import PlanError
from toolchain.planners.base import Buffer, Overlap, Planner, align_up, overlap_windows


class FreeList:
    """The free blocks below the arena's top, sorted by offset and never adjacent to each other
    (adjacent blocks merge as they are returned), so a fit is found by one scan."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.sizes: list[int] = []

    def give_back(self, start: int, size: int) -> None:
        """Returns a block, merging it with the free blocks that touch it on either side."""
        if size == 0:
            return
        i = bisect_left(self.starts, start)
        if i < len(self.starts) and start + size == self.starts[i]:
            size += self.sizes.pop(i)
            del self.starts[i]
        if i > 0 and self.starts[i - 1] + self.sizes[i - 1] == start:
            self.sizes[i - 1] += size
        else:
            self.starts.insert(i, start)
            self.sizes.insert(i, size)

    def reaches(self, top: int) -> bool:
        """Whether the highest free block ends at `top`, so a buffer placed there can overhang."""
        return bool(self.starts) and self.starts[-1] + self.sizes[-1] == top

    def bytes_in(self, start: int, end: int) -> int:
        """How many bytes of [start, end) are free."""
        i = max(bisect_right(self.starts, start) - 1, 0)
        free = 0
        for block_start, block_size in zip(self.starts[i:], self.sizes[i:]):
            if block_start >= end:
                break
            free += max(0, min(end, block_start + block_size) - max(start, block_start))
        return free

    def take_range(self, start: int, end: int) -> None:
        """Removes [start, end) from the free blocks wherever they meet it."""
        i = max(bisect_right(self.starts, start) - 1, 0)
        while i < len(self.starts) and self.starts[i] < end:
            block_start, block_end = self.starts[i], self.starts[i] + self.sizes[i]
            if block_end <= start:
                i += 1
                continue
            kept = [(a, b) for a, b in ((block_start, start), (end, block_end)) if a < b]
            self.starts[i : i + 1] = [a for a, _ in kept]
            self.sizes[i : i + 1] = [b - a for a, b in kept]
            i += len(kept)

    def take(self, i: int, size: int) -> int:
        """Cuts `size` bytes from the front of block `i` and returns their offset."""
        start = self.starts[i]
        if self.sizes[i] == size:
            del self.starts[i], self.sizes[i]
        else:
            self.starts[i] += size
            self.sizes[i] -= size
        return start


def first_fit(free: FreeList, size: int) -> int | None:
    """The lowest block that fits: cheap, and keeps the arena's low end packed."""
    return next((i for i, block in enumerate(free.sizes) if block >= size), None)


def best_fit(free: FreeList, size: int) -> int | None:
    """The smallest block that fits (lowest on ties): leaves big blocks for big buffers."""
    fitting = [(block, free.starts[i], i) for i, block in enumerate(free.sizes) if block >= size]
    return min(fitting)[2] if fitting else None


FITS: dict[str, Callable[[FreeList, int], int | None]] = {"first": first_fit, "best": best_fit}


class FreeListPlanner(Planner):
    """Walks the ops in order; at each op frees the blocks of buffers that died before it, then
    places the buffers born at it, larger padded size first (ties by id), into a free block
    chosen by `fit` or else at the top of the arena, or at the snug spot beside a placed overlap
    partner when that is usable and no worse."""

    name = "freelist"

    def __init__(self, alignment: int = 16, *, fit: str = "first", **options: object) -> None:
        super().__init__(alignment, **options)
        if fit not in FITS:
            raise PlanError(
                f"unknown fit {fit!r} for planner 'freelist'; choose one of {', '.join(FITS)}"
            )
        self.fit = fit

    def _place(self, buffers: list[Buffer], overlaps: list[Overlap]) -> list[int]:
        choose_block = FITS[self.fit]
        sizes = [align_up(b.size, self.alignment) for b in buffers]
        windows = overlap_windows(sizes, overlaps, self.alignment)
        partners: dict[int, list[int]] = {}
        for new, placed in windows:
            partners.setdefault(new, []).append(placed)
        # Only ops where something is born matter: a free at an op where nothing is placed
        # changes nothing before the next birth, so frees are applied lazily just before it.
        births = sorted(range(len(buffers)), key=lambda i: (buffers[i].first, -sizes[i], i))
        deaths = sorted(range(len(buffers)), key=lambda i: buffers[i].last)
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

        free = FreeList()
        top = 0
        dead = 0
        for i in births:
            op = buffers[i].first
            while dead < len(deaths) and buffers[deaths[dead]].last < op:
                for start, end in owned[deaths[dead]]:
                    free.give_back(start, end - start)
                dead += 1
            size = sizes[i]
            block = choose_block(free, size)
            if block is not None:
                fit = free.starts[block]
            elif free.reaches(top):
                fit = free.starts[-1]  # grow the free block that touches the top
            else:
                fit = top
            # A partner already placed is alive now: the pair's lives meet at this op. Its snug
            # spot wins if it shares bytes with it and tops out no higher than the fit would.
            snug = (
                (p, offsets[p] + windows[i, p].snug) for p in partners.get(i, ()) if p in offsets
            )
            spot = next(
                (
                    (p, at)
                    for p, at in snug
                    if at >= 0
                    and at < offsets[p] + sizes[p]
                    and offsets[p] < at + size
                    and at + size <= max(top, fit + size)
                    and usable(free, top, alone(p, op), at, at + size)
                ),
                None,
            )
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
                elif free.reaches(top):
                    free.take(len(free.sizes) - 1, free.sizes[-1])
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
