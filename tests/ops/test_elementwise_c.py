"""The generated C of the elementwise binary ops, beyond what test_elementwise.py checks through
the oracle: extreme values under the sanitizers (int32 wrap-around, INT32_MIN / -1, division
by zero, float infinities and NaNs), every pair of int8 values, in-place operation, the loop
nests and deterministic text."""

from __future__ import annotations

import re
import subprocess
import tempfile

import numpy as np
import pytest

from runtime_py.kernels import KERNELS
from toolchain.c.generate import generate
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import SANITIZE_FLAGS, compile_files, write_files
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import plan_model
from toolchain.ops import prepare_graph
from toolchain.ops.elementwise.emit import Loop, broadcast_loops

PLAIN_OPS = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE")


def ops_model(
    dtype: str,
    ops: dict[str, tuple],
    shape1: tuple,
    shape2: tuple,
    q1: tuple = (None, None),
    q2: tuple = (None, None),
) -> bytes:
    """Every op of `ops` (opcode -> (activation, output quantization)) on the same inputs a, b;
    one output per op, in order."""
    builder = ModelBuilder(dtype="int8" if dtype == "int8" else "float32")
    a = builder.input("a", shape1, dtype, *q1)
    b = builder.input("b", shape2, dtype, *q2)
    for opcode, (activation, q_out) in ops.items():
        out = builder.tensor(opcode.lower(), np.broadcast_shapes(shape1, shape2), dtype, *q_out)
        options = {"fused_activation_function": activation} if activation else None
        builder.op(opcode, [a, b], [out], options, version=2 if dtype == "int8" else 1)
        builder.output(out)
    return builder.build()


def python_outputs(
    model_bytes: bytes, inputs: list[np.ndarray], skip_div: bool = False
) -> list[np.ndarray]:
    """runtime_py's kernels, op by op (each op reads only the model inputs); DIV's output is
    left uninitialized with `skip_div`."""
    graph = parse_model(model_bytes, "<built model>").main
    params = prepare_graph(graph)
    outputs = []
    for index, op in enumerate(graph.operators):
        out = graph.tensors[op.outputs[0]]
        result = np.empty(out.shape, out.dtype)
        if not (skip_div and op.opcode == "DIV"):
            KERNELS[op.opcode](params[index], list(inputs), [result])
        outputs.append(result)
    return outputs


def c_sources(model_bytes: bytes) -> tuple[dict[str, str], object]:
    model = parse_model(model_bytes, "<built model>")
    return generate(plan_model(model), "m"), model.main


def run_c(files: dict[str, str], graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Build with the sanitizers (any undefined behaviour aborts) and run once."""
    with tempfile.TemporaryDirectory(prefix="arenac-ew-") as directory:
        write_files(files, directory)
        binary = compile_files(directory, "m", SANITIZE_FLAGS)
        stdin = b"".join(np.ascontiguousarray(x).tobytes() for x in inputs)
        result = subprocess.run([binary], input=stdin, capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    outputs, position = [], 0
    for t in (graph.tensors[i] for i in graph.outputs):
        outputs.append(
            np.frombuffer(result.stdout, np.dtype(t.dtype), t.num_elements, position).reshape(
                t.shape
            )
        )
        position += t.nbytes
    assert position == len(result.stdout)
    return outputs


def assert_same(expected: np.ndarray, actual: np.ndarray) -> None:
    """Bit for bit; floats too (NaNs only need to be NaNs)."""
    assert expected.shape == actual.shape and expected.dtype == actual.dtype
    if expected.dtype.kind == "f":
        nan = np.isnan(expected)
        np.testing.assert_array_equal(nan, np.isnan(actual))
        np.testing.assert_array_equal(expected[~nan].view(np.uint32), actual[~nan].view(np.uint32))
    else:
        np.testing.assert_array_equal(expected, actual)


def every_pair(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.repeat(values, len(values)), np.tile(values, len(values))


INT32_EXTREMES = np.array(
    [
        -(2**31),
        -(2**31) + 1,
        -65536,
        -46341,
        -1000,
        -7,
        -2,
        -1,
        0,
        1,
        2,
        3,
        7,
        46341,
        65535,
        2**30,
        2**31 - 2,
        2**31 - 1,
    ],
    np.int32,
)


@pytest.mark.parametrize("activation", [None, "RELU6"])
def test_int32_extremes_wrap_without_undefined_behaviour(activation):
    """Sums, products and squares that overflow wrap as in TFLite; INT32_MIN / -1 wraps too."""
    ops = {
        op: (activation if op in ("ADD", "SUB", "MUL", "DIV") else None, (None, None))
        for op in PLAIN_OPS
    }
    a, b = every_pair(INT32_EXTREMES)
    model = ops_model("int32", ops, a.shape, b.shape)
    files, graph = c_sources(model)
    actual = run_c(files, graph, [a, b])
    expected = python_outputs(model, [a, b], skip_div=True)
    div = list(ops).index("DIV")
    nonzero = np.where(b == 0, 1, b).astype(np.int32)  # runtime_py refuses x / 0
    quotient = python_outputs(model, [a, nonzero])[div]
    expected[div] = np.where(b == 0, 0, quotient).astype(np.int32)  # documented: x / 0 = 0
    if activation:
        expected[div] = np.clip(expected[div], 0, 6).astype(np.int32)
    for e, c in zip(expected, actual, strict=True):
        assert_same(e, c)


def test_floor_division_and_modulo_of_int32_extremes():
    """FLOOR_DIV and FLOOR_MOD on every pair of extreme int32 values under the sanitizers: the
    C gives runtime_py's values, x / 0 and x mod 0 give 0 (TFLite refuses a zero divisor),
    INT32_MIN / -1 wraps, and where LiteRT runs (no zero divisor, no INT32_MIN % -1, which
    traps on its x86 build) it gives the same."""
    ops = {"FLOOR_DIV": (None, (None, None)), "FLOOR_MOD": (None, (None, None))}
    a, b = every_pair(INT32_EXTREMES)
    model = ops_model("int32", ops, a.shape, b.shape)
    files, graph = c_sources(model)
    actual = run_c(files, graph, [a, b])
    for e, c in zip(python_outputs(model, [a, b]), actual, strict=True):
        assert_same(e, c)
    assert (actual[0][b == 0] == 0).all() and (actual[1][b == 0] == 0).all()
    assert actual[0][(a == -(2**31)) & (b == -1)].tolist() == [-(2**31)]
    runs = b != 0
    oracle = LiteRTOracle(ops_model("int32", {"FLOOR_DIV": ops["FLOOR_DIV"]}, (runs.sum(),),
                                    (runs.sum(),)))
    (quotient,) = oracle.invoke([a[runs], b[runs]])
    assert_same(quotient, actual[0][runs])
    runs &= ~((a == -(2**31)) & (b == -1))
    oracle = LiteRTOracle(ops_model("int32", {"FLOOR_MOD": ops["FLOOR_MOD"]}, (runs.sum(),),
                                    (runs.sum(),)))
    (remainder,) = oracle.invoke([a[runs], b[runs]])
    assert_same(remainder, actual[1][runs])


FLOAT_EXTREMES = np.array(
    [
        0.0,
        -0.0,
        1e-45,
        -1e-45,
        1.5,
        -2.25,
        1e20,
        -1e20,
        3e38,
        -3e38,
        3.4028235e38,
        np.inf,
        -np.inf,
        np.nan,
    ],
    np.float32,
)


@pytest.mark.parametrize("activation", [None, "RELU_N1_TO_1"])
def test_float_infinities_and_nans(activation):
    ops = {
        op: (activation if op in ("ADD", "SUB", "MUL", "DIV") else None, (None, None))
        for op in PLAIN_OPS
    }
    a, b = every_pair(FLOAT_EXTREMES)
    model = ops_model("float32", ops, a.shape, b.shape)
    files, graph = c_sources(model)
    for e, c in zip(python_outputs(model, [a, b]), run_c(files, graph, [a, b]), strict=True):
        assert_same(e, c)


INT8_QUANTS = [
    ((0.05, -3), (0.02, 10)),
    ((0.003, 127), (0.25, -128)),
    ((0.1, 0), (0.1, 0)),
]
INT8_OUTPUTS = {
    "ADD": ("NONE", (0.07, 2)),
    "SUB": ("RELU", (0.04, -128)),
    "MUL": ("RELU6", (0.0005, -7)),
    "SQUARED_DIFFERENCE": (None, (0.3, -128)),
}


@pytest.mark.parametrize("broadcast", [False, True], ids=["flat", "broadcast"])
@pytest.mark.parametrize("quant", INT8_QUANTS, ids=str)
def test_int8_every_pair_of_values(quant, broadcast):
    """All 65536 input pairs through each int8 pipeline, bit-exact with runtime_py."""
    values = np.arange(-128, 128, dtype=np.int8)
    if broadcast:  # the inner loop hoists the rescaled input1
        a, b = values.reshape(256, 1), values.reshape(1, 256)
    else:
        a, b = every_pair(values)
    model = ops_model("int8", INT8_OUTPUTS, a.shape, b.shape, *quant)
    files, graph = c_sources(model)
    for e, c in zip(python_outputs(model, [a, b]), run_c(files, graph, [a, b]), strict=True):
        assert_same(e, c)


def test_int8_select_every_pair_of_values():
    values = np.arange(-128, 128, dtype=np.int8)
    a, b = every_pair(values)
    q = (0.05, -3)
    model = ops_model("int8", {"MAXIMUM": (None, q), "MINIMUM": (None, q)}, a.shape, b.shape, q, q)
    files, graph = c_sources(model)
    for e, c in zip(python_outputs(model, [a, b]), run_c(files, graph, [a, b]), strict=True):
        assert_same(e, c)


INT16_EXTREMES = np.array(
    [-32768, -32767, -16385, -16384, -2, -1, 0, 1, 2, 3, 5, 6, 7, 16383, 16384, 32766, 32767],
    np.int16,
)
# int16 (scale, zero point) of input1, input2 and each op's (activation, output quantization):
# the power-of-two path with input2 shifted by 0, 3, 15, 16 and 31 bits (from 16 bits every
# value rounds to +-1), and input1 shifted by 1, then the general path and MUL.
INT16_CASES = {
    "pot-no-shift": ((2**-12, 0), (2**-12, 0), {"ADD": (None, (2**-12, 0)),
                                                 "SUB": ("RELU", (2**-12, 0))}),
    "pot-shift-3": ((2**-9, 0), (2**-12, 0), {"ADD": ("RELU6", (2**-9, 0)),
                                               "SUB": ("RELU_N1_TO_1", (2**-9, 0))}),
    "pot-shift-15": ((2**-2, 0), (2**-17, 0), {"ADD": (None, (2**-2, 0)),
                                                "SUB": (None, (2**-2, 0))}),
    "pot-shift-16": ((2**-2, 0), (2**-18, 0), {"ADD": (None, (2**-2, 0)),
                                                "SUB": ("RELU", (2**-2, 0))}),
    "pot-shift-31": ((2**-2, 0), (2**-33, 0), {"ADD": (None, (2**-2, 0)),
                                                "SUB": (None, (2**-2, 0))}),
    "pot-input1-shift": ((2**-13, 0), (2**-12, 0), {"ADD": (None, (2**-12, 0)),
                                                     "SUB": (None, (2**-12, 0))}),
    "general": ((3e-4, 0), (7e-4, 0), {"ADD": (None, (1e-3, 0)), "SUB": ("RELU", (1e-3, 0)),
                                       "MUL": ("RELU6", (5e-3, 0))}),
    "select": ((3e-4, -5), (3e-4, -5), {"MAXIMUM": (None, (3e-4, -5)),
                                        "MINIMUM": (None, (3e-4, -5))}),
}


@pytest.mark.parametrize("broadcast", [False, True], ids=["flat", "broadcast"])
@pytest.mark.parametrize("case", INT16_CASES, ids=str)
def test_int16_extremes(case, broadcast):
    """Every pair of extreme int16 values through each int16 pipeline under the sanitizers,
    bit-exact with runtime_py (ADD's power-of-two path runs flat only)."""
    q1, q2, ops = INT16_CASES[case]
    if broadcast:
        if case.startswith("pot"):
            ops = {op: v for op, v in ops.items() if op != "ADD"}
        a, b = INT16_EXTREMES.reshape(-1, 1), INT16_EXTREMES.reshape(1, -1)
    else:
        a, b = every_pair(INT16_EXTREMES)
    model = ops_model("int16", ops, a.shape, b.shape, q1, q2)
    files, graph = c_sources(model)
    for e, c in zip(python_outputs(model, [a, b]), run_c(files, graph, [a, b]), strict=True):
        assert_same(e, c)


def in_place(text: str, fn: str, operand: str) -> str:
    """The model's C with `fn`'s output placed on its input `operand` ("a0" or "b0"), the model
    output read from there."""
    body = text[text.index(f"static void {fn}(void)") :]
    source = re.search(rf"\*{operand} = (.*);", body).group(1)
    target = re.search(r"\*o0 = (.*);", body).group(1)
    return text.replace(target, source)


@pytest.mark.parametrize(
    "dtype,opcode,shape1,shape2,operand",
    [
        ("int8", "ADD", (2, 3, 8), (2, 3, 8), "a0"),
        ("int8", "SUB", (2, 3, 8), (3, 1), "a0"),
        ("int8", "MUL", (8,), (4, 2, 8), "b0"),
        ("float32", "SQUARED_DIFFERENCE", (5, 1, 7), (5, 3, 7), "b0"),
        ("int32", "MAXIMUM", (2, 1, 3, 1, 2), (2, 4, 3, 5, 2), "b0"),
        ("float32", "DIV", (4, 6), (), "a0"),
        ("int16", "SUB", (2, 3, 8), (3, 1), "a0"),
        ("int16", "ADD", (2, 3, 8), (2, 3, 8), "b0"),
    ],
    ids=str,
)
def test_in_place(dtype, opcode, shape1, shape2, operand):
    """The output may share memory with an input of its shape."""
    quant = {"int8": ((0.05, -3), (0.02, 10), (0.07, 2)),
             "int16": ((2**-10, 0), (2**-12, 0), (2**-10, 0))}.get(dtype, ((None, None),) * 3)
    model = ops_model(dtype, {opcode: (None, quant[2])}, shape1, shape2, *quant[:2])
    files, graph = c_sources(model)
    files["m.c"] = in_place(files["m.c"], f"m_op0_{opcode.lower()}", operand)
    rng = np.random.default_rng(7)
    if dtype == "float32":
        inputs = [rng.standard_normal(s).astype(np.float32) + 3 for s in (shape1, shape2)]
    else:
        info = np.iinfo(dtype)
        inputs = [
            rng.integers(info.min, info.max, s, dtype=dtype, endpoint=True)
            for s in (shape1, shape2)
        ]
    assert_same(python_outputs(model, inputs)[0], run_c(files, graph, inputs)[0])


@pytest.mark.parametrize(
    "shape1,shape2,loops",
    [
        ((2, 3, 4), (2, 3, 4), [Loop(24, 1, 1, 1)]),
        ((1, 4, 4, 3), (3,), [Loop(16, 3, 0, 3), Loop(3, 1, 1, 1)]),
        ((5,), (), [Loop(5, 1, 0, 1)]),
        ((), (2, 3), [Loop(6, 0, 1, 1)]),
        ((), (), [Loop(1, 1, 1, 1)]),
        ((1, 1), (1,), [Loop(1, 1, 1, 1)]),
        ((2, 1, 3), (1, 4, 1), [Loop(2, 3, 0, 12), Loop(4, 0, 1, 3), Loop(3, 1, 0, 1)]),
        ((6, 1, 5, 7), (6, 4, 1, 1), [Loop(6, 35, 4, 140), Loop(4, 0, 1, 35), Loop(35, 1, 0, 1)]),
        ((2, 3, 1, 1), (2, 3, 4, 5), [Loop(6, 1, 20, 20), Loop(20, 0, 1, 1)]),
        ((0, 3), (3,), []),
    ],
)
def test_broadcast_loops(shape1, shape2, loops):
    out = tuple(np.broadcast_shapes(shape1, shape2))
    assert broadcast_loops(shape1, shape2, out) == loops
    assert broadcast_loops(shape2, shape1, out) == [
        Loop(n, sb, sa, so) for n, sa, sb, so in ((x.n, x.sa, x.sb, x.so) for x in loops)
    ]


def test_equal_shapes_are_one_flat_loop():
    model = ops_model("float32", {"ADD": (None, (None, None))}, (2, 3, 4, 5), (2, 3, 4, 5))
    text = c_sources(model)[0]["m.c"]
    body = text[text.index("static void m_op0_add(void)") : text.index("int m_invoke")]
    assert body.count("for (") == 1
    assert "for (int i = 0; i < 120; ++i)" in body


def test_generation_is_deterministic():
    ops = {
        "ADD": ("RELU", (0.07, 2)),
        "MUL": (None, (0.1, 0)),
        "SQUARED_DIFFERENCE": (None, (0.3, -128)),
    }
    model = ops_model("int8", ops, (2, 1, 3), (1, 4, 1), (0.05, -3), (0.02, 10))
    assert c_sources(model)[0] == c_sources(model)[0]


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_empty_output_compiles(dtype):
    """A zero-size output gets an empty kernel and no unused tables (-Werror)."""
    quant = {"int8": ((0.05, -3), (0.02, 10), (0.07, 2))}.get(dtype, ((None, None),) * 3)
    model = ops_model(dtype, {"ADD": (None, quant[2])}, (0, 3), (3,), *quant[:2])
    files = c_sources(model)[0]
    assert "nothing to compute" in files["m.c"] and "_in1[256]" not in files["m.c"]
    with tempfile.TemporaryDirectory(prefix="arenac-ew-") as directory:
        write_files(files, directory)
        compile_files(directory, "m")
