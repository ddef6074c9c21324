"""SVDF: int8 with an int16 state (LiteRT's kernel), int8 with an int8 state (TFLite Micro's),
float32 (LiteRT's, in its x86 order of additions), bit-exact in runtime_py and in the generated C
over sequences of invokes that carry the state, and again after a reset.

The built models list the state as a second graph output, so the oracle, runtime_py and the C
all report it after every invoke, beside the output.
"""

from __future__ import annotations

import math
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.conftest import SHARED_MODELS
from toolchain.c.generate import generate
from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model, read_model
from toolchain.ir import Graph
from toolchain.lab.c_backend import SANITIZE_FLAGS, compile_files, split_outputs, write_files
from toolchain.lab.check import check_plan
from toolchain.lab.oracle import LiteRTOracle, TFLMOracle
from toolchain.lower.plan import ModelPlan, plan_model
from toolchain.ops import bind, oracle_of
from toolchain.ops.spec import LITERT_REF, TFLM

INVOKES = 6  # invokes without a reset
AGAIN = 3  # invokes after the reset
INT8_STD = 127 / math.sqrt(3)  # of uniform int8 values


# -- models ----------------------------------------------------------------------------------


def svdf_model(state: str = "int16", batches: int = 1, input_size: int = 12, filters: int = 8,
               memory: int = 5, rank: int = 1, bias: bool = True, activation: str = "RELU",
               input_zero_point: int = -3, state_zero_point: int = 0,
               output_zero_point: int = 5, state_std: float | None = None,
               time_magnitude: int | None = None, bias_std: float = 0.5,
               extreme_bias: bool = False, time_dtype: str | None = None, seed: int = 0,
               expose_state: bool = True, version: int = 3) -> bytes:
    """An int8 SVDF with an int16 or int8 state (weights_time of the same type unless
    `time_dtype`). The scales put the state's values at about `state_std` (default: a fifth of
    its range) and the outputs at about 40; the bias at `bias_std` of the time sums' deviation,
    but unit 0's at the top of int32 with `extreme_bias` (its sums wrap)."""
    rng = np.random.default_rng(seed)
    units = filters // rank
    b = ModelBuilder("int8", seed=seed)
    input_scale, feature_scale, time_scale = 0.05, 0.01, 0.003
    x = b.input("x", (batches, input_size), "int8", input_scale, input_zero_point)
    wf = b.const("weights_feature",
                 rng.integers(-127, 128, (filters, input_size)).astype(np.int8), feature_scale, 0)
    wide = state == "int16"
    time_dtype = time_dtype or state
    magnitude = time_magnitude or (32767 if time_dtype == "int16" else 127)
    wt = b.const("weights_time", rng.integers(-magnitude, magnitude + 1, (filters, memory))
                 .astype(time_dtype), time_scale, 0)
    state_std = state_std or (6000 if wide else 25)
    feature_gain = state_std / (math.sqrt(input_size) * INT8_STD * INT8_STD)
    state_scale = input_scale * feature_scale / feature_gain
    time_std = math.sqrt(rank * memory) * max(magnitude / math.sqrt(3), 0.8) * state_std
    output_scale = state_scale * time_scale * time_std / 40
    bias_scale = float(np.float32(state_scale) * np.float32(time_scale))
    spread = max(int(bias_std * time_std), 1)
    biases = rng.integers(-spread, spread + 1, units).astype(np.int32)
    if extreme_bias:
        biases[0] = 2**31 - 1 - spread // 4
    bias_index = b.const("bias", biases, bias_scale, 0) if bias else -1
    s = b.variable("state", np.zeros((batches, filters * memory), state), state_scale,
                   state_zero_point)
    y = b.tensor("y", (batches, units), "int8", output_scale, output_zero_point)
    b.op("SVDF", [x, wf, wt, bias_index, s], [y],
         {"rank": rank, "fused_activation_function": activation}, version=version)
    b.output(y)
    if expose_state:
        b.output(s)
    return b.build()


def float_svdf_model(batches: int = 1, input_size: int = 16, filters: int = 8, memory: int = 4,
                     rank: int = 2, activation: str = "NONE", bias: bool = True, seed: int = 0,
                     expose_state: bool = True, hybrid: bool = False,
                     asymmetric: bool = False) -> bytes:
    """A float32 SVDF; `hybrid` gives it int8 weights (per tensor), LiteRT's hybrid kernel,
    whose input rows are quantized asymmetrically with `asymmetric`."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder("float32", seed=seed)
    x = b.input("x", (batches, input_size), "float32")
    feature = rng.standard_normal((filters, input_size)) / math.sqrt(input_size)
    time = rng.standard_normal((filters, memory)) / math.sqrt(memory * rank)

    def weights(name: str, values: np.ndarray) -> int:
        if not hybrid:
            return b.const(name, values.astype(np.float32))
        scale = float(np.abs(values).max()) / 127
        return b.const(name, np.round(values / scale).astype(np.int8), scale, 0)

    wf = weights("weights_feature", feature)
    wt = weights("weights_time", time)
    bias_index = (b.const("bias", rng.standard_normal(filters // rank).astype(np.float32))
                  if bias else -1)
    s = b.variable("state", np.zeros((batches, filters * memory), "float32"))
    y = b.tensor("y", (batches, filters // rank), "float32")
    b.op("SVDF", [x, wf, wt, bias_index, s], [y],
         {"rank": rank, "fused_activation_function": activation,
          "asymmetric_quantize_inputs": asymmetric})
    b.output(y)
    if expose_state:
        b.output(s)
    return b.build()


# -- running sequences -----------------------------------------------------------------------


def input_sets(graph: Graph, count: int, seed: int = 7) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(count):
        values = []
        for t in graph.inputs:
            tensor = graph.tensors[t]
            if tensor.dtype == "float32":
                values.append(rng.standard_normal(tensor.shape).astype(np.float32))
            else:
                info = np.iinfo(tensor.dtype)
                values.append(rng.integers(info.min, info.max + 1, tensor.shape,
                                           dtype=tensor.dtype))
        sets.append(values)
    return sets


def oracle_sequence(model: bytes, sets: Sequence[Sequence[np.ndarray]], oracle: str,
                    outputs: int) -> list[list[np.ndarray]]:
    """The oracle's outputs on `sets`, one interpreter, no reset between them."""
    interpreter = LiteRTOracle(model) if oracle == LITERT_REF else TFLMOracle(model, outputs)
    return [interpreter.invoke(values) for values in sets]


def runtime_sequence(mp: ModelPlan, sets, reset_after: int) -> list[list[np.ndarray]]:
    runtime = ArenaInterpreter(mp)
    results = []
    for k, values in enumerate(sets):
        if k == reset_after:
            runtime.reset()
        results.append(runtime.invoke(values))
    return results


HARNESS = """/* Test harness: input sets from stdin, the model reset only before set 0 and
 * before set argv[1], so that the state carries from one set to the next. */
#include <stdio.h>
#include <stdlib.h>

#include "model.h"

static const size_t input_bytes[] = {%(inputs)s};
static const size_t output_bytes[] = {%(outputs)s};

int main(int argc, char **argv) {
  const long reset_after = argc > 1 ? atol(argv[1]) : 0;
  long set;
  int i;
  model_reset();
  for (set = 0;; ++set) {
    if (set > 0 && set == reset_after) model_reset();
    for (i = 0; i < MODEL_INPUT_COUNT; ++i) {
      const size_t got = fread(model_input(i), 1, input_bytes[i], stdin);
      if (got == 0 && i == 0 && feof(stdin)) return 0;
      if (got != input_bytes[i]) return 2;
    }
    if (model_invoke() != 0) return 3;
    for (i = 0; i < MODEL_OUTPUT_COUNT; ++i) {
      if (fwrite(model_output(i), 1, output_bytes[i], stdout) != output_bytes[i]) return 4;
    }
  }
}
"""


def c_sequence(mp: ModelPlan, sets, reset_after: int, sanitize: bool = False
               ) -> list[list[np.ndarray]]:
    """The generated C, built with a harness that resets the model only when told."""
    graph = mp.graph
    files = generate(mp, "model")
    files["model_main.c"] = HARNESS % {
        "inputs": ", ".join(str(graph.tensors[t].nbytes) for t in graph.inputs),
        "outputs": ", ".join(str(graph.tensors[t].nbytes) for t in graph.outputs)}
    with tempfile.TemporaryDirectory(prefix="arenac-svdf-") as directory:
        write_files(files, directory)
        binary = compile_files(directory, "model", SANITIZE_FLAGS if sanitize else ())
        stdin = b"".join(np.ascontiguousarray(v).tobytes() for values in sets for v in values)
        result = subprocess.run([binary, str(reset_after)], input=stdin, capture_output=True,
                                timeout=60, check=True)
    return split_outputs(result.stdout, graph, len(sets))


def assert_same(expected: Sequence[Sequence[np.ndarray]], actual, backend: str) -> None:
    """Bit for bit, float bits included."""
    assert len(expected) == len(actual)
    for k, (want, got) in enumerate(zip(expected, actual, strict=True)):
        for j, (e, a) in enumerate(zip(want, got, strict=True)):
            e, a = np.asarray(e), np.asarray(a)
            assert e.shape == a.shape and e.dtype == a.dtype, (backend, k, j)
            same = e.view(np.uint8) == a.view(np.uint8)
            assert same.all(), f"{backend}: invoke {k}, output {j} differs: {a} vs {e}"


def assert_sequence_matches(model: bytes, c: bool = True, sanitize: bool = False) -> list:
    """INVOKES invokes without a reset, then a reset and AGAIN more, in runtime_py and in C,
    against the oracle the registry picks (a fresh interpreter for the part after the reset)."""
    mp = plan_model(parse_model(model, "<built svdf>"), "greedy")
    oracle, _ = oracle_of(mp.program.bindings)
    sets = input_sets(mp.graph, INVOKES)
    sequence = sets + sets[:AGAIN]
    outputs = len(mp.graph.outputs)
    expected = (oracle_sequence(model, sets, oracle, outputs)
                + oracle_sequence(model, sets[:AGAIN], oracle, outputs))
    assert_same(expected, runtime_sequence(mp, sequence, INVOKES), "runtime_py")
    if c:
        assert_same(expected, c_sequence(mp, sequence, INVOKES, sanitize), "c")
    return expected


def assert_state_matters(model: bytes, expected: list[list[np.ndarray]]) -> None:
    """The outputs depend on the state, so a kernel that forgot it, or a reset that did not
    restore it, is caught: the state changes at every invoke, and (with a memory of more than
    one) some invoke's output differs from what the same input gives on a fresh state."""
    states = [run[1] for run in expected[:INVOKES]]
    assert all(not np.array_equal(a, b) for a, b in pairwise(states))
    mp = plan_model(parse_model(model, "<built svdf>"), "greedy")
    sets = input_sets(mp.graph, INVOKES)
    fresh = [ArenaInterpreter(mp).invoke(values)[0] for values in sets[1:]]
    memory = mp.graph.tensors[mp.graph.operators[0].inputs[2]].shape[1]
    if memory > 1:  # a memory of one holds only the newest value, which the output reads
        assert any(not np.array_equal(f, run[0]) for f, run in zip(fresh, expected[1:],
                                                                   strict=True))
    outputs = np.concatenate([run[0].ravel() for run in expected])
    assert np.unique(outputs).size > 4, "(nearly) constant outputs"


# -- int8 with an int16 state: LiteRT ----------------------------------------------------------

INT16_CASES = {
    "rank 1": {},
    "rank 2, input zero point 0": dict(input_size=10, memory=4, rank=2, input_zero_point=0),
    "rank 3, batch 2": dict(batches=2, input_size=7, filters=9, memory=6, rank=3),
    "batch 3, memory 16": dict(batches=3, input_size=16, filters=4, memory=16),
    "output zero point -128": dict(output_zero_point=-128, filters=6),
    "output zero point 60": dict(output_zero_point=60, rank=2, filters=6),
    "saturating state": dict(input_size=20, filters=6, memory=3, state_std=60000),
    "output left shift, int32 sums": dict(filters=4, memory=4, time_magnitude=1, state_std=6,
                                          bias_std=2.0),
    "no bias": dict(batches=2, input_size=9, filters=6, memory=4, rank=2, bias=False),
    "one filter, memory 1": dict(input_size=3, filters=1, memory=1, input_zero_point=100),
    "one unit of rank 4": dict(batches=2, input_size=5, filters=4, memory=3, rank=4),
}


@pytest.mark.parametrize("options", INT16_CASES.values(), ids=INT16_CASES.keys())
def test_int16_state_matches_litert_across_invokes(options):
    model = svdf_model("int16", **options)
    assert oracle_of(plan_model(parse_model(model)).program.bindings)[0] == LITERT_REF
    assert_state_matters(model, assert_sequence_matches(model))


# -- int8 with an int8 state: TFLite Micro -----------------------------------------------------

INT8_CASES = {
    "keyword-like": dict(input_size=16, memory=8, input_zero_point=-7, state_zero_point=-13,
                         output_zero_point=-128),
    "rank 2, batch 2, state wraps": dict(batches=2, rank=2, state_zero_point=37, state_std=60),
    "rank 3, batch 3, zero points 0": dict(batches=3, input_size=7, filters=9, memory=6, rank=3,
                                           input_zero_point=0, output_zero_point=0),
    "state zero point -128, saturating": dict(state_zero_point=-128, state_std=400),
    "zero points 100 and 60": dict(input_zero_point=100, output_zero_point=60,
                                   state_zero_point=5),
    "activation NONE": dict(activation="NONE", state_zero_point=3),
    "one filter, memory 1": dict(input_size=3, filters=1, memory=1, state_zero_point=-20),
    "a bias at the top of int32": dict(extreme_bias=True, state_zero_point=-50, filters=6,
                                       rank=3),
}


@pytest.mark.parametrize("options", INT8_CASES.values(), ids=INT8_CASES.keys())
def test_int8_state_matches_tflm_across_invokes(options):
    model = svdf_model("int8", **options)
    assert oracle_of(plan_model(parse_model(model)).program.bindings)[0] == TFLM
    assert_state_matters(model, assert_sequence_matches(model))


def test_int8_state_wraps_as_tflm_stores_it():
    """New state values near the top of int8 plus a positive zero point wrap to negative."""
    model = svdf_model("int8", state_zero_point=37, state_std=150)
    expected = assert_sequence_matches(model, c=False)
    newest = np.concatenate([run[1].reshape(8, 5)[:, -1] for run in expected])
    # stored values from -128 + 37 up are not wrapped; below, they are (127 + 37 - 256 at most)
    assert (newest == 127 + 37 - 256).any() and (newest < -128 + 37).sum() > 3


# -- float32: LiteRT's order of additions ------------------------------------------------------

FLOAT_CASES = {
    "input 5, rank 1": dict(input_size=5, filters=4, memory=3, rank=1),
    "input 16, rank 2, RELU": dict(activation="RELU"),
    "input 21, rank 3, batch 2": dict(batches=2, input_size=21, filters=9, memory=7, rank=3),
    "input 40, RELU6": dict(input_size=40, filters=6, memory=10, rank=1, activation="RELU6"),
    "input 33, rank 4, no bias": dict(input_size=33, filters=8, memory=5, rank=4, bias=False),
    "rank 5, batch 3, RELU_N1_TO_1": dict(batches=3, input_size=13, filters=10, memory=9, rank=5,
                                         activation="RELU_N1_TO_1"),
    "rank 8, memory 12": dict(input_size=8, filters=16, memory=12, rank=8),
    "one filter, memory 1": dict(input_size=3, filters=1, memory=1, rank=1),
}


@pytest.mark.parametrize("options", FLOAT_CASES.values(), ids=FLOAT_CASES.keys())
def test_float_matches_litert_bit_for_bit_across_invokes(options):
    model = float_svdf_model(**options)
    assert_state_matters(model, assert_sequence_matches(model))


# Hybrid: int8 weights, float input and state. The feature sums are exact integers rescaled,
# the rest is the float kernel's: bit-exact too.
HYBRID_CASES = {
    "symmetric": dict(hybrid=True),
    "asymmetric, batch 2, rank 3": dict(hybrid=True, asymmetric=True, batches=2, input_size=21,
                                        filters=9, memory=7, rank=3),
    "asymmetric, input 40 (8-value rounding blocks), RELU6": dict(
        hybrid=True, asymmetric=True, input_size=40, filters=6, memory=10, rank=1,
        activation="RELU6"),
    "symmetric, batch 3, no bias, RELU": dict(hybrid=True, batches=3, input_size=13, filters=4,
                                              memory=5, rank=2, bias=False, activation="RELU"),
}


@pytest.mark.parametrize("options", HYBRID_CASES.values(), ids=HYBRID_CASES.keys())
def test_hybrid_matches_litert_bit_for_bit_across_invokes(options):
    model = float_svdf_model(**options)
    assert_state_matters(model, assert_sequence_matches(model))


def test_hybrid_plans_its_quantized_row_and_tables_its_weights():
    mp = plan_model(parse_model(float_svdf_model(**HYBRID_CASES["asymmetric, batch 2, rank 3"]),
                                "<built svdf>"), "greedy")
    assert [r.purpose for r, _ in mp.scratch_offsets()] == [
        "the time sums of one batch's filters", "the quantized input row"]
    c = generate(mp, "model")["model.c"]
    assert "static const float model_op0_weights_time[63]" in c
    assert "model_op0_row_sums[f] * zp" in c


def test_c_is_clean_under_sanitizers():
    for model in (svdf_model("int16", batches=2, rank=2), svdf_model("int8", state_zero_point=9),
                  float_svdf_model(batches=2, rank=3, filters=6),
                  float_svdf_model(hybrid=True, asymmetric=True, batches=2)):
        assert_sequence_matches(model, sanitize=True)


# -- the state -------------------------------------------------------------------------------


def test_a_state_that_does_not_persist_or_reset_is_caught():
    """runtime_py reset before every invoke, or never reset, disagrees with the oracle."""
    model = svdf_model("int8", state_zero_point=-13)
    mp = plan_model(parse_model(model, "<built svdf>"), "greedy")
    sets = input_sets(mp.graph, INVOKES)
    expected = oracle_sequence(model, sets, TFLM, 2) + oracle_sequence(model, sets[:AGAIN],
                                                                     TFLM, 2)
    forgetful = ArenaInterpreter(mp)
    forgotten = []
    for values in sets + sets[:AGAIN]:
        forgetful.reset()
        forgotten.append(forgetful.invoke(values))
    with pytest.raises(AssertionError):
        assert_same(expected, forgotten, "runtime_py reset before every invoke")
    with pytest.raises(AssertionError):
        assert_same(expected, runtime_sequence(mp, sets + sets[:AGAIN], -1), "never reset")
    with pytest.raises(AssertionError):
        assert_same(expected, c_sequence(mp, sets + sets[:AGAIN], 0), "c never reset")


def test_state_lives_outside_the_arena_and_resets_to_its_zero_point():
    model = svdf_model("int8", state_zero_point=-50, expose_state=False)
    mp = plan_model(parse_model(model, "<built svdf>"), "greedy")
    offsets, size = mp.state_layout()
    state = mp.graph.operators[0].inputs[4]
    assert state in offsets and size == 48 and state not in mp.offset_of_tensor()
    text = generate(mp, "kw")["kw.c"]
    assert ("memset(kw_state + 0, 206, 40); /* tensor 4 'state' int8[1, 40], its zero point -50"
            " */") in text
    assert "memmove(state, state + 1, 39 * sizeof *state);" in text
    runtime = ArenaInterpreter(mp)
    assert (runtime.views[state] == -50).all()
    runtime.invoke(input_sets(mp.graph, 1)[0])
    assert not (runtime.views[state] == -50).all()
    runtime.reset()
    assert (runtime.views[state] == -50).all()


def test_an_int8_variable_starts_at_its_zero_point_for_every_op():
    """TFLite's interpreters memset an int8 variable to its zero point (an ADD reads it)."""
    b = ModelBuilder("int8")
    x = b.input("x", (1, 4), "int8", 0.1, 0)
    s = b.variable("s", np.zeros((1, 4), "int8"), 0.1, 7)
    y = b.tensor("y", (1, 4), "int8", 0.1, 0)
    b.op("ADD", [x, s], [y], {}, 2)
    b.output(y)
    model = b.build()
    mp = plan_model(parse_model(model, "<built add>"), "greedy")
    sets = input_sets(mp.graph, 2)
    for oracle in (LITERT_REF, TFLM):
        expected = oracle_sequence(model, sets, oracle, 1)
        assert_same(expected, runtime_sequence(mp, sets, -1), "runtime_py")
        assert_same(expected, c_sequence(mp, sets, 0), "c")


# -- the oracle `check` picks ------------------------------------------------------------------


def test_check_compares_int8_states_with_tflm_and_int16_states_with_litert():
    for model, oracle in ((svdf_model("int8", state_zero_point=4), TFLM),
                          (svdf_model("int16"), LITERT_REF), (float_svdf_model(), LITERT_REF)):
        mp = plan_model(parse_model(model, "<built svdf>"), "greedy")
        report = check_plan(mp, model, inputs=3)  # runtime_py carries the state across sets
        assert report.backends[0] == oracle and report.ok


def test_per_layer_check_refuses_a_model_only_tflm_computes():
    from toolchain.errors import RuntimeBackendError
    from toolchain.lab.check import check_layers

    model = svdf_model("int8", state_zero_point=4)
    mp = plan_model(parse_model(model, "<built svdf>"), "greedy")
    with pytest.raises(RuntimeBackendError, match="needs LiteRT's interpreter, whose kernel is "
                                                  "wrong for op 0 SVDF"):
        check_layers(mp, model)


# -- refusals --------------------------------------------------------------------------------


def bind_op(model: bytes):
    graph = parse_model(model, "<built svdf>").main
    return bind(graph, graph.operators[0])


def rewritten(model: bytes, **changes) -> bytes:
    """`model` with fields of its SVDF operator or tensors replaced, through the object API."""
    from toolchain.front.schema import fb

    table = fb.ModelT.InitFromObj(fb.Model.GetRootAs(model, 0))
    graph = table.subgraphs[0]
    for key, value in changes.items():
        kind, _, field = key.partition("__")
        if kind == "op":
            setattr(graph.operators[0], field, value)
        elif kind == "options":
            setattr(graph.operators[0].builtinOptions, field, value)
        else:
            setattr(graph.tensors[int(kind[1:])], field, value)
    import flatbuffers

    builder = flatbuffers.Builder(1024)
    builder.Finish(table.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


PER_CHANNEL = "per-channel"
WRONG_BIAS_SCALE = "wrong bias scale"

# name -> (builder options, or "float" for float_svdf_model's; changes to the file; error;
# what its message says). The state is no graph output here: the op is refused, not the graph.
REFUSALS = {
    "rank 0": ({}, {"options__rank": 0}, ModelError, "rank 0"),
    "filters not a multiple of rank": ({"rank": 2}, {"options__rank": 3}, UnsupportedOpError,
                                       "not a multiple of rank 3"),
    "state not variable": ({}, {"t4__isVariable": False}, ModelError, "not a variable"),
    "weights_feature not constant": ({}, {"t1__buffer": 0}, UnsupportedOpError,
                                     "weights_feature is not a constant"),
    "state of the wrong shape": ({}, {"t4__shape": [1, 39]}, UnsupportedOpError,
                                 "activation state of shape"),
    "output of the wrong shape": ({}, {"t5__shape": [1, 7]}, UnsupportedOpError,
                                  "output of shape"),
    "int16 state with a zero point": ({"state_zero_point": 3}, {}, UnsupportedOpError,
                                      "LiteRT ignores it"),
    "int16 state, activation NONE": ({"activation": "NONE"}, {}, UnsupportedOpError,
                                     "runs only RELU"),
    "int8 state without a bias": ({"state": "int8", "bias": False}, {}, UnsupportedOpError,
                                  "no kernel"),
    "int8 state, wrong bias scale": ({"state": "int8"}, WRONG_BIAS_SCALE, UnsupportedOpError,
                                     "bias scale"),
    "int8 weights_time with an int16 state": ({"time_dtype": "int8"}, {}, UnsupportedOpError,
                                              "no kernel"),
    "per-channel weights_feature": ({}, PER_CHANNEL, UnsupportedOpError, "one positive scale"),
    "float TANH": ("float", {"options__fusedActivationFunction": 4}, UnsupportedOpError,
                   "fused activation TANH"),
    "hybrid, per-channel weights_feature": ("hybrid", PER_CHANNEL, UnsupportedOpError,
                                            "one positive scale"),
    "hybrid, weights_time not constant": ("hybrid", {"t2__buffer": 0}, UnsupportedOpError,
                                          "weights_time is not a constant"),
}


@pytest.mark.parametrize("options, changes, error, message", REFUSALS.values(),
                         ids=REFUSALS.keys())
def test_refusals(options, changes, error, message):
    from toolchain.front.schema import fb

    model = (float_svdf_model(expose_state=False) if options == "float"
             else float_svdf_model(hybrid=True, expose_state=False) if options == "hybrid"
             else svdf_model(**options, expose_state=False))
    if changes == PER_CHANNEL:
        changes = {"t1__quantization": fb.QuantizationParametersT(
            scale=[0.01] * 8, zeroPoint=[0] * 8, quantizedDimension=0)}
    elif changes == WRONG_BIAS_SCALE:
        changes = {"t3__quantization": fb.QuantizationParametersT(scale=[1e-3], zeroPoint=[0])}
    with pytest.raises(error, match=message):
        bind_op(rewritten(model, **changes) if changes else model)


# -- the keyword model (TFLite Micro's int8-state SVDFs) ---------------------------------------

KEYWORD = SHARED_MODELS / "recurrent" / "keyword_scrambled_8bit.tflite"
needs_keyword = pytest.mark.skipif(not KEYWORD.is_file(), reason=f"{KEYWORD} not found")


def tflm_tensors(model: bytes, sets, tensors: Sequence[int]) -> list[dict[int, np.ndarray]]:
    """TFLite Micro keeping every tensor, read after each invoke (no reset between sets)."""
    from tflite_micro.python.tflite_micro import runtime

    interpreter = runtime.Interpreter.from_bytes(
        model, arena_size=1 << 18,
        intrepreter_config=runtime.InterpreterConfig.kPreserveAllTensors)
    found = []
    for values in sets:
        for i, value in enumerate(values):
            interpreter.set_input(value, i)
        interpreter.invoke()
        found.append({t: np.asarray(interpreter.GetTensor(t, 0)["tensor_data"]).copy()
                      for t in tensors})
    return found


def keyword_sets(graph: Graph, count: int) -> list[list[np.ndarray]]:
    """Random int16 inputs over the full range, and speech-like ones of one sign."""
    rng = np.random.default_rng(3)
    shape = graph.tensors[graph.inputs[0]].shape
    return [[rng.integers(-32768, 32768, shape, dtype=np.int16) if k % 2
             else rng.integers(0, 24000, shape, dtype=np.int16)] for k in range(count)]


@needs_keyword
def test_keyword_model_passes_check_against_tflm(capsys):
    from toolchain.cli import main

    assert main(["check", str(KEYWORD), "--inputs", "4"]) == 0
    out = capsys.readouterr().out
    assert "tflm (oracle) vs runtime_py, c" in out and "all backends agree" in out


@needs_keyword
def test_keyword_model_every_layer_and_state_matches_tflm_across_invokes():
    """The final output saturates for every input, so compare what leads to it: every op's
    output and the seven states after each of several invokes, in runtime_py and in the C
    (built for a copy of the graph that lists those tensors as outputs), then after a reset."""
    model = read_model(KEYWORD)
    graph = model.main
    variables = tuple(t.index for t in graph.tensors if t.is_variable)
    written = tuple(t for op in graph.operators for t in op.outputs)
    sets = keyword_sets(graph, INVOKES)
    data = KEYWORD.read_bytes()
    watched = sorted({*written, *variables})
    expected = tflm_tensors(data, sets, watched) + tflm_tensors(data, sets[:AGAIN], watched)

    mp = plan_model(model)
    runtime = ArenaInterpreter(mp)
    for k, values in enumerate(sets + sets[:AGAIN]):
        if k == INVOKES:
            runtime.reset()
        seen: dict[int, np.ndarray] = {}

        def record(op: int, outs: list[np.ndarray], seen=seen) -> None:
            seen.update(zip(graph.operators[op].outputs, outs, strict=True))

        runtime.invoke(values, observe=record)
        seen.update((t, runtime.views[t].copy()) for t in variables)
        for t in watched:
            assert np.array_equal(seen[t].ravel(), expected[k][t].ravel()), (k, t)

    shown = replace(graph, outputs=tuple(dict.fromkeys((*graph.outputs, *written, *variables))))
    wide = plan_model(replace(model, graphs=(shown,)), "greedy")
    c = c_sequence(wide, sets + sets[:AGAIN], INVOKES)
    for k, outputs in enumerate(c):
        for t, value in zip(shown.outputs, outputs, strict=True):
            assert np.array_equal(value.ravel(), expected[k][t].ravel()), (k, t)
    states = [expected[k][variables[1]] for k in range(INVOKES)]
    assert all(not np.array_equal(a, b) for a, b in pairwise(states))


@needs_keyword
def test_keyword_model_needs_tflm_not_litert():
    mp = plan_model(read_model(KEYWORD))
    oracle, bound = oracle_of(mp.program.bindings)
    assert oracle == TFLM and [b.op for b in bound] == [1, 3, 5, 7, 9, 10, 11]
    assert all(b.oracle == LITERT_REF for b in (mp.program.bindings[0].kernel,
                                                mp.program.bindings[2].kernel))


def test_generated_c_reads_as_written_by_hand():
    """No line over the limit, no loop of one trip or none, the same text every time; the
    integer kernels fold the bias into their table and so do not define its array."""
    from tests.test_codegen import style_problems

    models = [svdf_model("int16", **options, expose_state=False)
              for options in INT16_CASES.values()]
    models += [svdf_model("int8", **options, expose_state=False)
               for options in INT8_CASES.values()]
    models += [float_svdf_model(**options, expose_state=False) for options in FLOAT_CASES.values()]
    for model in models:
        mp = plan_model(parse_model(model, "<built svdf>"), "greedy")
        text = generate(mp)["model.c"]
        assert style_problems(text) == [] and generate(mp)["model.c"] == text
        integer = mp.graph.tensors[mp.graph.inputs[0]].dtype == "int8"
        assert ("model_t3[" in text) == (not integer and mp.graph.operators[0].inputs[3] >= 0)
