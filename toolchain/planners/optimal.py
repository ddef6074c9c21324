"""The exact planner: the smallest arena the lives allow, by branch and bound in the spirit of
MiniMalloc (Moffitt, ASPLOS 2023).

Any plan can be pushed down until no buffer can move lower; taken in order of offset, each
buffer of such a plan sits at its floor, the lowest offset clear of the forbidden ranges
(`Window`) of the buffers placed before it. So the search only chooses which buffer goes next,
at its floor, in non-decreasing order of offset (ties in a fixed preorder). It prunes with:

- capacity: a branch dies once an unplaced buffer's floor plus size exceeds the capacity, or,
  at some op, the unplaced buffers alive there whose floors are at least some f add more than
  the capacity less f (each adds its size less what it may share with earlier partners, as
  `lower_bound_with_overlaps` counts);
- dominance: no buffer goes at or above the top another unplaced buffer would have at its own
  floor, since that one could then drop into the gap below;
- symmetry: buffers equal in size and life (and in no overlap) go in a fixed order;
- decomposition: unplaced buffers that never meet in time are searched group by group, not
  interleaved by offset;
- the lower bound: a plan that meets the best proven bound ends the search.

Each question "is there a plan within C bytes?" is one depth-first search within a node
budget. Rounds ask it for the bound (no: the bound rises one alignment step) and for one step
below the best plan (no: the best is optimal), doubling the budget each round, so neither a
weak bound nor a poor plan stalls the other. Ops that no life crosses split the problem into
parts solved one by one. The heuristics' best plan is the incumbent, so the planner always has
a plan to return when its budget runs out.

The budget is work: `nodes` search nodes, and a part whose setup would pair more than
`SETUP_PAIRS` lives, or with more buffers than the compiled search takes, is left at its
incumbent (a node of the Python search looks at every member: 10,000 random buffers did not
answer one question in minutes). Both are counts, so the plan is the same on
any machine under any load; a deadline (`Deadline`) is a further cap only a caller sets.
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Generator, Sequence
from dataclasses import replace

import numpy as np

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
    Window,
    align_up,
    arena_end,
    charge_order,
    lower_bound_with_overlaps,
    overlap_windows,
    pair_saving,
    preorder,
    stacked_above,
)
from toolchain.planners.canonical import (
    COMPILED_MAX_BUFFERS,
    Answer,
    CompiledProblem,
    compiled_available,
)
from toolchain.planners.freelist import FreeListPlanner
from toolchain.planners.greedy import GreedyPlanner, fill
from toolchain.planners.skyline import skyline

# The default work budget: search nodes over all parts, and the most pairs of meeting lives
# a part's setup may list.
DEFAULT_NODES = 2_000_000
SETUP_PAIRS = 4_000_000
# Members of one search node beyond which its setup looks at the clock as it goes.
LONG_NODE = 256


class OptimalPlanner(Planner):
    """Searches for the smallest arena for up to `nodes` search nodes (`nodes_used` counts
    them), so that what it finds does not depend on the machine; the planner's deadline, when
    a caller gives one, stops it sooner. `result()` tells whether the plan is
    proven optimal and the best lower bound proven (`Placement.bound_bytes`)."""

    name = "optimal"

    def __init__(
        self,
        alignment: int = 16,
        *,
        nodes: int | None = DEFAULT_NODES,
        **options: object,
    ):
        super().__init__(alignment, **options)
        if nodes is not None and (not isinstance(nodes, int) or nodes < 0):
            raise PlanError(f"nodes must be a whole number of search nodes >= 0, not {nodes!r}")
        self.nodes = nodes
        self.nodes_used = 0
        self._bound = 0

    def result(self) -> Placement:
        plan = super().result()  # plans first, which sets the bound
        return replace(
            plan, proven_optimal=plan.arena_bytes == self._bound, bound_bytes=self._bound
        )

    def _place(self, buffers: list[Buffer], overlaps: list[Overlap]) -> list[int]:
        # Leave time for make_plan's verify, so that the verified plan arrives within the budget.
        deadline = self.deadline.earlier(VERIFY_SECONDS_PER_BUFFER * len(buffers))
        nodes_left = self.nodes
        self.nodes_used = 0
        a = self.alignment
        sizes = [align_up(b.size, a) for b in buffers]
        started = time.monotonic()
        offsets = incumbent(buffers, overlaps, a, deadline)
        # the long lives' plan costs about what the heuristics did: only when that much is left
        if deadline.allows(time.monotonic() - started):
            staged = long_lives_first(buffers, overlaps, a, deadline, self.nodes)
            if staged is not None and arena_end(buffers, staged, a) < arena_end(buffers,
                                                                                 offsets, a):
                offsets = staged
        windows = overlap_windows(sizes, overlaps, a)
        bound = lower_bound_with_overlaps(buffers, overlaps, a)
        parts = independent_parts(buffers, sizes)
        parts.sort(key=lambda part: -max(offsets[i] + sizes[i] for i in part))
        for part in parts:
            arena = max(offsets[i] + sizes[i] for i in part)
            if arena <= bound:
                continue  # this part already fits under what the whole needs anyway
            if nodes_left == 0 or deadline.passed() or len(part) > COMPILED_MAX_BUFFERS:
                break  # the largest part left decides the arena: its incumbent stays
            try:
                search = Search(part, buffers, sizes, overlaps, windows, a, deadline, nodes_left)
            except Timeout:
                break
            found, bound = search.solve(bound, {i: offsets[i] for i in part})
            for i, offset in found.items():
                offsets[i] = offset
            self.nodes_used += search.nodes_used
            if nodes_left is not None:
                nodes_left -= search.nodes_used
        self._bound = bound
        return offsets


def incumbent(
    buffers: list[Buffer], overlaps: list[Overlap], alignment: int, deadline: Deadline
) -> list[int]:
    """The best heuristic plan, with the overlaps and (valid too, sometimes smaller) without,
    and the canonical dive (`skyline`, which ignores overlaps): all of them, or under a clock
    deadline at least one and no more once the next would likely run past it."""
    heuristics = [
        GreedyPlanner(alignment, deadline=deadline),  # gives up at the deadline
        FreeListPlanner(alignment, deadline=deadline),  # never does: stacks the rest
        FreeListPlanner(alignment, fit="best", deadline=deadline),
    ]
    best: list[int] = []
    best_arena = 0
    cost = 0.0
    for given in [overlaps, []] if overlaps else [overlaps]:
        for heuristic in heuristics:
            if best and not deadline.allows(cost):
                return best
            started = time.monotonic()
            try:
                found = heuristic._place(buffers, given)
            except OutOfTime as cut:  # the greedy planner's largest buffers, the rest stacked
                if not cut.placed:
                    continue
                found = stacked_above(buffers, cut.placed, alignment)
            finally:
                cost = time.monotonic() - started
            arena = arena_end(buffers, found, alignment)
            if not best or arena < best_arena:
                best, best_arena = found, arena
    if deadline.allows(cost):
        dive = skyline(buffers, alignment, deadline)
        if dive is not None and arena_end(buffers, dive, alignment) < best_arena:
            best = dive
    return best


# The share of the search's nodes the exact plan of the long lives may take
# (long_lives_first).
LONG_LIVES_SHARE = 4


def long_lives_first(buffers: list[Buffer], overlaps: list[Overlap], alignment: int,
                     deadline: Deadline, nodes: int | None) -> list[int] | None:
    """A plan of the buffers that live more than one step, exact within a share of `nodes`,
    with the one-step buffers (most of them kernel scratch) then filled in, largest first, each
    at the lowest offset free at its step; None when there are not both kinds, or no nodes or
    time for a search, or more long lives than the compiled search takes at once (a model has
    far fewer; a search of thousands in Python would take minutes). The heuristics
    place scratch beside the tensors, often at offset 0, and the search keeps that: a chain of
    outputs over their inputs above it then rises by the scratch's size for every step of the
    chain, where this plan puts the scratch in a gap the chain leaves above it."""
    long = [i for i, b in enumerate(buffers) if b.first < b.last]
    short = [i for i, b in enumerate(buffers) if b.first == b.last]
    if not long or not short or nodes == 0 or deadline.passed() \
            or len(long) > COMPILED_MAX_BUFFERS:
        return None  # no search asked for, no time, or too large for a quick one
    local = {i: k for k, i in enumerate(long)}
    planner = OptimalPlanner(alignment, nodes=None if nodes is None else nodes // LONG_LIVES_SHARE,
                             deadline=deadline)
    placed = planner._place(
        [replace(buffers[i], id=local[i]) for i in long],
        [replace(o, below=local[o.below], above=local[o.above]) for o in overlaps
         if o.below in local and o.above in local])
    offsets = [0] * len(buffers)
    for i, offset in zip(long, placed, strict=True):
        offsets[i] = offset
    sizes = [align_up(b.size, alignment) for b in buffers]
    order = sorted(short, key=lambda i: (-sizes[i], buffers[i].first, i))
    try:
        return fill(buffers, sizes, overlap_windows(sizes, overlaps, alignment), order, offsets,
                    long, deadline)
    except OutOfTime:
        return None


def independent_parts(buffers: list[Buffer], sizes: list[int]) -> list[list[int]]:
    """The non-empty buffers split where no life crosses from one op to the next: parts never
    meet, so each can be planned alone from offset 0. Empty buffers stay at 0, in no part."""
    parts: list[list[int]] = []
    reach = -1
    for i in sorted((i for i in range(len(buffers)) if sizes[i]), key=lambda i: buffers[i].first):
        if buffers[i].first > reach:
            parts.append([])
        parts[-1].append(i)
        reach = max(reach, buffers[i].last)
    return parts


class Timeout(Exception):
    """The deadline passed; the search keeps the best plan found so far."""


class OutOfNodes(Exception):
    """One question used up its node budget; a later round asks it again with more."""


class Search:
    """Branch and bound over one part, its buffers renumbered 0..n-1 in preorder ("local")."""

    # A search step: yields (members, low, last) sub-searches, is sent their results.
    Call = Generator[tuple[list[int], int, int], bool | None, bool]

    def __init__(
        self,
        part: list[int],
        buffers: list[Buffer],
        sizes: list[int],
        overlaps: list[Overlap],
        windows: dict[tuple[int, int], Window],
        alignment: int,
        deadline: Deadline,
        node_limit: int | None = None,
    ) -> None:
        self.alignment = alignment
        self.deadline = deadline
        self.node_limit = node_limit  # nodes all of this part's questions may visit together
        self.nodes_used = 0
        members = set(part)
        pairs = [o for o in overlaps if o.below in members and o.above in members]
        section, span = sections(part, buffers, pairs)
        busiest = busiest_bytes(part, span, sizes, len(section))
        # A pair whose padded shift is 0 may share one offset only if `below` goes first (placed
        # after `above`, it must clear it), so the tie order puts `below` first.
        ties = [
            (o.below, o.above)
            for o in pairs
            if not o.any_offset and align_up(o.shift, alignment) == 0
        ]
        if deadline.passed():
            raise Timeout  # each step of the setup is near-linear, but a part may be huge
        order, self.sound = preorder(
            part, lambda i: (-busiest[i], -len(span[i]), -sizes[i], i), ties
        )
        if deadline.passed():
            raise Timeout
        local = {i: n for n, i in enumerate(order)}
        self.order = order
        self.size = [sizes[i] for i in order]
        self.span = [span[i] for i in order]
        self.owed, self.charges = charges(order, local, pairs, buffers, sizes, section, alignment)
        self.neighbours = neighbours(order, local, part, buffers, sizes, windows, deadline)
        self.twin = twins(order, pairs, buffers, sizes)
        # The same questions, answered by the compiled search when there is one.
        self.compiled = None
        if compiled_available() and len(order) <= COMPILED_MAX_BUFFERS:
            self.compiled = CompiledProblem(
                [Buffer(i, sizes[i], buffers[i].first, buffers[i].last) for i in order],
                alignment,
                pairs,
            )
            self.sound = self.sound and self.compiled.sound
        self.first = [buffers[i].first for i in order]
        self.last = [buffers[i].last for i in order]
        self.by_first = sorted(range(len(order)), key=self.first.__getitem__)
        self.offset = [-1] * len(order)
        self.floor = [0] * len(order)
        self.trail: list[tuple[int, list[tuple[int, int]]]] = []
        self.best: list[int] = []
        self.best_arena = 0
        self.cap = 0
        self.nodes_left = 0

    def solve(self, goal: int, start: dict[int, int]) -> tuple[dict[int, int], int]:
        """The smallest arena found for this part, starting from the plan `start`, as offsets by
        buffer id, with the bound the search proved for the whole problem.

        `goal` is a proven bound for the whole problem: a part within it needs no more work.
        Rounds alternate two questions, each within a node budget that doubles every round: is
        there a plan within the bound (if not, the bound rises one alignment step), and one
        halfway between the bound and the best (if not, the bound rises past it; if the budget
        ran out, the next round asks nearer the best)? A weak bound then cannot keep the search
        from improving the plan, nor a poor plan from raising the bound.
        """
        self.best = [start[i] for i in self.order]
        self.best_arena = max(o + s for o, s in zip(self.best, self.size, strict=True))
        bound = goal
        budget = 64 * len(self.order)
        # An exhausted search proves nothing when the tie order is unsound: stop asking then.
        ask_bound = True
        a = self.alignment
        below = None  # how far under the best the next question asks; None: halfway to the bound
        try:
            while self.best_arena > bound:
                if ask_bound and self.fits(bound, budget) is False:
                    if self.sound:
                        bound += a
                    ask_bound = self.sound
                gap = self.best_arena - bound
                step = max(a, (gap // 2 if below is None else below) // a * a)
                ask = max(bound, self.best_arena - step)
                if self.best_arena > bound and (ask > bound or not ask_bound):
                    answer = self.fits(ask, budget)
                    if answer is False:
                        if not self.sound:
                            break
                        bound = ask + a  # nothing fits in `ask`: the bound rises past it
                    below = max(a, step // 2) if answer is None else None
                budget *= 2
        except Timeout:
            pass
        return dict(zip(self.order, self.best, strict=True)), bound

    def fits(self, cap: int, budget: int) -> bool | None:
        """Whether a plan within `cap` exists (it becomes the best), by depth-first search of
        at most `budget` nodes; None if the budget ran out first.

        Each call of `place_all` is a generator that yields the sub-searches it needs and gets
        back whether they succeeded; this loop runs them on an explicit stack, so deep parts
        cannot hit Python's recursion limit.
        """
        if self.compiled is not None:
            return self.compiled_fits(cap, budget)
        self.cap = cap
        self.nodes_left = budget
        stack = [self.place_all(self.by_first, 0, -1)]
        result = None  # what to send the top search: None starts it, then its sub-search's result
        try:
            while stack:
                try:
                    members, low, last = stack[-1].send(result)
                except StopIteration as done:
                    stack.pop()
                    result = done.value
                    continue
                stack.append(self.place_all(members, low, last))
                result = None
        except OutOfNodes:
            result = None
        if result:
            self.best = list(self.offset)
            self.best_arena = max(o + s for o, s in zip(self.offset, self.size, strict=True))
        self.undo(0)
        return result

    def compiled_fits(self, cap: int, budget: int) -> bool | None:
        """`fits`, by the compiled search (whose node count has the same meaning)."""
        if self.node_limit is not None:
            if self.nodes_used >= self.node_limit:
                raise Timeout
            budget = min(budget, self.node_limit - self.nodes_used)
        answer = self.compiled.fits(cap, self.deadline, budget)
        if answer.status == "no_memory":  # the compiled search's lists did not fit: in Python
            problem = self.compiled
            answer = python_fits(problem.buffers, cap, problem.alignment, problem.overlaps,
                                 self.deadline, budget)
        self.nodes_used += answer.nodes
        if answer.status == "found":
            self.best = list(answer.offsets)
            self.best_arena = max(o + s for o, s in zip(self.best, self.size, strict=True))
            return True
        if answer.status == "infeasible":
            return False
        if answer.status == "out_of_time" or (
            self.node_limit is not None and self.nodes_used >= self.node_limit
        ):
            raise Timeout
        return None

    def place_all(self, members: list[int], low: int, last: int) -> Search.Call:
        """Places `members` (sorted by first op) within `cap` at offsets from `low` on (after
        buffer `last` at `low`); yields (members, low, last) for each sub-search. Leaves them
        placed on success; undoes its placements on failure.

        Members that never meet in time are independent once the placed buffers are fixed, so
        they are searched group by group rather than interleaved by offset: a group that
        cannot fit fails the node at once instead of after every order of the others.
        """
        if not members:
            return True
        mark = len(self.trail)
        groups = self.groups(members)
        if len(groups) > 1:
            for group in groups:
                if not (yield group, low, last):
                    self.undo(mark)
                    return False
            return True
        for offset, n in self.branches(members, low, last):
            self.place(n, offset)
            if (yield [m for m in members if m != n], offset, n):
                return True
            self.undo(mark)
        return False

    def groups(self, members: list[int]) -> list[list[int]]:
        """`members` (sorted by first op) split where no life crosses from one op to the next."""
        groups: list[list[int]] = []
        reach = -1
        for n in members:
            if self.first[n] > reach:
                groups.append([])
            groups[-1].append(n)
            reach = max(reach, self.last[n])
        return groups

    def branches(self, members: list[int], low: int, last: int) -> list[tuple[int, int]]:
        """The (offset, buffer) choices for the next of `members` after buffer `last` went to
        offset `low`, lowest first; none if they cannot all fit within `cap`."""
        self.nodes_left -= 1
        if self.nodes_left < 0:
            raise OutOfNodes
        if self.node_limit is not None and self.nodes_used >= self.node_limit:
            raise Timeout  # the node limit ends the search as the deadline would
        self.nodes_used += 1
        if self.deadline.passed():
            raise Timeout
        floor, size, offset, cap = self.floor, self.size, self.offset, self.cap
        tops = [floor[n] + size[n] for n in members]
        if max(tops) > cap:
            return []
        # At each section, the members with floors at or above some f all lie above f and need
        # at least the bytes they add (`count`): f plus those must fit, for every such f.
        adds: dict[int, list[tuple[int, int]]] = {}
        watch = len(members) > LONG_NODE  # a node this big may take long: look at the clock
        for n in members:
            if watch and self.deadline.passed():
                raise Timeout
            owed = self.owed[n]
            at = max(low, floor[n])
            for s in self.span[n]:
                adds.setdefault(s, []).append((at, size[n] - min(size[n], owed.get(s, 0))))
        for section in adds.values():
            section.sort(reverse=True)
            need = 0
            for at, add in section:
                need += add
                if at + need > cap:
                    return []
        # Dominance: a buffer at or above `min(tops)` would leave a gap the member with that
        # top fits into, so the plan could not be pushed down (not canonical).
        ceiling = min(tops)
        twin = self.twin
        return sorted(
            (floor[n], n)
            for n in members
            if (floor[n] > low or (floor[n] == low and n > last))
            and floor[n] < ceiling
            and (twin[n] < 0 or offset[twin[n]] >= 0)
        )

    def place(self, n: int, at: int) -> None:
        """Puts buffer n at offset `at`, raising its neighbours' floors (undone by `undo`)."""
        self.offset[n] = at
        raised = []
        for other, high in self.neighbours[n]:
            if self.offset[other] < 0 and at + high > self.floor[other]:
                raised.append((other, self.floor[other]))
                self.floor[other] = at + high
        self.count(n, -1)
        self.trail.append((n, raised))

    def undo(self, mark: int) -> None:
        """Takes back the placements made since the trail was `mark` long, latest first."""
        while len(self.trail) > mark:
            n, raised = self.trail.pop()
            self.count(n, +1)
            for other, floor in reversed(raised):
                self.floor[other] = floor
            self.offset[n] = -1

    def count(self, n: int, sign: int) -> None:
        """Buffer n rejoins (sign +1) or leaves (-1) the unplaced buffers: its later partners
        may count their savings with it only while it is unplaced."""
        for later, s, saving in self.charges[n]:
            self.owed[later][s] += sign * saving


def sections(part: list[int], buffers: list[Buffer], pairs: list[Overlap]
             ) -> tuple[dict[int, int], dict[int, range]]:
    """The sections of a part (section number by op) and each buffer's span of them.

    Sections are the ops where something is born, and the ops right after a pair's op, where
    its saving ends. Any other op's live set is a subset of the one at the last section before
    it, with no savings at either, so checking the sections checks every op."""
    ops = sorted({buffers[i].first for i in part} | {buffers[o.below].first + 1 for o in pairs})
    section = {op: s for s, op in enumerate(ops)}
    span = {i: range(section[buffers[i].first], bisect_right(ops, buffers[i].last)) for i in part}
    return section, span


def busiest_bytes(part: list[int], span: dict[int, range], sizes: list[int],
                  count: int) -> dict[int, int]:
    """The most bytes live at any section of each buffer's span, by a running sum and a sparse
    table, so a part of long lives costs no more than one of short ones."""
    change = np.zeros(count + 1, dtype=np.int64)
    for i in part:
        change[span[i].start] += sizes[i]
        change[span[i].stop] -= sizes[i]
    most = [np.cumsum(change[:-1])]
    while 2 ** len(most) <= count:
        half = 2 ** (len(most) - 1)
        most.append(np.maximum(most[-1][:-half], most[-1][half:]))
    busiest = {}
    for i in part:
        level = len(span[i]).bit_length() - 1
        table = most[level]
        busiest[i] = int(max(table[span[i].start], table[span[i].stop - 2**level]))
    return busiest


def charges(order: list[int], local: dict[int, int], pairs: list[Overlap],
            buffers: list[Buffer], sizes: list[int], section: dict[int, int], alignment: int
            ) -> tuple[list[dict[int, int]], list[list[tuple[int, int, int]]]]:
    """What each buffer adds to a section's bytes is its size less its savings with earlier
    partners (in `charge_order`) that are still unplaced, never less than 0: per local buffer,
    those savings by section, and the (later partner, section, saving) it owes them."""
    owed: list[dict[int, int]] = [{} for _ in order]
    charged: list[list[tuple[int, int, int]]] = [[] for _ in order]
    for o in pairs:
        saving = max(0, pair_saving(o, sizes[o.below], sizes[o.above], alignment))
        s = section[buffers[o.below].first]
        early, late = sorted((buffers[o.below], buffers[o.above]), key=charge_order)
        savings = owed[local[late.id]]
        savings[s] = savings.get(s, 0) + saving
        charged[local[early.id]].append((local[late.id], s, saving))
    return owed, charged


def neighbours(order: list[int], local: dict[int, int], part: list[int], buffers: list[Buffer],
               sizes: list[int], windows: dict[tuple[int, int], Window], deadline: Deadline
               ) -> list[list[tuple[int, int]]]:
    """Per local buffer p, its (neighbour c, high) pairs: once p sits at offset x, an unplaced
    c has floor >= x + high, where (low, high) is c's window beside p. A part whose lives meet
    in more than SETUP_PAIRS pairs is not searched (Timeout): its incumbent stays."""
    found: list[list[tuple[int, int]]] = [[] for _ in order]
    by_first = sorted(part, key=lambda i: buffers[i].first)
    pairs_listed = 0
    for n, i in enumerate(by_first):
        if deadline.passed():
            raise Timeout  # a huge part: not even worth finishing the setup
        for later in range(n + 1, len(by_first)):
            j = by_first[later]
            if buffers[j].first > buffers[i].last:
                break
            pairs_listed += 1
            if pairs_listed > SETUP_PAIRS:
                raise Timeout  # as many lives meet as in no model: the incumbent stays
            for new, placed in ((i, j), (j, i)):
                window = windows.get((new, placed))
                high = sizes[placed] if window is None else window.high
                found[local[placed]].append((local[new], high))
    return found


def twins(order: list[int], pairs: list[Overlap], buffers: list[Buffer], sizes: list[int]
          ) -> list[int]:
    """Per local buffer, the previous one of the same size and life in no pair (-1 for none):
    such twins are interchangeable, so the search places them in order."""
    twin = [-1] * len(order)
    in_pairs = {i for o in pairs for i in (o.below, o.above)}
    last_twin: dict[tuple[int, int, int], int] = {}
    for n, i in enumerate(order):
        if i not in in_pairs:
            key = (sizes[i], buffers[i].first, buffers[i].last)
            twin[n] = last_twin.get(key, -1)
            last_twin[key] = n
    return twin


def fits(
    buffers: Sequence[Buffer],
    capacity: int,
    alignment: int = 1,
    overlaps: Sequence[Overlap] = (),
    deadline: Deadline = NEVER,
    node_limit: int | None = None,
) -> Answer:
    """Whether `buffers` (ids may be anything; `overlaps` refer to them) fit in `capacity`
    bytes with every offset a multiple of `alignment`, searching for at most `node_limit`
    nodes and until `deadline`. A capacity beyond every padded size stacked is as good as unbounded,
    so it is cut to that sum: the compiled search takes it as an int64. A problem with a part
    beyond the compiled search is answered by the heuristics (`heuristic_fits`)."""
    capacity = min(capacity, sum(align_up(b.size, alignment) for b in buffers))
    if compiled_available() and len(buffers) <= COMPILED_MAX_BUFFERS:
        answer = CompiledProblem(buffers, alignment, overlaps).fits(capacity, deadline, node_limit)
        if answer.status != "no_memory":
            return answer
    return python_fits(buffers, capacity, alignment, overlaps, deadline, node_limit)


def numbered(buffers: Sequence[Buffer], overlaps: Sequence[Overlap]
             ) -> tuple[list[Buffer], list[Overlap]]:
    """The buffers numbered by position, and the overlaps by those numbers."""
    local = [Buffer(k, b.size, b.first, b.last) for k, b in enumerate(buffers)]
    position = {b.id: k for k, b in enumerate(buffers)}
    return local, [Overlap(position[o.below], position[o.above], o.shift, o.any_offset)
                   for o in overlaps]


def heuristic_fits(buffers: list[Buffer], capacity: int, alignment: int,
                   overlaps: list[Overlap], deadline: Deadline) -> Answer:
    """`fits` for a problem with a part beyond the compiled search (neither search answers one
    question on thousands of buffers in reasonable time; OptimalPlanner leaves such a part too):
    found when the heuristics' best plan (`incumbent`, the dives included) fits, infeasible below
    the lower bound, else not decided ("out_of_nodes", no node searched)."""
    if lower_bound_with_overlaps(buffers, overlaps, alignment) > capacity:
        return Answer("infeasible", None, 0, search="heuristics")
    offsets = incumbent(buffers, overlaps, alignment, deadline)
    if arena_end(buffers, offsets, alignment) <= capacity:
        return Answer("found", tuple(offsets), 0, search="heuristics")
    return Answer("out_of_time" if deadline.passed() else "out_of_nodes", None, 0,
                  search="heuristics")


def python_fits(
    buffers: Sequence[Buffer],
    capacity: int,
    alignment: int,
    overlaps: Sequence[Overlap],
    deadline: Deadline,
    node_limit: int | None,
) -> Answer:
    """`fits`, by the Python search: where there is no compiler, or too many buffers; by the
    heuristics (`heuristic_fits`) when a part has more than the compiled search takes."""
    local, pairs = numbered(buffers, overlaps)
    sizes = [align_up(b.size, alignment) for b in local]
    parts = independent_parts(local, sizes)
    if max((len(part) for part in parts), default=0) > COMPILED_MAX_BUFFERS:
        return heuristic_fits(local, capacity, alignment, pairs, deadline)
    windows = overlap_windows(sizes, pairs, alignment)
    offsets = [0] * len(local)
    nodes = 0
    budget = 10**18 if node_limit is None else node_limit
    status = "found"
    for part in parts:
        try:
            search = Search(part, local, sizes, pairs, windows, alignment, deadline, None)
            search.compiled = None  # this is the path without the compiled search
            answer = search.fits(capacity, max(0, budget - nodes))
        except (Timeout, OutOfNodes):
            answer = None
            search = None
        if search is not None:
            nodes += search.nodes_used
        if answer is None:
            status = "out_of_time" if deadline.passed() else "out_of_nodes"
            break
        if answer is False:
            status = "infeasible" if search.sound else "out_of_nodes"
            break
        for n, i in enumerate(search.order):
            offsets[i] = search.best[n]
    found = tuple(offsets) if status == "found" else None
    return Answer(status, found, nodes, search="python")
