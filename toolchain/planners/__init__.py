"""Memory planners: place plain buffers with known lives into one arena.

A new planner is one module with a `Planner` subclass and one line in `PLANNERS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from toolchain.errors import PlanError
from toolchain.planners.base import (
    Buffer,
    Overlap,
    Plan,
    Planner,
    align_up,
    check_overlaps,
    lower_bound,
    lower_bound_with_overlaps,
    naive_sum,
)
from toolchain.planners.freelist import FreeListPlanner
from toolchain.planners.greedy import GreedyPlanner
from toolchain.planners.naive import NaivePlanner
from toolchain.planners.optimal import OptimalPlanner
from toolchain.planners.verify import verify

PLANNERS: dict[str, type[Planner]] = {
    GreedyPlanner.name: GreedyPlanner,
    FreeListPlanner.name: FreeListPlanner,
    NaivePlanner.name: NaivePlanner,
    OptimalPlanner.name: OptimalPlanner,
}

__all__ = [
    "PLANNERS",
    "Buffer",
    "Overlap",
    "Plan",
    "Planner",
    "align_up",
    "lower_bound",
    "lower_bound_with_overlaps",
    "make_plan",
    "naive_sum",
    "verify",
]


def make_plan(
    buffers: Sequence[Buffer],
    planner: str = "greedy",
    alignment: int = 16,
    overlaps: Sequence[Overlap] = (),
    **options: object,
) -> Plan:
    """Plans `buffers` with the named planner and returns the plan only once `verify` accepts it.

    The plan keeps the caller's buffers and overlaps (and so their ids); planners number
    buffers by position.
    """
    try:
        planner_class = PLANNERS[planner]
    except KeyError:
        raise PlanError(
            f"unknown planner {planner!r}; choose one of {', '.join(PLANNERS)}"
        ) from None
    chosen = planner_class(alignment, **options)
    for b in buffers:
        chosen.add_buffer(b.size, b.first, b.last)
    check_overlaps(buffers, overlaps)  # here, so errors name the caller's ids
    position = {b.id: i for i, b in enumerate(buffers)}
    for o in overlaps:
        chosen.add_overlap(position[o.below], position[o.above], o.shift, o.any_offset)
    plan = replace(chosen.result(), buffers=tuple(buffers), overlaps=tuple(overlaps))
    verify(plan)
    return plan
