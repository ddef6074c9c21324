"""Reader: every field the IR promises, on built models and on the reference models."""

from __future__ import annotations

import flatbuffers
import numpy as np
import pytest

from tests.conftest import SHARED_MODEL_FILES, needs_shared_models
from toolchain.errors import ModelError
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model, read_model
from toolchain.front.schema import fb


def built_conv_model() -> bytes:
    b = ModelBuilder("int8", seed=3)
    x = b.input("x", (1, 8, 8, 3), "int8", scale=0.05, zero_point=-3)
    y = b.conv_2d(x, 4, 3, stride=2, padding="VALID", activation="RELU6")
    b.output(b.softmax(b.reshape(y, (1, -1))))
    return b.build()


def test_conv_model_fields():
    model = parse_model(built_conv_model(), "conv.tflite")
    g = model.main
    assert [op.opcode for op in g.operators] == ["CONV_2D", "RESHAPE", "SOFTMAX"]
    conv = g.operators[0]
    assert conv.options["padding"] == "VALID"
    assert conv.options["stride_w"] == 2 and conv.options["stride_h"] == 2
    assert conv.options["fused_activation_function"] == "RELU6"
    x, w, bias = (g.tensors[t] for t in conv.inputs)
    assert (x.name, x.dtype, x.shape) == ("x", "int8", (1, 8, 8, 3))
    assert x.quantization.scale == pytest.approx((0.05,)) and x.quantization.zero_point == (-3,)
    assert w.shape == (4, 3, 3, 3) and w.quantization.per_channel
    assert len(w.quantization.scale) == 4 and w.quantization.quantized_dimension == 0
    assert bias.dtype == "int32" and bias.data.shape == (4,)
    assert g.tensors[conv.outputs[0]].shape == (1, 3, 3, 4)
    assert g.inputs == (x.index,) and len(g.outputs) == 1
    assert [s.key for s in model.signature_defs] == ["serving_default"]


def test_constant_data_is_a_read_only_view_of_the_file():
    data = built_conv_model()
    g = parse_model(data).main
    w = g.tensors[g.operators[0].inputs[1]]
    assert not w.data.flags.writeable
    assert w.data.base is not None  # a view, not a copy
    raw = w.data.tobytes()
    assert raw in data


def test_builtin_code_above_127_is_resolved():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    y = b.tensor("y", (1, 4), "float32")
    b.op("GELU", [x], [y])
    b.output(y)
    assert parse_model(b.build()).main.operators[0].opcode == "GELU"


def test_absent_optional_input_and_metadata():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    w = b.const("w", np.ones((2, 4), np.float32))
    y = b.tensor("y", (1, 2), "float32")
    b.op("FULLY_CONNECTED", [x, w, -1], [y])
    b.output(y)
    b.metadata("note", b"hello")
    model = parse_model(b.build())
    assert model.main.operators[0].inputs[2] == -1
    assert model.metadata["note"] == b"hello"


def test_variable_tensor_is_marked():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    s = b.variable("state", np.zeros((1, 4), np.float32))
    y = b.tensor("y", (1, 4), "float32")
    b.op("ADD", [x, s], [y])
    b.output(y)
    g = parse_model(b.build()).main
    assert g.tensors[s].is_variable and not g.tensors[x].is_variable


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_parse(name):
    g = parse_model(EXAMPLES[name]()).main
    assert g.operators and all(t >= 0 for op in g.operators for t in op.outputs)


@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_reference_models_parse(path):
    model = read_model(path)
    g = model.main
    assert g.operators and g.inputs and g.outputs
    for t in g.tensors:
        if t.is_constant:
            assert t.data.shape == t.shape and not t.data.flags.writeable


@needs_shared_models
def test_person_detect_keeps_quantized_dimension_3():
    g = read_model(SHARED_MODEL_FILES[0].parent / "person_detect.tflite").main
    depthwise = next(op for op in g.operators if op.opcode == "DEPTHWISE_CONV_2D")
    assert g.tensors[depthwise.inputs[1]].quantization.quantized_dimension == 3


def _pack(model) -> bytearray:
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    packed = bytearray(builder.Output())
    return packed + b"\0" * (-len(packed) % 16)


def test_buffer_stored_after_the_flatbuffer():
    """Models over 2 GB keep buffers after the flatbuffer, addressed by offset and size."""
    model = fb.ModelT.InitFromPackedBuf(built_conv_model(), 0)
    g = model.subgraphs[0]
    weights = model.buffers[g.tensors[g.operators[0].inputs[1]].buffer]
    payload = weights.data.tobytes()
    weights.data = None
    weights.offset, weights.size = 2, len(payload)  # placeholder: same layout as the real offset
    weights.offset = len(_pack(model))
    packed = _pack(model)
    assert len(packed) == weights.offset
    g2 = parse_model(bytes(packed + payload)).main
    assert g2.tensors[g2.operators[0].inputs[1]].data.tobytes() == payload


def test_a_model_that_lists_no_buffers_reads_and_plans():
    """Converters may leave the buffers vector empty when no tensor has data: buffer 0, the
    empty one by convention, then is not listed. Such a model reads, and its real problem (if
    any) is what the user sees."""
    from toolchain.lower.plan import plan_model

    b = ModelBuilder()
    x = b.input("x", (2, 3), "float32")
    y = b.tensor("y", (2, 3), "float32")
    b.op("ABS", [x], [y])
    b.output(y)
    model = fb.ModelT.InitFromPackedBuf(b.build(), 0)
    for tensor in model.subgraphs[0].tensors:
        tensor.buffer = 0
    model.buffers = []
    graph = parse_model(bytes(_pack(model))).main
    assert all(t.data is None for t in graph.tensors)
    assert plan_model(parse_model(bytes(_pack(model)))).arena_bytes > 0
    model.subgraphs[0].tensors[0].buffer = 1
    with pytest.raises(ModelError, match="refers to buffer 1, but the model has 0"):
        parse_model(bytes(_pack(model)))
