"""embed: arenac's plan as TFLite Micro's "OfflineMemoryAllocation" metadata, run in stock TFLM.

The models here use only operators whose TFLM reference kernels request no scratch buffers
(CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED ask for one only for int4 filters; pooling,
ADD, RESHAPE and SOFTMAX never), so TFLM's head is exactly the embedded plan's arena. MEAN does
request scratch; its test pins where TFLM puts it.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from dataclasses import replace

import flatbuffers
import numpy as np
import pytest

from tests.conftest import SHARED_MODEL_FILES, needs_shared_models, tflm_head_figures
from toolchain.errors import ArenacError, ModelError, PlanError
from toolchain.front.builder import FILE_IDENTIFIER, ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model, read_model
from toolchain.front.schema import fb
from toolchain.lab.check import random_inputs
from toolchain.lab.oracle import TFLMOracle, capture_fd
from toolchain.lower.lifetimes import SCRATCH, BufferKey, ScratchRequest
from toolchain.lower.plan import NO_TECHNIQUES, plan_model
from toolchain.tflm.embed import METADATA_NAME, embed_file, embed_plan

PLANNERS = ("greedy", "freelist")
needs_tflm = pytest.mark.skipif(
    importlib.util.find_spec("tflite_micro") is None, reason="tflite-micro is not installed"
)


# --- helpers ----------------------------------------------------------------------------------
def plain(model, planner: str = "greedy", **options):
    """A plan TFLM's kernels can run: the file's operator order, no in-place, no overlaps."""
    return plan_model(model, planner, techniques=NO_TECHNIQUES, **options)


def tflm(model_bytes: bytes, outputs: int) -> TFLMOracle:
    """TFLM with room to spare: its default arena (10x the file) is too small for some models."""
    return TFLMOracle(model_bytes, outputs, arena_size=10 * len(model_bytes) + (1 << 20))


def offline_values(model) -> list[int]:
    raw = model.metadata[METADATA_NAME]
    assert len(raw) % 4 == 0
    return np.frombuffer(raw, "<i4").tolist()


def expected_values(model, mp) -> list[int]:
    """What the metadata must hold, worked out independently of embed."""
    entries = [-1] * sum(len(g.tensors) for g in model.graphs)
    for t, offset in mp.offset_of_tensor().items():
        entries[t] = offset
    return [1, len(model.graphs), len(entries), *entries]


def run_both(original: bytes, embedded: bytes, graph, seed: int = 0):
    """Outputs and TFLM heads of the original and the embedded model on the same inputs."""
    inputs = random_inputs(graph, seed)
    before, after = tflm(original, len(graph.outputs)), tflm(embedded, len(graph.outputs))
    out_before, out_after = before.invoke(inputs), after.invoke(inputs)
    return out_before, out_after, before.allocations()["head"], after.allocations()["head"]


def check_embedded(data: bytes, planner: str, model=None) -> tuple[int, int, int]:
    """Embed a plan of `data`, check the file and TFLM's run; (arena, head before, head after)."""
    model = parse_model(data) if model is None else model
    mp = plain(model, planner)
    out = embed_plan(data, mp)
    embedded = parse_model(out)
    assert offline_values(embedded) == expected_values(model, mp)
    # Every tensor TFLM plans has an offline offset; constants and variables have none.
    for t in model.main.tensors:
        entry = offline_values(embedded)[3 + t.index]
        if t.is_constant or t.is_variable:
            assert entry == -1
        elif t.nbytes:
            assert entry >= 0 and entry % 16 == 0
    out_before, out_after, head_before, head_after = run_both(data, out, model.main)
    assert len(out_after) == len(out_before)
    for b, a in zip(out_before, out_after, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert_head_holds_the_plan(head_after, mp.arena_bytes, model)
    return mp.arena_bytes, head_before, head_after


def assert_head_holds_the_plan(head: int, arena: int, model) -> None:
    """TFLM's head is the embedded plan's arena, to the byte, unless its kernels take scratch
    of their own (its SVDF and LSTM do), which it places after the plan's tensors."""
    own_scratch = any(op.opcode in ("SVDF", "UNIDIRECTIONAL_SEQUENCE_LSTM")
                      for op in model.main.operators)
    assert head >= arena if own_scratch else head == arena


def tree(obj):
    """A schema object tree as plain values, for comparing two files field by field."""
    if isinstance(obj, np.ndarray):
        return obj.tobytes() if obj.dtype == np.uint8 else obj.tolist()
    if isinstance(obj, (list, tuple)):
        return [tree(v) for v in obj]
    if hasattr(obj, "__dict__"):
        return {k: tree(v) for k, v in sorted(vars(obj).items())}
    return obj


def model_tree(data: bytes) -> dict:
    return tree(fb.ModelT.InitFromPackedBuf(data, 0))


def pack(model: fb.ModelT) -> bytes:
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


# --- TFLM runs the embedded plan --------------------------------------------------------------
@needs_tflm
@pytest.mark.parametrize("planner", PLANNERS)
# TFLite Micro runs no legacy uint8 kernels.
@pytest.mark.parametrize("name", sorted(n for n in EXAMPLES if not n.endswith("_uint8")))
def test_examples_run_in_tflm_with_the_plan(name, planner):
    check_embedded(EXAMPLES[name](), planner)


@needs_tflm
@needs_shared_models
@pytest.mark.parametrize("planner", PLANNERS)
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_shared_models_run_in_tflm_with_the_plan(path, planner):
    _, head_before, _ = check_embedded(path.read_bytes(), planner, read_model(path))
    assert head_before == tflm_head_figures()[path.stem]


@needs_tflm
@needs_shared_models
def test_a_smaller_plan_shrinks_tflm_head():
    path = next((p for p in SHARED_MODEL_FILES if p.stem == "vww_96_int8"), None)
    if path is None:
        pytest.skip("vww_96_int8.tflite is not among the reference models")
    arena, head_before, head_after = check_embedded(path.read_bytes(), "greedy", read_model(path))
    assert (head_before, arena, head_after) == (73728, 64512, 64512)
    assert head_after < head_before


@needs_tflm
@pytest.mark.parametrize("name", ["residual_cnn_int8", "tiny_cnn_float32"])
def test_external_io_leaves_inputs_and_outputs_to_tflm(name):
    data = EXAMPLES[name]()
    model = parse_model(data)
    mp = plain(model, "greedy", external_io=True)
    out = embed_plan(data, mp)
    values = offline_values(parse_model(out))
    assert values == expected_values(model, mp)
    assert all(values[3 + t] == -1 for t in model.main.inputs + model.main.outputs)
    out_before, out_after, _, head = run_both(data, out, model.main)
    assert np.array_equal(out_before[0], out_after[0])
    # TFLM's online planner fits them around the offline plan, first-fit, above it if need be.
    assert head >= mp.arena_bytes


def mean_model(dtype: str) -> bytes:
    """x -> MEAN over H and W: TFLM's reference MEAN asks for scratch (int32 accumulators for
    int8, then one int per input dimension and one per axis)."""
    b = ModelBuilder(dtype)
    quant = (0.05, 0) if dtype == "int8" else (None, None)
    x = b.input("x", (1, 6, 6, 10), dtype, *quant)
    axis = b.const("axis", np.array([1, 2], np.int32))
    z = b.tensor("z", (1, 1, 1, 10), dtype, *quant)
    b.op("MEAN", [x, axis], [z], {"keep_dims": True}, 2 if dtype == "int8" else 1)
    b.output(z)
    return b.build()


@needs_tflm
@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_tflm_places_kernel_scratch_around_the_offline_plan(dtype):
    data = mean_model(dtype)
    model = parse_model(data)
    scratch = ([4 * 10] if dtype == "int8" else []) + [4 * 4, 4 * 2]
    padded = sum(-(-s // 16) * 16 for s in scratch)

    # Scratch is never planned offline; at MEAN both tensors are live and the plan has no gap,
    # so TFLM's online planner stacks the scratch on top of the offline arena.
    mp = plain(model, "greedy")
    out_before, out_after, _, head = run_both(data, embed_plan(data, mp), model.main)
    assert np.array_equal(out_before[0], out_after[0])
    assert head == mp.arena_bytes + padded

    # A plan that reserves the same scratch leaves gaps TFLM fills first-fit: head == arena.
    requests = [ScratchRequest(0, s, "TFLM reference MEAN", BufferKey(SCRATCH, 0, k))
                for k, s in enumerate(scratch)]
    mp = plain(model, "greedy", scratch=requests)
    out_before, out_after, _, head = run_both(data, embed_plan(data, mp), model.main)
    assert np.array_equal(out_before[0], out_after[0])
    assert head == mp.arena_bytes
    assert offline_values(parse_model(embed_plan(data, mp))) == expected_values(model, mp)


@needs_tflm
def test_variables_stay_with_tflm():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 8), "float32")
    state = b.variable("state", np.zeros((1, 8), np.float32))
    y = b.tensor("y", (1, 8), "float32")
    b.op("ADD", [x, state], [y])
    z = b.tensor("z", (1, 8), "float32")
    b.op("ADD", [y, y], [z])
    b.output(z)
    data = b.build()
    model = parse_model(data)
    mp = plain(model)
    out = embed_plan(data, mp)
    assert offline_values(parse_model(out))[3 + state] == -1
    out_before, out_after, _, head = run_both(data, out, model.main)
    assert np.array_equal(out_before[0], out_after[0]) and head == mp.arena_bytes


@needs_tflm
def test_entries_cover_every_subgraph():
    data = EXAMPLES["tiny_cnn_int8"]()
    two = fb.ModelT.InitFromPackedBuf(data, 0)
    two.subgraphs.append(copy.deepcopy(two.subgraphs[0]))
    data = pack(two)
    model = parse_model(data)
    mp = plain(model)
    out = embed_plan(data, mp)
    values = offline_values(parse_model(out))
    count = len(model.graphs[0].tensors)
    assert values[:3] == [1, 2, 2 * count]
    assert values[3 + count :] == [-1] * count
    out_before, out_after, _, _ = run_both(data, out, model.main)
    assert np.array_equal(out_before[0], out_after[0])


@needs_tflm
def test_tflm_refuses_an_entry_count_other_than_its_tensor_count():
    """Why the count must be exact: TFLM checks it (micro_allocation_info.cc)."""
    data = EXAMPLES["tiny_cnn_float32"]()
    embedded = fb.ModelT.InitFromPackedBuf(embed_plan(data, plain(parse_model(data))), 0)
    entry = next(m for m in embedded.metadata if m.name.decode() == METADATA_NAME)
    values = np.frombuffer(embedded.buffers[entry.buffer].data.tobytes(), "<i4").copy()
    values[2] -= 1
    embedded.buffers[entry.buffer].data = np.frombuffer(values[:-1].tobytes(), np.uint8)
    failures = []

    def load() -> None:
        try:
            tflm(pack(embedded), 1)
        except RuntimeError as e:
            failures.append(e)

    log = capture_fd(2, load)
    assert (
        failures
        and "Nbr of offline buffer offsets (20) in metadata not equal nbr tensors (21)" in log
    )


# --- the rest of the file is kept ----------------------------------------------------------
def unchanged_cases():
    cases = [pytest.param(EXAMPLES[n](), id=n) for n in ("tiny_cnn_int8", "residual_cnn_float32")]
    cases += [pytest.param(p, id=p.stem, marks=needs_shared_models) for p in SHARED_MODEL_FILES]
    return cases


@pytest.mark.parametrize("case", unchanged_cases())
def test_only_the_metadata_and_one_buffer_are_added(case):
    data = case if isinstance(case, bytes) else case.read_bytes()
    out = embed_plan(data, plain(parse_model(data)))
    before, after = model_tree(data), model_tree(out)
    assert len(after["buffers"]) == len(before["buffers"]) + 1
    names = [m["name"] for m in after["metadata"]]
    assert names.count(METADATA_NAME.encode()) == 1
    added = after["metadata"].pop(names.index(METADATA_NAME.encode()))
    assert added["buffer"] == len(after["buffers"]) - 1
    after["buffers"].pop()
    if not after["metadata"]:
        after["metadata"] = None
    assert after == before
    # parse_model sees the same model apart from the new metadata entry.
    original, embedded = parse_model(data), parse_model(out)
    assert {k: v for k, v in embedded.metadata.items() if k != METADATA_NAME} == original.metadata
    assert embedded.main.operators[0].options == original.main.operators[0].options


def test_buffers_stay_16_byte_aligned():
    data = EXAMPLES["residual_cnn_int8"]()
    out = embed_plan(data, plain(parse_model(data)))
    root = fb.Model.GetRootAs(out, 0)
    base = np.frombuffer(out, np.uint8).ctypes.data
    for i in range(root.BuffersLength()):
        buffer = root.Buffers(i)
        if buffer.DataLength():
            assert (buffer.DataAsNumpy().ctypes.data - base) % 16 == 0


def test_deterministic_and_an_existing_plan_is_replaced():
    data = EXAMPLES["residual_cnn_int8"]()
    model = parse_model(data)
    greedy, freelist = plain(model, "greedy"), plain(model, "freelist")
    once = embed_plan(data, greedy)
    assert embed_plan(data, greedy) == once
    assert embed_plan(once, greedy) == once  # replacing with the same plan changes nothing
    again = embed_plan(
        once, replace(freelist, program=replace(freelist.program, model=parse_model(once)))
    )
    replaced = parse_model(again)
    assert offline_values(replaced) == expected_values(model, freelist)
    assert list(replaced.metadata) == [METADATA_NAME]
    assert len(model_tree(again)["buffers"]) == len(model_tree(once)["buffers"])


# --- bad input ------------------------------------------------------------------------------
def test_a_plan_of_another_model_is_refused():
    data = EXAMPLES["tiny_cnn_int8"]()
    other = plain(parse_model(EXAMPLES["residual_cnn_int8"]()))
    with pytest.raises(PlanError, match="29 tensors.*has 21.*another model"):
        embed_plan(data, other)
    # Same tensor count, different sizes: the float twin of the model.
    twin = plain(parse_model(EXAMPLES["tiny_cnn_float32"]()))
    with pytest.raises(PlanError, match="another model"):
        embed_plan(data, twin)


def test_a_plan_unsafe_in_file_order_is_refused():
    data = EXAMPLES["residual_cnn_float32"]()
    mp = plain(parse_model(data))
    stacked = replace(mp, plan=replace(mp.plan, offsets=(0,) * len(mp.plan.offsets)))
    with pytest.raises(PlanError, match="not safe in the file's operator order"):
        embed_plan(data, stacked)


def test_plans_sharing_bytes_are_refused():
    data = EXAMPLES["tiny_cnn_float32"]()
    inplace = plan_model(parse_model(data), "greedy")  # in-place and overlaps by default
    with pytest.raises(PlanError, match="share bytes.*without in-place and overlaps"):
        embed_plan(data, inplace)


def test_a_plan_for_another_operator_order_is_refused():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 64), "float32")
    y1 = b.tensor("y1", (1, 64), "float32")
    b.op("RELU", [x], [y1])
    y2 = b.tensor("y2", (1, 64), "float32")
    b.op("RELU", [y1], [y2])
    z = b.tensor("z", (1, 64), "float32")
    b.op("TANH", [x], [z])
    out = b.tensor("out", (1, 64), "float32")
    b.op("ADD", [y2, z], [out])
    b.output(out)
    data = b.build()
    # Running TANH first frees x before y2 exists, so the plan puts them together; in the
    # file's order x is still alive when y2 is written.
    reordered = plain(parse_model(data), order=[2, 0, 1, 3])
    assert reordered.offset_of_tensor()[x] == reordered.offset_of_tensor()[y2]
    with pytest.raises(PlanError, match="another operator order"):
        embed_plan(data, reordered)


def test_misaligned_plans_are_refused():
    data = EXAMPLES["tiny_cnn_float32"]()
    with pytest.raises(PlanError, match="multiple of 16"):
        embed_plan(data, plain(parse_model(data), alignment=4))


def test_not_a_model_is_refused():
    mp = plain(parse_model(EXAMPLES["tiny_cnn_float32"]()))
    with pytest.raises(ModelError):
        embed_plan(b"not a flatbuffer at all", mp)


# --- embed_file -----------------------------------------------------------------------------
def test_embed_file_writes_the_embedded_model(example_path, tmp_path):
    path = example_path("tiny_cnn_int8")
    mp = plain(read_model(path))
    out = tmp_path / "out" / "model.tflite"
    out.parent.mkdir()
    embed_file(path, out, mp)
    assert out.read_bytes() == embed_plan(path.read_bytes(), mp)
    assert os.listdir(out.parent) == ["model.tflite"]
    embed_file(path, out, mp)  # overwrites in place
    assert os.listdir(out.parent) == ["model.tflite"]


def test_embed_file_leaves_nothing_on_error(example_path, tmp_path):
    path = example_path("tiny_cnn_int8")
    other = plain(read_model(example_path("residual_cnn_int8")))
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.tflite").write_bytes(b"old")
    with pytest.raises(PlanError):
        embed_file(path, out / "model.tflite", other)
    with pytest.raises(ModelError, match="no such file"):
        embed_file(tmp_path / "missing.tflite", out / "new.tflite", other)
    with pytest.raises(ArenacError, match="cannot write"):
        embed_file(path, tmp_path / "no-such-dir" / "x.tflite", plain(read_model(path)))
    assert os.listdir(out) == ["model.tflite"]
    assert (out / "model.tflite").read_bytes() == b"old"


@needs_tflm
@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_cli_embed_matches_what_plan_reports(capsys, tmp_path, path):
    """Acceptance: OUT.tflite from `arenac embed` gives TFLM's outputs, and TFLM's head is the
    arena `arenac plan --no-inplace --no-overlap --json` reports."""
    from toolchain.cli import main

    out = tmp_path / "out.tflite"
    assert main(["embed", str(path), "-o", str(out)]) == 0
    assert main(["plan", str(path), "--no-inplace", "--no-overlap", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    model = read_model(path)
    outputs = len(model.main.outputs)
    original = TFLMOracle(path.read_bytes(), outputs, arena_size=4 << 20)
    embedded = TFLMOracle(out.read_bytes(), outputs, arena_size=4 << 20)
    inputs = random_inputs(model.main, seed=3)
    for want, got in zip(original.invoke(inputs), embedded.invoke(inputs), strict=True):
        assert np.array_equal(want, got)
    assert_head_holds_the_plan(embedded.allocations()["head"], planned["arena_bytes"], model)


# --- the whole arena a TFLM user allocates ----------------------------------------------------
EMBED_MODELS = [
    *(pytest.param(name, id=name) for name in ("tiny_cnn_int8", "residual_cnn_int16")),
    *(pytest.param(p, id=p.stem) for p in SHARED_MODEL_FILES if p.stem == "kws_ref_model"),
]


@needs_tflm
@pytest.mark.parametrize("model", EMBED_MODELS)
def test_embed_total_is_the_arena_tflm_runs_in_and_no_byte_less(
    model, example_path, capsys, tmp_path
):
    path = example_path(model) if isinstance(model, str) else model
    out = tmp_path / "planned.tflite"  # never beside a shared model
    from toolchain.cli import main

    assert main(["embed", str(path), "-o", str(out), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    graph = read_model(path).main
    roomy = tflm(out.read_bytes(), len(graph.outputs)).allocations()
    assert (said["head_bytes"], said["tail_bytes"]) == (roomy["head"], roomy["tail"])
    assert said["total_bytes"] == said["head_bytes"] + said["tail_bytes"]
    assert said["head_bytes"] >= said["arena_bytes"]
    inputs = random_inputs(graph, seed=5)
    want = tflm(path.read_bytes(), len(graph.outputs)).invoke(inputs)
    exact = TFLMOracle(out.read_bytes(), len(graph.outputs), arena_size=said["total_bytes"])
    for w, got in zip(want, exact.invoke(inputs), strict=True):
        assert np.array_equal(w, got)
    with pytest.raises(RuntimeError, match="allocate"):
        TFLMOracle(out.read_bytes(), len(graph.outputs), arena_size=said["total_bytes"] - 16)


@needs_tflm
def test_embed_says_the_total_in_its_line(example_path, capsys, tmp_path):
    from toolchain.cli import main

    path = example_path("tiny_cnn_int8")
    out = tmp_path / "planned.tflite"
    assert main(["embed", str(path), "-o", str(out), "--json"]) == 0
    total = json.loads(capsys.readouterr().out)["total_bytes"]
    assert main(["embed", str(path), "-o", str(out)]) == 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and f"allocate {total} bytes for TFLite Micro" in line


def test_embed_without_tflite_micro_says_what_is_unknown(
    example_path, capsys, monkeypatch, tmp_path
):
    from toolchain.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "tflite_micro" else real(name, *rest))
    path = example_path("tiny_cnn_int8")
    out = tmp_path / "planned.tflite"
    assert main(["embed", str(path), "-o", str(out), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["measured"] is False
    assert said["head_bytes"] is said["tail_bytes"] is said["total_bytes"] is None
    assert main(["embed", str(path), "-o", str(out)]) == 0
    assert "install tflite-micro to measure the whole arena" in capsys.readouterr().out


def test_embed_warns_when_tflm_needs_more_with_the_plan_than_with_its_own(capsys, tmp_path):
    """keyword_scrambled_8bit: TFLM's own head is 672 bytes, 800 with the exported plan (it
    places its kernels' scratch around an offline plan). The file is still written; the
    warning and the JSON say what each costs."""
    from tests.conftest import SHARED_MODELS
    from toolchain.cli import main

    path = SHARED_MODELS / "recurrent" / "keyword_scrambled_8bit.tflite"
    if not path.exists() or importlib.util.find_spec("tflite_micro") is None:
        pytest.skip("needs the shared recurrent models and tflite-micro")
    out = tmp_path / "planned.tflite"
    assert main(["embed", str(path), "-o", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert (data["head_bytes"], data["own_head_bytes"]) == (800, 672)
    assert ("with this plan TFLite Micro's head is 800 bytes, above the 672 of its own plan"
            in captured.err)
    assert main(["embed", str(SHARED_MODELS / "kws_ref_model.tflite"), "-o", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
