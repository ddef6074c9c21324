"""The float32 math functions (toolchain/ops/unary): runtime_py and the C against LiteRT's
reference kernels, bit for bit (a NaN as a NaN), on edge values as well as random ones; CEIL,
which LiteRT's reference resolver lacks, against TFLite Micro's."""

from __future__ import annotations

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import three_ways
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.oracle import LiteRTOracle, TFLMOracle
from toolchain.lower.plan import plan_model
from toolchain.ops.unary.prepare import FUNCTIONS

EDGES = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 2.5, 1e-45, -1e-45, 3.4e38, -3.4e38,
                  np.inf, -np.inf, np.nan, 1e-30, 123456.789], np.float32)


# What LiteRT's BUILTIN_REF resolver has no kernel for: TFLite Micro is the oracle there.
LITERT_LACKS = {"CEIL", "ROUND"}


def unary_model(opcode: str, shape: tuple[int, ...]) -> bytes:
    b = ModelBuilder("float32")
    x = b.input("x", shape, "float32")
    y = b.tensor("y", shape, "float32")
    b.op(opcode, [x], [y])
    b.output(y)
    return b.build()


def inputs_of(shape: tuple[int, ...], seed: int) -> np.ndarray:
    values = np.random.default_rng(seed).normal(0, 10, int(np.prod(shape))).astype(np.float32)
    values[:len(EDGES)] = EDGES[:values.size]
    return values.reshape(shape)


def same_bits(expected: np.ndarray, actual: np.ndarray) -> bool:
    nan = np.isnan(expected)
    return bool((nan == np.isnan(actual)).all()
                and (expected[~nan].view(np.uint32) == actual[~nan].view(np.uint32)).all())


@pytest.mark.parametrize("shape", [(2, 3, 5), (17,)])
@pytest.mark.parametrize("opcode", FUNCTIONS)
def test_runtime_py_and_c_give_litert_s_bits(opcode, shape):
    model = unary_model(opcode, shape)
    sets = [[inputs_of(shape, seed)] for seed in range(2)]
    oracle = TFLMOracle(model, 1) if opcode in LITERT_LACKS else LiteRTOracle(model)
    mp = plan_model(parse_model(model, "<built model>"))
    runtime = ArenaInterpreter(mp)
    with CBackend(mp, sanitize=shape == (17,)) as backend:
        c_outputs = backend.invoke_many(sets)
    for inputs, (c_out,) in zip(sets, c_outputs, strict=True):
        (expected,) = oracle.invoke(inputs)
        (mine,) = runtime.invoke(inputs)
        assert same_bits(expected, mine), (opcode, expected, mine)
        assert same_bits(expected, c_out), (opcode, expected, c_out)


def test_the_output_may_take_the_input_s_place():
    """Each element is read before its output is written: the plan may put the output over
    the input, and the C run that way still gives LiteRT's bits."""
    model = unary_model("RSQRT", (4, 8))
    mp = plan_model(parse_model(model, "<built model>"))
    offsets = mp.offset_of_tensor()
    assert offsets[mp.graph.inputs[0]] == offsets[mp.graph.outputs[0]]
    inputs = [np.abs(inputs_of((4, 8), 3))]
    (expected,) = LiteRTOracle(model).invoke(inputs)
    with CBackend(mp) as backend:
        ((c_out,),) = backend.invoke_many([inputs])
    assert same_bits(expected, c_out)


def test_a_shape_change_is_refused_in_one_line():
    b = ModelBuilder("float32")
    x = b.input("x", (2, 3), "float32")
    y = b.tensor("y", (3, 2), "float32")
    b.op("SQRT", [x], [y])
    b.output(y)
    with pytest.raises(Exception, match="output shape \\[3, 2\\] is not the input's \\[2, 3\\]"):
        plan_model(parse_model(b.build(), "<built model>")).program.params()


def test_round_takes_halves_to_even_and_small_negatives_to_plus_zero():
    """TFLite's ROUND floors and then steps up: halves go to the even integer, and -0.3 comes
    out +0.0, where C's rintf and numpy's rint give -0.0. runtime_py and the C match TFLite
    Micro's bits on these."""
    values = np.array([[-0.3, -0.5, 0.5, 1.5, 2.5, -1.5, -2.5, -0.0, 0.49999997, 8388607.5]],
                      np.float32)
    model = unary_model("ROUND", values.shape)
    expected = three_ways(model, [values], TFLMOracle(model, 1))
    np.testing.assert_array_equal(expected, [[0, -0, 0, 2, 2, -2, -2, -0, 0, 8388608]])
    assert not np.signbit(expected[0, 0]) and np.signbit(np.rint(values[0, 0]))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_neg_of_integers_wraps_as_litert(dtype):
    """NEG on int32 and int64: the type's lowest value negates to itself, as LiteRT's kernel
    gives it (the C negates in unsigned arithmetic: no undefined behaviour)."""
    info = np.iinfo(dtype)
    values = np.array([[info.min, info.min + 1, -1, 0, 1, 7, info.max]], dtype)
    b = ModelBuilder()
    x = b.input("x", values.shape, dtype)
    y = b.tensor("y", values.shape, dtype)
    b.op("NEG", [x], [y])
    b.output(y)
    expected = three_ways(b.build(), [values])
    assert expected.tolist() == [[info.min, info.max, 1, 0, -1, -7, info.min + 1]]
