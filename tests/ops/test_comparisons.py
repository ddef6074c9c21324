"""Comparison and logical ops against LiteRT's reference kernels, in runtime_py and the compiled
C: every op on every dtype, broadcasts, quantized inputs of different scales and zero points
(the common-scale rescale), a WHILE whose condition is a LESS, and one-line refusals of what
LiteRT refuses or would not compute."""

from __future__ import annotations

import numpy as np
import pytest

from tests.opcheck import assert_matches_oracle, assert_varied, refusal
from toolchain.c.generate import generate
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lower.plan import plan_model
from toolchain.ops.comparisons.prepare import EQUALITY, LOGICAL, ORDERED

COMPARISONS = (*ORDERED, *EQUALITY)
NO_QUANT = (None, None)


def model(opcodes, dtype: str, shape1, shape2, q1=NO_QUANT, q2=NO_QUANT,
          const2: np.ndarray | None = None) -> bytes:
    """Every op of `opcodes` on inputs a and b (b a constant if `const2` is given); one bool
    output per op."""
    builder = ModelBuilder("int8" if dtype in ("int8", "uint8") else "float32")
    a = builder.input("a", shape1, dtype, *q1)
    b = (builder.const("b", const2, *q2) if const2 is not None
         else builder.input("b", shape2, dtype, *q2))
    shape = np.broadcast_shapes(tuple(shape1), tuple(shape2))
    for opcode in opcodes:
        out = builder.tensor(opcode.lower(), shape, "bool")
        builder.op(opcode, [a, b], [out])
        builder.output(out)
    return builder.build()


def equal_pairs_model(opcode: str, dtype: str) -> bytes:
    """EQUAL/NOT_EQUAL of [a; b] and [a; a] (a, b random): half the pairs are equal."""
    builder = ModelBuilder("float32")
    a = builder.input("a", (4, 8), dtype)
    b = builder.input("b", (4, 8), dtype)
    sides = []
    for name, parts in (("ab", [a, b]), ("aa", [a, a])):
        sides.append(builder.tensor(name, (8, 8), dtype))
        builder.op("CONCATENATION", parts, [sides[-1]], {"axis": 0})
    out = builder.tensor("out", (8, 8), "bool")
    builder.op(opcode, sides, [out])
    builder.output(out)
    return builder.build()


def check(data: bytes) -> None:
    assert_varied(data)
    assert_matches_oracle(data)


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "int16"])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (3, 1)),
                                    ((1, 4), (3, 1)), ((2, 1, 3, 4), (1,))])
def test_ordered_plain_types_broadcast(dtype, shapes):
    check(model(ORDERED, dtype, *shapes))


@pytest.mark.parametrize("dtype, opcode", [
    (dtype, opcode) for dtype in ("float32", "int32", "int64", "int16") for opcode in EQUALITY
    if (dtype, opcode) != ("int16", "NOT_EQUAL")])  # refused: see test_refusals
def test_equality_plain_types_with_equal_pairs(dtype, opcode):
    check(equal_pairs_model(opcode, dtype))


@pytest.mark.parametrize("opcode", [*EQUALITY, *LOGICAL])
@pytest.mark.parametrize("shapes", [((3, 5), (3, 5)), ((2, 3, 1), (1, 4)), ((7,), (3, 1))])
def test_bool_ops(opcode, shapes):
    check(model([opcode], "bool", *shapes))


def test_logical_not_feeds_logical_and():
    builder = ModelBuilder("float32")
    a, b = builder.input("a", (3, 6), "bool"), builder.input("b", (6,), "bool")
    negated = builder.tensor("not_a", (3, 6), "bool")
    builder.op("LOGICAL_NOT", [a], [negated])
    both = builder.tensor("both", (3, 6), "bool")
    builder.op("LOGICAL_AND", [negated, b], [both])
    builder.output(negated)
    builder.output(both)
    check(builder.build())


# (dtype, input1 quantization, input2 quantization): equal, different and non-power-of-two
# scales, with zero points at and off the middle.
QUANTIZED = [
    ("int8", (0.05, -3), (0.05, -3)),
    ("int8", (0.05, -3), (0.13, 20)),
    ("int8", (0.5, 0), (0.25, -7)),
    ("int8", (0.0037, -128), (0.009, -100)),
    ("uint8", (0.1, 128), (0.3, 10)),
    ("uint8", (0.02, 0), (0.07, 200)),
]


@pytest.mark.parametrize("dtype, q1, q2", QUANTIZED)
@pytest.mark.parametrize("shapes", [((4, 8), (4, 8)), ((2, 4, 8), (1, 8)), ((3, 1), (1, 5))])
def test_quantized_ordered_rescale(dtype, q1, q2, shapes):
    check(model(ORDERED, dtype, *shapes, q1, q2))


@pytest.mark.parametrize("dtype, q1, q2", QUANTIZED)
def test_quantized_equality_against_every_value(dtype, q1, q2):
    """b holds every stored value, so each a meets the values it equals at the common scale."""
    info = np.iinfo(dtype)
    every = np.arange(info.min, int(info.max) + 1).astype(dtype)
    check(model(EQUALITY, dtype, (96, 1), every.shape, q1, q2, const2=every))


@pytest.mark.parametrize("q1, q2", [((0.001, 0), (0.001, 0)), ((0.001, 5), (0.003, -40))])
def test_quantized_int16_equality(q1, q2):
    """int16 EQUAL and NOT_EQUAL of quantized inputs compare at the common scale: b holds
    every int16 value."""
    every = np.arange(-32768, 32768).astype(np.int16)
    check(model(EQUALITY, "int16", (2, 1), every.shape, q1, q2, const2=every))


def test_quantized_int16_ordered_compares_stored_values():
    q = (0.001, 0)
    check(model(ORDERED, "int16", (4, 8), (1, 8), q, q))


def test_c_text_reads_like_a_comparison():
    data = model(["LESS"], "int8", (2, 4, 8), (1, 8), (0.05, -3), (0.13, 20))
    c = generate(plan_model(parse_model(data, "m.tflite")), "m")["m.c"]
    assert "return (uint8_t)(x < y);" in c
    assert "static const int32_t" in c  # the scaled-value tables


def while_less_loop() -> bytes:
    """WHILE i < n: i += 1, acc += step; n from an int8 input (negative: no trip)."""
    b = ModelBuilder("float32")
    cond, body = b.subgraph("cond"), b.subgraph("body")
    for g in (cond, body):
        g.i, g.n = g.input("i", (1,), "int32"), g.input("n", (1,), "int32")
        g.acc = g.input("acc", (1, 4), "float32")
    going = cond.tensor("going", (1,), "bool")
    cond.op("LESS", [cond.i, cond.n], [going])
    cond.output(going)
    i_next = body.tensor("i_next", (1,), "int32")
    body.op("ADD", [body.i, body.const("one", np.ones(1, np.int32))], [i_next])
    acc_next = body.tensor("acc_next", (1, 4), "float32")
    body.op("ADD", [body.acc, body.const("step", np.asarray([[0.5, -1, 2, 0.25]], np.float32))],
            [acc_next])
    for t in (i_next, body.n, acc_next):
        body.output(t)
    raw = b.input("n", (1,), "int8")
    n = b.tensor("n32", (1,), "int32")
    b.op("CAST", [raw], [n])
    x = b.input("x", (1, 4), "float32")
    i, _, acc = b.while_(cond, body, [b.const("start", np.zeros(1, np.int32)), n, x])
    b.output(i)
    b.output(acc)
    return b.build()


def test_while_counter_loop_with_less_condition():
    assert_matches_oracle(while_less_loop(), inputs=6)


def _mixed_model() -> bytes:
    builder = ModelBuilder("float32")
    a, b = builder.input("a", (4,), "float32"), builder.input("b", (4,), "int32")
    out = builder.tensor("out", (4,), "bool")
    builder.op("LESS", [a, b], [out])
    builder.output(out)
    return builder.build()


def _one_op(opcode: str, dtypes: tuple[str, ...], out_dtype: str, shapes=None,
            out_shape=(4,)) -> bytes:
    builder = ModelBuilder("float32")
    inputs = [builder.input(f"x{k}", shape, dtype)
              for k, (dtype, shape) in enumerate(zip(dtypes, shapes or [(4,)] * len(dtypes),
                                                     strict=True))]
    out = builder.tensor("out", out_shape, out_dtype)
    builder.op(opcode, inputs, [out])
    builder.output(out)
    return builder.build()


REFUSALS = [
    (lambda: model(["LESS"], "bool", (4,), (4,)), "LESS: no kernel for bool, bool -> bool"),
    (lambda: model(["GREATER_EQUAL"], "bool", (4,), (4,)),
     "GREATER_EQUAL: no kernel for bool, bool -> bool"),
    (lambda: model(["LOGICAL_AND"], "float32", (4,), (4,)),
     "LOGICAL_AND: no kernel for float32, float32 -> bool"),
    (lambda: model(["LOGICAL_OR"], "int32", (4,), (4,)),
     "LOGICAL_OR: no kernel for int32, int32 -> bool"),
    (lambda: _one_op("LOGICAL_NOT", ("float32",), "bool"),
     "LOGICAL_NOT: no kernel for float32 -> bool"),
    (lambda: _one_op("LESS", ("float32", "int32"), "bool"),
     "LESS: no kernel for float32, int32 -> bool"),
    (lambda: _one_op("GREATER", ("float32", "float32"), "float32"),
     "GREATER: no kernel for float32, float32 -> float32"),
    (lambda: _one_op("EQUAL", ("float32",), "bool"),
     "EQUAL: no kernel for float32 -> bool"),
    (lambda: _one_op("LOGICAL_NOT", ("bool",), "bool", out_shape=(2, 2)),
     "LOGICAL_NOT output shape (2, 2) is not the input's (4,)"),
    (lambda: model(["LESS"], "float32", (2, 1, 3, 1, 2), (1, 2, 1, 4, 1)),
     "broadcasting over more than 4 dimensions"),
    (lambda: _one_op("EQUAL", ("int32", "int32"), "bool", [(2, 3), (4,)], (2, 3)),
     "shapes (2, 3) and (4,) do not broadcast"),
    (lambda: _one_op("LESS_EQUAL", ("int32", "int32"), "bool", [(2, 3), (3,)], (3, 3)),
     "output shape (3, 3) is not the broadcast (2, 3)"),
    (lambda: model(["NOT_EQUAL"], "int16", (4,), (4,)),
     "unquantized int16 (LiteRT's NOT_EQUAL leaves the output unwritten)"),
    (lambda: model(["LESS"], "int16", (4,), (4,), (0.001, 0), (0.002, 0)),
     "int16 compares stored values: the inputs need identical quantization"),
    (lambda: model(["LESS"], "int8", (4,), (4,), (1.5, 0), (0.1, 0)),
     "int8 tensor 'a': scale 1.5 is not below 1 (LiteRT's comparison rescale needs it)"),
    (lambda: model(["EQUAL"], "uint8", (4,), (4,)),
     "uint8 tensor 'a' needs per-tensor quantization"),
]


@pytest.mark.parametrize("build, reason", REFUSALS)
def test_refusals(build, reason):
    assert refusal(build()).endswith(reason)


def test_five_dimensional_equal_shapes_run_flat():
    check(model(["LESS_EQUAL"], "int32", (2, 1, 3, 2, 2), (2, 1, 3, 2, 2)))


def select_model(opcode: str, dtype: str, cond_shape, x_shape, y_shape, out_shape=None,
                 q=NO_QUANT, qy=None) -> bytes:
    builder = ModelBuilder("float32")
    c = builder.input("c", cond_shape, "bool")
    x = builder.input("x", x_shape, dtype, *q)
    y = builder.input("y", y_shape, dtype, *(q if qy is None else qy))
    if out_shape is None:
        out_shape = np.broadcast_shapes(tuple(cond_shape), tuple(x_shape), tuple(y_shape))
    out = builder.tensor("out", out_shape, dtype, *q)
    builder.op(opcode, [c, x, y], [out])
    builder.output(out)
    return builder.build()


SELECT_DTYPES = [("float32", NO_QUANT), ("int32", NO_QUANT), ("int64", NO_QUANT),
                 ("int16", NO_QUANT), ("int8", (0.05, -3)), ("uint8", (0.1, 128)),
                 ("bool", NO_QUANT)]


@pytest.mark.parametrize("dtype, q", SELECT_DTYPES)
@pytest.mark.parametrize("opcode", ["SELECT", "SELECT_V2"])
def test_select_same_shapes_every_dtype(opcode, dtype, q):
    check(select_model(opcode, dtype, (3, 5), (3, 5), (3, 5), q=q))


@pytest.mark.parametrize("cond_shape", [(4,), ()])
def test_select_condition_per_slice_or_scalar(cond_shape):
    """SELECT's rank-1 condition picks whole slices along the first dimension."""
    check(select_model("SELECT", "float32", cond_shape, (4, 2, 3), (4, 2, 3), (4, 2, 3)))


@pytest.mark.parametrize("dtype, q", [("float32", NO_QUANT), ("int8", (0.05, -3))])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (4,), (2, 1, 4)), ((3, 1), (1, 5), ()),
                                    ((1,), (2, 3), (2, 3)), ((2, 1, 2, 1, 3), (2, 1, 3),
                                                             (1, 2, 1, 1, 1))])
def test_select_v2_broadcasts(dtype, q, shapes):
    check(select_model("SELECT_V2", dtype, *shapes, q=q))


def test_select_v2_of_a_comparison():
    """where(x < y, y, x): a GREATER-free MAXIMUM, chosen element by element."""
    builder = ModelBuilder("float32")
    x, y = builder.input("x", (2, 6), "float32"), builder.input("y", (6,), "float32")
    less = builder.tensor("less", (2, 6), "bool")
    builder.op("LESS", [x, y], [less])
    out = builder.tensor("out", (2, 6), "float32")
    builder.op("SELECT_V2", [less, y, x], [out])
    builder.output(out)
    check(builder.build())


SELECT_REFUSALS = [
    (lambda: select_model("SELECT", "float32", (3, 4), (3, 4), (1, 4), (3, 4)),
     "SELECT of shapes (3, 4) and (1, 4) (SELECT does not broadcast; SELECT_V2 does)"),
    (lambda: select_model("SELECT", "float32", (4,), (3, 4), (3, 4), (3, 4)),
     "SELECT condition of shape (4,) for values of shape (3, 4): neither the same, one bool, "
     "nor one per slice along the first dimension"),
    (lambda: select_model("SELECT_V2", "float32", (2, 1, 1, 1, 1, 3), (3,), (3,)),
     "broadcasting over more than 5 dimensions"),
    (lambda: select_model("SELECT_V2", "float32", (3,), (4,), (3,), (3,)),
     "shapes (3,), (4,) and (3,) do not broadcast"),
    (lambda: select_model("SELECT_V2", "float32", (3,), (2, 3), (3,), (3, 3)),
     "output shape (3, 3) is not the broadcast (2, 3)"),
    (lambda: select_model("SELECT_V2", "int8", (3,), (3,), (3,), q=(0.05, 0), qy=(0.1, 0)),
     "x, y and the output need identical quantization (LiteRT copies stored values)"),
]


@pytest.mark.parametrize("build, reason", SELECT_REFUSALS)
def test_select_refusals(build, reason):
    assert refusal(build()).endswith(reason)
