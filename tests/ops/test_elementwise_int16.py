"""int16 (16x8) elementwise ops beyond test_elementwise.py's general ADD/SUB and MUL: MAXIMUM
and MINIMUM, ADD and SUB on TFLite's power-of-two path, and what TFLite refuses."""

from __future__ import annotations

import flatbuffers
import numpy as np
import pytest

from tests.opcheck import assert_matches_oracle, assert_varied
from tests.ops.test_elementwise import SHAPES
from toolchain.errors import UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.front.schema import fb
from toolchain.ops import prepare_graph
from toolchain.ops.elementwise.prepare import RescaledParams, ShiftedParams, prepare

Quant = tuple[float, int]


def pot(exponent: int, factor: float = 1.0) -> Quant:
    """The int16 quantization of scale factor * 2^exponent, zero point 0."""
    return (factor * 2.0**exponent, 0)


def int16_model(opcode: str, shape1: tuple, shape2: tuple, quant: tuple[Quant, Quant, Quant],
                activation: str | None = None, pot_scale_int16: bool | None = None,
                options_table: bool = True) -> bytes:
    """One int16 binary op on two model inputs; without `options_table` the op carries no
    options at all (TFLite then reads pot_scale_int16 as false)."""
    builder = ModelBuilder(dtype="float32")
    a = builder.input("a", shape1, "int16", *quant[0])
    b = builder.input("b", shape2, "int16", *quant[1])
    out = builder.tensor("out", np.broadcast_shapes(shape1, shape2), "int16", *quant[2])
    options = {}
    if activation:
        options["fused_activation_function"] = activation
    if pot_scale_int16 is not None:
        options["pot_scale_int16"] = pot_scale_int16
    builder.op(opcode, [a, b], [out], options or None)
    builder.output(out)
    data = builder.build()
    if options_table:
        return data
    model = fb.ModelT.InitFromPackedBuf(data, 0)
    op = model.subgraphs[0].operators[0]
    op.builtinOptionsType, op.builtinOptions = 0, None
    packed = flatbuffers.Builder(1024)
    packed.Finish(model.Pack(packed), file_identifier=b"TFL3")
    return bytes(packed.Output())


def params_of(model: bytes):
    graph = parse_model(model, "<built model>").main
    return prepare(graph, graph.operators[0])


def refusal(model: bytes, reason: str) -> None:
    with pytest.raises(UnsupportedOpError, match=reason):
        prepare_graph(parse_model(model, "<built model>").main)


# -- MAXIMUM and MINIMUM: TFLite compares the stored values ----------------------------------

SELECT_QUANTS = [((0.001, 0),) * 3, ((3e-4, -7),) * 3]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("opcode", ["MAXIMUM", "MINIMUM"])
def test_int16_select_broadcasting(opcode, shapes):
    assert_matches_oracle(int16_model(opcode, *shapes, SELECT_QUANTS[0]))


@pytest.mark.parametrize("quant", SELECT_QUANTS, ids=str)
@pytest.mark.parametrize("opcode", ["MAXIMUM", "MINIMUM"])
def test_int16_select_output_varies(opcode, quant):
    model = int16_model(opcode, (4, 16), (4, 16), quant)
    assert_matches_oracle(model)
    assert_varied(model, min_distinct=60)


def test_int16_select_with_different_quantizations_is_refused():
    """TFLite would compare values of different scales as if they were alike."""
    refusal(int16_model("MAXIMUM", (4,), (4,), ((0.001, 0), (0.002, 0), (0.001, 0))),
            "identical quantization")


def test_int16_squared_difference_is_refused_as_tflite_does():
    """TFLite's SQUARED_DIFFERENCE Eval fails on int16 ("only supports FLOAT32 and INT32")."""
    refusal(int16_model("SQUARED_DIFFERENCE", (4,), (4,), ((0.001, 0),) * 3),
            "no kernel for int16, int16 -> int16")


# -- ADD and SUB on power-of-two scales: a rounding shift, then saturation -------------------

# (input1, input2, output) scales: no shift, input2 or input1 shifted, a shift of 15 (the last
# one that rounds as usual), 16 and more (TFLite's 16-bit mask rounds every value to +-1), 31.
POT_QUANTS = [
    (pot(-12), pot(-12), pot(-12)),
    (pot(-10), pot(-12), pot(-10)),
    (pot(-13), pot(-11), pot(-11)),
    (pot(-4), pot(-19), pot(-4)),
    (pot(-21), pot(-5), pot(-5)),
    (pot(-3), pot(-23), pot(-3)),
    (pot(-5), pot(-36), pot(-5)),
]


POT_IDS = ["no-shift", "in2-by-2", "in1-by-2", "in2-by-15", "in1-by-16", "in2-by-20",
           "in2-by-31"]


@pytest.mark.parametrize("quant", POT_QUANTS, ids=POT_IDS)
@pytest.mark.parametrize("opcode", ["ADD", "SUB"])
def test_int16_power_of_two_shifts(opcode, quant):
    model = int16_model(opcode, (4, 64), (4, 64), quant)
    assert isinstance(params_of(model), ShiftedParams)
    assert_matches_oracle(model)
    assert_varied(model, min_distinct=40)


@pytest.mark.parametrize("shapes", [((2, 3, 4), (2, 3, 4)), ((1, 64), (64,)), ((), (1,))],
                         ids=str)
def test_int16_power_of_two_add_equal_sizes(shapes):
    """ADD's power-of-two path runs flat: operands of the output's size, whatever the shape."""
    assert_matches_oracle(int16_model("ADD", *shapes, POT_QUANTS[1]))


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_int16_power_of_two_sub_broadcasting(shapes):
    assert_matches_oracle(int16_model("SUB", *shapes, POT_QUANTS[2]))


@pytest.mark.parametrize("activation", ["RELU", "RELU6", "RELU_N1_TO_1"])
@pytest.mark.parametrize("opcode", ["ADD", "SUB"])
def test_int16_power_of_two_fused_activations(opcode, activation):
    """The output scale puts the activation's bounds inside the int16 range."""
    e = -14 if activation == "RELU_N1_TO_1" else -12
    model = int16_model(opcode, (2, 3, 16), (2, 3, 16), (pot(e), pot(e - 2), pot(e)), activation)
    assert isinstance(params_of(model), ShiftedParams)
    assert_matches_oracle(model)
    assert_varied(model, min_distinct=20)


@pytest.mark.parametrize(
    "factor,path",
    [(1.0006, ShiftedParams), (1 / 1.0006, ShiftedParams), (1.0008, RescaledParams),
     (1 / 1.0008, RescaledParams)],
    ids=["just-above", "just-below", "past-above", "past-below"],
)
@pytest.mark.parametrize("opcode", ["ADD", "SUB"])
def test_int16_near_power_of_two_scales(opcode, factor, path):
    """CheckedLog2 counts a scale within 1e-3 of a power of two in log2 as one (about 0.07%);
    the exact scale then goes unused."""
    model = int16_model(opcode, (8, 32), (8, 32), (pot(-10, factor), pot(-12), pot(-10)))
    assert isinstance(params_of(model), path)
    assert_matches_oracle(model)


@pytest.mark.parametrize(
    "pot_scale_int16,options_table",
    [(False, True), (None, False)],
    ids=["pot_scale_int16-false", "no-options-table"],
)
@pytest.mark.parametrize("opcode", ["ADD", "SUB"])
def test_int16_power_of_two_scales_on_the_general_path(opcode, pot_scale_int16, options_table):
    """Power-of-two scales take the general path when pot_scale_int16 is false, and when the op
    has no options table at all (the schema's default, true, needs the table)."""
    model = int16_model(opcode, (8, 32), (8, 32), POT_QUANTS[1],
                        pot_scale_int16=pot_scale_int16, options_table=options_table)
    assert isinstance(params_of(model), RescaledParams)
    assert_matches_oracle(model)


def test_int16_general_path_scales_still_rescale():
    """Non-power-of-two scales with pot_scale_int16 set (explicitly) stay on the general path."""
    quant = ((3e-4, 0), (7e-4, 0), (1e-3, 0))
    model = int16_model("SUB", (3, 1, 6), (1, 4, 6), quant, pot_scale_int16=True)
    assert isinstance(params_of(model), RescaledParams)
    assert_matches_oracle(model)


@pytest.mark.parametrize(
    "opcode,shapes,quant,reason",
    [
        ("ADD", ((4, 1), (1, 4)), POT_QUANTS[1], "does not broadcast"),
        ("ADD", ((2, 3), (3,)), POT_QUANTS[0], "does not broadcast"),
        ("ADD", ((4,), (4,)), (pot(-12), pot(-12), pot(-10)), "both input scales"),
        ("SUB", ((4,), (4,)), (pot(-12), pot(-11), pot(-10)), "both input scales"),
        ("ADD", ((4,), (4,)), (pot(-9), pot(-10), pot(-10)), "coarser than the output"),
        ("SUB", ((4,), (4,)), (pot(-10), pot(-8), pot(-10)), "coarser than the output"),
        ("SUB", ((4,), (4,)), (pot(-2), pot(-40), pot(-2)), "more than 31 bits"),
    ],
    ids=["add-broadcast", "add-broadcast-row", "add-two-shifts", "sub-two-shifts",
         "add-coarser-input", "sub-coarser-input", "sub-shift-38"],
)
def test_int16_power_of_two_refusals(opcode, shapes, quant, reason):
    """What TFLite refuses in Prepare (or aborts on, for ADD's broadcast) on this path."""
    refusal(int16_model(opcode, *shapes, quant), reason)


def test_int16_power_of_two_zero_point_is_refused():
    quant = ((2**-10, 3), (2**-10, 0), (2**-10, 0))
    refusal(int16_model("ADD", (4,), (4,), quant), "zero point 0")
