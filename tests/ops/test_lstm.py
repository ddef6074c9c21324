"""UNIDIRECTIONAL_SEQUENCE_LSTM against LiteRT's reference kernel, over sequences of invokes that
carry the output and cell state (and across a reset): integer (int8 with an int16 cell state)
bit-exact in runtime_py and in the generated C, float32 within the check's tolerance."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from runtime_py.kernels.lstm import logistic16, tanh16
from tests.conftest import SHARED_MODELS
from tests.opcheck import assert_matches_oracle
from tests.test_codegen import style_problems
from toolchain.c.generate import generate
from toolchain.cli import main
from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab import qemu_backend
from toolchain.lab.c_backend import SANITIZE_FLAGS, compile_files, split_outputs, write_files
from toolchain.lab.check import difference
from toolchain.lab.oracle import LiteRTOracle, TFLMOracle
from toolchain.lab.qemu_backend import QemuBackend
from toolchain.lower.plan import plan_model
from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier as mbqm
from toolchain.numerics.fixedpoint import rounding_divide_by_pot as rdbpot
from toolchain.numerics.quant import quantize_multiplier
from toolchain.ops import oracle_of, prepare_graph
from toolchain.ops.spec import TFLM

GATES = ("input", "forget", "cell", "output")


@dataclass(frozen=True)
class Lstm:
    """One LSTM layer to build: sizes, variants and scales. `output` is n_output with a
    projection (n_cell without)."""

    batch: int = 1
    time: int = 5
    n_input: int = 6
    n_cell: int = 5
    output: int | None = None
    time_major: bool = False
    cifg: bool = False
    peephole: bool = False
    layer_norm: bool = False
    projection: bool = False
    projection_bias: bool = True
    cell_clip: float = 0.0
    proj_clip: float = 0.0
    activation: str = "TANH"
    dtype: str = "int8"
    seed: int = 0
    # int8 only
    input_quant: tuple[float, int] = (1 / 64, -10)
    weight_scale: float = 0.02
    bias_magnitude: int = 3000
    hidden_quant: tuple[float, int] = (1 / 128, 0)
    state_quant: tuple[float, int] | None = None  # the output state's; the hidden's by default
    cell_scale: float = 2.0**-12
    gate_scale: float = 2.0**-10  # the intermediates' scale with layer norm
    extra: dict = field(default_factory=dict)
    # LSTM: the older op, one step of [batch, n_input] per invoke (`time` is then ignored)
    opcode: str = "UNIDIRECTIONAL_SEQUENCE_LSTM"

    @property
    def n_output(self) -> int:
        return self.output if self.projection and self.output else self.n_cell

    @property
    def input_shape(self) -> tuple[int, ...]:
        if self.opcode == "LSTM":
            return self.batch, self.n_input
        if self.time_major:
            return self.time, self.batch, self.n_input
        return self.batch, self.time, self.n_input

    def but(self, **changes) -> Lstm:
        return replace(self, **changes)


@dataclass(frozen=True)
class Built:
    """The model and the indices of its input, output and state tensors."""

    data: bytes
    x: int
    y: int
    output_state: int
    cell_state: int


def lstm_model(cfg: Lstm, inputs: int = 24) -> Built:
    """An LSTM layer whose whole output sequence is the model's output. A `hybrid` dtype is
    float32 activations with int8 weights (per tensor, symmetric)."""
    if cfg.dtype in ("float32", "hybrid"):
        return _float_model(cfg, inputs)
    return _int8_model(cfg, inputs)


def _int8_model(cfg: Lstm, n_inputs: int) -> Built:
    rng = np.random.default_rng(cfg.seed)
    b = ModelBuilder("int8", seed=cfg.seed)
    c, o = cfg.n_cell, cfg.n_output
    in_scale, in_zp = cfg.input_quant
    hidden_scale, hidden_zp = cfg.hidden_quant
    state_scale, state_zp = cfg.state_quant or cfg.hidden_quant
    x = b.input("x", cfg.input_shape, "int8", in_scale, in_zp)
    ids = [-1] * 24
    ids[0] = x
    for k, gate in enumerate(GATES):
        if cfg.cifg and gate == "input":
            continue
        s_in, s_rec = cfg.weight_scale * (1 + 0.1 * k), cfg.weight_scale * (1.3 - 0.1 * k)
        ids[1 + k] = b.const(f"{gate}_input_weights",
                             rng.integers(-127, 128, (c, cfg.n_input)).astype(np.int8), s_in, 0)
        ids[5 + k] = b.const(f"{gate}_recurrent_weights",
                             rng.integers(-127, 128, (c, o)).astype(np.int8), s_rec, 0)
        magnitude = cfg.bias_magnitude
        ids[12 + k] = b.const(f"{gate}_bias", rng.integers(-magnitude, magnitude + 1, c)
                              .astype(np.int32), in_scale * s_in, 0)
        if cfg.layer_norm:
            ids[20 + k] = b.const(f"{gate}_norm", rng.integers(8000, 24000, c).astype(np.int16),
                                  2.0**-14, 0)
    if cfg.peephole:
        for k, gate in ((9, "input"), (10, "forget"), (11, "output")):
            if not (cfg.cifg and gate == "input"):
                ids[k] = b.const(f"{gate}_peephole",
                                 rng.integers(-20000, 20001, c).astype(np.int16), 1e-4, 0)
    if cfg.projection:
        ids[16] = b.const("projection", rng.integers(-127, 128, (o, c)).astype(np.int8), 0.01, 0)
        if cfg.projection_bias:
            ids[17] = b.const("projection_bias", rng.integers(-2000, 2001, o).astype(np.int32),
                              hidden_scale * 0.01, 0)
    h = b.variable("output_state", np.zeros((cfg.batch, o), "int8"), state_scale, state_zp)
    cs = b.variable("cell_state", np.zeros((cfg.batch, c), "int16"), cfg.cell_scale, 0)
    ids[18], ids[19] = h, cs
    intermediates = []
    for k, gate in enumerate(GATES):
        if cfg.layer_norm:
            intermediates.append(b.tensor(f"{gate}_intermediate", (0,), "int16",
                                          cfg.gate_scale * (1 + 0.05 * k), 0))
        else:
            intermediates.append(b.tensor(f"{gate}_intermediate", (0,), "float32"))
    intermediates.append(b.tensor("hidden_intermediate", (0,), "int8", hidden_scale, hidden_zp))
    y_shape = (*cfg.input_shape[:-1], o)
    y = b.tensor("y", y_shape, "int8", state_scale, state_zp)
    b.op(cfg.opcode, ids[:n_inputs], [y], _options(cfg))
    b.intermediates(cfg.extra.get("intermediates", intermediates))
    b.output(y)
    return Built(b.build(), x, y, h, cs)


def _float_model(cfg: Lstm, n_inputs: int) -> Built:
    rng = np.random.default_rng(cfg.seed)
    b = ModelBuilder("float32")
    c, o = cfg.n_cell, cfg.n_output
    x = b.input("x", cfg.input_shape, "float32")
    ids = [-1] * 24
    ids[0] = x

    def normal(*shape: int, scale: float = 0.4) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def weights(name: str, values: np.ndarray) -> int:
        if cfg.dtype != "hybrid":
            return b.const(name, values)
        scale = float(np.abs(values).max()) / 127
        return b.const(name, np.round(values / scale).astype(np.int8), scale, 0)

    for k, gate in enumerate(GATES):
        if cfg.cifg and gate == "input":
            continue
        ids[1 + k] = weights(f"{gate}_input_weights", normal(c, cfg.n_input))
        ids[5 + k] = weights(f"{gate}_recurrent_weights", normal(c, o))
        ids[12 + k] = b.const(f"{gate}_bias", normal(c, scale=0.3))
        if cfg.layer_norm:
            ids[20 + k] = b.const(f"{gate}_norm", 1 + normal(c, scale=0.2))
    if cfg.peephole:
        for k, gate in ((9, "input"), (10, "forget"), (11, "output")):
            if not (cfg.cifg and gate == "input"):
                ids[k] = weights(f"{gate}_peephole", normal(c, scale=0.3))
    if cfg.projection:
        ids[16] = weights("projection", normal(o, c))
        if cfg.projection_bias:
            ids[17] = b.const("projection_bias", normal(o, scale=0.1))
    h = b.variable("output_state", np.zeros((cfg.batch, o), "float32"))
    cs = b.variable("cell_state", np.zeros((cfg.batch, c), "float32"))
    ids[18], ids[19] = h, cs
    y = b.tensor("y", (*cfg.input_shape[:-1], o), "float32")
    b.op(cfg.opcode, ids[:n_inputs], [y], _options(cfg))
    b.output(y)
    return Built(b.build(), x, y, h, cs)


def _options(cfg: Lstm) -> dict:
    layout = {"kernel_type": "FULL"} if cfg.opcode == "LSTM" else {"time_major": cfg.time_major}
    return {"fused_activation_function": cfg.activation, "cell_clip": cfg.cell_clip,
            "proj_clip": cfg.proj_clip, **layout,
            **{k: v for k, v in cfg.extra.items() if k != "intermediates"}}


# -- running sequences of invokes ----------------------------------------------------------


def input_sets(cfg: Lstm, count: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if cfg.dtype in ("float32", "hybrid"):
        return [rng.standard_normal(cfg.input_shape).astype(np.float32) for _ in range(count)]
    return [rng.integers(-128, 128, cfg.input_shape).astype(np.int8) for _ in range(count)]


def model_inputs(value) -> list[np.ndarray]:
    """One invoke's inputs: an array for a model of one input, or a list of arrays."""
    return list(value) if isinstance(value, list) else [value]


def oracle_sequence(model: bytes, inputs: Sequence, resets: Sequence[bool],
                    states: Sequence[int] = ()) -> list[list[np.ndarray]]:
    """LiteRT's outputs (then the `states` tensors: variables, or any tensor LiteRT keeps)
    invoke after invoke; its variables are reset before invoke k where resets[k]. Each of
    `inputs` is one invoke's (model_inputs)."""
    oracle = LiteRTOracle(model, preserve_all_tensors=True)
    results = []
    for value, reset in zip(inputs, resets, strict=True):
        if reset:
            oracle.interpreter.reset_all_variables()
        results.append([*oracle.invoke(model_inputs(value)),
                        *(oracle.tensor(t) for t in states)])
    return results


def runtime_sequence(mp, inputs, resets, states: Sequence[int] = ()) -> list[list[np.ndarray]]:
    """runtime_py's, alike: `states` are variables or op outputs."""
    runtime = ArenaInterpreter(mp)
    written: dict[int, np.ndarray] = {}

    def observe(op: int, outputs: list[np.ndarray]) -> None:
        written.update(zip(mp.graph.operators[op].outputs, outputs, strict=True))

    results = []
    for value, reset in zip(inputs, resets, strict=True):
        if reset:
            runtime.reset()
        outputs = runtime.invoke(model_inputs(value), observe)
        results.append([*outputs, *(written.get(t, runtime.views[t]).copy() for t in states)])
    return results


# The stock host harness resets the state before every input set; this one resets only when
# told to (a byte 'r' instead of 'c' ahead of the set), so the state carries between sets.
SEQUENCE_HARNESS = """#include <stdio.h>

#include "model.h"

static const size_t input_bytes[] = {%(inputs)s};
static const size_t output_bytes[] = {%(outputs)s};

int main(void) {
  int command;
  model_reset();
  while ((command = getchar()) != EOF) {
    int i;
    if (command == 'r') model_reset();
    for (i = 0; i < MODEL_INPUT_COUNT; ++i) {
      if (fread(model_input(i), 1, input_bytes[i], stdin) != input_bytes[i]) return 2;
    }
    if (model_invoke() != 0) return 3;
    for (i = 0; i < MODEL_OUTPUT_COUNT; ++i) {
      if (fwrite(model_output(i), 1, output_bytes[i], stdout) != output_bytes[i]) return 4;
    }
  }
  return 0;
}
"""


def c_sequence(mp, inputs, resets, sanitize: bool = False) -> list[list[np.ndarray]]:
    """The generated C, built with a harness that keeps the state between input sets."""
    graph = mp.graph
    files = generate(mp, "model")
    files["model_main.c"] = SEQUENCE_HARNESS % {
        "inputs": ", ".join(str(graph.tensors[t].nbytes) for t in graph.inputs),
        "outputs": ", ".join(str(graph.tensors[t].nbytes) for t in graph.outputs)}
    with tempfile.TemporaryDirectory(prefix="arenac-lstm-") as directory:
        write_files(files, directory)
        binary = compile_files(directory, "model", SANITIZE_FLAGS if sanitize else ())
        stdin = b"".join((b"r" if reset else b"c")
                         + b"".join(np.ascontiguousarray(v).tobytes() for v in model_inputs(value))
                         for value, reset in zip(inputs, resets, strict=True))
        result = subprocess.run([binary], input=stdin, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return split_outputs(result.stdout, graph, len(inputs))


def assert_same(expected: list[list[np.ndarray]], actual: list[list[np.ndarray]],
                what: str) -> None:
    for k, (want, got) in enumerate(zip(expected, actual, strict=True)):
        for n, (e, a) in enumerate(zip(want, got, strict=True)):
            d = difference(e, a)
            assert d.mismatches == 0, f"{what}, invoke {k}, value {n}: {d}"


# Four invokes carrying the state, a reset, two more.
RESETS = (False, False, False, False, True, False, False)


def assert_sequence_matches(cfg: Lstm, c: bool = True, sanitize: bool = False,
                            resets: Sequence[bool] = RESETS) -> None:
    """runtime_py (outputs and both states) and the C (outputs) against LiteRT over invokes
    that carry the state, across a reset."""
    built = lstm_model(cfg)
    mp = plan_model(parse_model(built.data, "<built model>"), "greedy")
    values = input_sets(cfg, len(resets))
    states = (built.output_state, built.cell_state)
    expected = oracle_sequence(built.data, values, resets, states)
    outputs = np.concatenate([row[0].ravel() for row in expected])
    assert np.unique(outputs).size > 4, "(nearly) constant outputs"
    assert_same(expected, runtime_sequence(mp, values, resets, states), "runtime_py")
    if c:
        outputs = [row[:1] for row in expected]
        assert_same(outputs, c_sequence(mp, values, resets, sanitize), "C")


# -- integer LSTM ----------------------------------------------------------------------------

BASE = Lstm()
INTEGER_CASES = {
    "full gates, cell clip": BASE.but(time=6, n_input=7, cell_clip=10.0),
    "batch 2": BASE.but(batch=2, time=4),
    "time-major, batch 3": BASE.but(batch=3, time=4, n_input=5, n_cell=4, time_major=True),
    "input zero point 17, state zero point 5": BASE.but(input_quant=(0.02, 17),
                                                         hidden_quant=(0.01, 5)),
    "cell clip 0.7": BASE.but(time=8, cell_clip=0.7, bias_magnitude=9000),
    "cell scale 2^-9": BASE.but(cell_scale=2.0**-9, bias_magnitude=8000),
    "cell scale 2^-11": BASE.but(cell_scale=2.0**-11, bias_magnitude=8000),
    "cell scale 2^-15": BASE.but(cell_scale=2.0**-15),
    "saturating gates": BASE.but(n_input=9, n_cell=6, weight_scale=0.2),
    "CIFG": BASE.but(cifg=True),
    "peephole": BASE.but(peephole=True),
    "CIFG, peephole, batch 2": BASE.but(batch=2, cifg=True, peephole=True),
    "projection": BASE.but(n_cell=6, projection=True, output=4, state_quant=(0.03, -3)),
    "projection without bias, clip": BASE.but(
        n_cell=6, projection=True, output=4, state_quant=(0.01, 2), projection_bias=False,
        proj_clip=0.5),
    "projection, hidden zero point 4": BASE.but(
        n_input=5, n_cell=6, projection=True, output=3, hidden_quant=(1 / 128, 4),
        state_quant=(0.02, 0)),
    "layer norm": BASE.but(n_cell=8, layer_norm=True),
    "layer norm, CIFG, batch 2": BASE.but(batch=2, n_cell=8, layer_norm=True, cifg=True),
    "layer norm over 6 cells": BASE.but(n_cell=6, layer_norm=True),
    "layer norm, peephole, projection": BASE.but(
        n_cell=8, layer_norm=True, peephole=True, projection=True, output=8,
        state_quant=(0.02, 0)),
    "peephole, projection to fewer outputs": BASE.but(
        n_cell=6, peephole=True, projection=True, output=4, state_quant=(0.03, 0)),
    "time-major, every variant": BASE.but(
        batch=2, time=3, n_cell=8, cifg=True, peephole=True, projection=True, output=5,
        layer_norm=True, state_quant=(0.03, 4), time_major=True, cell_clip=1.0, proj_clip=0.8),
    "activation NONE (LiteRT: tanh)": BASE.but(activation="NONE"),
    "activation RELU (LiteRT: tanh)": BASE.but(activation="RELU", batch=2, time_major=True),
}


@pytest.mark.parametrize("cfg", INTEGER_CASES.values(), ids=INTEGER_CASES.keys())
def test_integer_lstm_carries_its_state_bit_exactly(cfg):
    assert_sequence_matches(cfg)


# -- float32 LSTM ----------------------------------------------------------------------------

FLOAT = Lstm(dtype="float32")
FLOAT_CASES = {
    "full gates": FLOAT,
    "batch 2, cell clip": FLOAT.but(batch=2, n_input=16, n_cell=12, cell_clip=1.5),
    "CIFG": FLOAT.but(cifg=True, n_input=9, n_cell=8),
    "time-major, CIFG, peephole, RELU": FLOAT.but(batch=3, time_major=True, peephole=True,
                                                  cifg=True, activation="RELU"),
    "peephole, projection, layer norm, clips": FLOAT.but(
        batch=2, peephole=True, projection=True, output=3, layer_norm=True, proj_clip=0.3,
        cell_clip=0.8),
    "projection without bias, RELU6": FLOAT.but(projection=True, output=7,
                                                projection_bias=False, activation="RELU6"),
    "time-major, layer norm, RELU_N1_TO_1": FLOAT.but(batch=2, time_major=True,
                                                      layer_norm=True,
                                                      activation="RELU_N1_TO_1"),
}


@pytest.mark.parametrize("cfg", FLOAT_CASES.values(), ids=FLOAT_CASES.keys())
def test_float_lstm_carries_its_state_within_tolerance(cfg):
    assert_sequence_matches(cfg)


# -- hybrid LSTM -------------------------------------------------------------------------------
# float32 activations, int8 weights: LiteRT's EvalHybrid, within the float tolerance.

HYBRID = Lstm(dtype="hybrid")
ASYMMETRIC = {"asymmetric_quantize_inputs": True}
HYBRID_CASES = {
    "symmetric": HYBRID,
    "asymmetric, batch 2": HYBRID.but(batch=2, extra=ASYMMETRIC),
    "time-major, CIFG, peephole, batch 3": HYBRID.but(batch=3, time_major=True, cifg=True,
                                                      peephole=True),
    "asymmetric, 16 inputs, 9 cells (8-value rounding blocks)": HYBRID.but(
        n_input=16, n_cell=9, extra=ASYMMETRIC, cell_clip=1.2),
    "peephole, projection, layer norm, clips, asymmetric, time-major": HYBRID.but(
        batch=2, time_major=True, peephole=True, projection=True, output=3, layer_norm=True,
        proj_clip=0.3, cell_clip=0.8, extra=ASYMMETRIC),
    "projection without bias, RELU6": HYBRID.but(projection=True, output=7,
                                                 projection_bias=False, activation="RELU6"),
    "the LSTM op, asymmetric, batch 2": HYBRID.but(opcode="LSTM", batch=2, extra=ASYMMETRIC),
}


@pytest.mark.parametrize("cfg", HYBRID_CASES.values(), ids=HYBRID_CASES.keys())
def test_hybrid_lstm_carries_its_state_within_tolerance(cfg):
    assert_sequence_matches(cfg)


def test_hybrid_lstm_plans_its_quantized_rows_as_scratch():
    cfg = HYBRID_CASES["peephole, projection, layer norm, clips, asymmetric, time-major"]
    mp = plan_model(parse_model(lstm_model(cfg).data, "<built model>"), "greedy")
    purposes = [request.purpose for request, _ in mp.scratch_offsets()]
    assert purposes[-7:] == ["the quantized input", "the input rows' scales",
                             "the input rows' zero points", "the quantized output state",
                             "the output state rows' scales",
                             "the output state rows' zero points",
                             "the quantized hidden values"]
    c = generate(mp, "model")["model.c"]
    assert style_problems(c) == []
    assert "static void model_op0_quantize_6(" in c and "_row_sums[" in c


def test_hybrid_lstm_refuses_per_channel_weights():
    graph = parse_model(lstm_model(HYBRID).data, "<built model>").main
    weights = graph.operators[0].inputs[2]
    quant = graph.tensors[weights].quantization
    per_channel = replace(quant, scale=(*quant.scale,) * 5, zero_point=(0,) * 5)
    graph = replace(graph, tensors=tuple(replace(t, quantization=per_channel)
                                         if t.index == weights else t for t in graph.tensors))
    with pytest.raises(UnsupportedOpError, match="per channel"):
        prepare_graph(graph)


def test_asymmetric_hybrid_lstm_refuses_weights_computed_at_run_time():
    """The row sums are taken at prepare: the weights must be constants."""
    graph = parse_model(lstm_model(HYBRID.but(extra=ASYMMETRIC)).data, "<built model>").main
    weights = graph.operators[0].inputs[6]
    graph = replace(graph, tensors=tuple(replace(t, data=None) if t.index == weights else t
                                         for t in graph.tensors))
    with pytest.raises(UnsupportedOpError, match="not a constant"):
        prepare_graph(graph)


# -- the LSTM op ------------------------------------------------------------------------------
# Its FULL kernel is the same cell over one time step of [batch, n_input] per invoke: the state
# carries the sequence from invoke to invoke.

STEP = BASE.but(opcode="LSTM")
STEP_CASES = {
    "int8, batch 2": STEP.but(batch=2),
    "int8, one row, cell clip": STEP.but(cell_clip=0.7, bias_magnitude=9000),
    "int8, CIFG, peephole, batch 3": STEP.but(batch=3, cifg=True, peephole=True),
    "int8, layer norm, peephole, projection": STEP.but(
        batch=2, n_cell=8, layer_norm=True, peephole=True, projection=True, output=5,
        state_quant=(0.03, 2), proj_clip=0.8),
    "float32, batch 2": STEP.but(dtype="float32", batch=2),
    "float32, CIFG, layer norm, projection, clips": STEP.but(
        dtype="float32", batch=3, cifg=True, layer_norm=True, projection=True, output=4,
        cell_clip=0.9, proj_clip=0.5, activation="RELU6"),
}


@pytest.mark.parametrize("cfg", STEP_CASES.values(), ids=STEP_CASES.keys())
def test_lstm_op_carries_its_state_across_invokes(cfg):
    assert_sequence_matches(cfg)


def test_lstm_op_with_twenty_inputs_matches_litert():
    cfg = STEP.but(batch=2, n_cell=6)
    built = lstm_model(cfg, inputs=20)
    mp = plan_model(parse_model(built.data, "<built model>"), "greedy")
    values = input_sets(cfg, len(RESETS))
    expected = oracle_sequence(built.data, values, RESETS, (built.output_state, built.cell_state))
    assert_same(expected, runtime_sequence(mp, values, RESETS,
                                           (built.output_state, built.cell_state)), "runtime_py")
    assert_same([row[:1] for row in expected], c_sequence(mp, values, RESETS), "C")


def basic_model(batch: int = 2, n_input: int = 3, depth: int = 4, seed: int = 0,
                variables: bool = True) -> tuple[bytes, int, int]:
    """The LSTM op's BASIC kernel (float32) with its activation and state as outputs; the
    model, and the previous activation's and state's tensors."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder("float32")
    x = b.input("x", (batch, n_input), "float32")
    state = b.variable if variables else b.input
    h = state("previous_activation", np.zeros((batch, depth), "float32")) if variables else \
        b.input("previous_activation", (batch, depth), "float32")
    w = b.const("weights", (rng.standard_normal((4 * depth, n_input + depth)) * 0.5)
                .astype(np.float32))
    bias = b.const("bias", (rng.standard_normal(4 * depth) * 0.3).astype(np.float32))
    c = state("previous_state", np.zeros((batch, depth), "float32")) if variables else \
        b.input("previous_state", (batch, depth), "float32")
    outputs = [b.tensor("activation", (batch, depth), "float32"),
               b.tensor("state", (batch, depth), "float32"),
               b.tensor("concat", (batch, n_input + depth), "float32"),
               b.tensor("gates", (batch, 4 * depth), "float32")]
    b.op("LSTM", [x, h, w, bias, c], outputs,
         {"kernel_type": "BASIC", "fused_activation_function": "TANH"}, version=2)
    b.output(outputs[0])
    b.output(outputs[1])
    return b.build(), h, c


@pytest.mark.parametrize("batch, n_input, depth", [(2, 3, 4), (1, 7, 5), (3, 1, 1)])
def test_lstm_op_basic_kernel_carries_its_state_within_tolerance(batch, n_input, depth):
    data, h, c = basic_model(batch, n_input, depth)
    mp = plan_model(parse_model(data, "<built model>"), "greedy")
    rng = np.random.default_rng(5)
    values = [rng.standard_normal((batch, n_input)).astype(np.float32) for _ in RESETS]
    expected = oracle_sequence(data, values, RESETS, (h, c))
    assert np.unique(np.concatenate([row[0].ravel() for row in expected])).size > 4
    assert_same(expected, runtime_sequence(mp, values, RESETS, (h, c)), "runtime_py")
    assert_same([row[:2] for row in expected], c_sequence(mp, values, RESETS), "C")
    assert style_problems(generate(mp, "model")["model.c"]) == []


def test_lstm_op_refuses_a_basic_state_that_is_not_a_variable():
    data, _, _ = basic_model(variables=False)
    assert_refused(data, "not a variable tensor")


def test_lstm_op_refuses_the_basic_kernel_in_full_form_and_sequences():
    basic = lstm_model(STEP.but(extra={"kernel_type": "BASIC"})).data
    assert_refused(basic, "takes 5 and writes 4", ModelError)
    b = ModelBuilder("int8")
    ids = [-1] * 24
    ids[0] = b.input("x", (1, 2, 3), "int8", 0.1, 0)
    for k in range(1, 5):
        ids[k] = b.const(f"w{k}", np.ones((2, 3), np.int8), 0.1, 0)
        ids[k + 4] = b.const(f"r{k}", np.ones((2, 2), np.int8), 0.1, 0)
        ids[k + 11] = b.const(f"b{k}", np.zeros(2, np.int32), 0.01, 0)
    ids[18] = b.variable("h", np.zeros((1, 2), "int8"), 0.01, 0)
    ids[19] = b.variable("c", np.zeros((1, 2), "int16"), 2.0**-12, 0)
    y = b.tensor("y", (1, 2, 2), "int8", 0.01, 0)
    b.op("LSTM", ids, [y], {"kernel_type": "FULL"})
    b.intermediates([b.tensor(f"i{k}", (0,), "int8", 0.01, 0) for k in range(5)])
    b.output(y)
    assert_refused(b.build(), "rank 3")


def test_lstm_op_refuses_the_8x8_8_integer_kernel():
    graph = parse_model(lstm_model(STEP.but(batch=2)).data, "<built model>").main
    op12 = replace(graph.operators[0], intermediates=tuple(range(12)))
    with pytest.raises(UnsupportedOpError, match="8x8_8"):
        prepare_graph(replace(graph, operators=(op12,)))


# -- the state ----------------------------------------------------------------------------------


def test_the_state_changes_the_outputs_so_the_tests_can_see_it():
    """Resetting before every invoke (what a lost state amounts to) gives other outputs than
    LiteRT's carried state, in runtime_py and in the C: the sequence tests would catch it."""
    cfg = INTEGER_CASES["batch 2"]
    built = lstm_model(cfg)
    mp = plan_model(parse_model(built.data, "<built model>"), "greedy")
    values = input_sets(cfg, 3)
    carried = oracle_sequence(built.data, values, (False,) * 3)
    always_reset = (True,) * 3
    assert_same(carried[:1], runtime_sequence(mp, values[:1], always_reset[:1]), "invoke 0")
    for backend in (runtime_sequence(mp, values, always_reset),
                    c_sequence(mp, values, always_reset)):
        for k in (1, 2):
            assert difference(carried[k][0], backend[k][0]).mismatches > 0


def test_the_state_lives_outside_the_arena_and_only_its_reset_clears_it():
    cfg = INTEGER_CASES["CIFG, peephole, batch 2"]
    built = lstm_model(cfg)
    mp = plan_model(parse_model(built.data, "<built model>"), "greedy")
    offsets, state_bytes = mp.state_layout()
    assert {built.output_state, built.cell_state} <= set(offsets)
    assert built.output_state not in mp.offset_of_tensor()
    runtime = ArenaInterpreter(mp)
    runtime.invoke(input_sets(cfg, 1))
    assert runtime.views[built.cell_state].any()
    runtime.reset()
    assert not runtime.views[built.cell_state].any()
    c = generate(mp, "model")["model.c"]
    assert f"static uint8_t model_state[{state_bytes}];" in c
    assert "(int16_t *)(model_state + " in c


def test_gate_buffers_are_scratch_planned_in_the_arena():
    for cfg, purposes in (
            (INTEGER_CASES["full gates, cell clip"],
             ["the input gate", "the forget gate, then the output gate", "the cell gate"]),
            (INTEGER_CASES["projection"],
             ["the input gate", "the forget gate, then the output gate", "the cell gate",
              "the hidden values before the projection"]),
            (INTEGER_CASES["time-major, batch 3"],
             ["the input gate", "the forget gate, then the output gate", "the cell gate"]),
            (FLOAT_CASES["CIFG"], ["the forget gate, then the output gate", "the cell gate"])):
        built = lstm_model(cfg)
        mp = plan_model(parse_model(built.data, "<built model>"), "greedy")
        scratch = mp.scratch_offsets()
        assert [request.purpose for request, _ in scratch] == purposes
        rows = cfg.batch if cfg.time_major else 1  # the batch rows of one step
        element = 4 if cfg.dtype == "float32" else 2
        assert scratch[0][0].size == rows * cfg.n_cell * element
        c = generate(mp, "model")["model.c"]
        assert c.count("(model_arena + MODEL_OP0_SCRATCH") == len(purposes)
        assert c.count("(model_arena + MODEL_") >= len(purposes) + 2


# -- refusals -------------------------------------------------------------------------------


def assert_refused(model: bytes, reason: str, error=UnsupportedOpError) -> None:
    with pytest.raises(error, match=reason) as caught:
        prepare_graph(parse_model(model, "<built model>").main)
    assert type(caught.value) is error


@pytest.mark.parametrize("scale, reason", [
    (3e-4, "not a power of two"), (2.0**-16, "2\\^-16"), (2.0**-8, "2\\^-8")])
def test_refuses_cell_scales_litert_mishandles(scale, reason):
    assert_refused(lstm_model(BASE.but(cell_scale=scale)).data, reason)


def test_refuses_without_the_five_intermediates():
    intermediates = {"intermediates": []}
    assert_refused(lstm_model(BASE.but(extra=intermediates)).data, "5", ModelError)


def unquantized(data: bytes, position: int):
    """The main graph with the op's intermediate `position` stripped of its quantization."""
    graph = parse_model(data, "<built model>").main
    t = graph.operators[0].intermediates[position]
    return replace(graph, tensors=tuple(replace(x, quantization=None) if x.index == t else x
                                        for x in graph.tensors))


def test_refuses_unquantized_intermediates():
    """LiteRT's prepare would leave the multipliers at zero, and the op output zeros."""
    with pytest.raises(UnsupportedOpError, match="hidden intermediate"):
        prepare_graph(unquantized(lstm_model(BASE).data, 4))
    prepare_graph(unquantized(lstm_model(BASE).data, 0))  # read with layer norm only
    with pytest.raises(UnsupportedOpError, match="intermediate 0"):
        prepare_graph(unquantized(lstm_model(BASE.but(layer_norm=True)).data, 0))


def test_refuses_peepholes_past_the_cell_state():
    cfg = BASE.but(peephole=True, projection=True, output=7, state_quant=(0.03, 0))
    assert_refused(lstm_model(cfg).data, "reads past the cell state")


def test_refuses_per_channel_weights():
    b = ModelBuilder("int8")
    x = b.input("x", (1, 2, 3), "int8", 0.1, 0)
    ids = [-1] * 24
    ids[0] = x
    for k in range(1, 5):
        ids[k] = b.const(f"w{k}", np.ones((2, 3), np.int8), [0.1, 0.2], [0, 0])
        ids[k + 4] = b.const(f"r{k}", np.ones((2, 2), np.int8), 0.1, 0)
        ids[k + 11] = b.const(f"b{k}", np.zeros(2, np.int32), 0.01, 0)
    ids[18] = b.variable("h", np.zeros((1, 2), "int8"), 0.01, 0)
    ids[19] = b.variable("c", np.zeros((1, 2), "int16"), 2.0**-12, 0)
    y = b.tensor("y", (1, 2, 2), "int8", 0.01, 0)
    b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ids, [y], {"time_major": False})
    b.intermediates([b.tensor(f"i{k}", (0,), "int8", 0.01, 0) for k in range(5)])
    b.output(y)
    assert_refused(b.build(), "per channel")


def test_refuses_weights_computed_at_run_time():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 2, 3), "int8", 0.1, 0)
    w = b.input("w", (2, 3), "int8", 0.1, 0)
    ids = [-1] * 24
    ids[0] = x
    for k in range(1, 5):
        ids[k] = w
        ids[k + 4] = b.const(f"r{k}", np.ones((2, 2), np.int8), 0.1, 0)
        ids[k + 11] = b.const(f"b{k}", np.zeros(2, np.int32), 0.01, 0)
    ids[18] = b.variable("h", np.zeros((1, 2), "int8"), 0.01, 0)
    ids[19] = b.variable("c", np.zeros((1, 2), "int16"), 2.0**-12, 0)
    y = b.tensor("y", (1, 2, 2), "int8", 0.01, 0)
    b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ids, [y], {"time_major": False})
    b.intermediates([b.tensor(f"i{k}", (0,), "int8", 0.01, 0) for k in range(5)])
    b.output(y)
    assert_refused(b.build(), "not a constant")


def test_refuses_what_litert_would_overflow_on():
    assert_refused(lstm_model(BASE.but(weight_scale=300.0)).data, "overflow")


def test_refuses_float_activation_none():
    assert_refused(lstm_model(FLOAT.but(activation="NONE")).data, "NONE")


def test_refuses_diagonal_recurrent_weights():
    cfg = BASE.but(extra={"diagonal_recurrent_tensors": True})
    assert_refused(lstm_model(cfg).data, "diagonal")


def int16x8_model() -> bytes:
    """int16 activations and cell state, int8 weights, int64 biases: TFLite Micro's int16x8
    LSTM, which LiteRT's reference kernel refuses at prepare."""
    b = ModelBuilder("int8")
    ids = [-1] * 24
    ids[0] = b.input("x", (1, 3, 3), "int16", 1e-3, 0)
    for k in range(1, 5):
        ids[k] = b.const(f"w{k}", np.ones((2, 3), np.int8), 0.01, 0)
        ids[k + 4] = b.const(f"r{k}", np.ones((2, 2), np.int8), 0.01, 0)
        ids[k + 11] = b.const(f"b{k}", np.zeros(2, np.int64), 1e-5, 0)
    ids[18] = b.variable("h", np.zeros((1, 2), "int16"), 1e-3, 0)
    ids[19] = b.variable("c", np.zeros((1, 2), "int16"), 2.0**-11, 0)
    y = b.tensor("y", (1, 3, 2), "int16", 1e-3, 0)
    b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ids, [y], {"fused_activation_function": "TANH"})
    b.intermediates([b.tensor(f"i{k}", (0,), "int16", 1e-3, 0) for k in range(5)])
    b.output(y)
    return b.build()


def test_int16_activations_which_litert_cannot_prepare_follow_tflite_micro():
    """int16x8: LiteRT's prepare refuses it, so TFLite Micro's kernel and interpreter are the
    ones to match (tests/ops/test_lstm_int16.py)."""
    data = int16x8_model()
    with pytest.raises(RuntimeError, match="FLOAT32"):
        LiteRTOracle(data)
    bindings = plan_model(parse_model(data, "<built model>")).program.bindings
    assert oracle_of(bindings)[0] == TFLM


def test_refuses_uint8_hybrid_weights():
    """float32 input with uint8 weights is LiteRT's older hybrid kernel: no kernel here."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 2, 3), "float32")
    ids = [-1] * 24
    ids[0] = x
    for k in range(1, 5):
        ids[k] = b.const(f"w{k}", np.full((2, 3), 130, np.uint8), 0.1, 128)
        ids[k + 4] = b.const(f"r{k}", np.full((2, 2), 130, np.uint8), 0.1, 128)
        ids[k + 11] = b.const(f"b{k}", np.zeros(2, np.float32))
    ids[18] = b.variable("h", np.zeros((1, 2), "float32"))
    ids[19] = b.variable("c", np.zeros((1, 2), "float32"))
    y = b.tensor("y", (1, 2, 2), "float32")
    b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ids, [y], {"fused_activation_function": "TANH"})
    b.output(y)
    assert_refused(b.build(), "no kernel")


def test_refuses_models_litert_cannot_prepare():
    assert_refused(lstm_model(BASE, inputs=21).data, "20 or 24", ModelError)
    data = lstm_model(BASE).data
    model = parse_model(data, "<built model>")
    op = model.main.operators[0]
    stateless = replace(model.main, tensors=tuple(
        replace(t, is_variable=False) if t.index == op.inputs[18] else t
        for t in model.main.tensors))
    with pytest.raises(ModelError, match="not a variable"):
        prepare_graph(stateless)


def test_a_refused_lstm_is_one_line_naming_the_file(tmp_path, capsys):
    path = tmp_path / "lstm.tflite"
    path.write_bytes(lstm_model(BASE.but(cell_scale=2.0**-16)).data)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "2^-16" in err


# -- the trained model ------------------------------------------------------------------------

REAL_MODEL = SHARED_MODELS / "recurrent" / "trained_lstm_int8.tflite"
needs_real_model = pytest.mark.skipif(not REAL_MODEL.is_file(),
                                      reason=f"{REAL_MODEL} not found")


def digits() -> dict[str, np.ndarray]:
    """28x28 int8 images the trained model tells apart (random ones all saturate to one
    class, whatever the state)."""
    blank = np.full((1, 28, 28), -128, np.int8)
    seven = blank.copy()
    seven[0, 5, 6:22] = 127
    for row in range(6, 24):
        seven[0, row, 21 - (row - 6) // 2] = 127
    zero = blank.copy()
    rows, cols = np.mgrid[0:28, 0:28]
    ring = np.abs(np.hypot(rows - 14, (cols - 14) * 1.4) - 8) < 1.5
    zero[0][ring] = 127
    one = blank.copy()
    one[0, 4:24, 13:16] = 127
    return {"seven": seven, "zero": zero, "one": one}


@needs_real_model
def test_real_model_checks_on_runtime_py_and_c(capsys):
    assert main(["check", str(REAL_MODEL)]) == 0
    assert "all backends agree" in capsys.readouterr().out


@needs_real_model
def test_real_model_carries_its_state_across_invokes():
    """The trained model over invokes that keep the state, and after a reset: its LSTM output
    sequence and both states in runtime_py, its class scores in the C, all bit-exact."""
    data = REAL_MODEL.read_bytes()
    mp = plan_model(parse_model(data, str(REAL_MODEL)), "greedy")
    lstm = mp.graph.operators[0]
    watched = (lstm.outputs[0], lstm.inputs[18], lstm.inputs[19])
    images = digits()
    values = [images[k] for k in ("seven", "seven", "zero", "one", "seven", "seven", "zero")]
    resets = (False, False, False, False, True, False, False)
    expected = oracle_sequence(data, values, resets, watched)
    assert difference(expected[0][0], expected[1][0]).mismatches > 0, "the state shows"
    assert_same(expected, runtime_sequence(mp, values, resets, watched), "runtime_py")
    assert_same([row[:1] for row in expected], c_sequence(mp, values, resets), "C")


@needs_real_model
def test_real_model_follows_litert_where_tflite_micro_differs():
    """LiteRT is the oracle: TFLite Micro's integer LSTM is another algorithm (int16 sigmoid
    and tanh from tables, double rounding in the cell update), and its class scores part from
    LiteRT's after a few invokes of this sequence."""
    pytest.importorskip("tflite_micro")
    data = REAL_MODEL.read_bytes()
    images = digits()
    values = [images[k] for k in ("seven", "seven", "zero", "one", "seven", "seven")]
    litert = oracle_sequence(data, values, (False,) * len(values))
    mp = plan_model(parse_model(data, str(REAL_MODEL)), "greedy")
    assert_same(litert, runtime_sequence(mp, values, (False,) * len(values)), "runtime_py")
    tflm = TFLMOracle(data, 1)
    differing = [k for k, value in enumerate(values)
                 if difference(litert[k][0], tflm.invoke([value])[0]).mismatches]
    assert differing and differing[0] > 0


# -- the generated C --------------------------------------------------------------------------

SANITIZED = ("layer norm, peephole, projection", "time-major, every variant",
             "CIFG, peephole, batch 2")


@pytest.mark.parametrize("name", SANITIZED)
def test_c_is_clean_under_sanitizers(name):
    assert_sequence_matches(INTEGER_CASES[name], sanitize=True, resets=RESETS[:5])


def test_float_c_is_clean_under_sanitizers():
    cfg = FLOAT_CASES["peephole, projection, layer norm, clips"]
    assert_sequence_matches(cfg, sanitize=True, resets=RESETS[:5])


def test_generated_c_reads_like_careful_hand_written_c():
    for name, cfg in {**INTEGER_CASES, **FLOAT_CASES, **HYBRID_CASES, **STEP_CASES}.items():
        mp = plan_model(parse_model(lstm_model(cfg).data, "lstm.tflite"), "greedy")
        for file_name, text in generate(mp, "m").items():
            assert style_problems(text) == [], f"{name}: {file_name}"


def test_two_integer_lstms_in_one_file_keep_their_own_helpers():
    """Each op's fixed-point helpers carry its prefix: a second LSTM compiles beside the first."""
    b = ModelBuilder("int8")
    x = b.input("x", (1, 3, 4), "int8", 1 / 64, 0)
    rng = np.random.default_rng(3)
    previous = x
    for layer in range(2):
        ins = [-1] * 24
        ins[0] = previous
        depth = 4 if layer == 0 else 5
        for k in range(4):
            ins[1 + k] = b.const(f"w{layer}{k}", rng.integers(-127, 128, (5, depth))
                                 .astype(np.int8), 0.02, 0)
            ins[5 + k] = b.const(f"r{layer}{k}", rng.integers(-127, 128, (5, 5))
                                 .astype(np.int8), 0.02, 0)
            ins[12 + k] = b.const(f"b{layer}{k}", rng.integers(-3000, 3000, 5)
                                  .astype(np.int32), 0.02 / 64, 0)
        ins[18] = b.variable(f"h{layer}", np.zeros((1, 5), "int8"), 1 / 128, 0)
        ins[19] = b.variable(f"c{layer}", np.zeros((1, 5), "int16"), 2.0**-12, 0)
        y = b.tensor(f"y{layer}", (1, 3, 5), "int8", 1 / 128, 0)
        b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ins, [y], {"fused_activation_function": "TANH"})
        b.intermediates([*(b.tensor(f"i{layer}{k}", (0,), "float32") for k in range(4)),
                         b.tensor(f"hidden{layer}", (0,), "int8", 1 / 128, 0)])
        previous = y
    b.output(previous)
    data = b.build()
    mp = plan_model(parse_model(data, "<built model>"), "greedy")
    c = generate(mp, "model")["model.c"]
    assert "model_op0_logistic" in c and "model_op1_logistic" in c
    values = [np.random.default_rng(k).integers(-128, 128, (1, 3, 4)).astype(np.int8)
              for k in range(4)]
    resets = (False, False, True, False)
    expected = oracle_sequence(data, values, resets)
    assert_same(expected, runtime_sequence(mp, values, resets), "runtime_py")
    assert_same(expected, c_sequence(mp, values, resets), "C")


# -- roundings random weights rarely tell apart ---------------------------------------------

PROBE_HIDDEN_SCALE = 0.0071234  # float(2^-30 / scale) gives another multiplier than the double


def probe_model(biases: dict[str, np.ndarray]) -> Built:
    """Zero weights and scales that make each gate multiplier exactly 1: every cell's gate
    pre-activations are its biases, and its cell and output follow from them alone."""
    n = len(biases["forget"])
    b = ModelBuilder("int8")
    x = b.input("x", (1, 2, 2), "int8", 1 / 64, 0)
    ids = [-1] * 24
    ids[0] = x
    for k, gate in enumerate(GATES):
        ids[1 + k] = b.const(f"{gate}_w", np.zeros((n, 2), np.int8), 1 / 64, 0)
        ids[5 + k] = b.const(f"{gate}_r", np.zeros((n, n), np.int8), 1 / 32, 0)
        ids[12 + k] = b.const(f"{gate}_b", biases[gate].astype(np.int32), 1 / 4096, 0)
    ids[18] = b.variable("h", np.zeros((1, n), "int8"), PROBE_HIDDEN_SCALE, 0)
    ids[19] = b.variable("c", np.zeros((1, n), "int16"), 2.0**-12, 0)
    y = b.tensor("y", (1, 2, n), "int8", PROBE_HIDDEN_SCALE, 0)
    b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ids, [y], {"fused_activation_function": "TANH"})
    b.intermediates([*(b.tensor(f"i{k}", (0,), "float32") for k in range(4)),
                     b.tensor("hidden", (0,), "int8", PROBE_HIDDEN_SCALE, 0)])
    b.output(y)
    return Built(b.build(), x, y, ids[18], ids[19])


def forget_probes(count: int, rng: np.random.Generator) -> list[tuple[int, int, int]]:
    """(input, cell, forget) gate pre-activations for which the second step's f * c rounded
    once (LiteRT) and twice (MultiplyByQuantizedMultiplier by 2^-15, TFLite Micro's) differ."""
    pre = np.arange(-32768, 32768)
    sigmoid = logistic16(pre)
    found = []
    while len(found) < count:
        i_pre, g_pre = (int(v) for v in rng.integers(-30000, 30000, 2))
        c1 = int(rdbpot(logistic16(i_pre) * tanh16(g_pre, 3), 18))  # one step from c = 0
        apart = np.flatnonzero(rdbpot(sigmoid * c1, 15) != mbqm(sigmoid * c1, 1 << 30, -14))
        if apart.size:
            found.append((i_pre, g_pre, int(pre[rng.choice(apart)])))
    return found


def hidden_probes(count: int, float_multiplier, exact_multiplier) -> list[tuple[int, int, int]]:
    """(input, cell, output) gate pre-activations for which the first step's output differs
    between the two hidden multipliers (the exact one the larger). Random values almost never
    hit one: the product o * tanh(c) must fall in the few integers below a rounding boundary
    of the larger multiplier but above the smaller's, so those are solved for."""
    (m_small, shift), (m_large, _) = float_multiplier, exact_multiplier
    assert m_small < m_large and shift == _
    pre = np.arange(-32768, 32768)
    sigmoid = logistic16(pre)
    i_pre = 30000
    tanh_c = tanh16(rdbpot(logistic16(i_pre) * tanh16(pre, 3), 18), 3)
    found = []
    for k in range(127, 0, -1):
        # the result reaches k + 1 from srdhm(p, m) >= (k + 1/2) * 2^-shift on
        threshold = ((2 * k + 1) << (-shift - 1) << 31) - (1 << 30)
        low, high = -(-threshold // m_large), -(-threshold // m_small) - 1
        for tc in np.unique(tanh_c[tanh_c > 0]):
            o = -(-low // int(tc))
            if o * tc <= high and o in sigmoid:
                found.append((i_pre, int(pre[np.argmax(tanh_c == tc)]),
                              int(pre[np.argmax(sigmoid == o)])))
                break
        if len(found) == count:
            return found
    return found


def test_roundings_that_random_weights_rarely_tell_apart():
    """The cell update's f * c rounds once (not twice, as TFLite Micro's does), and the hidden
    multiplier comes from the float32 effective scale (not the double): biases picked so that
    the competing readings give other cell states or outputs, all matched bit for bit."""
    scale = float(np.float32(PROBE_HIDDEN_SCALE))
    float_multiplier = quantize_multiplier(float(np.float32(2.0**-15 / scale * 2.0**-15)))
    exact_multiplier = quantize_multiplier(2.0**-30 / scale)
    probes = [*forget_probes(8, np.random.default_rng(5)),
              *hidden_probes(8, float_multiplier, exact_multiplier)]
    assert len(probes) == 16
    biases = {gate: np.zeros(len(probes), np.int64) for gate in GATES}
    for n, (i_pre, g_pre, other) in enumerate(probes):
        biases["input"][n], biases["cell"][n] = i_pre, g_pre
        biases["forget" if n < 8 else "output"][n] = other
    built = probe_model(biases)
    mp = plan_model(parse_model(built.data, "<built model>"), "greedy")
    p = mp.program.params()[0]
    assert (p.hidden_multiplier, p.hidden_shift) == float_multiplier
    values = [np.zeros((1, 2, 2), np.int8)] * 3
    resets = (False, False, True)
    expected = oracle_sequence(built.data, values, resets, (built.cell_state,))
    assert_same(expected, runtime_sequence(mp, values, resets, (built.cell_state,)),
                "runtime_py")
    assert_same([row[:1] for row in expected], c_sequence(mp, values, resets), "C")


@pytest.mark.parametrize("name", ["batch 2", "time-major, every variant"])
def test_check_compares_the_stock_backends_over_a_carried_state(name):
    """`check` runs its input sets as one sequence in every backend: the stock host harness
    keeps the state from set to set too."""
    assert_matches_oracle(lstm_model(INTEGER_CASES[name]).data, inputs=4)


@pytest.mark.skipif(bool(qemu_backend.missing()), reason="no Cortex-M toolchain or QEMU")
@pytest.mark.parametrize("name", ["time-major, every variant", "layer norm over 6 cells"])
def test_integer_lstm_on_a_cortex_m4_keeps_its_state(name):
    """The integer-only C built for a Cortex-M4 and run under QEMU: five invokes carrying the
    state, bit-exact with LiteRT."""
    cfg = INTEGER_CASES[name]
    built = lstm_model(cfg)
    mp = plan_model(parse_model(built.data, "lstm.tflite"), "greedy")
    values = input_sets(cfg, 5)
    expected = oracle_sequence(built.data, values, (False,) * 5)
    with QemuBackend(mp) as backend:
        assert_same(expected, backend.invoke_many([[v] for v in values]), "Cortex-M4")


@pytest.mark.skipif(bool(qemu_backend.missing()), reason="no Cortex-M toolchain or QEMU")
def test_lstm_op_on_a_cortex_m4_keeps_its_state():
    """The LSTM op (one step per invoke, int8 with layer norm, peephole and projection) on a
    Cortex-M4 under QEMU: five invokes carrying the state, bit-exact with LiteRT."""
    cfg = STEP_CASES["int8, layer norm, peephole, projection"]
    built = lstm_model(cfg)
    mp = plan_model(parse_model(built.data, "lstm.tflite"), "greedy")
    values = input_sets(cfg, 5)
    expected = oracle_sequence(built.data, values, (False,) * 5)
    with QemuBackend(mp) as backend:
        assert_same(expected, backend.invoke_many([[v] for v in values]), "Cortex-M4")


@needs_real_model
@pytest.mark.skipif(bool(qemu_backend.missing()), reason="no Cortex-M toolchain or QEMU")
def test_real_model_on_a_cortex_m4_keeps_its_state():
    data = REAL_MODEL.read_bytes()
    mp = plan_model(parse_model(data, str(REAL_MODEL)), "greedy")
    images = digits()
    values = [images[k] for k in ("seven", "seven", "zero", "one", "seven")]
    expected = oracle_sequence(data, values, (False,) * len(values))
    with QemuBackend(mp) as backend:
        assert_same(expected, backend.invoke_many([[v] for v in values]), "Cortex-M4")


@pytest.mark.parametrize("norm_scale", [2.0**-14, 0.5])
def test_layer_norm_past_int32_as_litert_computes_it(norm_scale):
    """Over 6 cells (not a power of two) LiteRT's variance of nearly equal pre-activations
    truncates below 1 and falls back to the guard, so a normalized value times its coefficient
    passes int32 (an overflow in LiteRT's source): its build computes it in 64 bits, and so
    does arenac. Input [127, 127, 1] and weights that put each gate's pre-activation right
    where that happens, every step; biases large enough that an int32 sum would wrap too. With
    a coefficient scale of 0.5 the requantization shifts left by 12 and wraps, as LiteRT's."""
    pre = np.array([29335, 29348, 29477, 29405, 29321, 29333])
    n = len(pre)
    coarse = np.round(pre / 127).astype(np.int64)
    weights = np.stack([np.minimum(coarse, 127), coarse - np.minimum(coarse, 127),
                        pre - 127 * coarse], axis=1).astype(np.int8)
    assert (weights.astype(np.int64) @ [127, 127, 1] == pre).all()
    coefficients = np.full(n, 20000, np.int16)
    # the first step's normalized values, as LiteRT computes them, pass int32 with the coefficient
    mean = int(pre.sum() * 1024 // n)
    variance = (int((pre * pre).sum()) * ((1 << 20) // n) - mean * mean) // (1 << 20)
    assert variance < 1
    assert (np.abs((1024 * pre - mean) * 20000) >= 2**31).any()

    b = ModelBuilder("int8")
    x = b.input("x", (1, 3, 3), "int8", 2.0**-6, 0)
    ids = [-1] * 24
    ids[0] = x
    for k, gate in enumerate(GATES):
        ids[1 + k] = b.const(f"{gate}_w", weights, 2.0**-6, 0)
        ids[5 + k] = b.const(f"{gate}_r", np.zeros((n, n), np.int8), 0.01, 0)
        bias = np.arange(n, dtype=np.int64) * 300 + (2_000_000_000 if k % 2 else 0)
        ids[12 + k] = b.const(f"{gate}_b", bias.astype(np.int32), 2.0**-12, 0)
        ids[20 + k] = b.const(f"{gate}_norm", coefficients, norm_scale, 0)
    ids[18] = b.variable("h", np.zeros((1, n), "int8"), 1 / 128, 0)
    ids[19] = b.variable("c", np.zeros((1, n), "int16"), 2.0**-12, 0)
    y = b.tensor("y", (1, 3, n), "int8", 1 / 128, 0)
    b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ids, [y], {"fused_activation_function": "TANH"})
    b.intermediates([*(b.tensor(f"i{k}", (0,), "int16", 2.0**-12, 0) for k in range(4)),
                     b.tensor("hidden", (0,), "int8", 1 / 128, 0)])
    b.output(y)
    data = b.build()
    mp = plan_model(parse_model(data, "<built model>"), "greedy")
    values = [np.tile(np.array([127, 127, 1], np.int8), (1, 3, 1))] * 3
    resets = (False, False, True)
    expected = oracle_sequence(data, values, resets, (ids[19],))
    assert_same(expected, runtime_sequence(mp, values, resets, (ids[19],)), "runtime_py")
    assert_same([row[:1] for row in expected], c_sequence(mp, values, resets, sanitize=True),
                "C")
