"""Elementwise binary ops (ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, SQUARED_DIFFERENCE) against
TFLite's reference kernels: bit-exact for int8 and int32, 1e-5 relative for float32."""

from __future__ import annotations

import numpy as np
import pytest

from runtime_py.kernels import KERNELS
from tests.conftest import SHARED_MODELS, needs_shared_models
from tests.opcheck import assert_matches_oracle, assert_varied, oracle_outputs, three_ways
from toolchain.errors import UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.check import random_inputs
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import plan_model
from toolchain.ops import prepare_graph
from toolchain.ops.elementwise.prepare import prepare

OPS = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "FLOOR_DIV",
       "FLOOR_MOD")
ACTIVATION_OPS = ("ADD", "SUB", "MUL", "DIV")
INT8_OPS = ("ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE")

# (input1 shape, input2 shape): equal shapes, scalars, one-sided and two-sided broadcasts, up to
# rank 6 with broadcast dimensions alternating so that none can be merged away.
SHAPES = [
    ((2, 3, 4), (2, 3, 4)),
    ((1, 4, 4, 3), (3,)),
    ((5,), ()),
    ((), (2, 3)),
    ((2, 1, 3), (1, 4, 1)),
    ((1, 3), (2, 1, 1, 3)),
    ((2, 1, 3, 1, 2), (1, 4, 1, 3, 1)),
    ((2, 1, 2, 1, 2, 1), (1, 2, 1, 2, 1, 3)),
]

Quant = tuple[float, int]
# int8 (scale, zero point) of input1, input2 and output per op: the output covers the result of
# full-range inputs, so few outputs saturate.
INT8_QUANT: dict[str, tuple[Quant, Quant, Quant]] = {
    "ADD": ((0.05, -3), (0.02, 10), (0.07, 2)),
    "SUB": ((0.05, -3), (0.02, 10), (0.07, 2)),
    "MUL": ((0.05, -3), (0.02, 10), (0.1, 0)),
    "SQUARED_DIFFERENCE": ((0.05, -3), (0.02, 10), (0.3, -128)),
    "MAXIMUM": ((0.05, -3), (0.05, -3), (0.05, -3)),
    "MINIMUM": ((0.05, -3), (0.05, -3), (0.05, -3)),
}
# Output quantization per fused activation, covering the activation's range.
ACTIVATION_OUTPUT: dict[str, Quant] = {
    "RELU": (0.04, -128),
    "RELU6": (0.03, -128),
    "RELU_N1_TO_1": (0.01, 0),
}


def binary_model(
    opcode: str,
    dtype: str,
    shape1: tuple,
    shape2: tuple,
    activation: str | None = None,
    quant: tuple[Quant, Quant, Quant] | None = None,
    input2: np.ndarray | None = None,
) -> bytes:
    """One binary op; input2 is a model input unless given as a constant."""
    builder = ModelBuilder(dtype="int8" if dtype == "int8" else "float32")
    q1, q2, q_out = quant or ((None, None),) * 3
    a = builder.input("a", shape1, dtype, *q1)
    b = (
        builder.input("b", shape2, dtype, *q2)
        if input2 is None
        else builder.const("b", input2, *q2)
    )
    out = builder.tensor("out", np.broadcast_shapes(shape1, shape2), dtype, *q_out)
    options = {"fused_activation_function": activation} if activation else None
    builder.op(opcode, [a, b], [out], options, version=2 if dtype == "int8" else 1)
    builder.output(out)
    return builder.build()


def nonzero_divisor(shape: tuple) -> np.ndarray:
    """int32 divisors for DIV (TFLite refuses zero), a constant since inputs span all of int32."""
    rng = np.random.default_rng(1)
    return (rng.integers(1, 1000, shape) * rng.choice([-1, 1], shape)).astype(np.int32)


def plain_model(
    opcode: str, dtype: str, shape1: tuple, shape2: tuple, activation: str | None = None
) -> bytes:
    divides = opcode in ("DIV", "FLOOR_DIV", "FLOOR_MOD") and dtype == "int32"
    divisor = nonzero_divisor(shape2) if divides else None
    return binary_model(opcode, dtype, shape1, shape2, activation, input2=divisor)


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("opcode", OPS)
def test_float_and_int32_broadcasting(opcode, dtype, shapes):
    assert_matches_oracle(plain_model(opcode, dtype, *shapes))


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("opcode", INT8_OPS)
def test_int8_broadcasting(opcode, shapes):
    assert_matches_oracle(binary_model(opcode, "int8", *shapes, quant=INT8_QUANT[opcode]))


ACTIVATION_CASES = [
    (op, dtype)
    for op in ACTIVATION_OPS
    for dtype in ("float32", "int32", "int8")
    if (op, dtype) != ("DIV", "int8")
]


@pytest.mark.parametrize("activation", ["RELU", "RELU6", "RELU_N1_TO_1"])
@pytest.mark.parametrize("opcode,dtype", ACTIVATION_CASES)
def test_fused_activations(opcode, dtype, activation):
    shapes = ((2, 3, 4), (3, 1))
    if dtype == "int8":
        q1, q2, _ = INT8_QUANT[opcode]
        quant = (q1, q2, ACTIVATION_OUTPUT[activation])
        assert_matches_oracle(binary_model(opcode, dtype, *shapes, activation, quant))
    else:
        assert_matches_oracle(plain_model(opcode, dtype, *shapes, activation))


# Scale relations that change the rescaling pipeline: which input has the larger scale, equal
# scales, extreme zero points, an output scale finer than the inputs'.
RESCALINGS = [
    ((0.01, 20), (0.08, -50), (0.1, 5)),
    ((0.1, 0), (0.1, 0), (0.2, -1)),
    ((0.003, 127), (0.25, -128), (0.3, 0)),
    ((0.05, -128), (0.04, 127), (0.02, 0)),
]


@pytest.mark.parametrize("quant", RESCALINGS, ids=str)
@pytest.mark.parametrize("opcode", ["ADD", "SUB"])
def test_int8_add_sub_rescaling(opcode, quant):
    assert_matches_oracle(binary_model(opcode, "int8", (3, 8), (1, 8), quant=quant))


@pytest.mark.parametrize("opcode", ["ADD", "SUB"])
def test_int8_add_sub_multipliers_are_computed_in_double(opcode):
    """add.cc and sub.cc divide the float scales in double; computed in float, these scales'
    multipliers are an ulp off, which moves about 1% of the results by one."""
    quant = ((0.092, 0), (0.036, 0), (0.136, 0))
    assert_matches_oracle(binary_model(opcode, "int8", (64, 64), (64, 64), quant=quant))


@pytest.mark.parametrize(
    "quant",
    [
        ((0.05, -3), (0.02, 10), (0.1, 0)),
        ((0.02, 0), (0.03, 5), (0.0005, -7)),  # multiplier above 1: a left shift
        ((0.2, 127), (0.007, -128), (0.5, 30)),
    ],
    ids=str,
)
def test_int8_mul_rescaling(quant):
    assert_matches_oracle(binary_model("MUL", "int8", (3, 8), (3, 1), quant=quant))


def test_int8_mul_multiplier_is_computed_in_float():
    """in1_scale * in2_scale / out_scale is float arithmetic in mul.cc: here it gives exactly 0.5
    where double gives a hair less, so products with a half in them round differently."""
    out_scale = float(np.float32(2 * float(np.float32(0.05)) * float(np.float32(0.02))))
    quant = ((0.05, 0), (0.02, 0), (out_scale, 0))
    assert_matches_oracle(binary_model("MUL", "int8", (64, 64), (64, 64), quant=quant))


def test_int8_sub_subtracts_the_rescaled_inputs():
    """The reference SUB subtracts input2 after rescaling it; older TFLite instead ran ADD with
    input2's multiplier negated, which rounds exact halves the other way. These scales make
    such halves."""
    quant = ((2.0, 0), ((2**20 + 1) / 2**20, 0), (2.0, 0))
    assert_matches_oracle(binary_model("SUB", "int8", (64, 64), (64, 64), quant=quant))


@pytest.mark.parametrize(
    "quant",
    [
        ((0.05, -3), (0.02, 10), (0.3, -128)),
        ((0.1, 0), (0.1, 0), (0.5, -100)),
        ((0.01, 100), (0.06, -100), (0.02, -128)),
    ],
    ids=str,
)
def test_int8_squared_difference_rescaling(quant):
    assert_matches_oracle(binary_model("SQUARED_DIFFERENCE", "int8", (3, 8), (8,), quant=quant))


def test_int8_add_with_constant_operand():
    bias = np.random.default_rng(3).integers(-128, 128, (1, 1, 4)).astype(np.int8)
    quant = INT8_QUANT["ADD"]
    assert_matches_oracle(
        binary_model("ADD", "int8", (2, 3, 4), (1, 1, 4), quant=quant, input2=bias)
    )


def test_float_overflow_is_clamped_to_the_largest_float():
    """TFLite clamps to numeric_limits<float>::lowest/max even without an activation."""
    huge = np.full((4,), 3e38, np.float32)
    model = binary_model("MUL", "float32", (2, 4), (4,), input2=huge)
    assert np.isfinite(oracle_outputs(model)[0]).all()
    assert_matches_oracle(model)


@pytest.mark.parametrize("opcode,dtype", [(op, "int8") for op in INT8_OPS] + [("DIV", "float32")])
def test_oracle_output_varies(opcode, dtype):
    """The quantization above leaves room for the result: the comparisons can fail."""
    if dtype == "int8":
        model = binary_model(opcode, dtype, (4, 16), (4, 16), quant=INT8_QUANT[opcode])
    else:
        model = plain_model(opcode, dtype, (4, 16), (4, 16))
    output = oracle_outputs(model)[0]
    assert len(np.unique(output)) > 20
    if dtype == "int8":
        assert np.mean((output == -128) | (output == 127)) < 0.2


def test_int32_division_by_zero_gives_zero():
    """TFLite refuses a zero divisor; runtime_py gives 0, as the C kernel does (tests/test_edges.py
    compares the two)."""
    model = binary_model("DIV", "int32", (3,), (3,))
    graph = parse_model(model, "<built model>").main
    params = prepare(graph, graph.operators[0])
    out = np.empty(3, np.int32)
    KERNELS["DIV"](params, [np.array([7, 2, -9], np.int32), np.array([2, 0, 4], np.int32)], [out])
    assert out.tolist() == [3, 0, -2]


@pytest.mark.parametrize(
    "model,reason",
    [
        (
            binary_model("MAXIMUM", "int8", (4,), (4,), quant=((0.05, 0), (0.06, 0), (0.05, 0))),
            "identical quantization",
        ),
        (binary_model("ADD", "float32", (4,), (4,), activation="TANH"), "fused activation TANH"),
        (
            binary_model("ADD", "float32", (2, 1, 2, 1, 2, 1, 2), (1, 2, 1, 2, 1, 2, 1)),
            "more than 6 dimensions",
        ),
        (binary_model("DIV", "int8", (4,), (4,), quant=((0.05, 0),) * 3),
         "DIV: no kernel for int8, int8 -> int8"),
        (
            binary_model("ADD", "int8", (4,), (4,), quant=((0.5, 0), (0.5, 0), (1e-7, 0))),
            "output multiplier",
        ),
    ],
    ids=["max-requant", "tanh", "rank7", "div-int8", "tiny-output-scale"],
)
def test_refused_variants(model, reason):
    with pytest.raises(UnsupportedOpError, match=reason):
        prepare_graph(parse_model(model, "<built model>").main)




@needs_shared_models
def test_simple_add_model_end_to_end():
    assert_matches_oracle((SHARED_MODELS / "simple_add_model.tflite").read_bytes())


@needs_shared_models
def test_resnet_residual_adds_match_the_oracle_tensors():
    """Each ADD of ResNet-8, fed the oracle's own inputs, reproduces the oracle's output."""
    model = (SHARED_MODELS / "pretrainedResnet_quant.tflite").read_bytes()
    graph = parse_model(model, "pretrainedResnet_quant").main
    oracle = LiteRTOracle(model, preserve_all_tensors=True)
    oracle.invoke(random_inputs(graph, seed=0))
    adds = [op for op in graph.operators if op.opcode == "ADD"]
    assert len(adds) == 3
    for op in adds:
        expected = oracle.tensor(op.outputs[0])
        actual = np.empty_like(expected)
        KERNELS["ADD"](prepare(graph, op), [oracle.tensor(t) for t in op.inputs], [actual])
        np.testing.assert_array_equal(actual, expected)
        assert len(np.unique(expected)) > 10


# -- legacy uint8: the int8 pipelines in the range [0, 255] -----------------------------------

UINT8_OPS = ("ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM")


def as_uint8(quant: tuple[Quant, ...]) -> tuple[Quant, ...]:
    """The int8 quantizations moved to uint8: the same scales, zero points 128 higher."""
    return tuple((scale, zero_point + 128) for scale, zero_point in quant)


@pytest.mark.parametrize("shapes", SHAPES[:5], ids=str)
@pytest.mark.parametrize("opcode", UINT8_OPS)
def test_uint8_broadcasting(opcode, shapes):
    assert_matches_oracle(binary_model(opcode, "uint8", *shapes,
                                       quant=as_uint8(INT8_QUANT[opcode])))


@pytest.mark.parametrize("activation", ["RELU", "RELU6", "RELU_N1_TO_1"])
@pytest.mark.parametrize("opcode", ["ADD", "SUB", "MUL"])
def test_uint8_fused_activations(opcode, activation):
    q1, q2, _ = as_uint8(INT8_QUANT[opcode])
    quant = (q1, q2, as_uint8((ACTIVATION_OUTPUT[activation],))[0])
    assert_matches_oracle(binary_model(opcode, "uint8", (2, 3, 4), (3, 1), activation, quant))


@pytest.mark.parametrize("quant", [as_uint8(q) for q in RESCALINGS], ids=str)
@pytest.mark.parametrize("opcode", ["ADD", "SUB", "MUL"])
def test_uint8_rescaling(opcode, quant):
    assert_matches_oracle(binary_model(opcode, "uint8", (3, 8), (1, 8), quant=quant))


def test_uint8_squared_difference_is_refused_as_tflite_does():
    model = binary_model("SQUARED_DIFFERENCE", "uint8", (4,), (4,), quant=((0.05, 128),) * 3)
    with pytest.raises(UnsupportedOpError, match="no kernel for uint8, uint8 -> uint8"):
        prepare_graph(parse_model(model, "<built model>").main)


@pytest.mark.parametrize("opcode", UINT8_OPS)
def test_uint8_oracle_output_varies(opcode):
    """The shifted quantizations leave room for the result too: the comparisons can fail."""
    model = binary_model(opcode, "uint8", (4, 16), (4, 16), quant=as_uint8(INT8_QUANT[opcode]))
    output = oracle_outputs(model)[0]
    assert output.dtype == np.uint8 and len(np.unique(output)) > 20
    assert np.mean((output == 0) | (output == 255)) < 0.2


# -- int16 (16x8): zero points 0; ADD and SUB shift 15 bits, MUL as int8 --------------------
# (power-of-two ADD/SUB, MAXIMUM/MINIMUM and the int16 refusals: test_elementwise_int16.py)

INT16_QUANT: dict[str, tuple[Quant, Quant, Quant]] = {
    "ADD": ((0.0003, 0), (0.0007, 0), (0.001, 0)),
    "SUB": ((0.0003, 0), (0.0007, 0), (0.001, 0)),
    "MUL": ((0.0003, 0), (0.0007, 0), (0.005, 0)),
}


@pytest.mark.parametrize("shapes", SHAPES[:5], ids=str)
@pytest.mark.parametrize("opcode", ["ADD", "SUB", "MUL"])
def test_int16_broadcasting(opcode, shapes):
    assert_matches_oracle(binary_model(opcode, "int16", *shapes, quant=INT16_QUANT[opcode]))


@pytest.mark.parametrize("activation", ["RELU", "RELU6", "RELU_N1_TO_1"])
@pytest.mark.parametrize("opcode", ["ADD", "SUB", "MUL"])
def test_int16_fused_activations(opcode, activation):
    model = binary_model(opcode, "int16", (2, 3, 4), (3, 1), activation, INT16_QUANT[opcode])
    assert_matches_oracle(model)


@pytest.mark.parametrize("opcode", ["ADD", "SUB", "MUL"])
def test_int16_oracle_output_varies(opcode):
    output = oracle_outputs(binary_model(opcode, "int16", (4, 16), (4, 16),
                                         quant=INT16_QUANT[opcode]))[0]
    assert output.dtype == np.int16 and len(np.unique(output)) > 40


# --- ADD_N ------------------------------------------------------------------------------------


def add_n_model(dtype: str, shape: tuple[int, ...], count: int, constant: bool = False) -> bytes:
    """ADD_N of `count` model inputs (the last a constant instead, with `constant`)."""
    b = ModelBuilder()
    xs = [b.input(f"x{k}", shape, dtype) for k in range(count - constant)]
    if constant:
        values = np.random.default_rng(5).normal(0, 3, shape)
        xs.append(b.const("c", values.astype(dtype) if dtype == "float32" else
                          np.round(values * 1e8).astype(dtype)))
    y = b.tensor("y", shape, dtype)
    b.op("ADD_N", xs, [y])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("count", [2, 3, 5])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_add_n(dtype, count):
    model = add_n_model(dtype, (2, 3, 4), count)
    assert_varied(model)
    assert_matches_oracle(model, sanitize=True)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_add_n_with_a_constant_input(dtype):
    assert_matches_oracle(add_n_model(dtype, (3, 5), 3, constant=True), sanitize=True)


def test_add_n_sums_from_the_first_input_and_wraps_as_litert():
    """-0.0 + -0.0 is -0.0: LiteRT's sum starts from the first input (TFLite Micro's from 0,
    which gives +0.0); int32 wraps past INT32_MAX."""
    for dtype, values in (("float32", [-0.0, -0.0]), ("int32", [2**31 - 1, 5])):
        three_ways(add_n_model(dtype, (1,), 2), [np.array([v], dtype) for v in values])
    assert np.signbit(LiteRTOracle(add_n_model("float32", (1,), 2)).invoke(
        [np.array([-0.0], np.float32)] * 2)[0][0])


def test_add_n_may_write_over_its_inputs():
    mp = plan_model(parse_model(add_n_model("float32", (4, 4), 3), "add_n.tflite"))
    offsets = mp.offset_of_tensor()
    assert offsets[mp.graph.outputs[0]] in {offsets[t] for t in mp.graph.inputs}
