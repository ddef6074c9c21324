"""The planners by name, and the calls that run them: `make_plan` (one planner) and
`smallest_plan` (the smallest verified plan of several), both verified before they return.

A new planner is one module with a `Planner` subclass and one line in `PLANNERS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from toolchain.errors import PlanError
from toolchain.planners.base import (
    NEVER,
    VERIFY_SECONDS_PER_BUFFER,
    Buffer,
    Deadline,
    OutOfTime,
    Overlap,
    Placement,
    Planner,
    check_overlaps,
)
from toolchain.planners.freelist import FreeListPlanner
from toolchain.planners.greedy import GreedyPlanner
from toolchain.planners.naive import NaivePlanner
from toolchain.planners.optimal import OptimalPlanner
from toolchain.planners.tflm import TFLMPlanner
from toolchain.planners.verify import verify

PLANNERS: dict[str, type[Planner]] = {
    GreedyPlanner.name: GreedyPlanner,
    FreeListPlanner.name: FreeListPlanner,
    NaivePlanner.name: NaivePlanner,
    OptimalPlanner.name: OptimalPlanner,
    TFLMPlanner.name: TFLMPlanner,
}


# Fast on any input and never gives up (at its deadline it stacks what is left above its
# plan): planned first, and whenever nothing else finished.
FALLBACK: tuple[str, dict[str, object]] = ("freelist", {"fit": "first"})
# Measured on 100,000 random buffers, with margin: what FALLBACK costs per buffer, kept back
# from the planners so that the verified plan arrives by the deadline.
FALLBACK_SECONDS_PER_BUFFER = 1.5e-5


def make_plan(
    buffers: Sequence[Buffer],
    planner: str = "greedy",
    alignment: int = 16,
    overlaps: Sequence[Overlap] = (),
    deadline: Deadline = NEVER,
    **options: object,
) -> Placement:
    """Plans `buffers` with the named planner and returns the plan only once `verify` accepts it.

    The plan keeps the caller's buffers and overlaps (and so their ids); planners number
    buffers by position. A planner that reaches `deadline` without a plan raises OutOfTime.
    """
    plan = _unverified_plan(buffers, planner, alignment, overlaps, deadline, options)
    verify(plan)
    return plan


def smallest_plan(
    buffers: Sequence[Buffer],
    candidates: Sequence[tuple[str, dict[str, object]]],
    alignment: int = 16,
    overlaps: Sequence[Overlap] = (),
    deadline: Deadline = NEVER,
) -> Placement:
    """The smallest plan of the (planner, options) `candidates` that finish by `deadline`
    (the first of equals, in their order), once `verify` accepts it.

    The time `verify` will take is kept back from the planners. `FALLBACK` runs first when it
    is a candidate; the others take turns, the exact planner last (it improves its plan for as
    long as it may), each with an equal share of the time left at its turn, less what the
    fallback needs while there is no plan yet; once the deadline has passed, none starts if
    there is a plan already. If none finished, the fallback plans with what is left. So there
    is a plan by the deadline, on any input. Only the winner is verified: a check costs as
    much as a fast planner, and the winner is the only plan anyone uses.
    """
    work = deadline.earlier(VERIFY_SECONDS_PER_BUFFER * len(buffers))

    def fallback() -> Placement:
        return _unverified_plan(buffers, FALLBACK[0], alignment, overlaps, work, FALLBACK[1])

    plans: dict[int, Placement] = {}
    if FALLBACK in candidates:
        plans[list(candidates).index(FALLBACK)] = fallback()
    turns = sorted(
        (rank for rank in range(len(candidates)) if rank not in plans),
        key=lambda rank: candidates[rank][0] == OptimalPlanner.name,
    )
    for done, rank in enumerate(turns):
        if plans and work.passed():
            break
        until = work if plans else work.earlier(FALLBACK_SECONDS_PER_BUFFER * len(buffers))
        name, options = candidates[rank]
        share = until.share(1 / (len(turns) - done))
        try:
            plans[rank] = _unverified_plan(buffers, name, alignment, overlaps, share, options)
        except OutOfTime:
            continue
    if not plans:
        plans[len(candidates)] = fallback()
    plan = plans[min(plans, key=lambda rank: (plans[rank].arena_bytes, rank))]
    verify(plan)
    return plan


def _unverified_plan(
    buffers: Sequence[Buffer],
    planner: str,
    alignment: int,
    overlaps: Sequence[Overlap],
    deadline: Deadline,
    options: dict[str, object],
) -> Placement:
    try:
        planner_class = PLANNERS[planner]
    except KeyError:
        raise PlanError(
            f"unknown planner {planner!r}; choose one of {', '.join(PLANNERS)}"
        ) from None
    chosen = planner_class(alignment, deadline=deadline, **options)
    for b in buffers:
        chosen.add_buffer(b.size, b.first, b.last)
    check_overlaps(buffers, overlaps)  # here, so errors name the caller's ids
    position = {b.id: i for i, b in enumerate(buffers)}
    for o in overlaps:
        chosen.add_overlap(position[o.below], position[o.above], o.shift, o.any_offset)
    return replace(chosen.result(), buffers=tuple(buffers), overlaps=tuple(overlaps))
