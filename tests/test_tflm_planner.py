"""`--planner tflm`: TFLite Micro's GreedyMemoryPlanner, held to the head TFLM itself reports.

TFLM plans the tensors it allocates (activations, not constants or variables, no empty ones)
plus the scratch its kernels request: with `--planner tflm` that is what arenac plans too, the
SVDF and LSTM kernels' scratch TFLM asks for in place of ours (ours riding in it), so the
recurrent models are held to TFLM's head like the others.
"""

from __future__ import annotations

import importlib.util
import json
import random

import pytest

from tests.conftest import RECURRENT_MODEL_FILES, SHARED_MODEL_FILES, needs_shared_models
from tests.opcheck import assert_matches_oracle
from tests.ops.test_lstm import Lstm, lstm_model
from tests.ops.test_lstm_int16 import Lstm16, lstm16_model
from tests.ops.test_svdf import float_svdf_model, svdf_model
from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model, read_model
from toolchain.lab.oracle import TFLMOracle
from toolchain.lower.lifetimes import TFLM_SCRATCH
from toolchain.lower.plan import NO_TECHNIQUES, Techniques, plan_model
from toolchain.planners import Buffer, align_up, make_plan

needs_tflm = pytest.mark.skipif(
    importlib.util.find_spec("tflite_micro") is None, reason="tflite-micro is not installed"
)
needs_recurrent = pytest.mark.skipif(not RECURRENT_MODEL_FILES,
                                     reason="the recurrent shared models are absent")
# Kernels whose scratch in TFLM is not ours: SVDF and LSTM in several forms.
RECURRENT_BUILT = {
    "svdf_int8": lambda: svdf_model("int8", expose_state=False),
    "svdf_int8_batches_rank2": lambda: svdf_model("int8", batches=3, rank=2, expose_state=False),
    "svdf_float_rank1": lambda: float_svdf_model(rank=1, expose_state=False),
    "svdf_float_batches_rank2": lambda: float_svdf_model(batches=2, expose_state=False),
    "lstm_int8": lambda: lstm_model(Lstm()).data,
    "lstm_int8_time_major": lambda: lstm_model(Lstm(batch=3, time_major=True)).data,
    "lstm_float": lambda: lstm_model(Lstm(dtype="float32")).data,
    "lstm_int16x8": lambda: lstm16_model(Lstm16()).data,
}


def tflm_head(data: bytes, outputs: int) -> int:
    return TFLMOracle(data, outputs, arena_size=4 << 20).allocations()["head"]


def reference_tflm(buffers: list[Buffer], alignment: int = 16) -> list[int]:
    """TFLM's method as it reads: a list of placed buffers sorted by offset, walked from the
    bottom for the first gap between buffers alive with the new one that holds it."""
    sizes = [align_up(b.size, alignment) for b in buffers]
    order = list(reversed(range(len(buffers))))
    order.sort(key=lambda i: -sizes[i])  # stable, as TFLM's bubble sort is
    placed: list[tuple[int, int]] = []  # (offset, buffer), by offset
    offsets = [0] * len(buffers)
    for i in order:
        if not sizes[i]:
            continue
        candidate = 0
        for offset, j in placed:
            if buffers[j].first > buffers[i].last or buffers[i].first > buffers[j].last:
                continue
            if offset - candidate >= sizes[i]:
                break
            candidate = max(candidate, offset + sizes[j])
        offsets[i] = candidate
        placed.append((candidate, i))
        placed.sort(key=lambda entry: entry[0])
    return offsets


def fc_chain() -> bytes:
    """Fully connected layers whose equal-sized outputs TFLM and our greedy place apart."""
    b = ModelBuilder("int8", 0)
    x = b.input("x", (1, 32), "int8", 1 / 128, 0)
    for units in (16, 32, 48, 32, 32, 32):
        x = b.fully_connected(x, units)
    b.output(x)
    return b.build()


@pytest.mark.parametrize("seed", range(30))
def test_tflm_places_every_buffer_where_its_method_does(seed):
    rng = random.Random(seed)
    buffers = []
    for i in range(rng.randrange(1, 60)):
        first = rng.randrange(20)
        size = rng.choice([0, 16, 32, 32, 48, rng.randrange(1, 200)])
        buffers.append(Buffer(i, size, first, first + rng.randrange(6)))
    plan = make_plan(buffers, "tflm")  # verified
    assert list(plan.offsets) == reference_tflm(buffers)


def test_tflm_ignores_declared_overlaps():
    from toolchain.planners import Overlap

    buffers = [Buffer(0, 64, 0, 1), Buffer(1, 64, 1, 2)]
    shared = make_plan(buffers, "greedy", overlaps=[Overlap(1, 0)])
    apart = make_plan(buffers, "tflm", overlaps=[Overlap(1, 0)])
    assert (shared.arena_bytes, apart.arena_bytes) == (64, 128)


@needs_tflm
def test_equal_sizes_go_in_tflm_order_not_ours():
    data = fc_chain()
    model = parse_model(data)
    ours = plan_model(model, "greedy", techniques=NO_TECHNIQUES).arena_bytes
    theirs = plan_model(model, "tflm", techniques=NO_TECHNIQUES).arena_bytes
    assert (ours, theirs, tflm_head(data, 1)) == (80, 96, 96)


@needs_tflm
@pytest.mark.parametrize("name", sorted(n for n in EXAMPLES if not n.endswith("_uint8")))
def test_tflm_plan_is_tflm_head_on_built_models(name):
    data = EXAMPLES[name]()
    model = parse_model(data)
    plan = plan_model(model, "tflm", techniques=NO_TECHNIQUES)
    assert plan.arena_bytes == tflm_head(data, len(model.main.outputs))


@needs_tflm
@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_tflm_plan_is_tflm_head_on_shared_models(path):
    model = read_model(path)
    head = tflm_head(path.read_bytes(), len(model.main.outputs))
    # In-place and overlaps are declared sharings, which TFLM's planner never takes.
    for techniques in (NO_TECHNIQUES, Techniques(schedule="model")):
        assert plan_model(model, "tflm", techniques=techniques).arena_bytes == head


@needs_tflm
@needs_shared_models
def test_cli_plan_shows_tflm_plan_beside_ours(capsys):
    path = next((p for p in SHARED_MODEL_FILES if p.stem == "vww_96_int8"), None)
    if path is None:
        pytest.skip("vww_96_int8 is not among the shared models")
    arenas = {}
    for planner in ("tflm", "greedy"):
        assert main(["plan", str(path), "--planner", planner, "--schedule", "model",
                     "--no-inplace", "--no-overlap", "--json"]) == 0
        arenas[planner] = json.loads(capsys.readouterr().out)["arena_bytes"]
    model = read_model(path)
    assert arenas["tflm"] == tflm_head(path.read_bytes(), len(model.main.outputs))
    assert arenas["greedy"] < arenas["tflm"]


@needs_tflm
@needs_recurrent
@pytest.mark.parametrize("path", RECURRENT_MODEL_FILES, ids=lambda p: p.stem)
def test_recurrent_models_need_tflm_own_scratch_to_reach_its_head(path):
    """The scratch only TFLM's kernels ask for is what the head holds beyond ours."""
    model = read_model(path)
    head = tflm_head(path.read_bytes(), len(model.main.outputs))
    mp = plan_model(model, "tflm", techniques=NO_TECHNIQUES)
    theirs = [r for r in mp.lifetimes.scratch if not r.kernel]
    assert mp.arena_bytes == head and theirs
    ours = [b for b, key in zip(mp.lifetimes.buffers, mp.lifetimes.keys, strict=True)
            if key.kind != TFLM_SCRATCH]
    assert make_plan(ours, "tflm").arena_bytes < head


@needs_tflm
@pytest.mark.parametrize("name", RECURRENT_BUILT)
def test_tflm_plan_is_tflm_head_on_built_recurrent_models(name):
    data = RECURRENT_BUILT[name]()
    model = parse_model(data)
    plan = plan_model(model, "tflm", techniques=NO_TECHNIQUES)
    assert plan.arena_bytes == tflm_head(data, len(model.main.outputs))


def test_our_scratch_rides_in_tflm_own_in_order():
    """An integer LSTM asks for three gate buffers of one row; TFLM for four of every batch
    row: ours take the first three, the fourth is TFLM's alone; an int8 SVDF asks for none
    and TFLM for two."""
    lstm = plan_model(parse_model(lstm_model(Lstm(batch=2)).data), "tflm").program
    assert [(r.size, r.purpose, r.kernel) for r in lstm.tflm_scratch()] == [
        (20, "the input gate", True), (20, "the forget gate, then the output gate", True),
        (20, "the cell gate", True),
        (20, "unused here, as TFLite Micro plans it: LSTM gate buffer 4", False)]
    assert [r.size for r in lstm.scratch()] == [10, 10, 10]
    svdf = plan_model(parse_model(svdf_model("int8", batches=3, rank=2)), "tflm").program
    assert [(r.size, r.kernel) for r in svdf.tflm_scratch()] == [(96, False), (48, False)]
    assert svdf.scratch() == ()


@pytest.mark.parametrize("name", ["svdf_int8", "svdf_float_batches_rank2", "lstm_int8",
                                  "lstm_float"])
def test_kernels_run_in_a_tflm_plan(name):
    """runtime_py and the C run in TFLM's layout, each kernel on its own scratch in TFLM's."""
    assert_matches_oracle(RECURRENT_BUILT[name](), planner="tflm")


@needs_tflm
def test_planner_tflm_plans_tflm_graph_with_every_pad_its_own_op():
    """A MobileNetV2 as the converter writes it (explicit PADs before the strided windows):
    with the default techniques, `--planner tflm` runs the file's order with every PAD kept,
    as TFLM does, and gives TFLM's head; our own plan fuses the PADs and is far smaller."""
    from tests.mobilenet import mobilenet_v2

    data = mobilenet_v2(96, explicit_pads=True)
    model = parse_model(data)
    assert any(op.opcode == "PAD" for op in model.main.operators)
    theirs = plan_model(model, "tflm")
    assert theirs.arena_bytes == tflm_head(data, len(model.main.outputs))
    assert not theirs.program.pad_fusions or all(not f.fused for f in theirs.program.pad_fusions)
    assert plan_model(model).arena_bytes < theirs.arena_bytes
