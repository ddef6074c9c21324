"""`arenac solve`: an allocation problem in MiniMalloc's CSV form, solved directly, so that other
solvers can be compared with ours on the same files.

With a capacity, the question is MiniMalloc's own: a plan within that many bytes (the canonical
search, toolchain/planners/canonical.py). Without one, the exact planner looks for the smallest
arena it can find and prove. Either search stops after `nodes` search nodes, so a solution is
the same on every machine; a time limit, when given, stops it sooner.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass

from toolchain.errors import PlanError
from toolchain.planners import NEVER, Deadline, Placement, lower_bound, make_plan, verify
from toolchain.planners.canonical import compiled_available
from toolchain.planners.csvio import dump_solution, load_buffers
from toolchain.planners.optimal import fits

# The default work budget of `solve`, in search nodes: the published problems need far fewer.
SOLVE_NODES = 100_000_000
# How the text names what answered (Solved.search).
ANSWERED_BY = {"compiled": "compiled search", "python": "Python search",
               "heuristics": "heuristics (too large to search)"}


@dataclass(frozen=True)
class Solved:
    """What `solve` found: `plan` is None when no plan within `capacity` was found; then
    `proven_infeasible` says whether the search proved there is none."""

    problem: str
    buffers: int
    capacity: int | None
    plan: Placement | None
    lower_bound: int
    proven_infeasible: bool
    seconds: float
    nodes: int | None
    search: str  # what answered: "compiled", "python" or "heuristics" (canonical.Answer)

    def as_dict(self) -> dict[str, object]:
        plan = self.plan
        return {
            "problem": self.problem,
            "buffers": self.buffers,
            "capacity": self.capacity,
            "solved": plan is not None,
            "arena_bytes": None if plan is None else plan.arena_bytes,
            "lower_bound": self.lower_bound,
            "proven_optimal": None if plan is None else plan.proven_optimal,
            "proven_infeasible": self.proven_infeasible,
            "seconds": round(self.seconds, 3),
            "nodes": self.nodes,
            "search": self.search,
        }


def solve(path: str, capacity: int | None, time_limit: float | None = None, alignment: int = 1,
          nodes: int = SOLVE_NODES) -> Solved:
    """Reads the problem at `path` and solves it within `nodes` search nodes (and
    `time_limit` seconds, when given)."""
    started = time.monotonic()
    deadline = NEVER if time_limit is None else Deadline.after(time_limit)  # reading included
    buffers = load_buffers(path)
    if capacity is None:  # the exact planner proves its own bound
        plan = make_plan(buffers, "optimal", alignment, deadline=deadline, nodes=nodes)
        seconds = time.monotonic() - started
        return Solved(path, len(buffers), None, plan,
                      plan.bound_bytes or lower_bound(buffers, alignment), False, seconds, None,
                      "compiled" if compiled_available() else "python")
    bound = lower_bound(buffers, alignment)
    answer = fits(buffers, capacity, alignment, deadline=deadline, node_limit=nodes)
    plan = None
    if answer.offsets is not None:
        plan = Placement.from_offsets("optimal", alignment, buffers, answer.offsets)
        verify(plan)
        if plan.arena_bytes > capacity:
            raise PlanError(f"the search returned {plan.arena_bytes} bytes for a capacity of "
                            f"{capacity}", path)
    seconds = time.monotonic() - started
    return Solved(path, len(buffers), capacity, plan, bound, answer.status == "infeasible",
                  seconds, answer.nodes, answer.search)


def solution_csv(solved: Solved) -> str:
    text = io.StringIO()
    dump_solution(solved.plan.buffers, solved.plan.offsets, text)
    return text.getvalue()


def solved_text(solved: Solved) -> str:
    how = f"{solved.seconds:.2f} s, {ANSWERED_BY[solved.search]}"
    if solved.nodes is not None:
        how += f", {solved.nodes:,} nodes"
    head = f"{solved.problem}: {solved.buffers} buffers, lower bound {solved.lower_bound:,} bytes"
    if solved.plan is None:
        verdict = (f"no plan fits in {solved.capacity:,} bytes (proven)"
                   if solved.proven_infeasible
                   else f"no plan within {solved.capacity:,} bytes found")
        return f"{head}\n{verdict} ({how})"
    arena = solved.plan.arena_bytes
    if solved.capacity is not None:
        verdict = f"a plan of {arena:,} bytes fits the capacity of {solved.capacity:,}"
    elif solved.plan.proven_optimal:
        verdict = f"a plan of {arena:,} bytes, proven optimal"
    else:
        verdict = f"a plan of {arena:,} bytes ({arena - solved.lower_bound:,} above the bound)"
    return f"{head}\n{verdict}, verified ({how})"
