"""TFLite Micro's GreedyMemoryPlanner: biggest buffers first, each at the lowest offset free for
its whole life.

Placing big buffers first leaves small ones to fill the gaps between them; this is the planner
TFLite Micro runs on the device, so matching it lets us compare arenas like for like.
"""

from __future__ import annotations

import numpy as np

from toolchain.planners.base import Buffer, Overlap, Planner, align_up, overlap_windows


class GreedyPlanner(Planner):
    """Sorts by padded size descending (ties: first op, then id) and gives each buffer the lowest
    offset outside the forbidden range of every placed buffer whose life overlaps its own.

    Beside a placed buffer at o with padded size s, a buffer of padded size z may not start
    strictly between o - z and o + s (they would share a byte); a declared overlap narrows that
    range to the pair's `Window`, so in-place and shifted outputs land on their inputs.
    """

    name = "greedy"

    def _place(self, buffers: list[Buffer], overlaps: list[Overlap]) -> list[int]:
        sizes = [align_up(b.size, self.alignment) for b in buffers]
        windows = overlap_windows(sizes, overlaps, self.alignment)
        partners: dict[int, list[int]] = {}
        for new, placed in windows:
            partners.setdefault(new, []).append(placed)
        order = sorted(range(len(buffers)), key=lambda i: (-sizes[i], buffers[i].first, i))
        offsets = [0] * len(buffers)
        # Placed buffers as numpy columns kept sorted by offset, so finding the ones alive at the
        # same time as the next buffer is one vectorized comparison, not a Python loop, and they
        # come out already in the order the gap search walks them.
        placed = np.empty((5, len(buffers)), dtype=np.int64)
        placed_first, placed_last, placed_start, placed_end, placed_id = placed
        count = 0
        for i in order:
            size = sizes[i]
            if size == 0:
                continue  # Occupies no bytes, so offset 0 collides with nothing.
            b = buffers[i]
            alive = (placed_first[:count] <= b.last) & (placed_last[:count] >= b.first)
            starts = placed_start[:count][alive]
            lows = starts - size
            highs = placed_end[:count][alive]
            if i in partners:
                ids = placed_id[:count][alive]
                for partner in partners[i]:
                    for at in np.flatnonzero(ids == partner):
                        lows[at] = starts[at] + windows[i, partner].low
                        highs[at] = starts[at] + windows[i, partner].high
                by_low = np.argsort(lows, kind="stable")
                lows, highs = lows[by_low], highs[by_low]
            offset = lowest_allowed(lows, highs)
            at = int(np.searchsorted(placed_start[:count], offset))
            placed[:, at + 1 : count + 1] = placed[:, at:count]
            placed[:, at] = (b.first, b.last, offset, offset + size, i)
            offsets[i] = offset
            count += 1
        return offsets


def lowest_allowed(lows: np.ndarray, highs: np.ndarray) -> int:
    """The lowest offset x >= 0 with x <= low or x >= high for every forbidden range
    (low, high), the ranges sorted by low.

    TFLite Micro's gap search, vectorized: walking the ranges by low, the candidate before each
    range is the highest high seen so far (or 0); the first candidate not past the next range's
    low wins, else the buffer goes above every range.
    """
    candidates = np.maximum.accumulate(np.concatenate(([0], highs)))
    fits = candidates[:-1] <= lows
    return int(candidates[fits.argmax() if fits.any() else -1])
