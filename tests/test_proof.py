"""The proof that a plan is safe: `verify` before running, and runtime_py's own check while
running, each catching every plan in which two live buffers share a byte they may not share."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from runtime_py.interpreter import POISON, ArenaInterpreter
from tests.conftest import SHARED_MODEL_FILES, needs_shared_models
from toolchain.errors import PlanError
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model, read_model
from toolchain.lab.check import random_inputs
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import NO_TECHNIQUES, ModelPlan, Techniques, plan_model
from toolchain.ops import bind
from toolchain.planners import Overlap, Placement, verify


def with_offsets(
    mp: ModelPlan, offsets: list[int], overlaps: tuple[Overlap, ...] | None = None
) -> ModelPlan:
    plan = mp.plan
    moved = Placement.from_offsets(plan.planner, plan.alignment, plan.buffers, offsets,
                              plan.overlaps if overlaps is None else overlaps)
    return replace(mp, plan=moved)


def unsafe_plans(mp: ModelPlan) -> Iterator[tuple[str, ModelPlan]]:
    """Every plan made by moving one buffer B to the offset of another buffer A that is alive
    at a common step, where no declared overlap lets the two start at the same offset."""
    buffers = mp.plan.buffers
    same_offset_allowed = {
        frozenset((o.below, o.above)) for o in mp.plan.overlaps if o.any_offset or o.shift == 0
    }
    for a in buffers:
        for b in buffers:
            meet = max(a.first, b.first) <= min(a.last, b.last)
            if a.id == b.id or not meet or not a.size or not b.size:
                continue
            if frozenset((a.id, b.id)) in same_offset_allowed:
                continue
            offsets = list(mp.plan.offsets)
            offsets[b.id] = offsets[a.id]
            yield f"buffer {b.id} at buffer {a.id}'s offset", with_offsets(mp, offsets)


def assert_every_unsafe_plan_is_caught(mp: ModelPlan) -> int:
    """verify rejects each unsafe plan, the runtime refuses it, and, told not to verify, the
    runtime's own check stops it while running; returns how many plans were tried."""
    inputs = random_inputs(mp.graph, seed=0)
    ArenaInterpreter(mp).invoke(inputs)  # the plan itself is fine
    tried = 0
    for what, unsafe in unsafe_plans(mp):
        tried += 1
        with pytest.raises(PlanError):
            verify(unsafe.plan)
        with pytest.raises(PlanError):
            ArenaInterpreter(unsafe)
        try:
            ArenaInterpreter(unsafe, verify_plan=False).invoke(inputs)
        except PlanError as e:
            assert e.source == mp.model.source and str(e).count("\n") == 0
            assert "step " in e.message and "would clobber" in e.message
        else:
            pytest.fail(f"{what}: runtime_py ran an unsafe plan without noticing")
    return tried


@pytest.mark.parametrize("name", ["tiny_cnn_int8", "residual_cnn_int8", "residual_cnn_float32"])
def test_every_unsafe_placement_of_an_example_is_caught(name):
    mp = plan_model(parse_model(EXAMPLES[name](), f"{name}.tflite"), "greedy")
    assert assert_every_unsafe_plan_is_caught(mp) > len(mp.plan.buffers)


@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=[p.stem for p in SHARED_MODEL_FILES])
def test_every_unsafe_placement_of_a_shared_model_is_caught(path):
    mp = plan_model(read_model(str(path)), "greedy")
    assert assert_every_unsafe_plan_is_caught(mp) > 0


def tiny_cnn_plan(**techniques) -> ModelPlan:
    techniques.setdefault("techniques", Techniques(tiling="off"))  # every tensor whole
    return plan_model(parse_model(EXAMPLES["tiny_cnn_int8"](), "tiny.tflite"), "greedy",
                      **techniques)


def test_the_error_names_the_step_the_op_and_both_tensors():
    mp = tiny_cnn_plan()
    graph = mp.graph
    slot = mp.lifetimes.tensor_buffers
    conv = graph.operators[0]
    offsets = list(mp.plan.offsets)
    offsets[slot[conv.outputs[0]]] = offsets[slot[conv.inputs[0]]]  # the conv needs a shift
    unsafe = with_offsets(mp, offsets)
    with pytest.raises(PlanError, match="tiny.tflite: buffers") as refused:
        ArenaInterpreter(unsafe)
    assert refused.value.source == "tiny.tflite"
    out, x = (graph.tensors[t] for t in (conv.outputs[0], conv.inputs[0]))
    with pytest.raises(PlanError) as caught:
        ArenaInterpreter(unsafe, verify_plan=False).invoke(random_inputs(graph, 0))
    assert str(caught.value).startswith(
        f"tiny.tflite: step 0, op 0 (CONV_2D): tensor {out.index} ({out.name!r}) at arena bytes "
    )
    message = str(caught.value)
    assert f"would clobber tensor {x.index} ({x.name!r}), an input of this op; " in message
    (rule,) = bind(graph, conv).overlaps
    assert f"its kernel needs the output {rule.shift} bytes or more below the input" in message


@pytest.mark.parametrize("opcode, reason", [
    ("DEPTHWISE_CONV_2D", "its kernel needs the output 64 bytes or more below the input"),
    ("FULLY_CONNECTED", "its kernel does not let this output cover it"),
])
def test_an_overlap_the_kernel_does_not_allow_is_caught_even_when_the_plan_declares_it(
    opcode, reason
):
    """A plan may claim any overlap; the runtime asks the op's own rule, so a forged one fails.
    The numpy kernels read all input before writing, so only the rule can tell."""
    mp = tiny_cnn_plan(techniques=NO_TECHNIQUES)
    graph = mp.graph
    slot = mp.lifetimes.tensor_buffers
    op = next(op for op in graph.operators if op.opcode == opcode)
    below, above = slot[op.outputs[0]], slot[op.inputs[0]]
    offsets = list(mp.plan.offsets)
    offsets[below] = offsets[above] = mp.plan.arena_bytes  # fresh bytes past the arena
    forged = with_offsets(mp, offsets, (Overlap(below, above, shift=0),))
    verify(forged.plan)  # the declaration makes it look safe
    runtime = ArenaInterpreter(forged)
    with pytest.raises(PlanError, match=f"op {op.index} \\({opcode}\\): .*; {reason}"):
        runtime.invoke(random_inputs(graph, 0))


def test_sizes_and_lives_come_from_the_graph_not_from_the_plan():
    """Buffers that understate a tensor's size or life pass `verify`; running still fails.
    Each pair is moved to fresh bytes past the arena, where nothing else lives."""
    mp = tiny_cnn_plan(techniques=NO_TECHNIQUES)
    graph = mp.graph
    slot = mp.lifetimes.tensor_buffers
    x = graph.inputs[0]
    conv, depthwise = graph.operators[0], graph.operators[1]
    c0, d1 = conv.outputs[0], depthwise.outputs[0]  # c0 lives [0, 1], d1 [1, 2]
    cases = [
        (x, c0, dict(size=0), f"step 0, op 0 \\(CONV_2D\\): tensor {c0} .* clobber tensor {x} "),
        (c0, d1, dict(last=0), f"step 1, op 1 \\(DEPTHWISE_CONV_2D\\): tensor {d1} .* "
                               f"clobber tensor {c0} "),
    ]
    for victim, writer, lie, message in cases:
        offsets = list(mp.plan.offsets)
        offsets[slot[victim]] = offsets[slot[writer]] = mp.plan.arena_bytes
        buffers = list(mp.plan.buffers)
        buffers[slot[victim]] = replace(buffers[slot[victim]], **lie)
        lying = replace(
            mp, plan=Placement.from_offsets("lying", mp.plan.alignment, buffers, offsets)
        )
        verify(lying.plan)
        with pytest.raises(PlanError, match=message):
            ArenaInterpreter(lying).invoke(random_inputs(graph, 0))


def test_two_outputs_of_one_op_may_not_share_bytes():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 8, 4), "float32")
    axis = b.const("axis", np.asarray(2, np.int32))
    left, right = b.tensor("left", (1, 8, 2), "float32"), b.tensor("right", (1, 8, 2), "float32")
    b.op("SPLIT", [axis, x], [left, right], {"num_splits": 2})
    total = b.tensor("total", (1, 8, 2), "float32")
    b.op("ADD", [left, right], [total])
    b.output(total)
    mp = plan_model(parse_model(b.build(), "split.tflite"), "greedy")
    slot = mp.lifetimes.tensor_buffers
    offsets = list(mp.plan.offsets)
    offsets[slot[right]] = offsets[slot[left]]
    with pytest.raises(PlanError, match=r"step 0, op 0 \(SPLIT\): tensor \d+ \('right'\) .* "
                                        r"clobber tensor \d+ \('left'\), which is read until"):
        ArenaInterpreter(with_offsets(mp, offsets), verify_plan=False).invoke(
            random_inputs(mp.graph, 0))


def test_two_graph_inputs_may_not_share_bytes():
    b = ModelBuilder("float32")
    first, second = b.input("first", (1, 16), "float32"), b.input("second", (1, 16), "float32")
    b.output(b.add(first, second))
    mp = plan_model(parse_model(b.build(), "inputs.tflite"), "greedy")
    slot = mp.lifetimes.tensor_buffers
    offsets = list(mp.plan.offsets)
    offsets[slot[second]] = offsets[slot[first]]
    with pytest.raises(PlanError, match=r"step 0, writing the graph inputs: tensor 1 \('second'\)"
                                        r".* clobber tensor 0 \('first'\), another graph input"):
        ArenaInterpreter(with_offsets(mp, offsets), verify_plan=False).invoke(
            random_inputs(mp.graph, 0))


def test_every_kernel_finds_its_output_poisoned_on_every_run(monkeypatch):
    """No output inherits bytes from an earlier tensor or an earlier run: a kernel that fails
    to write part of its output leaves poison, never a plausible leftover."""
    import runtime_py.interpreter as interpreter

    mp = tiny_cnn_plan(techniques=NO_TECHNIQUES)  # no output may cover an input
    seen = []

    def checked(kernel):
        def run(params, ins, outs):
            seen.append(all(np.all(o.view(np.uint8) == POISON) for o in outs))
            kernel(params, ins, outs)
        return run

    for opcode in {op.opcode for op in mp.graph.operators}:
        monkeypatch.setitem(interpreter.KERNELS, opcode, checked(interpreter.KERNELS[opcode]))
    runtime = ArenaInterpreter(mp)
    for seed in range(2):
        runtime.invoke(random_inputs(mp.graph, seed))
    assert len(seen) == 2 * len(mp.graph.operators) and all(seen)


def twice_model(dtype: str) -> bytes:
    """ADD(x, x) then MUL(y, y): each op reads one tensor through both inputs."""
    b = ModelBuilder(dtype, seed=3)
    int8 = dtype == "int8"
    x = b.input("x", (1, 8, 8, 4), dtype, *((1 / 128, 0) if int8 else (None, None)))
    doubled = b.add(x, x)
    squared = b.tensor("squared", (1, 8, 8, 4), dtype, *((4 / 255, -128) if int8 else (None, None)))
    b.op("MUL", [doubled, doubled], [squared], {"fused_activation_function": "NONE"})
    b.output(squared)
    return b.build()


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_an_op_reading_one_tensor_twice_runs_in_place(dtype):
    data = twice_model(dtype)
    mp = plan_model(parse_model(data, "twice.tflite"), "greedy")
    pairs = [(o.below, o.above) for o in mp.plan.overlaps]
    assert len(pairs) == len(set(pairs)) == 2
    assert mp.arena_bytes == mp.graph.tensors[mp.graph.inputs[0]].nbytes  # each op in place
    runtime, oracle = ArenaInterpreter(mp), LiteRTOracle(data)
    for seed in range(3):
        inputs = random_inputs(mp.graph, seed)
        (want,), (got,) = oracle.invoke(inputs), runtime.invoke(inputs)
        assert np.unique(want).size > 10
        if dtype == "int8":
            assert np.array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_nothing_is_placed_over_a_graph_output_read_by_the_last_op():
    """s = RELU(x) is a graph output and the input of the last op: it never dies."""
    b = ModelBuilder("float32", seed=4)
    x = b.input("x", (1, 4, 4, 2), "float32")
    s = b.tensor("s", (1, 4, 4, 2), "float32")
    b.op("RELU", [x], [s])
    p = b.tensor("p", (1, 4, 4, 2), "float32")
    b.op("RELU6", [s], [p])
    b.output(s)
    b.output(p)
    mp = plan_model(parse_model(b.build(), "outputs.tflite"))
    assert not any(mp.lifetimes.keys[o.above].index == s for o in mp.plan.overlaps)
    inputs = [np.linspace(-8, 8, 32, dtype=np.float32).reshape(1, 4, 4, 2)]
    got_s, got_p = ArenaInterpreter(mp).invoke(inputs)
    np.testing.assert_array_equal(got_s, np.maximum(inputs[0], 0))
    np.testing.assert_array_equal(got_p, np.clip(inputs[0], 0, 6))
