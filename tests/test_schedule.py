"""Operator scheduling: hand-worked branching graphs with known best orders, brute force over
every valid order of random graphs, and the reference models."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import toolchain.lower.schedule as sched
from tests.conftest import SHARED_MODEL_FILES, needs_shared_models
from toolchain.errors import ModelError, PlanError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.ir import Graph, Operator, Tensor
from toolchain.lower.lifetimes import SCRATCH, BufferKey, ScratchRequest, compute_lifetimes
from toolchain.lower.schedule import best_order, peak_bytes, schedule
from toolchain.planners import align_up

# -- helpers ---------------------------------------------------------------------------------


def fc(b: ModelBuilder, x: int, name: str, units: int) -> int:
    """A float FULLY_CONNECTED x -> (1, units) with constant weights: units * 4 bytes out."""
    out = b.tensor(name, (1, units), "float32")
    weights = b.const(f"{name}/w", np.ones((units, b.shape(x)[1]), np.float32))
    b.op("FULLY_CONNECTED", [x, weights, -1], [out])
    return out


def main_graph(b: ModelBuilder) -> Graph:
    return parse_model(b.build(), "test.tflite").main


def assert_valid(graph: Graph, order) -> None:
    """`order` runs every operator once, and every tensor read is a graph input, a constant, a
    variable or written at an earlier step."""
    assert sorted(order) == list(range(len(graph.operators)))
    written = set(graph.inputs)
    for v in order:
        op = graph.operators[v]
        for t in op.inputs:
            if t >= 0 and not graph.tensors[t].is_constant and not graph.tensors[t].is_variable:
                assert t in written, f"op {v} reads tensor {t} before it is written"
        written.update(op.outputs)


def topological_orders(graph: Graph):
    """Every valid order, in lexicographic order of operator indices (brute force)."""
    producer = graph.producers()
    preds = [
        {producer[t] for t in op.inputs if t in producer and producer[t] != op.index}
        for op in graph.operators
    ]
    n = len(graph.operators)

    def extend(order: list[int], done: set[int]):
        if len(order) == n:
            yield tuple(order)
            return
        for v in range(n):
            if v not in done and preds[v] <= done:
                order.append(v)
                done.add(v)
                yield from extend(order, done)
                done.remove(v)
                order.pop()

    yield from extend([], set())


def ir_graph(sizes, ops, inputs, outputs, constants=(), variables=(), opcodes=None) -> Graph:
    """A graph straight from IR objects: tensor i holds sizes[i] bytes (uint8)."""
    tensors = tuple(
        Tensor(
            index=i,
            name=f"t{i}",
            dtype="uint8",
            shape=(size,),
            shape_signature=None,
            quantization=None,
            is_variable=i in variables,
            buffer=0,
            data=np.zeros(size, np.uint8) if i in constants else None,
        )
        for i, size in enumerate(sizes)
    )
    operators = tuple(
        Operator(
            index=i,
            opcode=(opcodes or {}).get(i, "ADD"),
            version=1,
            inputs=tuple(ins),
            outputs=tuple(outs),
        )
        for i, (ins, outs) in enumerate(ops)
    )
    return Graph(0, "main", tensors, operators, tuple(inputs), tuple(outputs))


# -- hand-worked graphs ----------------------------------------------------------------------


def diamond():
    """x (64 B) feeds a small branch s (480 B) and a large one l1 (1600 B) -> l2 (160 B);
    concat(l2, s) -> y (640 B). The file runs the small branch first."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 16), "float32")
    s = fc(b, x, "s", 120)  # op 0
    l1 = fc(b, x, "l1", 400)  # op 1
    l2 = fc(b, l1, "l2", 40)  # op 2
    y = b.tensor("y", (1, 160), "float32")
    b.op("CONCATENATION", [l2, s], [y], {"axis": 1})  # op 3
    b.output(y)
    return main_graph(b)


def test_diamond_runs_the_large_branch_first():
    graph = diamond()
    # File order: x+s 544, x+s+l1 2144, s+l1+l2 2240, l2+s+y 1280.
    assert peak_bytes(graph, (0, 1, 2, 3)) == 2240
    # Large branch first: x+l1 1664, x+l1+l2 1824, x+l2+s 704, l2+s+y 1280.
    assert best_order(graph) == (1, 2, 0, 3)
    assert peak_bytes(graph, (1, 2, 0, 3)) == 1824
    assert schedule(graph) == (1, 2, 0, 3)
    assert schedule(graph, "model") == (0, 1, 2, 3)


def three_branches():
    """x (64 B) -> big_i -> small_i for i = 0, 1, 2, concatenated: big = 320, 960, 640 B and
    small = 160, 32, 96 B; y = 288 B. Ops: big0 0, small0 1, big1 2, small1 3, big2 4,
    small2 5, concat 6."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 16), "float32")
    units = [(80, 40), (240, 8), (160, 24)]
    smalls = [
        fc(b, fc(b, x, f"big{i}", big), f"small{i}", small) for i, (big, small) in enumerate(units)
    ]
    y = b.tensor("y", (1, 72), "float32")
    b.op("CONCATENATION", smalls, [y], {"axis": 1})
    b.output(y)
    return main_graph(b)


def test_concatenation_of_three_branches():
    graph = three_branches()
    # File order: 384, 544, x+s0+big1 1184, x+s0+big1+s1 1216, 896, 928, 576.
    assert peak_bytes(graph, range(7)) == 1216
    # The 960 B branch first, while only x is live: x+big1 1024, x+big1+s1 1056; then the
    # first order by index that stays within 1056: big0 416, small0 576, big2 896 (x dies),
    # small2 928, concat 576.
    assert best_order(graph) == (2, 3, 0, 1, 4, 5, 6)
    assert peak_bytes(graph, (2, 3, 0, 1, 4, 5, 6)) == 1056
    # Any other branch first leaves at least 96 B with big1 + small1 + x: 1088 or more.
    assert schedule(graph) == (2, 3, 0, 1, 4, 5, 6)


def projection_residual():
    """x (64) -> a (640); main path a -> b1 (160) -> b2 (1280) -> b3 (160); shortcut a -> p
    (160), listed after the main path; add(b3, p) -> y (160)."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 16), "float32")
    a = fc(b, x, "a", 160)  # op 0
    b3 = fc(b, fc(b, fc(b, a, "b1", 40), "b2", 320), "b3", 40)  # ops 1, 2, 3
    p = fc(b, a, "p", 40)  # op 4
    b.output(b.add(b3, p))  # op 5
    return main_graph(b)


def test_residual_projection_runs_before_the_expansion():
    graph = projection_residual()
    # File order: 704, a+b1 800, a+b1+b2 2080, a+b2+b3 2080, a+b3+p 960, 480.
    assert peak_bytes(graph, range(6)) == 2080
    # The shortcut right after b1 lets a die before b2: a+b1+p 960, b1+p+b2 1600,
    # p+b2+b3 1600. (0, 4, 1, ...) has the same peak but comes later by index.
    assert best_order(graph) == (0, 1, 4, 2, 3, 5)
    assert peak_bytes(graph, (0, 1, 4, 2, 3, 5)) == 1600
    assert schedule(graph) == (0, 1, 4, 2, 3, 5)


def test_identity_residual_has_one_order():
    """x -> a -> b1 -> b2; add(a, b2): a stays live across the branch whatever the order."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 16), "float32")
    a = fc(b, x, "a", 100)  # 400 B
    b2 = fc(b, fc(b, a, "b1", 300), "b2", 100)  # 1200 B, 400 B
    b.output(b.add(a, b2))
    graph = main_graph(b)
    assert best_order(graph) == schedule(graph) == (0, 1, 2, 3)
    # a + b1 + b2 while b2 is computed.
    assert peak_bytes(graph, (0, 1, 2, 3)) == 400 + 1200 + 400


def test_multi_output_op_and_an_unread_output():
    """split(x) -> (h0, h1); h0 -> big (1024) -> r0 (32); h1 -> r1 (32), and h1 -> unread
    (512) that nobody reads; concat(r0, r1). The unread tensor lives only during its step."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 32), "float32")  # 128 B
    h0, h1 = b.tensor("h0", (1, 16), "float32"), b.tensor("h1", (1, 16), "float32")  # 64 B
    b.op("SPLIT", [b.const("axis", np.asarray(1, np.int32)), x], [h0, h1], {"num_splits": 2})
    r0 = fc(b, fc(b, h0, "big", 256), "r0", 8)  # ops 1, 2
    r1 = fc(b, h1, "r1", 8)  # op 3
    fc(b, h1, "unread", 128)  # op 4
    y = b.tensor("y", (1, 16), "float32")
    b.op("CONCATENATION", [r0, r1], [y], {"axis": 1})  # op 5
    b.output(y)
    graph = main_graph(b)
    # File order: split 256, h0+h1+big 1152, h1+big+r0 1120, 160, h1+r0+r1+unread 640, 128.
    assert peak_bytes(graph, range(6)) == 1152
    # Finish h1 first: split 256, h0+h1+r1 160, h0+h1+r1+unread 672 (h1 dies), then
    # h0+r1+big 1120, r1+big+r0 1088, 128.
    assert best_order(graph) == (0, 3, 4, 1, 2, 5)
    assert peak_bytes(graph, (0, 3, 4, 1, 2, 5)) == 1120
    brute = min(peak_bytes(graph, order) for order in topological_orders(graph))
    assert brute == 1120


def test_an_unread_graph_input_counts_at_the_first_step_only():
    """Tensor 1 is a graph input nobody reads: it lives at step 0, so the small op goes first."""
    graph = ir_graph(
        sizes=[16, 512, 16, 256],
        ops=[([0], [2]), ([0], [3])],
        inputs=[0, 1],
        outputs=[2, 3],
    )
    assert peak_bytes(graph, (0, 1)) == 16 + 512 + 16  # then 16 + 16 + 256
    assert peak_bytes(graph, (1, 0)) == 16 + 512 + 256
    assert best_order(graph) == (0, 1)
    reversed_graph = ir_graph([16, 512, 16, 256], [([0], [3]), ([0], [2])], [0, 1], [2, 3])
    assert best_order(reversed_graph) == (1, 0)


def test_stateful_operators_keep_their_file_order():
    """Two branches from x; the large one is listed second. As plain ops the large branch goes
    first; when both first ops touch a variable they keep the file's order."""
    sizes = [64, 32, 160, 1600, 16, 176, 8]  # x, s, s2, big, l, y, var
    ops = [([0], [1]), ([0], [3]), ([1], [2]), ([3], [4]), ([2, 4], [5])]
    plain = ir_graph(sizes, ops, [0], [5])
    # Big first: x+big 1664, x+big+l 1680, then 112 and 208.
    assert best_order(plain) == (1, 3, 0, 2, 4)
    assert peak_bytes(plain, (1, 3, 0, 2, 4)) == 1680
    # s before big, then big's branch before s2: 96, x+s+big 1696, s+big+l 1648, 208, 352.
    with_state = [([0, 6], [1]), ([0, 6], [3]), *ops[2:]]
    stateful = ir_graph(sizes, with_state, [0], [5], variables={6})
    assert best_order(stateful) == schedule(stateful) == (0, 1, 3, 2, 4)
    assert peak_bytes(stateful, (0, 1, 3, 2, 4)) == 1696
    custom = ir_graph(sizes, ops, [0], [5], opcodes={0: "CUSTOM", 1: "CUSTOM"})
    assert best_order(custom) == (0, 1, 3, 2, 4)


def test_constants_are_not_planned_and_do_not_order():
    graph = ir_graph([64, 4096, 32, 32], [([0, 1], [2]), ([2, 1], [3])], [0], [3], constants={1})
    assert best_order(graph) == (0, 1)
    assert peak_bytes(graph, (0, 1)) == 64 + 32


def test_schedule_modes():
    graph = diamond()
    assert schedule(graph, "model") == (0, 1, 2, 3)
    assert schedule(graph, "auto") == (1, 2, 0, 3)
    with pytest.raises(PlanError, match="unknown schedule"):
        schedule(graph, "fastest")


def test_auto_keeps_the_model_order_on_ties(monkeypatch):
    """Two independent ops: both orders have the same peak, so "auto" keeps the file's even
    if the search came back with the other."""
    graph = ir_graph([16, 64, 64], [([0], [1]), ([0], [2])], [0], [1, 2])
    assert peak_bytes(graph, (1, 0)) == peak_bytes(graph, (0, 1)) == 144
    monkeypatch.setattr(sched, "_best", lambda problem, exact_limit, deadline: (1, 0))
    assert schedule(graph) == (0, 1)


def test_no_valid_order_is_a_model_error():
    cycle = ir_graph([16, 16, 16], [([0, 2], [1]), ([1], [2])], [0], [2])
    with pytest.raises(ModelError):
        best_order(cycle)
    unwritten = ir_graph([16, 16, 16], [([0, 2], [1])], [0], [1])
    with pytest.raises(ModelError):
        best_order(unwritten)


def test_empty_graph():
    graph = ir_graph([16], [], [0], [0])
    assert best_order(graph) == schedule(graph) == ()


# -- random graphs against brute force -------------------------------------------------------


@st.composite
def random_graphs(draw, max_ops: int = 8) -> Graph:
    """Random DAGs in file order: ops with one to three inputs (recent tensors are likelier),
    one or two outputs, sizes that need alignment; some tensors unread, some outputs early,
    maybe an unread graph input and a constant."""
    size = st.integers(1, 400)
    sizes = [draw(size)]
    inputs = [0]
    if draw(st.booleans()):
        sizes.append(draw(size))
        inputs.append(1)
    constants = set()
    if draw(st.booleans()):
        constants.add(len(sizes))
        sizes.append(draw(size))
    readable = list(range(len(sizes)))
    ops = []
    for _ in range(draw(st.integers(1, max_ops))):
        recent = readable[-4:]
        count = draw(st.integers(1, 3))
        ins = [draw(st.sampled_from(recent if draw(st.booleans()) else readable))]
        ins += [draw(st.sampled_from(readable)) for _ in range(count - 1)]
        outs = []
        for _ in range(draw(st.integers(1, 2))):
            outs.append(len(sizes))
            sizes.append(draw(size))
        ops.append((ins, outs))
        readable += outs
    produced = [t for _, outs in ops for t in outs]
    outputs = {produced[-1]} | set(draw(st.lists(st.sampled_from(produced + inputs), max_size=2)))
    return ir_graph(sizes, ops, inputs, sorted(outputs), constants=constants)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(), alignment=st.sampled_from([1, 16]))
def test_best_order_matches_brute_force(graph, alignment):
    orders = list(topological_orders(graph))
    peaks = [peak_bytes(graph, order, alignment) for order in orders]
    best = min(peaks)
    order = best_order(graph, alignment)
    assert_valid(graph, order)
    assert peak_bytes(graph, order, alignment) == best
    # Among the best orders, the first by operator index (so the file's when it is one).
    assert order == orders[peaks.index(best)]
    auto = schedule(graph, "auto", alignment)
    assert_valid(graph, auto)
    assert peak_bytes(graph, auto, alignment) == best
    # The heuristic alone: valid, never below the optimum.
    rough = best_order(graph, alignment, exact_limit=0)
    assert_valid(graph, rough)
    assert peak_bytes(graph, rough, alignment) >= best


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_graphs(), data=st.data())
def test_the_schedule_counts_kernel_scratch_as_the_planner_will(graph, data):
    """Scratch lives during its op's step in the lifetimes; the scheduler's memory model is the
    same, so its best order is the best of every order with the scratch counted."""
    ops = len(graph.operators)
    scratch = [ScratchRequest(op, data.draw(st.integers(1, 3000)), "test",
                              BufferKey(SCRATCH, op, k))
               for k, op in enumerate(data.draw(st.lists(st.integers(0, ops - 1), max_size=3)))]
    orders = list(topological_orders(graph))
    peaks = [peak_bytes(graph, order, 16, scratch) for order in orders]
    order = best_order(graph, 16, scratch=scratch)
    assert peak_bytes(graph, order, 16, scratch) == min(peaks)
    assert peak_bytes(graph, schedule(graph, "auto", 16, scratch=scratch), 16, scratch) == min(
        peaks)


@settings(max_examples=60, deadline=None)
@given(graph=random_graphs(max_ops=10), seed=st.integers(0, 2**32 - 1))
def test_the_schedulers_accounting_is_the_lifetimes_rules(graph, seed):
    """The bytes the scheduler counts at each step are those of compute_lifetimes."""
    problem = sched._Problem.of(graph, 16)
    rng = np.random.default_rng(seed)
    for _ in range(5):
        # A random valid order: repeatedly run a random ready operator.
        waiting = {v: set(problem.preds[v]) for v in range(problem.size)}
        order = []
        while len(order) < problem.size:
            ready = sorted(v for v, w in waiting.items() if not w)
            v = ready[rng.integers(len(ready))]
            order.append(v)
            del waiting[v]
            for w in waiting.values():
                w.discard(v)
        during = sched._profile(problem, order)[0]
        buffers = compute_lifetimes(graph, order).buffers
        for step in range(len(order)):
            live = [b for b in buffers if b.first <= step <= b.last]
            assert during[step] == sum(align_up(b.size, 16) for b in live)
        assert max(during) == peak_bytes(graph, order)


# -- larger graphs ---------------------------------------------------------------------------


def inception(blocks: int, branches: int, depth: int, seed: int = 0, alike: bool = False) -> Graph:
    """`blocks` blocks of `branches` parallel chains of `depth` ops, each block concatenated;
    with `alike`, every block has the same sizes."""
    rng = np.random.default_rng(seed)
    sizes, ops, x = [256], [], 0
    for _ in range(blocks):
        if alike:
            rng = np.random.default_rng(seed)
        ends = []
        for _ in range(branches):
            current = x
            for _ in range(depth):
                sizes.append(int(rng.choice([64, 128, 512, 1024, 2048])))
                ops.append(([current], [len(sizes) - 1]))
                current = len(sizes) - 1
            ends.append(current)
        sizes.append(256)
        ops.append((ends, [len(sizes) - 1]))
        x = len(sizes) - 1
    return ir_graph(sizes, ops, [0], [x])


@pytest.fixture
def searched(monkeypatch) -> list[int]:
    """The downsets each exact search visits, in the order they run."""
    visited: list[int] = []
    real = sched._Search

    def counting(problem, limit, deadline):
        search = real(problem, limit, deadline)
        visited.append(search.visited)
        return search

    monkeypatch.setattr(sched, "_Search", counting)
    return visited


def test_thousands_of_operators_take_bounded_work(searched):
    graph = inception(blocks=100, branches=6, depth=3)  # 1900 ops, 4096 downsets a block
    model = peak_bytes(graph, range(len(graph.operators)))
    rough = best_order(graph, exact_limit=0)
    assert_valid(graph, rough)
    assert peak_bytes(graph, rough) < model
    # Only the windows around peaks were searched, within their budget.
    assert 0 < sum(searched) <= sched._WINDOW_BUDGET
    assert max(searched) <= sched._WINDOW_LIMIT
    # Exact block by block where the downsets allow: never above the heuristic.
    searched.clear()
    exact = best_order(graph)
    assert_valid(graph, exact)
    assert peak_bytes(graph, exact) <= peak_bytes(graph, rough)
    assert sum(searched) <= sched.EXACT_LIMIT + sched._WINDOW_BUDGET


def test_a_long_chain_keeps_the_model_order_without_searching(searched):
    n = 3000
    sizes = [64 * (1 + i % 7) for i in range(n + 1)]
    graph = ir_graph(sizes, [([i], [i + 1]) for i in range(n)], [0], [n])
    assert schedule(graph) == tuple(range(n))
    assert searched == []  # a chain is all cuts: every piece has one order


def test_exact_over_many_blocks_matches_each_block_alone():
    """Blocks are solved between cuts: a graph of identical blocks has the peak of one."""
    one = inception(blocks=1, branches=4, depth=2, seed=3)
    many = inception(blocks=40, branches=4, depth=2, seed=3, alike=True)
    peak = peak_bytes(one, best_order(one))
    assert peak < peak_bytes(one, range(len(one.operators)))
    assert peak_bytes(many, best_order(many)) == peak


# -- reference models ------------------------------------------------------------------------


@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_reference_models(path):
    graph = parse_model(path.read_bytes(), path.name).main
    model = peak_bytes(graph, range(len(graph.operators)))
    auto = schedule(graph)
    assert_valid(graph, auto)
    assert peak_bytes(graph, auto) <= model
    rough = best_order(graph, exact_limit=0)
    assert_valid(graph, rough)
    assert peak_bytes(graph, rough) >= peak_bytes(graph, best_order(graph))


@needs_shared_models
def test_resnet_peak_is_set_by_its_identity_block():
    """ResNet-8: the first block's input (32x32x16 int8, 16 KiB) stays live across two convs,
    so 48 KiB is live in every order; the projection blocks can be reordered but stay below."""
    path = next((p for p in SHARED_MODEL_FILES if p.stem == "pretrainedResnet_quant"), None)
    if path is None:
        pytest.skip("pretrainedResnet_quant.tflite not found")
    graph = parse_model(path.read_bytes(), path.name).main
    assert peak_bytes(graph, range(len(graph.operators))) == 49152
    assert peak_bytes(graph, schedule(graph)) == 49152


def test_a_file_order_that_reads_before_writing_is_replaced():
    graph = ir_graph([16, 32, 32], [([2], [1]), ([0], [2])], [0], [1])
    with pytest.raises(ModelError):
        peak_bytes(graph, (0, 1))
    assert best_order(graph) == schedule(graph) == (1, 0)
