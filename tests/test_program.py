"""The lowered Program: every op bound to its kernel before planning, one binding for all."""

from __future__ import annotations

from dataclasses import replace

import flatbuffers
import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.conftest import SHARED_MODEL_FILES
from toolchain.builder import ModelBuilder
from toolchain.checking.check import random_inputs
from toolchain.codegen import generate
from toolchain.errors import ArenacError, PlanError, UnsupportedOpError
from toolchain.examples import EXAMPLES
from toolchain.ops import unsupported_ops
from toolchain.plan import plan_model
from toolchain.planners import verify
from toolchain.reader import parse_model, read_model
from toolchain.report import inspect_data
from toolchain.schema import fb


def pooled_plan():
    mp = plan_model(parse_model(EXAMPLES["tiny_cnn_int8"](), "tiny.tflite"), "greedy")
    scratch = [i for i, t in enumerate(mp.lifetimes.tensor_of) if t is None]
    assert scratch, "the pooling kernels request their accumulators as scratch"
    return mp, scratch


def test_kernel_scratch_is_planned_in_the_arena_and_used_by_the_c():
    mp, scratch = pooled_plan()
    pools = {op.index for op in mp.graph.operators if op.opcode.endswith("POOL_2D")}
    assert {r.op for r in mp.lifetimes.scratch} == pools
    for i in scratch:
        buffer, offset = mp.plan.buffers[i], mp.plan.offsets[i]
        assert buffer.first == buffer.last  # lives during its op's step only
        assert offset + buffer.size <= mp.arena_bytes
    c = generate(mp, "tiny")["tiny.c"]
    pool = c.split("static void tiny_op3_max_pool_2d")[1].split("\n}\n")[0]
    assert "int32_t *acc = (int32_t *)(tiny_arena + tiny_offsets[" in pool
    assert "acc[16]" not in pool  # no stack array
    assert c.count("scratch of op") == len(scratch)


def test_scratch_over_a_live_tensor_fails_verify_and_the_runtime():
    mp, scratch = pooled_plan()
    i = scratch[0]
    step = mp.plan.buffers[i].first
    live = next(j for j, b in enumerate(mp.plan.buffers)
                if j != i and b.first <= step <= b.last and mp.lifetimes.tensor_of[j] is not None)
    offsets = list(mp.plan.offsets)
    offsets[i] = offsets[live]
    unsafe = replace(mp, plan=replace(mp.plan, offsets=tuple(offsets)))
    with pytest.raises(PlanError):
        verify(unsafe.plan)
    with pytest.raises(PlanError):
        generate(unsafe)
    with pytest.raises(PlanError, match="scratch|clobber"):
        ArenaInterpreter(unsafe, verify_plan=False).invoke(random_inputs(mp.graph, 0))


def hybrid_conv_model() -> bytes:
    """A float32 model whose convolution filters are int8: a variant no kernel here runs."""
    data = EXAMPLES["tiny_cnn_float32"]()
    model = fb.ModelT.InitFromPackedBuf(data, 0)
    graph = model.subgraphs[0]
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        if max(code.builtinCode, code.deprecatedBuiltinCode) == fb.BuiltinOperator.CONV_2D:
            weights = graph.tensors[op.inputs[1]]
            weights.type = fb.TensorType.INT8
            buffer = model.buffers[weights.buffer]
            buffer.data = np.asarray(buffer.data, np.uint8)[: len(buffer.data) // 4]
            q = fb.QuantizationParametersT()
            q.scale, q.zeroPoint = [0.01], [0]
            weights.quantization = q
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def test_inspect_marks_exactly_the_ops_the_backends_refuse():
    model = parse_model(hybrid_conv_model(), "hybrid.tflite")
    refused = unsupported_ops(model.main)
    convs = {op.index for op in model.main.operators if op.opcode == "CONV_2D"}
    assert set(refused) == convs
    ops = inspect_data(model)["graphs"][0]["operators"]
    assert {o["index"] for o in ops if not o["supported"]} == convs
    mp = plan_model(model)  # planning a model it cannot run still works, for `plan`
    for backend in (ArenaInterpreter, generate):
        with pytest.raises(UnsupportedOpError) as caught:
            backend(mp)
        assert all(f"op {i} CONV_2D" in str(caught.value) for i in convs)


def walked_models() -> list[tuple[str, bytes]]:
    built = [(name, make()) for name, make in EXAMPLES.items()]
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4, 4, 2), "float32")
    b.output(b.add(x, x))
    built.append(("add_twice", b.build()))
    built.append(("hybrid", hybrid_conv_model()))
    return built + [(p.stem, p.read_bytes()) for p in SHARED_MODEL_FILES]


@pytest.mark.parametrize("name, data", walked_models(), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_inspect_and_the_backends_agree_on_every_op(name, data):
    model = parse_model(data, f"{name}.tflite")
    marked = set(unsupported_ops(model.main))
    mp = plan_model(model)
    try:
        ArenaInterpreter(mp)
        generate(mp)
        refused = None
    except ArenacError as e:
        refused = str(e)
    if marked:
        assert refused is not None and all(f"op {i} " in refused for i in marked), refused
    else:
        assert refused is None, refused


def test_a_shared_model_runs_from_its_bindings():
    if not SHARED_MODEL_FILES:
        pytest.skip("reference models not found")
    mp = plan_model(read_model(SHARED_MODEL_FILES[0]))
    assert all(b is not None for b in mp.program.bindings)
    assert [b.op for b in mp.program.bindings] == list(range(len(mp.graph.operators)))
