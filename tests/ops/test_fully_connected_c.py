"""The generated C of FULLY_CONNECTED and BATCH_MATMUL beyond tests/ops/test_fully_connected.py
and test_batch_matmul_int16.py (which already run it through assert_matches_oracle): sanitized
builds, loop tails, wide accumulators, the folded-offset path, requantization overflow and
deterministic text."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

import numpy as np
import pytest

from tests.conftest import SHARED_MODELS, native_vnni
from tests.ops.test_batch_matmul_int16 import int16_batch_matmul_model
from tests.ops.test_fully_connected import (
    batch_matmul_model,
    fully_connected_model,
    hybrid_batch_matmul_model,
    int16_fully_connected_model,
)
from toolchain.c.generate import generate
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend, compiler
from toolchain.lab.check import check_plan, difference
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import plan_model


def c_text(model: bytes) -> str:
    return generate(plan_model(parse_model(model, "<built model>"), "greedy"))["model.c"]


def assert_c_matches(model: bytes, inputs: int = 3, sanitize: bool = True) -> None:
    """The C (built with ASan and UBSan by default) against TFLite on random inputs."""
    mp = plan_model(parse_model(model, "<built model>"), "greedy")
    with CBackend(mp, sanitize=sanitize) as backend:
        report = check_plan(mp, model, inputs=inputs, extra=[("c", backend.invoke_many)])
    bad = [o for o in report.outputs if o.mismatches]
    assert not bad, "; ".join(
        f"{o.name}: {o.mismatches} mismatches, max {o.max_abs_diff}" for o in bad
    )


def assert_c_matches_on(model: bytes, values: Sequence[np.ndarray]) -> None:
    """The sanitized C against TFLite on the given inputs."""
    mp = plan_model(parse_model(model, "<built model>"), "greedy")
    expected = LiteRTOracle(model).invoke(list(values))
    with CBackend(mp, sanitize=True) as backend:
        actual = backend.invoke(list(values))
    for e, a in zip(expected, actual, strict=True):
        d = difference(e, a)
        assert d.mismatches == 0, str(d)


# -- FULLY_CONNECTED -------------------------------------------------------------------------

FC_CASES = [
    ("float32", (1, 7), 3, {}),  # depth below one vector step: tail only
    ("float32", (3, 37), 5, {}),  # main loop plus tail
    ("float32", (2, 640), 9, {"activation": "RELU"}),
    ("int8", (1, 7), 3, {}),
    ("int8", (3, 37), 5, {"filter_zero_point": -3}),
    ("int8", (2, 640), 9, {"per_channel": True, "activation": "RELU6"}),
    ("int8", (4, 48), 6, {"bias": False, "filter_zero_point": 4}),
]


@pytest.mark.parametrize("dtype, shape, units, options", FC_CASES)
def test_fully_connected_sanitized(dtype, shape, units, options):
    assert_c_matches(fully_connected_model(dtype, shape, units, **options))


@pytest.mark.parametrize(
    "shape, units, options",
    [
        ((3, 37), 5, {"filter_zero_point": -3}),
        ((2, 640), 9, {"per_channel": True, "activation": "RELU6"}),
        ((4, 48), 6, {"bias": False, "filter_zero_point": 4}),
        ((5, 16), 4, {}),
    ],
)
def test_fully_connected_int8_folded_offsets(shape, units, options):
    """Constant weights: the input offset is folded into per-unit constants."""
    model = fully_connected_model("int8", shape, units, **options)
    text = c_text(model)
    assert "_row[" in text, "the folded path was not taken"
    assert_c_matches(model)


def test_fully_connected_int8_reads_its_input_plus_128_as_bytes():
    """int8 input + 128 copied into arenac_col8, the input offset - 128 folded per unit: exact
    at the extremes of the input and of the offsets too."""
    model = _extreme_fc_model(64)
    assert "arenac_col8 xr[64]" in c_text(model)
    for value in (-128, 0, 127):
        assert_c_matches_on(model, [np.full((1, 64), value, np.int8)])
    assert "arenac_col8" not in c_text(_extreme_fc_model(33100))  # too deep for the stack


@pytest.mark.skipif(not native_vnni(), reason="-march=native has no VNNI on this host")
@pytest.mark.parametrize("shape, units, options", [
    ((2, 640), 9, {"per_channel": True, "activation": "RELU6"}),
    ((3, 37), 5, {"filter_zero_point": -3}),
    ((4, 48), 6, {"bias": False}),
])
def test_fully_connected_int8_with_vnni(shape, units, options, monkeypatch):
    """The input row in uint8_t, which GCC multiplies by the int8 filter with vpdpbusd."""
    monkeypatch.setenv("CC", shlex.join([*compiler(), "-march=native"]))
    assert_c_matches(fully_connected_model("int8", shape, units, **options))


def _extreme_fc_model(depth: int, units: int = 2, out_scale: float = 1.0) -> bytes:
    """Operands that reach +-255 after their offsets, so long sums wrap an int32."""
    b = ModelBuilder("int8")
    x = b.input("x", (1, depth), "int8", 1.0, 127)
    w = b.const("w", np.full((units, depth), -128, np.int8), 1.0, 127)
    y = b.tensor("y", (1, units), "int8", out_scale, 0)
    b.op("FULLY_CONNECTED", [x, w, -1], [y], version=4)
    b.output(y)
    return b.build()


def test_fully_connected_int8_wrapping_accumulator():
    """33100 products of 65025 overflow int32: the C sums in uint32_t and wraps like TFLite."""
    model = _extreme_fc_model(33100)
    assert_c_matches_on(model, [np.full((1, 33100), -128, np.int8)])


def test_fully_connected_int8_requantization_out_of_int32():
    """round(acc * scale) beyond int32 casts to INT32_MIN (x86), then clamps to -128."""
    model = _extreme_fc_model(64, out_scale=1e-6)
    for value in (-128, 0, 100, 127):
        assert_c_matches_on(model, [np.full((1, 64), value, np.int8)])


# -- BATCH_MATMUL ----------------------------------------------------------------------------

BMM_CASES = [
    ("float32", (2, 3, 5), (2, 5, 4), False, False, None),
    ("float32", (2, 1, 5, 3), (4, 2, 5), True, True, None),
    ("float32", (2, 300), (300, 260), False, False, None),  # too wide for a row accumulator
    ("int8", (2, 3, 5), (1, 5, 4), False, False, None),
    ("int8", (1, 2, 1, 5, 3), (2, 1, 3, 4, 5), True, True, None),
    ("int8", (3, 40), (40, 300), False, False, None),
    ("int8", (2, 3, 7), (4, 7), False, True, "int32"),
    ("int8", (2, 3, 7), (7, 4), False, False, "int32"),
]


@pytest.mark.parametrize("dtype, lhs, rhs, adj_x, adj_y, out_dtype", BMM_CASES)
def test_batch_matmul_sanitized(dtype, lhs, rhs, adj_x, adj_y, out_dtype):
    assert_c_matches(batch_matmul_model(dtype, lhs, rhs, adj_x, adj_y, out_dtype), inputs=2)


def test_batch_matmul_int8_wrapping_accumulator():
    b = ModelBuilder("int8")
    lhs = b.input("lhs", (1, 33100), "int8", 1.0, 127)
    rhs = b.input("rhs", (33100, 2), "int8", 1.0, 127)
    out = b.tensor("out", (1, 2), "int32")
    b.op("BATCH_MATMUL", [lhs, rhs], [out])
    b.output(out)
    model = b.build()
    assert "uint32_t acc" not in c_text(model)  # raw products: int32 cannot overflow
    q = ModelBuilder("int8")
    lhs = q.input("lhs", (1, 33100), "int8", 1.0, 127)
    rhs = q.input("rhs", (33100, 2), "int8", 1.0, 127)
    out = q.tensor("out", (1, 2), "int8", 2.0**-20, 0)
    q.op("BATCH_MATMUL", [lhs, rhs], [out])
    q.output(out)
    model = q.build()
    assert "uint32_t acc" in c_text(model)
    assert_c_matches_on(
        model, [np.full((1, 33100), -128, np.int8), np.full((33100, 2), -128, np.int8)]
    )


@pytest.mark.parametrize("lhs, rhs, adj_x, adj_y, rhs_dtype", [
    ((2, 1, 5, 3), (4, 2, 5), True, True, "int16"),
    ((2, 3, 7), (1, 7, 4), False, False, "int16"),
    ((3, 40), (40, 300), False, False, "int16"),  # too wide for an int64 row accumulator
    ((2, 3, 7), (7, 4), False, False, "int8"),  # 16x8
])
def test_batch_matmul_int16_sanitized(lhs, rhs, adj_x, adj_y, rhs_dtype):
    model = int16_batch_matmul_model(lhs, rhs, adj_x, adj_y, rhs_dtype=rhs_dtype)
    assert ("int64_t acc[" in c_text(model)) == (rhs[-1] <= 128 and not adj_y)
    assert_c_matches(model, inputs=2)


@pytest.mark.parametrize("lhs, rhs, adj_x, adj_y, per_channel, asymmetric", [
    ((2, 3, 16), (16, 7), False, False, True, True),
    ((2, 13, 3), (1, 6, 13), True, True, False, True),
    ((1, 9), (9, 1), False, False, False, False),  # every loop of one trip
    ((2, 300), (300, 260), False, False, True, False),  # too wide for a row accumulator
])
def test_batch_matmul_hybrid_sanitized(lhs, rhs, adj_x, adj_y, per_channel, asymmetric):
    model = hybrid_batch_matmul_model(lhs, rhs, adj_x, adj_y, per_channel, asymmetric)
    assert_c_matches(model, inputs=2)


@pytest.mark.parametrize("shape, units, options", [
    ((3, 37), 5, {}),
    ((2, 640), 9, {"per_channel": True, "activation": "RELU6"}),
    ((4, 48), 6, {"bias": False, "filter_zero_point": -4}),
])
def test_fully_connected_int16_int32_bias_sanitized(shape, units, options):
    model = int16_fully_connected_model(shape, units, bias_type="INT32", **options)
    assert "_output(uint32_t sum" in c_text(model)  # wrapping as TFLite's int32 sums
    assert_c_matches(model)


# -- whole models and text -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["hello_world_float", "hello_world_int8", "ad01_fp32", "ad01_int8"]
)
def test_real_models_sanitized(name):
    path = SHARED_MODELS / f"{name}.tflite"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    assert_c_matches(path.read_bytes(), inputs=2)


def test_generated_text_is_deterministic():
    models = [
        fully_connected_model("int8", (2, 40), 6, per_channel=True),
        fully_connected_model("float32", (2, 40), 6),
        batch_matmul_model("int8", (2, 3, 5), (1, 5, 4)),
        int16_batch_matmul_model((2, 3, 5), (1, 5, 4)),
        hybrid_batch_matmul_model((2, 5, 3), (2, 4, 5), True, True, True, True),
        int16_fully_connected_model((2, 40), 6, bias_type="INT32"),
    ]
    for model in models:
        assert c_text(model) == c_text(bytes(model))
