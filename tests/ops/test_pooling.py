"""AVERAGE_POOL_2D, MAX_POOL_2D and L2_POOL_2D against TFLite's reference kernels: bit-exact."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tests.conftest import SHARED_MODELS
from tests.opcheck import assert_matches_oracle
from tests.ops.test_fully_connected import (
    assert_matches_and_varies,
    assert_refused,
    check_ops_on_oracle_tensors,
)
from toolchain.front.builder import ModelBuilder
from toolchain.ops.pooling.prepare import leading_padding, output_size

POOLS = ("AVERAGE_POOL_2D", "MAX_POOL_2D")
# int8 inputs span [-6.4, 6.35]: RELU6 and RELU_N1_TO_1 clamp inside that range; uint8 ones the
# same, their zero point 128 higher.
INPUT_QUANT = (0.05, 0)
UINT8_QUANT = (0.05, 128)
INT16_QUANT = (0.0002, 0)  # 16x8: zero point 0


def pool_model(
    opcode: str,
    dtype: str,
    shape: Sequence[int],
    size: tuple[int, int],
    stride: tuple[int, int],
    padding: str,
    activation: str = "NONE",
    quant: tuple[float, int] = INPUT_QUANT,
    output_quant: tuple[float, int] | None = None,
) -> bytes:
    _, height, width, channels = shape
    out_shape = (
        shape[0],
        output_size(padding, height, size[0], stride[0]),
        output_size(padding, width, size[1], stride[1]),
        channels,
    )
    b = ModelBuilder("float32" if dtype in ("uint8", "int16") else dtype)
    quant = {"int8": quant, "uint8": UINT8_QUANT, "int16": INT16_QUANT}.get(dtype, ())
    x = b.input("x", shape, dtype, *quant)
    out = b.tensor("y", out_shape, dtype, *(output_quant or quant))
    options = {
        "padding": padding,
        "stride_h": stride[0],
        "stride_w": stride[1],
        "filter_height": size[0],
        "filter_width": size[1],
        "fused_activation_function": activation,
    }
    b.op(opcode, [x], [out], options, version=2 if dtype == "int8" else 1)
    b.output(out)
    return b.build()


GEOMETRIES = [
    # shape, filter, stride, padding
    ((1, 4, 4, 3), (2, 2), (2, 2), "VALID"),
    ((1, 5, 5, 3), (2, 2), (2, 2), "SAME"),  # odd size: last windows half outside
    ((2, 7, 6, 4), (3, 2), (2, 1), "SAME"),
    ((1, 6, 6, 2), (3, 3), (1, 1), "SAME"),  # padding on both sides, counts 4, 6 and 9
    ((1, 8, 9, 2), (3, 3), (2, 3), "VALID"),
    ((1, 5, 7, 8), (5, 7), (5, 7), "VALID"),  # global pooling
    ((1, 3, 4, 2), (4, 4), (1, 1), "SAME"),  # window larger than the input
]


@pytest.mark.parametrize("opcode", POOLS)
@pytest.mark.parametrize("dtype", ["float32", "int8", "uint8", "int16"])
@pytest.mark.parametrize("shape, size, stride, padding", GEOMETRIES)
def test_pool_geometries(opcode, dtype, shape, size, stride, padding):
    assert_matches_and_varies(pool_model(opcode, dtype, shape, size, stride, padding))


@pytest.mark.parametrize("opcode", POOLS)
@pytest.mark.parametrize("dtype", ["float32", "int8", "uint8", "int16"])
@pytest.mark.parametrize("activation", ["RELU", "RELU6", "RELU_N1_TO_1"])
def test_pool_activations(opcode, dtype, activation):
    assert_matches_and_varies(
        pool_model(opcode, dtype, (1, 6, 5, 4), (2, 2), (1, 2), "SAME", activation)
    )


def test_average_pool_int8_rounds_negative_halves_away_from_zero():
    """Two-element windows (SAME edges of a 1x2 filter) have exact halves of both signs; zero
    point -128 makes many sums that TFLite rounds toward and away from zero."""
    for zero_point in (0, -128, 127):
        model = pool_model(
            "AVERAGE_POOL_2D",
            "int8",
            (2, 3, 9, 6),
            (1, 2),
            (1, 2),
            "SAME",
            quant=(0.05, zero_point),
        )
        assert_matches_and_varies(model)


def test_pool_refuses_requantization():
    model = pool_model(
        "AVERAGE_POOL_2D", "int8", (1, 4, 4, 1), (2, 2), (2, 2), "VALID", output_quant=(0.1, 0)
    )
    assert_refused(model, "quantization differs")


def test_pool_refuses_non_clamping_activation():
    model = pool_model("MAX_POOL_2D", "float32", (1, 4, 4, 1), (2, 2), (2, 2), "VALID", "TANH")
    assert_refused(model, "TANH")


def test_same_padding_matches_tflite_arithmetic():
    """TFLite puts the smaller half of odd total padding before the input."""
    assert output_size("SAME", 5, 2, 2) == 3
    assert leading_padding(5, 2, 2, 3) == 0
    assert leading_padding(6, 3, 1, 6) == 1
    assert leading_padding(3, 4, 1, 3) == 1


@pytest.mark.parametrize("name", ["kws_ref_model", "vww_96_int8", "pretrainedResnet_quant"])
def test_real_models_pooling(name):
    path = SHARED_MODELS / f"{name}.tflite"
    checked = sum(check_ops_on_oracle_tensors(path, POOLS, seed) for seed in range(3))
    assert checked > 0


@pytest.mark.parametrize("activation", ["NONE", "RELU6"])
@pytest.mark.parametrize("shape, size, stride, padding", GEOMETRIES)
def test_l2_pool(shape, size, stride, padding, activation):
    """L2_POOL_2D (float32 only, in LiteRT and TFLite Micro alike): every geometry, the C under
    the sanitizers; the SAME edges divide by their in-bounds counts."""
    model = pool_model("L2_POOL_2D", "float32", shape, size, stride, padding, activation)
    assert_matches_oracle(model, sanitize=True)
