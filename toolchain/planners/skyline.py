"""The canonical dive: the exact planner's search (toolchain/planners/optimal.py) without its
backtracking, for problems too large to search.

Every buffer's floor is the highest top placed so far during its life; the buffer with the
lowest floor goes next, at its floor, ties by a preorder. Where greedy by size puts each buffer
into the lowest gap of the plan so far, this builds the plan from the bottom up like a skyline.
Which buffer wins a tie matters a great deal on large problems (on 10,000 random buffers one
preorder gives 1.03x the lower bound and another 1.07x), so the planner dives several times and
keeps the smallest plan: once per preorder of the exact planner (PREORDERS), then by the most
bytes alive beside the buffer and the births during its life (T, C) with the remaining ties
shuffled, as many dives as the work budget pays for (`paid_dives`). The shuffles come from
fixed seeds, so the plan is the same on every run.

The loop is compiled (`skyline.c`, built with the system `cc` like the other planners' loops);
without a compiler (or with ARENAC_PURE_PYTHON=1) there is no dive and callers keep their other
plans. Its work is bounded by a count of heap steps (DIVE_WORK), never by the clock.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import numpy as np

from toolchain.planners.base import Buffer, Deadline, align_up
from toolchain.planners.canonical import PREORDERS, preorder_keys
from toolchain.planners.compiled import I64, entry_point, pointer, ranked_lives

SOURCE = Path(__file__).with_name("skyline.c")
# The heap steps all the dives of one problem may take together, and the most dives. A dive
# takes at most the buffers plus twice the pairs of lives that meet (a buffer goes back on the
# heap at most once per partner placed): `make bench`'s 10,000 random buffers (2.5 million
# pairs, a dive in about 0.13 s) get 12 dives; a problem with 30 million pairs or more, none.
DIVE_WORK = 60_000_000
MAX_DIVES = 20


def skyline(buffers: list[Buffer], alignment: int, deadline: Deadline) -> list[int] | None:
    """The smallest plan of the dives DIVE_WORK pays for (the preorders first, then the
    shuffled ones), as offsets by position; None without the compiled loop, when not one dive
    is paid for, or once `deadline` passed."""
    core = _core()
    if core is None or not buffers or deadline.passed():
        return None
    sizes = np.array([align_up(b.size, alignment) for b in buffers], dtype=np.int64)
    first, last = ranked_lives(buffers)
    dives = paid_dives(len(buffers), meeting_pairs(first, last))
    if dives == 0:
        return None
    keys = preorder_keys(first, last + 1, sizes)
    index = np.arange(len(buffers))
    orders = [[index] + [-keys[c] for c in reversed(letters)] for letters in PREORDERS]
    for seed in range(dives - len(PREORDERS)):
        orders.append([np.random.default_rng(seed).permutation(len(buffers)), -keys["C"],
                       -keys["T"]])
    best, best_arena = None, 0
    for lexsort_keys in orders[:dives]:
        if best is not None and deadline.passed():
            break
        offsets = dive(core, sizes, first, last, np.lexsort(lexsort_keys))
        arena = int((offsets + sizes).max())
        if best is None or arena < best_arena:
            best, best_arena = offsets, arena
    return None if best is None else best.tolist()


def dive(core: ctypes.CDLL, sizes: np.ndarray, first: np.ndarray, last: np.ndarray,
         order: np.ndarray) -> np.ndarray:
    """One dive's offsets: buffers of padded `sizes` living over the times [first, last]
    (ranks: small whole numbers), ties going to the earlier in `order`."""
    offsets = np.zeros(len(sizes), dtype=np.int64)
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in (sizes, first, last, order)]
    times = int(last.max()) + 1
    if core.arenac_skyline(len(sizes), *map(pointer, arrays), times, pointer(offsets)) < 0:
        raise MemoryError("the compiled skyline planner ran out of memory")
    return offsets


def paid_dives(buffers: int, pairs: int) -> int:
    """How many dives DIVE_WORK pays for."""
    return min(MAX_DIVES, DIVE_WORK // (buffers + 2 * pairs))


def meeting_pairs(first: np.ndarray, last: np.ndarray) -> int:
    """How many pairs of the lives [first, last] meet: each buffer counts the lives that start
    by its last op less those that ended before its first; the buffer itself and every pair
    counted twice come off."""
    by_first, by_last = np.sort(first), np.sort(last)
    meets = np.searchsorted(by_first, last, "right") - np.searchsorted(by_last, first, "left")
    return int((meets.sum() - len(first)) // 2)


@cache
def _core() -> ctypes.CDLL | None:
    return entry_point(SOURCE, "arenac_skyline", [ctypes.c_int64, I64, I64, I64, I64,
                                                  ctypes.c_int64, I64])
