"""IF and WHILE with their subgraphs: runtime_py and the compiled C against LiteRT's reference
kernels (both branches taken, loops of data-dependent trip counts, an IF inside a WHILE, a
resource variable updated inside a branch over sequences of invokes), the plan of every
subgraph, and one-line refusals of what TFLite would not run or arenac does not plan."""

from __future__ import annotations

import subprocess
import sys

import flatbuffers
import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import assert_matches_oracle
from tests.test_codegen import style_problems
from tests.test_mcu import mcu_tools, needs_mcu  # noqa: F401 (the fixture needs_mcu uses)
from toolchain.c.generate import SHARED_NAME, generate, generate_shared
from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.front.builder import FILE_IDENTIFIER, ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.front.schema import fb
from toolchain.lab.c_backend import STRICT_FLAGS, compiler, split_outputs, write_files
from toolchain.lab.check import random_inputs
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import plan_model
from toolchain.lower.steps import RunWhile
from toolchain.planners import Pool, verify
from toolchain.views.report import plan_text

INT8 = (0.05, -3)  # scale and zero point of the int8 test tensors


def planned(data: bytes, **options):
    return plan_model(parse_model(data, "m.tflite"), **options)


def branch(b: ModelBuilder, name: str, ops, shape=(1, 4), dtype="float32", quant=(None, None)):
    """A branch subgraph of two inputs x, y running `ops` (opcodes, each applied to the value
    so far and y) and handing back the last value."""
    g = b.subgraph(name)
    x = g.input("x", shape, dtype, *quant)
    y = g.input("y", shape, dtype, *quant)
    value = x
    for k, opcode in enumerate(ops):
        out = g.tensor(f"{name}/{k}", shape, dtype, *quant)
        inputs = [value] if opcode in ("RELU", "TANH", "LOGISTIC") else [value, y]
        g.op(opcode, inputs, [out], version=2 if dtype == "int8" and opcode != "RELU" else 1)
        value = out
    g.output(value)
    return g


def if_float() -> bytes:
    """A bool input picks a branch of several ops: ADD, RELU, MUL or SUB, MUL."""
    b = ModelBuilder("float32")
    then = branch(b, "then", ["ADD", "RELU", "MUL"])
    otherwise = branch(b, "else", ["SUB", "MUL"])
    c = b.input("c", (1,), "bool")
    x, y = b.input("x", (1, 4), "float32"), b.input("y", (1, 4), "float32")
    (out,) = b.if_(c, then, otherwise, [x, y])
    b.output(out)
    return b.build()


def if_int8() -> bytes:
    """int8, the condition computed from the data (which of two values is larger, as bool):
    then ADD then RELU, else MUL; the branches' outputs feed an op after the IF."""
    b = ModelBuilder("int8")
    then = branch(b, "then", ["ADD", "RELU"], dtype="int8", quant=INT8)
    otherwise = branch(b, "else", ["MUL"], dtype="int8", quant=INT8)
    x = b.input("x", (1, 4), "int8", *INT8)
    y = b.input("y", (1, 4), "int8", *INT8)
    pair = b.input("pair", (1, 2), "float32")
    index = b.tensor("argmax", (1,), "int32")
    b.op("ARG_MAX", [pair, b.const("axis", np.asarray([1], np.int32))], [index],
         {"output_type": "INT32"})
    c = b.tensor("c", (1,), "bool")
    b.op("CAST", [index], [c])
    (chosen,) = b.if_(c, then, otherwise, [x, y])
    out = b.tensor("out", (1, 4), "int8", *INT8)
    b.op("ADD", [chosen, x], [out], version=2)
    b.output(out)
    return b.build()


def counter_loop() -> bytes:
    """WHILE i != n: i += 1, acc += step, n passed through; n = max(int8 input, 0) gives a
    data-dependent trip count (up to 127), i starts as a constant."""
    b = ModelBuilder("float32")
    cond, body = b.subgraph("cond"), b.subgraph("body")
    for g in (cond, body):
        g.i, g.n = g.input("i", (1,), "int32"), g.input("n", (1,), "int32")
        g.acc = g.input("acc", (1, 4), "float32")
    left = cond.tensor("left", (1,), "int32")
    cond.op("SUB", [cond.n, cond.i], [left])
    going = cond.tensor("going", (1,), "bool")
    cond.op("CAST", [left], [going])
    cond.output(going)
    i_next = body.tensor("i_next", (1,), "int32")
    body.op("ADD", [body.i, body.const("one", np.ones(1, np.int32))], [i_next])
    acc_next = body.tensor("acc_next", (1, 4), "float32")
    body.op("ADD", [body.acc, body.const("step", np.asarray([[0.5, -1, 2, 0.25]], np.float32))],
            [acc_next])
    for t in (i_next, body.n, acc_next):
        body.output(t)
    raw = b.input("n", (1,), "int8")
    wide = b.tensor("n32", (1,), "int32")
    b.op("CAST", [raw], [wide])
    n = b.tensor("n_clipped", (1,), "int32")
    b.op("MAXIMUM", [wide, b.const("zero", np.zeros(1, np.int32))], [n])
    x = b.input("x", (1, 4), "float32")
    i, _, acc = b.while_(cond, body, [b.const("start", np.zeros(1, np.int32)), n, x])
    b.output(i)
    b.output(acc)
    return b.build()


def fc_loop() -> bytes:
    """int8: WHILE i != n: h = FULLY_CONNECTED(h) (a tanh-like bounded recurrence), i += 1;
    n = min(max(int8 input, 0), 12)."""
    b = ModelBuilder("int8")
    cond, body = b.subgraph("cond"), b.subgraph("body")
    for g in (cond, body):
        g.i, g.n = g.input("i", (1,), "int32"), g.input("n", (1,), "int32")
        g.h = g.input("h", (1, 8), "int8", *INT8)
    left = cond.tensor("left", (1,), "int32")
    cond.op("SUB", [cond.n, cond.i], [left])
    going = cond.tensor("going", (1,), "bool")
    cond.op("CAST", [left], [going])
    cond.output(going)
    i_next = body.tensor("i_next", (1,), "int32")
    body.op("ADD", [body.i, body.const("one", np.ones(1, np.int32))], [i_next])
    rng = np.random.default_rng(3)
    weights = body.const("w", rng.integers(-60, 60, (8, 8)).astype(np.int8), 0.02, 0)
    bias = body.const("bias", rng.integers(-200, 200, 8).astype(np.int32), 0.05 * 0.02, 0)
    h_next = body.tensor("h_next", (1, 8), "int8", *INT8)
    body.op("FULLY_CONNECTED", [body.h, weights, bias], [h_next], {"fused_activation_function":
                                                                   "RELU"}, version=4)
    for t in (i_next, body.n, h_next):
        body.output(t)
    raw = b.input("n", (1,), "int8")
    wide = b.tensor("n32", (1,), "int32")
    b.op("CAST", [raw], [wide])
    low = b.tensor("n_low", (1,), "int32")
    b.op("MAXIMUM", [wide, b.const("zero", np.zeros(1, np.int32))], [low])
    n = b.tensor("n_clipped", (1,), "int32")
    b.op("MINIMUM", [low, b.const("most", np.full(1, 12, np.int32))], [n])
    h = b.input("h", (1, 8), "int8", *INT8)
    _, _, final = b.while_(cond, body, [b.const("start", np.zeros(1, np.int32)), n, h])
    b.output(final)
    return b.build()


def if_in_while() -> bytes:
    """WHILE i != n (n in [0, 9]): acc = IF(i != 3) acc + x else acc * x; i += 1."""
    b = ModelBuilder("float32")
    cond, body = b.subgraph("cond"), b.subgraph("body")
    then = branch(b, "then", ["ADD"])
    otherwise = branch(b, "else", ["MUL", "TANH"])
    for g in (cond, body):
        g.i, g.n = g.input("i", (1,), "int32"), g.input("n", (1,), "int32")
        g.acc, g.x = g.input("acc", (1, 4), "float32"), g.input("x", (1, 4), "float32")
    left = cond.tensor("left", (1,), "int32")
    cond.op("SUB", [cond.n, cond.i], [left])
    going = cond.tensor("going", (1,), "bool")
    cond.op("CAST", [left], [going])
    cond.output(going)
    off = body.tensor("off", (1,), "int32")
    body.op("SUB", [body.i, body.const("three", np.full(1, 3, np.int32))], [off])
    pick = body.tensor("pick", (1,), "bool")
    body.op("CAST", [off], [pick])
    (acc_next,) = body.if_(pick, then, otherwise, [body.acc, body.x])
    i_next = body.tensor("i_next", (1,), "int32")
    body.op("ADD", [body.i, body.const("one", np.ones(1, np.int32))], [i_next])
    for t in (i_next, body.n, acc_next, body.x):
        body.output(t)
    raw = b.input("n", (1,), "int8")
    wide = b.tensor("n32", (1,), "int32")
    b.op("CAST", [raw], [wide])
    low = b.tensor("n_low", (1,), "int32")
    b.op("MAXIMUM", [wide, b.const("zero", np.zeros(1, np.int32))], [low])
    n = b.tensor("n_clipped", (1,), "int32")
    b.op("MINIMUM", [low, b.const("most", np.full(1, 9, np.int32))], [n])
    x = b.input("x", (1, 4), "float32")
    acc = b.input("acc", (1, 4), "float32")
    _, _, final, _ = b.while_(cond, body, [b.const("start", np.zeros(1, np.int32)), n, acc, x])
    b.output(final)
    return b.build()


def variable_in_branch() -> bytes:
    """The streaming recipe: CALL_ONCE sets 'acc' to zero; each invoke passes its handle into an
    IF whose then branch adds the input to the variable and assigns it back, and whose else
    branch reads it only; the IF outputs the value."""
    b = ModelBuilder("float32")
    init = b.subgraph("init")
    init.assign_variable(init.var_handle("acc"), init.const("acc/zero",
                                                             np.zeros((1, 4), np.float32)))
    then, otherwise = b.subgraph("then"), b.subgraph("else")
    for g in (then, otherwise):
        g.handle = g.input("handle", (), "resource")
        g.x = g.input("x", (1, 4), "float32")
        g.old = g.read_variable(g.handle, (1, 4), "float32", name=f"{g._name}/old")
    new = then.tensor("then/new", (1, 4), "float32")
    then.op("ADD", [then.old, then.x], [new])
    then.assign_variable(then.handle, new)
    then.output(new)
    otherwise.output(otherwise.old)
    c = b.input("c", (1,), "bool")
    x = b.input("x", (1, 4), "float32")
    b.call_once(init)
    handle = b.var_handle("acc")
    (value,) = b.if_(c, then, otherwise, [handle, x])
    b.output(value)
    return b.build()


def variable_in_loop() -> bytes:
    """A WHILE carries the handle of 'acc' (passed through unchanged): each iteration reads the
    variable, adds the input and assigns it back; after the loop the main graph reads it through
    the WHILE's handle output. n = max(int8 input, 0) % small: the trip count of each invoke."""
    b = ModelBuilder("float32")
    init = b.subgraph("init")
    init.assign_variable(init.var_handle("acc"), init.const("acc/zero",
                                                             np.zeros((1, 4), np.float32)))
    cond, body = b.subgraph("cond"), b.subgraph("body")
    for g in (cond, body):
        g.i, g.n = g.input("i", (1,), "int32"), g.input("n", (1,), "int32")
        g.handle, g.x = g.input("handle", (), "resource"), g.input("x", (1, 4), "float32")
    left = cond.tensor("left", (1,), "int32")
    cond.op("SUB", [cond.n, cond.i], [left])
    going = cond.tensor("going", (1,), "bool")
    cond.op("CAST", [left], [going])
    cond.output(going)
    old = body.read_variable(body.handle, (1, 4), "float32", name="acc/old")
    new = body.tensor("acc/new", (1, 4), "float32")
    body.op("ADD", [old, body.x], [new])
    body.assign_variable(body.handle, new)
    i_next = body.tensor("i_next", (1,), "int32")
    body.op("ADD", [body.i, body.const("one", np.ones(1, np.int32))], [i_next])
    for t in (i_next, body.n, body.handle, body.x):
        body.output(t)
    raw = b.input("n", (1,), "int8")
    wide = b.tensor("n32", (1,), "int32")
    b.op("CAST", [raw], [wide])
    low = b.tensor("n_low", (1,), "int32")
    b.op("MAXIMUM", [wide, b.const("zero", np.zeros(1, np.int32))], [low])
    n = b.tensor("n_clipped", (1,), "int32")
    b.op("MINIMUM", [low, b.const("most", np.full(1, 5, np.int32))], [n])
    x = b.input("x", (1, 4), "float32")
    b.call_once(init)
    handle = b.var_handle("acc")
    _, _, passed, _ = b.while_(cond, body, [b.const("start", np.zeros(1, np.int32)), n, handle,
                                            x])
    b.output(b.read_variable(passed, (1, 4), "float32", name="acc/final"))
    return b.build()


def if_pass_through() -> bytes:
    """Branches that hand back an input unchanged, a constant, and a value computed before
    other ops of the branch; the else branch has no ops at all."""
    b = ModelBuilder("float32")
    then, otherwise = b.subgraph("then"), b.subgraph("else")
    for g in (then, otherwise):
        g.x, g.y = g.input("x", (1, 4), "float32"), g.input("y", (1, 4), "float32")
    early = then.tensor("early", (1, 4), "float32")
    then.op("RELU", [then.x], [early])
    late = then.tensor("late", (1, 4), "float32")
    then.op("MUL", [then.y, then.y], [late])
    later = then.tensor("later", (1, 4), "float32")
    then.op("SUB", [late, then.x], [later])
    for t in (then.y, then.const("c", np.full((1, 4), 2.5, np.float32)), early, later):
        then.output(t)
    for t in (otherwise.x, otherwise.const("d", np.full((1, 4), -1, np.float32)), otherwise.y,
              otherwise.x):
        otherwise.output(t)
    c = b.input("c", (1,), "bool")
    x, y = b.input("x", (1, 4), "float32"), b.input("y", (1, 4), "float32")
    outs = b.if_(c, then, otherwise, [x, y])
    total = b.tensor("total", (1, 4), "float32")
    b.op("ADD", [outs[0], outs[3]], [total])
    for t in (*outs[1:3], total):
        b.output(t)
    return b.build()


MODELS = {
    "if_pass_through": if_pass_through,
    "if_float": if_float,
    "if_int8": if_int8,
    "counter_loop": counter_loop,
    "fc_loop": fc_loop,
    "if_in_while": if_in_while,
    "variable_in_branch": variable_in_branch,
    "variable_in_loop": variable_in_loop,
}


def branches_taken(data: bytes, count: int) -> set[bool]:
    """The values the first IF's condition takes in runtime_py over the input sets
    assert_matches_oracle draws (seeds 0 to count - 1)."""
    mp = planned(data)
    graph = mp.graph
    control = next(c for c in mp.program.controls.values() if c.opcode == "IF")
    producer = graph.producers().get(control.condition)
    runtime = ArenaInterpreter(mp)
    seen: set[bool] = set()

    def record(op: int, outputs: list[np.ndarray]) -> None:
        if op == producer:
            seen.add(bool(outputs[0].reshape(-1)[0]))

    for k in range(count):
        inputs = random_inputs(graph, k)
        if producer is None:
            seen.add(bool(inputs[graph.inputs.index(control.condition)].reshape(-1)[0]))
        runtime.invoke(inputs, observe=record)
    return seen


# --- bit-exact against LiteRT ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["if_float", "if_int8", "if_pass_through", "if_in_while"])
def test_if_takes_both_branches_bit_exact(name):
    data = MODELS[name]()
    assert branches_taken(data, 6) == {True, False}
    assert_matches_oracle(data, inputs=6)


@pytest.mark.parametrize("name", ["counter_loop", "fc_loop", "if_in_while"])
def test_while_runs_data_dependent_trip_counts_bit_exact(name):
    data = MODELS[name]()
    assert_matches_oracle(data, inputs=6)


def test_the_trip_count_follows_the_data():
    """The counter's final value is the clipped input: loops of several lengths, none left."""
    data = counter_loop()
    oracle = LiteRTOracle(data)
    counts = set()
    for k in range(6):
        inputs = random_inputs(parse_model(data, "m").main, k)
        i, acc = oracle.invoke(inputs)
        n = max(int(inputs[0][0]), 0)
        assert int(i[0]) == n
        counts.add(n)
    assert len(counts - {0}) >= 2


def test_a_variable_updated_in_a_branch_over_sequences():
    """Sequences of invokes keep the variable: the then branch's assignments show in later
    invokes (both branches are taken), and a reset restores the start (LiteRT, runtime_py, C)."""
    data = variable_in_branch()
    assert branches_taken(data, 9) == {True, False}
    assert_matches_oracle(data, inputs=3, sequence=3)
    assert_matches_oracle(data, inputs=2, seed=5, sequence=6)


def test_a_variable_updated_in_a_loop_body_over_sequences():
    """The body's assignments accumulate over iterations and invokes; the WHILE's handle output
    names the same variable (LiteRT, runtime_py, C)."""
    assert_matches_oracle(variable_in_loop(), inputs=3, sequence=4)


# --- planning every subgraph -----------------------------------------------------------------


def test_both_branches_are_planned_and_share_memory():
    """Both branches' tensors are in the plan, within the IF's span; only one runs, so they
    may overlap each other, and here do (the arena meets the bound with overlaps)."""
    mp = planned(if_float())
    program = mp.program
    labels = [mp.step_label(step) for step in range(len(mp.lifetimes.order))]
    assert labels == ["op 0 IF", "subgraph 1 op 0 ADD", "subgraph 1 op 1 RELU",
                      "subgraph 1 op 2 MUL", "subgraph 2 op 0 SUB", "subgraph 2 op 1 MUL"]
    (branch,) = mp.steps
    assert [[s.step for s in block] for block in branch.branches] == [[1, 2, 3], [4, 5]]
    rows = {program.tensor_label(r.tensor): r for r in mp.rows()}
    assert {"subgraph 1 tensor 2", "subgraph 1 tensor 3", "subgraph 1 tensor 4",
            "subgraph 2 tensor 2", "subgraph 2 tensor 3"} <= set(rows)
    then_rows = [r for label, r in rows.items() if label.startswith("subgraph 1")]
    else_rows = [r for label, r in rows.items() if label.startswith("subgraph 2")]
    shared = {(a.offset, b.offset) for a in then_rows for b in else_rows
              if a.offset < b.offset + b.bytes and b.offset < a.offset + a.bytes}
    assert shared
    assert rows["tensor 3"].first_op == 0 and rows["tensor 3"].last_op == 5  # the IF's output
    verify(mp.plan)
    assert mp.arena_bytes <= mp.overlap_bound_bytes


def test_loop_values_live_across_the_whole_while():
    """The loop values (the WHILE's outputs) live from its step to the end of its body; the
    body's results live until its last step, when they are copied back; the condition's
    temporaries live within the condition's steps."""
    mp = planned(counter_loop())
    program = mp.program
    (loop,) = [s for s in mp.steps if isinstance(s, RunWhile)]
    step = loop.step
    test, body = (range(b[0].step, b[-1].step + 1) for b in (loop.test, loop.body))
    control = program.controls[mp.lifetimes.order[step]]
    rows = {r.tensor: r for r in mp.rows()}
    for t in control.carried:
        assert rows[t].first_op == step and rows[t].last_op >= body.stop - 1
    for copy in control.blocks[1].copies:
        if copy.src in rows:
            assert rows[copy.src].last_op == body.stop - 1
    assert rows[control.condition].last_op == test.stop - 1
    verify(mp.plan)


def test_the_plan_names_what_runs_each_subgraph():
    text = plan_text(planned(if_in_while()))
    assert ("subgraph 1 'cond': steps 4-5, within the step of op 3 WHILE (its condition, before "
            "each iteration); it reads its inputs in place: tensor 9, tensor 10, tensor 11, "
            "tensor 12") in text
    assert "within the step of subgraph 2 op 2 IF (its else branch)" in text
    assert "subgraph  tensor" in text.splitlines()[0].replace("map  ", "")


def test_an_empty_branch_goes_unwritten():
    """An IF whose then branch only assigns a variable and whose else branch does nothing:
    one `if` without `else`, bit-exact over sequences."""
    b = ModelBuilder("float32")
    then, otherwise = b.subgraph("then"), b.subgraph("else")
    for g in (then, otherwise):
        g.handle, g.x = g.input("handle", (), "resource"), g.input("x", (1, 4), "float32")
    then.assign_variable(then.handle, then.x)
    init = b.subgraph("init")
    init.assign_variable(init.var_handle("last"), init.const("zero", np.zeros((1, 4),
                                                                             np.float32)))
    c, x = b.input("c", (1,), "bool"), b.input("x", (1, 4), "float32")
    b.call_once(init)
    handle = b.var_handle("last")
    b.if_(c, then, otherwise, [handle, x])
    b.output(b.read_variable(handle, (1, 4), "float32", name="last/read"))
    data = b.build()
    source = generate(planned(data), "m")["m.c"]
    assert "  if (condition[0]) {\n" in source and "else" not in source.split("_if(void)")[1]
    assert_matches_oracle(data, inputs=3, sequence=3)


@pytest.mark.parametrize("name", ["counter_loop", "if_pass_through"])
def test_runtime_py_catches_a_plan_that_forgets_the_copies(monkeypatch, name):
    """A plan made as if no copy ran after a block's steps (the copies' sources dying at their
    last reader, the loop values at theirs) overlaps what the copies still read; runtime_py's
    owner map says so at the step that clobbers it, with the static proof switched off."""
    from toolchain.errors import PlanError
    from toolchain.lower.program import Program

    real = Program.control_lives
    monkeypatch.setattr(Program, "control_lives", lambda self, order: ({}, frozenset()))
    mp = planned(MODELS[name](), planner="greedy")
    monkeypatch.setattr(Program, "control_lives", real)
    runtime = ArenaInterpreter(mp, verify_plan=False)
    with pytest.raises(PlanError, match="IF or WHILE"):
        for k in range(6):
            runtime.invoke(random_inputs(mp.graph, k))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_generated_c_reads_like_careful_hand_written_c(name):
    files = generate(planned(MODELS[name]()), "m")
    for file_name, text in files.items():
        assert style_problems(text) == [], file_name
    source = files["m.c"]
    if "IF" in {op.opcode for op in planned(MODELS[name]()).graph.operators}:
        assert "  if (condition[0]) {\n" in source and "  } else {\n" in source
        assert "{\n  }" not in source
    if "loop" in name or "while" in name:
        assert "  for (;;) {\n" in source and "    if (!condition[0]) break;\n" in source
    assert "malloc" not in source


# --- the copies of IF and WHILE in every kind of arena ---------------------------------------


def run_c(files: dict[str, str], name: str, input_sets: list[list[np.ndarray]],
          graph, directory) -> list[list[np.ndarray]]:
    """Compile NAME.c with its harness (and the shared arena's file, if generated) strictly,
    and run it on `input_sets`: the outputs of each."""
    write_files(files, str(directory))
    shared = [f"{SHARED_NAME}.c"] if f"{SHARED_NAME}.c" in files else []
    subprocess.run([*compiler(), *STRICT_FLAGS, f"{name}.c", f"{name}_main.c", *shared, "-lm",
                    "-o", name], cwd=directory, check=True, timeout=600)
    stdin = b"".join(np.ascontiguousarray(v).tobytes() for values in input_sets for v in values)
    result = subprocess.run([str(directory / name), "1", "0"], input=stdin, capture_output=True,
                            check=True, timeout=600)
    return split_outputs(result.stdout, graph, len(input_sets))


def assert_c_matches_runtime_py(mp, files: dict[str, str], name: str, directory) -> None:
    """The C's outputs over six input sets (both branches, several trip counts) are runtime_py's
    (floats to rounding: the C compiler may contract a multiply and an add)."""
    input_sets = [random_inputs(mp.graph, k) for k in range(6)]
    runtime = ArenaInterpreter(mp)
    expected = [runtime.invoke(inputs) for inputs in input_sets]
    for want, got in zip(expected, run_c(files, name, input_sets, mp.graph, directory),
                         strict=True):
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["if_float", "counter_loop", "if_in_while"])
def test_the_copies_address_memory_pools(name, tmp_path):
    """With pools there is no NAME_arena: the copies index the pool each tensor lies in."""
    data = MODELS[name]()
    mp = planned(data, pools=[Pool("fast", 48), Pool("slow", 1 << 16)])
    assert set(mp.pool_of) == {0, 1}
    files = generate(mp, "m")
    assert "m_arena" not in files["m.c"]
    assert_c_matches_runtime_py(mp, files, "m", tmp_path)


def test_the_copies_address_a_shared_arena(tmp_path):
    """Models sharing one static arena copy within it: no model has an arena of its own."""
    plans = [planned(if_float()), planned(counter_loop())]
    files = generate_shared(list(zip(plans, ["branchy", "loopy"], strict=True)))
    for mp, name in zip(plans, ["branchy", "loopy"], strict=True):
        assert f"{name}_arena" not in files[f"{name}.c"]
        assert_c_matches_runtime_py(mp, files, name, tmp_path)


# --- refusals: one line, exit status 2 -------------------------------------------------------


def edited(data: bytes, edit) -> bytes:
    model = fb.ModelT.InitFromPackedBuf(data, 0)
    edit(model)
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=FILE_IDENTIFIER)
    return bytes(builder.Output())


def control_op(model, subgraph: int = 0):
    return next(op for op in model.subgraphs[subgraph].operators
                if op.builtinOptionsType in (fb.BuiltinOptions.IfOptions,
                                             fb.BuiltinOptions.WhileOptions))


def then_index(index: int):
    def edit(model):
        control_op(model).builtinOptions.thenSubgraphIndex = index
    return edit


def drop_else(model):
    model.subgraphs[2].inputs = model.subgraphs[2].inputs[:1]


def else_output_int32(model):
    g = model.subgraphs[2]
    g.tensors[g.outputs[0]].type = fb.TensorType.INT32


def then_input_wider(model):
    g = model.subgraphs[1]
    g.tensors[g.inputs[0]].shape = [1, 5]


def int_condition(model):
    model.subgraphs[0].tensors[0].type = fb.TensorType.INT32


def same_branch(model):
    control_op(model).builtinOptions.elseSubgraphIndex = 1


def inner_if_calls_main(model):
    """if_in_while: the IF inside the body (subgraph 2) runs subgraph 0, which runs the body."""
    control_op(model, 2).builtinOptions.thenSubgraphIndex = 0


def cond_two_outputs(model):
    model.subgraphs[1].outputs = [*model.subgraphs[1].outputs, 0]


def body_output_float(model):
    g = model.subgraphs[2]
    g.tensors[g.outputs[0]].type = fb.TensorType.FLOAT32


def growing_loop() -> bytes:
    """WHILE i != n: acc = CONCATENATION(acc, step): the accumulator grows by one row each
    iteration, which LiteRT runs by resizing it."""
    b = ModelBuilder("float32")
    cond, body = b.subgraph("cond"), b.subgraph("body")
    for g in (cond, body):
        g.i, g.n = g.input("i", (1,), "int32"), g.input("n", (1,), "int32")
        g.acc = g.input("acc", (1, 4), "float32")
    left = cond.tensor("left", (1,), "int32")
    cond.op("SUB", [cond.n, cond.i], [left])
    going = cond.tensor("going", (1,), "bool")
    cond.op("CAST", [left], [going])
    cond.output(going)
    i_next = body.tensor("i_next", (1,), "int32")
    body.op("ADD", [body.i, body.const("one", np.ones(1, np.int32))], [i_next])
    longer = body.tensor("longer", (2, 4), "float32")
    body.op("CONCATENATION", [body.acc, body.acc], [longer], {"axis": 0})
    for t in (i_next, body.n, longer):
        body.output(t)
    n = b.input("n", (1,), "int32")
    x = b.input("x", (1, 4), "float32")
    outputs = b.while_(cond, body, [b.const("start", np.zeros(1, np.int32)), n, x])
    b.output(outputs[2])
    return b.build()


BAD = [
    (if_float, then_index(9), "op 0 IF calls subgraph 9, but the model has 3 subgraphs"),
    (if_float, drop_else, "else subgraph 2 has 1 inputs for the op's 2 inputs after the "
                          "condition"),
    (if_float, else_output_int32, "else subgraph 2: output 0 tensor 3 ('else/1') is "
                                  "int32[1, 4], but output 0 tensor 3 ('if_0') is float32"),
    (if_float, then_input_wider, "then subgraph 1: input 0 tensor 0 ('x') is float32[1, 5], "
                                 "but input 1 tensor 1 ('x') is float32[1, 4]"),
    (if_float, int_condition, "its condition tensor 0 ('c') is int32[1], not one bool"),
    (if_in_while, inner_if_calls_main, "calls form a cycle: subgraph 0 -> subgraph 2 -> "
                                       "subgraph 0"),
    (counter_loop, cond_two_outputs, "condition subgraph 1 has 2 outputs, not one"),
    (counter_loop, body_output_float, "body subgraph 2: output 0 tensor 3 ('i_next') is "
                                      "float32[1], but input 0 tensor 0 ('i') is int32[1]"),
]


@pytest.mark.parametrize(("make", "edit", "words"), BAD,
                         ids=[getattr(e, "__name__", "then_index") for _, e, _ in BAD])
def test_malformed_control_flow_fails_in_one_line(tmp_path, make, edit, words):
    path = tmp_path / "bad.tflite"
    path.write_bytes(edited(make(), edit))
    with pytest.raises(ModelError, match=words.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        parse_model(path.read_bytes(), str(path))
    for command in ("inspect", "check"):
        assert_clean_failure(cli(command, str(path)), path, words)


REFUSED = [
    (if_float, same_branch, "op 0 IF: runs subgraph 1, which another operator or branch runs "
                            "too"),
    (growing_loop, None, "op 0 WHILE: its body changes loop value 2 from float32[1, 4] to "
                         "float32[2, 4]; arenac plans fixed shapes only"),
]


@pytest.mark.parametrize(("make", "edit", "words"), REFUSED,
                         ids=["same_branch", "growing_loop"])
def test_what_arenac_does_not_plan_is_refused_in_one_line(tmp_path, make, edit, words):
    path = tmp_path / "bad.tflite"
    path.write_bytes(edited(make(), edit) if edit else make())
    mp = planned(path.read_bytes())  # planned, to show; never run
    with pytest.raises(UnsupportedOpError, match=r"\[1, 4\]|another operator"):
        mp.program.params()
    for command in ("check", "gen"):
        args = ["-o", str(tmp_path / "out")] if command == "gen" else []
        assert_clean_failure(cli(command, str(path), *args), path, words)
    assert not (tmp_path / "out").exists()


def test_litert_refuses_what_arenac_refuses():
    """A condition that is not a bool, and branches of other arity, fail in LiteRT too."""
    for edit in (int_condition, drop_else):
        with pytest.raises(RuntimeError):
            LiteRTOracle(edited(if_float(), edit))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolchain.cli", *args], capture_output=True,
                          text=True, timeout=120)


def assert_clean_failure(result, path, words: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(path) in lines[0] and words in lines[0], lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize("name", ["if_float", "counter_loop", "if_in_while"])
def test_tflite_micro_runs_the_embedded_plan(name):
    """embed writes every subgraph's planned offsets; TFLite Micro runs the file with them as
    without, on inputs taking both branches (its own copies of the subgraphs' inputs, which
    arenac reads in place, come on top of the plan: its head is at least the arena)."""
    pytest.importorskip("tflite_micro")
    from tests.test_embed import plain, run_both
    from toolchain.tflm.embed import embed_plan

    data = MODELS[name]()
    model = parse_model(data)
    mp = plain(model)
    out = embed_plan(data, mp)
    for seed in range(4):
        before, after, _, head = run_both(data, out, model.main, seed)
        assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
        assert head >= mp.arena_bytes


@needs_mcu
@pytest.mark.parametrize("name", ["if_int8", "fc_loop", "variable_in_branch"])
def test_control_flow_on_the_cortex_m4(name):
    """The firmware under QEMU (Cortex-M4) gives runtime_py's outputs bit for bit, sequences of
    invokes with the state kept included."""
    from toolchain.lab import check
    from toolchain.lab.qemu_backend import QemuBackend

    mp = planned(MODELS[name]())
    sets = [random_inputs(mp.graph, k) for k in range(6)]
    runtime = ArenaInterpreter(mp)
    want = []
    for k, values in enumerate(sets):
        if k and k % 3 == 0:
            runtime.reset()
        want.append(runtime.invoke(values))
    with QemuBackend(mp) as backend:
        got = backend.invoke_many(sets, 3)
    for expected, actual in zip(want, got, strict=True):
        for e, a in zip(expected, actual, strict=True):
            assert check.difference(e, a).mismatches == 0


@pytest.mark.parametrize("name", ["if_pass_through", "counter_loop", "variable_in_branch"])
def test_external_io_copies_from_and_into_the_callers_buffers(tmp_path, name):
    """With external I/O a value passed through a branch comes from the caller's input buffer
    and a loop value that is a graph output lives in the caller's output buffer."""
    from toolchain.lab.c_backend import compile_files, split_outputs, write_files

    data = MODELS[name]()
    mp = planned(data, external_io=True)
    files = generate(mp, "ext", external_io=True)
    for text in files.values():
        assert style_problems(text) == []
    write_files(files, str(tmp_path))
    binary = compile_files(str(tmp_path), "ext")
    sets = [random_inputs(mp.graph, k) for k in range(6)]
    raw = subprocess.run([binary, "1", "3"],
                         input=b"".join(v.tobytes() for s in sets for v in s),
                         capture_output=True, check=True).stdout
    runtime = ArenaInterpreter(planned(data))
    for k, got in enumerate(split_outputs(raw, mp.graph, 6)):
        if k and k % 3 == 0:
            runtime.reset()
        for a, e in zip(got, runtime.invoke(sets[k]), strict=True):
            assert np.array_equal(a, e)


def test_generated_control_flow_is_clean_under_sanitizers():
    """The branches', loops' and copies' C under AddressSanitizer and UBSan, against LiteRT."""
    from toolchain.lab.c_backend import CBackend
    from toolchain.lab.check import check_plan

    for name in ("if_pass_through", "if_in_while", "variable_in_loop"):
        data = MODELS[name]()
        mp = planned(data)
        with CBackend(mp, sanitize=True) as backend:
            assert check_plan(mp, data, inputs=3, extra=[("c", backend.invoke_many)]).ok
