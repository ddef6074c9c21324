"""TFLite Micro's GreedyMemoryPlanner: biggest buffers first, each at the lowest offset free for
its whole life.

Placing big buffers first leaves small ones to fill the gaps between them; this is the planner
TFLite Micro runs on the device, so matching it lets us compare arenas like for like.
"""

from __future__ import annotations

import numpy as np

from toolchain.planners.base import Buffer, Planner, align_up


class GreedyPlanner(Planner):
    """Sorts by padded size descending (ties: first op, then id) and gives each buffer the lowest
    offset that overlaps no placed buffer whose life overlaps its own."""

    name = "greedy"

    def _place(self, buffers: list[Buffer]) -> list[int]:
        sizes = [align_up(b.size, self.alignment) for b in buffers]
        order = sorted(range(len(buffers)), key=lambda i: (-sizes[i], buffers[i].first, i))
        offsets = [0] * len(buffers)
        # Placed buffers as numpy columns kept sorted by offset, so finding the ones alive at the
        # same time as the next buffer is one vectorized comparison, not a Python loop, and they
        # come out already in the order the gap search walks them.
        placed = np.empty((4, len(buffers)), dtype=np.int64)
        placed_first, placed_last, placed_start, placed_end = placed
        count = 0
        for i in order:
            size = sizes[i]
            if size == 0:
                continue  # Occupies no bytes, so offset 0 collides with nothing.
            b = buffers[i]
            alive = (placed_first[:count] <= b.last) & (placed_last[:count] >= b.first)
            offset = lowest_gap(placed_start[:count][alive], placed_end[:count][alive], size)
            at = int(np.searchsorted(placed_start[:count], offset))
            placed[:, at + 1 : count + 1] = placed[:, at:count]
            placed[:, at] = (b.first, b.last, offset, offset + size)
            offsets[i] = offset
            count += 1
        return offsets


def lowest_gap(starts: np.ndarray, ends: np.ndarray, size: int) -> int:
    """The lowest offset where `size` bytes overlap none of the blocks [starts, ends), which
    are sorted by start.

    TFLite Micro's gap search, vectorized: walking the blocks by offset, the candidate before
    each block is the highest end seen so far; the first candidate whose gap to the next block
    holds `size` wins, else the buffer goes above every block.
    """
    if starts.size == 0:
        return 0
    candidates = np.concatenate(([0], np.maximum.accumulate(ends)))
    fits = starts - candidates[:-1] >= size
    return int(candidates[fits.argmax() if fits.any() else -1])
