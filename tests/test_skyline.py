"""The canonical dive (toolchain/planners/skyline.py): its compiled loop against the definition
written plainly, its plans verified, its work bound, and what it buys the exact planner."""

from __future__ import annotations

import numpy as np
import pytest

from tests.bench import random_buffers as bench_buffers
from tests.test_planners import random_buffers
from toolchain.planners import NEVER, Placement, align_up, lower_bound, make_plan, verify
from toolchain.planners import skyline as skyline_module
from toolchain.planners.canonical import preorder_keys
from toolchain.planners.compiled import ranked_lives
from toolchain.planners.skyline import _core, dive, meeting_pairs, paid_dives, skyline

needs_compiler = pytest.mark.skipif(_core() is None, reason="the dive's loop needs a C compiler")


def random_lives(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A few lives [first, last] and sizes, in multiples of 16 so that tops often tie."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    first = rng.integers(0, 20, n)
    return first, first + rng.integers(0, 6, n), rng.integers(0, 6, n) * 16


def dive_by_definition(sizes, first, last, order) -> list[int]:
    """Lowest floor first (the floor: the highest top placed during the life), ties by
    `order`, each at its floor; empty buffers at 0."""
    n = len(sizes)
    rank = {buffer: r for r, buffer in enumerate(order)}
    offsets, unplaced = [0] * n, {i for i in range(n) if sizes[i]}
    tops: list[tuple[int, int, int]] = []  # (first, last, top) of each placed buffer
    while unplaced:
        def floor(i):
            return max((top for f, la, top in tops if f <= last[i] and first[i] <= la), default=0)
        chosen = min(unplaced, key=lambda i: (floor(i), rank[i]))
        offsets[chosen] = floor(chosen)
        tops.append((first[chosen], last[chosen], offsets[chosen] + sizes[chosen]))
        unplaced.remove(chosen)
    return offsets


@needs_compiler
@pytest.mark.parametrize("seed", range(40))
def test_the_compiled_dive_is_the_definition(seed):
    first, last, sizes = random_lives(seed)
    order = np.random.default_rng(seed).permutation(len(sizes))
    got = dive(_core(), sizes, first, last, order)
    assert got.tolist() == dive_by_definition(sizes.tolist(), first.tolist(), last.tolist(),
                                              order.tolist())


@needs_compiler
@pytest.mark.parametrize("count", [1, 50, 2_000])
def test_its_plans_are_valid(count):
    buffers = random_buffers(count, seed=count)
    offsets = skyline(buffers, 16, NEVER)
    verify(Placement.from_offsets("skyline", 16, buffers, offsets))


def test_pairs_are_counted_as_defined():
    for seed in range(100):
        first, last, _ = random_lives(seed)
        n = len(first)
        meet = sum(1 for i in range(n) for j in range(i + 1, n)
                   if first[i] <= last[j] and first[j] <= last[i])
        assert meeting_pairs(first, last) == meet


@needs_compiler
def test_the_dives_are_paid_for_by_work(monkeypatch):
    buffers = random_buffers(200, seed=1)
    ranks = np.array([(b.first, b.last) for b in buffers])
    cost = len(buffers) + 2 * meeting_pairs(ranks[:, 0], ranks[:, 1])
    monkeypatch.setattr(skyline_module, "DIVE_WORK", cost - 1)
    assert skyline(buffers, 16, NEVER) is None
    monkeypatch.setattr(skyline_module, "DIVE_WORK", cost)  # one dive: the first preorder's
    one = skyline(buffers, 16, NEVER)
    sizes = np.array([align_up(b.size, 16) for b in buffers])
    first, last = ranked_lives(buffers)
    keys = preorder_keys(first, last + 1, sizes)
    by_first_preorder = np.lexsort([np.arange(len(buffers))] + [
        -keys[c] for c in reversed(skyline_module.PREORDERS[0])])
    assert one == dive(_core(), sizes, first, last, by_first_preorder).tolist()
    assert paid_dives(10, 0) == skyline_module.MAX_DIVES
    assert paid_dives(10_000, 2_490_701) == skyline_module.DIVE_WORK // 4_991_402


@needs_compiler
def test_the_exact_planner_beats_greedy_by_size_where_it_cannot_search():
    # `make bench`'s random buffers, 5,000 in one part: more than the compiled search takes, so
    # the plan is the heuristics' best, and the dives make it smaller than greedy by size's.
    buffers = bench_buffers(5_000, seed=11)
    greedy = make_plan(buffers, "greedy", 16).arena_bytes
    exact = make_plan(buffers, "optimal", 16)
    dived = skyline(buffers, 16, NEVER)
    tops = [o + align_up(b.size, 16) for o, b in zip(dived, buffers, strict=True)]
    assert exact.arena_bytes == max(tops)
    assert exact.arena_bytes < 0.99 * greedy
    assert exact.arena_bytes >= lower_bound(buffers, 16)
    assert skyline(buffers, 16, NEVER) == dived  # the same plan every time


def test_the_preorder_keys_are_as_defined():
    for seed in range(100):
        lower, last, size = random_lives(seed)
        upper, n = last + 1, len(lower)
        keys = preorder_keys(lower, upper, size)
        alive = [size[(lower <= t) & (t < upper)].sum() for t in range(30)]
        births = set(lower.tolist())
        for i in range(n):
            assert keys["T"][i] == max(alive[lower[i]:upper[i]])
            assert keys["C"][i] == sum(lower[i] <= b < upper[i] for b in births)
            assert keys["A"][i] == size[i] * (upper[i] - lower[i])
