"""Greedy by size, TFLite Micro's method: biggest buffers first, each at the lowest offset free
for its whole life.

Placing big buffers first leaves small ones to fill the gaps between them. TFLite Micro runs
this method on the device; we break ties between equal sizes by first op and honour declared
overlaps, which often gives a smaller arena. `tflm.py` breaks ties as TFLM does, to show its
own plan.

Without declared overlaps the placing loop is compiled (`greedy.c`, built with the system `cc`
like the exact planner's search): the same offsets, found from the bytes taken in blocks of
time rather than from every placed buffer alive beside the new one. Without a compiler (or
with ARENAC_PURE_PYTHON=1), and with overlaps, the loop below places them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import numpy as np

from toolchain.planners.base import (
    CLOCK_EVERY,
    Buffer,
    Deadline,
    OutOfTime,
    Overlap,
    Planner,
    Window,
    align_up,
    overlap_windows,
)
from toolchain.planners.compiled import I64, entry_point, pointer, ranked_lives

SOURCE = Path(__file__).with_name("greedy.c")
# The compiled loop's blocks of time, as a share of the mean life: fewer blocks to look at
# against fewer partial lives in each (0.25 was the fastest on `make bench`'s random buffers).
BLOCK_SHARE = 0.25
# Steps of work after which the greedy planner gives up (see GreedyPlanner), far above what any
# model's lives need.
WORK = 100_000_000


class GreedyPlanner(Planner):
    """Sorts by padded size descending (ties: first op, then id) and gives each buffer the lowest
    offset outside the forbidden range of every placed buffer whose life overlaps its own.

    Beside a placed buffer at o with padded size s, a buffer of padded size z may not start
    strictly between o - z and o + s (they would share a byte); a declared overlap narrows that
    range to the pair's `Window`, so in-place and shifted outputs land on their inputs.

    The search for the lowest offset passes every gap too small below it, and there are more
    of those the more buffers are alive at once: with 2,500 (100,000 random buffers) the
    Python loop needs some 20 s, the compiled one a tenth of that. Either raises OutOfTime
    once it has done `WORK` steps (the Python loop: placed buffers looked at; the compiled
    one: runs, members and lists looked at), so the same input gives up the same way on any
    machine, or at a caller's deadline; callers fall back to the free list.
    """

    name = "greedy"

    def _place(self, buffers: list[Buffer], overlaps: list[Overlap]) -> list[int]:
        if self.deadline.passed():  # before the setup, which takes a while on large inputs
            raise OutOfTime(f"the greedy planner placed 0 of {len(buffers)} buffers in its time")
        sizes = [align_up(b.size, self.alignment) for b in buffers]
        windows = overlap_windows(sizes, overlaps, self.alignment)
        order = self._order(buffers, sizes)
        core = _core()
        if not windows and core is not None:
            return self._place_compiled(core, buffers, sizes, order)
        return fill(buffers, sizes, windows, order, [0] * len(buffers), (), self.deadline)

    def _order(self, buffers: list[Buffer], sizes: list[int]) -> list[int]:
        """The order buffers are placed in: larger padded size first, then earlier first op."""
        return sorted(range(len(buffers)), key=lambda i: (-sizes[i], buffers[i].first, i))

    def _place_compiled(self, core: ctypes.CDLL, buffers: list[Buffer], sizes: list[int],
                        order: list[int]) -> list[int]:
        firsts, lasts = ranked_lives(buffers)
        block = max(1, int(BLOCK_SHARE * float(np.mean(lasts - firsts + 1)))) if buffers else 1
        offsets = np.zeros(len(buffers), dtype=np.int64)
        arrays = (np.array(sizes, dtype=np.int64), firsts, lasts, np.array(order, dtype=np.int64))
        placed = core.arenac_greedy(len(buffers), *(pointer(a) for a in arrays), block, WORK,
                                    self.deadline.at, pointer(offsets))
        if placed < 0:
            raise MemoryError("the compiled greedy planner ran out of memory")
        if placed < len(buffers):
            raise OutOfTime(
                f"the greedy planner placed {placed} of {len(buffers)} buffers in its budget",
                placed={i: int(offsets[i]) for i in order[:placed]})
        return offsets.tolist()


def fill(buffers: list[Buffer], sizes: list[int], windows: dict[tuple[int, int], Window],
         order: list[int], offsets: list[int], placed: Iterable[int],
         deadline: Deadline) -> list[int]:
    """The offsets with each buffer of `order` in turn at the lowest offset outside the
    forbidden range (`windows` narrowing it for declared overlaps) of every buffer alive beside
    it that is `placed` already (at its offset) or came before it in `order`."""
    partners: dict[int, list[int]] = {}
    for new, partner in windows:
        partners.setdefault(new, []).append(partner)
    offsets = list(offsets)
    lives = LiveIndex(buffers)
    for i in placed:
        if sizes[i]:
            lives.place(i, offsets[i], offsets[i] + sizes[i])
    work = 0
    for count, i in enumerate(order):
        if work > WORK or not count % CLOCK_EVERY and deadline.passed():
            raise OutOfTime(
                f"the greedy planner placed {count} of {len(buffers)} buffers in its budget",
                placed={j: offsets[j] for j in (*placed, *order[:count])})
        size = sizes[i]
        if size == 0:
            continue  # Occupies no bytes, so offset 0 collides with nothing.
        b = buffers[i]
        ids, starts, highs = lives.placed_during(b.first, b.last)
        work += 1 + len(ids)
        lows = starts - size
        for partner in partners.get(i, ()):
            for at in np.flatnonzero(ids == partner):
                lows[at] = starts[at] + windows[i, partner].low
                highs[at] = starts[at] + windows[i, partner].high
        by_low = np.argsort(lows, kind="stable")
        offset = lowest_allowed(lows[by_low], highs[by_low])
        lives.place(i, offset, offset + size)
        offsets[i] = offset
    return offsets


@cache
def _core() -> ctypes.CDLL | None:
    return entry_point(SOURCE, "arenac_greedy", [ctypes.c_int64, I64, I64, I64, I64,
                                                 ctypes.c_int64, ctypes.c_int64,
                                                 ctypes.c_double, I64])


class LiveIndex:
    """The placed buffers, found by life: buffers sorted by first op, in blocks that remember the
    latest op any placed member lives to. A block whose placed members all die before a life
    starts is skipped whole, so finding the placed buffers alive during a life costs about the
    blocks up to its last op plus the members of the blocks that may hold one, not one look at
    every placed buffer (which made 100,000 buffers quadratic)."""

    BLOCK = 128

    def __init__(self, buffers: list[Buffer]) -> None:
        by_first = sorted(range(len(buffers)), key=lambda i: buffers[i].first)
        self.ids = np.array(by_first, dtype=np.int64)
        self.firsts = np.array([buffers[i].first for i in by_first], dtype=np.int64)
        self.lasts = np.array([buffers[i].last for i in by_first], dtype=np.int64)
        self.rank = np.empty(len(buffers), dtype=np.int64)
        self.rank[self.ids] = np.arange(len(buffers))
        self.placed = np.zeros(len(buffers), dtype=bool)
        self.starts = np.zeros(len(buffers), dtype=np.int64)
        self.ends = np.zeros(len(buffers), dtype=np.int64)
        self.block_last = np.full(-(-len(buffers) // self.BLOCK), -1, dtype=np.int64)

    def place(self, buffer: int, start: int, end: int) -> None:
        r = self.rank[buffer]
        self.placed[r] = True
        self.starts[r], self.ends[r] = start, end
        block = r // self.BLOCK
        self.block_last[block] = max(self.block_last[block], self.lasts[r])

    def placed_during(self, first: int, last: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids, starts, ends) of the placed buffers whose lives meet [first, last]."""
        reach = int(np.searchsorted(self.firsts, last, side="right"))
        blocks = np.flatnonzero(self.block_last[: -(-reach // self.BLOCK)] >= first)
        ranks = (blocks[:, None] * self.BLOCK + np.arange(self.BLOCK)).ravel()
        ranks = ranks[ranks < reach]
        ranks = ranks[self.placed[ranks] & (self.lasts[ranks] >= first)]
        return self.ids[ranks], self.starts[ranks], self.ends[ranks]


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
