"""One memory budget for the whole model and bounded work for any file: nested subgraphs and
resource variables count against --max-bytes, calls nest no deeper than a limit, and an endless
WHILE stops at --max-iterations; each is refused in one line."""

from __future__ import annotations

import flatbuffers
import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.test_control_flow import assert_clean_failure, cli
from toolchain.c.generate import generate
from toolchain.errors import ModelError, PlanError, RuntimeBackendError, UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.front.schema import fb
from toolchain.front.validate import MAX_NESTING
from toolchain.lower.plan import plan_model

MIB = 1 << 20


def call_chain(depth: int, shape=(1, 4)) -> bytes:
    """The main graph calls subgraph 1 with CALL_ONCE, which calls subgraph 2, ... to `depth`;
    each subgraph computes one tensor of `shape` into a resource variable."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    y = b.tensor("y", (1, 4), "float32")
    b.op("RELU", [x], [y])
    b.output(y)
    subs = [b.subgraph(f"init{k}") for k in range(depth)]
    b.call_once(subs[0])
    for k, g in enumerate(subs):
        if k + 1 < depth:
            g.call_once(subs[k + 1])
        value = g.tensor(f"v{k}", shape, "float32")
        g.op("FILL", [g.const(f"dims{k}", np.asarray(shape, np.int32)),
                      g.const(f"one{k}", np.ones((), np.float32))], [value])
        g.assign_variable(g.var_handle(f"var{k}"), value)
    return b.build()


def endless_loop(increment: int) -> bytes:
    """WHILE i != 3: i += `increment` (0: the condition never turns false)."""
    b = ModelBuilder("float32")
    cond, body = b.subgraph("cond"), b.subgraph("body")
    for g in (cond, body):
        g.i = g.input("i", (1,), "int32")
    left = cond.tensor("left", (1,), "int32")
    cond.op("SUB", [cond.const("three", np.full(1, 3, np.int32)), cond.i], [left])
    going = cond.tensor("going", (1,), "bool")
    cond.op("CAST", [left], [going])
    cond.output(going)
    i_next = body.tensor("i_next", (1,), "int32")
    body.op("ADD", [body.i, body.const("step", np.full(1, increment, np.int32))], [i_next])
    body.output(i_next)
    start = b.input("start", (1,), "int32")
    (i,) = b.while_(cond, body, [start])
    b.output(i)
    return b.build()


def many_handles(count: int, elements: int) -> bytes:
    """`count` resource variables, each assigned the one input of `elements` floats."""
    b = ModelBuilder("float32")
    x = b.input("x", (elements,), "float32")
    for k in range(count):
        b.assign_variable(b.var_handle(f"var{k}"), x)
    y = b.tensor("y", (elements,), "float32")
    b.op("RELU", [x], [y])
    b.output(y)
    return b.build()


def test_calls_nested_up_to_the_limit_are_planned():
    mp = plan_model(parse_model(call_chain(MAX_NESTING), "m.tflite"))
    assert [s.kind for s in mp.state_slots].count("call_once") == MAX_NESTING


def test_calls_nested_deeper_than_the_limit_are_refused_in_one_line(tmp_path):
    path = tmp_path / "deep.tflite"
    path.write_bytes(call_chain(330))
    with pytest.raises(ModelError, match=f"deeper than the limit of {MAX_NESTING}"):
        parse_model(path.read_bytes(), str(path))
    for command in ("plan", "run"):
        extra = ["--input", str(tmp_path / "x.npy")] if command == "run" else []
        np.save(tmp_path / "x.npy", np.zeros((1, 4), np.float32))
        assert_clean_failure(cli(command, str(path), *extra), path, "deeper than the limit")


def test_nested_subgraphs_count_against_one_budget():
    """Each subgraph's 1 MiB is within 3 MiB; the five planned together are not."""
    data = call_chain(5, shape=(MIB // 4,))
    parse_model(data, "m.tflite", max_bytes=6 * MIB)
    with pytest.raises(ModelError, match=r"the main graph and the 5 subgraphs it runs .* over "
                                         r"the limit of 3145728 \(--max-bytes\)"):
        parse_model(data, "m.tflite", max_bytes=3 * MIB)


def test_resource_variables_count_against_the_budget(tmp_path):
    """40 variables of one 1 MiB input: a 40 MiB state block from a small file."""
    data = many_handles(40, MIB // 4)
    model = parse_model(data, "m.tflite", max_bytes=8 * MIB)  # each graph's tensors fit
    with pytest.raises(PlanError, match=r"state block, \d+ bytes together, over the limit of "
                                        r"8388608 \(--max-bytes\)"):
        plan_model(model, max_bytes=8 * MIB)
    mp = plan_model(model, max_bytes=64 * MIB)
    assert mp.state_bytes >= 40 * MIB
    path = tmp_path / "handles.tflite"
    path.write_bytes(data)
    for command in ("plan", "gen"):
        extra = ["-o", str(tmp_path / "out")] if command == "gen" else []
        result = cli(command, str(path), "--max-bytes", str(8 * MIB), *extra)
        assert_clean_failure(result, path, "over the limit of 8388608")
    assert not (tmp_path / "out").exists()


def test_a_loop_that_ends_runs_to_its_end():
    runtime = ArenaInterpreter(plan_model(parse_model(endless_loop(1))), max_iterations=3)
    assert runtime.invoke([np.zeros(1, np.int32)])[0].tolist() == [3]


def test_an_endless_loop_stops_at_the_iteration_limit():
    runtime = ArenaInterpreter(plan_model(parse_model(endless_loop(0))), max_iterations=50)
    with pytest.raises(RuntimeBackendError, match="op 0 WHILE: its condition still holds "
                                                  "after 50 iterations"):
        runtime.invoke([np.zeros(1, np.int32)])


def test_run_refuses_an_endless_loop_in_one_line(tmp_path):
    path = tmp_path / "loop.tflite"
    path.write_bytes(endless_loop(0))
    np.save(tmp_path / "start.npy", np.zeros(1, np.int32))
    result = cli("run", str(path), "--input", str(tmp_path / "start.npy"), "--max-iterations",
                 "1000", "--output-dir", str(tmp_path / "out"))
    assert_clean_failure(result, path, "after 1000 iterations")
    assert not (tmp_path / "out").exists()


def test_the_generated_while_says_it_runs_uncapped(tmp_path):
    from toolchain.c.generate import generate

    files = generate(plan_model(parse_model(endless_loop(1))))
    text = "".join(files.values()) if isinstance(files, dict) else str(files)
    assert "no cap on the iterations" in text


def _repacked(model: fb.ModelT) -> bytes:
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


@pytest.mark.parametrize("slot, role", [(2, "weights_time"), (3, "bias")])
def test_an_svdf_constant_marked_variable_is_refused_in_one_line(slot, role):
    """A variable's data is its initial value, state: an op that needs a constant refuses it."""
    from tests.ops.test_svdf import svdf_model

    model = fb.ModelT.InitFromPackedBuf(svdf_model(), 0)
    graph = model.subgraphs[0]
    graph.tensors[graph.operators[0].inputs[slot]].isVariable = True
    with pytest.raises(UnsupportedOpError, match=f"op 0 SVDF: {role} is not a constant"):
        generate(plan_model(parse_model(_repacked(model), "svdf.tflite")), "m")


@pytest.mark.parametrize("code, dtype", [(13, "resource"), (14, "variant"), (5, "string"),
                                         (20, "uint4")])
def test_an_lstm_state_of_a_type_that_holds_no_numbers_is_refused(code, dtype):
    from tests.ops.test_lstm import INTEGER_CASES, lstm_model

    built = lstm_model(next(iter(INTEGER_CASES.values())))
    model = fb.ModelT.InitFromPackedBuf(built.data, 0)
    model.subgraphs[0].tensors[built.cell_state].type = code
    with pytest.raises(ModelError, match=f"'cell_state'\\) is a variable of type {dtype}"):
        parse_model(_repacked(model), "lstm.tflite")


def test_check_stops_an_endless_loop_before_waiting_for_the_oracle(tmp_path):
    """runtime_py runs before the oracle, so the loop is named, not the oracle's time-out."""
    path = tmp_path / "loop.tflite"
    path.write_bytes(endless_loop(0))
    result = cli("check", str(path), "--max-iterations", "1000", "--inputs", "1",
                 "--backends", "runtime_py", "--oracle-timeout", "100")
    assert_clean_failure(result, path, "op 0 WHILE: its condition still holds after 1000")
