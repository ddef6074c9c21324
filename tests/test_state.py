"""State across invokes and several subgraphs: the plan of a program that calls a subgraph, the
state block beside the arena, `reset` in every backend, `check` over sequences (and that it
fails when state is kept wrongly), `run` over a stacked sequence, TFLite Micro as the second
oracle, the Cortex-M4 under QEMU, and clean refusals of malformed calls and handles."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import flatbuffers
import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import assert_matches_oracle
from tests.ops.test_variables import (
    STATEFUL,
    accumulator,
    computed_start,
    nested_calls,
    two_variables,
)
from tests.test_codegen import style_problems
from tests.test_mcu import mcu_tools, needs_mcu  # noqa: F401 (the fixture needs_mcu uses)
from toolchain.c.generate import generate
from toolchain.errors import ModelError, PlanError
from toolchain.front.builder import FILE_IDENTIFIER, ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model
from toolchain.front.schema import fb
from toolchain.lab import c_backend, check
from toolchain.lab.c_backend import CBackend, compile_files, split_outputs, write_files
from toolchain.lab.check import check_plan, default_sequence, random_inputs
from toolchain.lab.oracle_process import run_in_child
from toolchain.lab.qemu_backend import QemuBackend
from toolchain.lower.plan import plan_model
from toolchain.lower.steps import CallOnce
from toolchain.planners import Placement, verify
from toolchain.views.report import plan_data, plan_text


def planned(data: bytes, name: str = "m.tflite", **options):
    return plan_model(parse_model(data, name), **options)


def sequence_outputs(mp, input_sets, sequence):
    """runtime_py over `input_sets`, reset every `sequence` sets."""
    runtime = ArenaInterpreter(mp)
    outputs = []
    for k, values in enumerate(input_sets):
        if k and k % sequence == 0:
            runtime.reset()
        outputs.append(runtime.invoke(values))
    return outputs


def input_sets(mp, count: int, seed: int = 0):
    return [random_inputs(mp.graph, seed + k) for k in range(count)]


# --- planning every subgraph -----------------------------------------------------------------


def test_a_called_subgraph_runs_within_its_callers_step():
    """The init subgraph's steps follow CALL_ONCE; its tensors live within them, and the main
    graph's tensor alive across the call stays alive through them."""
    mp = planned(computed_start())
    program = mp.program
    labels = [mp.step_label(step) for step in range(len(mp.lifetimes.order))]
    assert labels == [
        "op 0 ADD", "op 1 CALL_ONCE", "subgraph 1 op 0 ADD", "subgraph 1 op 1 RELU",
        "subgraph 1 op 2 VAR_HANDLE", "subgraph 1 op 3 ASSIGN_VARIABLE", "op 2 VAR_HANDLE",
        "op 3 READ_VARIABLE", "op 4 MUL", "op 5 ASSIGN_VARIABLE",
    ]
    assert call_ends(mp.steps) == {1: 6}
    lives = {program.tensor_label(r.tensor): (r.first_op, r.last_op) for r in mp.rows()}
    assert lives["subgraph 1 tensor 2"] == (2, 3)  # 'sum'
    assert lives["subgraph 1 tensor 3"] == (3, 5)  # 'relu'
    assert lives["tensor 1"] == (0, 8)  # 'doubled': across the call
    assert_matches_oracle(computed_start())


def call_ends(steps) -> dict[int, int]:
    """Step of each CALL_ONCE -> the step after the last of its subgraph's (nested included)."""
    ends = {}

    def last(block) -> int:
        end = -1
        for s in block:
            end = max(end, s.step)
            if isinstance(s, CallOnce):
                ends[s.step] = last(s.body) + 1
                end = max(end, ends[s.step] - 1)
        return end

    last(steps)
    return ends


def test_verify_sees_the_called_subgraphs_buffers():
    """A plan that puts the init subgraph's tensor over a main tensor alive across the call is
    unsafe, and `verify` says so."""
    mp = planned(computed_start(), planner="naive")
    program = mp.program
    position = {program.tensor_label(t): i for t, i in mp.lifetimes.tensor_buffers.items()}
    offsets = list(mp.plan.offsets)
    offsets[position["subgraph 1 tensor 2"]] = offsets[position["tensor 1"]]
    bad = Placement.from_offsets("bad", 16, mp.plan.buffers, offsets)
    with pytest.raises(PlanError):
        verify(bad)


def test_nested_calls_nest_their_steps():
    mp = planned(nested_calls())
    labels = [mp.step_label(step) for step in range(len(mp.lifetimes.order))]
    assert labels[:3] == ["op 0 CALL_ONCE", "subgraph 1 op 0 CALL_ONCE",
                          "subgraph 2 op 0 VAR_HANDLE"]
    assert call_ends(mp.steps) == {0: 9, 1: 4}
    assert [s.kind for s in mp.state_slots] == ["resource", "resource", "call_once", "call_once"]


def test_an_order_that_splits_a_call_is_refused():
    """A call's subgraph runs as a whole right after its CALL_ONCE, in any order of its own."""
    data = computed_start()
    assert planned(data).lifetimes.order == (0, 1, 6, 7, 8, 9, 2, 3, 4, 5)
    assert call_ends(planned(data, order=(0, 1, 8, 6, 7, 9, 2, 3, 4, 5)).steps) == {1: 6}
    for bad in [(1, 0, 6, 7, 8, 9, 2, 3, 4, 5), (0, 1, 6, 7, 8, 2, 9, 3, 4, 5)]:
        with pytest.raises(PlanError, match="right after the CALL_ONCE"):
            planned(data, order=bad)
    with pytest.raises(ModelError, match="before anything writes it"):
        planned(data, order=(0, 1, 7, 6, 8, 9, 2, 3, 4, 5))


def test_the_file_order_is_what_schedule_model_keeps():
    from toolchain.lower.plan import NO_TECHNIQUES

    mp = planned(computed_start(), techniques=NO_TECHNIQUES)
    assert mp.lifetimes.order == mp.program.file_order() == (0, 1, 6, 7, 8, 9, 2, 3, 4, 5)


# --- the state block -------------------------------------------------------------------------


def test_state_lives_beside_the_arena_and_the_plan_shows_it():
    mp = planned(two_variables())
    slots = [(s.kind, s.name, s.offset, s.nbytes) for s in mp.state_slots]
    assert slots == [("resource", "count", 0, 4), ("resource", "peak", 16, 12),
                     ("call_once", "subgraph 1 'init' ran", 32, 1)]
    assert mp.state_bytes == 33
    text = plan_text(mp)
    assert "state block: 33 bytes kept across invokes, outside the arena" in text
    assert re.search(r"\n\s+0\s+4\s+resource\s+count\s+int32\[1\]", text)
    assert re.search(r"\n\s+16\s+12\s+resource\s+peak\s+float32\[1, 3\]", text)
    assert "state        33 bytes (persistent, beside the arena)" in text
    assert "subgraph 1 'init': steps 1-4, within the step of op 0 CALL_ONCE" in text
    data = plan_data(mp)
    assert data["state_bytes"] == 33
    assert [(s["name"], s["bytes"]) for s in data["state"]] == [
        ("count", 4), ("peak", 12), ("subgraph 1 'init' ran", 1)]
    assert [g["subgraph"] for g in data["subgraphs"]] == [0, 1]


def test_the_cli_plan_prints_the_state_block(tmp_path):
    path = tmp_path / "acc.tflite"
    path.write_bytes(accumulator())
    result = cli("plan", str(path))
    assert result.returncode == 0, result.stderr
    assert "state block: 17 bytes" in result.stdout and "resource   acc" in result.stdout
    result = cli("plan", str(path), "--json")
    state = json.loads(result.stdout)["state"]
    assert [(s["kind"], s["name"], s["bytes"]) for s in state] == [
        ("resource", "acc", 16), ("call_once", "subgraph 1 'init' ran", 1)]


def test_models_without_state_have_none():
    mp = planned(EXAMPLES["tiny_cnn_int8"]())
    assert mp.state_slots == () and mp.state_bytes == 0
    assert "state" not in plan_text(mp).split("planner")[1].split("lower bound")[0]
    assert default_sequence(mp) == 1
    assert default_sequence(planned(accumulator())) == check.STATEFUL_SEQUENCE > 1


# --- generated C -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_generated_c_for_state_reads_like_careful_hand_written_c(name):
    files = generate(planned(STATEFUL[name]()), "m")
    for file_name, text in files.items():
        assert style_problems(text) == [], file_name


def test_the_header_lists_the_state_and_reset_restores_it():
    files = generate(planned(two_variables()), "s")
    header, source = files["s.h"], files["s.c"]
    assert "#define S_STATE_BYTES 33u" in header
    assert " *   bytes 0-3: resource variable 'count' int32[1]" in header
    assert " *   byte 32: whether CALL_ONCE ran subgraph 1 'init'" in header
    assert "ARENAC_ALIGN(16) static uint8_t s_state[33];" in source
    assert "memset(s_state + 32, 0, 1); /* whether CALL_ONCE ran subgraph 1 'init' */" in source
    assert "if (s_state[32] != 0) return;" in source
    body = re.search(r"static void s_op0_call_once\(void\) \{\n(.*?)\n\}", source, re.S).group(1)
    assert "s_sg1_op1_assign_variable(); /* step 2: subgraph 1 op 1 ASSIGN_VARIABLE */" in body
    # the init subgraph's kernels are defined before the CALL_ONCE that calls them
    assert source.index("static void s_sg1_op1_assign_variable") < source.index(
        "static void s_op0_call_once")
    assert "s_sg1_op1_assign_variable();" not in source.split("int s_invoke(void)")[1]


def test_nonzero_initial_state_is_in_the_block_from_the_start(tmp_path):
    """A variable tensor with data starts as its data without a reset first."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    state = b.variable("state", np.asarray([[1.0, 2.0, 3.0, 4.0]], np.float32))
    y = b.tensor("y", (1, 4), "float32")
    b.op("ADD", [x, state], [y])
    b.output(y)
    mp = planned(b.build())
    files = generate(mp, "v")
    assert re.search(r"static uint8_t v_state\[16\] = \{\n  0, 0, 128, 63,", files["v.c"])
    write_files(files, str(tmp_path))
    binary = compile_files(str(tmp_path), "v")
    x = np.zeros((1, 4), np.float32)
    out = subprocess.run([binary], input=x.tobytes(), capture_output=True, check=True).stdout
    assert np.frombuffer(out, np.float32).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_external_io_keeps_the_state_inside(tmp_path):
    mp = planned(accumulator("int8"), external_io=True)
    files = generate(mp, "ext", external_io=True)
    write_files(files, str(tmp_path))
    binary = compile_files(str(tmp_path), "ext")
    sets = input_sets(mp, 6)
    raw = subprocess.run([binary, "1", "3"], input=b"".join(v[0].tobytes() for v in sets),
                         capture_output=True, check=True).stdout
    expected = sequence_outputs(planned(accumulator("int8")), sets, 3)
    for got, want in zip(split_outputs(raw, mp.graph, 6), expected, strict=True):
        assert np.array_equal(got[0], want[0])


def test_the_harness_keeps_state_across_sets_and_resets_on_request():
    mp = planned(accumulator())
    sets = [[np.full((1, 4), k, np.float32)] for k in range(5)]
    with CBackend(mp) as backend:
        kept = [float(o[0][0, 0]) for o in backend.invoke_many(sets)]
        reset = [float(o[0][0, 0]) for o in backend.invoke_many(sets, 2)]
        assert [float(backend.invoke(s)[0][0, 0]) for s in sets[:2]] == [1.5, 2.5]
    assert kept == [1.5, 2.5, 4.5, 7.5, 11.5]
    assert reset == [1.5, 2.5, 3.5, 6.5, 5.5]


def test_generated_state_is_clean_under_sanitizers():
    for make in (accumulator, computed_start, nested_calls):
        data = make()
        mp = planned(data)
        with CBackend(mp, sanitize=True) as backend:
            assert check_plan(mp, data, inputs=2, extra=[("c", backend.invoke_many)]).ok


# --- check fails when state is kept wrongly ------------------------------------------------


class ResetForgets(ArenaInterpreter):
    """runtime_py whose reset restores nothing once the model has run."""

    ran = False

    def invoke(self, *args, **kwargs):
        self.ran = True
        return super().invoke(*args, **kwargs)

    def reset(self):
        if not self.ran:
            super().reset()


class StateInArena(ArenaInterpreter):
    """runtime_py that keeps the state in the (reused) arena."""

    def state_block(self, nbytes):
        return self.arena[:nbytes]


@pytest.mark.parametrize("make", [accumulator, computed_start, two_variables],
                         ids=lambda m: m.__name__)
@pytest.mark.parametrize("broken", [ResetForgets, StateInArena], ids=lambda c: c.__name__)
def test_check_fails_when_runtime_py_keeps_state_wrongly(monkeypatch, make, broken):
    data = make()
    mp = planned(data)
    assert mp.arena_bytes >= mp.state_bytes  # the arena is where StateInArena puts it
    assert check_plan(mp, data, inputs=2).ok
    monkeypatch.setattr(check, "ArenaInterpreter", broken)
    report = check_plan(mp, data, inputs=2)
    assert not report.ok
    if broken is ResetForgets:  # right until the first reset
        assert min(o.first_mismatch for o in report.outputs if o.first_mismatch) == [1, 0]


def forget_reset(files: dict[str, str]) -> dict[str, str]:
    return {name: re.sub(r"(void model_reset\(void\) \{\n).*?\n\}", r"\1}", text, flags=re.S)
            for name, text in files.items()}


def state_in_arena(files: dict[str, str]) -> dict[str, str]:
    return {name: re.sub(r"ARENAC_ALIGN\(16\) static uint8_t model_state\[\d+\];",
                         "#define model_state model_arena", text)
            for name, text in files.items()}


@pytest.mark.parametrize("make", [accumulator, computed_start, two_variables],
                         ids=lambda m: m.__name__)
@pytest.mark.parametrize("breaking", [forget_reset, state_in_arena], ids=lambda f: f.__name__)
def test_check_fails_when_the_c_keeps_state_wrongly(monkeypatch, make, breaking):
    data = make()
    mp = planned(data)
    monkeypatch.setattr(c_backend, "generate", lambda *a, **k: breaking(generate(*a, **k)))
    with CBackend(mp) as backend:
        report = check_plan(mp, data, inputs=2, extra=[("c", backend.invoke_many)])
    bad = [o for o in report.outputs if o.mismatches]
    assert bad and all(o.name.startswith("c:") for o in bad)
    if breaking is forget_reset:
        assert min(o.first_mismatch for o in bad) == [1, 0]


# --- the second oracle, and the Cortex-M4 ----------------------------------------------------


@pytest.mark.parametrize("name", sorted(n for n in STATEFUL if not n.endswith("uint8")))
def test_tflite_micro_agrees_over_sequences(name):
    """TFLite Micro (no uint8 kernels) as the oracle: a fresh interpreter after each reset."""
    data = STATEFUL[name]()
    mp = planned(data)
    sets = input_sets(mp, 6)
    tflm = run_in_child("tflm", data, sets, len(mp.graph.outputs), "m.tflite", (), 120.0, 3)
    for want, got in zip(tflm.outputs, sequence_outputs(mp, sets, 3), strict=True):
        for e, a in zip(want, got, strict=True):
            assert check.difference(e, a).mismatches == 0


@needs_mcu
@pytest.mark.parametrize("name", ["accumulator_int8", "two_variables", "streaming_kws_int8"])
def test_state_on_the_cortex_m4(name):
    data = STATEFUL[name]()
    mp = planned(data)
    sets = input_sets(mp, 6)
    with QemuBackend(mp) as backend:
        actual = backend.invoke_many(sets, 3)
    for want, got in zip(sequence_outputs(mp, sets, 3), actual, strict=True):
        for e, a in zip(want, got, strict=True):
            assert check.difference(e, a).mismatches == 0


# --- the command line --------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolchain.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_check_runs_sequences_by_default_for_a_model_with_state(tmp_path):
    path = tmp_path / "acc.tflite"
    path.write_bytes(accumulator("int8"))
    result = cli("check", str(path), "--json", "--inputs", "2")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["ok"], report["sequences"], report["sequence"]) == (True, 2, 3)
    result = cli("check", str(path), "--sequence", "5")
    assert result.returncode == 0, result.stderr
    assert "3 random sequence(s) of 5 invokes; state kept within a sequence" in result.stdout


def test_run_takes_a_stacked_sequence_and_writes_the_sequence_of_outputs(tmp_path):
    data = two_variables()
    path = tmp_path / "two.tflite"
    path.write_bytes(data)
    mp = planned(data)
    sets = input_sets(mp, 4)
    for i in range(2):
        np.save(tmp_path / f"in{i}.npy", np.stack([s[i] for s in sets]))
    result = cli("run", str(path), "--input", str(tmp_path / "in0.npy"), "--input",
                 str(tmp_path / "in1.npy"), "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("4 steps, state kept from one to the next")
    expected = sequence_outputs(mp, sets, 4)
    for i in range(2):
        saved = np.load(tmp_path / "out" / f"output_{i}.npy")
        assert saved.shape == (4, *expected[0][i].shape)
        assert np.array_equal(saved, np.stack([e[i] for e in expected]))


def test_run_refuses_sequences_of_different_lengths(tmp_path):
    path = tmp_path / "two.tflite"
    path.write_bytes(two_variables())
    np.save(tmp_path / "x.npy", np.zeros((3, 1, 3), np.float32))
    np.save(tmp_path / "step.npy", np.zeros((1,), np.int32))  # one value, not a sequence
    result = cli("run", str(path), "--input", str(tmp_path / "x.npy"), "--input",
                 str(tmp_path / "step.npy"), "--output-dir", str(tmp_path / "out"))
    assert_clean_failure(result, path, "they hold 3 steps, one value")
    assert not (tmp_path / "out").exists()
    np.save(tmp_path / "step.npy", np.zeros((3, 2), np.int32))
    result = cli("run", str(path), "--input", str(tmp_path / "x.npy"), "--input",
                 str(tmp_path / "step.npy"), "--output-dir", str(tmp_path / "out"))
    assert_clean_failure(result, tmp_path / "step.npy",
                         "must be int32[1] (one invoke) or int32[T, 1] (T invokes in a row)")


def test_inspect_shows_handles_and_resource_variables(tmp_path):
    path = tmp_path / "acc.tflite"
    path.write_bytes(accumulator())
    result = cli("inspect", str(path))
    assert result.returncode == 0, result.stderr
    assert re.search(r"acc/handle\s+resource\[\]\s+0\s+handle", result.stdout)
    assert "resource variables (state, beside the variable tensors): acc float32[1, 4]" \
        in result.stdout
    assert " NO" not in result.stdout


# --- malformed calls and handles: one line, exit 2 ------------------------------------------


def assert_clean_failure(result, path, words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0] and words in lines[0], lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


def edited(data: bytes, edit) -> bytes:
    model = fb.ModelT.InitFromPackedBuf(data, 0)
    edit(model)
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def call_index(index: int):
    def edit(model):
        model.subgraphs[0].operators[0].builtinOptions.initSubgraphIndex = index
    return edit


def drop_call_options(model):
    op = model.subgraphs[0].operators[0]
    op.builtinOptionsType, op.builtinOptions = 0, None


def init_calls_init(model):
    """Subgraph 2 (which subgraph 1 calls) calls subgraph 1 back: a cycle."""
    call = next(op for op in model.subgraphs[1].operators
                if op.builtinOptionsType == fb.BuiltinOptions.CallOnceOptions)
    back = fb.OperatorT(opcodeIndex=call.opcodeIndex, inputs=[], outputs=[])
    back.builtinOptionsType = fb.BuiltinOptions.CallOnceOptions
    back.builtinOptions = fb.CallOnceOptionsT()
    back.builtinOptions.initSubgraphIndex = 1
    model.subgraphs[2].operators.insert(0, back)


def init_with_output(model):
    model.subgraphs[1].outputs = [1]  # the start value


def handle_input_out_of_range(model):
    model.subgraphs[0].operators[2].inputs = [99]  # READ_VARIABLE's handle


def handle_is_the_input(model):
    model.subgraphs[0].operators[2].inputs = [0]  # READ_VARIABLE reads the float input


def wide_handle(model):
    model.subgraphs[0].tensors[1].shape = [3]


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (call_index(7), "op 0 CALL_ONCE calls subgraph 7, but the model has 2 subgraphs"),
        (call_index(-1), "op 0 CALL_ONCE calls subgraph -1, but the model has 2 subgraphs"),
        (call_index(0), "op 0 CALL_ONCE calls its own subgraph 0"),
        (drop_call_options, "op 0 CALL_ONCE: its options lack init_subgraph_index"),
        (init_calls_init, "CALL_ONCE calls form a cycle: subgraph 1 -> subgraph 2 -> subgraph 1"),
        (init_with_output, "calls subgraph 1, which has inputs or outputs"),
        (handle_input_out_of_range, "operator 2 (READ_VARIABLE) inputs name tensor 99"),
        (handle_is_the_input, "op 2 READ_VARIABLE: no kernel for float32 -> float32"),
        (wide_handle, "its handle (tensor 1 'acc/handle') has shape [3], not one element"),
    ],
    ids=lambda v: getattr(v, "__name__", None) if callable(v) else None,
)
@pytest.mark.parametrize("command", ["check", "run", "gen"])
def test_malformed_calls_and_handles_fail_cleanly(tmp_path, edit, words, command):
    path = tmp_path / "bad.tflite"
    path.write_bytes(edited(nested_calls() if edit is init_calls_init else accumulator(), edit))
    out = tmp_path / "out"
    np.save(tmp_path / "x.npy", np.zeros((1, 4), np.float32))
    args = {"check": [], "run": ["--input", str(tmp_path / "x.npy"), "--output-dir", str(out)],
            "gen": ["-o", str(out)]}[command]
    assert_clean_failure(cli(command, str(path), *args), path, words)
    assert not out.exists()


def test_a_cycle_of_calls_fails_even_inspect(tmp_path):
    path = tmp_path / "cycle.tflite"
    path.write_bytes(edited(nested_calls(), init_calls_init))
    assert_clean_failure(cli("inspect", str(path)), path, "form a cycle")


def test_the_tflite_interpreters_refuse_what_arenac_refuses():
    """LiteRT refuses the same malformed calls (a self call, an out-of-range index)."""
    from toolchain.lab.oracle import LiteRTOracle

    for edit, words in ((call_index(0), "GetSubgraphIndex"), (call_index(7), "subgraphs->size")):
        with pytest.raises(RuntimeError, match=words):
            LiteRTOracle(edited(accumulator(), edit)).invoke([np.zeros((1, 4), np.float32)])


def test_embedded_plan_covers_the_called_subgraphs():
    """embed writes the init subgraph's tensors' offsets too; TFLite Micro runs the result."""
    pytest.importorskip("tflite_micro")
    from tests.test_embed import check_embedded

    arena, _, head = check_embedded(computed_start(), "greedy")
    assert head == arena
