"""The shape family's generated C: how its loops collapse, shapes that stress the loop nests,
constant operands, uint8 rescaling, determinism.

tests/ops/test_shape.py already runs every case and element size against TFLite, with the C
built under -fsanitize=address,undefined; the stress shapes here run the same way.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import assert_matches_oracle
from tests.ops.test_shape import CASES, UINT8_RESCALED, build, concatenation_model, i32
from toolchain.c.generate import generate
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import random_inputs
from toolchain.lower.plan import plan_model
from toolchain.ops.shape.emit import Move, pad_dims, simplify


def c_source(model: bytes) -> str:
    return generate(plan_model(parse_model(model, "m.tflite")), "m")["m.c"]


def kernel(model: bytes, opcode: str) -> str:
    """The text of the (single) kernel function of `opcode`."""
    source = c_source(model)
    match = re.search(
        rf"static void m_op\d+_{opcode.lower()}\(void\) \{{\n(.*?)\n\}}\n", source, re.S
    )
    assert match, source
    return match.group(1)


def assert_sanitized_c_matches_runtime(model: bytes, sets: int = 2) -> None:
    """The C built with ASan and UBSan gives runtime_py's outputs, bit for bit."""
    mp = plan_model(parse_model(model))
    inputs = [random_inputs(mp.graph, seed) for seed in range(sets)]
    expected = [ArenaInterpreter(mp).invoke(x) for x in inputs]
    with CBackend(mp, sanitize=True) as backend:
        got = backend.invoke_many(inputs)
    for want, have in zip(expected, got, strict=True):
        for w, h in zip(want, have, strict=True):
            assert w.shape == h.shape and w.tobytes() == h.tobytes()


# --- how the loops collapse ---------------------------------------------------------------


def test_contiguous_copy_collapses_to_one_memcpy():
    move = Move("o", "x", 1, (12, 4, 1), (12, 4, 1))
    assert simplify((2, 3, 4), [move]) == ([], [Move("o", "x", 24, (), ())])


def test_size_one_and_mergeable_loops_vanish():
    # A [2, 1, 3, 4] slice of a [2, 1, 3, 8] input: the first 4 of every row of 8.
    move = Move("o", "x", 1, (12, 12, 4, 1), (24, 24, 8, 1))
    counts, (m,) = simplify((2, 1, 3, 4), [move])
    assert counts == [6] and (m.run, m.dst_strides, m.src_strides) == (4, (4,), (8,))


def test_transpose_keeps_a_strided_innermost_loop():
    move = Move("o", "x", 1, (3, 1), (1, 4))
    counts, (m,) = simplify((4, 3), [move])
    assert counts == [4, 3] and m.run == 1


def test_empty_copies_vanish():
    assert simplify((2, 0, 3), [Move("o", "x", 1, (0, 3, 1), (0, 3, 1))]) == ([], [])
    counts, moves = simplify((2,), [Move("o", "x0", 0, (3,), (0,)), Move("o", "x1", 3, (3,), (3,))])
    assert counts == [] and moves == [Move("o", "x1", 6, (), ())]


def test_pad_dims_merge_unpadded_dims():
    assert pad_dims((1, 3, 4, 2), ((0, 0), (1, 2), (2, 1), (0, 0))) == [(3, 1, 2), (8, 4, 2)]
    assert pad_dims((2, 3, 4), ((0, 0), (0, 0), (0, 0))) == [(24, 0, 0)]
    assert pad_dims((1, 1), ((0, 0), (0, 0))) == [(1, 0, 0)]
    assert pad_dims((1, 5, 2), ((1, 0), (0, 0), (0, 0))) == [(10, 10, 0)]


# --- the emitted text ---------------------------------------------------------------------


def test_reshape_skips_the_copy_when_placed_in_place():
    body = kernel(build("RESHAPE", "int8", [(2, 3, 4)], 1, {"new_shape": [6, 4]}), "RESHAPE")
    assert "if (o != x) memmove(o, x, 24);" in body


def test_slice_of_whole_rows_is_one_memcpy():
    model = build("SLICE", "float32", [(4, 3, 5), i32([1, 0, 0]), i32([2, -1, -1])])
    body = kernel(model, "SLICE")
    assert "memcpy(o, &x[15], 120);" in body and "for (" not in body


def test_large_transpose_goes_in_tiles():
    """float32 [32, 48, 16] -> [32, 16, 48] in tiles of 16 x 16 over the last two axes; int8
    of that size goes straight."""
    body = kernel(build("TRANSPOSE", "float32", [(32, 48, 16), i32([0, 2, 1])]), "TRANSPOSE")
    loops = [line.strip() for line in body.splitlines() if line.strip().startswith("for")]
    assert loops == [
        "for (i0 = 0; i0 < 32; ++i0)",
        "for (t2 = 0; t2 < 48; t2 += 16)",
        "for (i1 = 0; i1 < 16; ++i1)",
        "for (i2 = t2; i2 < t2 + 16; ++i2) {",
    ]
    assert "o[i0 * 768 + i1 * 48 + i2] = x[i0 * 768 + i1 + i2 * 16];" in body
    small = kernel(build("TRANSPOSE", "int8", [(32, 48, 16), i32([0, 2, 1])]), "TRANSPOSE")
    assert "+= 16" not in small


def test_generation_is_deterministic():
    for case in CASES:
        model = build(case[1], "int8", case[2], case[4], case[3])
        assert c_source(model) == c_source(model)


def test_resolved_constants_are_not_emitted():
    """The perm was applied when the loops were generated: no copy of it goes to flash."""
    model = build("TRANSPOSE", "int8", [(3, 4), i32([1, 0])])
    source = generate(plan_model(parse_model(model)), "m")["m.c"]
    assert not re.search(r"static const int32_t m_t\d+\[2\]", source)


# --- shapes that stress the loop nests, against TFLite ------------------------------------

STRESS = [
    ("transpose_3d", "TRANSPOSE", [(8, 16, 32), i32([2, 0, 1])], {}, 1),
    ("transpose_inner_pair", "TRANSPOSE", [(2, 5, 7, 3), i32([0, 2, 1, 3])], {}, 1),
    ("transpose_tiles", "TRANSPOSE", [(32, 48, 16), i32([0, 2, 1])], {}, 1),
    ("transpose_no_whole_tiles", "TRANSPOSE", [(72, 90), i32([1, 0])], {}, 1),
    ("pad_uneven", "PAD", [(2, 17, 19, 5), i32([[0, 1], [3, 0], [2, 5], [1, 2]])], {}, 1),
    ("pad_only_outer", "PAD", [(3, 4, 6), i32([[2, 1], [0, 0], [0, 0]])], {}, 1),
    ("pad_only_inner", "PAD", [(3, 4, 6), i32([[0, 0], [0, 0], [1, 0]])], {}, 1),
    (
        "strided_steps",
        "STRIDED_SLICE",
        [(9, 10, 11), i32([8, 1, 10]), i32([0, 10, 0]), i32([-3, 2, -4])],
        {},
        1,
    ),
    ("strided_empty", "STRIDED_SLICE", [(4, 5), i32([2, 0]), i32([2, 5]), i32([1, 1])], {}, 1),
    ("slice_rows", "SLICE", [(6, 7, 8), i32([2, 1, 0]), i32([3, 5, -1])], {}, 1),
    (
        "concat_four",
        "CONCATENATION",
        [(2, 3, 1, 4), (2, 3, 5, 4), (2, 3, 2, 4), (2, 3, 1, 4)],
        {"axis": 2},
        1,
    ),
    ("split_axis0", "SPLIT", [i32(0), (6, 5, 3)], {"num_splits": 3}, 3),
    ("split_v_inner", "SPLIT_V", [(4, 3, 9), i32([2, 4, 3]), i32(2)], {"num_splits": 3}, 3),
    ("pack_inner", "PACK", [(4, 5, 3)] * 4, {"values_count": 4, "axis": 2}, 1),
    ("unpack_middle", "UNPACK", [(4, 3, 5)], {"num": 3, "axis": 1}, 3),
    ("gather_last_axis", "GATHER", [(3, 4, 9), i32([8, 0, 8, 3, 3])], {"axis": 2}, 1),
    ("gather_rows", "GATHER", [(10, 16), i32([[9, 0], [4, 4], [1, 2]])], {"axis": 0}, 1),
]


@pytest.mark.parametrize("dtype", ("int8", "float32"))
@pytest.mark.parametrize(
    ("name", "opcode", "operands", "options", "outputs"), STRESS, ids=[case[0] for case in STRESS]
)
def test_stress_shapes(name, opcode, operands, options, outputs, dtype):
    assert_matches_oracle(build(opcode, dtype, operands, outputs, options), sanitize=True)


# --- constant operands and chains ---------------------------------------------------------


def test_constant_values_operand():
    """A constant data input is read from its static const array."""
    b = ModelBuilder()
    x = b.input("x", (2, 3), "float32")
    c = b.const("c", np.arange(8, dtype=np.float32).reshape(2, 4))
    y = b.tensor("y", (2, 7), "float32")
    b.op("CONCATENATION", [c, x], [y], {"axis": 1})
    b.output(y)
    assert_matches_oracle(b.build(), sanitize=True)


def test_chain_of_moves():
    """Pad, transpose, slice, split and concatenate in a row, through the planned arena."""
    b = ModelBuilder()
    x = b.input("x", (1, 6, 5, 4), "float32")
    padded = b.tensor("padded", (1, 8, 6, 4), "float32")
    b.op("PAD", [x, b.const("p", i32([[0, 0], [1, 1], [0, 1], [0, 0]]))], [padded])
    moved = b.tensor("moved", (1, 4, 8, 6), "float32")
    b.op("TRANSPOSE", [padded, b.const("perm", i32([0, 3, 1, 2]))], [moved])
    cut = b.tensor("cut", (1, 4, 6, 6), "float32")
    b.op(
        "SLICE",
        [moved, b.const("begin", i32([0, 0, 1, 0])), b.const("size", i32([-1, -1, 6, -1]))],
        [cut],
    )
    halves = [b.tensor(f"h{i}", (1, 2, 6, 6), "float32") for i in range(2)]
    b.op("SPLIT", [b.const("axis", i32(1)), cut], halves, {"num_splits": 2})
    joined = b.tensor("joined", (1, 2, 6, 12), "float32")
    b.op("CONCATENATION", halves[::-1], [joined], {"axis": 3})
    flat = b.tensor("flat", (2, 72), "float32")
    b.op("RESHAPE", [joined], [flat], {"new_shape": [2, 72]})
    b.output(flat)
    assert_matches_oracle(b.build(), sanitize=True)


# --- uint8 CONCATENATION rescaling its inputs ---------------------------------------------


@pytest.mark.parametrize("case", range(len(UINT8_RESCALED)))
def test_concatenation_uint8_rescaled_sanitized(case):
    model = concatenation_model("uint8", *UINT8_RESCALED[case])
    assert_sanitized_c_matches_runtime(model, sets=3)


def test_concatenation_uint8_rescaled_text():
    """Inputs quantized as the output are copied with memcpy, the others rescaled through the
    op's one helper."""
    model = concatenation_model("uint8", *UINT8_RESCALED[0])
    source = c_source(model)
    assert source.count("static inline uint8_t m_op0_rescale(") == 1
    body = kernel(model, "CONCATENATION")
    assert "memcpy(&o[i0 * 12], &x0[i0 * 6], 6);" in body
    assert "o[i0 * 12 + k + 6] = m_op0_rescale(x1[i0 * 2 + k], 2.e+00f, -2.e+02f);" in body
    copies = concatenation_model("uint8", [(2, 3), (2, 3)], [(0.1, 5)] * 2, (0.1, 5), 0)
    assert "rescale" not in c_source(copies)


def test_concatenation_uint8_rescaled_empty_input():
    """An input of extent 0 along the axis adds nothing, and no pointer to it is declared (the
    C compiles without warnings)."""
    model = concatenation_model("uint8", [(2, 0), (2, 3)], [(0.2, 1), (0.1, 5)], (0.1, 5), 1)
    assert "x0" not in kernel(model, "CONCATENATION")
    with CBackend(plan_model(parse_model(model))):
        pass
