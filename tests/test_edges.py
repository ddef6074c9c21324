"""The backends agree on every edge: zero divisors, NaN and infinities in float ops, saturating
conversions. runtime_py and the compiled C are compared element for element (NaN where NaN,
every other value equal, integers exact), and with LiteRT's reference kernels wherever LiteRT
runs the model.

Where TFLite defines the result, both follow it: MAXIMUM/MINIMUM select (a NaN first operand
yields the second), max pooling and REDUCE_MAX start from the lowest finite float and let only
a greater element win (NaN never does), float sums add in order from 0.0, fused activations and
unbounded clamps stop at +-FLT_MAX, QUANTIZE converts out-of-range and NaN quotients as x86
does (INT32_MIN, then the clamp), CAST saturates and sends NaN to the highest value. Where
LiteRT refuses (int32 DIV by zero) or would crash (INT32_MIN / -1), both backends give 0 and
INT32_MIN.
"""

from __future__ import annotations

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import plan_model

FLOAT_MAX = float(np.finfo(np.float32).max)
FLOAT_EDGES = np.array(
    [0.0, -0.0, 1.5, -2.5, 7.0, -7.0, 1e30, -1e30, FLOAT_MAX, -FLOAT_MAX, 1e-45, -1e-45,
     np.inf, -np.inf, np.nan, -np.nan],
    np.float32,
)
INT32_EDGES = np.array([0, 1, -1, 2, -7, 3, 2**31 - 1, -(2**31)], np.int32)


def every_pair(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.repeat(values, len(values)), np.tile(values, len(values))


def assert_same(expected: np.ndarray, actual: np.ndarray, what: str) -> None:
    """NaN exactly where expected has NaN, every other element equal; dtype and shape too."""
    assert expected.dtype == actual.dtype and expected.shape == actual.shape, what
    if expected.dtype.kind == "f":
        nan = np.isnan(expected)
        np.testing.assert_array_equal(nan, np.isnan(actual), err_msg=f"{what}: NaN positions")
        np.testing.assert_array_equal(expected[~nan], actual[~nan], err_msg=what)
    else:
        np.testing.assert_array_equal(expected, actual, err_msg=what)


def backend_outputs(model_bytes: bytes, inputs: list[np.ndarray]) -> dict[str, list[np.ndarray]]:
    """runtime_py's and the compiled C's outputs on one input set."""
    mp = plan_model(parse_model(model_bytes, "<edge model>"), "greedy")
    with CBackend(mp) as c:
        (compiled,) = c.invoke_many([inputs])
    return {"runtime_py": ArenaInterpreter(mp).invoke(inputs), "c": compiled}


def assert_backends_agree(model_bytes: bytes, inputs: list[np.ndarray], litert: bool) -> None:
    """The C (and LiteRT, where it runs the model) against runtime_py, output by output."""
    graph = parse_model(model_bytes).main
    names = [graph.tensors[t].name for t in graph.outputs]
    outputs = backend_outputs(model_bytes, inputs)
    if litert:
        outputs["litert"] = LiteRTOracle(model_bytes).invoke(inputs)
    reference = outputs.pop("runtime_py")
    for backend, values in outputs.items():
        for name, expected, actual in zip(names, reference, values, strict=True):
            assert_same(expected, actual, f"{name}: runtime_py vs {backend}")


class Ops:
    """A model of independent ops on shared inputs, each op's output a model output."""

    def __init__(self) -> None:
        self.builder = ModelBuilder("float32")
        self.count = 0

    def input(self, name: str, shape: tuple[int, ...], dtype: str) -> int:
        return self.builder.input(name, shape, dtype)

    def const(self, array: np.ndarray) -> int:
        self.count += 1
        return self.builder.const(f"c{self.count}", array)

    def op(self, opcode: str, inputs: list[int], shape: tuple[int, ...], dtype: str = "float32",
           options: dict | None = None, quantization: tuple = (None, None)) -> None:
        self.count += 1
        out = self.builder.tensor(f"{opcode.lower()}{self.count}", shape, dtype, *quantization)
        self.builder.op(opcode, inputs, [out], options)
        self.builder.output(out)

    def build(self) -> bytes:
        return self.builder.build()


def test_float_activations_and_conversions_of_nan_and_infinities():
    """RELU-style clamps keep NaN (both `x < lo ? lo : x` and np.clip), LOGISTIC, TANH,
    HARD_SWISH and LEAKY_RELU follow IEEE; QUANTIZE and CAST saturate as TFLite does."""
    n = FLOAT_EDGES.shape
    ops = Ops()
    x = ops.input("x", n, "float32")
    for opcode in ("RELU", "RELU6", "RELU_N1_TO_1", "LOGISTIC", "TANH", "HARD_SWISH"):
        ops.op(opcode, [x], n)
    ops.op("LEAKY_RELU", [x], n, options={"alpha": 0.2})
    ops.op("QUANTIZE", [x], n, "int8", quantization=(0.05, 3))
    ops.op("QUANTIZE", [x], n, "int8", quantization=(1e-30, -5))  # every finite quotient is huge
    ops.op("QUANTIZE", [x], n, "int16", quantization=(1e-3, 0))
    for dtype in ("int8", "uint8", "int16", "int32", "bool"):
        ops.op("CAST", [x], n, dtype)
    assert_backends_agree(ops.build(), [FLOAT_EDGES], litert=True)


@pytest.mark.parametrize("activation", [None, "RELU", "RELU6"])
def test_float_binary_ops_on_every_pair_of_edges(activation):
    """IEEE division by zero (inf, -inf, NaN), MAXIMUM/MINIMUM as TFLite's select (a NaN in the
    first operand yields the second), overflow to infinity clamped to +-FLT_MAX."""
    a, b = every_pair(FLOAT_EDGES)
    ops = Ops()
    operands = [ops.input("a", a.shape, "float32"), ops.input("b", b.shape, "float32")]
    for opcode in ("ADD", "SUB", "MUL", "DIV"):
        options = {"fused_activation_function": activation} if activation else None
        ops.op(opcode, operands, a.shape, options=options)
    if activation is None:
        for opcode in ("MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE"):
            ops.op(opcode, operands, a.shape)
    assert_backends_agree(ops.build(), [a, b], litert=True)


def int32_ops_model(opcodes: tuple[str, ...], shape: tuple[int, ...]) -> bytes:
    ops = Ops()
    operands = [ops.input("a", shape, "int32"), ops.input("b", shape, "int32")]
    for opcode in opcodes:
        ops.op(opcode, operands, shape, "int32")
    return ops.build()


def test_int32_division_by_zero_gives_zero_in_both_backends():
    """LiteRT refuses to run DIV on a zero divisor; a C kernel cannot refuse mid-inference, so
    runtime_py and the C agree on x / 0 = 0 (and INT32_MIN / -1 wraps to INT32_MIN, which
    would crash LiteRT's process)."""
    a, b = every_pair(INT32_EDGES)
    outputs = backend_outputs(int32_ops_model(("DIV",), a.shape), [a, b])
    (quotient,) = outputs["runtime_py"]
    assert_same(quotient, outputs["c"][0], "DIV: runtime_py vs c")
    assert np.all(quotient[b == 0] == 0)
    wraps = (a == -(2**31)) & (b == -1)
    assert quotient[wraps].tolist() == [-(2**31)]
    exact = (b != 0) & ~wraps
    expected = np.fix(a[exact].astype(np.float64) / b[exact]).astype(np.int32)
    np.testing.assert_array_equal(quotient[exact], expected)


def test_litert_refuses_an_int32_zero_divisor():
    """The case the backends had to decide alone: TFLite's DIV fails instead of computing."""
    oracle = LiteRTOracle(int32_ops_model(("DIV",), (2,)))
    with pytest.raises(RuntimeError, match="DIV"):
        oracle.invoke([np.array([5, 6], np.int32), np.array([1, 0], np.int32)])


def test_int32_wrapping_ops_on_extremes():
    """int32 ADD, SUB, MUL and SQUARED_DIFFERENCE wrap, MAXIMUM/MINIMUM are exact."""
    a, b = every_pair(INT32_EDGES)
    opcodes = ("ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE")
    assert_backends_agree(int32_ops_model(opcodes, a.shape), [a, b], litert=True)


def test_int_casts_narrow_modulo():
    ops = Ops()
    x = ops.input("x", INT32_EDGES.shape, "int32")
    for dtype in ("int8", "uint8", "int16", "float32", "bool"):
        ops.op("CAST", [x], INT32_EDGES.shape, dtype)
    assert_backends_agree(ops.build(), [INT32_EDGES], litert=True)


# 2x2 windows of 4x4 inputs: all NaN, all -inf, NaN among finite values, +inf among NaN and
# -inf; and windows whose float sums cancel only when added in order, or overflow.
POOL_INPUTS = [
    np.array([[np.nan, np.nan, -np.inf, -np.inf],
              [np.nan, np.nan, -np.inf, -np.inf],
              [np.nan, 1.0, np.inf, np.nan],
              [2.0, np.nan, -np.inf, 3.0]], np.float32),
    np.array([[0.0, -0.0, 1.5, -2.5],
              [7.0, -7.0, 1e30, -1e30],
              [FLOAT_MAX, -FLOAT_MAX, np.inf, -np.inf],
              [FLOAT_MAX, FLOAT_MAX, 0.5, -0.5]], np.float32),
]


@pytest.mark.parametrize("activation", ["NONE", "RELU"])
@pytest.mark.parametrize("values", POOL_INPUTS, ids=["nan-windows", "cancelling-sums"])
def test_pooling_of_nan_and_infinities(values, activation):
    ops = Ops()
    x = ops.input("x", (1, 4, 4, 1), "float32")
    options = {"padding": "VALID", "stride_w": 2, "stride_h": 2, "filter_width": 2,
               "filter_height": 2, "fused_activation_function": activation}
    for opcode in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
        ops.op(opcode, [x], (1, 2, 2, 1), options=options)
    assert_backends_agree(ops.build(), [values.reshape(1, 4, 4, 1)], litert=True)


def test_reductions_of_nan_and_infinities():
    """REDUCE_MAX/MIN skip NaN and start from the finite extremes, ARG_MAX/MIN keep the first
    index unless strictly beaten, SUM and MEAN add in order (3e38 + 3e38 - 3e38 - 3e38 is
    +inf, not the NaN of a pairwise sum)."""
    rows = np.concatenate([*POOL_INPUTS, np.array([[3e38, 3e38, -3e38, -3e38]], np.float32)])
    ops = Ops()
    x, axis = ops.input("x", rows.shape, "float32"), ops.const(np.array([1], np.int32))
    for opcode in ("REDUCE_MAX", "REDUCE_MIN", "SUM", "MEAN"):
        ops.op(opcode, [x, axis], rows.shape[:1], options={"keep_dims": False})
    for opcode in ("ARG_MAX", "ARG_MIN"):
        ops.op(opcode, [x, axis], rows.shape[:1], "int32", options={"output_type": "INT32"})
    assert_backends_agree(ops.build(), [rows], litert=True)


def test_softmax_and_l2_normalization_of_nan_and_infinities():
    rows = np.array([[-np.inf] * 4, [-np.inf, 0.0, 1.0, 2.0], [np.inf, 0.0, 1.0, 2.0],
                     [np.nan, 0.0, 1.0, 2.0], [0.0, np.nan, 1.0, 2.0], [1e38, -1e38, 0.0, 1.0],
                     [3e38, 3e38, 1.0, 1.0], [1e-30, 1e-30, 0.0, 0.0]], np.float32)
    ops = Ops()
    x = ops.input("x", rows.shape, "float32")
    ops.op("SOFTMAX", [x], rows.shape, options={"beta": 1.0})
    ops.op("L2_NORMALIZATION", [x], rows.shape)
    assert_backends_agree(ops.build(), [rows], litert=True)


def test_fully_connected_and_convolutions_of_nan_and_infinities():
    """Dot products over infinities and NaN: an infinity times zero is NaN, +inf meeting -inf
    is NaN, an infinite sum is clamped to +-FLT_MAX. (Finite sums that overflow depend on the
    order of addition, which vectorized C and TFLite do not share: not an edge tested here.)"""
    rows = np.array([[np.inf, 1.0, 2.0, 0.0], [-np.inf, 1.0, np.inf, 2.0],
                     [np.nan, 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]], np.float32)
    image = rows.reshape(1, 4, 4, 1)
    ops = Ops()
    x, picture = ops.input("x", rows.shape, "float32"), ops.input("image", image.shape, "float32")
    weights = np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0], [-1.0, 0.5, 2.0, 0.0]],
                       np.float32)
    ops.op("FULLY_CONNECTED", [x, ops.const(weights), -1], (4, 3))
    kernel = ops.const(np.array([[1.0, 0.0], [0.5, -1.0]], np.float32).reshape(1, 2, 2, 1))
    bias = ops.const(np.zeros(1, np.float32))
    window = {"padding": "SAME", "stride_w": 1, "stride_h": 1}
    ops.op("CONV_2D", [picture, kernel, bias], image.shape, options=window)
    ops.op("DEPTHWISE_CONV_2D", [picture, kernel, bias], image.shape,
           options={**window, "depth_multiplier": 1})
    assert_backends_agree(ops.build(), [rows, image], litert=True)
