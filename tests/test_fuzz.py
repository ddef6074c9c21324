"""Hostile models through the whole pipeline (tests/fuzz.py): a few hundred mutants of the
built-in seeds must each run cleanly or be refused in one line naming the file, and the
fuzzer itself must record what it is there to record."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, reject, settings

from tests import fuzz
from toolchain.errors import ModelError
from toolchain.front.reader import parse_model

SEEDS = fuzz.builtin_seeds()
# One example in COMPILE_SHARE builds and runs its C: compiling is the slow part.
COMPILE_SHARE = 8


@pytest.fixture(scope="module")
def worker():
    with fuzz.Worker() as w:
        yield w


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(example=fuzz.examples(sorted(SEEDS), COMPILE_SHARE))
def test_hostile_models_run_cleanly_or_are_refused(worker, example):
    try:
        mutant = fuzz.mutate(SEEDS, example)
    except fuzz.Inapplicable:
        reject()
    outcome = worker.run(mutant.data, example.compile_c, example.planning)
    result = fuzz.Result(example, mutant, outcome)
    assert not result.outcome.is_finding, fuzz.describe(result)


@pytest.mark.parametrize("name", sorted(SEEDS))
def test_every_seed_passes_every_python_stage(worker, name):
    outcome = worker.run(SEEDS[name], compile_c=False)
    assert (outcome.verdict, outcome.stage) == ("ok", "generate"), outcome.message


@pytest.mark.parametrize(
    "planning", [fuzz.DEFAULT, fuzz.Planning("greedy", False, False, "model", True)], ids=str
)
def test_a_seed_passes_the_sanitized_c(worker, planning):
    outcome = worker.run(SEEDS["elementwise_int8"], True, planning)
    assert (outcome.verdict, outcome.compiled) == ("ok", True), outcome.message


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(example=fuzz.examples(sorted(SEEDS)))
def test_every_mutation_packs_and_says_what_it_did(example):
    mutant = fuzz.mutate(SEEDS, example)
    assert len(mutant.notes) == len(example.edits) + len(example.byte_edits)
    assert all(mutant.notes)


def test_a_hostile_name_reaches_the_file():
    name = b"*/ int injected; /*\n"
    example = fuzz.Example("tiny_cnn_int8", (fuzz.Mutation("name", (0, name)),))
    model = parse_model(fuzz.mutate(SEEDS, example).data, fuzz.SOURCE)
    assert model.main.tensors[0].name == name.decode()


@pytest.mark.parametrize("value", [0, 2**31 - 1, -1])
def test_a_semantic_edit_changes_what_the_reader_sees(value):
    """stride_h of the first convolution, through the object API and back."""
    options = sorted(vars(fuzz.fb.ModelT.InitFromPackedBuf(SEEDS["tiny_cnn_int8"], 0)
                          .subgraphs[0].operators[0].builtinOptions))
    which = options.index("strideH")
    choice = fuzz.SLOT_VALUES["Int32"].index(value)
    example = fuzz.Example("tiny_cnn_int8", (fuzz.Mutation("option", (0, which, choice)),))
    model = parse_model(fuzz.mutate(SEEDS, example).data, fuzz.SOURCE)
    assert model.main.operators[0].options["stride_h"] == value


# --- the worker records what goes wrong --------------------------------------------------
# Functions the worker runs instead of the pipeline; it imports this module by name.


def abort_during(stage, name: str, last_words: str):
    stage(name)
    print(last_words, file=sys.stderr, flush=True)
    os.abort()


def sleep_during(stage, name: str, seconds: float):
    stage(name)
    time.sleep(seconds)
    return fuzz.Outcome("ok", name)


def raise_during(stage, name: str, error_type: type, *args):
    stage(name)
    raise error_type(*args)


def test_a_crash_is_recorded_and_the_worker_replaced(worker):
    outcome = worker.call(abort_during, "plan", "free(): invalid pointer")
    assert (outcome.verdict, outcome.stage) == ("crash", "plan")
    assert outcome.key == "signal SIGABRT: free(): invalid pointer", outcome.key
    assert worker.run(SEEDS["tiny_cnn_int8"], compile_c=False).verdict == "ok"


def test_a_hang_is_recorded_and_the_worker_replaced():
    with fuzz.Worker() as impatient:
        # the first call imports this module in the worker, which a busy machine may take
        # seconds over: patience runs out only once the worker has it
        assert impatient.call(sleep_during, "parse", 0).verdict == "ok"
        impatient.timeouts = fuzz.Timeouts(python=2.0)
        outcome = impatient.call(sleep_during, "runtime_py", 60)
        assert (outcome.verdict, outcome.stage) == ("hang", "runtime_py")  # killed, not awaited
        impatient.timeouts = fuzz.Timeouts()  # a new worker starts, and imports this again
        assert impatient.call(sleep_during, "parse", 0).verdict == "ok"


@pytest.mark.parametrize(
    ("error", "args", "verdict"),
    [
        (ModelError, ("tensor 3 is wrong", fuzz.SOURCE), "refused"),
        (ModelError, ("tensor 3 is wrong", None), "unclean-refusal"),
        (ModelError, ("tensor 3\nis wrong", fuzz.SOURCE), "unclean-refusal"),
        (ModelError, ("tensor '\u202e' is wrong", fuzz.SOURCE), "unclean-refusal"),
        (ZeroDivisionError, ("division by zero",), "traceback"),
        (MemoryError, (), "traceback"),
    ],
)
def test_outcomes_are_classified(worker, error, args, verdict):
    outcome = worker.call(raise_during, "generate", error, *args)
    assert (outcome.verdict, outcome.stage) == (verdict, "generate"), outcome.message
    assert outcome.is_finding == (verdict != "refused")


# --- campaigns ---------------------------------------------------------------------------


HARMLESS = fuzz.Mutation("text", (0, b"harmless"))
OUT_OF_RANGE = fuzz.Mutation("zero_point", (0, 0, 2**40))  # of the input: refused
TOGGLE = fuzz.Mutation("variable", (0,))
TRUNCATE = fuzz.Mutation("truncate", (10,))


def result(stage: str, verdict: str, key: str, edits: int) -> fuzz.Result:
    example = fuzz.Example(
        "tiny_cnn_int8", tuple(fuzz.Mutation("variable", (i,)) for i in range(edits))
    )
    return fuzz.Result(example, fuzz.mutate(SEEDS, example), fuzz.Outcome(verdict, stage, key, key))


def test_one_reproducer_per_distinct_finding(tmp_path):
    tally = fuzz.Tally()
    for r in (
        result("plan", "traceback", "KeyError in toolchain/lower/plan.py:plan_model", 2),
        result("plan", "traceback", "KeyError in toolchain/lower/plan.py:plan_model", 1),
        result("compile", "compile-error", "error: 'x' undeclared", 1),
        result("parse", "refused", "fuzz.tflite: corrupt", 1),
        result("compare", "ok", "", 1),
    ):
        tally.add(r)
    (tmp_path / "finding-099.txt").write_text("from an earlier campaign")
    written = fuzz.write_reproducers(tally, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "finding-001.tflite", "finding-001.txt", "finding-002.tflite", "finding-002.txt",
    ]
    first = (tmp_path / "finding-001.txt").read_text()
    assert "seen 2 times" in first and "stage: plan" in first and "KeyError" in first
    assert "variable(0,)" in first
    text = fuzz.summary(tally, 2.0, 2, written)
    assert "5 examples" in text and "2.50 per second" in text
    assert "findings       3  (2 distinct)" in text and "refused        1  (parse 1)" in text


@pytest.mark.parametrize(
    ("edits", "byte_edits"),
    [
        ((HARMLESS, OUT_OF_RANGE, HARMLESS, HARMLESS), ()),
        ((HARMLESS, TOGGLE, TOGGLE), (TRUNCATE,)),
    ],
)
def test_shrinking_keeps_only_the_mutations_that_matter(edits, byte_edits):
    """Any outcome shrinks the same way as a finding: here, two clean refusals."""
    pool = fuzz.Pool(1, fuzz.Timeouts())
    try:
        example = fuzz.Example("tiny_cnn_int8", edits, byte_edits, fuzz.Planning("naive"), False)
        found = pool.evaluate(SEEDS, example)
        shrunk = fuzz.shrink(pool, SEEDS, found)
    finally:
        pool.close()
    assert found.outcome.verdict == "refused", found.outcome.message
    assert shrunk.outcome.signature == found.outcome.signature
    minimal = ((), (TRUNCATE,)) if byte_edits else ((OUT_OF_RANGE,), ())
    assert (shrunk.example.edits, shrunk.example.byte_edits) == minimal
    assert shrunk.example.planning == fuzz.DEFAULT


@pytest.mark.parametrize("flags", ["", "--planner greedy --no-inplace --external-io"])
def test_replay_from_the_command_line(tmp_path, flags):
    """A reproducer is replayed with the planning flags its text file names."""
    path = tmp_path / "finding-001.tflite"
    path.write_bytes(SEEDS["moves_float32"])
    if flags:
        path.with_suffix(".txt").write_text(f"kind:  mismatch\nflags: {flags}\n")
    run = subprocess.run(
        [sys.executable, "-m", "tests.fuzz", "--replay", str(path)],
        capture_output=True, text=True, timeout=300, cwd=fuzz.ROOT,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == f"{path} ({flags or 'defaults'}): [compare] ok:"


@given(fuzz.PLANNINGS)
@settings(max_examples=50, database=None)
def test_planning_flags_round_trip(planning):
    assert fuzz.Planning.from_flags(planning.flags()) == planning


def test_draws_are_repeatable():
    assert fuzz.draw_examples(20, 7, sorted(SEEDS)) == fuzz.draw_examples(20, 7, sorted(SEEDS))
    assert fuzz.draw_examples(20, 7, sorted(SEEDS)) != fuzz.draw_examples(20, 8, sorted(SEEDS))



@pytest.mark.parametrize("example", [
    # every stripe of a segment written out with constant rows: no cursor is declared
    fuzz.Example("padded_int8", (fuzz.Mutation("op_list", (105, 59, 4096)),),
                 planning=fuzz.Planning("greedy", external_io=True)),
    # a loop body fed its own counter: runtime_py stops it at the iteration limit
    fuzz.Example("variable_in_loop", (fuzz.Mutation("op_input", (1549, 186, 3861)),)),
], ids=["unread stripe cursor", "endless loop"])
def test_campaign_findings_stay_fixed(worker, example):
    outcome = worker.run(fuzz.mutate(SEEDS, example).data, example.compile_c, example.planning)
    assert not outcome.is_finding, outcome.message


def test_hostile_user_files_are_read_or_refused_in_one_line(tmp_path):
    """A dozen of the campaign's data files, memory descriptions and solve problems."""
    problems = []
    for k, case in enumerate(fuzz.user_files(12, seed=3)):
        (tmp_path / str(k)).mkdir()
        problem = fuzz.run_user_file(case, str(tmp_path / str(k)))
        if problem:
            problems.append((case.note, problem))
    assert problems == []


def test_an_npy_header_numpy_cannot_tokenize_is_one_line(tmp_path):
    """A header cut inside its dict: numpy's parser raises tokenize's TokenError."""
    case = fuzz.UserFile("run", "x.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': '|i1',\n", "cut")
    assert fuzz.run_user_file(case, str(tmp_path)) is None


def test_a_sound_memory_file_whose_pools_are_too_small_is_a_refusal_not_a_finding(tmp_path):
    """The campaign's one finding at 200 files: a pool of 1 byte. The model does not fit it,
    which `plan` says in one line naming the model (exit 2): a result, not a defect."""
    case = fuzz.UserFile("plan", "memory.json", b'{"pools": [{"name": "fast", "size": 1}]}',
                         "a pool of 1 byte")
    assert fuzz.run_user_file(case, str(tmp_path)) is None
