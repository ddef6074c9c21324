"""int16 (16x8) LOGISTIC, TANH, SOFTMAX and PRELU against TFLite's reference kernels, bit-exact in
runtime_py and in the compiled C; the tables they interpolate in, computed by our own code; and
what TFLite has no int16 kernel for (RELU_N1_TO_1, HARD_SWISH) or prepares differently, refused.

LOGISTIC and TANH run on every int16 input at each input scale: the power-of-two cases (2^-12
for both, 2^-11 for TANH), a scale CheckedLog2 still takes for 2^-12, and general ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import assert_matches_oracle, assert_varied
from tests.ops.test_activations import PRELU_SHAPES, assert_refused, uint8_model
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import difference
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import plan_model
from toolchain.numerics.tables import (
    lut_lookup_int16,
    sigmoid_table_uint16,
    softmax_exp_lut,
    softmax_reciprocal_lut,
)
from toolchain.ops import REGISTRY
from toolchain.ops.activations.prepare import Int16SigmoidParams

Quant = tuple[float, int]

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int64).astype(np.int16)
OUT_2_15: Quant = (2**-15, 0)
SHAPES = [(4, 64), (1, 4, 4, 3), (40,)]


def int16_model(opcode: str, shape: Sequence[int], input_q: Quant, output_q: Quant,
                options: dict | None = None) -> bytes:
    return uint8_model(opcode, shape, input_q, output_q, options, dtype="int16")


def assert_matches_on(model: bytes, input_sets: Sequence[Sequence[np.ndarray]],
                      sanitize: bool = False) -> None:
    """TFLite, runtime_py and the compiled C on the given inputs: bit for bit."""
    mp = plan_model(parse_model(model, "<built model>"), "greedy")
    oracle, interpreter = LiteRTOracle(model), ArenaInterpreter(mp)
    with CBackend(mp, sanitize=sanitize) as backend:
        c_outputs = backend.invoke_many(input_sets)
    for inputs, c_set in zip(input_sets, c_outputs, strict=True):
        expected = oracle.invoke(inputs)
        for name, outputs in (("runtime_py", interpreter.invoke(inputs)), ("c", c_set)):
            for want, got in zip(expected, outputs, strict=True):
                assert difference(want, got).mismatches == 0, name


def assert_tflite_has_no_int16_kernel(model: bytes) -> None:
    """TFLite prepares the model but fails it when it runs."""
    oracle = LiteRTOracle(model)
    with pytest.raises(RuntimeError, match="got INT16"):
        oracle.invoke([np.zeros(oracle.interpreter.get_input_details()[0]["shape"], np.int16)])


# -- the tables -----------------------------------------------------------------------------


def test_sigmoid_table():
    table = sigmoid_table_uint16()
    assert table.dtype == np.uint16 and table.shape == (256,)
    assert table[0] == 32768 and table[255] == 65535  # sigmoid(0) = 1/2; saturated
    assert (np.diff(table.astype(np.int64)) >= 0).all()  # non-decreasing (flat near 1)
    # off the sampled sigmoid by half an interpolation error (under 0.7) and a rounding
    samples = 65536 / (1 + np.exp(-np.arange(255) / 24))
    assert np.abs(table[:255] - samples).max() < 1.2


def test_softmax_tables_need_no_int16_wrap():
    """The C looks up both tables in int32 without TFLite's int16 truncations: for every int16
    argument the result is the same, and within int16."""
    exp_lut, reciprocal_lut = softmax_exp_lut(), softmax_reciprocal_lut()
    assert exp_lut.shape == reciprocal_lut.shape == (513,)
    assert exp_lut[512] == reciprocal_lut[0] == 32767  # exp(0) and 1 / (1 + 0), saturated
    assert reciprocal_lut[512] == 16384  # 1 / 2
    for lut in (exp_lut, reciprocal_lut):
        v = ALL_INT16.astype(np.int64)
        base = lut.astype(np.int64)[256 + (v >> 7)]
        slope = lut.astype(np.int64)[257 + (v >> 7)] - base
        unwrapped = base + ((slope * (v & 0x7F) + 64) >> 7)
        assert (unwrapped == lut_lookup_int16(lut, v)).all()
        assert unwrapped.min() >= -32768 and unwrapped.max() <= 32767


# -- LOGISTIC, TANH -------------------------------------------------------------------------

# 2^-12 (both ops' power-of-two case), 2^-11 (TANH's only), a scale CheckedLog2 takes for 2^-12,
# the input rescale's loop at several shifts, and a coarse scale that saturates most inputs.
EXHAUSTIVE_SCALES = [2**-12, 2**-11, 2**-12 * 1.0004, 10 / 32767, 3.2e-4, 0.5]


def logistic_and_tanh_model(in_scale: float, shape: Sequence[int] = (65536,)) -> bytes:
    """LOGISTIC and TANH of one int16 input, each an output."""
    b = ModelBuilder("float32")
    x = b.input("x", shape, "int16", in_scale, 0)
    for opcode in ("LOGISTIC", "TANH"):
        y = b.tensor(opcode.lower(), shape, "int16", *OUT_2_15)
        b.op(opcode, [x], [y])
        b.output(y)
    return b.build()


@pytest.mark.parametrize("in_scale", EXHAUSTIVE_SCALES)
def test_int16_logistic_and_tanh_every_input(in_scale):
    assert_matches_on(logistic_and_tanh_model(in_scale), [[ALL_INT16]])


@pytest.mark.parametrize("in_scale", [2**-12, 10 / 32767, 1 / 3276.8])
@pytest.mark.parametrize("shape", SHAPES)
def test_int16_logistic_and_tanh_random(shape, in_scale):
    model = logistic_and_tanh_model(in_scale, shape)
    assert_matches_oracle(model)
    assert_varied(model, min_distinct=8)


def test_int16_logistic_and_tanh_clean_under_sanitizers():
    assert_matches_on(logistic_and_tanh_model(10 / 32767), [[ALL_INT16]], sanitize=True)


def _sigmoid_params(opcode: str, in_scale: float) -> Int16SigmoidParams:
    graph = parse_model(int16_model(opcode, (4,), (in_scale, 0), OUT_2_15), "<m>").main
    return REGISTRY[opcode].prepare(graph, graph.operators[0])


@pytest.mark.parametrize("opcode, in_scale, multiplier, shift", [
    ("LOGISTIC", 2**-12, 3, 0),
    ("TANH", 2**-12, 3, 0),
    ("TANH", 2**-11, 6, 0),
    ("LOGISTIC", 2**-11, 24576, 12),  # not LOGISTIC's power-of-two case: the loop
    ("LOGISTIC", 2**-12 * 1.0004, 3, 0),
    ("TANH", 10 / 32767, 30720, 13),
    ("TANH", 1.5, 18432, 0),
])
def test_int16_sigmoid_input_rescale(opcode, in_scale, multiplier, shift):
    assert _sigmoid_params(opcode, in_scale) == Int16SigmoidParams(opcode, multiplier, shift)


def test_int16_tanh_takes_an_output_scale_near_2_15():
    """TANH checks only that the output scale's log2 rounds to -15 (within CheckedLog2's
    tolerance), and computes as for 2^-15."""
    model = int16_model("TANH", (4, 64), (1 / 3276.8, 0), (1 / 32767, 0))
    assert_matches_oracle(model)
    assert_varied(model, min_distinct=8)


@pytest.mark.parametrize("opcode, output_q, reason", [
    ("LOGISTIC", (1 / 32767, 0), "output scale 1/32768"),
    ("LOGISTIC", (2**-14, 0), "output scale 1/32768"),
    ("TANH", (2**-14, 0), "output scale 2"),
    ("TANH", (1 / 30000, 0), "output scale 2"),
])
def test_int16_sigmoid_refuses_other_output_scales(opcode, output_q, reason):
    assert_refused(int16_model(opcode, (4, 8), (10 / 32767, 0), output_q), reason)


@pytest.mark.parametrize("opcode", ["LOGISTIC", "TANH"])
def test_int16_sigmoid_refuses_zero_points(opcode):
    assert_refused(int16_model(opcode, (4, 8), (10 / 32767, 3), OUT_2_15), "zero point 0")
    assert_refused(int16_model(opcode, (4, 8), (10 / 32767, 0), (2**-15, 5)), "zero point 0")


@pytest.mark.parametrize("opcode", ["LOGISTIC", "TANH"])
def test_int16_sigmoid_refuses_input_scales_that_overflow(opcode):
    """From about 5.33 the multiplier reaches 2^16 and TFLite's int32 product x * multiplier
    overflows; below about 3.8e-14 it truncates to 0 (taken for the power-of-two case)."""
    model = int16_model(opcode, (4, 8), (6.0, 0), OUT_2_15)
    assert_refused(model, "too large", tflite_refuses=False)
    model = int16_model(opcode, (4, 8), (1e-14, 0), OUT_2_15)
    assert_refused(model, "too small", tflite_refuses=False)


# -- SOFTMAX --------------------------------------------------------------------------------

# (input scale, beta): random int16 rows span 65535 steps; these put their differences from
# within [-0.2, 0] to far beyond [-10, 0], and the multiplier's left shift to where TFLite's
# int32 shift wraps (which the C's does alike).
SOFTMAX_CASES = [
    (3e-6, 1.0),
    (3e-5, 1.0),
    (1e-4, 1.0),
    (2e-4, 0.5),
    (5e-5, 2.5),
    (1 / 4096, 1.0),
    (0.01, 1000.0),
    (1e-4, -1.0),
]


@pytest.mark.parametrize("shape", [(4, 10), (2, 3, 50), (300,)])
@pytest.mark.parametrize("in_scale, beta", SOFTMAX_CASES)
def test_int16_softmax(in_scale, beta, shape):
    assert_matches_oracle(int16_model("SOFTMAX", shape, (in_scale, 0), OUT_2_15, {"beta": beta}))


@pytest.mark.parametrize("in_scale, beta", SOFTMAX_CASES[:5])
def test_int16_softmax_varies(in_scale, beta):
    model = int16_model("SOFTMAX", (8, 16), (in_scale, 0), OUT_2_15, {"beta": beta})
    assert_varied(model, min_distinct=16)


def test_int16_softmax_edges():
    """Single classes, equal rows (each 1/n), one dominant class, every value once in a row,
    and 1001 classes."""
    model = int16_model("SOFTMAX", (8, 1), (1e-4, 0), OUT_2_15, {"beta": 1.0})
    assert_matches_oracle(model)
    rows = np.stack([np.zeros(256, np.int16), np.full(256, -32768, np.int16),
                     np.where(np.arange(256) == 7, 32767, -32768).astype(np.int16),
                     ALL_INT16[::256].copy()])
    model = int16_model("SOFTMAX", (4, 256), (3e-5, 0), OUT_2_15, {"beta": 1.0})
    assert_matches_on(model, [[rows]], sanitize=True)
    model = int16_model("SOFTMAX", (2, 1001), (5e-5, 0), OUT_2_15, {"beta": 1.0})
    assert_matches_oracle(model, inputs=1)


def test_int16_softmax_takes_an_output_scale_near_1_32768():
    model = int16_model("SOFTMAX", (4, 10), (1e-4, 0), (1.0009 / 32768, 0), {"beta": 1.0})
    assert_matches_oracle(model)


@pytest.mark.parametrize("output_q, reason", [
    ((1.002 / 32768, 0), "output scale 1/32768"),
    ((1 / 65536, 0), "output scale 1/32768"),
    ((1 / 32768, 4), "zero point 0"),
])
def test_int16_softmax_refuses_other_output_quantization(output_q, reason):
    assert_refused(int16_model("SOFTMAX", (2, 10), (1e-4, 0), output_q, {"beta": 1.0}), reason)


def test_int16_softmax_refuses_input_zero_point_and_rows_whose_sum_could_overflow():
    model = int16_model("SOFTMAX", (2, 10), (1e-4, 2), OUT_2_15, {"beta": 1.0})
    assert_refused(model, "zero point 0")
    model = int16_model("SOFTMAX", (1, 65537), (1e-4, 0), OUT_2_15, {"beta": 1.0})
    assert_refused(model, "could overflow", tflite_refuses=False)


# -- PRELU: int16 input and output, int8 alpha ----------------------------------------------

# (input, alpha, output) quantizations; TFLite checks no zero point for PRELU, and uses all.
PRELU_QUANTS = [
    ((1e-3, 0), (0.01, 0), (2e-3, 0)),
    ((5e-4, 0), (0.004, -30), (3e-4, 0)),
    ((2e-4, 7), (0.02, 100), (4e-4, -5)),
]


def int16_prelu_model(shape: Sequence[int], alpha_shape: Sequence[int], constant_alpha: bool,
                      input_q: Quant, alpha_q: Quant, output_q: Quant) -> bytes:
    b = ModelBuilder("float32")
    x = b.input("x", shape, "int16", *input_q)
    if constant_alpha:
        values = np.random.default_rng(3).integers(-128, 128, alpha_shape, dtype=np.int8)
        alpha = b.const("alpha", values, *alpha_q)
    else:
        alpha = b.input("alpha", alpha_shape, "int8", *alpha_q)
    y = b.tensor("y", shape, "int16", *output_q)
    b.op("PRELU", [x, alpha], [y])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("input_q, alpha_q, output_q", PRELU_QUANTS)
@pytest.mark.parametrize("constant_alpha", [True, False])
@pytest.mark.parametrize("shape, alpha_shape", PRELU_SHAPES)
def test_int16_prelu(shape, alpha_shape, constant_alpha, input_q, alpha_q, output_q):
    model = int16_prelu_model(shape, alpha_shape, constant_alpha, input_q, alpha_q, output_q)
    assert_matches_oracle(model)


def test_int16_prelu_varies_and_is_clean_under_sanitizers():
    model = int16_prelu_model((2, 4, 4, 3), (1, 1, 3), True, *PRELU_QUANTS[1])
    assert_varied(model, min_distinct=32)
    x = np.linspace(-32768, 32767, 96).astype(np.int16).reshape(2, 4, 4, 3)
    assert_matches_on(model, [[x]], sanitize=True)


def test_int16_prelu_refuses_an_int16_alpha():
    """TFLite reads an int16 PRELU's alpha as int8 whatever its type: garbage for int16."""
    b = ModelBuilder("float32")
    x = b.input("x", (2, 4), "int16", 1e-3, 0)
    alpha = b.const("alpha", np.arange(-2, 2, dtype=np.int16), 0.01, 0)
    y = b.tensor("y", (2, 4), "int16", 1e-3, 0)
    b.op("PRELU", [x, alpha], [y])
    b.output(y)
    assert_refused(b.build(), "no kernel for int16, int16 -> int16", tflite_refuses=False)


# -- what TFLite has no int16 kernel for ----------------------------------------------------


@pytest.mark.parametrize("opcode", ["RELU_N1_TO_1", "HARD_SWISH"])
def test_int16_ops_without_a_tflite_kernel_are_refused(opcode):
    model = int16_model(opcode, (4, 8), (1e-3, 0), (1e-3, 0))
    assert_refused(model, "no kernel for int16 -> int16", tflite_refuses=False)
    assert_tflite_has_no_int16_kernel(model)
