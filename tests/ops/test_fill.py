"""ZEROS_LIKE, FILL and SHAPE (toolchain/ops/fill): runtime_py in its planned arena and the C (under
the sanitizers) against TFLite's reference kernels, bit for bit, in every dtype each runs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.opcheck import assert_matches_oracle, oracle_outputs, refusal
from toolchain.errors import ModelError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lower.plan import plan_model

QUANTIZED = {"int8": (0.05, -3), "int16": (0.001, 0)}


def zeros_like_model(dtype: str, shape: tuple[int, ...]) -> bytes:
    b = ModelBuilder()
    x = b.input("x", shape, dtype)
    y = b.tensor("y", shape, dtype)
    b.op("ZEROS_LIKE", [x], [y])
    b.output(y)
    return b.build()


def fill_model(dtype: str, shape: tuple[int, ...], dims_dtype: str = "int32",
               constant_value: bool = False) -> bytes:
    """FILL of `shape` with a value the model is given, or with a constant -7 (then the model's
    input only passes through a RESHAPE beside it: generated C is driven by an input)."""
    b = ModelBuilder()
    quant = QUANTIZED.get(dtype, (None, None))
    dims = b.const("dims", np.array(shape, dims_dtype))
    if constant_value:
        value = b.const("value", np.array(-7, dtype), *quant)
    else:
        value = b.input("value", (), dtype, *quant)
    y = b.tensor("y", shape, dtype, *quant)
    b.op("FILL", [dims, value], [y])
    b.output(y)
    if constant_value:
        x = b.input("x", (2, 2), dtype, *quant)
        flat = b.tensor("flat", (4,), dtype, *quant)
        b.op("RESHAPE", [x], [flat], {"new_shape": [4]})
        b.output(flat)
    return b.build()


@pytest.mark.parametrize("shape", [(2, 3, 5), (7,), ()])
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
def test_zeros_like(dtype, shape):
    model = zeros_like_model(dtype, shape)
    assert_matches_oracle(model, sanitize=True)
    assert all((out == 0).all() for out in oracle_outputs(model))


FILL_DTYPES = ["bool", "float32", "int8", "int16", "int32", "int64"]


@pytest.mark.parametrize(("shape", "dims_dtype"),
                         [((2, 3, 4), "int32"), ((5,), "int32"), ((), "int32"), ((3, 2), "int64")])
@pytest.mark.parametrize("dtype", FILL_DTYPES)
def test_fill(dtype, shape, dims_dtype):
    assert_matches_oracle(fill_model(dtype, shape, dims_dtype), inputs=2, sanitize=True)


@pytest.mark.parametrize("dtype", ["float32", "int8", "int64"])
def test_fill_with_a_constant_value(dtype):
    model = fill_model(dtype, (3, 4), constant_value=True)
    assert_matches_oracle(model, sanitize=True)
    assert (oracle_outputs(model)[0] == -7).all()


def test_the_output_may_take_the_value_s_place():
    """FILL reads its value once before it writes: the planner may put the output over it."""
    mp = plan_model(parse_model(fill_model("int32", (4, 4)), "fill.tflite"))
    offsets = mp.offset_of_tensor()
    assert offsets[mp.graph.inputs[0]] == offsets[mp.graph.outputs[0]]


def test_dims_given_at_run_time_are_refused_in_one_line():
    b = ModelBuilder()
    dims = b.input("dims", (2,), "int32")
    value = b.input("value", (), "float32")
    y = b.tensor("y", (2, 3), "float32")
    b.op("FILL", [dims, value], [y])
    b.output(y)
    assert "dims must be a constant tensor" in refusal(b.build())


def test_dims_that_are_not_the_output_s_shape_are_a_model_error():
    b = ModelBuilder()
    value = b.input("value", (), "float32")
    y = b.tensor("y", (2, 3), "float32")
    b.op("FILL", [b.const("dims", np.array([3, 2], np.int32)), value], [y])
    b.output(y)
    with pytest.raises(ModelError, match=r"its dims \[3, 2\] are not the output's shape \[2, 3\]"):
        plan_model(parse_model(b.build(), "fill.tflite")).program.params()


def shape_model(dtype: str, shape: tuple[int, ...], out_dtype: str) -> bytes:
    """SHAPE of the input, the model's only op: its input is never read, which LiteRT and the C
    allow alike."""
    b = ModelBuilder()
    quant = QUANTIZED.get(dtype, (None, None))
    x = b.input("x", shape, dtype, *quant)
    dims = b.tensor("dims", (len(shape),), out_dtype)
    b.op("SHAPE", [x], [dims], {"out_type": out_dtype.upper()})
    b.output(dims)
    return b.build()


@pytest.mark.parametrize(("shape", "out_dtype"),
                         [((2, 3, 5), "int32"), ((7,), "int32"), ((1, 4, 1, 2, 3), "int64")])
@pytest.mark.parametrize("dtype", ["float32", "int8", "int32"])
def test_shape(dtype, shape, out_dtype):
    model = shape_model(dtype, shape, out_dtype)
    assert_matches_oracle(model, sanitize=True)
    assert oracle_outputs(model)[0].tolist() == list(shape)


def test_shape_whose_out_type_is_not_its_output_s_is_refused():
    b = ModelBuilder()
    x = b.input("x", (2, 3), "float32")
    dims = b.tensor("dims", (2,), "int32")
    b.op("SHAPE", [x], [dims], {"out_type": "INT64"})
    b.output(dims)
    assert "out_type int64 with an output tensor of int32" in refusal(b.build())


# -- BROADCAST_ARGS -----------------------------------------------------------------------------


def broadcast_args_model(dtype: str, lengths: tuple[int, int]) -> bytes:
    b = ModelBuilder()
    s1 = b.input("s1", (lengths[0],), dtype)
    s2 = b.input("s2", (lengths[1],), dtype)
    y = b.tensor("y", (max(lengths),), dtype)
    b.op("BROADCAST_ARGS", [s1, s2], [y])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("s1, s2, expected", [
    ([1, 3, 1, 5], [3, 1, 1], [1, 3, 1, 5]),
    ([1, 4, 1], [6, 1, 1, 5], [6, 1, 4, 5]),
    ([2, 1], [7, 1, 6], [7, 2, 6]),
    ([8, 9], [8, 9], [8, 9]),
    ([0, 1], [1, 4], [0, 4]),
    ([1], [], [1]),
])
def test_broadcast_args(dtype, s1, s2, expected):
    from tests.opcheck import three_ways

    model = broadcast_args_model(dtype, (len(s1), len(s2)))
    out = three_ways(model, [np.array(s1, dtype), np.array(s2, dtype)])
    assert out.tolist() == expected


def test_shapes_that_do_not_broadcast_fail_the_invoke():
    """TFLite's reference stops the process; runtime_py raises and the C's invoke returns
    NAME_ERROR_INCOMPATIBLE_SHAPES (the harness then exits 3)."""
    from tests.opcheck import fails_everywhere
    from toolchain.c.generate import generate

    model = broadcast_args_model("int32", (2, 2))
    fails_everywhere(model, [np.array([3, 4], np.int32), np.array([3, 5], np.int32)],
                     "do not broadcast", oracle_fails=False)
    header = generate(plan_model(parse_model(model, "<built model>")))["model.h"]
    assert "#define MODEL_ERROR_INCOMPATIBLE_SHAPES 6" in header
    assert "INDEX_OUT_OF_RANGE" not in header
