"""GATHER_ND and EMBEDDING_LOOKUP (toolchain/ops/lookup): runtime_py in its planned arena and
the C (under the sanitizers) against LiteRT's reference kernels, bit for bit, on indices the
model is given; an index out of range fails all three."""

from __future__ import annotations

import numpy as np
import pytest

from tests.opcheck import fails_everywhere, refusal, three_ways
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lower.plan import plan_model

COPIED = ["float32", "int8", "uint8", "int16", "int32", "int64"]


def values(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def gather_nd_model(dtype: str, params: tuple[int, ...], indices: tuple[int, ...],
                    index_dtype: str = "int32") -> bytes:
    b = ModelBuilder()
    x = b.input("params", params, dtype)
    i = b.input("indices", indices, index_dtype)
    y = b.tensor("y", (*indices[:-1], *params[indices[-1]:]), dtype)
    b.op("GATHER_ND", [x, i], [y])
    b.output(y)
    return b.build()


# (params shape, index vectors, index dtype): slices of rows, single elements, whole blocks
GATHER_CASES = [
    ((4, 5, 3), [[3, 0], [1, 4], [0, 2]], "int32"),
    ((6,), [[5], [0], [5], [2]], "int64"),
    ((2, 3, 4), [[[1, 2, 3], [0, 0, 0]], [[1, 0, 1], [0, 2, 2]]], "int32"),
    ((3, 4), [[0, 3], [2, 3]], "int16"),
]


@pytest.mark.parametrize("dtype", COPIED)
@pytest.mark.parametrize("shape, vectors, index_dtype", GATHER_CASES)
def test_gather_nd(dtype, shape, vectors, index_dtype):
    indices = np.array(vectors, index_dtype)
    model = gather_nd_model(dtype, shape, indices.shape, index_dtype)
    params = values(dtype, shape)
    expected = three_ways(model, [params, indices])
    first = tuple(indices.reshape(-1, indices.shape[-1])[0])
    np.testing.assert_array_equal(expected.reshape(-1, *shape[len(first):])[0], params[first])


def embedding_model(value_dtype: str, out_dtype: str, rows: tuple[int, ...], ids: int,
                    quant: tuple[float, int] | tuple[None, None] = (None, None)) -> bytes:
    b = ModelBuilder()
    i = b.input("ids", (ids,), "int32")
    v = b.input("value", rows, value_dtype, *quant)
    y = b.tensor("y", (ids, *rows[1:]), out_dtype)
    b.op("EMBEDDING_LOOKUP", [i, v], [y])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("dtype", COPIED)
def test_embedding_lookup_copies_rows(dtype):
    model = embedding_model(dtype, dtype, (5, 2, 3), 4)
    ids = np.array([4, 0, 4, 2], np.int32)
    table = values(dtype, (5, 2, 3))
    np.testing.assert_array_equal(three_ways(model, [ids, table]), table[ids])


def test_hybrid_embedding_lookup_scales_int8_rows_in_float():
    """int8 rows into float32: each value times the scale, one float32 product."""
    model = embedding_model("int8", "float32", (6, 7), 5, (0.0371, 0))
    ids = np.array([5, 1, 0, 1, 3], np.int32)
    table = values("int8", (6, 7), 3)
    out = three_ways(model, [ids, table])
    np.testing.assert_array_equal(out, table[ids].astype(np.float32) * np.float32(0.0371))


def test_index_vectors_of_no_coordinates_are_refused():
    assert "no coordinates" in refusal(gather_nd_model("int8", (2, 3), (1, 0)))


def test_hybrid_embedding_lookup_with_a_zero_point_is_refused():
    model = embedding_model("int8", "float32", (6, 7), 5, (0.0371, 3))
    assert "zero point 3 (LiteRT would ignore it)" in refusal(model)


@pytest.mark.parametrize("model, inputs", [
    (gather_nd_model("int8", (3, 4), (2, 2)),
     [values("int8", (3, 4)), np.array([[0, 1], [2, 4]], np.int32)]),
    (gather_nd_model("int8", (3, 4), (1, 2)),  # flat position 5 is within: TFLM reads it
     [values("int8", (3, 4)), np.array([[0, 5]], np.int32)]),
    (gather_nd_model("float32", (3, 4), (1, 2)),
     [values("float32", (3, 4)), np.array([[-1, 3]], np.int32)]),
    (gather_nd_model("int16", (5, 2), (1, 1), "int64"),
     [values("int16", (5, 2)), np.array([[2**40]], np.int64)]),
    (embedding_model("float32", "float32", (3, 2), 2),
     [np.array([1, 3], np.int32), values("float32", (3, 2))]),
], ids=["past_the_end", "past_its_dimension", "before_the_start", "huge_coordinate",
        "embedding_id"])
def test_an_index_out_of_range_fails_the_invoke_everywhere(model, inputs):
    """LiteRT fails the invoke; so does runtime_py, and the C's invoke returns
    NAME_ERROR_INDEX_OUT_OF_RANGE (the harness then exits 3)."""
    fails_everywhere(model, inputs, "outside")


def test_the_header_names_the_error_only_where_an_index_is_checked():
    from toolchain.c.generate import generate

    checked = generate(plan_model(parse_model(gather_nd_model("int8", (3, 4), (2, 2)), "m")))
    assert "#define MODEL_ERROR_INDEX_OUT_OF_RANGE 5" in checked["model.h"]
    b = ModelBuilder()
    x = b.input("x", (2,), "float32")
    y = b.tensor("y", (2,), "float32")
    b.op("ABS", [x], [y])
    b.output(y)
    plain = generate(plan_model(parse_model(b.build(), "m")))
    assert "INDEX_OUT_OF_RANGE" not in plain["model.h"] + plain["model.c"]


# -- DYNAMIC_UPDATE_SLICE -----------------------------------------------------------------------


def update_slice_model(dtype: str, operand: tuple[int, ...], update: tuple[int, ...],
                       index_dtype: str = "int32") -> bytes:
    b = ModelBuilder()
    x = b.input("operand", operand, dtype)
    u = b.input("update", update, dtype)
    s = b.input("start", (len(operand),), index_dtype)
    y = b.tensor("y", operand, dtype)
    b.op("DYNAMIC_UPDATE_SLICE", [x, u, s], [y])
    b.output(y)
    return b.build()


def any_values(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    if dtype == "bool":
        return np.random.default_rng(seed).integers(0, 2, shape).astype(bool)
    return values(dtype, shape, seed)


# (operand, update, start): inside, clamped past the end and before the start, the whole
# operand, a single element, an update of no elements
UPDATE_CASES = [
    ((4, 5, 3), (2, 3, 3), [1, 2, 0]),
    ((4, 5, 3), (2, 3, 1), [9, -7, 2]),
    ((6,), (6,), [3]),
    ((3, 4), (1, 1), [2, 3]),
    ((2, 3, 4, 2), (1, 2, 3, 2), [1, -1, 1, 0]),
    ((3, 4), (0, 2), [1, 1]),
]


@pytest.mark.parametrize("dtype", [*COPIED, "bool"])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("operand, update, start", UPDATE_CASES)
def test_dynamic_update_slice(dtype, index_dtype, operand, update, start):
    model = update_slice_model(dtype, operand, update, index_dtype)
    x, u = any_values(dtype, operand, 1), any_values(dtype, update, 2)
    out = three_ways(model, [x, u, np.array(start, index_dtype)])
    at = tuple(slice(min(max(0, s), d - n), min(max(0, s), d - n) + n)
               for s, d, n in zip(start, operand, update, strict=True))
    expected = x.copy()
    expected[at] = u
    np.testing.assert_array_equal(out, expected)


def test_dynamic_update_slice_clamps_an_int64_start_that_int32_cannot_hold():
    model = update_slice_model("int8", (3, 4), (2, 2), "int64")
    x, u = values("int8", (3, 4)), values("int8", (2, 2), 1)
    out = three_ways(model, [x, u, np.array([2**40, -(2**40)], np.int64)])
    np.testing.assert_array_equal(out[1:, :2], u)


def test_dynamic_update_slice_may_write_over_its_operand():
    """The operand dies at the op: the plan puts the output over it (alias), and the C then
    skips the copy."""
    from toolchain.c.generate import generate

    b = ModelBuilder()
    x = b.input("x", (4, 6), "float32")
    u = b.input("u", (2, 3), "float32")
    s = b.input("s", (2,), "int32")
    doubled = b.tensor("doubled", (4, 6), "float32")
    b.op("ADD", [x, x], [doubled])
    y = b.tensor("y", (4, 6), "float32")
    b.op("DYNAMIC_UPDATE_SLICE", [doubled, u, s], [y])
    b.output(y)
    model = b.build()
    mp = plan_model(parse_model(model, "<built model>"))
    offsets = mp.offset_of_tensor()
    assert offsets[y] == offsets[doubled]
    inputs = [values("float32", (4, 6)), values("float32", (2, 3), 1), np.array([3, 1], np.int32)]
    out = three_ways(model, inputs)
    np.testing.assert_array_equal(out[2:, 1:4], inputs[1])
    assert "if (o != operand) memmove(o, operand, 96);" in generate(mp)["model.c"]


def test_an_update_larger_than_its_operand_is_refused():
    with pytest.raises(Exception, match="does not fit"):
        plan_model(parse_model(update_slice_model("int8", (3, 4), (4, 1)), "<built model>"))
