"""The free-list method of patent CN114201298A: replay the ops in order like a heap allocator.

Unlike the greedy planner it never looks ahead: at each op it frees what died and allocates what
is born, as a runtime allocator with coalescing would, but decided offline.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from toolchain.errors import PlanError
from toolchain.planners.base import Buffer, Planner, align_up


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
    chosen by `fit` or else at the top of the arena."""

    name = "freelist"

    def __init__(self, alignment: int = 16, *, fit: str = "first", **options: object) -> None:
        super().__init__(alignment, **options)
        if fit not in FITS:
            raise PlanError(
                f"unknown fit {fit!r} for planner 'freelist'; choose one of {', '.join(FITS)}"
            )
        self.fit = fit

    def _place(self, buffers: list[Buffer]) -> list[int]:
        choose_block = FITS[self.fit]
        sizes = [align_up(b.size, self.alignment) for b in buffers]
        # Only ops where something is born matter: a free at an op where nothing is placed
        # changes nothing before the next birth, so frees are applied lazily just before it.
        births = sorted(range(len(buffers)), key=lambda i: (buffers[i].first, -sizes[i], i))
        deaths = sorted(range(len(buffers)), key=lambda i: buffers[i].last)
        offsets = [0] * len(buffers)
        free = FreeList()
        top = 0
        dead = 0
        for i in births:
            op = buffers[i].first
            while dead < len(deaths) and buffers[deaths[dead]].last < op:
                j = deaths[dead]
                free.give_back(offsets[j], sizes[j])
                dead += 1
            block = choose_block(free, sizes[i])
            if block is not None:
                offsets[i] = free.take(block, sizes[i])
            elif free.reaches(top):
                # Grow the free block that touches the top instead of leaving it as a hole.
                offsets[i] = free.take(len(free.sizes) - 1, free.sizes[-1])
                top = offsets[i] + sizes[i]
            else:
                offsets[i] = top
                top += sizes[i]
        return offsets
