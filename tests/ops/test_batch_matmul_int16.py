"""int16 BATCH_MATMUL (zero points 0; an int16 rhs, or an int8 one as 16x8) against TFLite's
reference kernel, in runtime_py and the generated C: int64 sums, then the int64
MultiplyByQuantizedMultiplier (a 16-bit multiplier and one rounding shift, unlike the int32 one
that int8 uses)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from tests.opcheck import assert_matches_oracle, assert_varied
from tests.ops.test_fully_connected import MATMUL_SHAPES, _adjusted, assert_refused
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import plan_model
from toolchain.ops.fully_connected.prepare import BatchMatMulInt16Params, prepare_batch_matmul

# Uniform int16 and int8 values have these deviations.
STD = {"int16": 65536 / math.sqrt(12), "int8": 256 / math.sqrt(12)}


def int16_batch_matmul_model(lhs_shape: Sequence[int], rhs_shape: Sequence[int],
                             adj_x: bool = False, adj_y: bool = False,
                             scales: tuple[float, float] = (1 / 4096, 1 / 2048),
                             spread: float = 4.0, constant_rhs: bool = False,
                             zero_points: tuple[int, int, int] = (0, 0, 0),
                             out_dtype: str = "int16", rhs_dtype: str = "int16") -> bytes:
    """One int16 BATCH_MATMUL whose output scale covers +-`spread` deviations of the result."""
    rows = lhs_shape[-1] if adj_x else lhs_shape[-2]
    depth = lhs_shape[-2] if adj_x else lhs_shape[-1]
    cols = rhs_shape[-2] if adj_y else rhs_shape[-1]
    out_shape = (*np.broadcast_shapes(tuple(lhs_shape[:-2]), tuple(rhs_shape[:-2])), rows, cols)
    b = ModelBuilder("float32")
    lhs = b.input("lhs", lhs_shape, "int16", scales[0], zero_points[0])
    if constant_rhs:
        info = np.iinfo(rhs_dtype)
        values = np.random.default_rng(7).integers(info.min, info.max + 1, rhs_shape)
        rhs = b.const("rhs", values.astype(rhs_dtype), scales[1], zero_points[1])
    else:
        rhs = b.input("rhs", rhs_shape, rhs_dtype, scales[1], zero_points[1])
    std = math.sqrt(depth) * STD["int16"] * STD[rhs_dtype] * scales[0] * scales[1]
    out_quant = (spread * std / 32767, zero_points[2]) if out_dtype != "int32" else ()
    out = b.tensor("out", out_shape, out_dtype, *out_quant)
    b.op("BATCH_MATMUL", [lhs, rhs], [out], {"adj_x": adj_x, "adj_y": adj_y})
    b.output(out)
    return b.build()


def params_of(model: bytes) -> BatchMatMulInt16Params:
    graph = parse_model(model, "<built model>").main
    return prepare_batch_matmul(graph, graph.operators[0])


def assert_matches_and_varied(model: bytes) -> None:
    assert_matches_oracle(model)
    assert_varied(model, min_distinct=8)


ADJOINTS = [(False, False), (True, False), (False, True), (True, True)]


@pytest.mark.parametrize("lhs_shape, rhs_shape", MATMUL_SHAPES)
@pytest.mark.parametrize("adj_x, adj_y", ADJOINTS)
def test_batch_matmul_int16(lhs_shape, rhs_shape, adj_x, adj_y):
    """Every broadcast of the batch dimensions, with each adjoint pair."""
    assert_matches_and_varied(int16_batch_matmul_model(
        _adjusted(lhs_shape, adj_x), _adjusted(rhs_shape, adj_y), adj_x, adj_y))


@pytest.mark.parametrize("scales, spread", [
    ((1 / 4096, 1 / 2048), 4.0),
    ((0.0123, 0.00071), 3.0),  # a product that differs in float32 and double
    ((3e-4, 7e-4), 0.05),  # most outputs clamp at +-32767
])
def test_batch_matmul_int16_scales(scales, spread):
    model = int16_batch_matmul_model((2, 5, 24), (24, 6), scales=scales, spread=spread)
    assert_matches_oracle(model)
    assert_varied(model, min_distinct=3)


def assert_matches_on(model: bytes, values: list[np.ndarray]) -> None:
    """runtime_py and the sanitized C against TFLite on the given inputs."""
    from runtime_py.interpreter import ArenaInterpreter

    expected = LiteRTOracle(model).invoke(values)[0]
    mp = plan_model(parse_model(model, "<built model>"), "greedy")
    with CBackend(mp, sanitize=True) as c:
        from_c = c.invoke(values)[0]
    for got in (ArenaInterpreter(mp).invoke(values)[0], from_c):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("out_scale", [0.1, 0.0213, 0.002])
def test_batch_matmul_int16_multiplier_above_one(out_scale):
    """Small operands and an output scale below their product: the multiplier exceeds one,
    the int64 shift is below 15."""
    b = ModelBuilder("float32")
    lhs = b.input("lhs", (2, 5, 24), "int16", 0.5, 0)
    rhs = b.input("rhs", (24, 6), "int16", 0.25, 0)
    out = b.tensor("out", (2, 5, 6), "int16", out_scale, 0)
    b.op("BATCH_MATMUL", [lhs, rhs], [out])
    b.output(out)
    model = b.build()
    assert params_of(model).shift < 15
    rng = np.random.default_rng(4)
    values = [rng.integers(-9, 10, (2, 5, 24)).astype(np.int16),
              rng.integers(-9, 10, (24, 6)).astype(np.int16)]
    assert_matches_on(model, values)


@pytest.mark.parametrize("adj_y", [False, True])
def test_batch_matmul_int16_constant_rhs(adj_y):
    model = int16_batch_matmul_model((3, 4, 20), _adjusted((20, 9), adj_y), adj_y=adj_y,
                                     constant_rhs=True)
    assert_matches_and_varied(model)


def test_batch_matmul_int16_wide_rows():
    """More columns than the row accumulator holds in int64: dot products down the columns."""
    assert_matches_and_varied(int16_batch_matmul_model((2, 16), (16, 200)))


def test_batch_matmul_int16_sums_beyond_int32():
    """4096 products of 2^30: the sums need int64, as in TFLite."""
    model = int16_batch_matmul_model((1, 4096), (4096, 3), scales=(1.0, 1.0), spread=1.0)
    values = [np.full((1, 4096), -32768, np.int16),
              np.concatenate([np.full((4096, 1), v, np.int16) for v in (-32768, 32767, 5)], 1)]
    assert len(np.unique(LiteRTOracle(model).invoke(values)[0])) == 3
    assert_matches_on(model, values)


def test_batch_matmul_int16_refuses_zero_points():
    model = int16_batch_matmul_model((2, 3), (3, 2), zero_points=(0, 3, 0))
    assert_refused(model, "zero point")


def test_batch_matmul_int16_refuses_per_channel():
    b = ModelBuilder("float32")
    lhs = b.input("lhs", (2, 3), "int16", 0.01, 0)
    rhs = b.const("rhs", np.ones((3, 2), np.int16), [0.01, 0.02], [0, 0], quantized_dimension=1)
    out = b.tensor("out", (2, 2), "int16", 0.01, 0)
    b.op("BATCH_MATMUL", [lhs, rhs], [out])
    b.output(out)
    assert_refused(b.build(), "per-channel")


def test_batch_matmul_int16_refuses_scales_too_far_apart():
    """A multiplier of 2^15 or more would shift TFLite's int64 product by a negative amount."""
    model = int16_batch_matmul_model((2, 3), (3, 2), scales=(1.0, 1.0), spread=1e-12)
    assert_refused(model, "left shift")


def test_batch_matmul_int16_refuses_sums_that_overflow_int64():
    depth = 2**20
    model = int16_batch_matmul_model((1, depth), (depth, 1), scales=(1.0, 1.0), spread=1.0)
    assert_refused(model, "overflow")


@pytest.mark.parametrize("rhs_dtype, out_dtype", [("int16", "int32"), ("int8", "int8"),
                                                ("int8", "int32")])
def test_batch_matmul_int16_refuses_other_dtypes(rhs_dtype, out_dtype):
    model = int16_batch_matmul_model((2, 3), (3, 2), rhs_dtype=rhs_dtype, out_dtype=out_dtype)
    assert_refused(model, "no kernel for int16")


# -- 16x8: int16 lhs, int8 rhs ---------------------------------------------------------------


@pytest.mark.parametrize("lhs_shape, rhs_shape, adj_x, adj_y", [
    ((3, 5), (5, 4), False, False),
    ((2, 3, 5), (1, 5, 4), True, False),
    ((2, 1, 3, 5), (4, 5, 2), False, True),
    ((1, 2, 1, 3, 5), (2, 1, 3, 5, 4), True, True),
])
@pytest.mark.parametrize("constant_rhs", [False, True])
def test_batch_matmul_16x8(lhs_shape, rhs_shape, adj_x, adj_y, constant_rhs):
    model = int16_batch_matmul_model(_adjusted(lhs_shape, adj_x), _adjusted(rhs_shape, adj_y),
                                     adj_x, adj_y, scales=(1 / 4096, 0.0123),
                                     constant_rhs=constant_rhs, rhs_dtype="int8")
    assert_matches_oracle(model)
    assert_varied(model, min_distinct=6)


def test_batch_matmul_16x8_refuses_rhs_zero_point():
    model = int16_batch_matmul_model((2, 3), (3, 2), zero_points=(0, 5, 0), rhs_dtype="int8")
    assert_refused(model, "needs zero point 0")
