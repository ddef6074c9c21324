"""QUANTIZE, DEQUANTIZE and CAST against TFLite's reference kernels, bit for bit."""

from __future__ import annotations

import re

import flatbuffers
import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import assert_matches_oracle, assert_varied
from toolchain.errors import UnsupportedOpError
from toolchain.front.builder import FILE_IDENTIFIER, ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.front.schema import fb
from toolchain.lab.check import random_inputs
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import plan_model
from toolchain.ops import prepare_graph

Quant = tuple[float, int] | None


def unary_model(
    opcode: str,
    shape: tuple[int, ...],
    source: str,
    target: str,
    source_quant: Quant = None,
    target_quant: Quant = None,
) -> bytes:
    b = ModelBuilder()
    x = b.input("x", shape, source, *(source_quant or (None, None)))
    y = b.tensor("y", shape, target, *(target_quant or (None, None)))
    b.op(opcode, [x], [y])
    b.output(y)
    return b.build()


def assert_matches_oracle_on(model_bytes: bytes, values: np.ndarray) -> None:
    """Like assert_matches_oracle, on chosen input values (ties, saturation, NaN)."""
    runtime = ArenaInterpreter(plan_model(parse_model(model_bytes), "greedy"))
    (expected,) = LiteRTOracle(model_bytes).invoke([values])
    (actual,) = runtime.invoke([values])
    np.testing.assert_array_equal(actual, expected)


SHAPES = [(7,), (2, 5, 3), (1, 4, 4, 6)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "target, quant",
    [
        ("int8", (0.02, -3)),
        ("int8", (1.0 / 128, 0)),
        ("int8", (0.0137, 27)),
        ("uint8", (0.03, 128)),
        ("int16", (1e-4, 0)),
    ],
)
def test_quantize_float(shape, target, quant):
    model = unary_model("QUANTIZE", shape, "float32", target, None, quant)
    assert_varied(model)
    assert_matches_oracle(model)


@pytest.mark.parametrize(
    "target, scale, zero_point",
    [
        ("int8", 0.5, 1),
        ("int8", 0.25, -3),
        ("int8", 0.1, 0),
        ("int8", 3.0, 7),
        ("uint8", 0.25, 128),
        ("int16", 0.5, 0),
    ],
)
def test_quantize_rounds_halves_away_from_zero(target, scale, zero_point):
    model = unary_model("QUANTIZE", (41,), "float32", target, None, (scale, zero_point))
    halves = (np.arange(-20, 21) + 0.5).astype(np.float32) * np.float32(scale)
    assert_matches_oracle_on(model, halves)
    # Beyond int32 TFLite's conversion misbehaves (x86: INT32_MIN, then the zero point wraps).
    extremes = [np.inf, -np.inf, 1e30, -1e30, np.nan, 2.1e9 * scale, -2.1e9 * scale]
    assert_matches_oracle_on(model, np.array(extremes + [0.0] * 34, np.float32))


@pytest.mark.parametrize("shape", SHAPES[:2])
@pytest.mark.parametrize(
    "source, target, source_quant, target_quant",
    [
        ("int8", "int8", (0.05, 3), (0.1, -10)),
        ("int8", "int8", (0.05, 3), (0.02, 5)),
        ("int8", "int8", (0.05, 3), (0.05, 3)),
        ("int8", "uint8", (0.05, 3), (0.07, 120)),
        ("int8", "uint8", (0.05, 3), (0.05, 131)),
        ("uint8", "int8", (0.05, 128), (0.05, 0)),
        ("uint8", "int8", (0.03, 100), (0.04, -20)),
        ("uint8", "uint8", (0.03, 100), (0.011, 90)),
        ("int16", "int16", (1e-3, 0), (3e-3, 0)),
        ("int16", "int8", (1e-3, 0), (0.2, -7)),
        ("int8", "int16", (0.05, 3), (0.002, 0)),
        ("int8", "int16", (0.1, 0), (0.1, 0)),
        ("int16", "int32", (1e-3, 0), (1e-4, 0)),
        ("uint8", "int16", (0.05, 128), (0.002, 0)),
        ("uint8", "int16", (0.0123, 7), (0.03, 0)),
        # int32 inputs span all of int32: scales that bring them into the output's range
        ("int32", "int8", (1e-9, 0), (0.05, -3)),
        ("int32", "int8", (3e-10, 123456), (0.02, 10)),
        ("int32", "int16", (1e-6, 0), (0.1, 0)),
        ("int32", "int16", (2.5e-7, -70000), (0.01, 0)),
    ],
)
def test_requantize(shape, source, target, source_quant, target_quant):
    model = unary_model("QUANTIZE", shape, source, target, source_quant, target_quant)
    assert_varied(model)
    assert_matches_oracle(model)


# Values at the ends of their types: q - zero_point, and the product plus the output's zero
# point, wrap around in TFLite's int32 arithmetic.
ENDS = {
    "int32": np.array(
        [-(2**31), -(2**31) + 1, -(2**31) + 500, 2**31 - 1, 2**31 - 600, -1, 0, 1, 99, -99,
         2**30, -(2**30), 123456789, -987654321, 2**31 - 130, -(2**31) + 130],
        np.int32,
    ),
    "int16": np.array([-32768, -32767, -1000, -1, 0, 1, 1000, 32767] * 2, np.int16),
}
WRAPS = [
    ("int32", "int8", (0.05, 1000), (0.05, -100)),
    ("int32", "int8", (0.05, 1000), (0.1, 0)),
    ("int32", "int8", (0.05, -1000), (0.0499, 100)),
    ("int32", "int8", (0.05, 0), (0.05, 127)),
    ("int32", "int16", (0.01, 300), (0.01, 0)),
    ("int32", "int16", (0.05, -1000), (0.1, 0)),
    ("int32", "int8", (1e-9, 0), (0.05, -3)),
    ("int16", "int32", (0.001, 0), (0.0001, 2**31 - 100)),
    ("int16", "int32", (0.001, 0), (0.0005, -(2**31) + 5)),
]


@pytest.mark.parametrize("source, target, source_quant, target_quant", WRAPS)
def test_requantize_wraps_as_tflite(source, target, source_quant, target_quant):
    values = ENDS[source]
    model = unary_model("QUANTIZE", values.shape, source, target, source_quant, target_quant)
    assert_matches_oracle_on(model, values)


def with_quantized_dimension(model: bytes, tensor: int, dimension: int) -> bytes:
    """The model with `tensor`'s quantized_dimension set (the builder writes 0 for tensors)."""
    tree = fb.ModelT.InitFromPackedBuf(model, 0)
    tree.subgraphs[0].tensors[tensor].quantization.quantizedDimension = dimension
    builder = flatbuffers.Builder(len(model))
    builder.Finish(tree.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def per_channel_model(shape, source, target, source_quant, target_quant, axis) -> bytes:
    """QUANTIZE with one side quantized per channel along `axis` (a quant given as lists)."""
    b = ModelBuilder()
    x = b.input("x", shape, source, *(source_quant or (None, None)))
    y = b.tensor("y", shape, target, *(target_quant or (None, None)))
    b.op("QUANTIZE", [x], [y])
    b.output(y)
    per_channel = x if source_quant and isinstance(source_quant[0], list) else y
    return with_quantized_dimension(b.build(), per_channel, axis)


@pytest.mark.parametrize(
    "shape, axis, target, zero_points",
    [
        ((2, 3, 4), 1, "int8", [1, -3, 5]),
        ((3, 5), 0, "int8", [0, 0, 0]),
        ((2, 4, 3), 2, "uint8", [128, 100, 140]),
        ((1, 2, 2, 3), 3, "int16", [0, 0, 0]),
        ((3, 2, 5), 0, "int16", [0, 0, 0]),
    ],
)
def test_quantize_per_channel(shape, axis, target, zero_points):
    """TFLite's PerChannelQuantize: AffineQuantize with each channel's scale and zero point."""
    scales = [0.01, 0.05, 0.2][: len(zero_points)]
    model = per_channel_model(shape, "float32", target, None, (scales, zero_points), axis)
    assert_varied(model)
    assert_matches_oracle(model)
    halves = (np.arange(np.prod(shape)).reshape(shape) % 7 - 3 + 0.5).astype(np.float32)
    channel_scales = np.asarray(scales, np.float32).reshape([-1 if a == axis else 1
                                                             for a in range(len(shape))])
    assert_matches_oracle_on(model, (halves * channel_scales).astype(np.float32))
    extremes = np.resize(np.array([np.inf, -np.inf, np.nan, 1e30, -3e9, 0.0], np.float32), shape)
    assert_matches_oracle_on(model, extremes)


# (source, target, LiteRT's message): the pairs QUANTIZE does not run.
LITERT_REFUSES = [
    ("float32", "int32", "output->type == kTfLiteUInt8 || output->type == kTfLiteInt8"),
    ("int8", "int32", "output->type == kTfLiteUInt8 || output->type == kTfLiteInt8"),
    ("uint8", "int32", "output->type == kTfLiteUInt8 || output->type == kTfLiteInt8"),
    ("int16", "uint8", "output->type == kTfLiteInt8 || output->type == kTfLiteInt16 ||"),
    ("int32", "uint8", "output->type == kTfLiteInt8 || output->type == kTfLiteInt16 was"),
    ("int32", "int32", "output->type == kTfLiteInt8 || output->type == kTfLiteInt16 was"),
    ("int8", "float32", "output->quantization.type != kTfLiteAffineQuantization"),
    ("float32", "float32", "output->quantization.type != kTfLiteAffineQuantization"),
]
QUANTS = {"float32": None, "int8": (0.05, 3), "uint8": (0.05, 130), "int16": (0.002, 0),
          "int32": (1e-4, 0)}


@pytest.mark.parametrize("source, target, message", LITERT_REFUSES)
def test_quantize_refuses_the_pairs_litert_refuses(source, target, message):
    model = unary_model("QUANTIZE", (4,), source, target, QUANTS[source], None)
    with pytest.raises(UnsupportedOpError, match=f"no kernel for {source} -> {target}"):
        prepare_graph(parse_model(model).main)
    quantized = unary_model("QUANTIZE", (4,), source, target, QUANTS[source], QUANTS[target])
    with pytest.raises(RuntimeError, match=re.escape(message)):
        LiteRTOracle(quantized)


@pytest.mark.parametrize(
    "source, source_quant, target, target_quant",
    [
        ("int16", (1 / 32768, -32768), "int32", (1 / 65536, 0)),  # after an int8 -> int16 softmax
        ("int16", (0.003, 5), "int32", (0.005, 3)),
        ("int16", (0.003, 5), "int8", (0.005, -3)),
        ("float32", None, "int16", (0.005, 17)),
        ("int8", (0.003, 3), "int16", (0.005, 5)),
        ("uint8", (0.003, 3), "int16", (0.005, -5)),
        ("int32", (0.003, 3), "int16", (0.005, 5)),
    ],
)
def test_quantize_int16_beside_another_type_takes_any_zero_point(source, source_quant, target,
                                                                 target_quant):
    """TFLite holds only int16 -> int16 to zero point 0 (the 16x8 scheme)."""
    model = unary_model("QUANTIZE", (3, 20), source, target, source_quant, target_quant)
    assert_varied(model)
    assert_matches_oracle(model)


@pytest.mark.parametrize(
    "source, target, source_quant, target_quant, reason",
    [
        ("int16", "int16", (0.1, 5), (0.1, 0), "zero point 0"),
        ("int16", "int16", (0.1, 0), (0.1, -4), "zero point 0"),
        ("float32", "int8", None, None, "no quantization"),
    ],
)
def test_quantize_refusals(source, target, source_quant, target_quant, reason):
    model = unary_model("QUANTIZE", (4,), source, target, source_quant, target_quant)
    with pytest.raises(UnsupportedOpError, match=reason):
        prepare_graph(parse_model(model).main)


@pytest.mark.parametrize(
    "source, target, source_quant, target_quant",
    [
        ("int8", "int8", ([0.01, 0.05, 0.2], [0, 0, 0]), (0.1, 0)),
        ("int8", "int8", (0.1, 0), ([0.01, 0.05, 0.2], [0, 0, 0])),
        ("int16", "int8", (0.001, 0), ([0.01, 0.05, 0.2], [0, 0, 0])),
    ],
)
def test_requantize_refuses_per_channel(source, target, source_quant, target_quant):
    """TFLite requantizes with a tensor's single scale, which a per-channel tensor lacks (0):
    LiteRT writes zeros, which no model means."""
    model = per_channel_model((2, 3, 4), source, target, source_quant, target_quant, 1)
    with pytest.raises(UnsupportedOpError, match="per-tensor"):
        prepare_graph(parse_model(model).main)
    (litert,) = LiteRTOracle(model).invoke(random_inputs(parse_model(model).main, 0))
    assert not litert.any()


def test_quantize_per_channel_refuses_an_axis_past_the_rank():
    """The reader lets a 1-D tensor name any axis (converters write the filter's into biases);
    a QUANTIZE output cannot mean one, and LiteRT refuses it."""
    model = per_channel_model((3,), "float32", "int8", None, ([0.1, 0.2, 0.3], [0, 0, 0]), 2)
    with pytest.raises(UnsupportedOpError, match="3 scales along axis 2"):
        prepare_graph(parse_model(model).main)
    with pytest.raises(ValueError, match="quantized_dimension must be in range"):
        LiteRTOracle(model)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "source, quant",
    [
        ("int8", (0.05, -3)),
        ("int8", (0.0137, 100)),
        ("uint8", (0.1, 128)),
        ("int16", (3.1e-4, 0)),
        ("int16", (0.02, 0)),
    ],
)
def test_dequantize(shape, source, quant):
    model = unary_model("DEQUANTIZE", shape, source, "float32", quant)
    assert_varied(model)
    assert_matches_oracle(model)


def test_dequantize_per_channel():
    b = ModelBuilder()
    x = b.input("x", (3, 4, 2), "int8", [0.1, 0.013, 2.5], [0, 4, -9])
    y = b.tensor("y", (3, 4, 2), "float32")
    b.op("DEQUANTIZE", [x], [y])
    b.output(y)
    model = b.build()
    assert_varied(model)
    assert_matches_oracle(model)


CAST_DTYPES = ["float32", "int64", "int32", "int16", "int8", "uint8", "bool"]


@pytest.mark.parametrize("source", CAST_DTYPES)
@pytest.mark.parametrize("target", CAST_DTYPES)
def test_cast(source, target):
    model = unary_model("CAST", (3, 17), source, target)
    if target != "bool":  # random values are never zero: see test_cast_to_bool
        assert_varied(model)
    assert_matches_oracle(model)


@pytest.mark.parametrize("source", CAST_DTYPES)
def test_cast_to_bool(source):
    values = np.array([0, 1, 0, 3, 0, 0, 1, 7], dtype=source)
    assert_matches_oracle_on(unary_model("CAST", values.shape, source, "bool"), values)


# Out of range, halves, NaN and infinities: TFLite saturates float -> integer casts.
EDGES = np.array(
    [
        0.0,
        -0.0,
        0.5,
        -0.5,
        1.7,
        -1.7,
        127.9,
        128.5,
        -129.5,
        200.7,
        255.9,
        256.2,
        32767.9,
        -32768.9,
        65536.1,
        2147483520.0,
        2147483648.0,
        -2147483648.0,
        3e9,
        -3e9,
        9.3e18,
        -9.3e18,
        1e20,
        -1e20,
        np.inf,
        -np.inf,
        np.nan,
    ],
    np.float32,
)


@pytest.mark.parametrize("target", CAST_DTYPES[1:])
def test_cast_float_edges(target):
    model = unary_model("CAST", EDGES.shape, "float32", target)
    assert_matches_oracle_on(model, EDGES)
