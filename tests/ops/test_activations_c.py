"""The activations' C beyond what tests/ops/test_activations.py reaches through the oracle:
sanitizer builds, every int8 input value, outputs sharing memory with inputs (in place and
partly overlapping), several ops of a kind in one file, and the behaviour chosen where TFLite
aborts.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from runtime_py.kernels import activations as kernels
from tests.conftest import SHARED_MODELS
from tests.opcheck import assert_matches_oracle
from tests.ops.test_activations import (
    L2_OUT,
    SOFTMAX_MODELS,
    SOFTMAX_OUT,
    prelu_model,
    uint8_model,
    unary_model,
)
from toolchain.c.generate import generate
from toolchain.errors import UnsupportedOpError
from toolchain.front import builder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import SANITIZE_FLAGS, CBackend, compile_files, write_files
from toolchain.lab.check import difference, random_inputs
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import ModelPlan, plan_model
from toolchain.ops.activations import emit as emitters
from toolchain.ops.activations.prepare import L2_INT32_SUM_DEPTH

ALL_INT8 = np.arange(-128, 128, dtype=np.int8)


def planned(model: bytes) -> ModelPlan:
    return plan_model(parse_model(model, "<built model>"), "greedy")


def assert_c_matches_runtime(
    model: bytes, input_sets: Sequence[Sequence[np.ndarray]], sanitize: bool = True
) -> None:
    """The compiled C (under ASan and UBSan by default) against runtime_py, set by set."""
    mp = planned(model)
    interpreter = ArenaInterpreter(mp)
    with CBackend(mp, sanitize=sanitize) as backend:
        c_outputs = backend.invoke_many(input_sets)
    for inputs, outputs in zip(input_sets, c_outputs, strict=True):
        for expected, actual in zip(interpreter.invoke(inputs), outputs, strict=True):
            assert difference(expected, actual).mismatches == 0


def chain_model(dtype: str, shape: Sequence[int]) -> bytes:
    """Every activation in one chain, each op's input dying at it (so the planner may put the
    output over it), SOFTMAX, L2_NORMALIZATION and HARD_SWISH twice each (shared helpers)."""
    b = builder.ModelBuilder(dtype)
    q = dtype == "int8"
    x = b.input("x", shape, dtype, *((0.05, 3) if q else (None, None)))
    steps: list[tuple[str, dict, tuple]] = [
        ("LEAKY_RELU", {"alpha": -0.3}, (0.04, -10)),
        ("HARD_SWISH", {}, (0.03, -90)),
        ("PRELU", {}, (0.03, -20)),
        ("RELU6", {}, (6 / 255, -128)),
        ("SOFTMAX", {"beta": 1.5}, SOFTMAX_OUT),
        ("L2_NORMALIZATION", {}, L2_OUT),
        ("TANH", {}, (1 / 128, 0)),
        ("HARD_SWISH", {}, (0.01, -30)),
        ("LOGISTIC", {}, (1 / 256, -128)),
        ("RELU_N1_TO_1", {}, (2 / 255, 0)),
        ("SOFTMAX", {"beta": 0.7}, SOFTMAX_OUT),
        ("RELU", {}, (1 / 256, -128)),
        ("L2_NORMALIZATION", {}, L2_OUT),
    ]
    for k, (opcode, options, out_q) in enumerate(steps):
        y = b.tensor(f"y{k}", shape, dtype, *(out_q if q else (None, None)))
        inputs = [x]
        if opcode == "PRELU":
            alpha = np.random.default_rng(k).uniform(-0.5, 1.0, shape[-1:]).astype(np.float32)
            if q:
                inputs.append(b.const("alpha", np.round(alpha / 0.004).astype(np.int8), 0.004, 0))
            else:
                inputs.append(b.const("alpha", alpha))
        b.op(opcode, inputs, [y], options or None)
        x = y
    b.output(x)
    return b.build()


@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("shape", [(3, 24), (2, 2, 5)])
def test_chain_matches_oracle(dtype, shape):
    assert_matches_oracle(chain_model(dtype, shape), inputs=4)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_chain_clean_under_sanitizers(dtype):
    model = chain_model(dtype, (3, 24))
    graph = parse_model(model, "<built model>").main
    assert_c_matches_runtime(model, [random_inputs(graph, seed) for seed in range(3)])


# int16 steps of a chain: (opcode, options, output quantization); every int16 zero point is 0.
INT16_STEPS: dict[str, tuple[dict, tuple[float, int]]] = {
    "LOGISTIC": ({}, (2**-15, 0)),
    "TANH": ({}, (2**-15, 0)),
    "SOFTMAX": ({"beta": 1.0}, (2**-15, 0)),
    "PRELU": ({}, (2e-4, 0)),
    "LEAKY_RELU": ({"alpha": 0.2}, (3e-4, 0)),
    "RELU6": ({}, (6 / 32767, 0)),
}


def int16_chain_model(shape: Sequence[int], steps: Sequence[str]) -> bytes:
    """int16 activations in a chain from an input of scale 1e-4, each op's input dying at it;
    PRELU with a per-channel int8 alpha."""
    b = builder.ModelBuilder("float32")
    x = b.input("x", shape, "int16", 1e-4, 0)
    for k, opcode in enumerate(steps):
        options, out_q = INT16_STEPS[opcode]
        y = b.tensor(f"y{k}", shape, "int16", *out_q)
        inputs = [x]
        if opcode == "PRELU":
            alpha = np.random.default_rng(k).integers(-128, 128, shape[-1:], dtype=np.int8)
            inputs.append(b.const(f"alpha{k}", alpha, 0.005, 3))
        b.op(opcode, inputs, [y], options or None)
        x = y
    b.output(x)
    return b.build()


INT16_CHAIN = ["TANH", "PRELU", "LOGISTIC", "SOFTMAX", "TANH", "LEAKY_RELU", "SOFTMAX",
               "LOGISTIC", "RELU6"]


@pytest.mark.parametrize("shape", [(3, 24), (2, 2, 5)])
def test_int16_chain_matches_oracle(shape):
    assert_matches_oracle(int16_chain_model(shape, INT16_CHAIN), inputs=3)


def test_int16_chain_clean_under_sanitizers():
    """The tables, the same for every op, and the shared helpers defined once."""
    model = int16_chain_model((3, 24), INT16_CHAIN)
    source = generate(planned(model), "m")["m.c"]
    for definition in ("static const uint16_t arenac_sigmoid_table[",
                       "static const int16_t arenac_softmax_exp[",
                       "static inline int arenac_clz32(uint32_t x)"):
        assert source.count(definition) == 1
    graph = parse_model(model, "<built model>").main
    assert_c_matches_runtime(model, [random_inputs(graph, seed) for seed in range(3)])


def run_overlapped(model: bytes, inputs: Sequence[np.ndarray], below: int, tmp_path) -> np.ndarray:
    """Run a one-op model's C (sanitized) with its output placed `below` bytes under the start of
    its input, by rewriting the generated offset macros: the planner is not asked."""
    mp = planned(model)
    graph = mp.graph
    (x,), (y,) = graph.inputs, graph.outputs
    x_bytes, y_bytes = graph.tensors[x].nbytes, graph.tensors[y].nbytes
    files = generate(mp, "m")
    source = files["m.c"]
    for t, offset in ((x, below), (y, 0)):
        source, n = re.subn(
            rf"^#define M_T{t} \d+u$", f"#define M_T{t} {offset}u", source, flags=re.MULTILINE
        )
        assert n == 1
    arena = max(below + x_bytes, y_bytes)
    source, n = re.subn(
        r"static uint8_t m_arena\[\d+\]", f"static uint8_t m_arena[{arena}]", source
    )
    assert n == 1
    write_files({**files, "m.c": source}, str(tmp_path))
    binary = compile_files(str(tmp_path), "m", SANITIZE_FLAGS)
    stdin = b"".join(np.ascontiguousarray(v).tobytes() for v in inputs)
    out = subprocess.run([binary], input=stdin, capture_output=True, check=True).stdout
    t = graph.tensors[y]
    return np.frombuffer(out, np.dtype(t.dtype)).reshape(t.shape)


# One-op models whose C must allow its output at or below its input (toolchain.ops.overlaps).
OVERLAP_MODELS = {
    "int8_relu": lambda: unary_model("RELU", "int8", (4, 32), (0.05, -20), (0.03, -128)),
    "int8_tanh": lambda: unary_model("TANH", "int8", (4, 32), (0.05, 3), (1 / 128, 0)),
    "int8_leaky": lambda: unary_model(
        "LEAKY_RELU", "int8", (4, 32), (0.1, 10), (0.07, 100), {"alpha": -0.5}
    ),
    "int8_hard_swish": lambda: unary_model("HARD_SWISH", "int8", (4, 32), (0.05, 3), (0.03, -100)),
    "int8_softmax": lambda: unary_model(
        "SOFTMAX", "int8", (4, 32), (0.1, 0), SOFTMAX_OUT, {"beta": 1.0}
    ),
    "int8_l2": lambda: unary_model("L2_NORMALIZATION", "int8", (4, 32), (0.05, 3), L2_OUT),
    "int8_prelu": lambda: prelu_model(
        "int8", (4, 32), (32,), True, (0.05, 3), (0.004, -30), (0.03, -60)
    ),
    "float_logistic": lambda: unary_model("LOGISTIC", "float32", (4, 32)),
    "float_softmax": lambda: unary_model("SOFTMAX", "float32", (4, 32), options={"beta": 1.0}),
    "float_l2": lambda: unary_model("L2_NORMALIZATION", "float32", (4, 32)),
    "float_prelu": lambda: prelu_model("float32", (4, 32), (1, 32)),
    "int16_logistic": lambda: uint8_model("LOGISTIC", (4, 32), (10 / 32767, 0), (2**-15, 0),
                                          dtype="int16"),
    "int16_tanh": lambda: uint8_model("TANH", (4, 32), (2**-11, 0), (2**-15, 0), dtype="int16"),
    "int16_softmax": lambda: uint8_model("SOFTMAX", (4, 32), (1e-4, 0), (2**-15, 0),
                                         {"beta": 1.0}, dtype="int16"),
    "int16_prelu": lambda: int16_chain_model((4, 32), ["PRELU"]),
}


@pytest.mark.parametrize("elements_below", [0, 1, 7, 32, 127])
@pytest.mark.parametrize("name", sorted(OVERLAP_MODELS))
def test_output_at_or_below_its_input(name, elements_below, tmp_path):
    """In place, and partly overlapping from one element to all but one: rows of SOFTMAX and
    L2_NORMALIZATION are read whole before written, elements read before written."""
    model = OVERLAP_MODELS[name]()
    graph = parse_model(model, "<built model>").main
    inputs = random_inputs(graph, seed=1)
    expected = ArenaInterpreter(planned(model)).invoke(inputs)[0]
    below = elements_below * graph.tensors[graph.inputs[0]].nbytes // 128
    actual = run_overlapped(model, inputs, below, tmp_path)
    assert difference(expected, actual).mismatches == 0


def test_shared_helpers_are_defined_once_per_file():
    """Two of each op kind here need the gemmlowp helpers: the file defines each helper once,
    ahead of every kernel, and nothing it does not call."""
    source = generate(planned(chain_model("int8", (3, 24))), "m")["m.c"]
    first_kernel = source.index("static void m_op")
    for helper in ["arenac_clz32(uint32_t x)", "arenac_sat_shl(int32_t x, int exponent)"]:
        assert source.count(f"static inline int {helper}" if "clz" in helper
                            else f"static inline int32_t {helper}") == 1, helper
        assert source.index(helper) < first_kernel
    assert "#ifndef ARENAC_HELPERS" not in source
    assert source.count("static const int8_t m_op") == 2  # the LOGISTIC and TANH tables
    float_source = generate(planned(chain_model("float32", (3, 24))), "m")["m.c"]
    assert "arenac_clz32" not in float_source


def test_generation_is_deterministic():
    model = chain_model("int8", (3, 24))
    assert generate(planned(model), "m") == generate(planned(model), "m")


# (opcode, input quantization, output quantization, options) of the elementwise int8 ops.
INT8_ELEMENTWISE = [
    ("RELU", (0.05, -20), (0.03, -128), None),
    ("RELU6", (0.1, -7), (0.03, -128), None),
    ("RELU_N1_TO_1", (0.01, -50), (0.004, 3), None),
    ("LOGISTIC", (0.0787, 100), (1 / 256, -64), None),
    ("TANH", (0.004, -3), (0.0095, -9), None),
    ("LEAKY_RELU", (0.1, 10), (0.07, 100), {"alpha": -0.5}),
    ("LEAKY_RELU", (0.05, 3), (0.03, -60), {"alpha": 1.5}),
    ("HARD_SWISH", (0.002, -10), (0.001, -50), None),
    ("HARD_SWISH", (0.5, -20), (0.4, -127), None),
    ("HARD_SWISH", (40.0, 0), (30.0, 0), None),
    ("HARD_SWISH", (20000.0, 0), (15000.0, 0), None),  # reluish pre-shift 20, capped at 16
]


@pytest.mark.parametrize("opcode, input_q, output_q, options", INT8_ELEMENTWISE)
def test_int8_elementwise_every_input_value(opcode, input_q, output_q, options):
    model = unary_model(opcode, "int8", (256,), input_q, output_q, options)
    assert_c_matches_runtime(model, [[ALL_INT8], [ALL_INT8[::-1].copy()]])
    assert_matches_oracle(model)


@pytest.mark.parametrize("input_q, beta", [((0.1, 0), 1.0), ((1.0, 0), 100.0), ((0.004, 0), 0.05)])
def test_int8_softmax_every_difference(input_q, beta):
    """Rows holding every int8 value: each difference to the max from 0 to -255 once."""
    model = unary_model("SOFTMAX", "int8", (2, 256), input_q, SOFTMAX_OUT, {"beta": beta})
    rows = np.stack([ALL_INT8, np.roll(ALL_INT8, 77)])
    assert_c_matches_runtime(model, [[rows]])
    assert_matches_oracle(model)


def test_int8_softmax_wide_rows_sum_in_64_bits():
    """5000 classes: an int32 sum of Q12.19 terms could overflow, the C sums in int64."""
    model = unary_model("SOFTMAX", "int8", (1, 5000), (0.1, 0), SOFTMAX_OUT, {"beta": 1.0})
    assert "int64_t sum = 0;" in generate(planned(model), "m")["m.c"]
    assert_matches_oracle(model, inputs=2)


def test_int8_softmax_row_summing_to_512_is_all_lowest():
    """Where TFLite aborts (and runtime_py raises), the C gives -128 for the whole row; other
    rows are untouched by that choice."""
    model = unary_model("SOFTMAX", "int8", (2, 512), (0.1, 0), SOFTMAX_OUT, {"beta": 1.0})
    rows = np.zeros((2, 512), np.int8)
    rows[1, 0] = 127  # one dominant class: an ordinary row
    with CBackend(planned(model), sanitize=True) as backend:
        out = backend.invoke([rows])[0]
    assert (out[0] == -128).all()
    expected = np.full(512, -128, np.int8)
    expected[0] = 127
    assert out[1].tolist() == expected.tolist()


def test_int8_l2_normalization_refuses_depths_whose_sum_could_overflow():
    model = unary_model(
        "L2_NORMALIZATION", "int8", (1, L2_INT32_SUM_DEPTH + 1), (0.05, 0), L2_OUT
    )
    with pytest.raises(UnsupportedOpError, match="could overflow"):
        generate(planned(model), "m")


def test_logistic_cutoffs_are_runtime_py_constants():
    assert np.float32(emitters.LOGISTIC_CUTOFF_HIGH) == kernels.LOGISTIC_CUTOFF_HIGH
    assert np.float32(emitters.LOGISTIC_CUTOFF_LOW) == kernels.LOGISTIC_CUTOFF_LOW


@pytest.mark.parametrize("opcode", ["LOGISTIC", "TANH", "HARD_SWISH", "RELU", "LEAKY_RELU"])
def test_float_elementwise_edges(opcode):
    """Around the logistic cutoffs and the hard swish knees, and at large magnitudes."""
    values = np.array(
        [
            -1e30,
            -100,
            -9.0001,
            -9,
            -8.9999,
            -3.0001,
            -3,
            -2.9999,
            -1e-30,
            0,
            1e-30,
            2.9999,
            3,
            3.0001,
            16.619,
            16.619047164916992188,
            16.62,
            100,
            1e30,
        ],
        dtype=np.float32,
    )
    options = {"alpha": 0.2} if opcode == "LEAKY_RELU" else None
    model = unary_model(opcode, "float32", values.shape, options=options)
    assert_c_matches_runtime(model, [[values]])


@pytest.mark.parametrize("name", SOFTMAX_MODELS)
def test_real_model_softmax_in_c_on_oracle_tensors(name):
    """Each real model's int8 SOFTMAX, alone in a model with its quantization and beta, compiled
    and fed the tensors TFLite computed in front of it: TFLite's outputs, bit for bit."""
    path = SHARED_MODELS / f"{name}.tflite"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    model = path.read_bytes()
    graph = parse_model(model, str(path)).main
    oracle = LiteRTOracle(model, preserve_all_tensors=True)
    for op in (op for op in graph.operators if op.opcode == "SOFTMAX"):
        x, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
        quant = [(t.quantization.scale[0], t.quantization.zero_point[0]) for t in (x, y)]
        alone = unary_model(
            "SOFTMAX", "int8", x.shape, *quant, {"beta": op.options.get("beta", 1.0)}
        )
        sets = []
        for seed in range(3):
            oracle.invoke(random_inputs(graph, seed))
            sets.append(([oracle.tensor(x.index)], oracle.tensor(y.index)))
        with CBackend(planned(alone), sanitize=True) as backend:
            outputs = backend.invoke_many([inputs for inputs, _ in sets])
        for (_, expected), (actual,) in zip(sets, outputs, strict=True):
            assert difference(expected, actual).mismatches == 0, f"{name} op {op.index}"
