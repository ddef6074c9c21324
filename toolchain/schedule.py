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
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from toolchain.errors import ModelError, PlanError
from toolchain.ir import Graph, Operator
from toolchain.lifetimes import compute_lifetimes, model_order
from toolchain.planners import align_up, lower_bound

MODES = ("model", "auto")
# Most downsets the exact searches of one graph visit before the heuristic takes over.
EXACT_LIMIT = 200_000
# The heuristic's exact re-ordering of windows: half-widths tried around a peak step, the most
# downsets one window may visit, and the most all windows of one piece may visit together.
_HALF_WIDTHS = (4, 8, 16)
_WINDOW_LIMIT = 10_000
_WINDOW_BUDGET = 50_000

# Operators with effects beyond the tensors they read and write (variables, subgraph calls,
# custom kernels nobody described): they keep the file's relative order.
_STATEFUL_OPCODES = frozenset(
    {"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE", "CALL_ONCE", "CALL", "IF", "WHILE", "CUSTOM"}
)
_HANDLE_DTYPES = frozenset({"resource", "variant"})


def peak_bytes(graph: Graph, order: Sequence[int], alignment: int = 16) -> int:
    """The most aligned bytes of planned tensors live at any step of `order`: no plan of that
    order fits in a smaller arena."""
    return lower_bound(compute_lifetimes(graph, order).buffers, alignment)


def schedule(graph: Graph, mode: str = "auto", alignment: int = 16) -> tuple[int, ...]:
    """The execution order to plan with: "model" is the file's order; "auto" is `best_order`
    when it lowers the peak, else the file's order."""
    if mode == "model":
        return model_order(graph)
    if mode != "auto":
        raise PlanError(f"unknown schedule {mode!r}; choose one of {', '.join(MODES)}")
    best = best_order(graph, alignment)
    model = model_order(graph)
    if best == model:
        return model
    try:
        model_peak = peak_bytes(graph, model, alignment)
    except ModelError:  # the file's order reads a tensor before writing it: no candidate
        return best
    return best if peak_bytes(graph, best, alignment) < model_peak else model


def best_order(
    graph: Graph, alignment: int = 16, exact_limit: int = EXACT_LIMIT
) -> tuple[int, ...]:
    """A valid execution order with the lowest peak of live bytes.

    Exact while the downsets visited stay within `exact_limit` (in all pieces together); the
    order is then the first of the best ones by operator index, so the file's order whenever it
    is one of them. Pieces beyond the limit get the best of their file order and two greedy
    orders, improved by exact re-ordering of windows around its peak. Raises ModelError if the
    graph has no valid order.
    """
    problem = _Problem.of(graph, alignment)
    pieces = _pieces(problem, _topological(problem))
    searches: list[_Search | None] = []
    budget = exact_limit
    for piece in pieces:
        search = None
        if budget > 0:
            search = _Search(piece, 0, piece.start, (1 << piece.size) - 1, budget)
            budget -= search.visited
        searches.append(search if search is not None and search.complete else None)
    peak = max((s.peak for s in searches if s is not None), default=0)
    # The other pieces start from their best candidate; the highest is improved first, and none
    # below the peak already reached.
    rough = {i: _candidate(pieces[i]) for i, s in enumerate(searches) if s is None}
    budget = _WINDOW_BUDGET
    for i in sorted(rough, key=lambda i: -_peak(pieces[i], rough[i])):
        if budget > 0 and _peak(pieces[i], rough[i]) > peak:
            rough[i], budget = _improve(pieces[i], rough[i], peak, budget)
        peak = max(peak, _peak(pieces[i], rough[i]))
    order: list[int] = []
    for i, (piece, search) in enumerate(zip(pieces, searches)):
        local = rough[i] if search is None else search.order(peak)
        order.extend(piece.ops[v] for v in local)
    compute_lifetimes(graph, order)  # raises what the planner would on an invalid graph
    return tuple(order)


@dataclass(frozen=True)
class _Problem:
    """A graph, or a piece of one, reduced to what scheduling needs; bytes are aligned.

    Operators are numbered 0..size-1 (`ops` maps them back to the graph's indices, in the same
    order) and sets of them are bitmasks. `reads[v]` lists the inputs of v that die with their
    last reader: (tensor, bytes, mask of their readers).
    """

    ops: tuple[int, ...]
    preds: tuple[int, ...]
    succs: tuple[tuple[int, ...], ...]
    made: tuple[int, ...]  # bytes of v's planned outputs: all live while v runs
    kept: tuple[int, ...]  # of those, the bytes that stay live after v (read later, or outputs)
    reads: tuple[tuple[tuple[int, int, int], ...], ...]
    start: int  # bytes live before the first operator runs
    first_only: int  # graph inputs nobody reads: live during the first step only

    @property
    def size(self) -> int:
        return len(self.ops)

    @classmethod
    def of(cls, graph: Graph, alignment: int) -> _Problem:
        tensors = graph.tensors
        n = len(graph.operators)

        def planned(t: int) -> bool:
            return t >= 0 and not tensors[t].is_constant and not tensors[t].is_variable

        graph_inputs = {t for t in graph.inputs if planned(t)}
        outputs = set(graph.outputs)
        producer: dict[int, int] = {}
        for op in graph.operators:
            for t in op.outputs:
                if planned(t) and t not in graph_inputs:
                    producer.setdefault(t, op.index)
        readers: dict[int, int] = {}
        preds = [0] * n
        for op in graph.operators:
            for t in op.inputs:
                if planned(t):
                    readers[t] = readers.get(t, 0) | 1 << op.index
                    p = producer.get(t)
                    if p is not None and p != op.index:
                        preds[op.index] |= 1 << p
        previous = None
        for op in graph.operators:
            if _stateful(graph, op):
                if previous is not None:
                    preds[op.index] |= 1 << previous
                previous = op.index
        nbytes = {t: align_up(tensors[t].nbytes, alignment) for t in (*graph_inputs, *producer)}
        made, kept = [0] * n, [0] * n
        for t, p in producer.items():
            made[p] += nbytes[t]
            if t in outputs or t in readers:
                kept[p] += nbytes[t]
        start = sum(nbytes[t] for t in graph_inputs if t in outputs or t in readers)
        reads = tuple(
            tuple(
                (t, nbytes[t], readers[t])
                for t in dict.fromkeys(op.inputs)
                if planned(t) and t in nbytes and t not in outputs
            )
            for op in graph.operators
        )
        return cls(
            ops=tuple(range(n)),
            preds=tuple(preds),
            succs=_successors(preds),
            made=tuple(made),
            kept=tuple(kept),
            reads=reads,
            start=start,
            first_only=sum(nbytes[t] for t in graph_inputs) - start,
        )

    def piece(self, ops: Sequence[int], done: int, live: int) -> _Problem:
        """The sub-problem of running `ops` (ascending) after the operators in `done`, with
        `live` bytes live then; inputs read after the piece never die in it."""
        local = {v: i for i, v in enumerate(ops)}
        mask = 0
        for v in ops:
            mask |= 1 << v

        def localized(m: int) -> int:
            out = 0
            for v in _bits(m & mask):
                out |= 1 << local[v]
            return out

        preds = [localized(self.preds[v]) for v in ops]
        reads = tuple(
            tuple(
                (t, nbytes, localized(readers))
                for t, nbytes, readers in self.reads[v]
                if not readers & ~(done | mask)
            )
            for v in ops
        )
        return _Problem(
            ops=tuple(self.ops[v] for v in ops),
            preds=tuple(preds),
            succs=_successors(preds),
            made=tuple(self.made[v] for v in ops),
            kept=tuple(self.kept[v] for v in ops),
            reads=reads,
            start=live,
            first_only=self.first_only if done == 0 else 0,
        )


def _successors(preds: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    succs: list[list[int]] = [[] for _ in preds]
    for v, mask in enumerate(preds):
        for u in _bits(mask):
            succs[u].append(v)
    return tuple(tuple(s) for s in succs)


def _stateful(graph: Graph, op: Operator) -> bool:
    if op.opcode in _STATEFUL_OPCODES:
        return True
    return any(
        t >= 0 and (graph.tensors[t].is_variable or graph.tensors[t].dtype in _HANDLE_DTYPES)
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
    waiting = [mask.bit_count() for mask in problem.preds]
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


def _pieces(problem: _Problem, order: Sequence[int]) -> list[_Problem]:
    """The sub-problems between the cuts of a valid `order`.

    The first k operators of an order form a cut when each of them is an ancestor of every
    later one; every order then runs exactly them first.
    """
    n = len(order)
    position = [0] * n
    for i, v in enumerate(order):
        position[v] = i
    # Descendants by position in `order`, and the furthest non-descendant after each operator.
    below = [0] * n
    furthest = [0] * n
    everything = (1 << n) - 1
    for i in range(n - 1, -1, -1):
        v = order[i]
        mask = 0
        for w in problem.succs[v]:
            mask |= below[w] | 1 << position[w]
        below[v] = mask
        others = everything & ~mask & ~((2 << i) - 1)
        furthest[i] = max(others.bit_length() - 1, i)
    before = _profile(problem, order)[1]
    pieces = []
    first = reach = 0
    done = 0
    for i in range(n):
        reach = max(reach, furthest[i])
        if reach == i:
            ops = sorted(order[first : i + 1])
            pieces.append(problem.piece(ops, done, before[first]))
            for v in ops:
                done |= 1 << v
            first = i + 1
    return pieces


def _is_topological(problem: _Problem, order: Sequence[int]) -> bool:
    done = 0
    for v in order:
        if problem.preds[v] & ~done:
            return False
        done |= 1 << v
    return True


def _peak(problem: _Problem, order: Sequence[int]) -> int:
    return max(_profile(problem, order)[0], default=0)


def _profile(problem: _Problem, order: Sequence[int]) -> tuple[list[int], list[int]]:
    """Bytes live during each step of `order`, and bytes live before each step."""
    waiting = {t: readers.bit_count() for reads in problem.reads for t, _, readers in reads}
    live = problem.start
    during, before = [], []
    for step, v in enumerate(order):
        before.append(live)
        during.append(live + problem.made[v] + (problem.first_only if step == 0 else 0))
        live += problem.kept[v]
        for t, nbytes, _ in problem.reads[v]:
            waiting[t] -= 1
            if waiting[t] == 0:
                live -= nbytes
    return during, before


class _Search:
    """Exact search for the best orders of the operators in `window`, run after those in `done`
    with `live` bytes live: forward over downsets of growing size (at most `limit` of them),
    then backward for the lowest peak still to come from each."""

    def __init__(self, problem: _Problem, done: int, live: int, window: int, limit: int):
        self.problem, self.done = problem, done
        preds, succs, kept, made, reads = (
            problem.preds,
            problem.succs,
            problem.kept,
            problem.made,
            problem.reads,
        )
        ready = 0
        for v in _bits(window & ~done):
            if not preds[v] & ~done:
                ready |= 1 << v
        # downset -> (bytes live, mask of ready operators)
        states: dict[int, tuple[int, int]] = {done: (live, ready)}
        self.states = states
        self.steps = window.bit_count()
        self.complete = False
        layers = [[done]]
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
                    if len(states) >= limit:
                        self.visited = len(states)
                        return
                    v = bit.bit_length() - 1
                    t_live = s_live + kept[v]
                    for _, nbytes, readers in reads[v]:
                        if not readers & ~t:
                            t_live -= nbytes
                    t_ready = s_ready ^ bit
                    for w in succs[v]:
                        if window >> w & 1 and not preds[w] & ~t:
                            t_ready |= 1 << w
                    states[t] = (t_live, t_ready)
                    layer.append(t)
            layers.append(layer)
        self.visited = len(states)
        self.complete = True
        to_go = self.to_go = dict.fromkeys(layers[-1], 0)
        for layer in reversed(layers[:-1]):
            for s in layer:
                s_live, m = states[s]
                if s == 0:
                    s_live += problem.first_only
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
        self.peak = to_go[done]

    def order(self, threshold: int) -> tuple[int, ...]:
        """The first order by operator index whose peak is at most `threshold` (>= `peak`)."""
        problem = self.problem
        order = []
        s = self.done
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


def _candidate(problem: _Problem) -> tuple[int, ...]:
    """The best of the file's order and two greedy orders (the file's on ties)."""
    candidates = [_greedy(problem, by_transient) for by_transient in (False, True)]
    model = tuple(range(problem.size))
    if _is_topological(problem, model):
        candidates.insert(0, model)
    return min(candidates, key=lambda order: _peak(problem, order))


def _greedy(problem: _Problem, by_transient: bool) -> tuple[int, ...]:
    """Runs, one at a time, the ready operator that leaves the fewest bytes live (ties: the one
    that frees most, then the lowest index); `by_transient` ranks by the bytes live while it
    runs first."""
    waiting = [mask.bit_count() for mask in problem.preds]
    readers_left = {t: r.bit_count() for reads in problem.reads for t, _, r in reads}
    ready = {v for v, count in enumerate(waiting) if count == 0}
    live = problem.start
    order: list[int] = []
    while ready:
        best_key, best = None, -1
        for v in ready:
            freed = sum(nbytes for t, nbytes, _ in problem.reads[v] if readers_left[t] == 1)
            after = live + problem.kept[v] - freed
            key = (live + problem.made[v], after, v) if by_transient else (after, -freed, v)
            if best_key is None or key < best_key:
                best_key, best = key, v
        ready.remove(best)
        order.append(best)
        for t, nbytes, _ in problem.reads[best]:
            readers_left[t] -= 1
            if readers_left[t] == 0:
                live -= nbytes
        live += problem.kept[best]
        for w in problem.succs[best]:
            waiting[w] -= 1
            if waiting[w] == 0:
                ready.add(w)
    return tuple(order)


def _improve(
    problem: _Problem, order: tuple[int, ...], floor: int, budget: int
) -> tuple[tuple[int, ...], int]:
    """Lowers the peak of `order` by re-ordering windows around its peak steps exactly, while
    a window helps, the peak is above `floor` and `budget` downsets remain; returns the order
    and the budget left."""
    current = list(order)
    while budget > 0:
        during, before = _profile(problem, current)
        peak = max(during)
        if peak <= floor:
            break
        improved = False
        for step in (i for i, m in enumerate(during) if m == peak):
            for half in _HALF_WIDTHS:
                lo, hi = max(0, step - half), min(len(current), step + half + 1)
                done = window = 0
                for v in current[:lo]:
                    done |= 1 << v
                for v in current[lo:hi]:
                    window |= 1 << v
                search = _Search(problem, done, before[lo], window, min(budget, _WINDOW_LIMIT))
                budget -= search.visited
                if search.complete and search.peak < peak:
                    current[lo:hi] = search.order(search.peak)
                    improved = True
                if improved or budget <= 0 or hi - lo == len(current):
                    break
            if improved or budget <= 0:
                break
        if not improved:
            break
    return tuple(current), budget
