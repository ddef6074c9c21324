"""BIDIRECTIONAL_SEQUENCE_LSTM against LiteRT's reference kernel over sequences of invokes that
carry both cells' states (and across a reset), in runtime_py and in the generated C: float32
within the check's tolerance, merged and separate outputs, both layouts, the auxiliary input
with and without weights for it; and what it refuses."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from tests.ops.test_lstm import (
    RESETS,
    assert_refused,
    assert_same,
    c_sequence,
    oracle_sequence,
    runtime_sequence,
)
from tests.test_codegen import style_problems
from toolchain.c.generate import generate
from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lower.plan import plan_model
from toolchain.ops import prepare_graph

GATES = ("input", "forget", "cell", "output")
AUX = ("none", "weights", "backward input")  # no auxiliary input, one with weights, one without


@dataclass(frozen=True)
class Bidi:
    """One bidirectional layer to build. `cifg`, `peephole` and `projection` hold each cell's
    choice (forward, backward)."""

    batch: int = 1
    time: int = 5
    n_input: int = 4
    n_cell: int = 5
    output: int | None = None  # n_output with a projection
    time_major: bool = False
    merge_outputs: bool = True
    cifg: tuple[bool, bool] = (False, False)
    peephole: tuple[bool, bool] = (False, False)
    projection: tuple[bool, bool] = (False, False)
    aux: str = "none"
    n_aux: int = 3
    activation: str = "TANH"
    cell_clip: float = 0.0
    proj_clip: float = 0.0
    seed: int = 0
    bw_cells: int | None = None  # the backward cell's n_cell, if not the forward one's
    hybrid: bool = False  # int8 weights (per tensor): LiteRT's hybrid kernel
    asymmetric: bool = False  # its asymmetric_quantize_inputs

    @property
    def n_output(self) -> int:
        return self.output if any(self.projection) and self.output else self.n_cell

    def lead(self) -> tuple[int, int]:
        return (self.time, self.batch) if self.time_major else (self.batch, self.time)

    def but(self, **changes) -> Bidi:
        return replace(self, **changes)


@dataclass(frozen=True)
class BuiltBidi:
    data: bytes
    states: tuple[int, ...]


def bidi_model(cfg: Bidi, drop: tuple[int, ...] = ()) -> BuiltBidi:
    """The layer with its outputs as the model's; the inputs at `drop` left absent."""
    rng = np.random.default_rng(cfg.seed)
    b = ModelBuilder("float32")
    ids = [-1] * 48
    ids[0] = b.input("x", (*cfg.lead(), cfg.n_input), "float32")

    def normal(*shape: int, scale: float = 0.4) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def weights(name: str, values: np.ndarray) -> int:
        if not cfg.hybrid:
            return b.const(name, values)
        scale = float(np.abs(values).max()) / 127
        return b.const(name, np.round(values / scale).astype(np.int8), scale, 0)

    states = []
    for cell, name in enumerate(("fw", "bw")):
        base = 17 * cell
        c = cfg.bw_cells or cfg.n_cell if cell else cfg.n_cell
        o = cfg.n_output if any(cfg.projection) else c
        for k, gate in enumerate(GATES):
            if cfg.cifg[cell] and gate == "input":
                continue
            ids[base + 1 + k] = weights(f"{name}_{gate}_input_weights", normal(c, cfg.n_input))
            ids[base + 5 + k] = weights(f"{name}_{gate}_recurrent_weights", normal(c, o))
            ids[base + 12 + k] = b.const(f"{name}_{gate}_bias", normal(c, scale=0.3))
            if cfg.aux == "weights":
                ids[40 + 4 * cell + k] = weights(f"{name}_{gate}_aux_weights",
                                                 normal(c, cfg.n_aux))
        if cfg.peephole[cell]:
            for k, gate in ((9, "input"), (10, "forget"), (11, "output")):
                if not (cfg.cifg[cell] and gate == "input"):
                    ids[base + k] = weights(f"{name}_{gate}_peephole", normal(c, scale=0.3))
        if cfg.projection[cell]:
            ids[base + 16] = weights(f"{name}_projection", normal(o, c))
            ids[base + 17] = b.const(f"{name}_projection_bias", normal(o, scale=0.1))
        for k, (state, size) in enumerate((("output_state", o), ("cell_state", c))):
            ids[35 + 2 * cell + k] = b.variable(f"{name}_{state}",
                                                np.zeros((cfg.batch, size), "float32"))
            states.append(ids[35 + 2 * cell + k])
    o = cfg.n_output
    if cfg.aux != "none":
        features = cfg.n_aux if cfg.aux == "weights" else cfg.n_input
        ids[39] = b.input("aux", (*cfg.lead(), features), "float32")
    for position in drop:
        ids[position] = -1
    options = {"fused_activation_function": cfg.activation, "cell_clip": cfg.cell_clip,
               "proj_clip": cfg.proj_clip, "merge_outputs": cfg.merge_outputs,
               "time_major": cfg.time_major, "asymmetric_quantize_inputs": cfg.asymmetric}
    if cfg.merge_outputs:
        outputs = [b.tensor("y", (*cfg.lead(), 2 * o), "float32")]
    else:
        outputs = [b.tensor("y_fw", (*cfg.lead(), o), "float32"),
                   b.tensor("y_bw", (*cfg.lead(), o), "float32")]
    b.op("BIDIRECTIONAL_SEQUENCE_LSTM", ids, outputs, options)
    for y in outputs:
        b.output(y)
    return BuiltBidi(b.build(), tuple(states))


def input_sets(cfg: Bidi, count: int, seed: int = 1) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(count):
        values = [rng.standard_normal((*cfg.lead(), cfg.n_input)).astype(np.float32)]
        if cfg.aux != "none":
            features = cfg.n_aux if cfg.aux == "weights" else cfg.n_input
            values.append(rng.standard_normal((*cfg.lead(), features)).astype(np.float32))
        sets.append(values)
    return sets


def planned(built: BuiltBidi):
    return plan_model(parse_model(built.data, "<built model>"), "greedy")


def assert_sequence_matches(cfg: Bidi) -> None:
    """runtime_py (outputs and the four states) and the C (outputs) against LiteRT over invokes
    that carry the states, across a reset."""
    built = bidi_model(cfg)
    mp = planned(built)
    values = input_sets(cfg, len(RESETS))
    expected = oracle_sequence(built.data, values, RESETS, built.states)
    outputs = 1 if cfg.merge_outputs else 2
    for k in range(outputs):
        assert np.unique(expected[0][k]).size > 8, "(nearly) constant outputs"
    assert_same(expected, runtime_sequence(mp, values, RESETS, built.states), "runtime_py")
    assert_same([row[:outputs] for row in expected], c_sequence(mp, values, RESETS), "C")


CASES = {
    "merged": Bidi(),
    "separate outputs, batch 2": Bidi(batch=2, merge_outputs=False),
    "time-major, merged, batch 3": Bidi(batch=3, time=4, time_major=True),
    "time-major, separate outputs": Bidi(batch=2, time_major=True, merge_outputs=False),
    "CIFG forward, peephole backward, clips": Bidi(
        cifg=(True, False), peephole=(False, True), cell_clip=0.6, activation="RELU6"),
    "projection both, CIFG backward, time-major": Bidi(
        batch=2, time_major=True, projection=(True, True), output=3, cifg=(False, True),
        proj_clip=0.4),
    "auxiliary input with weights": Bidi(aux="weights", batch=2, merge_outputs=False),
    "auxiliary input with weights, CIFG, time-major": Bidi(
        aux="weights", n_aux=6, cifg=(True, True), time_major=True, batch=2),
    "auxiliary input as the backward input": Bidi(aux="backward input"),
    "auxiliary input as the backward input, time-major, separate": Bidi(
        aux="backward input", time_major=True, batch=2, merge_outputs=False),
    "one time step": Bidi(time=1, batch=2, merge_outputs=False),
}


@pytest.mark.parametrize("cfg", CASES.values(), ids=CASES.keys())
def test_bidirectional_lstm_carries_both_states_within_tolerance(cfg):
    assert_sequence_matches(cfg)


HYBRID_CASES = {
    "hybrid, merged": Bidi(hybrid=True),
    "hybrid, asymmetric, separate, time-major, batch 2": Bidi(
        hybrid=True, asymmetric=True, time_major=True, batch=2, merge_outputs=False),
    "hybrid, asymmetric, auxiliary weights, peephole, projection": Bidi(
        hybrid=True, asymmetric=True, aux="weights", peephole=(True, True),
        projection=(True, True), output=3, cifg=(False, True), merge_outputs=False, batch=2),
    "hybrid, auxiliary input as the backward input": Bidi(hybrid=True, aux="backward input"),
}


@pytest.mark.parametrize("cfg", HYBRID_CASES.values(), ids=HYBRID_CASES.keys())
def test_hybrid_bidirectional_lstm_carries_both_states_within_tolerance(cfg):
    assert_sequence_matches(cfg)


def test_the_backward_cell_walks_the_sequence_from_its_end():
    """The forward cell's output at step t depends on steps 0 to t, the backward cell's on
    steps t to the end: changing the first step changes every forward output and only the
    first backward one, in runtime_py and in C."""
    cfg = Bidi(merge_outputs=False, batch=2)
    mp = planned(bidi_model(cfg))
    x = input_sets(cfg, 1)[0][0]
    changed = x.copy()
    changed[:, 0] += 1.0
    for run in (runtime_sequence, c_sequence):
        (fw, bw), (fw_changed, bw_changed) = run(mp, [x, changed], (True, True))
        assert not np.isclose(fw, fw_changed).all(axis=-1).any()
        assert not np.isclose(bw[:, 0], bw_changed[:, 0]).all(axis=-1).any()
        assert np.array_equal(bw[:, 1:], bw_changed[:, 1:])


def test_c_is_clean_under_sanitizers():
    for cfg in (CASES["auxiliary input with weights"],
                HYBRID_CASES["hybrid, asymmetric, auxiliary weights, peephole, projection"]):
        built = bidi_model(cfg)
        mp = planned(built)
        values = input_sets(cfg, 3)
        expected = oracle_sequence(built.data, values, RESETS[:3])
        assert_same([row[:2] for row in expected],
                    c_sequence(mp, values, RESETS[:3], sanitize=True), "C")


def test_the_cells_share_one_set_of_gate_buffers():
    cfg = Bidi(cifg=(True, False), projection=(True, True), output=4)
    mp = planned(bidi_model(cfg))
    purposes = sorted(request.purpose for request, _ in mp.scratch_offsets())
    assert purposes == sorted(["the input gate", "the forget gate, then the output gate",
                               "the cell gate", "the hidden values before the projection"])


def test_generated_c_reads_like_careful_hand_written_c():
    for cfg in (CASES["auxiliary input with weights"],
                CASES["projection both, CIFG backward, time-major"],
                HYBRID_CASES["hybrid, asymmetric, auxiliary weights, peephole, projection"]):
        c = generate(planned(bidi_model(cfg)), "model")["model.c"]
        assert style_problems(c) == []
        assert "_forward();" in c and "_backward();" in c
        # one matrix-product function, which both cells' steps call
        assert c.count("static void model_op0_fw_accumulate(") == 1
        assert "_bw_accumulate" not in c
        assert c.count("model_op0_fw_accumulate(") > 12


# -- refusals -------------------------------------------------------------------------------


def test_refuses_merged_batch_major_rows_litert_mishandles():
    assert_refused(bidi_model(Bidi(batch=2)).data, "past the state's end")


def test_refuses_cells_of_different_sizes():
    data = bidi_model(Bidi(bw_cells=4, merge_outputs=False)).data
    assert_refused(data, "the forward cell has 5 cells and 5 outputs, the backward 4 and 4",
                   ModelError)


def test_refuses_a_missing_gate_weight_naming_the_cell():
    assert_refused(bidi_model(Bidi(), drop=(19,)).data, "the backward cell: .*forget",
                   ModelError)


def test_refuses_auxiliary_weights_for_one_cell_only():
    assert_refused(bidi_model(Bidi(aux="weights"), drop=(45,)).data, "both cells",
                   ModelError)


def test_refuses_auxiliary_weights_missing_for_the_input_gate():
    assert_refused(bidi_model(Bidi(aux="weights"), drop=(40,)).data,
                   "the forward cell: the input gate's auxiliary weights", ModelError)


def test_refuses_auxiliary_weights_without_the_auxiliary_input():
    assert_refused(bidi_model(Bidi(aux="weights"), drop=(39,)).data, "input 39", ModelError)


def test_refuses_an_auxiliary_input_of_another_length():
    graph = parse_model(bidi_model(Bidi(aux="backward input")).data, "<built model>").main
    aux = graph.operators[0].inputs[39]
    graph = replace(graph, tensors=tuple(replace(t, shape=(1, 4, 4)) if t.index == aux else t
                                         for t in graph.tensors))
    with pytest.raises(ModelError, match="auxiliary input has shape"):
        prepare_graph(graph)


def test_refuses_float_activation_none():
    assert_refused(bidi_model(Bidi(activation="NONE")).data, "NONE")


def test_refuses_weights_of_mixed_types():
    """One int8 weight among float ones: neither the float nor the hybrid kernel."""
    graph = parse_model(bidi_model(Bidi()).data, "<built model>").main
    weight = graph.operators[0].inputs[2]
    hybrid = replace(graph, tensors=tuple(replace(t, dtype="int8") if t.index == weight else t
                                          for t in graph.tensors))
    with pytest.raises(UnsupportedOpError, match="no kernel"):
        prepare_graph(hybrid)
