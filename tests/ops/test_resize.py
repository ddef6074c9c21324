"""RESIZE_NEAREST_NEIGHBOR and RESIZE_BILINEAR against TFLite's reference kernels."""

from __future__ import annotations

import numpy as np
import pytest

from tests.opcheck import assert_matches_oracle, assert_varied
from toolchain.errors import UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.ops import prepare_graph

QUANT = {"float32": (None, None), "int8": (0.05, -3), "uint8": (0.05, 128), "int16": (0.001, 0)}


def resize_model(
    opcode: str,
    shape: tuple[int, int, int, int],
    size: tuple[int, int],
    dtype: str,
    align_corners: bool = False,
    half_pixel_centers: bool = False,
) -> bytes:
    b = ModelBuilder()
    x = b.input("x", shape, dtype, *QUANT[dtype])
    size_index = b.const("size", np.asarray(size, np.int32))
    y = b.tensor("y", (shape[0], *size, shape[3]), dtype, *QUANT[dtype])
    b.op(
        opcode,
        [x, size_index],
        [y],
        {"align_corners": align_corners, "half_pixel_centers": half_pixel_centers},
    )
    b.output(y)
    return b.build()


# (input shape, output size): up, down, mixed and odd ratios, identity, one-pixel edges.
RESIZES = [
    ((1, 3, 4, 2), (6, 8)),
    ((2, 5, 5, 3), (7, 3)),
    ((1, 8, 6, 1), (3, 4)),
    ((1, 4, 4, 2), (4, 4)),
    ((1, 1, 5, 2), (3, 9)),
    ((1, 6, 7, 2), (1, 13)),
    ((1, 3, 3, 4), (10, 11)),
]
# (align_corners, half_pixel_centers)
MODES = [(False, False), (True, False), (False, True)]
MODE_IDS = ["plain", "align_corners", "half_pixel"]


@pytest.mark.parametrize("shape, size", RESIZES)
@pytest.mark.parametrize("align_corners, half_pixel_centers", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("dtype", ["float32", "int8", "uint8", "int16"])
def test_resize_bilinear(dtype, shape, size, align_corners, half_pixel_centers):
    model = resize_model("RESIZE_BILINEAR", shape, size, dtype, align_corners, half_pixel_centers)
    assert_varied(model)
    assert_matches_oracle(model)


@pytest.mark.parametrize("shape, size", RESIZES)
@pytest.mark.parametrize("align_corners, half_pixel_centers", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("dtype", ["float32", "int8", "uint8", "int16"])
def test_resize_nearest_neighbor(dtype, shape, size, align_corners, half_pixel_centers):
    model = resize_model(
        "RESIZE_NEAREST_NEIGHBOR", shape, size, dtype, align_corners, half_pixel_centers
    )
    assert_varied(model)
    assert_matches_oracle(model)


@pytest.mark.parametrize("quant", [(3e-4, 0), (0.02, 0), (1e-3, 7)])
@pytest.mark.parametrize("align_corners, half_pixel_centers", MODES, ids=MODE_IDS)
def test_resize_bilinear_int16_ignores_quantization(quant, align_corners, half_pixel_centers):
    """TFLite blends the stored integers whatever the scales and zero points say."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 3, 2), "int16", *QUANT["int16"])
    size = b.const("size", np.asarray((7, 5), np.int32))
    y = b.tensor("y", (1, 7, 5, 2), "int16", *quant)
    options = {"align_corners": align_corners, "half_pixel_centers": half_pixel_centers}
    b.op("RESIZE_BILINEAR", [x, size], [y], options)
    b.output(y)
    assert_varied(b.build())
    assert_matches_oracle(b.build())


@pytest.mark.parametrize("dtype", ["int8", "int16"])
def test_resize_bilinear_refuses_positions_past_the_input(dtype):
    """2 -> 150 rows: the 10-bit scale rounds up (14/1024 per row, not 13.65), and TFLite's
    last output rows read row 2 of a 2-row input."""
    model = resize_model("RESIZE_BILINEAR", (1, 2, 3, 1), (150, 3), dtype)
    with pytest.raises(UnsupportedOpError, match="past the input"):
        prepare_graph(parse_model(model).main)
    float_model = resize_model("RESIZE_BILINEAR", (1, 2, 3, 1), (150, 3), "float32")
    prepare_graph(parse_model(float_model).main)  # float32 positions stay inside


def test_resize_bilinear_refuses_both_alignments():
    model = resize_model("RESIZE_BILINEAR", (1, 2, 2, 1), (4, 4), "float32", True, True)
    with pytest.raises(UnsupportedOpError, match="together"):
        prepare_graph(parse_model(model).main)


def test_resize_refuses_size_computed_at_run_time():
    b = ModelBuilder()
    x = b.input("x", (1, 2, 2, 1), "float32")
    size = b.input("size", (2,), "int32")
    y = b.tensor("y", (1, 4, 4, 1), "float32")
    b.op("RESIZE_NEAREST_NEIGHBOR", [x, size], [y])
    b.output(y)
    with pytest.raises(UnsupportedOpError, match="constant"):
        prepare_graph(parse_model(b.build()).main)
