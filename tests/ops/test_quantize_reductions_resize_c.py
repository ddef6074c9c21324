"""The generated C of the quantize, reduction and resize families where tests/ops/test_*.py do
not reach it: chosen edge values, TFLite Micro's int8/int16 SUM, outputs sharing the input's
memory, and builds with AddressSanitizer and UndefinedBehaviorSanitizer."""

from __future__ import annotations

import re

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import assert_matches_oracle
from tests.ops.test_quantize import EDGES, ENDS, WRAPS, per_channel_model, unary_model
from tests.ops.test_reductions import REDUCTIONS, arg_model, reduce_model
from tests.ops.test_resize import resize_model
from toolchain.c.generate import generate
from toolchain.errors import ModelError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend, compile_files, write_files
from toolchain.lab.check import random_inputs
from toolchain.lab.oracle import LiteRTOracle, TFLMOracle
from toolchain.lower.plan import plan_model
from toolchain.ops.reductions.emit import Loop, Walk, collapse


def plan(model_bytes: bytes):
    return plan_model(parse_model(model_bytes), "greedy")


def c_outputs(model_bytes: bytes, values: list[np.ndarray], sanitize: bool = True):
    """The compiled C's outputs; with `sanitize`, built with ASan and UBSan (aborting)."""
    with CBackend(plan(model_bytes), sanitize=sanitize) as backend:
        return backend.invoke(values)


def assert_c_matches(
    model_bytes: bytes, values: list[np.ndarray], oracle: str = "litert", runtime: bool = True
) -> None:
    """The sanitized C against the oracle (and runtime_py), bit for bit."""
    actual = c_outputs(model_bytes, values)
    if oracle == "litert":
        expected = LiteRTOracle(model_bytes).invoke(values)
    else:
        expected = TFLMOracle(model_bytes, len(actual)).invoke(values)
    for e, a in zip(expected, actual, strict=True):
        np.testing.assert_array_equal(a, e)
    if runtime:
        for r, a in zip(ArenaInterpreter(plan(model_bytes)).invoke(values), actual, strict=True):
            np.testing.assert_array_equal(a, r)


# QUANTIZE: halves, saturation, and what x86 makes of values beyond int32.
@pytest.mark.parametrize(
    "target, scale, zero_point",
    [
        ("int8", 0.5, 1),
        ("int8", 0.25, -3),
        ("int8", 0.1, 0),
        ("int8", 3.0, 7),
        ("uint8", 0.25, 128),
        ("int16", 0.5, 0),
    ],
)
def test_quantize_edges(target, scale, zero_point):
    model = unary_model("QUANTIZE", (41,), "float32", target, None, (scale, zero_point))
    halves = (np.arange(-20, 21) + 0.5).astype(np.float32) * np.float32(scale)
    assert_c_matches(model, [halves])
    extremes = [np.inf, -np.inf, 1e30, -1e30, np.nan, 2.1e9 * scale, -2.1e9 * scale]
    assert_c_matches(model, [np.array(extremes + [0.0] * 34, np.float32)])


@pytest.mark.parametrize("source, target, source_quant, target_quant", WRAPS)
def test_requantize_wraps(source, target, source_quant, target_quant):
    """int32 arithmetic wrapping around as TFLite's, spelled out in uint32_t (no UB)."""
    values = ENDS[source]
    model = unary_model("QUANTIZE", values.shape, source, target, source_quant, target_quant)
    assert_c_matches(model, [values])


def test_requantize_wraps_only_where_it_can():
    """int8 and int16 inputs never leave int32 with an int8 output: plain int32 arithmetic."""
    narrow = unary_model("QUANTIZE", (4,), "int16", "int8", (1e-3, 0), (0.2, -7))
    wide = unary_model("QUANTIZE", (4,), "int32", "int8", (1e-9, 5), (0.05, -3))
    assert "const int32_t q = arenac_mbqm((int32_t)x[i], " in c_source_of(narrow)
    assert "arenac_mbqm((int32_t)((uint32_t)x[i] - 5u), " in c_source_of(wide)


def c_source_of(model_bytes: bytes) -> str:
    return generate(plan(model_bytes), "m")["m.c"]


@pytest.mark.parametrize("target, zero_points", [("int8", [3, -7, 0]), ("uint8", [128, 0, 255]),
                                                 ("int16", [0, 0, 0])])
def test_quantize_per_channel_edges(target, zero_points):
    """Halves, saturation and values beyond int32, each channel with its own scale."""
    model = per_channel_model((4, 3, 5), "float32", target, None,
                              ([0.5, 0.03, 2.0], zero_points), 1)
    halves = ((np.arange(60) % 11 - 5 + 0.5) * np.resize([0.5, 0.03, 2.0], 60)).astype(np.float32)
    assert_c_matches(model, [halves.reshape(4, 5, 3).transpose(0, 2, 1).copy()])
    extremes = np.resize(np.array([np.inf, -np.inf, np.nan, 1e30, -3e9, 0.0, 7.0], np.float32),
                         (4, 3, 5))
    assert_c_matches(model, [extremes])


CAST_DTYPES = ["float32", "int64", "int32", "int16", "int8", "uint8", "bool"]


@pytest.mark.parametrize("target", CAST_DTYPES[1:])
def test_cast_float_edges(target):
    assert_c_matches(unary_model("CAST", EDGES.shape, "float32", target), [EDGES])


@pytest.mark.parametrize("source", CAST_DTYPES)
def test_cast_to_bool(source):
    values = np.array([0, 1, 0, 3, 0, 0, 1, 7], dtype=source)
    assert_c_matches(unary_model("CAST", values.shape, source, "bool"), [values])


INT_EDGES = {
    "int64": [
        0,
        1,
        -1,
        127,
        128,
        -129,
        255,
        256,
        2**31,
        -(2**31) - 1,
        2**53 + 1,
        2**63 - 1,
        -(2**63),
        16777217,
        -16777217,
        2**40 + 3,
    ],
    "int32": [
        0,
        1,
        -1,
        127,
        128,
        -129,
        255,
        256,
        32768,
        -32769,
        2**31 - 1,
        -(2**31),
        16777217,
        -16777217,
        2**30 + 1,
        65535,
    ],
}


@pytest.mark.parametrize("source", ["int64", "int32"])
@pytest.mark.parametrize("target", CAST_DTYPES)
def test_cast_integer_edges(source, target):
    """Narrowing wraps, int -> float rounds to nearest even, as TFLite's C++ conversions do."""
    values = np.array(INT_EDGES[source], source)
    assert_c_matches(unary_model("CAST", values.shape, source, target), [values])


def test_dequantize_zero_point_outside_the_dtype_is_refused():
    """Both backends would need q - zero_point beyond float32's exact integers: the reader
    refuses such zero points, so runtime_py and the C never see one."""
    b = ModelBuilder()
    x = b.input("x", (3, 4, 2), "int8", [0.1, 0.013, 2.5], [0, 2**25 + 3, -(2**27)])
    y = b.tensor("y", (3, 4, 2), "float32")
    b.op("DEQUANTIZE", [x], [y])
    b.output(y)
    with pytest.raises(ModelError, match="zero point 33554435, outside"):
        parse_model(b.build(), "far.tflite")


# Element-wise ops with the output over the input, as toolchain.ops.overlaps allows.
def c_in_place(model_bytes: bytes, values: list[np.ndarray]) -> np.ndarray:
    """Compile the C with the output moved onto the input: starting at the same byte, or lower
    by the growth when output elements are wider (the elementwise overlap rule)."""
    mp = plan(model_bytes)
    graph = mp.graph
    (x,), (y,) = graph.inputs, graph.outputs
    growth = max(0, graph.tensors[y].nbytes - graph.tensors[x].nbytes)
    files = generate(mp)
    text = files["model.c"]
    for t, offset in ((x, growth), (y, 0)):
        text, n = re.subn(rf"^#define MODEL_T{t} \d+u$", f"#define MODEL_T{t} {offset}u", text,
                          flags=re.M)
        assert n == 1
    files["model.c"] = text
    with CBackend(mp) as backend:
        write_files(files, backend.directory)
        backend.binary = compile_files(backend.directory, "model", ())
        (out,) = backend.invoke(values)
    return out


@pytest.mark.parametrize(
    "opcode, source, target, source_quant, target_quant",
    [
        ("QUANTIZE", "float32", "int8", None, (0.02, -3)),
        ("QUANTIZE", "float32", "int16", None, (1e-4, 0)),
        ("QUANTIZE", "int8", "uint8", (0.05, 3), (0.07, 120)),
        ("QUANTIZE", "uint8", "int16", (0.05, 128), (0.002, 0)),
        ("QUANTIZE", "int32", "int8", (1e-9, 7), (0.05, -3)),
        ("QUANTIZE", "int32", "int16", (1e-6, 0), (0.1, 0)),
        ("DEQUANTIZE", "int8", "float32", (0.05, -3), None),
        ("DEQUANTIZE", "int16", "float32", (3.1e-4, 0), None),
        ("CAST", "int8", "int64", None, None),
        ("CAST", "uint8", "float32", None, None),
        ("CAST", "float32", "int8", None, None),
        ("CAST", "int64", "int16", None, None),
        ("CAST", "int32", "float32", None, None),
    ],
)
def test_elementwise_in_place(opcode, source, target, source_quant, target_quant):
    model = unary_model(opcode, (5, 13), source, target, source_quant, target_quant)
    values = random_inputs(parse_model(model).main, 1)
    (expected,) = ArenaInterpreter(plan(model)).invoke(values)
    np.testing.assert_array_equal(c_in_place(model, values), expected)


def test_dequantize_per_channel_in_place():
    b = ModelBuilder()
    x = b.input("x", (3, 4, 2), "int8", [0.1, 0.013, 2.5], [0, 4, -9])
    y = b.tensor("y", (3, 4, 2), "float32")
    b.op("DEQUANTIZE", [x], [y])
    b.output(y)
    model = b.build()
    values = random_inputs(parse_model(model).main, 2)
    (expected,) = ArenaInterpreter(plan(model)).invoke(values)
    np.testing.assert_array_equal(c_in_place(model, values), expected)


@pytest.mark.parametrize(
    "source, target, source_quant, target_quant",
    [("float32", "int8", None, ([0.1, 0.02, 0.5], [0, 4, -9])),
     ("float32", "int16", None, ([0.1, 0.02, 0.5], [0, 0, 0]))],
)
def test_quantize_per_channel_in_place(source, target, source_quant, target_quant):
    model = per_channel_model((3, 4, 2), source, target, source_quant, target_quant, 0)
    values = random_inputs(parse_model(model).main, 2)
    (expected,) = ArenaInterpreter(plan(model)).invoke(values)
    np.testing.assert_array_equal(c_in_place(model, values), expected)


# Reductions.
@pytest.mark.parametrize("shape, axes, keep_dims", REDUCTIONS[::2])
@pytest.mark.parametrize(
    "dtype, source_quant, target_quant",
    [
        ("int8", (0.05, 3), (0.3, -5)),
        ("int8", (0.1, 0), (0.1, 0)),
        ("int16", (0.001, 0), (0.004, 0)),
    ],
)
def test_sum_int8_int16(shape, axes, keep_dims, dtype, source_quant, target_quant):
    """TFLite Micro is the specification here (see tests/ops/test_reductions.py)."""
    model = reduce_model("SUM", shape, axes, keep_dims, dtype, source_quant, target_quant)
    graph = parse_model(model).main
    for seed in range(2):
        assert_c_matches(model, random_inputs(graph, seed), oracle="tflm")


@pytest.mark.parametrize("opcode", ["REDUCE_MAX", "REDUCE_MIN"])
def test_reduce_extreme_nan_and_infinities(opcode):
    """TFLite starts from -FLT_MAX (FLT_MAX) and NaN never wins. runtime_py's np.max/np.min
    propagate NaN and keep infinities, so only the oracle is compared here."""
    x = np.array(
        [[np.nan, 1, 2], [1, np.nan, 2], [-np.inf] * 3, [np.inf] * 3, [3, -np.inf, 1]], np.float32
    )
    assert_c_matches(reduce_model(opcode, (5, 3), [1], False, "float32"), [x], runtime=False)


@pytest.mark.parametrize("opcode", ["ARG_MAX", "ARG_MIN"])
def test_arg_nan_and_ties(opcode):
    """Ties keep the first index; NaN never wins unless it comes first. TFLite Micro and
    runtime_py scan so along every axis; LiteRT 2.3.0's kernel treats NaN otherwise, and
    differently along the last axis and the others, so it is not the specification here."""
    x = np.array(
        [
            [np.nan, 1, 2, 2],
            [1, np.nan, 2, 2],
            [5, 5, 5, 5],
            [-np.inf, np.inf, 0, 1],
            [2, 1, np.nan, 3],
        ],
        np.float32,
    )
    assert_c_matches(arg_model(opcode, (5, 4), 1, "float32", "int32"), [x], oracle="tflm")
    assert_c_matches(arg_model(opcode, (5, 4), 0, "float32", "int32"), [x], oracle="tflm")


# Trailing kept dimensions of 130 (chunks of 26), 67 (prime: one element at a time, strided)
# and alternating kept and reduced groups.
CHUNKED = [
    ((1, 3, 5, 130), [1, 2], True),
    ((2, 4, 67), [1], False),
    ((3, 4, 5, 6, 7), [0, 2, 4], False),
    ((3, 4, 5, 6, 7), [1, 3], True),
    ((4, 1, 6), [1], False),
]


@pytest.mark.parametrize("shape, axes, keep_dims", CHUNKED)
@pytest.mark.parametrize(
    "opcode, dtype, source_quant, target_quant",
    [
        ("MEAN", "float32", None, None),
        ("SUM", "int32", None, None),
        ("MEAN", "int32", None, None),
        ("MEAN", "int8", (0.05, 3), (0.02, -5)),
        ("REDUCE_MAX", "int8", (0.05, 3), (0.05, 3)),
    ],
)
def test_reduce_layouts(opcode, dtype, source_quant, target_quant, shape, axes, keep_dims):
    assert_matches_oracle(
        reduce_model(opcode, shape, axes, keep_dims, dtype, source_quant, target_quant), inputs=2
    )


@pytest.mark.parametrize("shape, axis", [((1, 3, 3, 130), 3), ((2, 9, 67), 0), ((4, 7, 3), 1)])
def test_arg_layouts(shape, axis):
    assert_matches_oracle(
        arg_model("ARG_MAX", shape, axis, "int8", "int32", quant=(0.1, 0)), inputs=2
    )


def test_collapse():
    assert collapse((1, 5, 7, 3), (1, 2)) == Walk((), (Loop(35, 3),), 3)
    assert collapse((2, 3, 4), (0, 2)) == Walk((Loop(3, 4),), (Loop(2, 12), Loop(4, 1)), 1)
    assert collapse((2, 4, 130), (1,)) == Walk((Loop(2, 520), Loop(5, 26)), (Loop(4, 130),), 26)
    assert collapse((4, 1, 6), (1,)) == Walk((), (), 24)
    assert collapse((2, 3), (0, 1)) == Walk((), (Loop(6, 1),), 1)


# Sanitized builds on random inputs: no undefined behaviour on the paths the ops tests take.
SANITIZED = [
    reduce_model("MEAN", (2, 4, 6, 3), [1, 2], False, "int32"),
    reduce_model("SUM", (2, 3, 4), [0, 2], False, "int32"),
    reduce_model("MEAN", (1, 13, 11, 8), [1, 2], True, "int8", (0.02, 100), (0.5, -128)),
    reduce_model("MEAN", (2, 4, 6, 3), [1, 2], True, "int16", (0.001, 0), (0.0005, 0)),
    reduce_model("REDUCE_MIN", (2, 4, 6, 3), [-1], False, "uint8", (0.02, 128), (0.02, 128)),
    arg_model("ARG_MIN", (2, 9, 5), 1, "uint8", "int64", quant=(0.1, 128)),
    resize_model("RESIZE_BILINEAR", (2, 5, 5, 3), (7, 3), "int8", False, True),
    resize_model("RESIZE_BILINEAR", (1, 3, 3, 4), (10, 11), "float32", True, False),
    resize_model("RESIZE_NEAREST_NEIGHBOR", (1, 6, 7, 2), (1, 13), "int16", False, True),
    unary_model("QUANTIZE", (2, 5, 3), "int16", "int8", (1e-3, 0), (0.2, -7)),
    resize_model("RESIZE_BILINEAR", (2, 5, 5, 3), (7, 3), "int16", False, True),
    resize_model("RESIZE_BILINEAR", (1, 3, 3, 4), (10, 11), "int16", True, False),
    resize_model("RESIZE_BILINEAR", (1, 8, 6, 1), (3, 4), "int16", False, False),
    unary_model("QUANTIZE", (2, 5, 3), "int32", "int16", (2.5e-7, -70000), (0.01, 0)),
    unary_model("QUANTIZE", (2, 5, 3), "uint8", "int16", (0.0123, 7), (0.03, 0)),
    per_channel_model((2, 3, 4), "float32", "uint8", None, ([0.01, 0.05, 0.2], [128, 0, 9]), 1),
]


@pytest.mark.parametrize("index", range(len(SANITIZED)))
def test_sanitized(index):
    model = SANITIZED[index]
    graph = parse_model(model).main
    values = random_inputs(graph, index)
    expected = ArenaInterpreter(plan(model)).invoke(values)
    for e, a in zip(expected, c_outputs(model, values), strict=True):
        if e.dtype == np.float32:
            np.testing.assert_allclose(a, e, rtol=1e-6)
        else:
            np.testing.assert_array_equal(a, e)


def test_generation_is_deterministic():
    for model in SANITIZED[:3] + SANITIZED[6:8]:
        assert generate(plan(model)) == generate(plan(model))
