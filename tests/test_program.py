"""The lowered Program: every op bound to its kernel before planning, one binding for all."""

from __future__ import annotations

from dataclasses import replace

import flatbuffers
import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.conftest import SHARED_MODEL_FILES
from toolchain.c.generate import generate
from toolchain.errors import ArenacError, PlanError, UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model, read_model
from toolchain.front.schema import fb
from toolchain.lab.check import random_inputs
from toolchain.lower.lifetimes import TENSOR
from toolchain.lower.plan import Techniques, plan_model
from toolchain.lower.program import lower
from toolchain.ops import REGISTRY, operand_dtypes, unsupported_ops
from toolchain.ops.spec import PORTABLE_C, kernels
from toolchain.planners import verify
from toolchain.views.report import inspect_data


def pooled_plan():
    mp = plan_model(parse_model(EXAMPLES["tiny_cnn_int8"](), "tiny.tflite"), "greedy",
                    techniques=Techniques(tiling="off"))  # every op its own kernel call
    scratch = [mp.lifetimes.buffer_of[r.key] for r in mp.lifetimes.scratch]
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
    assert "int32_t *acc = (int32_t *)(tiny_arena + TINY_OP3_SCRATCH0)" in pool
    assert "acc[16]" not in pool  # no stack array
    assert c.count("scratch of op") == len(scratch)


def test_scratch_over_a_live_tensor_fails_verify_and_the_runtime():
    mp, scratch = pooled_plan()
    i = scratch[0]
    step = mp.plan.buffers[i].first
    live = next(j for j, b in enumerate(mp.plan.buffers)
                if j != i and b.first <= step <= b.last and mp.lifetimes.keys[j].kind == TENSOR)
    offsets = list(mp.plan.offsets)
    offsets[i] = offsets[live]
    unsafe = replace(mp, plan=replace(mp.plan, offsets=tuple(offsets)))
    with pytest.raises(PlanError):
        verify(unsafe.plan)
    with pytest.raises(PlanError):
        generate(unsafe)
    with pytest.raises(PlanError, match="scratch|clobber"):
        ArenaInterpreter(unsafe, verify_plan=False).invoke(random_inputs(mp.graph, 0))


def uint8_filter_model() -> bytes:
    """A float32 model whose convolution filters are uint8: a variant no kernel here runs (TFLite
    runs hybrid convolutions with int8 filters only)."""
    data = EXAMPLES["tiny_cnn_float32"]()
    model = fb.ModelT.InitFromPackedBuf(data, 0)
    graph = model.subgraphs[0]
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        if max(code.builtinCode, code.deprecatedBuiltinCode) == fb.BuiltinOperator.CONV_2D:
            weights = graph.tensors[op.inputs[1]]
            weights.type = fb.TensorType.UINT8
            buffer = model.buffers[weights.buffer]
            buffer.data = np.asarray(buffer.data, np.uint8)[: len(buffer.data) // 4]
            q = fb.QuantizationParametersT()
            q.scale, q.zeroPoint = [0.01], [0]
            weights.quantization = q
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def test_inspect_marks_exactly_the_ops_the_backends_refuse():
    model = parse_model(uint8_filter_model(), "uint8_filters.tflite")
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
    built.append(("uint8_filters", uint8_filter_model()))
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


def retyped_output_model(opcode: int, dtype: int) -> bytes:
    """The float32 residual example with the output of every `opcode` op retyped to `dtype`."""
    model = fb.ModelT.InitFromPackedBuf(EXAMPLES["residual_cnn_float32"](), 0)
    graph = model.subgraphs[0]
    for op in graph.operators:
        code = model.operatorCodes[op.opcodeIndex]
        if max(code.builtinCode, code.deprecatedBuiltinCode) == opcode:
            graph.tensors[op.outputs[0]].type = dtype
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def test_an_unusual_output_dtype_is_refused_by_its_signature_everywhere():
    model = parse_model(retyped_output_model(fb.BuiltinOperator.ADD, fb.TensorType.INT32),
                        "retyped.tflite")
    adds = [op.index for op in model.main.operators if op.opcode == "ADD"]
    assert adds
    refused = unsupported_ops(model.main)
    for i in adds:
        assert refused[i] == f"op {i} ADD: no kernel for float32, float32 -> int32"
    retyped = {model.main.operators[i].outputs[0] for i in adds}
    readers = {op.index for op in model.main.operators if retyped & set(op.inputs)}
    assert set(refused) == set(adds) | readers  # their readers get int32 data: no kernel either
    ops = inspect_data(model)["graphs"][0]["operators"]
    assert {o["index"] for o in ops if not o["supported"]} == set(refused)
    mp = plan_model(model)
    for backend in (ArenaInterpreter, generate):
        with pytest.raises(UnsupportedOpError, match="no kernel for float32, float32 -> int32"):
            backend(mp)


def test_a_binding_names_the_kernel_signature_it_runs():
    model = parse_model(EXAMPLES["tiny_cnn_int8"](), "tiny.tflite")
    program = lower(model)
    conv = next(b for b in program.bindings if b.opcode == "CONV_2D")
    assert conv.kernel.form == "int8, int8, int32? -> int8"
    assert PORTABLE_C in conv.kernel.targets


def test_signatures_read_optional_repeated_and_named_dtypes():
    (conv,) = kernels("int8, int8, int32? -> int8")
    assert conv.matches(["int8", "int8", "int32"], ["int8"])
    assert conv.matches(["int8", "int8", None], ["int8"])
    assert conv.matches(["int8", "int8"], ["int8"])
    assert not conv.matches(["int8"], ["int8"])
    assert not conv.matches(["int8", "int8", "int32", "int8"], ["int8"])
    assert not conv.matches(["int8", "float32", "int32"], ["int8"])
    assert not conv.matches(["int8", "int8", None], ["int16"])
    concat = kernels("T... -> T", T=("int8", "float32"))
    assert len(concat) == 2
    assert any(s.matches(["int8"] * 5, ["int8"]) for s in concat)
    assert not any(s.matches(["int8", "float32"], ["int8"]) for s in concat)
    (split,) = kernels("int32, T -> T...", T=("int16",))
    assert split.matches(["int32", "int16"], ["int16"] * 3)
    assert not split.matches(["int32", "int16"], ["int16", "int8"])
    (arg,) = kernels("uint8, int32|int64 -> int32|int64")
    assert arg.matches(["uint8", "int64"], ["int32"])
    assert dict(kernels("S -> T", S=("int8",), T=("bool",))[0].bound) == {"S": "int8", "T": "bool"}


def test_every_supported_model_op_matches_one_of_its_kernels():
    """The signatures cover what the kernels are tested on: every op of every walked model that
    binds matches one, and none binds without matching."""
    for name, data in walked_models():
        graph = parse_model(data, f"{name}.tflite").main
        for op in graph.operators:
            spec = REGISTRY.get(op.opcode)
            if spec is None:
                continue
            inputs, outputs = operand_dtypes(graph, op)
            matched = [s for s in spec.kernels if s.matches(inputs, outputs)]
            if op.index not in unsupported_ops(graph):
                assert matched, (name, op.index, op.opcode)
