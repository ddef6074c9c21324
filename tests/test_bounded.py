"""Bounded planning work: the time limit covers the schedule, every planner and `best`, each
returning a valid, verified result however little time is left; the near-linear structures
match their simple definitions; a 100,000-operator wide graph plans through the CLI; and
`--load-offsets` takes plain decimal offsets only.

No test here measures time: a deadline already in the past, node limits and step counts make
the bounds exact. tests/wide.py times the wide graph for the benchmark.
"""

from __future__ import annotations

import importlib
import io
import random
import re
import subprocess
import sys
from itertools import accumulate
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toolchain.lower.schedule as sched
from tests.test_control_flow import branch
from tests.test_planners import random_buffers, random_overlaps, reference_freelist
from tests.test_schedule import assert_valid, ir_graph, random_graphs
from tests.wide import plan_wide, wide_model
from toolchain.cli import main
from toolchain.errors import PlanError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lower.plan import ModelPlan, best_candidates, plan_model
from toolchain.lower.program import Program
from toolchain.planners import (
    CLOCK_EVERY,
    Buffer,
    Deadline,
    OutOfTime,
    Placement,
    align_up,
    lower_bound,
    make_plan,
    naive_sum,
    smallest_plan,
    verify,
)
from toolchain.planners.csvio import load_buffers, load_offsets
from toolchain.planners.freelist import Runs
from toolchain.planners.verify import SortedInts
from toolchain.views.report import subgraph_steps

verifier = importlib.import_module("toolchain.planners.verify")  # the name is the function too
PASSED = Deadline(0.0)  # long gone: every search must stop at its first look at the clock


def wide_graph(branches: int, join_first: bool = False):
    """x -> `branches` parallel ops of different sizes -> one op joining them, as IR. With
    `join_first` the file lists the join first, so the file's order is not valid."""
    sizes = [64] + [16 * (1 + i % 5) for i in range(branches)] + [64]
    ops = [([0], [i + 1]) for i in range(branches)]
    join = (list(range(1, branches + 1)), [branches + 1])
    return ir_graph(sizes, [join, *ops] if join_first else [*ops, join], [0], [branches + 1])


# -- the schedule --------------------------------------------------------------------------


def test_a_passed_deadline_keeps_the_file_order():
    graph = wide_graph(3_000)
    assert sched.best_order(graph, deadline=PASSED) == tuple(range(3_001))
    assert sched.schedule(graph, deadline=PASSED) == tuple(range(3_001))


def test_a_passed_deadline_with_an_invalid_file_order_gives_the_first_topological_one():
    graph = wide_graph(500, join_first=True)
    order = sched.best_order(graph, deadline=PASSED)
    assert order == (*range(1, 501), 0)
    assert_valid(graph, order)


def test_a_passed_deadline_stops_the_exact_search_at_once(monkeypatch):
    visited = []
    real = sched._Search

    def counting(problem, limit, deadline):
        search = real(problem, limit, deadline)
        visited.append(search.visited)
        return search

    monkeypatch.setattr(sched, "_Search", counting)
    graph = ir_graph([16, 32, 32, 32, 48], [([0], [1]), ([0], [2]), ([0], [3]),
                                            ([1, 2, 3], [4])], [0], [4])
    sched.best_order(graph, deadline=PASSED)
    assert visited == []  # no piece is searched once the deadline has passed
    sched.best_order(graph)
    assert visited and sum(visited) <= sched.EXACT_LIMIT


def brute_force_cuts(problem, order) -> list[int]:
    """The k with order[:k] a cut: every operator in it an ancestor of every later one."""
    descendants = []
    for v in range(problem.size):
        seen, stack = set(), list(problem.succs[v])
        while stack:
            w = stack.pop()
            if w not in seen:
                seen.add(w)
                stack.extend(problem.succs[w])
        descendants.append(seen)
    return [
        k
        for k in range(1, len(order) + 1)
        if all(set(order[k:]) <= descendants[v] for v in order[:k])
    ]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(max_ops=12))
def test_linear_cuts_match_their_definition(graph):
    problem = sched._Problem.of(graph, 16)
    order = sched._topological(problem)
    assert sched._cut_ends(problem, order) == brute_force_cuts(problem, order)


def greedy_by_definition(problem, by_transient: bool) -> tuple[int, ...]:
    """The greedy order by its definition: at each step, rank every ready operator afresh."""
    waiting = [len(p) for p in problem.preds]
    left = dict(problem.reader_counts)
    ready = {v for v, count in enumerate(waiting) if count == 0}
    order = []
    while ready:

        def key(v):
            freed = sum(nbytes for t, nbytes in problem.reads[v] if left[t] == 1)
            after = problem.kept[v] - freed
            return (problem.made[v], after, v) if by_transient else (after, -freed, v)

        best = min(ready, key=key)
        ready.remove(best)
        order.append(best)
        for t, _ in problem.reads[best]:
            left[t] -= 1
        for w in problem.succs[best]:
            waiting[w] -= 1
            if waiting[w] == 0:
                ready.add(w)
    return tuple(order)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(max_ops=12), by_transient=st.booleans())
def test_the_heap_greedy_is_the_greedy_by_definition(graph, by_transient):
    problem = sched._Problem.of(graph, 16)
    found = sched._greedy(problem, by_transient, Deadline())
    assert found == greedy_by_definition(problem, by_transient)


def test_greedy_orders_give_up_at_a_passed_deadline():
    problem = sched._Problem.of(wide_graph(2_000), 16)
    assert sched._greedy(problem, False, PASSED) is None
    assert sched._greedy(problem, False, Deadline()) is not None


# -- the planners --------------------------------------------------------------------------


def test_greedy_gives_up_at_a_passed_deadline():
    buffers = random_buffers(1_000, seed=3)
    with pytest.raises(OutOfTime, match="placed 0 of 1000 buffers"):
        make_plan(buffers, "greedy", deadline=PASSED)


def test_every_planner_has_a_verified_plan_past_its_deadline():
    buffers = random_buffers(2_000, seed=4)
    overlaps = random_overlaps(buffers, seed=4)
    late = make_plan(buffers, "freelist", 16, overlaps, deadline=PASSED)
    for candidates in (best_candidates(), [("greedy", {})],
                       [("optimal", {})]):
        plan = smallest_plan(buffers, candidates, 16, overlaps, PASSED)
        verify(plan)
        assert plan.offsets == late.offsets
    # The free lists never give up; the naive planner has nothing to search.
    for name, options in [("freelist", {"fit": "best"}), ("naive", {})]:
        plan = smallest_plan(buffers, [(name, options)], 16, overlaps, PASSED)
        assert plan.offsets == make_plan(buffers, name, 16, overlaps, PASSED, **options).offsets


def test_a_free_list_out_of_time_stacks_the_buffers_it_has_not_placed():
    buffers = random_buffers(2_000, seed=4)
    overlaps = random_overlaps(buffers, seed=4)
    whole = make_plan(buffers, "freelist", 16, overlaps)
    late = make_plan(buffers, "freelist", 16, overlaps, deadline=PASSED)  # verified
    padded = [align_up(b.size, 16) for b in buffers]
    births = sorted(range(len(buffers)), key=lambda i: (buffers[i].first, -padded[i], i))
    placed, stacked = births[:CLOCK_EVERY], births[CLOCK_EVERY:]
    assert [late.offsets[i] for i in placed] == [whole.offsets[i] for i in placed]
    top = max(whole.offsets[i] + padded[i] for i in placed)
    assert [late.offsets[i] for i in stacked] == list(
        accumulate((padded[i] for i in stacked[:-1]), initial=top)
    )
    assert late.arena_bytes > whole.arena_bytes


def test_best_with_time_keeps_the_smallest_plan_first_of_equals():
    buffers = random_buffers(300, seed=6)
    overlaps = random_overlaps(buffers, seed=6)
    candidates = best_candidates()
    plans = [make_plan(buffers, name, 16, overlaps, **options) for name, options in candidates]
    smallest = min(plans, key=lambda p: p.arena_bytes)
    plan = smallest_plan(buffers, candidates, 16, overlaps, Deadline())
    assert (plan.planner, plan.offsets) == (smallest.planner, smallest.offsets)


def test_plan_model_past_its_time_limit_falls_back_to_the_first_fit_free_list():
    model = parse_model(wide_model(300), "wide.tflite")
    for planner in ("best", "greedy"):
        mp = plan_model(model, planner, time_limit=1e-9)
        assert mp.plan.planner == "freelist"
        assert mp.lifetimes.order == tuple(range(301))  # the schedule kept the file's order
        verify(mp.plan)
    assert plan_model(model).arena_bytes <= plan_model(model, time_limit=1e-9).arena_bytes


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), max_size=3000))
def test_sorted_ints_match_a_sorted_list(operations):
    SortedInts.BLOCK = 4  # small blocks, so that splits and empty blocks happen
    try:
        ints, plain = SortedInts(), []
        for add, x in operations:
            if add and x not in plain:
                ints.add(x)
                plain.append(x)
                plain.sort()
            elif not add and x in plain:
                ints.remove(x)
                plain.remove(x)
            below = [y for y in plain if y <= x]
            assert ints.floor(x) == (below[-1] if below else None)
            assert ints.between(x, x + 500) == [y for y in plain if x <= y < x + 500]
    finally:
        SortedInts.BLOCK = 512


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 200), st.integers(1, 50)), max_size=600))
def test_free_list_runs_match_a_sorted_list(operations):
    Runs.RUN = 2  # tiny runs, so that splits and empty runs happen
    try:
        runs, plain = Runs(), []
        for add, first, second in operations:
            pair = (first, second)
            if add and pair not in plain:
                runs.add(pair)
                plain = sorted([*plain, pair])
            elif not add and pair in plain:
                runs.remove(pair)
                plain.remove(pair)
            below = [p for p in plain if p < pair]
            assert runs.before(pair) == (below[-1] if below else None)
            assert list(runs.ascending_from(pair)) == [p for p in plain if p >= pair]
            assert runs.after(pair) == next((p for p in plain if p >= pair), None)
            assert runs.first_with(second) == next((p for p in plain if p[1] >= second), None)
            assert runs.last() == (plain[-1] if plain else None)
    finally:
        Runs.RUN = 64


@pytest.mark.parametrize("fit", ["first", "best"])
def test_the_free_list_in_short_runs_matches_its_reference(monkeypatch, fit):
    monkeypatch.setattr(Runs, "RUN", 2)
    rng = random.Random(8)
    buffers = []  # many alive at once, so that many blocks are free at once
    for i in range(400):
        first = rng.randrange(40)
        buffers.append(Buffer(i, rng.randrange(1, 300), first, first + rng.randrange(12)))
    assert list(make_plan(buffers, "freelist", 16, fit=fit).offsets) == reference_freelist(
        buffers, 16, fit
    )


def test_a_fragmented_free_list_is_not_scanned_block_by_block():
    # 2,000 holes of 16 bytes that no later buffer fits: each placement looks at the runs'
    # largest blocks, not at every hole.
    buffers = []
    for _ in range(2_000):
        buffers += [Buffer(len(buffers), 16, 0, 0), Buffer(len(buffers) + 1, 16, 0, 2_001)]
    buffers += [Buffer(len(buffers) + k, 32, k + 1, 2_001) for k in range(2_000)]
    looked: list[int] = []
    real = Runs.first_with

    def counting(self, least):
        looked.append(len(self.most))
        return real(self, least)

    Runs.first_with = counting
    try:
        plan = make_plan(buffers, "freelist", 16)
    finally:
        Runs.first_with = real
    assert plan.arena_bytes == 4_000 * 16 + 2_000 * 32
    assert max(looked) <= 2_000 // Runs.RUN + 1  # runs of at least RUN holes each


def test_verify_holds_a_hundred_thousand_live_buffers():
    n = 100_000
    buffers = [Buffer(i, 16, i, n) for i in range(n)]
    offsets = [16 * i for i in range(n)]
    verify(Placement.from_offsets("stacked", 16, buffers, offsets))
    offsets[70_000] = offsets[123]
    with pytest.raises(PlanError, match=f"buffers 123 and 70000 share bytes .* at op {70_000}"):
        verify(Placement.from_offsets("stacked", 16, buffers, offsets))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([1, 3, 1 << 20]))
def test_verify_by_pairs_finds_what_the_sweep_finds(seed, chunk):
    # Offsets in a small arena, so that buffers collide; some collisions are declared pairs.
    rng = random.Random(seed)
    buffers = random_buffers(rng.randrange(1, 40), seed)
    overlaps = random_overlaps(buffers, seed)
    offsets = [16 * rng.randrange(12) for _ in buffers]
    plan = Placement.from_offsets("random", 16, buffers, offsets, overlaps)
    rules = verifier.declared_overlaps(plan)
    outcomes = []
    saved, verifier.PAIR_CHUNK = verifier.PAIR_CHUNK, chunk  # several chunks, or one
    try:
        for check in (verifier.check_no_shared_bytes, verifier.sweep_shared_bytes):
            try:
                check(plan, rules)
                outcomes.append(None)
            except PlanError as e:
                outcomes.append(str(e))
    finally:
        verifier.PAIR_CHUNK = saved
    assert outcomes[0] == outcomes[1]


def test_greedy_finds_the_placed_buffers_by_life_as_a_plain_scan_would():
    # Lives short and long, so that some blocks of the index are skipped and some are not.
    rng = random.Random(11)
    buffers = []
    for i in range(1_500):
        first = rng.randrange(300)
        life = rng.choice([0, 1, 3, 30, 300])
        buffers.append(Buffer(i, rng.randrange(1, 2000), first, first + life))
    plan = make_plan(buffers, "greedy")
    padded = {b.id: align_up(b.size, 16) for b in buffers}
    placed: list[Buffer] = []
    for b in sorted(buffers, key=lambda b: (-padded[b.id], b.first, b.id)):
        rivals = sorted(
            (plan.offsets[p.id] - padded[b.id], plan.offsets[p.id] + padded[p.id])
            for p in placed
            if p.first <= b.last and p.last >= b.first
        )
        lowest = 0
        for low, high in rivals:
            if lowest <= low:
                break
            lowest = max(lowest, high)
        assert plan.offsets[b.id] == lowest
        placed.append(b)


# -- the wide graph through the CLI ----------------------------------------------------------


def test_a_hundred_thousand_parallel_branches_plan_within_the_time_limit(tmp_path):
    path = tmp_path / "wide.tflite"
    path.write_bytes(wide_model(100_000))
    plan, _ = plan_wide(path, time_limit=2.0, timeout=300)  # a hang guard: the bench times it
    assert len(plan["buffers"]) == 100_002
    assert sorted(plan["order"]) == list(range(100_001))
    # Every y (16 B) and z (1,600,000 B) are live at the join: nothing can go below that.
    assert plan["lower_bound_bytes"] == 100_000 * 16 + 1_600_000
    assert plan["lower_bound_bytes"] <= plan["arena_bytes"] <= plan["naive_bytes"]
    assert plan["arena_bytes"] <= plan["lower_bound_bytes"] + 16


def tops_stub(lives: list[tuple[int, int, int, int]], steps: int) -> SimpleNamespace:
    """What ModelPlan.arena_tops reads of a plan: (first, last, offset, size) per buffer."""
    return SimpleNamespace(
        lifetimes=SimpleNamespace(order=range(steps)),
        plan=SimpleNamespace(buffers=[Buffer(i, size, first, last)
                                      for i, (first, last, _, size) in enumerate(lives)],
                             offsets=[offset for _, _, offset, _ in lives]))


def test_the_arena_top_at_each_step_is_the_highest_live_byte():
    rng = random.Random(7)
    for _ in range(300):
        steps = rng.randint(1, 25)
        lives = []
        for _ in range(rng.randint(0, 12)):
            first = rng.randrange(steps)
            lives.append((first, rng.randint(first, steps - 1), rng.randrange(0, 200, 16),
                          rng.randint(0, 64)))
        expected = [max((o + s for f, la, o, s in lives if f <= at <= la), default=0)
                    for at in range(steps)]
        assert ModelPlan.arena_tops(tops_stub(lives, steps)) == expected


def test_arena_tops_of_a_hundred_thousand_buffers_alive_together_finish():
    """Visiting every step of every life took hours on the wide graph, in `plan` without a time
    limit (a target's plan asks for the tops to find the scratch at the peak)."""
    program = ("from tests.test_bounded import tops_stub\n"
               "from toolchain.lower.plan import ModelPlan\n"
               "n = 100_000\n"
               "tops = ModelPlan.arena_tops(tops_stub([(0, n - 1, 16 * i, 16) for i in range(n)],"
               " n))\n"
               "assert tops == [16 * (n - 1) + 16] * n\n")
    subprocess.run([sys.executable, "-c", program], check=True, timeout=120,
                   cwd=Path(__file__).resolve().parents[1])


# -- the report ------------------------------------------------------------------------------


def many_ifs(count: int) -> bytes:
    """`count` IFs in a row, each with a then and an else subgraph of one op."""
    b = ModelBuilder("float32")
    c = b.input("c", (1,), "bool")
    x, y = b.input("x", (1, 4), "float32"), b.input("y", (1, 4), "float32")
    for i in range(count):
        (x,) = b.if_(c, branch(b, f"then{i}", ["ADD"]), branch(b, f"else{i}", ["SUB"]), [x, y])
    b.output(x)
    return b.build()


def test_subgraph_steps_look_each_step_up_once(monkeypatch):
    """Looking every step up again for every subgraph made 5,000 subgraphs take seconds."""
    mp = plan_model(parse_model(many_ifs(300), "ifs.tflite"))
    program, order = mp.program, mp.lifetimes.order
    expected = {g: [s for s, o in enumerate(order) if program.op_origin(o)[0] == g]
                for g in program.subgraphs}
    looked_up = []
    real = Program.op_origin
    monkeypatch.setattr(Program, "op_origin", lambda self, op: looked_up.append(op)
                        or real(self, op))
    rows = subgraph_steps(mp)
    assert {row["subgraph"]: row["steps"] for row in rows} == expected
    assert len(program.subgraphs) == 601 and len(order) == 900
    assert len(looked_up) <= len(order) + 2 * len(program.subgraphs)


# -- offsets from outside --------------------------------------------------------------------

CHAIN = [Buffer(0, 100, 0, 1), Buffer(1, 200, 1, 2), Buffer(2, 300, 2, 2)]


@pytest.mark.parametrize(
    ("field", "shown"),
    [
        ("1_6", "'1_6'"),
        ("+16", "'+16'"),
        ("1 6", "'1 6'"),
        ("16.0", "'16.0'"),
        ("1e3", "'1e3'"),
        ("0x10", "'0x10'"),
        ("\u0661\u0666", "'\u0661\u0666'"),  # Arabic-Indic digits: int() takes them
        ("", "''"),
    ],
)
def test_offsets_are_plain_decimals(field, shown):
    text = f"id,offset\n0,0\n1,{field}\n2,0\n"
    message = f"^<csv>: line 3: offset {re.escape(shown)} is not a whole number$"
    with pytest.raises(PlanError, match=message):
        load_offsets(io.StringIO(text), CHAIN)


@pytest.mark.parametrize("offset", [str(2**32), str(2**40), str(10**30), "9" * 5000])
def test_offsets_of_4_gib_and_more_are_refused(offset):
    text = f"id,offset\n0,0\n1,{offset}\n2,0\n"
    with pytest.raises(PlanError, match=f"line 3: offset {offset[:20]}.* is too large") as error:
        load_offsets(io.StringIO(text), CHAIN)
    assert len(str(error.value)) < 120  # one readable line, however long the number
    text = f"id,offset\n0,0\n1,{2**32 - 16}\n2,0\n"
    assert load_offsets(io.StringIO(text), CHAIN)[1] == 2**32 - 16


def test_ids_and_problem_fields_are_plain_decimals_too():
    with pytest.raises(PlanError, match=r"line 2: id '\+1' is not a whole number"):
        load_offsets(io.StringIO("id,offset\n+1,0\n"), CHAIN)
    with pytest.raises(PlanError, match="line 3: size '1_0' is not a whole number"):
        load_buffers(io.StringIO("id,lower,upper,size\n0,0,1,4\n1,0,1,1_0\n"))
    with pytest.raises(PlanError, match=f"line 2: upper {2**40} is too large"):
        load_buffers(io.StringIO(f"id,lower,upper,size\n0,0,{2**40},4\n"))
    with pytest.raises(PlanError, match="line 2: offset must not be negative, got -16"):
        load_offsets(io.StringIO("id,offset\n0,-16\n1,0\n2,0\n"), CHAIN)
    # Spaces around a number are not part of it.
    assert load_offsets(io.StringIO("id,offset\n0, 0\n1,304 \n2,0\n"), CHAIN) == {
        0: 0,
        1: 304,
        2: 0,
    }


def test_every_buffer_exactly_once_and_no_stranger():
    with pytest.raises(PlanError, match="line 5: buffer id 1 appears twice"):
        load_offsets(io.StringIO("id,offset\n0,0\n1,304\n2,0\n1,0\n"), CHAIN)
    with pytest.raises(PlanError, match="line 3: no buffer with id 9 in the problem"):
        load_offsets(io.StringIO("id,offset\n0,0\n9,0\n"), CHAIN)
    many = [Buffer(i, 16, 0, 0) for i in range(40)]
    with pytest.raises(PlanError, match=r"no offset for buffer id 1, 2, .*, 10 and 29 more$"):
        load_offsets(io.StringIO("id,offset\n0,0\n"), many)


def test_load_offsets_errors_are_one_line_naming_the_csv(tmp_path, capsys, example_path):
    model = example_path("tiny_cnn_int8")
    solution = tmp_path / "solution.csv"
    solution.write_text("id,offset\n0,1_6\n")
    assert main(["plan", str(model), "--load-offsets", str(solution)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [
        f"arenac: {solution}: line 2: offset '1_6' is not a whole number"
    ]


def test_best_has_a_verified_plan_for_a_hundred_thousand_buffers_in_a_short_limit():
    # `make bench` times this instance; here only the plan is held to its guarantees.
    from tests.bench import random_buffers as bench_buffers

    buffers = bench_buffers(100_000, seed=100_000)
    plan = smallest_plan(buffers, best_candidates(), 16, (),
                         Deadline.after(0.5))
    verify(plan)
    assert len(plan.offsets) == 100_000
    assert lower_bound(buffers, 16) <= plan.arena_bytes <= naive_sum(buffers, 16)
