"""Does a set of buffers fit in a given number of bytes? The question the exact planner and
`arenac solve` ask, answered by a compiled search when a C compiler is at hand.

The search is the canonical one of the exact planner (toolchain/planners/optimal.py): any plan
can be pushed down until no buffer can move lower, and taken in order of offset each buffer of
such a plan sits at its floor, so the search only chooses which buffer goes next. It prunes as
MiniMalloc (Moffitt, ASPLOS 2023) does: by dominance (no buffer at or above the lowest top an
unplaced one could have), by sections (at each set of buffers alive together, the floor plus
the unplaced bytes must fit), by the "hatless" rule (a buffer that shares time with no
unplaced one is never worth trying another choice instead of), and by decomposition (once no
unplaced buffer crosses from one section to the next, each side is searched alone). Identical
buffers go in a fixed order. It runs a portfolio of three preorders in rounds of doubling node
budgets, so one bad order cannot stall it.

The core is `canonical.c`, built once with the system `cc` into the user's cache and loaded
with ctypes (toolchain.planners.compiled). The question is asked through
`toolchain.planners.optimal.fits`: without a compiler (or with ARENAC_PURE_PYTHON=1), or when
the compiled search runs out of memory, the Python search of the exact planner answers it,
only slower.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from toolchain.planners.base import (
    Buffer,
    Deadline,
    Overlap,
    align_up,
    overlap_windows,
    pair_saving,
    preorder,
)
from toolchain.planners.compiled import build

SOURCE = Path(__file__).with_name("canonical.c")
# Beyond this many buffers in one question the compiled search's per-depth lists would need
# more memory than is reasonable (n^2 ints); the Python search takes those.
COMPILED_MAX_BUFFERS = 4000
# The preorders of the portfolio: keys compared in turn, larger first. T: the most bytes alive
# at any time of the buffer's life, W: the life's length, A: size times that, Z: size, C: how
# many births its life spans. Chosen on MiniMalloc's published problems: each of the eleven
# needs one of the first two, and the third makes the portfolio less tied to them.
PREORDERS = ("TWZ", "TAW", "TCA")
# What the compiled search takes for "no time limit" (infinity does not convert to its clock).
NO_CLOCK_SECONDS = 1e9
STATUS = {1: "found", 0: "infeasible", -1: "out_of_nodes", -2: "out_of_time", -3: "no_memory"}

_i64 = ctypes.POINTER(ctypes.c_int64)
_int = ctypes.POINTER(ctypes.c_int)


@dataclass(frozen=True)
class Answer:
    """`status` is "found" (then `offsets`, by position in the buffers given, fit within the
    capacity), "infeasible" (an exhausted search, or the lower bound: no plan fits),
    "out_of_nodes" or "out_of_time". `nodes` counts the search nodes visited, and `search`
    says what answered: "compiled" or "python" (the search), or "heuristics" (a problem beyond
    the compiled search: the heuristics' plan, or the lower bound)."""

    status: str
    offsets: tuple[int, ...] | None
    nodes: int
    search: str


def compiled_available() -> bool:
    return _core() is not None


@cache
def _core() -> ctypes.CDLL | None:
    core = build(SOURCE)
    return bind(core) if core is not None else None


def bind(core: ctypes.CDLL) -> ctypes.CDLL:
    """Declares the core's one entry point, so ctypes converts every argument."""
    core.arenac_fits.restype = ctypes.c_int
    core.arenac_fits.argtypes = [
        ctypes.c_int, _i64, _i64, _i64,  # n, size, lower, upper
        _i64, _int, _i64,  # neighbours
        _i64, _int, _i64, _i64,  # pairs: start, partner, time, share
        _int, ctypes.c_int, _int,  # kin, orders
        _i64, ctypes.c_char_p, ctypes.c_int,  # keys, letters, rerank
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_double,
        _i64, _i64,
    ]
    return core


def _ptr(array: np.ndarray, kind: type) -> object:
    return array.ctypes.data_as(kind)


class CompiledProblem:
    """The arrays the compiled search reads, built once (with numpy) for several questions."""

    def __init__(self, buffers: Sequence[Buffer], alignment: int, overlaps: Sequence[Overlap]):
        self.buffers = list(buffers)
        self.alignment = alignment
        self.overlaps = list(overlaps)
        # Empty buffers take no bytes and go at offset 0; the search sees the others only.
        self.searched = [k for k, b in enumerate(buffers) if align_up(b.size, alignment) > 0]
        self._arrays(alignment)

    def fits(self, capacity: int, deadline: Deadline, node_limit: int | None = None) -> Answer:
        """One question: a plan within `capacity`, until `deadline` and for at most
        `node_limit` nodes. Offsets come back by position in the buffers given."""
        core = _core()
        assert core is not None, "a CompiledProblem is made only when compiled_available()"
        n = len(self.searched)
        offsets = np.zeros(n, dtype=np.int64)
        nodes = np.zeros(1, dtype=np.int64)
        status = STATUS[
            core.arenac_fits(
                n, *self.pointers, len(PREORDERS), _ptr(self.orders, _int),
                _ptr(self.keys, _i64), self.letters, int(not self.ties),
                self.alignment, capacity, -1 if node_limit is None else node_limit,
                min(deadline.left(), NO_CLOCK_SECONDS), _ptr(offsets, _i64), _ptr(nodes, _i64),
            )
        ]
        found = None
        if status == "found":
            every = [0] * len(self.buffers)
            for k, offset in zip(self.searched, offsets.tolist(), strict=True):
                every[k] = offset
            found = tuple(every)
        return Answer(status, found, int(nodes[0]), search="compiled")

    def _arrays(self, alignment: int) -> None:
        buffers = [self.buffers[k] for k in self.searched]
        kept = {b.id for b in buffers}
        overlaps = [o for o in self.overlaps if o.below in kept and o.above in kept]
        n = len(buffers)
        position = {b.id: k for k, b in enumerate(buffers)}
        self.size = np.array([align_up(b.size, alignment) for b in buffers], dtype=np.int64)
        self.lower = np.array([b.first for b in buffers], dtype=np.int64)
        self.upper = np.array([b.last + 1 for b in buffers], dtype=np.int64)
        sizes_by_id = {b.id: int(s) for b, s in zip(buffers, self.size, strict=True)}
        windows = overlap_windows(sizes_by_id, overlaps, alignment) if overlaps else {}
        # Time neighbours, both ways round: once `placed` sits at o, `new` goes at o + high.
        lower, upper = self.lower, self.upper
        meet = (lower[:, None] < upper[None, :]) & (lower[None, :] < upper[:, None])
        np.fill_diagonal(meet, False)
        placed, new = np.nonzero(meet)
        eff = self.size[placed].copy()
        for k, (p, q) in enumerate(zip(placed.tolist(), new.tolist(), strict=True)):
            if windows:
                window = windows.get((buffers[q].id, buffers[p].id))
                if window is not None:
                    eff[k] = window.high
        self.nb_start = np.zeros(n + 1, dtype=np.int64)
        np.add.at(self.nb_start, placed + 1, 1)
        self.nb_start = np.cumsum(self.nb_start)
        self.nb_other = new.astype(np.intc)
        self.nb_eff = eff.astype(np.int64)
        # Declared pairs, listed under both members: the op where they meet and what they may
        # share there.
        pair_rows: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        for o in overlaps:
            below, above = position[o.below], position[o.above]
            share = max(0, pair_saving(o, int(self.size[below]), int(self.size[above]), alignment))
            meet_at = buffers[below].first
            pair_rows[below].append((above, meet_at, share))
            pair_rows[above].append((below, meet_at, share))
        self.pair_start = np.cumsum([0] + [len(r) for r in pair_rows]).astype(np.int64)
        flat = [row for rows in pair_rows for row in rows]
        self.pair_other = np.array([r[0] for r in flat] or [0], dtype=np.intc)
        self.pair_time = np.array([r[1] for r in flat] or [0], dtype=np.int64)
        self.pair_share = np.array([r[2] for r in flat] or [0], dtype=np.int64)
        # Interchangeable buffers: same size and life, in no pair.
        in_pair = {position[i] for o in overlaps for i in (o.below, o.above)}
        kinds: dict[tuple[int, int, int], int] = {}
        self.kin = np.array(
            [
                -1 if k in in_pair else kinds.setdefault((int(s), int(lo), int(up)), len(kinds))
                for k, (s, lo, up) in enumerate(zip(self.size, self.lower, self.upper, strict=True))
            ],
            dtype=np.intc,
        )
        self.orders = self._preorders(windows, position, overlaps)
        self.pointers = [
            _ptr(self.size, _i64), _ptr(self.lower, _i64), _ptr(self.upper, _i64),
            _ptr(self.nb_start, _i64), _ptr(self.nb_other, _int), _ptr(self.nb_eff, _i64),
            _ptr(self.pair_start, _i64), _ptr(self.pair_other, _int), _ptr(self.pair_time, _i64),
            _ptr(self.pair_share, _i64), _ptr(self.kin, _int),
        ]

    def _preorders(
        self, windows: dict, position: dict[int, int], overlaps: Sequence[Overlap]
    ) -> np.ndarray:
        """One row per entry of PREORDERS. A pair that may share one offset (padded shift 0)
        must have `below` first, or the canonical order could not put them there."""
        keys = preorder_keys(self.lower, self.upper, self.size)
        ties = [
            (position[o.below], position[o.above])
            for o in overlaps
            if not o.any_offset and windows[o.above, o.below].high == 0
        ]
        self.ties = ties
        self.sound = True  # whether every row keeps each tied pair's `below` first
        self.keys = np.concatenate([keys[c] for c in "WAZC"]).astype(np.int64)
        self.letters = b"".join(c.encode().ljust(4, b"\0") for c in PREORDERS)
        rows = []
        index = np.arange(len(self.size))
        for letters in PREORDERS:
            order = np.lexsort([index] + [-keys[c] for c in reversed(letters)])
            row, sound = _respect(order.tolist(), ties)
            rows.append(row)
            self.sound = self.sound and sound
        return np.array(rows, dtype=np.intc).reshape(len(rows), len(self.size))


def preorder_keys(lower: np.ndarray, upper: np.ndarray, size: np.ndarray) -> dict[str, np.ndarray]:
    """The keys of PREORDERS by letter, for lives [lower, upper)."""
    width = upper - lower
    return {"W": width, "A": width * size, "T": _busiest(lower, upper, size), "Z": size,
            "C": _births_within(lower, upper)}


def _busiest(lower: np.ndarray, upper: np.ndarray, size: np.ndarray) -> np.ndarray:
    """For each buffer, the most bytes alive at any time of its life: range maxima of the bytes
    alive, from a table of maxima over runs of 1, 2, 4, ... times."""
    if not len(size):
        return size
    times = np.unique(np.concatenate([lower, upper]))
    change = np.zeros(len(times) + 1, dtype=np.int64)
    np.add.at(change, np.searchsorted(times, lower), size)
    np.add.at(change, np.searchsorted(times, upper), -size)
    alive = np.cumsum(change)[:-1]
    lo, hi = np.searchsorted(times, lower), np.searchsorted(times, upper)  # [lo, hi), not empty
    levels = [alive]
    while 2 << (len(levels) - 1) <= len(alive):
        run = 1 << (len(levels) - 1)
        levels.append(np.maximum(levels[-1][:-run], levels[-1][run:]))
    level = np.floor(np.log2(hi - lo)).astype(np.int64)
    busiest = np.empty(len(size), dtype=np.int64)
    for k in np.unique(level):
        at = np.flatnonzero(level == k)
        table = levels[k]
        busiest[at] = np.maximum(table[lo[at]], table[hi[at] - (1 << k)])
    return busiest


def _births_within(lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """For each buffer, how many distinct times some buffer is born during its life."""
    births = np.unique(lower)
    return np.searchsorted(births, upper, "left") - np.searchsorted(births, lower, "left")


def _respect(order: list[int], before: list[tuple[int, int]]) -> tuple[list[int], bool]:
    """`order`, except that each (x, y) in `before` puts x ahead of y; and whether all held."""
    if not before:
        return order, True
    rank = {item: r for r, item in enumerate(order)}
    return preorder(order, lambda item: (rank[item],), before)


