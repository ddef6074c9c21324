"""An independent check that a plan is safe to run, whoever made it.

It shares no code with the planners (it does not even pad sizes): a planner bug cannot hide
behind a helper that the check also trusts, and offsets loaded from outside get the same scrutiny.
"""

from __future__ import annotations

from bisect import bisect_left

from toolchain.errors import PlanError
from toolchain.planners.base import Plan


def verify(plan: Plan) -> None:
    """Raises PlanError unless every buffer sits aligned inside the arena and no two buffers
    alive at the same op share a byte (judged by their real, unpadded sizes)."""
    check_each_buffer(plan)
    check_no_shared_bytes(plan)


def check_each_buffer(plan: Plan) -> None:
    if len(plan.offsets) != len(plan.buffers):
        raise PlanError(f"plan has {len(plan.offsets)} offsets for {len(plan.buffers)} buffers")
    if plan.alignment < 1:
        raise PlanError(f"plan alignment must be positive, not {plan.alignment}")
    if plan.arena_bytes < 0:
        raise PlanError(f"plan arena size must not be negative, not {plan.arena_bytes}")
    seen: set[int] = set()
    for b, offset in zip(plan.buffers, plan.offsets, strict=True):
        if b.id in seen:
            raise PlanError(f"buffer id {b.id} appears twice in the plan")
        seen.add(b.id)
        if b.size < 0:
            raise PlanError(f"buffer {b.id} has negative size {b.size}")
        if b.first > b.last:
            raise PlanError(f"buffer {b.id} life [{b.first}, {b.last}] ends before it starts")
        if offset % plan.alignment:
            raise PlanError(f"buffer {b.id} offset {offset} is not a multiple of {plan.alignment}")
        if offset < 0 or offset + b.size > plan.arena_bytes:
            raise PlanError(
                f"buffer {b.id} bytes [{offset}, {offset + b.size}) lie outside the arena "
                f"[0, {plan.arena_bytes})"
            )


def check_no_shared_bytes(plan: Plan) -> None:
    """Sweeps the ops in order, keeping the byte ranges alive at the current op sorted by offset.

    While no overlap has been found the live ranges are disjoint, so a new range can only
    collide with its neighbours in that order: O(n log n) comparisons instead of all pairs.
    """
    events = []  # (op, 0 = dies before this op / 1 = born at it, index); deaths sort first.
    for index, b in enumerate(plan.buffers):
        if b.size > 0:  # An empty buffer has no byte to share.
            events += [(b.first, 1, index), (b.last + 1, 0, index)]
    events.sort()
    live: list[tuple[int, int, int]] = []  # (offset, end, index), sorted
    for op, born, index in events:
        offset = plan.offsets[index]
        entry = (offset, offset + plan.buffers[index].size, index)
        at = bisect_left(live, entry)
        if not born:
            del live[at]
            continue
        neighbours = live[max(at - 1, 0) : at + 1]
        for other_offset, other_end, other in neighbours:
            if other_offset < entry[1] and offset < other_end:
                first, second = plan.buffers[other], plan.buffers[index]
                raise PlanError(
                    f"buffers {first.id} and {second.id} share bytes "
                    f"[{max(offset, other_offset)}, {min(entry[1], other_end)}) at op {op}"
                )
        live.insert(at, entry)
