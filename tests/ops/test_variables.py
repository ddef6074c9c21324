"""Resource variables and CALL_ONCE (VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE, CALL_ONCE):
runtime_py and the compiled C against LiteRT's reference kernels over sequences of invokes with
the state kept, and after a reset; every refusal."""

from __future__ import annotations

import numpy as np
import pytest

from tests.opcheck import assert_matches_oracle
from toolchain.errors import ArenacError, ModelError, UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import plan_model

# dtype -> (scale, zero point) of the quantized test tensors
QUANT = {"float32": (None, None), "int8": (0.05, -3), "int16": (0.002, 0), "int32": (None, None)}


def accumulator(dtype: str = "float32", shape=(1, 4), start: float = 1.5) -> bytes:
    """The streaming accumulator TFLite's converter writes: CALL_ONCE's subgraph assigns the
    variable its start value; each invoke reads it, adds the input, assigns the sum back and
    outputs it."""
    scale, zero_point = QUANT[dtype]
    b = ModelBuilder("float32")
    init = b.subgraph("init")
    values = np.full(shape, start if scale is None else round(start / scale) + zero_point)
    init.assign_variable(init.var_handle("acc"),
                         init.const("acc/start", values.astype(dtype), scale, zero_point))
    x = b.input("x", shape, dtype, scale, zero_point)
    b.call_once(init)
    handle = b.var_handle("acc")
    old = b.read_variable(handle, shape, dtype, scale, zero_point, name="acc/old")
    new = b.tensor("acc/new", shape, dtype, scale, zero_point)
    b.op("ADD", [old, x], [new], version=2 if scale is not None else 1)
    b.assign_variable(handle, new)
    b.output(new)
    return b.build()


def computed_start() -> bytes:
    """An initialization subgraph with activations of its own (planned within the CALL_ONCE's
    step), and a main-graph tensor alive across that step."""
    b = ModelBuilder("float32")
    init = b.subgraph("init")
    a = init.const("a", np.asarray([[0.5, -1.0, 2.0, 0.25]], np.float32))
    c = init.const("c", np.asarray([[1.0, 1.0, -3.0, 0.5]], np.float32))
    s = init.tensor("sum", (1, 4), "float32")
    init.op("ADD", [a, c], [s])
    r = init.tensor("relu", (1, 4), "float32")
    init.op("RELU", [s], [r])
    init.assign_variable(init.var_handle("level"), r)
    x = b.input("x", (1, 4), "float32")
    doubled = b.tensor("doubled", (1, 4), "float32")
    b.op("ADD", [x, x], [doubled])  # alive across the call
    b.call_once(init)
    handle = b.var_handle("level")
    old = b.read_variable(handle, (1, 4), "float32", name="level/old")
    new = b.tensor("level/new", (1, 4), "float32")
    b.op("MUL", [old, doubled], [new])
    b.assign_variable(handle, new)
    b.output(new)
    return b.build()


POOL = {"padding": "VALID", "stride_h": 2, "stride_w": 2, "filter_height": 2, "filter_width": 2}


def pooled_start() -> bytes:
    """int8, with kernel scratch in both subgraphs: the init subgraph pools a constant image
    into the variable's start value (its pool's scratch planned within the call), the main
    graph accumulates into it and pools the sum."""
    b = ModelBuilder("int8")
    init = b.subgraph("init")
    image = init.const("image", np.arange(-24, 24, dtype=np.int8).reshape(1, 4, 4, 3), 0.1, 0)
    pooled = init.tensor("pooled", (1, 2, 2, 3), "int8", 0.1, 0)
    init.op("AVERAGE_POOL_2D", [image], [pooled], POOL, version=2)
    init.assign_variable(init.var_handle("v"), pooled)
    x = b.input("x", (1, 2, 2, 3), "int8", 0.1, 0)
    b.call_once(init)
    handle = b.var_handle("v")
    old = b.read_variable(handle, (1, 2, 2, 3), "int8", 0.1, 0)
    new = b.tensor("new", (1, 2, 2, 3), "int8", 0.1, 0)
    b.op("ADD", [old, x], [new], version=2)
    b.assign_variable(handle, new)
    mean = b.tensor("mean", (1, 1, 1, 3), "int8", 0.1, 0)
    b.op("AVERAGE_POOL_2D", [new], [mean], POOL, version=2)
    b.output(mean)
    return b.build()


def two_variables() -> bytes:
    """An int32 counter and a float32 running maximum, each with its own handle, and an output
    that is the read value itself."""
    b = ModelBuilder("float32")
    init = b.subgraph("init")
    init.assign_variable(init.var_handle("count"), init.const("zero", np.zeros(1, np.int32)))
    init.assign_variable(init.var_handle("peak"),
                         init.const("low", np.full((1, 3), -100.0, np.float32)))
    x = b.input("x", (1, 3), "float32")
    step = b.input("step", (1,), "int32")
    b.call_once(init)
    count, peak = b.var_handle("count"), b.var_handle("peak")
    seen = b.read_variable(count, (1,), "int32", name="count/old")
    total = b.tensor("count/new", (1,), "int32")
    b.op("ADD", [seen, step], [total])
    b.assign_variable(count, total)
    high = b.read_variable(peak, (1, 3), "float32", name="peak/old")
    higher = b.tensor("peak/new", (1, 3), "float32")
    b.op("MAXIMUM", [high, x], [higher])
    b.assign_variable(peak, higher)
    b.output(seen)
    b.output(higher)
    return b.build()


def assigned_first() -> bytes:
    """No CALL_ONCE: the invoke assigns the variable before it reads it, as LiteRT allows; the
    value read is the one the same invoke assigned."""
    b = ModelBuilder("float32")
    x = b.input("x", (2, 3), "float32")
    handle = b.var_handle("last")
    b.assign_variable(handle, x)
    back = b.read_variable(handle, (2, 3), "float32", name="last/read")
    y = b.tensor("y", (2, 3), "float32")
    b.op("ADD", [back, x], [y])
    b.output(y)
    return b.build()


def nested_calls() -> bytes:
    """CALL_ONCE inside an initialization subgraph: subgraph 2 sets 'base', subgraph 1 calls it
    and derives 'acc' from 'base'."""
    b = ModelBuilder("float32")
    first, second = b.subgraph("init"), b.subgraph("init_base")
    second.assign_variable(second.var_handle("base"),
                           second.const("base/start", np.asarray([[2.0, -1.0]], np.float32)))
    first.call_once(second)
    base = first.read_variable(first.var_handle("base"), (1, 2), "float32", name="base/read")
    start = first.tensor("acc/start", (1, 2), "float32")
    first.op("MUL", [base, base], [start])
    first.assign_variable(first.var_handle("acc"), start)
    x = b.input("x", (1, 2), "float32")
    b.call_once(first)
    handle = b.var_handle("acc")
    old = b.read_variable(handle, (1, 2), "float32", name="acc/old")
    new = b.tensor("acc/new", (1, 2), "float32")
    b.op("SUB", [old, x], [new])
    b.assign_variable(handle, new)
    b.output(new)
    return b.build()


STATEFUL = {
    "accumulator_float32": accumulator,
    "accumulator_int8": lambda: accumulator("int8"),
    "accumulator_int16": lambda: accumulator("int16", (2, 3)),
    "accumulator_int32": lambda: accumulator("int32", (3,), 7),
    "computed_start": computed_start,
    "pooled_start": pooled_start,
    "two_variables": two_variables,
    "assigned_first": assigned_first,
    "nested_calls": nested_calls,
    **{name: make for name, make in EXAMPLES.items() if name.startswith("streaming")},
}


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_state_is_bit_exact_over_sequences_and_after_resets(name):
    """Three sequences of three invokes each, a reset between: runtime_py and C as LiteRT."""
    assert_matches_oracle(STATEFUL[name]())


def test_the_state_changes_the_outputs():
    """The accumulator's outputs depend on the invokes before: the same input gives the start
    value plus one, two, three times the input, and the start again after a reset (LiteRT)."""
    data = accumulator()
    x = np.ones((1, 4), np.float32)
    oracle = LiteRTOracle(data)
    assert [float(oracle.invoke([x])[0][0, 0]) for _ in range(3)] == [2.5, 3.5, 4.5]
    assert float(LiteRTOracle(data).invoke([x])[0][0, 0]) == 2.5


def test_a_longer_sequence_with_several_seeds():
    assert_matches_oracle(accumulator("int8"), inputs=2, seed=11, sequence=7)


def test_variable_tensors_start_at_the_int8_zero_point():
    """A variable tensor without data starts at its zero point for int8, as LiteRT and TFLite
    Micro reset it (zero otherwise)."""
    b = ModelBuilder("int8")
    x = b.input("x", (1, 4), "int8", 0.5, 3)
    state = b.variable("state", np.zeros((1, 4), np.int8), 0.5, 7)
    y = b.tensor("y", (1, 4), "int8", 0.5, 3)
    b.op("ADD", [x, state], [y], version=2)
    b.output(y)
    assert_matches_oracle(b.build())


# --- refusals ----------------------------------------------------------------------------------


def read_before_assign() -> bytes:
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    handle = b.var_handle("acc")
    old = b.read_variable(handle, (1, 4), "float32")
    y = b.tensor("y", (1, 4), "float32")
    b.op("ADD", [old, x], [y])
    b.assign_variable(handle, y)
    b.output(y)
    return b.build()


def mismatched_read() -> bytes:
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    handle = b.var_handle("acc")
    b.assign_variable(handle, x)
    wide = b.read_variable(handle, (1, 8), "float32")
    b.output(wide)
    return b.build()


def mismatched_type() -> bytes:
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    handle = b.var_handle("acc")
    b.assign_variable(handle, x)
    b.output(b.read_variable(handle, (1, 4), "int32"))
    return b.build()


def handle_nobody_writes() -> bytes:
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    handle = b._add_tensor("stray", (), "resource", None)
    b.assign_variable(handle, x)
    b.output(x)
    return b.build()


def handle_from_another_op() -> bytes:
    """A READ_VARIABLE's handle written by another READ_VARIABLE's output position."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    handle = b.var_handle("acc")
    b.assign_variable(handle, x)
    other = b._add_tensor("other", (), "resource", None)
    b.op("READ_VARIABLE", [handle], [other])
    b.output(b.read_variable(other, (1, 4), "float32"))
    return b.build()


def int32_resource_id() -> bytes:
    """LiteRT also reads a variable by an int32 resource id, numbered as it meets VAR_HANDLEs."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    handle = b.var_handle("acc")
    b.assign_variable(handle, x)
    b.output(b.read_variable(b.const("id", np.zeros(1, np.int32)), (1, 4), "float32"))
    return b.build()


def wide_handle() -> bytes:
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    handle = b._add_tensor("acc/handle", (2,), "resource", None)
    b.op("VAR_HANDLE", [], [handle], {"shared_name": "acc"})
    b.assign_variable(handle, x)
    b.output(x)
    return b.build()


def assign_without_value() -> bytes:
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    handle = b.var_handle("acc")
    b.op("ASSIGN_VARIABLE", [handle], [])
    b.output(x)
    return b.build()


@pytest.mark.parametrize(
    ("make", "error", "words"),
    [
        (read_before_assign, UnsupportedOpError,
         "op 1 READ_VARIABLE: reads variable 'acc' before anything assigns it"),
        (mismatched_read, UnsupportedOpError,
         "variable 'acc' holds float32[1, 4], but this op reads float32[1, 8]"),
        (mismatched_type, UnsupportedOpError, "holds float32[1, 4], but this op reads int32"),
        (handle_nobody_writes, ModelError, "is written by no operator, not by a VAR_HANDLE"),
        (handle_from_another_op, ModelError, "is written by op 2 READ_VARIABLE"),
        (int32_resource_id, UnsupportedOpError, "READ_VARIABLE: no kernel for int32 -> float32"),
        (wide_handle, ModelError, "has shape [2], not one element"),
        (assign_without_value, ModelError, "the required value (input 1) is missing"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_what_tflite_would_not_run_as_a_copy_is_refused(make, error, words):
    model = parse_model(make(), "m.tflite")
    with pytest.raises(ArenacError) as raised:
        mp = plan_model(model)
        mp.program.params()
    assert isinstance(raised.value, error), raised.value
    assert words in str(raised.value) and "m.tflite" in str(raised.value)


def test_mismatched_types_are_also_what_litert_refuses():
    oracle = LiteRTOracle(mismatched_type())
    with pytest.raises(RuntimeError, match="FLOAT32 != INT32"):
        oracle.invoke([np.zeros((1, 4), np.float32)])


def test_reading_before_any_assignment_fails_in_litert_too():
    with pytest.raises(Exception, match="READ_VARIABLE"):
        LiteRTOracle(read_before_assign()).invoke([np.zeros((1, 4), np.float32)])
