"""An independent check that a plan is safe to run, whoever made it.

It shares no code with the planners (it does not even pad sizes): a planner bug cannot hide
behind a helper that the check also trusts, and offsets loaded from outside get the same scrutiny.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

import numpy as np

from toolchain.errors import PlanError
from toolchain.planners.base import Overlap, Placement

# Pairs of buffers that share addresses (whatever their lives) per buffer, beyond which the
# sweep is the faster check; and how many such pairs are tested at once.
PAIRS_PER_BUFFER = 64
PAIR_CHUNK = 1 << 20


def verify(plan: Placement) -> None:
    """Raises PlanError unless every buffer sits aligned inside the arena and no two buffers
    alive at the same op share a byte (judged by their real, unpadded sizes and shifts) except
    as one of the plan's declared overlaps allows."""
    check_each_buffer(plan)
    check_no_shared_bytes(plan, declared_overlaps(plan))


def check_each_buffer(plan: Placement) -> None:
    if len(plan.offsets) != len(plan.buffers):
        raise PlanError(f"plan has {len(plan.offsets)} offsets for {len(plan.buffers)} buffers")
    if plan.alignment < 1:
        raise PlanError(f"plan alignment must be positive, not {plan.alignment}")
    if plan.arena_bytes < 0:
        raise PlanError(f"plan arena size must not be negative, not {plan.arena_bytes}")
    if _all_in_order(plan):
        return
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


def _all_in_order(plan: Placement) -> bool:
    """Whether every buffer passes `check_each_buffer`'s tests, all at once (numpy); the loop
    then only runs to name the first that fails."""
    n = len(plan.buffers)
    if n == 0:
        return True
    if not -(2**62) < plan.arena_bytes < 2**62:
        return False  # the sums below could leave int64: the loop works it out
    try:
        ids = np.fromiter((b.id for b in plan.buffers), np.int64, n)
        sizes = np.fromiter((b.size for b in plan.buffers), np.int64, n)
        firsts = np.fromiter((b.first for b in plan.buffers), np.int64, n)
        lasts = np.fromiter((b.last for b in plan.buffers), np.int64, n)
        offsets = np.asarray(plan.offsets, dtype=np.int64)
    except OverflowError:
        return False
    return bool(
        len(np.unique(ids)) == n
        and (sizes >= 0).all()
        and (firsts <= lasts).all()
        and not (offsets % plan.alignment).any()
        and (offsets >= 0).all()
        and (offsets + sizes <= plan.arena_bytes).all()
    )


def declared_overlaps(plan: Placement) -> dict[frozenset[int], Overlap]:
    """The plan's overlaps by the pair of buffer positions they join, once each checked sound:
    two distinct buffers of the plan, a shift >= 0, and lives that meet at the op where
    `below` starts and `above` ends (the only op the kernel's reasoning covers)."""
    index_of = {b.id: index for index, b in enumerate(plan.buffers)}
    rules: dict[frozenset[int], Overlap] = {}
    for o in plan.overlaps:
        missing = [i for i in (o.below, o.above) if i not in index_of]
        if missing:
            raise PlanError(f"overlap names buffer id {missing[0]}, which the plan does not have")
        below, above = plan.buffers[index_of[o.below]], plan.buffers[index_of[o.above]]
        pair = frozenset((index_of[o.below], index_of[o.above]))
        if len(pair) == 1:
            raise PlanError(f"overlap pairs buffer {o.below} with itself")
        if pair in rules:
            raise PlanError(f"overlap of buffers {o.below} and {o.above} is declared twice")
        if o.shift < 0:
            raise PlanError(f"overlap of buffers {o.below} and {o.above} has shift {o.shift} < 0")
        if below.first != above.last:
            raise PlanError(
                f"overlap of buffer {o.below} below buffer {o.above}: their lives "
                f"[{below.first}, {below.last}] and [{above.first}, {above.last}] do not meet "
                f"at {o.below}'s first op"
            )
        rules[pair] = o
    return rules


def check_no_shared_bytes(plan: Placement, rules: dict[frozenset[int], Overlap]) -> None:
    """Raises PlanError for the first pair of live buffers (in the order the ops run) that
    share a byte no rule allows.

    Two buffers share a byte only if one starts inside the other. With the non-empty buffers
    sorted by offset, each one's bytes hold the starts of a contiguous run of the buffers after
    it, found by binary search: when those runs are short, as in any plan that reuses memory
    sensibly, every such pair is tested for lives that meet at once (numpy), in chunks;
    otherwise the sweep below does the work.
    """
    n = len(plan.buffers)
    if plan.arena_bytes >= 2**62:  # offset + size might not fit in int64
        sweep_shared_bytes(plan, rules)
        return
    try:
        sizes = np.fromiter((b.size for b in plan.buffers), np.int64, n)
        offsets = np.asarray(plan.offsets, dtype=np.int64)
        firsts = np.fromiter((b.first for b in plan.buffers), np.int64, n)
        lasts = np.fromiter((b.last for b in plan.buffers), np.int64, n)
    except OverflowError:
        sweep_shared_bytes(plan, rules)
        return
    order = np.flatnonzero(sizes > 0)  # An empty buffer has no byte to share.
    order = order[np.argsort(offsets[order], kind="stable")]
    starts = offsets[order]
    runs = np.searchsorted(starts, starts + sizes[order], side="left") - np.arange(len(order)) - 1
    if int(runs.sum()) > PAIRS_PER_BUFFER * len(order) + PAIR_CHUNK:
        sweep_shared_bytes(plan, rules)
        return
    before = np.concatenate(([0], np.cumsum(runs)))  # pairs of the rows before each row
    met = []
    row = 0
    while row < len(order):
        end = max(int(np.searchsorted(before, before[row] + PAIR_CHUNK, side="right")) - 1, row + 1)
        counts = runs[row:end]
        lower = np.repeat(np.arange(row, end), counts)
        upper = lower + 1 + np.arange(len(lower)) - np.repeat(before[row:end] - before[row], counts)
        a, b = order[lower], order[upper]
        meet = (firsts[a] <= lasts[b]) & (firsts[b] <= lasts[a])
        met += zip(a[meet].tolist(), b[meet].tolist(), strict=True)
        row = end
    # Report as the ops run: by the op where the later-born of a pair is born, the earlier first.
    born = [(plan.buffers[i].first, i) for i in range(len(plan.buffers))] if met else []
    pairs = sorted((min(born[a], born[b]), max(born[a], born[b])) for a, b in met)
    for (_, earlier), (op, later) in sorted(pairs, key=lambda pair: (pair[1], pair[0])):
        check_pair(plan, rules, earlier, later, op)


def sweep_shared_bytes(plan: Placement, rules: dict[frozenset[int], Overlap]) -> None:
    """Sweeps the ops in order, keeping the byte ranges alive at the current op in groups sorted
    by offset: a group is one range, or ranges chained together by allowed overlaps.

    Groups are disjoint, so a new range meets only the groups from its left neighbour up to its
    end, and each group it meets must hold a partner it may overlap (or the plan is wrong):
    O(n log n) comparisons instead of all pairs, overlaps or not.
    """
    events = []  # (op, 0 = dies before this op / 1 = born at it, index); deaths sort first.
    for index, b in enumerate(plan.buffers):
        if b.size > 0:  # An empty buffer has no byte to share.
            events += [(b.first, 1, index), (b.last + 1, 0, index)]
    events.sort()
    starts = SortedInts()  # of the groups, which stay disjoint
    groups: dict[int, tuple[int, list[int]]] = {}  # start -> (end, member indices)
    for op, born, index in events:
        offset = plan.offsets[index]
        at = starts.floor(offset)  # the group starting at or before this range
        if not born:
            _, members = groups.pop(at)
            starts.remove(at)
            if len(members) > 1:
                for start, end, part in grouped(plan, [m for m in members if m != index]):
                    groups[start] = (end, part)
                    starts.add(start)
            continue
        end = offset + plan.buffers[index].size
        met = [at] if at is not None and groups[at][0] > offset else []
        met += starts.between(offset + 1, end)
        if not met:  # the usual case: the range shares no byte with anything alive
            groups[offset] = (end, [index])
            starts.add(offset)
            continue
        members = [m for start in met for m in groups[start][1]]
        for other in members:
            check_pair(plan, rules, other, index, op)
        for start in met:
            del groups[start]
            starts.remove(start)
        # One group: each group met the new range.
        [(start, group_end, group)] = grouped(plan, [*members, index])
        groups[start] = (group_end, group)
        starts.add(start)


class SortedInts:
    """A sorted set of ints in blocks of at most 2 * BLOCK, so that adding or removing one
    moves a block's entries rather than all of them: the sweep above may hold 100,000 groups."""

    BLOCK = 512

    def __init__(self) -> None:
        self.blocks: list[list[int]] = []
        self.lasts: list[int] = []  # the last int of each block

    def _block(self, x: int) -> int:
        """The block that holds x or would: the first whose last int is >= x (else the last)."""
        return min(bisect_left(self.lasts, x), len(self.blocks) - 1)

    def add(self, x: int) -> None:
        if not self.blocks:
            self.blocks, self.lasts = [[x]], [x]
            return
        b = self._block(x)
        block = self.blocks[b]
        insort(block, x)
        self.lasts[b] = block[-1]
        if len(block) > 2 * self.BLOCK:
            self.blocks[b : b + 1] = [block[: self.BLOCK], block[self.BLOCK :]]
            self.lasts[b : b + 1] = [block[self.BLOCK - 1], block[-1]]

    def remove(self, x: int) -> None:
        b = self._block(x)
        block = self.blocks[b]
        del block[bisect_left(block, x)]
        if block:
            self.lasts[b] = block[-1]
        else:
            del self.blocks[b], self.lasts[b]

    def floor(self, x: int) -> int | None:
        """The largest int <= x, if any."""
        b = bisect_left(self.lasts, x)
        if b < len(self.blocks):
            block = self.blocks[b]
            i = bisect_right(block, x)
            if i:
                return block[i - 1]
        return self.lasts[b - 1] if b else None

    def between(self, low: int, high: int) -> list[int]:
        """The ints in [low, high), ascending."""
        found: list[int] = []
        b = bisect_left(self.lasts, low)
        i = bisect_left(self.blocks[b], low) if b < len(self.blocks) else 0
        while b < len(self.blocks):
            block = self.blocks[b]
            j = bisect_left(block, high, i)
            found += block[i:j]
            if j < len(block):
                break
            b, i = b + 1, 0
        return found


def grouped(plan: Placement, members: list[int]) -> list[tuple[int, int, list[int]]]:
    """Splits ranges into groups of ranges chained by shared bytes, sorted by offset."""
    parts: list[tuple[int, int, list[int]]] = []
    for index in sorted(members, key=lambda m: plan.offsets[m]):
        offset = plan.offsets[index]
        end = offset + plan.buffers[index].size
        if parts and parts[-1][1] > offset:
            start, group_end, group = parts[-1]
            parts[-1] = (start, max(group_end, end), [*group, index])
        else:
            parts.append((offset, end, [index]))
    return parts


def check_pair(
    plan: Placement, rules: dict[frozenset[int], Overlap], first: int, second: int, op: int
) -> None:
    """Raises PlanError if two live buffers share a byte that no declared overlap allows."""
    a, b = plan.buffers[first], plan.buffers[second]
    a_offset, b_offset = plan.offsets[first], plan.offsets[second]
    shared_start, shared_end = max(a_offset, b_offset), min(a_offset + a.size, b_offset + b.size)
    if shared_start >= shared_end:
        return
    rule = rules.get(frozenset((first, second)))
    if rule is None:
        reason = ""
    else:
        offset_of = {a.id: a_offset, b.id: b_offset}
        if rule.any_offset or offset_of[rule.below] + rule.shift <= offset_of[rule.above]:
            return
        reason = (
            f"; their overlap needs offset({rule.below}) + {rule.shift} <= offset({rule.above}), "
            f"but {offset_of[rule.below]} + {rule.shift} > {offset_of[rule.above]}"
        )
    raise PlanError(
        f"buffers {a.id} and {b.id} share bytes [{shared_start}, {shared_end}) at op {op}{reason}"
    )
