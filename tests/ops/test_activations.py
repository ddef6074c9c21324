"""Activation ops against TFLite's reference kernels: bit-exact for int8, 1e-5 for float32.

int8 inputs are drawn over the full range; elementwise int8 ops run on 4 x 256 values per input
set, so every entry of a lookup table (and every rounding edge of a requantization) is hit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from runtime_py.kernels import KERNELS
from tests.conftest import SHARED_MODELS
from tests.opcheck import assert_matches_oracle, oracle_outputs, three_ways
from toolchain.errors import RuntimeBackendError, UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.check import difference, random_inputs
from toolchain.lab.oracle import LiteRTOracle, TFLMOracle
from toolchain.lower.plan import plan_model
from toolchain.numerics.tables import expf
from toolchain.ops import REGISTRY, prepare_graph

Quant = tuple[float, int]

INT8_SHAPE = (4, 256)
FLOAT_SHAPES = [(1, 4, 4, 3), (3, 17), (40,)]
# float inputs are standard normal; scaled by this they reach every clamp and cutoff.
FLOAT_SPREAD = 6.0
SOFTMAX_OUT: Quant = (1 / 256, -128)
L2_OUT: Quant = (1 / 128, 0)


def unary_model(
    opcode: str,
    dtype: str,
    shape: Sequence[int],
    input_q: Quant | None = None,
    output_q: Quant | None = None,
    options: dict | None = None,
    spread: float = 1.0,
) -> bytes:
    """One activation op; float inputs are first multiplied by `spread` (a MUL)."""
    b = ModelBuilder(dtype)
    x = b.input("x", shape, dtype, *(input_q or (None, None)))
    if spread != 1.0:
        factor = b.const("spread", np.float32(spread))
        scaled = b.tensor("scaled", shape, dtype)
        b.op("MUL", [x, factor], [scaled], {"fused_activation_function": "NONE"})
        x = scaled
    y = b.tensor("y", shape, dtype, *(output_q or (None, None)))
    b.op(opcode, [x], [y], options)
    b.output(y)
    return b.build()


def assert_matches_and_varies(model: bytes, min_distinct: int = 16) -> None:
    """Bit-exact with TFLite, on outputs that are far from constant, so the test can fail."""
    assert_matches_oracle(model)
    for output in oracle_outputs(model):
        assert len(np.unique(output)) >= min_distinct, "oracle output (nearly) constant"


def assert_refused(model: bytes, reason: str, tflite_refuses: bool = True) -> None:
    """We refuse the model, and so (where said) does TFLite when it prepares it."""
    with pytest.raises(UnsupportedOpError, match=reason):
        prepare_graph(parse_model(model, "<built model>").main)
    if tflite_refuses:
        with pytest.raises(RuntimeError):
            LiteRTOracle(model)


# -- RELU, RELU6, RELU_N1_TO_1, LOGISTIC, TANH, HARD_SWISH: float32 ----------------------------


@pytest.mark.parametrize("shape", FLOAT_SHAPES)
@pytest.mark.parametrize(
    "opcode", ["RELU", "RELU6", "RELU_N1_TO_1", "LOGISTIC", "TANH", "HARD_SWISH"]
)
def test_float_elementwise(opcode, shape):
    assert_matches_oracle(unary_model(opcode, "float32", shape, spread=FLOAT_SPREAD))


# -- RELU family: int8 ------------------------------------------------------------------------

# (input, output) quantizations: equal, finer and coarser output scales, shifted zero points.
RELU_QUANTS: dict[str, list[tuple[Quant, Quant]]] = {
    "RELU": [
        ((0.05, 3), (0.05, 3)),
        ((0.05, -20), (0.03, -128)),
        ((0.02, 10), (0.08, -100)),
        ((0.1, 0), (0.0235, -128)),
    ],
    "RELU6": [((0.05, 0), (6 / 255, -128)), ((0.1, -7), (0.03, -128)), ((0.02, 30), (0.01, 0))],
    "RELU_N1_TO_1": [
        ((0.02, 0), (2 / 255, 0)),
        ((0.01, -50), (0.004, 3)),
        ((0.05, 17), (0.02, -1)),
    ],
}


@pytest.mark.parametrize(
    "opcode, input_q, output_q",
    [(op, i, o) for op, quants in RELU_QUANTS.items() for i, o in quants],
)
def test_int8_relu_family(opcode, input_q, output_q):
    assert_matches_and_varies(unary_model(opcode, "int8", INT8_SHAPE, input_q, output_q))


# -- LOGISTIC, TANH: int8 lookup tables -------------------------------------------------------

INPUT_QUANTS: list[Quant] = [
    (0.05, 3),
    (1 / 32, -128),
    (0.1, 0),
    (0.0787, 100),
    (0.004, -3),
    (0.25, 20),
]


@pytest.mark.parametrize("output_zero_point", [-128, -64])
@pytest.mark.parametrize("input_q", INPUT_QUANTS)
def test_int8_logistic(input_q, output_zero_point):
    model = unary_model("LOGISTIC", "int8", INT8_SHAPE, input_q, (1 / 256, output_zero_point))
    assert_matches_and_varies(model)


@pytest.mark.parametrize("output_q", [(1 / 128, 0), (0.0095, -9)])
@pytest.mark.parametrize("input_q", INPUT_QUANTS)
def test_int8_tanh(input_q, output_q):
    assert_matches_and_varies(unary_model("TANH", "int8", INT8_SHAPE, input_q, output_q))


def test_int8_tanh_table_uses_the_c_library():
    """At input -53 these scales put glibc's tanhf (an ulp below the correctly rounded value)
    on the other side of a rounding edge than exact math; TFLite's table has glibc's entry."""
    model = unary_model(
        "TANH", "int8", INT8_SHAPE, (0.0015303671825677156, 121), (0.0027824987191706896, 11)
    )
    assert_matches_and_varies(model)


def test_int8_logistic_refuses_other_output_scale():
    model = unary_model("LOGISTIC", "int8", INT8_SHAPE, (0.05, 0), (1 / 128, -128))
    assert_refused(model, "output scale")


# -- HARD_SWISH: int8 -------------------------------------------------------------------------

# Input scales on both sides of 3/32768 * 128 / 2^15 ... ie. the "reluish" multiplier's exponent
# negative (small scales) and positive (large ones); output scales covering [-0.375, 6+].
HARD_SWISH_QUANTS: list[tuple[Quant, Quant]] = [
    ((0.05, 3), (0.03, -100)),
    ((0.002, -10), (0.001, -50)),
    ((0.004, 100), (0.002, 90)),
    ((0.1, 0), (0.06, -120)),
    ((0.5, -20), (0.4, -127)),
    ((0.02, 60), (0.013, 0)),
]


@pytest.mark.parametrize("input_q, output_q", HARD_SWISH_QUANTS)
def test_int8_hard_swish(input_q, output_q):
    assert_matches_and_varies(unary_model("HARD_SWISH", "int8", INT8_SHAPE, input_q, output_q))


def test_int8_hard_swish_refuses_tiny_output_scale():
    """The output multiplier must not left-shift: output scale above input scale / 128."""
    model = unary_model("HARD_SWISH", "int8", INT8_SHAPE, (0.5, 0), (0.001, 0))
    assert_refused(model, "output scale")


# -- ELU: LiteRT's reference resolver lacks it, so TFLite Micro is the oracle ---------------


def test_float_elu_is_expm1_below_zero_bit_for_bit():
    """expm1f(x) below zero, as TFLite Micro's reference_ops::Elu, x elsewhere, edge values
    included; exp(x) - 1, the int8 table's function, differs in the last bit on some."""
    x = np.random.default_rng(5).normal(0, 4, (8, 64)).astype(np.float32)
    x[0, :7] = [np.nan, np.inf, -np.inf, -0.0, 1e-45, -1e-45, -3.4e38]
    model = unary_model("ELU", "float32", x.shape)
    y = three_ways(model, [x], TFLMOracle(model, 1))
    negative = x < 0
    assert (y[negative] != expf(x[negative]) - np.float32(1.0)).any()


@pytest.mark.parametrize("input_q, output_q", [
    ((0.05, 3), (0.03, -100)), ((0.1, -128), (0.05, -108)), ((0.02, 100), (0.004, 20)),
    ((0.25, 0), (0.1, -118)),
])
def test_int8_elu_table(input_q, output_q):
    """int8: a table of exp(x) - 1 below zero, filled as TFLite Micro's Prepare fills it; the
    input runs over every int8 value."""
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    model = unary_model("ELU", "int8", x.shape, input_q, output_q)
    y = three_ways(model, [x], TFLMOracle(model, 1))
    assert len(np.unique(y)) >= 40


# -- LEAKY_RELU -------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.2, 0.01, 1.5, -0.3])
@pytest.mark.parametrize("shape", FLOAT_SHAPES[:2])
def test_float_leaky_relu(shape, alpha):
    assert_matches_oracle(unary_model("LEAKY_RELU", "float32", shape, options={"alpha": alpha}))


@pytest.mark.parametrize(
    "input_q, output_q",
    [((0.05, 3), (0.03, -60)), ((0.02, -40), (0.02, -40)), ((0.1, 10), (0.07, 100))],
)
@pytest.mark.parametrize("alpha", [0.2, 0.01, 0.5, 1.5, -0.5])
def test_int8_leaky_relu(alpha, input_q, output_q):
    model = unary_model("LEAKY_RELU", "int8", INT8_SHAPE, input_q, output_q, {"alpha": alpha})
    assert_matches_and_varies(model)


# -- PRELU ------------------------------------------------------------------------------------

# (input shape, alpha shape): per-channel alpha as TFLite converts it, other broadcasts, equal
# shapes (the elementwise path) up to rank 5.
PRELU_SHAPES = [
    ((1, 4, 4, 3), (3,)),
    ((1, 4, 4, 3), (1, 1, 3)),
    ((2, 4, 4, 3), (4, 4, 3)),
    ((3, 5), (3, 1)),
    ((2, 6), (2, 6)),
    ((1, 2, 3, 2, 4), (1, 2, 3, 2, 4)),
]


def prelu_model(
    dtype: str,
    shape: Sequence[int],
    alpha_shape: Sequence[int],
    constant_alpha: bool = True,
    input_q: Quant | None = None,
    alpha_q: Quant | None = None,
    output_q: Quant | None = None,
) -> bytes:
    rng = np.random.default_rng(7)
    b = ModelBuilder(dtype)
    x = b.input("x", shape, dtype, *(input_q or (None, None)))
    if not constant_alpha:
        alpha = b.input("alpha", alpha_shape, dtype, *(alpha_q or (None, None)))
    elif dtype == "float32":
        alpha = b.const("alpha", rng.uniform(-0.5, 1.0, alpha_shape).astype(np.float32))
    else:
        alpha = b.const("alpha", rng.integers(-128, 128, alpha_shape, dtype=np.int8), *alpha_q)
    y = b.tensor("y", shape, dtype, *(output_q or (None, None)))
    b.op("PRELU", [x, alpha], [y])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("constant_alpha", [True, False])
@pytest.mark.parametrize("shape, alpha_shape", PRELU_SHAPES)
def test_float_prelu(shape, alpha_shape, constant_alpha):
    assert_matches_oracle(prelu_model("float32", shape, alpha_shape, constant_alpha))


@pytest.mark.parametrize(
    "input_q, alpha_q, output_q",
    [
        ((0.05, 3), (0.004, -30), (0.03, -60)),
        ((0.1, -20), (0.01, 0), (0.08, 10)),
        ((0.02, 50), (0.02, 100), (0.05, -128)),
    ],
)
@pytest.mark.parametrize("constant_alpha", [True, False])
@pytest.mark.parametrize("shape, alpha_shape", PRELU_SHAPES)
def test_int8_prelu(shape, alpha_shape, constant_alpha, input_q, alpha_q, output_q):
    model = prelu_model("int8", shape, alpha_shape, constant_alpha, input_q, alpha_q, output_q)
    assert_matches_and_varies(model, min_distinct=min(16, int(np.prod(shape)) // 4))


def test_prelu_refuses_alpha_beyond_the_input():
    model = prelu_model("float32", (4, 3), (2, 4, 3))
    assert_refused(model, "broadcasts beyond the input")


def test_prelu_refuses_per_channel_alpha():
    b = ModelBuilder("int8")
    x = b.input("x", (1, 2, 2, 3), "int8", 0.05, 0)
    alpha = b.const("alpha", np.ones(3, np.int8), [0.01, 0.02, 0.03], [0, 0, 0])
    y = b.tensor("y", (1, 2, 2, 3), "int8", 0.05, 0)
    b.op("PRELU", [x, alpha], [y])
    b.output(y)
    assert_refused(b.build(), "per-tensor quantization", tflite_refuses=False)


# -- SOFTMAX ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, beta",
    [((1, 10), 1.0), ((2, 3, 7), 1.0), ((5,), 1.0), ((1, 1000), 1.0), ((4, 9), 0.5), ((4, 9), 2.5)],
)
def test_float_softmax(shape, beta):
    model = unary_model("SOFTMAX", "float32", shape, options={"beta": beta}, spread=3.0)
    assert_matches_oracle(model)


@pytest.mark.parametrize("shape, spread", [((1, 10), 3.0), ((2, 3, 7), 1.0), ((5,), 40.0),
                                           ((1, 1000), 3.0), ((4, 9), 0.01)])
def test_float_log_softmax(shape, spread):
    """x - max - log(sum of exp(x - max)), every step in float32 as TFLite's reference; in place
    when the input dies there (sanitized C)."""
    model = unary_model("LOG_SOFTMAX", "float32", shape, spread=spread)
    assert_matches_oracle(model, sanitize=True)
    out = oracle_outputs(model)[0]
    assert np.unique(out).size > 1 and (out <= 0).all()


@pytest.mark.parametrize("shape, input_q, varied", [
    ((1, 10), (0.1, 3), True), ((2, 3, 7), (0.05, -20), True), ((4, 30), (0.3, 0), True),
    ((1, 300), (0.02, -128), True), ((2, 9), (0.004, 7), True),
    ((3, 12), (1.0, 10), False),  # differences past the bound: -128 but for each row's max
])
def test_int8_log_softmax(shape, input_q, varied):
    """TFLite's fixed-point LogSoftmax: exp in Q5.26, the sum in Q12.19, its log in Q5.26."""
    model = unary_model("LOG_SOFTMAX", "int8", shape, input_q=input_q,
                        output_q=(16 / 256, 127))
    if varied:
        assert_matches_and_varies(model, min_distinct=5)
    assert_matches_oracle(model, sanitize=True)


def test_int8_log_softmax_needs_tflites_output_quantization():
    from tests.opcheck import refusal

    model = unary_model("LOG_SOFTMAX", "int8", (2, 5), input_q=(0.1, 0), output_q=(1 / 256, -128))
    assert "not (16/256, 127) as TFLite requires" in refusal(model)


# (input quantization, beta): beta * scale from tiny to above the multiplier's cap of 2^31 - 1
# (scaled by 2^26), so diff_min ranges from -255 (everything counts) to -1.
SOFTMAX_INT8_CASES = [
    ((0.02, 3), 1.0),
    ((0.05, -128), 1.0),
    ((0.1, 0), 1.0),
    ((1 / 16, 0), 1.0),
    ((0.004, -20), 1.0),
    ((0.25, 10), 0.3),
    ((0.02, 0), 0.05),
    ((0.0078125, 5), 5.0),
    ((1.0, 0), 100.0),
]


@pytest.mark.parametrize("shape", [(4, 10), (2, 3, 50), (300,)])
@pytest.mark.parametrize("input_q, beta", SOFTMAX_INT8_CASES)
def test_int8_softmax(input_q, beta, shape):
    model = unary_model("SOFTMAX", "int8", shape, input_q, SOFTMAX_OUT, {"beta": beta})
    assert_matches_oracle(model)


@pytest.mark.parametrize("input_q, beta", [((0.02, 3), 1.0), ((0.1, 0), 1.0), ((0.25, 10), 0.3)])
def test_int8_softmax_many_classes(input_q, beta):
    """1001 classes, at scales whose random rows sum their exponentials below 512."""
    model = unary_model("SOFTMAX", "int8", (2, 1001), input_q, SOFTMAX_OUT, {"beta": beta})
    assert_matches_oracle(model)


def test_int8_softmax_varies():
    model = unary_model("SOFTMAX", "int8", (32, 6), (0.03, 0), SOFTMAX_OUT, {"beta": 1.0})
    assert_matches_and_varies(model)


def test_int8_softmax_single_class():
    model = unary_model("SOFTMAX", "int8", (8, 1), (0.1, 0), SOFTMAX_OUT, {"beta": 1.0})
    assert_matches_oracle(model)


def test_int8_softmax_fails_where_tflite_aborts():
    """512 equal logits sum to 512, which TFLite's reference kernel aborts on (511 it runs;
    checked by hand, as an abort would end the test run)."""
    model = unary_model("SOFTMAX", "int8", (1, 512), (0.1, 0), SOFTMAX_OUT, {"beta": 1.0})
    interpreter = ArenaInterpreter(plan_model(parse_model(model, "<built model>"), "greedy"))
    with pytest.raises(RuntimeBackendError, match="sum to 512"):
        interpreter.invoke([np.zeros((1, 512), np.int8)])


@pytest.mark.parametrize("output_q", [(1 / 256, 0), (1 / 128, -128)])
def test_int8_softmax_refuses_other_output_quantization(output_q):
    model = unary_model("SOFTMAX", "int8", (2, 10), (0.1, 0), output_q, {"beta": 1.0})
    assert_refused(model, "scale 1/256 and zero point -128")


# -- L2_NORMALIZATION -------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 8), (2, 3, 5), (2, 2, 2, 16), (3, 1)])
def test_float_l2_normalization(shape):
    assert_matches_oracle(unary_model("L2_NORMALIZATION", "float32", shape))


@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 5), (2, 2, 2, 16), (16, 1), (8, 2), (1, 1000)])
@pytest.mark.parametrize("input_q", [(0.05, 0), (0.1, -7), (1.0, 127), (0.003, -128)])
def test_int8_l2_normalization(input_q, shape):
    """Depths 1 and 2 reach sums of squares <= 1, which TFLite special-cases."""
    assert_matches_oracle(unary_model("L2_NORMALIZATION", "int8", shape, input_q, L2_OUT))


def test_int8_l2_normalization_varies():
    model = unary_model("L2_NORMALIZATION", "int8", (4, 16), (0.05, 0), L2_OUT)
    assert_matches_and_varies(model)


@pytest.mark.parametrize("output_q", [(1 / 256, 0), (1 / 128, 5)])
def test_int8_l2_normalization_refuses_other_output_quantization(output_q):
    model = unary_model("L2_NORMALIZATION", "int8", (2, 8), (0.05, 0), output_q)
    assert_refused(model, "scale 1/128 and zero point 0")


def test_l2_normalization_refuses_fused_activation():
    model = unary_model(
        "L2_NORMALIZATION", "float32", (2, 8), options={"fused_activation_function": "RELU"}
    )
    assert_refused(model, "fused activation")


# -- real models: their final int8 SOFTMAX on TFLite's own input tensors ----------------------

SOFTMAX_MODELS = (
    "kws_ref_model",
    "micro_speech_quantized",
    "vww_96_int8",
    "pretrainedResnet_quant",
)


@pytest.mark.parametrize("name", SOFTMAX_MODELS)
def test_real_model_softmax_on_oracle_tensors(name):
    path = SHARED_MODELS / f"{name}.tflite"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    model = path.read_bytes()
    graph = parse_model(model, str(path)).main
    softmaxes = [op for op in graph.operators if op.opcode == "SOFTMAX"]
    assert softmaxes and all(graph.tensors[op.inputs[0]].dtype == "int8" for op in softmaxes)
    oracle = LiteRTOracle(model, preserve_all_tensors=True)
    for seed in range(3):
        oracle.invoke(random_inputs(graph, seed))
        for op in softmaxes:
            params = REGISTRY["SOFTMAX"].prepare(graph, op)
            expected = oracle.tensor(op.outputs[0])
            actual = np.zeros_like(expected)
            KERNELS["SOFTMAX"](params, [oracle.tensor(op.inputs[0])], [actual])
            assert difference(expected, actual).mismatches == 0, f"{name} op {op.index}"


# -- legacy uint8: the int8 kernels in [0, 255] -----------------------------------------------


def uint8_model(opcode: str, shape: Sequence[int], input_q: Quant, output_q: Quant,
                options: dict | None = None, dtype: str = "uint8") -> bytes:
    b = ModelBuilder("float32")
    x = b.input("x", shape, dtype, *input_q)
    y = b.tensor("y", shape, dtype, *output_q)
    b.op(opcode, [x], [y], options)
    b.output(y)
    return b.build()


def shifted(q: Quant) -> Quant:
    """An int8 quantization moved to uint8: the same scale, the zero point 128 higher."""
    return q[0], q[1] + 128


@pytest.mark.parametrize(
    "opcode, input_q, output_q",
    [(op, i, o) for op, quants in RELU_QUANTS.items() for i, o in quants],
)
def test_uint8_relu_family(opcode, input_q, output_q):
    model = uint8_model(opcode, INT8_SHAPE, shifted(input_q), shifted(output_q))
    assert_matches_and_varies(model)


@pytest.mark.parametrize("output_zero_point", [0, 64])
@pytest.mark.parametrize("input_q", INPUT_QUANTS[:4])
def test_uint8_logistic(input_q, output_zero_point):
    model = uint8_model("LOGISTIC", INT8_SHAPE, shifted(input_q), (1 / 256, output_zero_point))
    assert_matches_and_varies(model)


@pytest.mark.parametrize("output_q", [(1 / 128, 128), (0.0095, 119)])
@pytest.mark.parametrize("input_q", INPUT_QUANTS[:4])
def test_uint8_tanh(input_q, output_q):
    assert_matches_and_varies(uint8_model("TANH", INT8_SHAPE, shifted(input_q), output_q))


@pytest.mark.parametrize("shape", [(4, 10), (2, 3, 50)])
@pytest.mark.parametrize("input_q, beta", SOFTMAX_INT8_CASES[:5])
def test_uint8_softmax(input_q, beta, shape):
    model = uint8_model("SOFTMAX", shape, shifted(input_q), (1 / 256, 0), {"beta": beta})
    assert_matches_and_varies(model, min_distinct=4)


def test_uint8_softmax_writes_1_256_and_0_whatever_the_output_says():
    """LiteRT ignores a uint8 output's quantization here: so do we, rather than refuse."""
    model = uint8_model("SOFTMAX", (4, 10), (0.05, 128), (0.01, 7), {"beta": 1.0})
    assert_matches_and_varies(model, min_distinct=4)


# -- int16 (16x8): zero points 0, the int8 requantization in the int16 range ------------------

INT16_RELU_QUANTS = [((0.0005, 0), (0.0005, 0)), ((0.0005, 0), (0.0003, 0)),
                     ((0.0002, 0), (0.0009, 0)), ((1 / 4096, 0), (6 / 32767, 0))]


@pytest.mark.parametrize("input_q, output_q", INT16_RELU_QUANTS)
@pytest.mark.parametrize("opcode", ["RELU", "RELU6"])
def test_int16_relu(opcode, input_q, output_q):
    model = uint8_model(opcode, INT8_SHAPE, input_q, output_q, dtype="int16")
    assert_matches_and_varies(model, min_distinct=64)


@pytest.mark.parametrize("alpha", [0.1, 0.3, 1.7])
@pytest.mark.parametrize("input_q, output_q", INT16_RELU_QUANTS[:3])
def test_int16_leaky_relu(alpha, input_q, output_q):
    model = uint8_model("LEAKY_RELU", INT8_SHAPE, input_q, output_q, {"alpha": alpha}, "int16")
    assert_matches_and_varies(model, min_distinct=64)


def test_int16_relu_n1_to_1_and_zero_points_are_refused():
    """TFLite fails these when it runs them (RELU_N1_TO_1 has no int16 kernel) or prepares them
    (16x8 tensors need zero point 0)."""
    refused = uint8_model("RELU_N1_TO_1", INT8_SHAPE, (0.0005, 0), (0.0005, 0), dtype="int16")
    assert_refused(refused, "no kernel for int16 -> int16", tflite_refuses=False)
    assert_refused(uint8_model("RELU", INT8_SHAPE, (0.0005, 3), (0.0005, 0), dtype="int16"),
                   "zero point 0", tflite_refuses=False)


@pytest.mark.parametrize("shape", [(4, 10), (2, 3, 50)])
@pytest.mark.parametrize("input_q, beta", SOFTMAX_INT8_CASES[:5])
def test_int8_to_int16_softmax(input_q, beta, shape):
    """int8 in, int16 out: the int8 pipeline with 16 output bits; LiteRT ignores the int16
    output's quantization (it writes 1/65536 and -32768), and so do we."""
    b = ModelBuilder("float32")
    x = b.input("x", shape, "int8", *input_q)
    y = b.tensor("y", shape, "int16", 1 / 32768, 0)
    b.op("SOFTMAX", [x], [y], {"beta": beta})
    b.output(y)
    assert_matches_and_varies(b.build(), min_distinct=4)
