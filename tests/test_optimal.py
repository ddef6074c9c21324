"""The exact planner: optimal against brute force on tiny cases, never worse than the
heuristics, proofs that match the bounds, its time budget at scale, and the real models."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import SHARED_MODEL_FILES, needs_shared_models
from tests.test_planners import (
    buffers_from,
    clash,
    problems,
    random_buffers,
    random_overlaps,
    rules_of,
)
from toolchain.planners import (
    NEVER,
    Buffer,
    Deadline,
    Overlap,
    Placement,
    align_up,
    lower_bound,
    lower_bound_with_overlaps,
    make_plan,
    optimal,
    verify,
)
from toolchain.planners.canonical import COMPILED_MAX_BUFFERS
from toolchain.planners.naive import NaivePlanner
from toolchain.planners.optimal import OptimalPlanner, Search, independent_parts
from toolchain.planners.skyline import skyline

# Time limits in these tests only guard against a hang: node limits decide how far searches go,
# so what they find does not depend on how busy the machine is.
HANG_GUARD = 600.0


def brute_force_optimum(buffers: list[Buffer], overlaps: list[Overlap], alignment: int) -> int:
    """The smallest arena, by trying every order of placing the buffers, each at its lowest
    clash-free aligned offset: some order rebuilds an optimal plan pushed down as far as it
    goes, so the best order finds the optimum."""
    padded = {b.id: align_up(b.size, alignment) for b in buffers}
    rules = rules_of(overlaps)
    best = None
    for order in itertools.permutations(buffers):
        offsets: dict[int, int] = {}
        for b in order:
            offsets[b.id] = next(
                x
                for x in itertools.count(0, alignment)
                if not any(
                    clash(
                        b,
                        x,
                        p,
                        offsets[p.id],
                        rules.get(frozenset((b.id, p.id))),
                        lambda c: padded[c.id],
                        lambda o: align_up(o.shift, alignment),
                    )
                    for p in buffers
                    if p.id in offsets
                )
            )
        arena = max((offsets[b.id] + padded[b.id] for b in buffers), default=0)
        best = arena if best is None else min(best, arena)
    return best or 0


def heuristic_best(buffers, overlaps, alignment) -> int:
    """The smallest plan of the heuristics the exact planner starts from, the dive included."""
    configs = [("greedy", {}), ("freelist", {}), ("freelist", {"fit": "best"})]
    heuristics = [make_plan(buffers, name, alignment, overlaps, **options).arena_bytes
                  for name, options in configs]
    dive = skyline(buffers, alignment, NEVER)
    if dive is not None:
        plan = Placement.from_offsets("skyline", alignment, buffers, dive)
        verify(plan)
        heuristics.append(plan.arena_bytes)
    return min(heuristics)


# --- Against brute force and the heuristics -------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(problem=problems(max_size=5), alignment=st.sampled_from([1, 16]))
def test_optimal_matches_brute_force_on_tiny_problems(problem, alignment):
    buffers, overlaps = problem
    plan = make_plan(buffers, "optimal", alignment, overlaps)
    assert plan.proven_optimal
    assert plan.arena_bytes == plan.bound_bytes == brute_force_optimum(buffers, overlaps, alignment)


@settings(max_examples=200, deadline=None)
@given(problem=problems(), alignment=st.sampled_from([1, 4, 16]))
def test_optimal_is_never_worse_than_the_heuristics_and_proves_what_it_claims(problem, alignment):
    buffers, overlaps = problem
    plan = make_plan(buffers, "optimal", alignment, overlaps, deadline=Deadline.after(HANG_GUARD),
                     nodes=2_000)
    assert plan.arena_bytes <= heuristic_best(buffers, overlaps, alignment)
    bound = lower_bound_with_overlaps(buffers, overlaps, alignment)
    assert bound <= plan.bound_bytes <= plan.arena_bytes
    assert plan.gap_bytes == plan.arena_bytes - plan.bound_bytes
    assert plan.proven_optimal == (plan.gap_bytes == 0)
    if plan.proven_optimal and plan.bound_bytes == lower_bound(buffers, alignment):
        assert plan.arena_bytes == lower_bound(buffers, alignment)


# --- Proofs above the lower bound -----------------------------------------------------------

# At op 0 two inputs die and two outputs are born; each output may alias each input, but the
# two inputs (and the two outputs) can never share. Each output counts only after the inputs,
# and never below nothing, so the bound is 32, not 64 - 4 * 16 = 0.
CROSSED = (
    buffers_from((16, 0, 0), (16, 0, 0), (16, 0, 0), (16, 0, 0)),
    [Overlap(b, a, any_offset=True) for b in (2, 3) for a in (0, 1)],
)

# Two outputs may each sit in place on one dying input, but not on each other: the bound
# counts both savings, the plan can use only one.
TWO_IN_PLACE = (
    buffers_from((64, 0, 1), (64, 1, 2), (64, 1, 1)),
    [Overlap(1, 0), Overlap(2, 0)],
)

# Three buffers that may each overlap the others partly, by different shifts: the bound counts
# each pair's saving, but the three cannot all overlap that much at once.
TRIANGLE = (
    buffers_from((64, 0, 0), (64, 0, 0), (48, 0, 1)),
    [Overlap(2, 1, shift=16), Overlap(0, 1, shift=32), Overlap(2, 0, shift=16)],
)


@pytest.mark.parametrize(
    ("problem", "bound", "optimum"),
    [(CROSSED, 32, 32), (TWO_IN_PLACE, 64, 128), (TRIANGLE, 96, 112)],
    ids=["crossed-aliases", "two-in-place", "triangle"],
)
def test_optimal_proves_the_optimum_at_or_above_the_lower_bound(problem, bound, optimum):
    buffers, overlaps = problem
    assert lower_bound_with_overlaps(buffers, overlaps, 16) == bound
    assert brute_force_optimum(buffers, overlaps, 16) == optimum
    plan = make_plan(buffers, "optimal", 16, overlaps)
    assert (plan.arena_bytes, plan.bound_bytes, plan.proven_optimal) == (optimum, optimum, True)


def test_overlaps_in_a_cycle_still_plan_but_prove_nothing_beyond_the_bound():
    # Degenerate one-op lives let in-place pairs chain into a cycle (0 on 1 on 2 on 0): no tie
    # order then places every `below` first, so exhausting the search proves nothing.
    buffers = buffers_from((16, 0, 0), (16, 0, 0), (32, 0, 0), (16, 0, 0))
    overlaps = [Overlap(0, 1), Overlap(1, 2), Overlap(2, 0)]
    assert brute_force_optimum(buffers, overlaps, 16) == 48
    plan = make_plan(buffers, "optimal", 16, overlaps, deadline=Deadline.after(0.5))
    assert plan.arena_bytes == 48
    assert plan.bound_bytes == lower_bound_with_overlaps(buffers, overlaps, 16) == 32
    assert not plan.proven_optimal


# --- Options, fields and scale --------------------------------------------------------------


def test_heuristics_report_no_proof():
    plan = make_plan(buffers_from((16, 0, 0)), "greedy")
    assert (plan.proven_optimal, plan.bound_bytes, plan.gap_bytes) == (None, None, None)


def test_optimal_plans_nothing_and_empty_buffers():
    assert make_plan([], "optimal").proven_optimal
    plan = make_plan(buffers_from((0, 0, 3), (0, 1, 1)), "optimal")
    assert (plan.arena_bytes, plan.offsets, plan.proven_optimal) == (0, (0, 0), True)


def optimal_planner(buffers, overlaps=(), alignment=16, **options) -> OptimalPlanner:
    planner = OptimalPlanner(alignment, **options)
    for b in buffers:
        planner.add_buffer(b.size, b.first, b.last)
    for o in overlaps:
        planner.add_overlap(o.below, o.above, o.shift, o.any_offset)
    return planner


@pytest.mark.parametrize("with_overlaps", [False, True], ids=["plain", "overlaps"])
def test_ten_thousand_buffers_in_a_part_keep_the_heuristics_plan(with_overlaps):
    # A node of the Python search weighs up every member, and the compiled search takes at most
    # COMPILED_MAX_BUFFERS: a part this large is not searched, however many nodes are given.
    buffers = random_buffers(10_000, seed=7)
    overlaps = random_overlaps(buffers, seed=1) if with_overlaps else []
    parts = independent_parts(buffers, [b.size for b in buffers])
    assert max(len(part) for part in parts) > COMPILED_MAX_BUFFERS
    planner = optimal_planner(buffers, overlaps, deadline=Deadline.after(HANG_GUARD), nodes=20)
    plan = replace(planner.result(), buffers=tuple(buffers), overlaps=tuple(overlaps))
    verify(plan)
    assert planner.nodes_used == 0
    assert len(plan.offsets) == 10_000
    assert plan.arena_bytes == heuristic_best(buffers, overlaps, 16)
    assert plan.bound_bytes >= lower_bound_with_overlaps(buffers, overlaps, 16)


def test_no_nodes_and_a_passed_deadline_keep_the_first_heuristic_plans():
    buffers = random_buffers(2_000, seed=5)
    overlaps = random_overlaps(buffers, seed=2)
    searched = optimal_planner(buffers, overlaps, deadline=Deadline.after(HANG_GUARD), nodes=0)
    assert searched.result().arena_bytes == heuristic_best(buffers, overlaps, 16)
    assert searched.nodes_used == 0
    # Past its deadline the greedy planner gives up at once; the free list never does (it
    # stacks the buffers it had no time for).
    late = optimal_planner(buffers, overlaps, deadline=Deadline(0.0)).result()
    first_fit = make_plan(buffers, "freelist", 16, overlaps, Deadline(0.0))
    assert late.offsets == first_fit.offsets
    verify(replace(late, buffers=tuple(buffers), overlaps=tuple(overlaps)))


def test_a_part_too_deep_for_recursion_is_searched(monkeypatch):
    # 1,500 buffers that all meet: the search goes 1,500 placements deep, far past Python's
    # recursion limit, and still proves the bound (which the heuristics but the dive miss
    # here: without the dive, the search has the work to do).
    monkeypatch.setattr(optimal, "skyline", lambda *args: None)
    rng = random.Random(3)
    buffers = []
    for i in range(1500):
        first = rng.randrange(300)
        buffers.append(Buffer(i, rng.randrange(1, 500), first, first + rng.randrange(6)))
    planner = optimal_planner(buffers, deadline=Deadline.after(HANG_GUARD), nodes=10_000)
    plan = planner.result()
    assert min(make_plan(buffers, name, 16).arena_bytes for name in ("greedy", "freelist")) \
        > lower_bound(buffers, 16)
    assert plan.proven_optimal and plan.arena_bytes == lower_bound(buffers, 16)
    assert planner.nodes_used <= 10_000


# --- The real models ------------------------------------------------------------------------


# The real models need at most a few dozen search nodes each (39 for person_detect with
# overlaps): a hundred times that is still instant.
REAL_NODES = 4_000


def model_buffers(path) -> list[Buffer]:
    from toolchain.front.reader import read_model
    from toolchain.lower.lifetimes import compute_lifetimes

    return list(compute_lifetimes(read_model(path).main).buffers)


def in_place_overlaps(buffers: list[Buffer]) -> list[Overlap]:
    """A pair for each buffer born where an older one dies, mixing in-place, shifted and
    aliased ones: not what the real kernels allow, but the same shape of problem."""
    overlaps = []
    for b in buffers:
        dying = [a for a in buffers if a.last == b.first and a.first < b.first]
        if dying:
            shift, alias = 16 * (b.id % 3), b.id % 4 == 0
            overlaps.append(Overlap(b.id, dying[0].id, shift, alias))
    return overlaps


@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("alignment", [1, 16, 64])
def test_real_models_are_proven_optimal_at_the_lower_bound(path, alignment):
    buffers = model_buffers(path)
    plan = make_plan(buffers, "optimal", alignment, deadline=Deadline.after(HANG_GUARD),
                     nodes=REAL_NODES)
    assert plan.proven_optimal
    assert plan.arena_bytes == lower_bound(buffers, alignment)


@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_the_search_alone_proves_the_real_models(path):
    # From the naive plan, without the heuristics' head start: the search itself gets there.
    buffers = model_buffers(path)
    sizes = [align_up(b.size, 16) for b in buffers]
    offsets = NaivePlanner(16)._place(buffers, [])
    bound = lower_bound(buffers, 16)
    for part in independent_parts(buffers, sizes):
        deadline = Deadline.after(HANG_GUARD)
        search = Search(part, buffers, sizes, [], {}, 16, deadline, node_limit=REAL_NODES)
        found, bound = search.solve(bound, {i: offsets[i] for i in part})
        for i, offset in found.items():
            offsets[i] = offset
    assert max(o + s for o, s in zip(offsets, sizes,
                                     strict=True)) == bound == lower_bound(buffers, 16)


@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_real_models_with_overlaps_are_proven_optimal(path):
    buffers = model_buffers(path)
    overlaps = in_place_overlaps(buffers)
    plan = make_plan(buffers, "optimal", 16, overlaps, deadline=Deadline.after(HANG_GUARD),
                     nodes=REAL_NODES)
    assert plan.proven_optimal
    assert plan.arena_bytes <= heuristic_best(buffers, overlaps, 16)
    assert plan.arena_bytes <= lower_bound(buffers, 16)
