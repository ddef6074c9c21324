"""Shape and data-movement ops: runtime_py against TFLite's reference kernels, bit for bit.

Each model is built twice: first with empty output shapes, so that TFLite's own Prepare says
what the outputs' shapes are, then with those shapes. Our prepare must compute the same shapes
(it refuses a model whose declared shapes differ), so the tests check shape inference too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import assert_matches_oracle, assert_varied, refusal
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import random_inputs
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import plan_model

# Activation quantization per dtype; int16 keeps zero point 0 as TFLite requires of it.
QUANT = {"int8": (0.05, -3), "uint8": (0.05, 125), "int16": (0.002, 0)}
DTYPES = ("int8", "uint8", "float32", "int32")
EXTRA_DTYPES = ("int16", "int64")


@dataclass(frozen=True)
class OfDtype:
    """A constant operand of the tested dtype (PADV2's pad value), quantized as the output."""

    value: float


def i32(values) -> np.ndarray:
    return np.asarray(values, np.int32)


def i64(values) -> np.ndarray:
    return np.asarray(values, np.int64)


def build(
    opcode: str,
    dtype: str,
    operands: list,
    outputs: int = 1,
    options: dict | None = None,
    out_shapes: list | None = None,
    out_quant: tuple | None = None,
) -> bytes:
    """One-op model. An operand that is a shape becomes a model input of `dtype`; an array a
    constant. Output shapes default to those TFLite computes."""
    quant = QUANT.get(dtype, (None, None))
    b = ModelBuilder()
    indices = []
    for i, operand in enumerate(operands):
        if isinstance(operand, tuple):
            indices.append(b.input(f"x{i}", operand, dtype, *quant))
        elif isinstance(operand, OfDtype):
            value = operand.value + 128 if dtype == "uint8" else operand.value  # as int8's
            indices.append(b.const(f"c{i}", np.asarray([value], dtype), *(out_quant or quant)))
        else:
            indices.append(b.const(f"c{i}", operand))
    shapes = out_shapes or [()] * outputs
    outs = [b.tensor(f"y{i}", s, dtype, *(out_quant or quant)) for i, s in enumerate(shapes)]
    b.op(opcode, indices, outs, options)
    for o in outs:
        b.output(o)
    model = b.build()
    if out_shapes is not None:
        return model
    details = LiteRTOracle(model).interpreter.get_output_details()
    return build(
        opcode,
        dtype,
        operands,
        outputs,
        options,
        [tuple(int(d) for d in detail["shape"]) for detail in details],
        out_quant,
    )


def oracle_outputs(model: bytes) -> list[np.ndarray]:
    inputs = random_inputs(parse_model(model).main, seed=0)
    return LiteRTOracle(model).invoke(inputs)


# (id, opcode, operands, options, number of outputs)
CASES = [
    ("reshape_tensor", "RESHAPE", [(2, 3, 4), i32([4, -1])], {}, 1),
    ("reshape_options", "RESHAPE", [(2, 3, 4)], {"new_shape": [6, 1, 4]}, 1),
    ("reshape_both", "RESHAPE", [(1, 12), i32([3, 4])], {"new_shape": [3, 4]}, 1),
    ("squeeze_all", "SQUEEZE", [(1, 3, 1, 2)], {}, 1),
    ("squeeze_listed", "SQUEEZE", [(1, 3, 1, 2)], {"squeeze_dims": [-2]}, 1),
    ("expand_dims_front", "EXPAND_DIMS", [(3, 2), i32(0)], {}, 1),
    ("expand_dims_last", "EXPAND_DIMS", [(3, 2), i32([-1])], {}, 1),
    ("expand_dims_int64_axis", "EXPAND_DIMS", [(3, 2), i64(1)], {}, 1),
    ("pad_image", "PAD", [(1, 3, 4, 2), i32([[0, 0], [1, 2], [2, 1], [0, 0]])], {}, 1),
    ("pad_2d_int64", "PAD", [(2, 3), i64([[1, 0], [0, 2]])], {}, 1),
    ("pad_5d", "PAD", [(1, 2, 1, 2, 2), i32([[0, 1], [1, 0], [0, 0], [2, 0], [0, 1]])], {}, 1),
    ("padv2_value", "PADV2", [(2, 3, 2), i32([[1, 1], [0, 2], [1, 0]]), OfDtype(-2)], {}, 1),
    (
        "padv2_image",
        "PADV2",
        [(1, 2, 2, 3), i32([[0, 0], [1, 1], [1, 1], [0, 0]]), OfDtype(5)],
        {},
        1,
    ),
    ("concat_axis1", "CONCATENATION", [(2, 3, 2), (2, 1, 2), (2, 2, 2)], {"axis": 1}, 1),
    ("concat_negative_axis", "CONCATENATION", [(2, 3), (2, 4)], {"axis": -1}, 1),
    ("concat_axis0", "CONCATENATION", [(1, 4), (3, 4)], {"axis": 0}, 1),
    ("pack_front", "PACK", [(3, 2), (3, 2)], {"values_count": 2, "axis": 0}, 1),
    ("pack_last", "PACK", [(3, 2)] * 3, {"values_count": 3, "axis": -1}, 1),
    ("pack_middle", "PACK", [(2, 3), (2, 3)], {"values_count": 2, "axis": 1}, 1),
    ("unpack_front", "UNPACK", [(3, 2, 2)], {"num": 3, "axis": 0}, 3),
    ("unpack_last", "UNPACK", [(2, 4)], {"num": 4, "axis": -1}, 4),
    ("split", "SPLIT", [i32(1), (2, 6)], {"num_splits": 3}, 3),
    ("split_negative_axis", "SPLIT", [i32([-1]), (2, 2, 4)], {"num_splits": 2}, 2),
    ("split_v", "SPLIT_V", [(2, 6), i32([1, -1, 2]), i32(1)], {"num_splits": 3}, 3),
    ("split_v_int64_sizes", "SPLIT_V", [(5, 2), i64([2, 3]), i32(-2)], {"num_splits": 2}, 2),
    ("transpose_2d", "TRANSPOSE", [(3, 4), i32([1, 0])], {}, 1),
    ("transpose_nhwc_nchw", "TRANSPOSE", [(1, 2, 3, 4), i32([0, 3, 1, 2])], {}, 1),
    ("transpose_6d", "TRANSPOSE", [(2, 1, 3, 1, 2, 2), i32([5, 3, 1, 0, 2, 4])], {}, 1),
    ("transpose_negative_perm", "TRANSPOSE", [(2, 3, 4), i32([-1, 0, 1])], {}, 1),
    ("slice", "SLICE", [(3, 4, 5), i32([1, 0, 2]), i32([2, -1, 3])], {}, 1),
    ("slice_int64", "SLICE", [(4, 6), i64([0, 1]), i64([4, 2])], {}, 1),
    ("strided", "STRIDED_SLICE", [(4, 6), i32([1, 0]), i32([3, 6]), i32([1, 2])], {}, 1),
    (
        "strided_backwards",
        "STRIDED_SLICE",
        [(5, 6), i32([-1, 5]), i32([-6, 0]), i32([-2, -1])],
        {},
        1,
    ),
    (
        "strided_masks",
        "STRIDED_SLICE",
        [(3, 4, 5), i32([1, 2, 0]), i32([0, 3, 5]), i32([1, 1, 2])],
        {"begin_mask": 0b010, "end_mask": 0b001},
        1,
    ),
    (
        "strided_backwards_masks",
        "STRIDED_SLICE",
        [(4, 5), i32([0, 3]), i32([0, 0]), i32([-1, -2])],
        {"begin_mask": 0b01, "end_mask": 0b11},
        1,
    ),
    (
        "strided_shrink",
        "STRIDED_SLICE",
        [(3, 4, 5), i32([1, 0, -1]), i32([2, 4, 0]), i32([1, 1, 1])],
        {"shrink_axis_mask": 0b101},
        1,
    ),
    (
        "strided_ellipsis",
        "STRIDED_SLICE",
        [(2, 3, 4, 5), i32([0, 1]), i32([0, 3]), i32([1, 1])],
        {"ellipsis_mask": 0b01},
        1,
    ),
    (
        "strided_new_axis",
        "STRIDED_SLICE",
        [(3, 4), i32([0, 0, 1]), i32([0, 3, 4]), i32([1, 1, 2])],
        {"new_axis_mask": 0b001},
        1,
    ),
    (
        "strided_ellipsis_new_axis",
        "STRIDED_SLICE",
        [(2, 3, 4), i32([0, 0, 0]), i32([0, 0, 2]), i32([1, 1, 1])],
        {"ellipsis_mask": 0b010, "new_axis_mask": 0b001},
        1,
    ),
    (
        "strided_ellipsis_shrink",
        "STRIDED_SLICE",
        [(2, 3, 4), i32([0, 2]), i32([0, 3]), i32([1, 1])],
        {"ellipsis_mask": 0b01, "shrink_axis_mask": 0b10},
        1,
    ),
    (
        "strided_offset",
        "STRIDED_SLICE",
        [(5, 6), i32([1, 2]), i32([3, 2]), i32([1, 2])],
        {"offset": True},
        1,
    ),
    ("strided_partial_spec", "STRIDED_SLICE", [(3, 4, 5), i32([1]), i32([3]), i32([1])], {}, 1),
    (
        "strided_clamped",
        "STRIDED_SLICE",
        [(4, 5), i32([-10, 2]), i32([10, 100]), i32([1, 3])],
        {},
        1,
    ),
    (
        "strided_6d",
        "STRIDED_SLICE",
        [
            (2, 1, 3, 1, 2, 3),
            i32([1, 0, 2, 0, 0, 0]),
            i32([2, 1, 0, 1, 2, 3]),
            i32([1, 1, -1, 1, 1, 2]),
        ],
        {},
        1,
    ),
    ("depth_to_space", "DEPTH_TO_SPACE", [(2, 2, 3, 12)], {"block_size": 2}, 1),
    ("depth_to_space_3", "DEPTH_TO_SPACE", [(1, 2, 2, 9)], {"block_size": 3}, 1),
    ("space_to_depth", "SPACE_TO_DEPTH", [(2, 4, 6, 3)], {"block_size": 2}, 1),
    ("space_to_batch", "SPACE_TO_BATCH_ND", [(2, 4, 6, 3), i32([2, 3]), i32([[0, 0], [0, 0]])],
     {}, 1),
    ("batch_to_space", "BATCH_TO_SPACE_ND", [(12, 2, 3, 2), i32([2, 3]), i32([[0, 0], [0, 0]])],
     {}, 1),
    ("space_to_batch_padded", "SPACE_TO_BATCH_ND",
     [(2, 3, 4, 3), i32([2, 3]), i32([[1, 2], [0, 2]])], {}, 1),
    ("space_to_batch_padded_1x2", "SPACE_TO_BATCH_ND",
     [(1, 5, 3, 2), i32([1, 2]), i32([[2, 0], [1, 0]])], {}, 1),
    ("batch_to_space_cropped", "BATCH_TO_SPACE_ND",
     [(12, 2, 3, 2), i32([2, 3]), i32([[1, 0], [2, 3]])], {}, 1),
    ("batch_to_space_cropped_4x1", "BATCH_TO_SPACE_ND",
     [(8, 3, 2, 1), i32([4, 1]), i32([[3, 2], [0, 1]])], {}, 1),
    ("reverse_inner", "REVERSE_V2", [(2, 3, 4), i32([2])], {}, 1),
    ("reverse_outer", "REVERSE_V2", [(3, 5, 2), i32([0])], {}, 1),
    ("reverse_two_axes", "REVERSE_V2", [(2, 3, 4, 5), i32([-2, 1])], {}, 1),
    ("mirror_pad_reflect_image", "MIRROR_PAD",
     [(1, 4, 5, 2), i32([[0, 0], [1, 3], [3, 2], [0, 0]])], {"mode": "REFLECT"}, 1),
    ("mirror_pad_symmetric_int64", "MIRROR_PAD", [(3, 4), i64([[3, 1], [0, 4]])],
     {"mode": "SYMMETRIC"}, 1),
    ("mirror_pad_innermost", "MIRROR_PAD", [(2, 3, 3), i32([[1, 0], [0, 0], [2, 2]])],
     {"mode": "REFLECT"}, 1),
    ("broadcast_to_rows", "BROADCAST_TO", [(1, 4), i32([3, 4])], {}, 1),
    ("broadcast_to_new_axes", "BROADCAST_TO", [(3, 1), i64([2, 2, 3, 5])], {}, 1),
    ("broadcast_to_same", "BROADCAST_TO", [(2, 3), i32([2, 3])], {}, 1),
    ("gather_axis0", "GATHER", [(5, 3), i32([4, 0, 2])], {"axis": 0}, 1),
    ("gather_2d_indices", "GATHER", [(2, 5, 3), i32([[1, 4], [0, 0]])], {"axis": 1}, 1),
    ("gather_negative_axis_int64", "GATHER", [(3, 4), i64([3, 1])], {"axis": -1}, 1),
    ("gather_scalar_index", "GATHER", [(4, 3), i32(2)], {"axis": 0}, 1),
    ("gather_int16_indices", "GATHER", [(4, 3), np.asarray([1, 3], np.int16)], {"axis": 0}, 1),
    (
        "gather_batch_dims",
        "GATHER",
        [(2, 4, 3), i32([[3, 0], [1, 1]])],
        {"axis": 1, "batch_dims": 1},
        1,
    ),
    (
        "gather_negative_batch_dims",
        "GATHER",
        [(2, 3, 4, 2), i32([[0, 3], [2, 1]])],
        {"axis": 2, "batch_dims": -1},
        1,
    ),
]
CASE_IDS = [case[0] for case in CASES]
# For the dtypes that only ride along (same kernels, other element sizes): one case per op and
# every third case.
FIRST_OF_EACH_OP = {case[0] for case in {case[1]: case for case in reversed(CASES)}.values()}
RIDING_ALONG = [case for index, case in enumerate(CASES)
                if case[0] in FIRST_OF_EACH_OP or index % 3 == 0]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("name", "opcode", "operands", "options", "outputs"), CASES, ids=CASE_IDS)
def test_matches_oracle(name, opcode, operands, options, outputs, dtype):
    """Every case, with the C built under the sanitizers."""
    model = build(opcode, dtype, operands, outputs, options)
    assert_matches_oracle(model, sanitize=True)
    if dtype in ("int8", "uint8"):  # the comparison means something only if the outputs vary
        assert all(np.unique(out).size > 1 for out in oracle_outputs(model))


OTHER_SIZES = [
    pytest.param(dtype, *case, id=f"{case[0]}-{dtype}")
    for dtype in EXTRA_DTYPES
    for case in RIDING_ALONG
    # TFLite has no int64 UNPACK and no int16 DEPTH_TO_SPACE or SPACE_TO_DEPTH
    if (case[1], dtype) not in {("UNPACK", "int64"), ("DEPTH_TO_SPACE", "int16"),
                                ("SPACE_TO_DEPTH", "int16")}
]


@pytest.mark.parametrize(("dtype", "name", "opcode", "operands", "options", "outputs"),
                         OTHER_SIZES)
def test_other_element_sizes(dtype, name, opcode, operands, options, outputs):
    assert_matches_oracle(build(opcode, dtype, operands, outputs, options), sanitize=True)


# Ops whose int8 kernels copy stored integers even when the output is quantized differently.
REQUANTIZATION_FREE = [
    "reshape_tensor",
    "pad_image",
    "padv2_value",
    "transpose_nhwc_nchw",
    "slice",
    "strided_shrink",
    "split_v",
    "gather_batch_dims",
]


@pytest.mark.parametrize("dtype, out_quant", [("int8", (0.1, 4)), ("int16", (0.01, 0))])
@pytest.mark.parametrize("name", REQUANTIZATION_FREE)
def test_copies_stored_values_across_quantizations(name, dtype, out_quant):
    _, opcode, operands, options, outputs = CASES[CASE_IDS.index(name)]
    assert_matches_oracle(build(opcode, dtype, operands, outputs, options, out_quant=out_quant))


@pytest.mark.parametrize("padding", [[[0, 0], [1, 2], [2, 1], [0, 0]], [[1, 0], [0, 0], [0, 3],
                                                                          [2, 2]]])
def test_pad_int16(padding):
    """int16 PAD fills with zero (its zero point), PADV2 with its constant."""
    pad = build("PAD", "int16", [(2, 3, 4, 2), i32(padding)])
    padv2 = build("PADV2", "int16", [(2, 3, 4, 2), i32(padding), OfDtype(-1234)])
    for model in (pad, padv2):
        assert_varied(model)
        assert_matches_oracle(model)


def test_pad_fills_with_the_output_zero_point():
    model = build("PAD", "int8", [(1, 2), i32([[0, 0], [2, 1]])], out_quant=(0.1, 9))
    assert_matches_oracle(model)
    assert (oracle_outputs(model)[0][:, [0, 1, 4]] == 9).all()


def test_scalar_in_the_middle():
    """Reshape to rank 0 (an empty new_shape) and back; a scalar model output would trip
    toolchain.lab.check, which compares numpy scalars as arrays."""
    b = ModelBuilder()
    x = b.input("x", (1, 1), "float32")
    scalar = b.tensor("scalar", (), "float32")
    b.op("RESHAPE", [x], [scalar], {"new_shape": []})
    y = b.tensor("y", (1,), "float32")
    b.op("EXPAND_DIMS", [scalar, b.const("axis", i32(0))], [y])
    b.output(y)
    assert_matches_oracle(b.build())


def test_unsupported_element_type_is_not_listed():
    """SPLIT's signature covers its data input (input 1) as well as the int32 axis."""
    model = build("SPLIT", "bool", [i32(0), (2, 2)], 2, {"num_splits": 2}, [(1, 2), (1, 2)])
    assert "SPLIT: no kernel for int32, bool -> bool, bool" in refusal(model)


def int8_pair(
    opcode: str,
    in_quant: tuple,
    out_quant: tuple,
    operands_after=(),
    options=None,
    in_shape=(2, 3),
    out_shapes=((2, 3),),
) -> bytes:
    """A one-op int8 model with its inputs and outputs quantized as given."""
    b = ModelBuilder("int8")
    ins = [b.input(f"x{i}", in_shape, "int8", *q) for i, q in enumerate(in_quant)]
    extra = [b.const(f"c{i}", c) for i, c in enumerate(operands_after)]
    outs = [b.tensor(f"y{i}", s, "int8", *out_quant) for i, s in enumerate(out_shapes)]
    b.op(opcode, ins + extra, outs, options)
    for o in outs:
        b.output(o)
    return b.build()


# Models TFLite itself refuses; our prepare must refuse them too, with the reason.
TFLITE_REFUSES = {
    "concat_fused_relu": (
        build(
            "CONCATENATION",
            "float32",
            [(2, 3), (2, 3)],
            1,
            {"axis": 0, "fused_activation_function": "RELU"},
            [(4, 3)],
        ),
        "fused activation RELU",
    ),
    "concat_int8_rescale": (
        int8_pair(
            "CONCATENATION", [(0.1, 0), (0.2, 0)], (0.1, 0), (), {"axis": 0}, out_shapes=[(4, 3)]
        ),
        "does not requantize",
    ),
    "pack_int8_rescale": (
        int8_pair(
            "PACK", [(0.1, 0), (0.1, 0)], (0.1, 2), (), {"values_count": 2}, out_shapes=[(2, 2, 3)]
        ),
        "does not requantize",
    ),
    "unpack_int8_rescale": (
        int8_pair("UNPACK", [(0.1, 0)], (0.2, 0), (), {"num": 2}, out_shapes=[(3,), (3,)]),
        "does not requantize",
    ),
    "expand_dims_int8_rescale": (
        int8_pair("EXPAND_DIMS", [(0.1, 0)], (0.1, 1), [i32(0)], out_shapes=[(1, 2, 3)]),
        "does not requantize",
    ),
    "padv2_value_quantized_apart": (
        build(
            "PADV2",
            "int8",
            [(2, 3), i32([[1, 0], [0, 0]]), np.asarray([3], np.int8)],
            1,
            out_shapes=[(3, 3)],
        ),
        "constant_values quantized differently",
    ),
    "gather_negative_index": (
        build("GATHER", "float32", [(4, 3), i32([1, -1])], 1, {"axis": 0}, [(2, 3)]),
        "indices outside [0, 4)",
    ),
}


@pytest.mark.parametrize("name", TFLITE_REFUSES)
def test_refuses_what_tflite_refuses(name):
    model, reason = TFLITE_REFUSES[name]
    assert reason in refusal(model)
    with pytest.raises(Exception):  # noqa: B017 (LiteRT raises RuntimeError or ValueError)
        LiteRTOracle(model).invoke(random_inputs(parse_model(model).main, seed=0))


# Models TFLite runs but whose outputs it leaves partly unwritten or makes up.
UNDEFINED_IN_TFLITE = {
    "strided_offset_past_the_end": (
        build(
            "STRIDED_SLICE",
            "float32",
            [(4, 5), i32([2, 0]), i32([3, 5]), i32([1, 1])],
            1,
            {"offset": True},
            [(3, 5)],
        ),
        "TFLite sizes the output 3 but its loop writes 2",
    ),
    "strided_shrink_out_of_range": (
        build(
            "STRIDED_SLICE",
            "float32",
            [(4, 5), i32([4, 0]), i32([5, 5]), i32([1, 1])],
            1,
            {"shrink_axis_mask": 1},
            [(5,)],
        ),
        "TFLite sizes the output 1 but its loop writes 0",
    ),
    "mirror_pad_reflect_as_wide_as_the_dimension": (
        build("MIRROR_PAD", "float32", [(3, 4), i32([[0, 0], [4, 0]])], 1, {"mode": "REFLECT"},
              [(3, 8)]),
        "REFLECT padding 4 of a dimension of 4 (at most 3)",
    ),
    "transpose_repeated_axis": (
        build("TRANSPOSE", "float32", [(2, 2), i32([0, 0])], 1, None, [(2, 2)]),
        "not a permutation",
    ),
}


@pytest.mark.parametrize("name", UNDEFINED_IN_TFLITE)
def test_refuses_what_tflite_computes_wrongly(name):
    model, reason = UNDEFINED_IN_TFLITE[name]
    assert reason in refusal(model)


def test_refuses_output_shape_tflite_would_not_compute():
    model = build("TRANSPOSE", "float32", [(2, 3), i32([1, 0])], 1, None, [(2, 3)])
    assert "TFLite computes [3, 2]" in refusal(model)


# --- CONCATENATION across quantizations ----------------------------------------------------


def concatenation_model(dtype: str, shapes, quants, out_quant, axis: int) -> bytes:
    """CONCATENATION of inputs `shapes` quantized `quants` (None: unquantized) into an output
    quantized `out_quant`."""
    b = ModelBuilder()
    xs = [b.input(f"x{i}", s, dtype, *(q or (None, None))) for i, (s, q) in
          enumerate(zip(shapes, quants, strict=True))]
    out_shape = list(shapes[0])
    out_shape[axis] = sum(s[axis] for s in shapes)
    y = b.tensor("y", out_shape, dtype, *(out_quant or (None, None)))
    b.op("CONCATENATION", xs, [y], {"axis": axis})
    b.output(y)
    return b.build()


# (shapes, input quantizations, output quantization, axis): uint8 inputs quantized unlike the
# output are rescaled in float32; inputs quantized alike are copied.
UINT8_RESCALED = [
    ([(2, 3, 2), (2, 1, 2), (2, 2, 2)], [(0.05, 128), (0.1, 100), (0.02, 0)], (0.05, 128), 1),
    ([(1, 4), (1, 3)], [(0.05, 128), (0.1, 100)], (0.07, 120), 1),
    ([(3, 5), (2, 5)], [(0.0123, 7), (0.0123, 9)], (0.0123, 7), 0),
    ([(1, 2, 2, 3), (1, 2, 2, 5)], [(0.2, 0), (0.01, 255)], (0.03, 77), 3),
    ([(2, 3), (2, 3), (2, 3)], [(0.1, 128), (0.1, 128), (0.1, 128)], (0.2, 100), -1),
    ([(4, 1, 3), (4, 2, 3)], [(1 / 3, 10), (0.5, 128)], (1 / 6, 0), 1),
]


@pytest.mark.parametrize("shapes, quants, out_quant, axis", UINT8_RESCALED)
def test_concatenation_uint8_rescales(shapes, quants, out_quant, axis):
    model = concatenation_model("uint8", shapes, quants, out_quant, axis)
    assert_varied(model)
    assert_matches_oracle(model)


def test_concatenation_uint8_rounds_halves_away_from_zero():
    """Scale 1/2 and an even zero point: every odd q lands on a half."""
    model = concatenation_model("uint8", [(2, 128), (2, 128)], [(0.1, 128), (0.05, 64)],
                                (0.1, 100), 1)
    values = [np.arange(256, dtype=np.uint8).reshape(2, 128)] * 2
    expected = LiteRTOracle(model).invoke(values)
    runtime = ArenaInterpreter(plan_model(parse_model(model), "greedy")).invoke(values)
    with CBackend(plan_model(parse_model(model), "greedy")) as backend:
        compiled = backend.invoke(values)
    for e, r, c in zip(expected, runtime, compiled, strict=True):
        np.testing.assert_array_equal(r, e)
        np.testing.assert_array_equal(c, e)


@pytest.mark.parametrize(
    "quants, out_quant",
    [([(1e-3, 0), (5e-3, 0)], (2e-3, 0)), ([(0.5, 0), (3e-4, 0), (0.002, 0)], (0.002, 0))],
)
def test_concatenation_int16_copies_across_scales(quants, out_quant):
    """int16 CONCATENATION copies stored values whatever the scales (zero points are 0)."""
    shapes = [(2, 3, 2)] * len(quants)
    model = concatenation_model("int16", shapes, quants, out_quant, 1)
    assert_varied(model)
    assert_matches_oracle(model)


@pytest.mark.parametrize(
    "dtype, quants, out_quant, reason",
    [
        ("uint8", [None, (0.1, 128)], (0.1, 128), "scale of 0 or infinity"),
        ("uint8", [(0.1, 128), (0.1, 128)], None, "scale of 0 or infinity"),
        ("uint8", [(1.0, 0), (0.1, 128)], (1e-8, 0), "leaves int32"),
        ("int8", [(0.1, 0), (0.1, 1)], (0.1, 0), "does not requantize"),
        ("int16", [(0.1, 0), (0.1, 3)], (0.1, 0), "zero point 0"),
        ("int16", [(0.1, 0), (0.1, 0)], (0.1, 2), "zero point 0"),
    ],
)
def test_concatenation_refusals(dtype, quants, out_quant, reason):
    model = concatenation_model(dtype, [(2, 3), (2, 3)], quants, out_quant, 0)
    assert reason in refusal(model)


def test_padv2_int16_refuses_a_value_quantized_apart():
    model = build("PADV2", "int16", [(2, 3), i32([[1, 0], [0, 0]]), np.asarray([3], np.int16)],
                  1, out_shapes=[(3, 3)])
    assert "constant_values quantized differently" in refusal(model)
    with pytest.raises(Exception):  # noqa: B017 (LiteRT raises RuntimeError or ValueError)
        LiteRTOracle(model).invoke(random_inputs(parse_model(model).main, seed=0))


@pytest.mark.parametrize("opcode, options, shape", [
    ("RESHAPE", {"new_shape": [6]}, (6,)),
    ("SQUEEZE", {"squeeze_dims": [0]}, (2, 3)),
    ("EXPAND_DIMS", None, (1, 1, 2, 3)),
])
def test_bool_is_renamed_as_any_type(opcode, options, shape):
    """The ops that only rename bytes take bool, as TFLite's do (a converter reshapes the bool
    condition an IF reads)."""
    b = ModelBuilder()
    x = b.input("x", (1, 2, 3), "bool")
    y = b.tensor("y", shape, "bool")
    operands = {"RESHAPE": [x, b.const("shape", i32(shape))], "SQUEEZE": [x],
                "EXPAND_DIMS": [x, b.const("axis", i32([0]))]}[opcode]
    b.op(opcode, operands, [y], options)
    b.output(y)
    model = b.build()
    assert_varied(model)
    assert_matches_oracle(model)


def test_reverse_of_axes_apart_is_refused_as_tflite_refuses_it():
    model = build("REVERSE_V2", "float32", [(2, 3, 4, 5), i32([1, -1])], out_shapes=[(2, 3, 4, 5)])
    assert "axes [1, -1]: TFLite reverses distinct contiguous axes only" in refusal(model)


def test_broadcast_to_a_shape_the_input_does_not_fit_is_a_model_error():
    from toolchain.errors import ModelError
    from toolchain.ops import prepare_graph

    model = build("BROADCAST_TO", "float32", [(2, 3), i32([2, 4])], out_shapes=[(2, 4)])
    with pytest.raises(ModelError, match=r"input shape \[2, 3\] does not broadcast to \[2, 4\]"):
        prepare_graph(parse_model(model, "<built model>").main)


def test_space_to_batch_pads_with_the_zero_point():
    """TFLite requires the input's quantization on the output, and pads with its zero point."""
    b = ModelBuilder()
    x = b.input("x", (1, 2, 2, 1), "int8", 0.1, -7)
    y = b.tensor("y", (4, 2, 2, 1), "int8", 0.1, -7)
    b.op("SPACE_TO_BATCH_ND", [x, b.const("block", i32([2, 2])),
                               b.const("paddings", i32([[1, 1], [0, 2]]))], [y])
    b.output(y)
    model = b.build()
    assert_matches_oracle(model, sanitize=True)
    assert (oracle_outputs(model)[0] == -7).sum() >= 12  # the 12 padded elements at least


def test_crops_that_leave_nothing_are_a_model_error():
    from toolchain.errors import ModelError
    from toolchain.ops import prepare_graph

    model = build("BATCH_TO_SPACE_ND", "float32",
                  [(4, 1, 1, 1), i32([2, 2]), i32([[1, 1], [0, 0]])], out_shapes=[(1, 0, 2, 1)])
    with pytest.raises(ModelError, match="leave nothing"):
        prepare_graph(parse_model(model, "<built model>").main)
