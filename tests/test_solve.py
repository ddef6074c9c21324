"""The canonical search (compiled and Python) and `arenac solve`: optimal against brute force,
the same answers on both paths, verified solutions of MiniMalloc's published problems, and the
error contract of the command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.bench import random_buffers as bench_buffers
from tests.conftest import ALLOCATION_PROBLEMS, needs_allocation_problems
from tests.test_optimal import HANG_GUARD, brute_force_optimum
from tests.test_planners import problems, random_buffers
from toolchain.planners import (
    NEVER,
    Buffer,
    Deadline,
    Placement,
    align_up,
    canonical,
    lower_bound,
    lower_bound_with_overlaps,
    optimal,
    verify,
)
from toolchain.planners.csvio import dump_buffers, load_buffers, load_offsets
from toolchain.planners.optimal import independent_parts
from toolchain.planners.skyline import skyline

pytestmark = pytest.mark.filterwarnings("error")


@pytest.fixture(params=["compiled", "python"])
def search_path(request, monkeypatch):
    """Each test runs on both paths of the search; the compiled one must build wherever a C
    compiler is installed (CI has one)."""
    if request.param == "python":
        monkeypatch.setenv("ARENAC_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("ARENAC_PURE_PYTHON", raising=False)
    canonical._core.cache_clear()
    if request.param == "compiled":
        assert shutil.which("cc"), "no C compiler: the compiled search cannot be tested"
        assert canonical.compiled_available()
    yield request.param
    canonical._core.cache_clear()


def smallest_fit(buffers, overlaps, alignment) -> int:
    """The least capacity the search finds a plan for, by bisection between the lower bound and
    the sum of the sizes; every "no" on the way must be a proof, every plan must verify."""
    low = lower_bound_with_overlaps(buffers, overlaps, alignment)  # may not fit
    high = sum(align_up(b.size, alignment) for b in buffers)  # always fits
    while low < high:
        capacity = (low + high) // 2
        answer = optimal.fits(buffers, capacity, alignment, overlaps,
                              deadline=Deadline.after(HANG_GUARD))
        if answer.status == "found":
            plan = Placement.from_offsets("optimal", alignment, buffers, answer.offsets, overlaps)
            verify(plan)
            assert plan.arena_bytes <= capacity
            high = plan.arena_bytes
        else:
            assert answer.status == "infeasible"
            low = capacity + 1
    return high


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # the fixture picks a path
@given(problem=problems(max_size=5), alignment=st.sampled_from([1, 16]))
def test_the_smallest_capacity_that_fits_is_the_optimum(search_path, problem, alignment):
    buffers, overlaps = problem
    assert smallest_fit(buffers, overlaps, alignment) == brute_force_optimum(
        buffers, overlaps, alignment
    )


def test_both_paths_answer_alike_on_larger_problems(monkeypatch):
    """Found plans verify on either path, and an infeasible capacity is proven on both."""
    for seed in range(6):
        buffers = random_buffers(40, seed=seed)
        bound = lower_bound(buffers, 1)
        statuses = {}
        for path in ("compiled", "python"):
            if path == "python":
                monkeypatch.setenv("ARENAC_PURE_PYTHON", "1")
            canonical._core.cache_clear()
            below = optimal.fits(buffers, bound - 1, 1, deadline=Deadline.after(HANG_GUARD),
                                 node_limit=10**6)
            roomy = optimal.fits(buffers, 2 * bound, 1, deadline=Deadline.after(HANG_GUARD))
            statuses[path] = below.status, roomy.status
            assert roomy.search == path
            verify(Placement.from_offsets("optimal", 1, buffers, roomy.offsets))
            monkeypatch.delenv("ARENAC_PURE_PYTHON", raising=False)
        assert statuses["compiled"] == statuses["python"] == ("infeasible", "found")
    canonical._core.cache_clear()


def test_a_node_limit_makes_the_answer_the_same_on_every_run(search_path):
    buffers = random_buffers(120, seed=3)
    capacity = lower_bound(buffers, 1)
    first = optimal.fits(buffers, capacity, 1, deadline=Deadline.after(HANG_GUARD), node_limit=500)
    second = optimal.fits(buffers, capacity, 1, deadline=Deadline.after(HANG_GUARD), node_limit=500)
    assert first == second
    assert first.nodes <= 500


def test_nothing_to_place_fits_anywhere(search_path):
    answer = optimal.fits([], 0, 16)
    assert answer.status == "found" and answer.offsets == ()


@needs_allocation_problems
@pytest.mark.parametrize("path", ALLOCATION_PROBLEMS, ids=lambda p: p.name.split(".")[0])
def test_minimalloc_problems_are_solved_at_their_capacity(path):
    """Each of the published problems fits the capacity in its name; the solution verifies.
    (How long each takes is measured by `make bench`, section `solve`.)"""
    canonical._core.cache_clear()
    buffers = load_buffers(path)
    capacity = int(path.name.split(".")[1])
    answer = optimal.fits(buffers, capacity, 1, deadline=Deadline.after(HANG_GUARD))
    assert answer.status == "found" and answer.search == "compiled"
    plan = Placement.from_offsets("optimal", 1, buffers, answer.offsets)
    verify(plan)
    assert plan.arena_bytes <= capacity


# --- arenac solve -----------------------------------------------------------------------------


def arenac(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolchain.cli", *args], capture_output=True, text=True
    )


@pytest.fixture
def problem_csv(tmp_path):
    buffers = random_buffers(60, seed=11)
    path = tmp_path / "problem.csv"
    dump_buffers(buffers, path)
    return path, buffers


def test_solve_writes_a_verified_solution_within_the_capacity(problem_csv, tmp_path):
    path, buffers = problem_csv
    capacity = lower_bound(buffers, 1) * 5 // 4
    out = tmp_path / "solution.csv"
    done = arenac("solve", str(path), "--capacity", str(capacity), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"fits the capacity of {capacity:,}" in done.stdout
    offsets = load_offsets(out, buffers)
    plan = Placement.from_offsets("x", 1, buffers, [offsets[b.id] for b in buffers])
    verify(plan)
    assert plan.arena_bytes <= capacity


def test_solve_without_a_capacity_finds_the_smallest_it_can(problem_csv):
    path, buffers = problem_csv
    done = arenac("solve", str(path), "--time-limit", "5", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["solved"] and data["lower_bound"] <= data["arena_bytes"]
    assert data["lower_bound"] >= lower_bound(buffers, 1)


def test_a_capacity_question_beyond_the_compiled_search_is_answered_at_once(tmp_path):
    # 5,000 buffers in one part: no search takes them (a Python node weighs up every member:
    # before, this question did not end in minutes), so the heuristics' plan answers within the
    # capacity, the lower bound below it, and neither in between.
    buffers = bench_buffers(5_000, seed=11)
    assert len(independent_parts(buffers, [b.size for b in buffers])) == 1
    dive = skyline(buffers, 1, NEVER)
    arena = Placement.from_offsets("skyline", 1, buffers, dive).arena_bytes
    bound = lower_bound(buffers, 1)
    path = tmp_path / "large.csv"
    dump_buffers(buffers, path)
    done = arenac("solve", str(path), "--capacity", str(arena), "--json", "-o",
                  str(tmp_path / "solution.csv"))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["solved"], data["search"], data["nodes"]) == (True, "heuristics", 0)
    assert data["arena_bytes"] <= arena
    offsets = load_offsets(tmp_path / "solution.csv", buffers)
    verify(Placement.from_offsets("x", 1, buffers, [offsets[b.id] for b in buffers]))
    below = optimal.fits(buffers, bound - 1, 1, deadline=Deadline.after(HANG_GUARD))
    assert (below.status, below.search) == ("infeasible", "heuristics")
    between = optimal.fits(buffers, bound, 1, deadline=Deadline.after(HANG_GUARD))
    assert (between.status, between.nodes) == ("out_of_nodes", 0)


def test_solve_below_the_lower_bound_is_proven_impossible(problem_csv, tmp_path):
    path, buffers = problem_csv
    out = tmp_path / "solution.csv"
    done = arenac("solve", str(path), "--capacity", str(lower_bound(buffers, 1) - 1), "-o",
                  str(out))
    assert done.returncode == 1
    assert "(proven)" in done.stdout
    assert not out.exists()


@pytest.mark.parametrize(
    "text, said",
    [
        ("id,lower,upper\n0,0,1\n", "size"),
        ("id,lower,upper,size\n0,0,1,x\n", "x"),
        ("id,lower,upper,size\n0,3,1,8\n", "upper"),
        ("id,lower,upper,size\n0,1,3,8\n0,2,4,8\n", "appears twice"),
        ("id,lower,upper,size\n0,1,3,+8\n", "+8"),
        ("id,lower,upper,size\n0,1,3,99999999999999999999999\n", "size"),
    ],
)
def test_a_bad_problem_file_is_one_line_and_exit_2(tmp_path, text, said):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    done = arenac("solve", str(path))
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and said in lines[0]


def test_an_unwritable_solution_path_is_one_line_and_exit_2(problem_csv, tmp_path):
    path, _ = problem_csv
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    done = arenac("solve", str(path), "--capacity", "100000000", "-o",
                  str(not_a_folder / "s.csv"))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "s.csv" in done.stderr


@pytest.mark.parametrize("capacity", [2**63 - 1, 2**64 - 1, 2**64, 10**30])
def test_a_capacity_past_every_integer_type_is_unbounded_not_infeasible(problem_csv,
                                                                       capacity):
    path, buffers = problem_csv
    done = arenac("solve", str(path), "--capacity", str(capacity), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert data["solved"] and not data["proven_infeasible"]
    assert data["arena_bytes"] <= sum(b.size for b in buffers)


def test_lives_two_billion_steps_apart_solve_in_memory_of_the_buffers(tmp_path):
    path = tmp_path / "far.csv"
    path.write_text("id,lower,upper,size\n0,0,2,100\n1,2000000000,2000000001,60\n"
                    "2,1,2000000001,40\n")
    done = subprocess.run([sys.executable, "-c", (
        "import resource, sys; from toolchain.cli import main; "
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
        f"sys.exit(main(['solve', {str(path)!r}, '--json']))")],
        capture_output=True, text=True, timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["arena_bytes"] == 140


def test_a_size_beyond_int64_in_a_problem_is_one_line(tmp_path):
    path = tmp_path / "huge.csv"
    path.write_text(f"id,lower,upper,size\n0,0,2,{2**64 + 5}\n")
    done = arenac("solve", str(path))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "too large" in done.stderr


@pytest.mark.parametrize("value", ["-1", str(2**32)])
def test_a_seed_out_of_range_is_refused_in_one_line(value):
    done = arenac("check", "model.tflite", "--seed", value)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "seed must be" in done.stderr


def test_plain_files_read_the_same_at_once_as_field_by_field(tmp_path):
    """The whole-column reading of plain files (every field digits, spaces around them) gives
    the buffers the field-by-field reading gives."""
    from toolchain.planners.csvio import _numbers, _read_lines

    path = tmp_path / "p.csv"
    path.write_text("size, id ,upper,lower\n 0016,0,5,2\n7 ,3 ,9,8\n4096,1,2,1\n")
    source, header, lines = _read_lines(str(path), ("id", "lower", "upper", "size"), ())
    rows = _numbers(source, header, lines)
    assert load_buffers(str(path)) == [
        Buffer(r["id"], r["size"], r["lower"], r["upper"] - 1) for _, r in rows]
    assert load_buffers(str(path))[0] == Buffer(0, 16, 2, 4)


def test_the_sweep_bound_is_the_bound_of_every_op():
    """lower_bound's sorted sweep equals the most padded bytes alive at any op, counted op by
    op, on random small problems."""
    import random

    rng = random.Random(7)
    for _ in range(500):
        alignment = rng.choice([1, 4, 16])
        buffers = []
        for i in range(rng.randrange(0, 25)):
            first = rng.randrange(12)
            buffers.append(Buffer(i, rng.randrange(0, 100), first, first + rng.randrange(6)))
        by_op = [sum(-(-b.size // alignment) * alignment for b in buffers
                     if b.first <= op <= b.last) for op in range(20)]
        assert lower_bound(buffers, alignment) == max(by_op, default=0)


def test_a_greedy_plan_cut_by_its_deadline_is_completed_by_stacking():
    """Out of time, the greedy planner says which buffers it placed (its largest); stacking the
    rest above them is a valid plan."""
    from toolchain.planners import OutOfTime, make_plan
    from toolchain.planners.base import stacked_above

    buffers = random_buffers(20_000, seed=9)
    with pytest.raises(OutOfTime) as cut:
        make_plan(buffers, "greedy", 16, deadline=Deadline.after(0.02))
    placed = cut.value.placed
    assert len(placed) < len(buffers)
    padded = [align_up(b.size, 16) for b in buffers]
    left = [padded[i] for i in range(len(buffers)) if i not in placed]
    assert min((padded[i] for i in placed), default=max(left)) >= max(left)
    offsets = stacked_above(buffers, placed, 16)
    assert all(offsets[i] == at for i, at in placed.items())
    verify(Placement.from_offsets("greedy", 16, buffers, offsets))
