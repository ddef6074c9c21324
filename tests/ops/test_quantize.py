"""QUANTIZE, DEQUANTIZE and CAST against TFLite's reference kernels, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import assert_matches_oracle, assert_varied
from toolchain.builder import ModelBuilder
from toolchain.checking.oracle import LiteRTOracle
from toolchain.errors import UnsupportedOpError
from toolchain.ops import prepare_graph
from toolchain.plan import plan_model
from toolchain.reader import parse_model

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
    ],
)
def test_requantize(shape, source, target, source_quant, target_quant):
    model = unary_model("QUANTIZE", shape, source, target, source_quant, target_quant)
    assert_varied(model)
    assert_matches_oracle(model)


@pytest.mark.parametrize(
    "source, target, source_quant, target_quant",
    [
        ("float32", "int32", None, (0.1, 0)),
        ("int16", "int16", (0.1, 5), (0.1, 0)),
        ("float32", "int16", None, (0.1, 3)),
    ],
)
def test_quantize_refuses_what_tflite_refuses(source, target, source_quant, target_quant):
    model = unary_model("QUANTIZE", (4,), source, target, source_quant, target_quant)
    with pytest.raises(UnsupportedOpError):
        prepare_graph(parse_model(model).main)


def test_quantize_refuses_per_channel_output():
    b = ModelBuilder()
    x = b.input("x", (2, 3), "float32")
    y = b.tensor("y", (2, 3), "int8", [0.1, 0.2], [0, 0])
    b.op("QUANTIZE", [x], [y])
    b.output(y)
    with pytest.raises(UnsupportedOpError, match="per-tensor"):
        prepare_graph(parse_model(b.build()).main)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "source, quant",
    [
        ("int8", (0.05, -3)),
        ("int8", (0.0137, 100)),
        ("uint8", (0.1, 128)),
        ("int16", (3.1e-4, 0)),
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
