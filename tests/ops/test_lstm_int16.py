"""UNIDIRECTIONAL_SEQUENCE_LSTM with int16 activations, int8 weights and an int16 cell state
(int16x8) against TFLite Micro's interpreter, the oracle where LiteRT's prepare refuses the
model: runtime_py (outputs and both states) and the generated C bit-exact over invokes that
carry the state, across a reset."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from tests.opcheck import assert_matches_oracle, refusal
from tests.ops.test_lstm import assert_same, c_sequence, runtime_sequence
from tests.test_codegen import style_problems
from toolchain.c.generate import generate
from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab import qemu_backend
from toolchain.lab.oracle import TFLMOracle
from toolchain.lab.qemu_backend import QemuBackend
from toolchain.lower.plan import plan_model
from toolchain.ops import oracle_of
from toolchain.ops.spec import TFLM

GATES = ("input", "forget", "cell", "output")


@dataclass(frozen=True)
class Lstm16:
    """One int16x8 LSTM layer to build: sizes, scales (scale, zero point) and options."""

    batch: int = 2
    time: int = 4
    n_input: int = 3
    n_cell: int = 4
    time_major: bool = False
    seed: int = 0
    input_quant: tuple[float, int] = (2.0**-12, 0)
    state_quant: tuple[float, int] = (2.0**-15, 0)
    cell_scale: float = 2.0**-11
    weight_scale: float = 0.02
    bias_magnitude: int = 2**20
    cell_clip: float = 0.0
    activation: str = "TANH"
    input_seed: int = 1  # of the input sets a sequence test runs
    # variants TFLite Micro refuses
    cifg: bool = False
    peephole: bool = False
    projection: bool = False
    layer_norm: bool = False
    # operands TFLite Micro reads otherwise than LiteRT would
    inputs: int = 24
    weight_zero_point: int = 0
    per_channel: bool = False
    flat_output_state: bool = False

    @property
    def input_shape(self) -> tuple[int, int, int]:
        if self.time_major:
            return self.time, self.batch, self.n_input
        return self.batch, self.time, self.n_input

    def but(self, **changes) -> Lstm16:
        return replace(self, **changes)


@dataclass(frozen=True)
class Built:
    data: bytes
    output_state: int
    cell_state: int


def lstm16_model(cfg: Lstm16) -> Built:
    """The layer, its whole output sequence the model's output; 24 inputs, as TFLite Micro's
    kernel reads them, and no intermediates (it reads none)."""
    b = ModelBuilder("int16", seed=cfg.seed)
    x = b.input("x", cfg.input_shape, "int16", *cfg.input_quant)
    y, h, cs = add_layer(b, cfg, x)
    b.output(y)
    return Built(b.build(), h, cs)


def add_layer(b: ModelBuilder, cfg: Lstm16, x: int, name: str = "") -> tuple[int, int, int]:
    """One LSTM op reading `x` (cfg's input shape and quantization): its output, output state
    and cell state, their names after `name`."""
    rng = np.random.default_rng(cfg.seed)
    c, n = cfg.n_cell, cfg.n_input
    in_scale = cfg.input_quant[0]
    state_scale, state_zp = cfg.state_quant
    ids = [-1] * 24
    ids[0] = x
    for k, gate in enumerate(GATES):
        if cfg.cifg and gate == "input":
            continue
        s_in, s_rec = cfg.weight_scale * (1 + 0.1 * k), cfg.weight_scale * (1.3 - 0.1 * k)
        in_scales = [s_in * (1 + 0.01 * u) for u in range(c)] if cfg.per_channel else s_in
        ids[1 + k] = b.const(f"{name}{gate}_input_weights",
                             rng.integers(-127, 128, (c, n)).astype(np.int8), in_scales,
                             [cfg.weight_zero_point] * c if cfg.per_channel
                             else cfg.weight_zero_point)
        ids[5 + k] = b.const(f"{name}{gate}_recurrent_weights",
                             rng.integers(-127, 128, (c, c)).astype(np.int8), s_rec, 0)
        ids[12 + k] = b.const(f"{name}{gate}_bias", rng.integers(
            -cfg.bias_magnitude, cfg.bias_magnitude + 1, c).astype(np.int64), in_scale * s_in, 0)
        if cfg.layer_norm:
            ids[20 + k] = b.const(f"{name}{gate}_norm",
                                  rng.integers(8000, 24000, c).astype(np.int16), 2.0**-14, 0)
    if cfg.peephole:
        for k, gate in ((9, "input"), (10, "forget"), (11, "output")):
            ids[k] = b.const(f"{name}{gate}_peephole", rng.integers(-20000, 20001, c)
                             .astype(np.int16), 1e-4, 0)
    if cfg.projection:
        ids[16] = b.const(f"{name}projection", rng.integers(-127, 128, (c, c)).astype(np.int8),
                          0.01, 0)
    state_shape = (cfg.batch * c,) if cfg.flat_output_state else (cfg.batch, c)
    h = b.variable(f"{name}output_state", np.zeros(state_shape, "int16"), state_scale, state_zp)
    cs = b.variable(f"{name}cell_state", np.zeros((cfg.batch, c), "int16"), cfg.cell_scale, 0)
    ids[18], ids[19] = h, cs
    y = b.tensor(f"{name}y", (*cfg.input_shape[:-1], c), "int16", state_scale, state_zp)
    b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ids[:cfg.inputs], [y],
         {"fused_activation_function": cfg.activation, "cell_clip": cfg.cell_clip,
          "proj_clip": 0.0, "time_major": cfg.time_major})
    return y, h, cs


def input_sets(cfg: Lstm16, count: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-32768, 32768, cfg.input_shape).astype(np.int16) for _ in range(count)]


# Four invokes carrying the state, a reset, two more.
RESETS = (False, False, False, False, True, False, False)


def tflm_sequence(built: Built, inputs, resets) -> list[list[np.ndarray]]:
    """TFLite Micro's outputs invoke after invoke; a fresh interpreter stands for a reset (its
    variables start at zero)."""
    results, oracle = [], None
    for value, reset in zip(inputs, resets, strict=True):
        if oracle is None or reset:
            oracle = TFLMOracle(built.data, 1)
        results.append(oracle.invoke([value]))
    return results


def assert_sequence_matches(cfg: Lstm16, c: bool = True) -> None:
    built = lstm16_model(cfg)
    mp = plan_model(parse_model(built.data, "<built model>"), "greedy")
    assert oracle_of(mp.program.bindings)[0] == TFLM
    values = input_sets(cfg, len(RESETS), cfg.input_seed)
    expected = tflm_sequence(built, values, RESETS)
    outputs = np.concatenate([row[0].ravel() for row in expected])
    assert np.unique(outputs).size > 16, "(nearly) constant outputs"
    assert_same(expected, [row[:1] for row in runtime_sequence(mp, values, RESETS)],
                "runtime_py")
    if c:
        assert_same(expected, c_sequence(mp, values, RESETS), "C")


CASES = {
    "batch-major": Lstm16(),
    "time-major": Lstm16(time_major=True),
    "one batch row, long sequence": Lstm16(batch=1, time=12, n_input=5, n_cell=6),
    "zero points on the input and the state": Lstm16(input_quant=(2.0**-11, -300),
                                                     state_quant=(2.0**-14, 70)),
    "cell state Q0.15": Lstm16(cell_scale=2.0**-15),
    "cell state Q3.12, its tanh the cell gate's": Lstm16(cell_scale=2.0**-12, time_major=True),
    "cell state 2^-9, clipped": Lstm16(cell_scale=2.0**-9, cell_clip=3.0, seed=2),
    "cell clip 0.5": Lstm16(cell_clip=0.5, time_major=True),
    "cell scale not a power of two": Lstm16(cell_scale=1 / 3000, seed=3, weight_scale=0.05),
    "saturating gates": Lstm16(weight_scale=0.2, bias_magnitude=2**26, seed=4),
    # a recurrent multiplier whose 16-bit rounding depends on the scales' product being taken
    # in double (in float32 it rounds up, to another gate value)
    "scale product in double": Lstm16(
        time=2, n_input=2, n_cell=6, time_major=True, seed=233, input_seed=233,
        input_quant=(2.4553737105550286e-05, 33), state_quant=(0.00015508896801399806, 482),
        weight_scale=0.3019588076314929, bias_magnitude=32768, cell_clip=1.0),
}


@pytest.mark.parametrize("cfg", CASES.values(), ids=CASES.keys())
def test_matches_tflm_across_invokes(cfg):
    assert_sequence_matches(cfg)


def test_check_runs_tflm_as_the_oracle_over_a_carried_state():
    """`check` itself (its TFLite Micro child process, runtime_py and the host C) over four
    input sets run as one sequence."""
    assert_matches_oracle(lstm16_model(Lstm16(time_major=True)).data, inputs=4)


def test_cli_check_names_tflm_as_the_oracle(tmp_path, capsys):
    path = tmp_path / "lstm16.tflite"
    path.write_bytes(lstm16_model(Lstm16()).data)
    assert main(["check", str(path), "--inputs", "3"]) == 0
    out = capsys.readouterr().out
    assert "tflm (oracle) vs runtime_py, c" in out and "all backends agree" in out


def test_c_is_clean_under_sanitizers():
    cfg = CASES["zero points on the input and the state"]
    built = lstm16_model(cfg)
    mp = plan_model(parse_model(built.data, "<built model>"), "greedy")
    values = input_sets(cfg, 5)
    assert_same(tflm_sequence(built, values, RESETS[:5]),
                c_sequence(mp, values, RESETS[:5], sanitize=True), "sanitized C")


def test_generated_c_reads_like_careful_hand_written_c():
    for name, cfg in CASES.items():
        mp = plan_model(parse_model(lstm16_model(cfg).data, "lstm.tflite"), "greedy")
        for file_name, text in generate(mp, "m").items():
            assert style_problems(text) == [], f"{name}: {file_name}"


def test_two_stacked_layers_match_tflm_and_share_the_table():
    """The second layer reads the first's output sequence: each op's functions carry its
    prefix, the sigmoid table is defined once, and both match TFLite Micro over a sequence."""
    first = Lstm16(n_input=3, n_cell=5)
    second = first.but(n_input=5, n_cell=4, seed=9, input_quant=first.state_quant,
                       cell_scale=2.0**-13)
    b = ModelBuilder("int16")
    x = b.input("x", first.input_shape, "int16", *first.input_quant)
    y, _, _ = add_layer(b, second, add_layer(b, first, x, "first_")[0], "second_")
    b.output(y)
    built = Built(b.build(), -1, -1)
    mp = plan_model(parse_model(built.data, "<built model>"), "greedy")
    c = generate(mp, "m")["m.c"]
    assert c.count("static const uint16_t arenac_sigmoid_table[") == 1
    assert style_problems(c) == []
    values = input_sets(first, len(RESETS))
    expected = tflm_sequence(built, values, RESETS)
    assert np.unique(np.concatenate([row[0].ravel() for row in expected])).size > 16
    assert_same(expected, [row[:1] for row in runtime_sequence(mp, values, RESETS)],
                "runtime_py")
    assert_same(expected, c_sequence(mp, values, RESETS), "C")


def test_gate_buffers_are_arena_scratch():
    """Three int16 gate buffers of one step's rows (the output gate reuses the forget gate's),
    planned in the arena beside the input and the output."""
    cfg = Lstm16(batch=3, time_major=True, n_cell=5)
    mp = plan_model(parse_model(lstm16_model(cfg).data, "<built model>"), "greedy")
    scratch = mp.program.bindings[0].scratch
    assert [r.size for r in scratch] == [3 * 5 * 2] * 3
    batch_major = plan_model(parse_model(lstm16_model(cfg.but(time_major=False)).data,
                                         "<built model>"), "greedy")
    assert [r.size for r in batch_major.program.bindings[0].scratch] == [5 * 2] * 3


@pytest.mark.skipif(bool(qemu_backend.missing()), reason="no Cortex-M toolchain or QEMU")
def test_on_a_cortex_m4_keeps_its_state():
    """The C built for a Cortex-M4 and run under QEMU: five invokes carrying the state,
    bit-exact with TFLite Micro."""
    cfg = CASES["cell state 2^-9, clipped"]
    built = lstm16_model(cfg)
    mp = plan_model(parse_model(built.data, "lstm.tflite"), "greedy")
    values = input_sets(cfg, 5)
    expected = tflm_sequence(built, values, (False,) * 5)
    with QemuBackend(mp) as backend:
        assert_same(expected, backend.invoke_many([[v] for v in values]), "Cortex-M4")


# -- what TFLite Micro refuses, or reads otherwise ------------------------------------------

TFLM_REFUSES = {
    "CIFG": (Lstm16(cifg=True), "CIFG"),
    "peephole": (Lstm16(peephole=True), "peephole"),
    "projection": (Lstm16(projection=True), "projection"),
    "layer norm": (Lstm16(layer_norm=True), "layer norm"),
}


@pytest.mark.parametrize("name", TFLM_REFUSES)
def test_variants_tflm_refuses_are_refused(name):
    cfg, words = TFLM_REFUSES[name]
    data = lstm16_model(cfg).data
    with pytest.raises(RuntimeError, match="allocate"):
        TFLMOracle(data, 1)
    message = refusal(data)
    assert words in message and "standard LSTM" in message


REFUSED = {
    "activation RELU": (Lstm16(activation="RELU"), "fused activation RELU"),
    "activation NONE": (Lstm16(activation="NONE"), "fused activation NONE"),
    "20 inputs": (Lstm16(inputs=20), "20 inputs"),
    "weight zero point": (Lstm16(weight_zero_point=3), "zero point 3"),
    "per-channel weights": (Lstm16(per_channel=True), "per channel"),
    "flat output state": (Lstm16(flat_output_state=True), "output state of shape [8]"),
    "bias beyond 2^47": (Lstm16(bias_magnitude=2**49), "2^47"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_what_tflm_would_compute_otherwise_is_refused(name):
    """An activation TFLite Micro skips on the cell gate, inputs it would not find, weights it
    would requantize with uninitialized or ignored parameters, sums its int64 requantization
    asserts against."""
    cfg, words = REFUSED[name]
    assert words in refusal(lstm16_model(cfg).data)
