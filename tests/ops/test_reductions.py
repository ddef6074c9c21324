"""MEAN, SUM, REDUCE_MAX/MIN and ARG_MAX/MIN against TFLite's reference kernels, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import assert_matches_oracle, assert_varied, three_ways
from toolchain.errors import UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.check import random_inputs
from toolchain.lab.oracle import LiteRTOracle, TFLMOracle
from toolchain.lower.plan import plan_model
from toolchain.ops import prepare_graph

Quant = tuple[float, int] | None


def reduced_shape(shape: tuple[int, ...], axes: list[int], keep_dims: bool) -> tuple[int, ...]:
    resolved = {a % len(shape) for a in axes}
    return tuple(
        1 if i in resolved else d for i, d in enumerate(shape) if keep_dims or i not in resolved
    )


def reduce_model(
    opcode: str,
    shape: tuple[int, ...],
    axes: list[int],
    keep_dims: bool,
    dtype: str,
    source_quant: Quant = None,
    target_quant: Quant = None,
) -> bytes:
    b = ModelBuilder()
    x = b.input("x", shape, dtype, *(source_quant or (None, None)))
    axis = b.const("axis", np.asarray(axes, np.int32))
    y = b.tensor("y", reduced_shape(shape, axes, keep_dims), dtype, *(target_quant or (None, None)))
    b.op(opcode, [x, axis], [y], {"keep_dims": keep_dims})
    b.output(y)
    return b.build()


def assert_matches_tflm(model_bytes: bytes, inputs: int = 3) -> None:
    """assert_matches_oracle and assert_varied with TFLite Micro as the oracle, bit-exact."""
    graph = parse_model(model_bytes).main
    runtime = ArenaInterpreter(plan_model(parse_model(model_bytes), "greedy"))
    oracle = TFLMOracle(model_bytes, len(graph.outputs))
    seen = set()
    for seed in range(inputs):
        values = random_inputs(graph, seed)
        for expected, actual in zip(oracle.invoke(values), runtime.invoke(values), strict=True):
            np.testing.assert_array_equal(actual, expected)
            seen.update(expected.reshape(-1).tolist())
    assert len(seen) > 1


# (shape, axes, keep_dims): the spatial mean of 4-D tensors (TFLite once special-cased it),
# negative and duplicate axes, all axes, and reductions leaving a scalar.
REDUCTIONS = [
    ((1, 5, 7, 3), [1, 2], True),
    ((2, 4, 4, 3), [2, 1], True),
    ((1, 13, 11, 8), [1, 2], True),
    ((2, 4, 6, 3), [1, 2], False),
    ((2, 4, 6, 3), [-1], False),
    ((3, 5), [0], True),
    ((2, 3, 4), [0, 2], False),
    ((2, 3, 4), [1, -2], True),
    ((2, 3, 4), [0, 1, 2], False),
    ((5, 3, 2), [0, 1, 2], True),
]
IDS = [f"{shape}-{axes}-{'keep' if keep else 'drop'}" for shape, axes, keep in REDUCTIONS]


@pytest.mark.parametrize("shape, axes, keep_dims", REDUCTIONS, ids=IDS)
@pytest.mark.parametrize("opcode", ["MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN"])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_reduce_unquantized(opcode, dtype, shape, axes, keep_dims):
    assert_matches_oracle(reduce_model(opcode, shape, axes, keep_dims, dtype))


@pytest.mark.parametrize("shape, axes, keep_dims", REDUCTIONS, ids=IDS)
@pytest.mark.parametrize(
    "source_quant, target_quant",
    [
        ((0.05, 3), (0.02, -5)),
        ((0.1, -10), (0.1, -10)),
        ((0.03, 0), (0.011, 7)),
        ((0.02, 100), (0.5, -128)),
    ],
    ids=["rescale", "same", "finer", "coarser"],
)
def test_mean_int8(shape, axes, keep_dims, source_quant, target_quant):
    model = reduce_model("MEAN", shape, axes, keep_dims, "int8", source_quant, target_quant)
    if source_quant != (0.02, 100):  # the coarse output is meant to be nearly constant
        assert_varied(model)
    assert_matches_oracle(model)


@pytest.mark.parametrize("shape, axes, keep_dims", REDUCTIONS, ids=IDS)
@pytest.mark.parametrize(
    "dtype, source_quant, target_quant",
    [
        ("int8", (0.05, 3), (0.3, -5)),
        ("int8", (0.01, -2), (0.08, 10)),
        ("int8", (0.1, 0), (0.1, 0)),  # equal quantization still goes through requantization
        ("int16", (0.001, 0), (0.004, 0)),
        ("int16", (0.001, 0), (0.001, 0)),
    ],
    ids=["rescale", "rescale2", "same", "int16", "int16-same"],
)
def test_sum_int8_int16(shape, axes, keep_dims, dtype, source_quant, target_quant):
    """Checked against TFLite Micro: see test_litert_reference_sum_misreads_int8."""
    model = reduce_model("SUM", shape, axes, keep_dims, dtype, source_quant, target_quant)
    assert_matches_tflm(model)


def test_litert_reference_sum_misreads_int8():
    """LiteRT 2.3.0's reference SUM reads int8 as uint8: -1 - 2 - 3 becomes 255 + 254 + 253,
    clamped to 255 and stored as int8 -1, where TFLite Micro (and runtime_py) give -6. If this
    starts failing, LiteRT was fixed: check int8 and int16 SUM against it again."""
    model = reduce_model("SUM", (2, 3), [1], False, "int8", (0.1, 0), (0.1, 0))
    x = np.array([[1, 2, 3], [-1, -2, -3]], np.int8)
    (litert,) = LiteRTOracle(model).invoke([x])
    (micro,) = TFLMOracle(model, 1).invoke([x])
    np.testing.assert_array_equal(litert, [6, -1])
    np.testing.assert_array_equal(micro, [6, -6])


@pytest.mark.parametrize("shape, axes, keep_dims", REDUCTIONS[::3], ids=IDS[::3])
@pytest.mark.parametrize("opcode", ["REDUCE_MAX", "REDUCE_MIN"])
@pytest.mark.parametrize(
    "dtype, quant", [("int8", (0.05, -3)), ("uint8", (0.02, 128)), ("int16", (0.001, 0))]
)
def test_reduce_extreme_quantized(opcode, dtype, quant, shape, axes, keep_dims):
    model = reduce_model(opcode, shape, axes, keep_dims, dtype, quant, quant)
    assert_varied(model)
    assert_matches_oracle(model)


@pytest.mark.parametrize("shape, axes, keep_dims", REDUCTIONS[::2], ids=IDS[::2])
@pytest.mark.parametrize(
    "opcode, dtype, source_quant, target_quant",
    [
        ("MEAN", "uint8", (0.05, 128), (0.03, 120)),
        ("MEAN", "int16", (0.001, 0), (0.0005, 0)),
        ("SUM", "uint8", (0.05, 128), (0.2, 100)),
        ("SUM", "uint8", (0.05, 128), (0.05, 128)),
    ],
)
def test_reduce_other_quantized(opcode, dtype, source_quant, target_quant, shape, axes, keep_dims):
    model = reduce_model(opcode, shape, axes, keep_dims, dtype, source_quant, target_quant)
    assert_varied(model)
    assert_matches_oracle(model)


@pytest.mark.parametrize("shape, axes, keep_dims", REDUCTIONS, ids=IDS)
@pytest.mark.parametrize(
    "source_quant, target_quant",
    [((0.001, 0), (0.001, 0)), ((0.002, 0), (0.0007, 0)), ((3e-4, 0), (0.01, 0))],
    ids=["same", "finer", "coarser"],
)
def test_mean_int16(shape, axes, keep_dims, source_quant, target_quant):
    model = reduce_model("MEAN", shape, axes, keep_dims, "int16", source_quant, target_quant)
    assert_varied(model)
    assert_matches_oracle(model)


@pytest.mark.parametrize("opcode", ["MEAN", "SUM", "REDUCE_MAX"])
@pytest.mark.parametrize("source_zero_point, target_zero_point", [(3, 0), (0, -2)])
def test_int16_refuses_zero_points(opcode, source_zero_point, target_zero_point):
    """TFLite's Prepare requires int16 zero points of 0 for every reduction."""
    model = reduce_model(opcode, (2, 3), [1], False, "int16", (0.1, source_zero_point),
                         (0.1, target_zero_point))
    with pytest.raises(UnsupportedOpError, match="zero point 0"):
        prepare_graph(parse_model(model).main)
    with pytest.raises(RuntimeError, match="zero_point"):
        LiteRTOracle(model)


@pytest.mark.parametrize("opcode", ["REDUCE_MAX", "REDUCE_MIN"])
@pytest.mark.parametrize("dtype, source_quant, target_quant",
                         [("int8", (0.1, 0), (0.2, 0)), ("int16", (0.1, 0), (0.2, 0))])
def test_extreme_refuses_requantization(opcode, dtype, source_quant, target_quant):
    model = reduce_model(opcode, (2, 3), [1], False, dtype, source_quant, target_quant)
    with pytest.raises(UnsupportedOpError, match="equal input and output quantization"):
        prepare_graph(parse_model(model).main)
    with pytest.raises(RuntimeError, match="scale"):  # TFLite checks when it evaluates
        LiteRTOracle(model).invoke(random_inputs(parse_model(model).main, 0))


def test_reduce_refuses_axis_computed_at_run_time():
    b = ModelBuilder()
    x = b.input("x", (2, 3), "float32")
    axis = b.input("axis", (1,), "int32")
    y = b.tensor("y", (2,), "float32")
    b.op("MEAN", [x, axis], [y], {"keep_dims": False})
    b.output(y)
    with pytest.raises(UnsupportedOpError, match="constant"):
        prepare_graph(parse_model(b.build()).main)


def arg_model(
    opcode: str,
    shape: tuple[int, ...],
    axis: int,
    dtype: str,
    output_type: str,
    axis_type: str = "int32",
    quant: Quant = None,
) -> bytes:
    b = ModelBuilder()
    x = b.input("x", shape, dtype, *(quant or (None, None)))
    axis_index = b.const("axis", np.asarray([axis], axis_type))
    out_shape = tuple(d for i, d in enumerate(shape) if i != axis % len(shape))
    y = b.tensor("y", out_shape, output_type)
    b.op(opcode, [x, axis_index], [y], {"output_type": output_type.upper()})
    b.output(y)
    return b.build()


@pytest.mark.parametrize("opcode", ["ARG_MAX", "ARG_MIN"])
@pytest.mark.parametrize(
    "dtype, quant", [("float32", None), ("int8", (0.1, 3)), ("uint8", (0.1, 128)), ("int32", None)]
)
@pytest.mark.parametrize(
    "shape, axis",
    [((2, 9, 5), 1), ((2, 9, 5), -1), ((2, 9, 5), 0), ((1, 3, 3, 40), 3), ((300,), 0)],
)
def test_arg_extreme(opcode, dtype, quant, shape, axis):
    """Random 8-bit values repeat often, so ties (first index wins) are exercised."""
    model = arg_model(opcode, shape, axis, dtype, "int32", quant=quant)
    if shape[axis] > 2 and np.prod(shape) > shape[axis]:
        assert_varied(model)
    assert_matches_oracle(model)


@pytest.mark.parametrize("opcode", ["ARG_MAX", "ARG_MIN"])
@pytest.mark.parametrize(
    "output_type, axis_type", [("int64", "int32"), ("int32", "int64"), ("int64", "int64")]
)
def test_arg_extreme_index_types(opcode, output_type, axis_type):
    assert_matches_oracle(arg_model(opcode, (3, 7, 4), 1, "int8", output_type, axis_type, (0.1, 0)))


def test_arg_extreme_refuses_mismatched_output_type():
    b = ModelBuilder()
    x = b.input("x", (3, 4), "float32")
    axis = b.const("axis", np.asarray([1], np.int32))
    y = b.tensor("y", (3,), "int32")
    b.op("ARG_MAX", [x, axis], [y], {"output_type": "INT64"})
    b.output(y)
    with pytest.raises(UnsupportedOpError, match="output_type"):
        prepare_graph(parse_model(b.build()).main)


@pytest.mark.parametrize(("shape", "axes", "keep_dims"), [((2, 3, 4), [1], False),
                                                          ((2, 3, 4), [0, 2], True),
                                                          ((5, 6), [-1], False)])
@pytest.mark.parametrize("opcode", ["REDUCE_ANY", "REDUCE_ALL"])
def test_logical_reductions(opcode, shape, axes, keep_dims):
    """REDUCE_ANY and REDUCE_ALL of bools, on random rows and on rows all true or all false
    (random bools alone would make almost every ALL false and every ANY true)."""
    model = reduce_model(opcode, shape, axes, keep_dims, "bool")
    assert_matches_oracle(model, sanitize=True)
    rows = np.zeros(shape, bool)
    rows[0] = True  # some rows all true, the others all false
    rows.reshape(-1)[1] = False  # and one row mixed
    three_ways(model, [rows])
