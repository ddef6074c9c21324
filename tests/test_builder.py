"""The model builder writes files that the TFLite interpreter loads and runs, deterministically,
with the layout and quantization TFLite expects."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter, OpResolverType

from toolchain.front import examples
from toolchain.front.builder import BUFFER_ALIGNMENT, ModelBuilder, options_class_name
from toolchain.front.schema import DTYPE_NAMES, OPCODE_CODES, OPCODE_NAMES, fb


def interpreter(data: bytes) -> Interpreter:
    it = Interpreter(model_content=data, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    return it


def run(data: bytes, *inputs: np.ndarray) -> list[np.ndarray]:
    it = interpreter(data)
    for detail, value in zip(it.get_input_details(), inputs, strict=True):
        it.set_tensor(detail["index"], value)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def random_input(data: bytes, rng: np.random.Generator) -> np.ndarray:
    """The full integer range for quantized models, [-1, 1) for float ones."""
    detail = interpreter(data).get_input_details()[0]
    if detail["dtype"] in (np.int8, np.uint8, np.int16):
        info = np.iinfo(detail["dtype"])
        return rng.integers(info.min, info.max + 1, detail["shape"], dtype=detail["dtype"])
    return rng.uniform(-1.0, 1.0, detail["shape"]).astype(np.float32)


def dequantize(data: bytes, value: np.ndarray) -> np.ndarray:
    scale, zero_point = interpreter(data).get_output_details()[0]["quantization"]
    return (value.astype(np.float64) - zero_point) * scale if scale else value


def unpack(data: bytes) -> fb.ModelT:
    return fb.ModelT.InitFromPackedBuf(data, 0)


def constant(model: fb.ModelT, index: int) -> np.ndarray:
    tensor = model.subgraphs[0].tensors[index]
    raw = np.asarray(model.buffers[tensor.buffer].data, np.uint8).tobytes()
    return np.frombuffer(raw, DTYPE_NAMES[tensor.type]).reshape(tensor.shape)


def opcode_names(model: fb.ModelT) -> list[str]:
    codes = model.operatorCodes
    return [OPCODE_NAMES[codes[op.opcodeIndex].builtinCode] for op in model.subgraphs[0].operators]


# -- the examples --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(examples.EXAMPLES))
def test_example_runs_in_tflite(name: str) -> None:
    data = examples.EXAMPLES[name]()
    (out,) = run(data, random_input(data, np.random.default_rng(7)))
    probabilities = dequantize(data, out)
    assert out.shape == (1, 10)
    assert np.all(np.isfinite(probabilities))
    assert len(np.unique(out)) > 1, "output saturated or constant"
    assert probabilities.sum() == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("name", sorted(examples.EXAMPLES))
def test_declared_shapes_match_what_tflite_computes(name: str) -> None:
    data = examples.EXAMPLES[name]()
    declared = [tuple(t.shape) for t in unpack(data).subgraphs[0].tensors]
    computed = [tuple(d["shape"]) for d in interpreter(data).get_tensor_details()]
    assert computed == declared


@pytest.mark.parametrize(
    ("model", "extra_ops"), [(examples.tiny_cnn, set()), (examples.residual_cnn, {"ADD"})]
)
def test_examples_use_the_promised_ops(model, extra_ops: set[str]) -> None:
    expected = {
        "CONV_2D",
        "DEPTHWISE_CONV_2D",
        "MAX_POOL_2D",
        "AVERAGE_POOL_2D",
        "RESHAPE",
        "FULLY_CONNECTED",
        "SOFTMAX",
    }
    assert set(opcode_names(unpack(model("float32")))) == expected | extra_ops


@pytest.mark.parametrize("model", [examples.tiny_cnn, examples.residual_cnn])
def test_int8_model_tracks_the_float_model(model) -> None:
    """Same seed -> same float weights, so the int8 model must approximate the float one: its
    activation ranges neither clip badly nor waste most of the int8 grid."""
    float_data, int8_data = model("float32"), model("int8")
    q = random_input(int8_data, np.random.default_rng(3))
    (expected,) = run(float_data, q.astype(np.float32) / 128.0)
    (actual,) = run(int8_data, q)
    np.testing.assert_allclose(dequantize(int8_data, actual), expected, atol=0.02)


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    for model in (examples.tiny_cnn, examples.residual_cnn):
        for dtype in ("float32", "int8"):
            assert model(dtype, seed=5) == model(dtype, seed=5)
            assert model(dtype, seed=5) != model(dtype, seed=6)
    assert examples.EXAMPLES["tiny_cnn_int8"]() == examples.tiny_cnn("int8", seed=0)


# -- file layout ---------------------------------------------------------------------------------


def test_file_layout_follows_tflite_conventions() -> None:
    data = examples.residual_cnn("int8")
    assert data[4:8] == b"TFL3"
    model = unpack(data)
    assert model.version == 3 and len(model.subgraphs) == 1
    assert model.buffers[0].data is None
    tensors = model.subgraphs[0].tensors
    const_buffers = [t.buffer for t in tensors if t.buffer != 0]
    assert len(const_buffers) == len(set(const_buffers)) == len(model.buffers) - 1
    # Each constant's data starts 16-byte aligned within the file.
    root = fb.Model.GetRootAs(data, 0)
    base = np.frombuffer(data, np.uint8).ctypes.data
    offsets = [root.Buffers(b).DataAsNumpy().ctypes.data - base for b in const_buffers]
    assert [offset % BUFFER_ALIGNMENT for offset in offsets] == [0] * len(offsets)
    for code in model.operatorCodes:
        assert code.deprecatedBuiltinCode == code.builtinCode <= 127


def test_signature_def_names_inputs_and_outputs() -> None:
    signatures = interpreter(examples.tiny_cnn("float32")).get_signature_list()
    assert signatures == {"serving_default": {"inputs": ["input"], "outputs": ["softmax_0"]}}


def test_per_tensor_quantization_parameters() -> None:
    model = unpack(examples.residual_cnn("int8"))
    graph = model.subgraphs[0]
    tensors = graph.tensors
    for op, name in zip(graph.operators, opcode_names(model), strict=True):
        x, out = tensors[op.inputs[0]], tensors[op.outputs[0]]
        if name in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            weights, bias = tensors[op.inputs[1]], tensors[op.inputs[2]]
            channels = out.shape[-1]
            axis = 3 if name == "DEPTHWISE_CONV_2D" else 0
            assert weights.type == fb.TensorType.INT8 and bias.type == fb.TensorType.INT32
            assert weights.quantization.quantizedDimension == axis
            assert len(weights.quantization.scale) == channels == weights.shape[axis]
            assert list(weights.quantization.zeroPoint) == [0] * channels
            assert list(bias.quantization.zeroPoint) == [0] * channels
            np.testing.assert_allclose(
                bias.quantization.scale,
                x.quantization.scale[0] * np.asarray(weights.quantization.scale),
                rtol=1e-6,
            )
            assert np.abs(constant(model, op.inputs[1])).max() == 127  # symmetric, full range
        if name in ("MAX_POOL_2D", "AVERAGE_POOL_2D", "RESHAPE"):
            assert out.quantization.scale == x.quantization.scale
            assert out.quantization.zeroPoint == x.quantization.zeroPoint
        if name == "SOFTMAX":
            assert out.quantization.scale == [1.0 / 256.0]
            assert out.quantization.zeroPoint == [-128]
        assert out.type == fb.TensorType.INT8


# -- the generic layer ---------------------------------------------------------------------------


def test_generic_op_with_options_runs() -> None:
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 2), "float32")
    pooled = b.tensor("pooled", (1, 2, 2, 2), "float32")
    probs = b.tensor("probs", (1, 2, 2, 2), "float32")
    pool = {"padding": "VALID", "stride_w": 2, "stride_h": 2, "filter_width": 2, "filter_height": 2}
    b.op("MAX_POOL_2D", [x], [pooled], pool)
    b.op("SOFTMAX", [pooled], [probs], {"beta": 0.5})
    b.output(probs)
    data = b.build()

    options = unpack(data).subgraphs[0].operators[0].builtinOptions
    assert isinstance(options, fb.Pool2DOptionsT)
    assert (options.padding, options.filterWidth, options.strideH) == (fb.Padding.VALID, 2, 2)

    value = np.arange(32, dtype=np.float32).reshape(1, 4, 4, 2) % 7
    (out,) = run(data, value)
    window_max = value.reshape(1, 2, 2, 2, 2, 2).max(axis=(2, 4))
    logits = 0.5 * window_max
    expected = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_builtin_code_above_127_uses_the_placeholder() -> None:
    assert OPCODE_CODES["GELU"] > 127
    b = ModelBuilder()
    x = b.input("x", (1, 8), "float32")
    y = b.tensor("y", (1, 8), "float32")
    b.op("GELU", [x], [y], {"approximate": False})
    b.output(y)
    data = b.build()
    (code,) = unpack(data).operatorCodes
    assert (code.deprecatedBuiltinCode, code.builtinCode) == (127, OPCODE_CODES["GELU"])

    value = np.linspace(-3.0, 3.0, 8, dtype=np.float32).reshape(1, 8)
    (out,) = run(data, value)
    expected = [0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0))) for v in value[0]]
    np.testing.assert_allclose(out[0], expected, atol=1e-5)


def test_absent_optional_input_is_minus_one() -> None:
    b = ModelBuilder()
    weights = np.array([[1.0, -2.0, 0.5], [0.0, 1.0, 3.0]], np.float32)
    x = b.input("x", (1, 3), "float32")
    w = b.const("w", weights)
    y = b.tensor("y", (1, 2), "float32")
    b.op("FULLY_CONNECTED", [x, w, -1], [y], {"fused_activation_function": "NONE"})
    b.output(y)
    data = b.build()
    assert list(unpack(data).subgraphs[0].operators[0].inputs) == [0, 1, -1]
    (out,) = run(data, np.array([[2.0, 1.0, -4.0]], np.float32))
    np.testing.assert_allclose(out, [[-2.0, -11.0]])


def test_helpers_compute_what_their_weights_say() -> None:
    b = ModelBuilder(seed=11)
    x = b.input("x", (1, 3, 3, 4), "float32")
    conv = b.conv_2d(x, 5, 1, activation="RELU")
    flat = b.reshape(conv, (9, 5))
    fc = b.fully_connected(flat, 2)
    b.output(fc)
    data = b.build()
    model = unpack(data)
    conv_op, _, fc_op = model.subgraphs[0].operators
    conv_w, conv_b = (constant(model, i) for i in conv_op.inputs[1:])
    fc_w, fc_b = (constant(model, i) for i in fc_op.inputs[1:])
    assert conv_w.shape == (5, 1, 1, 4) and fc_w.shape == (2, 5)

    value = np.random.default_rng(0).uniform(-1, 1, (1, 3, 3, 4)).astype(np.float32)
    (out,) = run(data, value)
    hidden = np.maximum(value.reshape(9, 4) @ conv_w[:, 0, 0, :].T + conv_b, 0.0)
    np.testing.assert_allclose(out, hidden @ fc_w.T + fc_b, rtol=1e-5, atol=1e-6)


def test_every_options_table_belongs_to_some_operator() -> None:
    """The exceptions table is complete: no options class is unreachable by name."""
    reachable = {options_class_name(op) for op in OPCODE_CODES}
    tables = {name for name in vars(fb.BuiltinOptions) if name.endswith("Options")}
    assert tables <= reachable
    assert options_class_name("AVERAGE_POOL_2D") == "Pool2DOptions"
    assert options_class_name("TOPK_V2") == "TopKV2Options"
    assert options_class_name("RELU") is None


@pytest.mark.parametrize(
    ("opcode", "options"),
    [
        ("NOT_AN_OP", None),
        ("RELU", {"beta": 1.0}),
        ("CONV_2D", {"no_such_field": 1}),
        ("CONV_2D", {"padding": "SIDEWAYS"}),
    ],
)
def test_bad_operators_are_rejected(opcode: str, options: dict | None) -> None:
    b = ModelBuilder()
    with pytest.raises(ValueError):
        b.op(opcode, [], [], options)


def test_custom_op_metadata_and_variables_round_trip() -> None:
    b = ModelBuilder()
    x = b.input("x", (1, 4), "float32")
    state = b.variable("state", np.array([[1.0, 2.0, 3.0, 4.0]], np.float32))
    y = b.tensor("y", (1, 4), "float32")
    b.custom("MyOp", [x, state], [y], b"\x01\x02")
    b.metadata("min_runtime_version", b"1.5.0\0")
    b.output(y)
    model = unpack(b.build())
    (code,) = model.operatorCodes
    assert (code.builtinCode, code.customCode) == (OPCODE_CODES["CUSTOM"], b"MyOp")
    assert list(model.subgraphs[0].operators[0].customOptions) == [1, 2]
    (meta,) = model.metadata
    assert meta.name == b"min_runtime_version"
    assert bytes(model.buffers[meta.buffer].data) == b"1.5.0\0"
    assert model.subgraphs[0].tensors[state].isVariable
    np.testing.assert_array_equal(constant(model, state), [[1.0, 2.0, 3.0, 4.0]])


def test_zero_variable_runs_in_tflite() -> None:
    b = ModelBuilder()
    x = b.input("x", (1, 4), "float32")
    state = b.variable("state", np.zeros((1, 4), np.float32))
    y = b.tensor("y", (1, 4), "float32")
    b.op("ADD", [x, state], [y])
    b.output(y)
    value = np.array([[1.0, -2.0, 3.0, 0.5]], np.float32)
    (out,) = run(b.build(), value)
    np.testing.assert_array_equal(out, value)


# -- command line --------------------------------------------------------------------------------


def test_main_writes_the_example(tmp_path) -> None:
    out = tmp_path / "nested" / "model.tflite"
    assert examples.main(["tiny_cnn_int8", str(out)]) == 0
    assert out.read_bytes() == examples.EXAMPLES["tiny_cnn_int8"]()


def test_usage_error_is_one_line_and_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "toolchain.front.examples", "no_such_model", "out.tflite"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("usage:")
