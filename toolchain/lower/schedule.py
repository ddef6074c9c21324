"""Operator scheduling: the execution order that keeps the fewest activation bytes live at once.

The planners place buffers whose lives follow from an execution order (`compute_lifetimes`); the
order itself is free as long as every tensor is written before it is read. Branching graphs
(residual blocks, concatenations of several branches) have many such orders, and the most bytes
live at any step -- the lower bound of every plan -- depends on which one runs.

The bytes live at a step depend only on which operators ran before it and which one runs now, so
the best order is a min-max path over the graph's downsets (sets of operators closed under
predecessors). The memory model follows the lifetimes rules to the byte: live before operator v
runs are the graph inputs and produced tensors that an operator still to run reads, plus the
graph outputs produced so far; while v runs, all of its outputs are live too (one that nobody
reads lives only then), and during the first step so is every graph input that nobody reads.

Every order passes through the same cuts (sets of operators that must all run before any other
can), so `best_order` solves the pieces between cuts one by one: exactly while the downsets stay
few, else greedily with exact re-ordering of windows around the peak. A chain is all cuts.

The whole graph is held as adjacency lists and every pass over it is near-linear; bitmasks of
operators appear only inside the exact searches, over pieces and windows small enough for them.
A deadline ends the searches early: the result is then the best valid order found so far.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

from toolchain.errors import ModelError, PlanError
from toolchain.ir import Graph, Operator
from toolchain.lower.lifetimes import (
    ScratchRequest,
    TensorRoles,
    check_order,
    compute_lifetimes,
    model_order,
)
from toolchain.ops import REGISTRY
from toolchain.planners import NEVER, Deadline, align_up, lower_bound

MODES = ("model", "auto")
# Most downsets the exact searches of one graph visit before the heuristic takes over.
EXACT_LIMIT = 200_000
# Pieces of more operators are left to the heuristic: their downsets are at least as many as
# their operators, and each costs a bitmask that long.
EXACT_OPS = 2048
# The heuristic's exact re-ordering of windows: half-widths tried around a peak step, the most
# downsets one window may visit, and the most all windows of one piece may visit together.
_HALF_WIDTHS = (4, 8, 16)
_WINDOW_LIMIT = 10_000
_WINDOW_BUDGET = 50_000
# Steps of a search between two looks at the clock.
_CLOCK_EVERY = 1024



def peak_bytes(graph: Graph, order: Sequence[int], alignment: int = 16,
               scratch: Sequence[ScratchRequest] = ()) -> int:
    """The most aligned bytes of planned tensors and kernel scratch live at any step of
    `order`: no plan of that order fits in a smaller arena."""
    return lower_bound(compute_lifetimes(graph, order, scratch).buffers, alignment)


def schedule(
    graph: Graph,
    mode: str = "auto",
    alignment: int = 16,
    deadline: Deadline = NEVER,
    scratch: Sequence[ScratchRequest] = (),
    roles: TensorRoles | None = None,
) -> tuple[int, ...]:
    """The execution order to plan with: "model" is the file's order; "auto" is `best_order`
    (searched until `deadline`) when it lowers the peak, else the file's order. The peak
    counts the kernels' `scratch` as the planner will; `roles` are the graph's, if known."""
    if mode == "model":
        return model_order(graph)
    if mode != "auto":
        raise PlanError(f"unknown schedule {mode!r}; choose one of {', '.join(MODES)}")
    roles = roles or TensorRoles.of(graph)
    problem = _Problem.of(graph, alignment, scratch, roles)
    best = _checked(graph, _best(problem, EXACT_LIMIT, deadline), roles)
    model = model_order(graph)
    if best == model:
        return model
    if not _is_topological(problem, model):
        return best  # the file's order reads a tensor before writing it: no candidate
    return best if _peak(problem, best) < _peak(problem, model) else model


def best_order(
    graph: Graph,
    alignment: int = 16,
    exact_limit: int = EXACT_LIMIT,
    deadline: Deadline = NEVER,
    scratch: Sequence[ScratchRequest] = (),
) -> tuple[int, ...]:
    """A valid execution order with the lowest peak of live bytes.

    Exact while the downsets visited stay within `exact_limit` (in all pieces together); the
    order is then the first of the best ones by operator index, so the file's order whenever it
    is one of them. Pieces beyond the limit get the best of their file order and two greedy
    orders, improved by exact re-ordering of windows around its peak. Once `deadline` passes,
    each piece keeps the best order it has (at worst its file order, or a topological one).
    Raises ModelError if the graph has no valid order.
    """
    return _checked(graph, _best(_Problem.of(graph, alignment, scratch), exact_limit, deadline))


def _checked(graph: Graph, order: tuple[int, ...], roles: TensorRoles | None = None
             ) -> tuple[int, ...]:
    check_order(graph, order, roles=roles)  # raises what the planner would on an invalid graph
    return order


def _best(problem: _Problem, exact_limit: int, deadline: Deadline) -> tuple[int, ...]:
    pieces = _pieces(problem, _topological(problem))
    exact: dict[int, _Search] = {}
    peaks: dict[int, int] = {}
    budget = exact_limit
    for i, piece in enumerate(pieces):
        if budget <= 0 or deadline.passed():
            continue
        if piece.size == 1:  # one order, two downsets: no search needed to know its peak
            peaks[i] = piece.start + piece.made[0] + piece.first_only
            budget -= 2
        elif piece.size + 1 > budget:  # the search would run out of downsets
            budget = 0
        elif piece.size <= EXACT_OPS:
            search = _Search(piece, budget, deadline)
            budget -= search.visited
            if search.complete:
                exact[i], peaks[i] = search, search.peak
    peak = max(peaks.values(), default=0)
    # The other pieces start from their best candidate; the highest is improved first, and none
    # below the peak already reached.
    rough = {i: _candidate(piece, deadline) for i, piece in enumerate(pieces) if i not in peaks}
    rough_peaks = {i: _peak(pieces[i], order) for i, order in rough.items()}
    budget = _WINDOW_BUDGET
    for i in sorted(rough, key=lambda i: -rough_peaks[i]):
        if budget > 0 and rough_peaks[i] > peak and not deadline.passed():
            rough[i], budget = _improve(pieces[i], rough[i], peak, budget, deadline)
            rough_peaks[i] = _peak(pieces[i], rough[i])
        peak = max(peak, rough_peaks[i])
    order: list[int] = []
    for i, piece in enumerate(pieces):
        if i in rough:
            local: Sequence[int] = rough[i]
        elif i in exact:
            local = exact[i].order(peak)
        else:
            local = (0,)
        order.extend(piece.ops[v] for v in local)
    return tuple(order)


@dataclass(frozen=True)
class _Problem:
    """A graph, or a piece of one, reduced to what scheduling needs; bytes are aligned.

    Operators are numbered 0..size-1 (`ops` maps them back to the graph's indices, in the same
    order); `preds` and `succs` list each one's direct neighbours, ascending. `reads[v]` lists
    the inputs of v that die with their last reader, as (tensor, bytes): a tensor's readers are
    the operators that list it there.
    """

    ops: tuple[int, ...]
    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]
    made: tuple[int, ...]  # bytes of v's planned outputs: all live while v runs
    kept: tuple[int, ...]  # of those, the bytes that stay live after v (read later, or outputs)
    reads: tuple[tuple[tuple[int, int], ...], ...]
    start: int  # bytes live before the first operator runs
    first_only: int  # graph inputs nobody reads: live during the first step only

    @property
    def size(self) -> int:
        return len(self.ops)

    @cached_property
    def reader_counts(self) -> dict[int, int]:
        """Tensor -> how many operators list it in `reads`."""
        counts: dict[int, int] = {}
        for reads in self.reads:
            for t, _ in reads:
                counts[t] = counts.get(t, 0) + 1
        return counts

    @classmethod
    def of(cls, graph: Graph, alignment: int, scratch: Sequence[ScratchRequest] = (),
           roles: TensorRoles | None = None) -> _Problem:
        """The lifetimes rules (`TensorRoles`) as bytes per operator; a kernel's scratch is
        live while its operator runs, like an output nobody reads."""
        tensors = graph.tensors
        n = len(graph.operators)
        roles = roles or TensorRoles.of(graph)
        planned, graph_inputs, outputs = roles.planned, roles.graph_inputs, roles.graph_outputs
        producer = roles.producer
        read: set[int] = set()
        preds: list[set[int]] = [set() for _ in range(n)]
        previous = None
        for op in graph.operators:
            for t in op.inputs:
                if t >= 0 and planned[t]:
                    read.add(t)
                    p = producer.get(t)
                    if p is not None and p != op.index:
                        preds[op.index].add(p)
            if _stateful(graph, op):
                if previous is not None:
                    preds[op.index].add(previous)
                previous = op.index
        nbytes = {t: align_up(tensors[t].nbytes, alignment) for t in (*graph_inputs, *producer)}
        made, kept = [0] * n, [0] * n
        for t, p in producer.items():
            made[p] += nbytes[t]
            if t in outputs or t in read:
                kept[p] += nbytes[t]
        for request in scratch:
            made[request.op] += align_up(request.size, alignment)
        start = sum(nbytes[t] for t in graph_inputs if t in outputs or t in read)
        reads = tuple(
            tuple(
                (t, nbytes[t])
                for t in dict.fromkeys(op.inputs)
                if t in nbytes and t not in outputs
            )
            for op in graph.operators
        )
        ordered = tuple(tuple(sorted(p)) for p in preds)
        return cls(
            ops=tuple(range(n)),
            preds=ordered,
            succs=_successors(ordered),
            made=tuple(made),
            kept=tuple(kept),
            reads=reads,
            start=start,
            first_only=sum(nbytes[t] for t in graph_inputs) - start,
        )

    def part(
        self, ops: Sequence[int], live: int, first: bool, last_read: dict[int, int], end: int
    ) -> _Problem:
        """The sub-problem of running `ops` (ascending; positions up to `end` of a valid order)
        after every operator before them in that order, with `live` bytes live then; `first`
        when nothing ran before. An input dies in it only if `last_read` (tensor -> position of
        its last reader in that order) puts its last reader before `end`."""
        local = {v: i for i, v in enumerate(ops)}
        preds = tuple(tuple(local[u] for u in self.preds[v] if u in local) for v in ops)
        return _Problem(
            ops=tuple(self.ops[v] for v in ops),
            preds=preds,
            succs=_successors(preds),
            made=tuple(self.made[v] for v in ops),
            kept=tuple(self.kept[v] for v in ops),
            reads=tuple(
                tuple((t, nbytes) for t, nbytes in self.reads[v] if last_read[t] < end)
                for v in ops
            ),
            start=live,
            first_only=self.first_only if first else 0,
        )


def _successors(preds: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    succs: list[list[int]] = [[] for _ in preds]
    for v, before in enumerate(preds):
        for u in before:
            succs[u].append(v)
    return tuple(tuple(s) for s in succs)


def _stateful(graph: Graph, op: Operator) -> bool:
    """Whether the op has effects beyond the tensors it reads and writes (variables, subgraph
    calls, an operator no kernel describes): such ops keep the file's relative order."""
    spec = REGISTRY.get(op.kind)
    if spec is None or spec.effects:
        return True
    return any(
        t >= 0 and (graph.tensors[t].is_variable or graph.tensors[t].is_handle)
        for t in (*op.inputs, *op.outputs)
    )


def _bits(mask: int) -> Iterator[int]:
    """The set bits of `mask`, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _topological(problem: _Problem) -> tuple[int, ...]:
    """The first valid order by operator index."""
    waiting = [len(before) for before in problem.preds]
    ready = [v for v, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        v = heapq.heappop(ready)
        order.append(v)
        for w in problem.succs[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(ready, w)
    if len(order) < problem.size:
        raise ModelError("the operators' data dependencies form a cycle")
    return tuple(order)


def _cut_ends(problem: _Problem, order: Sequence[int]) -> list[int]:
    """The lengths k of the prefixes of a valid `order` that are cuts, ascending (n included).

    order[:k] is a cut when each of its operators is an ancestor of every later one; every
    order then runs exactly them first. That holds exactly when each maximal operator of the
    prefix (no successor in it) is a direct predecessor of each minimal one of the rest (all
    predecessors in the prefix): any operator of the prefix reaches a maximal one, and any
    later one is reached from a minimal one. So it is enough to count the edges between the two
    sets as operators move across, each joining and leaving each set once: linear time.
    """
    preds, succs = problem.preds, problem.succs
    n = problem.size
    waiting = [len(before) for before in preds]
    maximal_preds = [0] * n  # of each operator, its predecessors that are maximal in the prefix
    minimal_succs = [0] * n  # of each operator, its successors that are minimal in the rest
    is_maximal = [False] * n
    maximal = minimal = edges = 0  # set sizes, and the edges from the maximal to the minimal
    for w in range(n):
        if not waiting[w]:
            minimal += 1
    ends = []
    for k, v in enumerate(order, 1):
        minimal -= 1  # v leaves the rest, of which it was minimal
        edges -= maximal_preds[v]
        for u in preds[v]:
            minimal_succs[u] -= 1
        for u in preds[v]:  # they gain a successor in the prefix
            if is_maximal[u]:
                is_maximal[u] = False
                maximal -= 1
                edges -= minimal_succs[u]
                for w in succs[u]:
                    maximal_preds[w] -= 1
        is_maximal[v] = True  # none of its successors is minimal yet
        maximal += 1
        for w in succs[v]:
            maximal_preds[w] += 1
        for w in succs[v]:
            waiting[w] -= 1
            if not waiting[w]:
                minimal += 1
                edges += maximal_preds[w]
                for u in preds[w]:
                    minimal_succs[u] += 1
        if edges == maximal * minimal:
            ends.append(k)
    return ends


def _pieces(problem: _Problem, order: Sequence[int]) -> list[_Problem]:
    """The sub-problems between the cuts of a valid `order`."""
    before = _profile(problem, order)[1]
    last_read = _last_reads(problem, order)
    pieces = []
    first = 0
    for end in _cut_ends(problem, order):
        ops = sorted(order[first:end])
        pieces.append(problem.part(ops, before[first], first == 0, last_read, end))
        first = end
    return pieces


def _last_reads(problem: _Problem, order: Sequence[int]) -> dict[int, int]:
    """Tensor -> the position in `order` of its last reader."""
    last: dict[int, int] = {}
    for position, v in enumerate(order):
        for t, _ in problem.reads[v]:
            last[t] = position
    return last


def _is_topological(problem: _Problem, order: Sequence[int]) -> bool:
    done = [False] * problem.size
    for v in order:
        if not all(done[u] for u in problem.preds[v]):
            return False
        done[v] = True
    return True


def _peak(problem: _Problem, order: Sequence[int]) -> int:
    return max(_profile(problem, order)[0], default=0)


def _profile(problem: _Problem, order: Sequence[int]) -> tuple[list[int], list[int]]:
    """Bytes live during each step of `order`, and bytes live before each step."""
    waiting = dict(problem.reader_counts)
    live = problem.start
    during, before = [], []
    for step, v in enumerate(order):
        before.append(live)
        during.append(live + problem.made[v] + (problem.first_only if step == 0 else 0))
        live += problem.kept[v]
        for t, nbytes in problem.reads[v]:
            waiting[t] -= 1
            if waiting[t] == 0:
                live -= nbytes
    return during, before


def _masks(problem: _Problem) -> tuple[list[int], list[tuple[tuple[int, int], ...]], int]:
    """The problem as bitmasks: each operator's predecessors, each read's bytes with the
    operators that read the same tensor, and the operators ready at the start."""
    preds = [0] * problem.size
    for v, before in enumerate(problem.preds):
        for u in before:
            preds[v] |= 1 << u
    readers: dict[int, int] = {}
    for v, reads in enumerate(problem.reads):
        for t, _ in reads:
            readers[t] = readers.get(t, 0) | 1 << v
    reads = [tuple((nbytes, readers[t]) for t, nbytes in r) for r in problem.reads]
    ready = 0
    for v, mask in enumerate(preds):
        if not mask:
            ready |= 1 << v
    return preds, reads, ready


class _Search:
    """Exact search for the best orders of a problem: forward over downsets of growing size (at
    most `limit` of them, until `deadline`), then backward for the lowest peak still to come
    from each. Sets of operators are bitmasks here."""

    def __init__(self, problem: _Problem, limit: int, deadline: Deadline):
        self.problem = problem
        self.steps = problem.size
        self.complete = False
        self.preds, self.reads, ready = _masks(problem)
        # downset -> (bytes live, mask of ready operators)
        self.states: dict[int, tuple[int, int]] = {0: (problem.start, ready)}
        self.visited = 1
        layers = self._forward(limit, deadline)
        self.visited = len(self.states)
        if layers is None or not self._backward(layers, deadline):
            return
        self.peak = self.to_go[0]
        self.complete = True

    def _forward(self, limit: int, deadline: Deadline) -> list[list[int]] | None:
        """Every downset, layer by layer (downsets of 0, 1, ... operators), or None once there
        are `limit` of them or the deadline has passed."""
        states, preds, reads = self.states, self.preds, self.reads
        succs, kept = self.problem.succs, self.problem.kept
        layers = [[0]]
        for _ in range(self.steps):
            layer = []
            for s in layers[-1]:
                s_live, s_ready = states[s]
                m = s_ready
                while m:
                    bit = m & -m
                    m ^= bit
                    t = s | bit
                    if t in states:
                        continue
                    if len(states) >= limit or (
                        not len(states) % _CLOCK_EVERY and deadline.passed()
                    ):
                        return None
                    v = bit.bit_length() - 1
                    t_live = s_live + kept[v]
                    for nbytes, r in reads[v]:
                        if not r & ~t:
                            t_live -= nbytes
                    t_ready = s_ready ^ bit
                    for w in succs[v]:
                        if not preds[w] & ~t:
                            t_ready |= 1 << w
                    states[t] = (t_live, t_ready)
                    layer.append(t)
            layers.append(layer)
        return layers

    def _backward(self, layers: list[list[int]], deadline: Deadline) -> bool:
        """The lowest peak still to come from each downset (`to_go`), last layer first; False
        if the deadline passed first."""
        states, made, first_only = self.states, self.problem.made, self.problem.first_only
        to_go = self.to_go = dict.fromkeys(layers[-1], 0)
        for layer in reversed(layers[:-1]):
            if deadline.passed():
                return False
            for s in layer:
                s_live, m = states[s]
                if s == 0:
                    s_live += first_only
                best = None
                while m:
                    bit = m & -m
                    m ^= bit
                    cost = s_live + made[bit.bit_length() - 1]
                    rest = to_go[s | bit]
                    if rest > cost:
                        cost = rest
                    if best is None or cost < best:
                        best = cost
                to_go[s] = best
        return True

    def order(self, threshold: int) -> tuple[int, ...]:
        """The first order by operator index whose peak is at most `threshold` (>= `peak`)."""
        problem = self.problem
        order = []
        s = 0
        for _ in range(self.steps):
            s_live, s_ready = self.states[s]
            extra = problem.first_only if s == 0 else 0
            v = next(
                v
                for v in _bits(s_ready)
                if max(s_live + extra + problem.made[v], self.to_go[s | 1 << v]) <= threshold
            )
            order.append(v)
            s |= 1 << v
        return tuple(order)


def _candidate(problem: _Problem, deadline: Deadline) -> tuple[int, ...]:
    """The best of the file's order and two greedy orders (the file's on ties), of those found
    before `deadline`; at worst the file's order, or the first topological one."""
    model = tuple(range(problem.size))
    candidates = [model] if _is_topological(problem, model) else []
    for by_transient in (False, True):
        found = None if deadline.passed() else _greedy(problem, by_transient, deadline)
        if found is not None:
            candidates.append(found)
    if not candidates:
        return _topological(problem)
    return min(candidates, key=lambda order: _peak(problem, order))


def _greedy(problem: _Problem, by_transient: bool, deadline: Deadline) -> tuple[int, ...] | None:
    """Runs, one at a time, the ready operator that leaves the fewest bytes live (ties: the one
    that frees most, then the lowest index); `by_transient` ranks by the bytes live while it
    runs first. None if `deadline` passes first.

    The bytes live before a step are the same whichever operator runs, so the ranking needs
    only what each one adds and frees. What an operator frees grows only when another reader
    of one of its inputs runs, so the ready operators sit in a heap and an operator whose
    ranking improved is pushed again; stale entries are skipped: O(n log n) in all.
    """
    kept, made, reads = problem.kept, problem.made, problem.reads
    waiting = [len(before) for before in problem.preds]
    readers: dict[int, list[int]] = {}
    for v, inputs in enumerate(reads):
        for t, _ in inputs:
            readers.setdefault(t, []).append(v)
    readers_left = dict(problem.reader_counts)
    freed = [sum(nbytes for t, nbytes in inputs if readers_left[t] == 1) for inputs in reads]
    done = [False] * problem.size

    def entry(v: int) -> tuple[int, int, int, int]:
        after = kept[v] - freed[v]
        first, second = (made[v], after) if by_transient else (after, -freed[v])
        return first, second, v, freed[v]

    heap = [entry(v) for v, count in enumerate(waiting) if count == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        if not len(order) % _CLOCK_EVERY and order and deadline.passed():
            return None
        *_, best, best_freed = heapq.heappop(heap)
        if done[best] or best_freed != freed[best]:
            continue  # ran already, or ranked better since
        done[best] = True
        order.append(best)
        for t, nbytes in reads[best]:
            readers_left[t] -= 1
            if readers_left[t] == 1:
                last = next(w for w in readers[t] if not done[w])
                freed[last] += nbytes
                if not waiting[last]:
                    heapq.heappush(heap, entry(last))
        for w in problem.succs[best]:
            waiting[w] -= 1
            if not waiting[w]:
                heapq.heappush(heap, entry(w))
    return tuple(order)


def _improve(
    problem: _Problem, order: tuple[int, ...], floor: int, budget: int, deadline: Deadline
) -> tuple[tuple[int, ...], int]:
    """Lowers the peak of `order` by re-ordering windows around its peak steps exactly, while
    a window helps, the peak is above `floor`, `budget` downsets remain and `deadline` has not
    passed; returns the order and the budget left."""
    current = list(order)
    during, before = _profile(problem, current)
    last_read = _last_reads(problem, current)
    while budget > 0 and not deadline.passed():
        peak = max(during)
        if peak <= floor:
            break
        improved = False
        for step in (i for i, m in enumerate(during) if m == peak):
            for half in _HALF_WIDTHS:
                lo, hi = max(0, step - half), min(len(current), step + half + 1)
                members = sorted(current[lo:hi])
                window = problem.part(members, before[lo], lo == 0, last_read, hi)
                search = _Search(window, min(budget, _WINDOW_LIMIT), deadline)
                budget -= search.visited
                if search.complete and search.peak < peak:
                    current[lo:hi] = [members[v] for v in search.order(search.peak)]
                    _reprofile(problem, current, lo, hi, during, before, last_read)
                    improved = True
                if improved or budget <= 0 or hi - lo == len(current):
                    break
            if improved or budget <= 0 or deadline.passed():
                break
        if not improved:
            break
    return tuple(current), budget


def _reprofile(
    problem: _Problem,
    order: list[int],
    lo: int,
    hi: int,
    during: list[int],
    before: list[int],
    last_read: dict[int, int],
) -> None:
    """Brings `_profile`'s lists and `_last_reads` up to date after `order[lo:hi]` was
    re-ordered. The same operators run before and after the window, so nothing outside it
    changes: a window costs its own length, not the order's."""
    window = range(lo, hi)
    moved = {t for p in window for t, _ in problem.reads[order[p]] if lo <= last_read[t] < hi}
    for p in window:
        for t, _ in problem.reads[order[p]]:
            if t in moved:
                last_read[t] = p
    live = before[lo]
    for p in window:
        v = order[p]
        before[p] = live
        during[p] = live + problem.made[v] + (problem.first_only if p == 0 else 0)
        live += problem.kept[v]
        live -= sum(nbytes for t, nbytes in problem.reads[v] if last_read[t] == p)
