"""Several memory pools (tightly coupled RAM, SRAM, external PSRAM, ...) instead of one arena.

Pools come in order of speed. Every buffer goes to the fastest pool that can still hold it:
the first pool keeps all it can, and what it sheds (the fewest bytes of the buffers live at
its peak) spills to the next. Each pool is then planned by the usual planners, on its own
buffers and the overlaps among them. The result is one Placement in a joined address space,
pool k's bytes from `arenas[k].base`, so `verify` judges every pool at once; `verify_pools`
adds each pool's bounds and capacity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from toolchain.errors import PlanError
from toolchain.planners.base import (
    NEVER,
    Buffer,
    Deadline,
    Overlap,
    Placement,
    align_up,
    step_loads,
)
from toolchain.planners.registry import FALLBACK, smallest_plan
from toolchain.planners.verify import verify

# The planners that decide what a pool sheds: fast on any input, each better on some.
FAST: tuple[tuple[str, dict[str, object]], ...] = (("greedy", {}), ("freelist", {"fit": "best"}))
SHED_NODES = 20_000  # the search nodes the exact planner may take of each try


@dataclass(frozen=True)
class Pool:
    """A region of RAM: `capacity` bytes, placed by the linker in `section` (None: wherever
    it puts ordinary zero-initialised data)."""

    name: str
    capacity: int
    section: str | None = None


@dataclass(frozen=True)
class PoolArena:
    """What a plan takes of one pool: `bytes` for its buffers, from `base` in the joined
    address space, and `reserved` bytes the pool gives to something else (the state block)."""

    pool: Pool
    base: int
    bytes: int
    reserved: int = 0


@dataclass(frozen=True)
class PooledPlacement:
    """A plan over several pools: offsets in the joined address space, and the pool of each
    buffer (`pool_of[i]` for `placement.buffers[i]`)."""

    placement: Placement
    arenas: tuple[PoolArena, ...]
    pool_of: tuple[int, ...]


class PoolsDoNotFit(PlanError):
    """No assignment of the buffers to the pools fits their capacities."""

    def __init__(self, message: str, step: int, needed: int, pool: int | None = None):
        super().__init__(message)
        self.step, self.needed = step, needed
        self.pool = pool  # the pool its pinned buffers alone overflow, if that is why


def plan_pools(
    buffers: Sequence[Buffer],
    overlaps: Sequence[Overlap],
    pools: Sequence[Pool],
    candidates: Sequence[tuple[str, dict[str, object]]],
    alignment: int = 16,
    pins: Mapping[int, int] | None = None,
    reserved: Sequence[int] = (),
    deadline: Deadline = NEVER,
) -> PooledPlacement:
    """Assign each buffer to a pool and plan every pool with the `candidates` (as
    `smallest_plan` does); `pins` force buffer id -> pool index, and `reserved[k]` bytes of
    pool k are not the buffers' to take. The result is verified (`verify_pools`)."""
    if not pools:
        raise PlanError("no pools to plan into")
    pins = dict(pins or {})
    reserved = [*reserved, *[0] * (len(pools) - len(reserved))]
    left = [b for b in buffers if b.id not in pins]
    # A single fast candidate sheds with its own plans; otherwise the fast planners', which
    # the smallest plan of the candidates can only improve on.
    fast = [c for c in candidates if c[0] != "optimal"]
    shedders = tuple(fast) if len(candidates) == 1 and fast else (FALLBACK, *FAST)
    if len(fast) < len(candidates):  # the exact planner too, for a moment per try
        shedders += (("optimal", {"nodes": SHED_NODES}),)
    chosen: list[tuple[Buffer, ...]] = []
    plans: list[Placement] = []
    for k, pool in enumerate(pools):
        room = pool.capacity - reserved[k]
        fixed = [b for b in buffers if pins.get(b.id) == k]
        last = k == len(pools) - 1
        keep, fitted = shed_to_fit([*fixed, *left], {b.id for b in fixed} |
                                   ({b.id for b in left} if last else set()),
                                   overlaps, room, alignment, shedders, deadline)
        if fitted is None and not last:
            step, needed = peak(fixed, overlaps, alignment)
            raise PoolsDoNotFit(f"the buffers pinned to pool {pool.name} need {needed} bytes "
                                f"at step {step}; it holds {room}", step, needed, k)
        if fitted is None:
            raise does_not_fit(buffers, overlaps, pools, alignment)
        kept = {b.id for b in keep}
        left = [b for b in left if b.id not in kept]
        mine = within(overlaps, kept)
        share = deadline.share(1 / (len(pools) - k))
        plan = smallest_plan(keep, candidates, alignment, mine, share)
        if plan.arena_bytes > room:  # the chosen planner did worse than the one that fitted
            plan = fitted
        chosen.append(tuple(keep))
        plans.append(plan)
    return join(buffers, overlaps, pools, chosen, plans, reserved, alignment)


def shed_to_fit(
    buffers: list[Buffer],
    fixed: set[int],
    overlaps: Sequence[Overlap],
    room: int,
    alignment: int,
    planners: Sequence[tuple[str, dict[str, object]]],
    deadline: Deadline = NEVER,
) -> tuple[list[Buffer], Placement | None]:
    """The buffers a pool of `room` bytes keeps (all of `fixed`, and of the others all it
    can) with a plan of them that fits, or None for the plan when even `fixed` does not fit.

    The peak bound sheds first (`shed`); when a plan still outgrows the room, the bound's
    target drops by the excess (or more: by as much as it dropped so far) and sheds again."""
    target = room
    while True:
        keep = shed(buffers, fixed, overlaps, target, alignment)
        plan = smallest_plan(keep, planners, alignment, within(overlaps, {b.id for b in keep}),
                             deadline)
        if plan.arena_bytes <= room:
            return refill(buffers, keep, plan, overlaps, room, alignment, deadline)
        if all(b.id in fixed for b in keep):
            return keep, None
        # Lower by the excess, and at least double the drop so far: few tries on any model.
        target -= max(plan.arena_bytes - room, room - target, alignment)


def refill(
    buffers: list[Buffer], keep: list[Buffer], plan: Placement, overlaps: Sequence[Overlap],
    room: int, alignment: int, deadline: Deadline,
) -> tuple[list[Buffer], Placement]:
    """Takes back each shed buffer (largest first) that a fast plan still fits in the room: a
    lowered target may have shed more than the room needed."""
    position = {b.id: i for i, b in enumerate(buffers)}
    kept = {b.id for b in keep}
    for b in sorted((b for b in buffers if b.id not in kept), key=lambda b: (-b.size, b.id)):
        if deadline.passed():
            break
        trial = sorted([*keep, b], key=lambda b: position[b.id])
        if peak(trial, overlaps, alignment)[1] > room:
            continue
        candidate = smallest_plan(trial, (FALLBACK, *FAST), alignment,
                                  within(overlaps, {t.id for t in trial}))
        if candidate.arena_bytes <= room:
            keep, plan = trial, candidate
    return keep, plan


def shed(
    buffers: list[Buffer], fixed: set[int], overlaps: Sequence[Overlap], target: int,
    alignment: int,
) -> list[Buffer]:
    """Buffers whose load at every op is at most `target`, shedding few bytes: at the most
    loaded ops that have a buffer to shed (not fixed), the smallest buffer that removes the
    excess on its own, else the largest; then every shed buffer that fits back (largest
    first) returns."""
    keep = list(buffers)
    out: list[Buffer] = []
    while True:
        victim = None
        for load, start, end in sorted(spans(keep, overlaps, alignment), reverse=True):
            if load <= target:
                break
            live = [b for b in keep if b.first < end and b.last >= start and b.id not in fixed]
            if live:
                excess = load - target
                enough = [b for b in live if align_up(b.size, alignment) >= excess]
                victim = min(enough, key=lambda b: (b.size, b.first - b.last, b.id)) if enough \
                    else max(live, key=lambda b: (b.size, b.last - b.first, -b.id))
                break
        if victim is None:
            break
        keep.remove(victim)
        out.append(victim)
    for b in sorted(out, key=lambda b: (-b.size, b.id)):
        if peak([*keep, b], overlaps, alignment)[1] <= target:
            keep.append(b)
    position = {b.id: i for i, b in enumerate(buffers)}
    return sorted(keep, key=lambda b: position[b.id])


def spans(buffers: Sequence[Buffer], overlaps: Sequence[Overlap], alignment: int
          ) -> list[tuple[int, int, int]]:
    """(load, first op, op past the last) of each run of ops where the buffers' load holds."""
    loads = sorted(step_loads(buffers, within(overlaps, {b.id for b in buffers}),
                              alignment).items())
    if not loads:
        return []
    ends = [op for op, _ in loads[1:]] + [max((b.last + 1 for b in buffers), default=0)]
    return [(load, op, end) for (op, load), end in zip(loads, ends, strict=True)]


def peak(buffers: Sequence[Buffer], overlaps: Sequence[Overlap], alignment: int
         ) -> tuple[int, int]:
    """(op, load) where the buffers take the most bytes (the first such op); (0, 0) if none."""
    loads = step_loads(buffers, within(overlaps, {b.id for b in buffers}), alignment)
    largest = max((align_up(b.size, alignment) for b in buffers), default=0)
    step, load = max(loads.items(), key=lambda item: (item[1], -item[0]), default=(0, 0))
    if largest > load:  # one buffer alone is more than any op's bound
        b = max(buffers, key=lambda b: b.size)
        return b.first, largest
    return step, load


def within(overlaps: Sequence[Overlap], ids: set[int]) -> tuple[Overlap, ...]:
    """The overlaps between buffers of one pool: buffers in different pools share nothing."""
    return tuple(o for o in overlaps if o.below in ids and o.above in ids)


def does_not_fit(buffers, overlaps, pools, alignment) -> PoolsDoNotFit:
    step, needed = peak(buffers, overlaps, alignment)
    given = ", ".join(f"{p.name} {p.capacity}" for p in pools)
    return PoolsDoNotFit(f"needs {needed} bytes at step {step}; the pools hold {given} bytes",
                         step, needed)


def join(buffers, overlaps, pools, chosen, plans, reserved, alignment) -> PooledPlacement:
    """One Placement of every pool's plan: pool k from the end of pool k-1, padded."""
    offset_of, pool_of, arenas, base = {}, {}, [], 0
    for k, (pool, keep, plan) in enumerate(zip(pools, chosen, plans, strict=True)):
        for b, offset in zip(keep, plan.offsets, strict=True):
            offset_of[b.id], pool_of[b.id] = base + offset, k
        arenas.append(PoolArena(pool, base, plan.arena_bytes, reserved[k]))
        base += align_up(plan.arena_bytes, alignment)
    kept = [o for o in overlaps if pool_of[o.below] == pool_of[o.above]]
    placement = Placement.from_offsets(
        "+".join(dict.fromkeys(p.planner for p in plans if p.buffers)) or plans[0].planner,
        alignment, buffers, [offset_of[b.id] for b in buffers], kept)
    pooled = PooledPlacement(placement, tuple(arenas), tuple(pool_of[b.id] for b in buffers))
    verify_pools(pooled)
    return pooled


def verify_pools(pooled: PooledPlacement) -> None:
    """Raises PlanError unless the joined plan is safe (`verify`), each buffer lies inside its
    own pool, each pool within its capacity, and the pools do not overlap."""
    plan, arenas = pooled.placement, pooled.arenas
    verify(plan)
    if len(pooled.pool_of) != len(plan.buffers):
        raise PlanError(f"{len(pooled.pool_of)} pool numbers for {len(plan.buffers)} buffers")
    end = 0
    for a in arenas:
        if a.base < end or a.base % plan.alignment:
            raise PlanError(f"pool {a.pool.name} starts at {a.base}, inside the pool before it "
                            "or unaligned")
        if a.bytes + a.reserved > a.pool.capacity:
            raise PlanError(f"pool {a.pool.name} holds {a.pool.capacity} bytes; the plan puts "
                            f"{a.bytes + a.reserved} there")
        end = a.base + a.bytes
    for b, offset, k in zip(plan.buffers, plan.offsets, pooled.pool_of, strict=True):
        if not 0 <= k < len(arenas):
            raise PlanError(f"buffer {b.id} is in pool {k}, which the plan does not have")
        a = arenas[k]
        if b.size and not a.base <= offset <= offset + b.size <= a.base + a.bytes:
            raise PlanError(f"buffer {b.id} bytes [{offset - a.base}, "
                            f"{offset - a.base + b.size}) lie outside pool {a.pool.name} "
                            f"[0, {a.bytes})")
