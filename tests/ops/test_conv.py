"""CONV_2D, DEPTHWISE_CONV_2D and TRANSPOSE_CONV against TFLite's reference kernels.

Each case is a one-operator model; int8 outputs must be bit-exact. int8 quantization is chosen
so that the output covers about +-4 standard deviations of the accumulator: the random int8
inputs span the full range, so the outputs spread over the int8 range instead of saturating.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from runtime_py.kernels.conv import requantize
from tests.opcheck import assert_matches_oracle, oracle_outputs
from toolchain.errors import UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.oracle import LiteRTOracle
from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier
from toolchain.ops import prepare_graph
from toolchain.ops.conv.prepare import Requantize

INPUT_SCALE, INPUT_ZERO_POINT = 0.05, 3
OUTPUT_ZERO_POINT = -5
# Root mean square of int8 values uniform over [-128, 127] minus the zero point, and of
# filter values uniform over [-127, 127].
INPUT_RMS, FILTER_RMS = 74.0, 73.0
VERSIONS = {"CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "TRANSPOSE_CONV": 4}
ACTIVATIONS = ("NONE", "RELU", "RELU6", "RELU_N1_TO_1")
# (dtype, per-channel filter scales)
QUANTIZATIONS = [("int8", False), ("int8", True), ("float32", False)]
QUANT_IDS = ["int8-per-tensor", "int8-per-channel", "float32"]
# Convolutions that also run legacy uint8 (per tensor, the filter's zero point not 0).
CONV_QUANTIZATIONS = [*QUANTIZATIONS, ("uint8", False)]
CONV_QUANT_IDS = [*QUANT_IDS, "uint8"]
# uint8 quantizations are the int8 ones with zero points 128 higher; a uint8 filter has its own.
UINT8_SHIFT = 128
UINT8_FILTER_ZERO_POINT = 131


@dataclass(frozen=True)
class Weights:
    """Filter and bias of one test model, with the int8 output quantization they call for."""

    filter: np.ndarray
    filter_scales: np.ndarray | None
    bias: np.ndarray
    output_quant: tuple[float | None, int | None]
    filter_zero_point: int = 0


def _weights(
    rng: np.random.Generator,
    dtype: str,
    shape: tuple[int, ...],
    channel_axis: int,
    per_channel: bool,
    fan_in: float,
) -> Weights:
    channels = shape[channel_axis]
    if dtype == "float32":
        values = rng.normal(0.0, 1.0 / math.sqrt(fan_in), shape).astype(np.float32)
        bias = rng.normal(0.0, 0.5, channels).astype(np.float32)
        return Weights(values, None, bias, (None, None))
    values = rng.integers(-127, 128, shape).astype(np.int8)
    scales = rng.uniform(0.004, 0.012, channels) if per_channel else np.array([0.008])
    accumulator_rms = math.sqrt(fan_in) * INPUT_RMS * FILTER_RMS
    bias_range = int(0.5 * accumulator_rms)
    bias = rng.integers(-bias_range, bias_range + 1, channels).astype(np.int32)
    real_rms = accumulator_rms * INPUT_SCALE * float(np.sqrt(np.mean(scales**2)))
    output_quant = (8.0 * real_rms / 255.0, OUTPUT_ZERO_POINT)
    if dtype == "uint8":  # the same real values, stored 128 (the filter 131) higher
        stored = (values.astype(np.int32) + UINT8_FILTER_ZERO_POINT).clip(0, 255)
        return Weights(stored.astype(np.uint8), scales, bias,
                       (output_quant[0], output_quant[1] + UINT8_SHIFT), UINT8_FILTER_ZERO_POINT)
    return Weights(values, scales, bias, output_quant)


def _input(b: ModelBuilder, dtype: str, shape: tuple[int, ...], zero_point: int) -> int:
    if dtype == "float32":
        return b.input("input", shape, dtype)
    shift = UINT8_SHIFT if dtype == "uint8" else 0
    return b.input("input", shape, dtype, INPUT_SCALE, zero_point + shift)


def _builder(dtype: str) -> ModelBuilder:
    return ModelBuilder("float32" if dtype == "uint8" else dtype)


def _constants(b: ModelBuilder, w: Weights, channel_axis: int, bias: bool) -> tuple[int, int]:
    """Filter and bias tensors; -1 (absent) for the bias unless `bias`."""
    if w.filter_scales is None:
        return b.const("filter", w.filter), b.const("bias", w.bias) if bias else -1
    filter_index = b.const(
        "filter", w.filter, list(w.filter_scales), w.filter_zero_point,
        quantized_dimension=channel_axis
    )
    bias_scales = list(INPUT_SCALE * w.filter_scales)
    return filter_index, b.const("bias", w.bias, bias_scales, 0) if bias else -1


def _out_size(padding: str, size: int, kernel: int, stride: int, dilation: int = 1) -> int:
    effective = (kernel - 1) * dilation + 1
    return -(-size // stride) if padding == "SAME" else -(-(size - effective + 1) // stride)


def conv_model(
    dtype: str,
    per_channel: bool,
    input_shape: tuple[int, int, int, int],
    out_channels: int,
    kernel: tuple[int, int],
    stride=(1, 1),
    dilation=(1, 1),
    padding: str = "SAME",
    activation: str = "NONE",
    groups: int = 1,
    bias: bool = True,
    seed: int = 0,
    input_zero_point: int = INPUT_ZERO_POINT,
) -> bytes:
    batch, height, width, channels = input_shape
    rng = np.random.default_rng(seed)
    shape = (out_channels, *kernel, channels // groups)
    w = _weights(rng, dtype, shape, 0, per_channel, fan_in=math.prod(shape[1:]))
    b = _builder(dtype)
    x = _input(b, dtype, input_shape, input_zero_point)
    filter_index, bias_index = _constants(b, w, 0, bias)
    out_shape = (
        batch,
        *(
            _out_size(padding, n, k, s, d)
            for n, k, s, d in zip((height, width), kernel, stride, dilation, strict=True)
        ),
        out_channels,
    )
    out = b.tensor("output", out_shape, dtype, *w.output_quant)
    options = {
        "padding": padding,
        "stride_h": stride[0],
        "stride_w": stride[1],
        "dilation_h_factor": dilation[0],
        "dilation_w_factor": dilation[1],
        "fused_activation_function": activation,
    }
    b.op("CONV_2D", [x, filter_index, bias_index], [out], options, VERSIONS["CONV_2D"])
    b.output(out)
    return b.build()


def depthwise_model(
    dtype: str,
    per_channel: bool,
    input_shape: tuple[int, int, int, int],
    kernel: tuple[int, int],
    multiplier: int = 1,
    stride=(1, 1),
    dilation=(1, 1),
    padding: str = "SAME",
    activation: str = "NONE",
    bias: bool = True,
    seed: int = 0,
    input_zero_point: int = INPUT_ZERO_POINT,
) -> bytes:
    batch, height, width, channels = input_shape
    rng = np.random.default_rng(seed)
    shape = (1, *kernel, channels * multiplier)
    w = _weights(rng, dtype, shape, 3, per_channel, fan_in=math.prod(kernel))
    b = _builder(dtype)
    x = _input(b, dtype, input_shape, input_zero_point)
    filter_index, bias_index = _constants(b, w, 3, bias)
    out_shape = (
        batch,
        *(
            _out_size(padding, n, k, s, d)
            for n, k, s, d in zip((height, width), kernel, stride, dilation, strict=True)
        ),
        channels * multiplier,
    )
    out = b.tensor("output", out_shape, dtype, *w.output_quant)
    options = {
        "padding": padding,
        "stride_h": stride[0],
        "stride_w": stride[1],
        "dilation_h_factor": dilation[0],
        "dilation_w_factor": dilation[1],
        "depth_multiplier": multiplier,
        "fused_activation_function": activation,
    }
    inputs = [x, filter_index] + ([bias_index] if bias else [])
    b.op("DEPTHWISE_CONV_2D", inputs, [out], options, VERSIONS["DEPTHWISE_CONV_2D"])
    b.output(out)
    return b.build()


def transpose_conv_model(
    dtype: str,
    per_channel: bool,
    input_shape: tuple[int, int, int, int],
    out_channels: int,
    kernel: tuple[int, int],
    out_hw: tuple[int, int],
    stride=(1, 1),
    padding: str = "SAME",
    activation: str = "NONE",
    bias: bool = True,
    seed: int = 0,
    input_zero_point: int = INPUT_ZERO_POINT,
) -> bytes:
    batch, _, _, channels = input_shape
    rng = np.random.default_rng(seed)
    shape = (out_channels, *kernel, channels)
    # Each output pixel receives about kh * kw / (sh * sw) input pixels.
    fan_in = max(math.prod(kernel) / math.prod(stride), 1.0) * channels
    w = _weights(rng, dtype, shape, 0, per_channel, fan_in)
    b = ModelBuilder(dtype)
    out_shape = (batch, *out_hw, out_channels)
    shape_index = b.const("output_shape", np.asarray(out_shape, np.int32))
    filter_index, bias_index = _constants(b, w, 0, bias)
    x = _input(b, dtype, input_shape, input_zero_point)
    out = b.tensor("output", out_shape, dtype, *w.output_quant)
    options = {
        "padding": padding,
        "stride_h": stride[0],
        "stride_w": stride[1],
        "fused_activation_function": activation,
    }
    inputs = [shape_index, filter_index, x] + ([bias_index] if bias else [])
    b.op("TRANSPOSE_CONV", inputs, [out], options, VERSIONS["TRANSPOSE_CONV"])
    b.output(out)
    return b.build()


# -- CONV_2D -----------------------------------------------------------------------------------

CONV_GEOMETRIES = [
    # input shape, out channels, kernel, stride, dilation, padding
    ((1, 8, 8, 3), 4, (3, 3), (1, 1), (1, 1), "SAME"),
    ((1, 9, 7, 4), 5, (3, 2), (2, 2), (1, 1), "VALID"),
    ((2, 10, 10, 2), 3, (3, 3), (1, 1), (2, 2), "SAME"),
    ((1, 11, 9, 3), 4, (5, 3), (2, 3), (1, 2), "SAME"),
    ((1, 6, 6, 8), 6, (1, 1), (1, 1), (1, 1), "VALID"),
    ((1, 7, 7, 4), 3, (2, 2), (2, 2), (1, 1), "SAME"),
    ((1, 12, 5, 2), 2, (4, 1), (3, 1), (2, 1), "VALID"),
]


@pytest.mark.parametrize(("dtype", "per_channel"), CONV_QUANTIZATIONS, ids=CONV_QUANT_IDS)
@pytest.mark.parametrize(
    ("shape", "out_channels", "kernel", "stride", "dilation", "padding"), CONV_GEOMETRIES
)
def test_conv_2d_geometry(
    dtype, per_channel, shape, out_channels, kernel, stride, dilation, padding
):
    assert_matches_oracle(
        conv_model(dtype, per_channel, shape, out_channels, kernel, stride, dilation, padding)
    )


@pytest.mark.parametrize(("dtype", "per_channel"), CONV_QUANTIZATIONS, ids=CONV_QUANT_IDS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_conv_2d_activation(dtype, per_channel, activation):
    assert_matches_oracle(
        conv_model(
            dtype, per_channel, (1, 6, 6, 3), 4, (3, 3), (2, 2), activation=activation, seed=1
        )
    )


@pytest.mark.parametrize(("dtype", "per_channel"), CONV_QUANTIZATIONS, ids=CONV_QUANT_IDS)
@pytest.mark.parametrize(
    ("shape", "out_channels", "groups"), [((1, 6, 6, 4), 6, 2), ((1, 5, 5, 6), 3, 3)]
)
def test_conv_2d_grouped(dtype, per_channel, shape, out_channels, groups):
    """Input channels a multiple of the filter's: TFLite's reference kernel runs groups."""
    assert_matches_oracle(
        conv_model(
            dtype, per_channel, shape, out_channels, (3, 3), groups=groups, activation="RELU"
        )
    )


@pytest.mark.parametrize(("dtype", "per_channel"), CONV_QUANTIZATIONS, ids=CONV_QUANT_IDS)
def test_conv_2d_without_bias(dtype, per_channel):
    """LiteRT insists on a bias, so TFLite Micro is the oracle here; for uint8, which TFLite
    Micro does not run, the missing bias is refused as LiteRT refuses it."""
    model = conv_model(dtype, per_channel, (1, 7, 7, 3), 4, (3, 3), bias=False)
    if dtype == "uint8":
        assert "no kernel for uint8, uint8, - -> uint8" in _refusal(model)
        with pytest.raises(RuntimeError):
            LiteRTOracle(model)
    else:
        assert_matches_oracle(model)


@pytest.mark.parametrize("zero_point", [-128, 127])
def test_conv_2d_extreme_input_zero_point(zero_point):
    """SAME padding must read as the zero point (real 0), however far it is from int 0."""
    assert_matches_oracle(
        conv_model(
            "int8",
            True,
            (1, 6, 6, 3),
            4,
            (3, 3),
            (2, 2),
            (1, 1),
            "SAME",
            input_zero_point=zero_point,
        )
    )


def test_conv_2d_int8_output_spreads():
    output = oracle_outputs(conv_model("int8", True, (1, 8, 8, 3), 4, (3, 3)))[0]
    assert np.unique(output).size > 50
    assert output.min() > -128 or output.max() < 127


# -- DEPTHWISE_CONV_2D -------------------------------------------------------------------------

# The kernel sums over taps one way when channels outnumber taps and another otherwise.
DEPTHWISE_GEOMETRIES = [
    # input shape, kernel, depth multiplier, stride, dilation, padding
    ((1, 8, 8, 4), (3, 3), 1, (1, 1), (1, 1), "SAME"),
    ((1, 6, 6, 12), (3, 3), 1, (1, 1), (1, 1), "SAME"),
    ((2, 7, 5, 10), (3, 3), 2, (2, 1), (2, 1), "VALID"),
    ((1, 9, 9, 3), (3, 3), 2, (2, 2), (1, 1), "SAME"),
    ((2, 7, 8, 2), (3, 2), 3, (1, 2), (1, 1), "VALID"),
    ((1, 10, 10, 2), (3, 3), 1, (1, 1), (2, 3), "SAME"),
    ((1, 11, 6, 1), (5, 3), 4, (2, 1), (1, 1), "VALID"),
    ((1, 5, 5, 6), (1, 1), 1, (1, 1), (1, 1), "VALID"),
]


@pytest.mark.parametrize(("dtype", "per_channel"), CONV_QUANTIZATIONS, ids=CONV_QUANT_IDS)
@pytest.mark.parametrize(
    ("shape", "kernel", "multiplier", "stride", "dilation", "padding"), DEPTHWISE_GEOMETRIES
)
def test_depthwise_conv_2d_geometry(
    dtype, per_channel, shape, kernel, multiplier, stride, dilation, padding
):
    assert_matches_oracle(
        depthwise_model(dtype, per_channel, shape, kernel, multiplier, stride, dilation, padding)
    )


@pytest.mark.parametrize(("dtype", "per_channel"), CONV_QUANTIZATIONS, ids=CONV_QUANT_IDS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_depthwise_conv_2d_activation(dtype, per_channel, activation):
    assert_matches_oracle(
        depthwise_model(
            dtype, per_channel, (1, 7, 7, 5), (3, 2), 2, (2, 2), activation=activation, seed=1
        )
    )


@pytest.mark.parametrize(("dtype", "per_channel"), CONV_QUANTIZATIONS, ids=CONV_QUANT_IDS)
def test_depthwise_conv_2d_without_bias(dtype, per_channel):
    assert_matches_oracle(depthwise_model(dtype, per_channel, (1, 6, 6, 2), (3, 3), 2, bias=False))


def test_depthwise_conv_2d_bias_quantized_along_dimension_3():
    """person_detect's convention: per-channel biases say quantized_dimension 3, which LiteRT
    refuses for a 1-D tensor (TFLM is the oracle) and which no kernel reads."""
    rng = np.random.default_rng(2)
    w = _weights(rng, "int8", (1, 3, 3, 4), 3, True, fan_in=9)
    b = ModelBuilder("int8")
    x = _input(b, "int8", (1, 6, 6, 4), INPUT_ZERO_POINT)
    filter_index = b.const("filter", w.filter, list(w.filter_scales), 0, quantized_dimension=3)
    bias_index = b.const(
        "bias", w.bias, list(INPUT_SCALE * w.filter_scales), 0, quantized_dimension=3
    )
    out = b.tensor("output", (1, 6, 6, 4), "int8", *w.output_quant)
    b.op(
        "DEPTHWISE_CONV_2D",
        [x, filter_index, bias_index],
        [out],
        {
            "padding": "SAME",
            "stride_h": 1,
            "stride_w": 1,
            "depth_multiplier": 1,
            "fused_activation_function": "RELU6",
        },
        VERSIONS["DEPTHWISE_CONV_2D"],
    )
    b.output(out)
    assert_matches_oracle(b.build())


@pytest.mark.parametrize("zero_point", [-128, 127])
def test_depthwise_conv_2d_extreme_input_zero_point(zero_point):
    assert_matches_oracle(
        depthwise_model(
            "int8",
            True,
            (1, 6, 6, 12),
            (3, 3),
            1,
            (1, 1),
            (2, 2),
            "SAME",
            input_zero_point=zero_point,
        )
    )
    assert_matches_oracle(
        depthwise_model(
            "int8",
            True,
            (1, 6, 6, 2),
            (3, 3),
            2,
            (2, 2),
            (1, 1),
            "SAME",
            input_zero_point=zero_point,
        )
    )


def test_depthwise_conv_2d_int8_output_spreads():
    output = oracle_outputs(depthwise_model("int8", True, (1, 8, 8, 4), (3, 3), 2))[0]
    assert np.unique(output).size > 50
    assert output.min() > -128 or output.max() < 127


# -- TRANSPOSE_CONV ----------------------------------------------------------------------------

TRANSPOSE_GEOMETRIES = [
    # input shape, out channels, kernel, stride, padding, output (height, width)
    ((1, 4, 4, 3), 2, (3, 3), (2, 2), "SAME", (8, 8)),
    ((1, 4, 4, 3), 2, (3, 3), (2, 2), "SAME", (7, 7)),
    ((1, 3, 5, 2), 4, (3, 3), (2, 2), "VALID", (7, 11)),
    ((1, 3, 4, 2), 3, (2, 3), (2, 3), "VALID", (7, 12)),  # output past the scatter: bias only
    ((2, 5, 5, 4), 3, (3, 3), (1, 1), "SAME", (5, 5)),
    ((1, 4, 3, 2), 2, (4, 4), (3, 2), "SAME", (12, 6)),
    ((1, 6, 6, 3), 5, (1, 1), (1, 1), "VALID", (6, 6)),
]


@pytest.mark.parametrize(("dtype", "per_channel"), QUANTIZATIONS, ids=QUANT_IDS)
@pytest.mark.parametrize(
    ("shape", "out_channels", "kernel", "stride", "padding", "out_hw"), TRANSPOSE_GEOMETRIES
)
def test_transpose_conv_geometry(
    dtype, per_channel, shape, out_channels, kernel, stride, padding, out_hw
):
    assert_matches_oracle(
        transpose_conv_model(
            dtype, per_channel, shape, out_channels, kernel, out_hw, stride, padding
        )
    )


@pytest.mark.parametrize(("dtype", "per_channel"), QUANTIZATIONS, ids=QUANT_IDS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_transpose_conv_activation(dtype, per_channel, activation):
    assert_matches_oracle(
        transpose_conv_model(
            dtype,
            per_channel,
            (1, 4, 4, 3),
            3,
            (3, 3),
            (8, 8),
            (2, 2),
            activation=activation,
            seed=1,
        )
    )


@pytest.mark.parametrize(("dtype", "per_channel"), QUANTIZATIONS, ids=QUANT_IDS)
def test_transpose_conv_without_bias(dtype, per_channel):
    assert_matches_oracle(
        transpose_conv_model(
            dtype, per_channel, (1, 3, 3, 2), 2, (3, 3), (6, 6), (2, 2), bias=False
        )
    )


@pytest.mark.parametrize("zero_point", [-128, 127])
def test_transpose_conv_extreme_input_zero_point(zero_point):
    assert_matches_oracle(
        transpose_conv_model(
            "int8", True, (1, 4, 4, 3), 2, (3, 3), (7, 7), (2, 2), input_zero_point=zero_point
        )
    )


def test_transpose_conv_int8_output_spreads():
    output = oracle_outputs(
        transpose_conv_model("int8", True, (1, 4, 4, 3), 4, (3, 3), (8, 8), (2, 2))
    )[0]
    assert np.unique(output).size > 50
    assert output.min() > -128 or output.max() < 127


# -- refused variants --------------------------------------------------------------------------


def _refusal(model: bytes) -> str:
    with pytest.raises(UnsupportedOpError) as error:
        prepare_graph(parse_model(model, "<built model>").main)
    return error.value.message


def test_refuses_unsupported_fused_activation():
    model = conv_model("float32", False, (1, 5, 5, 2), 2, (3, 3), activation="TANH")
    assert "fused activation TANH" in _refusal(model)


def test_refuses_hybrid_transpose_conv():
    """Hybrid CONV_2D and DEPTHWISE_CONV_2D run (tests/ops/test_conv_hybrid.py); hybrid
    TRANSPOSE_CONV does not."""
    b = ModelBuilder("float32")
    shape = b.const("output_shape", np.array([1, 5, 5, 2], np.int32))
    filt = b.const("filter", np.ones((2, 3, 3, 2), np.int8), 0.1, 0)
    x = b.input("input", (1, 5, 5, 2), "float32")
    out = b.tensor("output", (1, 5, 5, 2), "float32")
    b.op("TRANSPOSE_CONV", [shape, filt, x], [out],
         {"padding": "SAME", "stride_h": 1, "stride_w": 1})
    b.output(out)
    assert "no kernel for int32, int8, float32 -> float32" in _refusal(b.build())


def test_refuses_filter_scales_along_another_axis():
    b = ModelBuilder("int8")
    x = b.input("input", (1, 5, 5, 3), "int8", INPUT_SCALE, INPUT_ZERO_POINT)
    filt = b.const("filter", np.ones((1, 3, 3, 3), np.int8), [0.01] * 3, 0, quantized_dimension=1)
    out = b.tensor("output", (1, 5, 5, 3), "int8", 0.1, 0)
    b.op("DEPTHWISE_CONV_2D", [x, filt], [out], {"padding": "SAME", "stride_h": 1, "stride_w": 1})
    b.output(out)
    assert "along dimension 1" in _refusal(b.build())


# -- requantization ----------------------------------------------------------------------------


def test_requantize_equals_tflite_fixed_point():
    """The kernels' fused requantization against fixedpoint's step-by-step TFLite primitives,
    on ties (multiplier 2^30), accumulators past int32 (C wrap-around) and left shifts."""
    rng = np.random.default_rng(0)
    shifts = np.arange(-20, 4)
    multipliers = np.concatenate(
        [[1 << 30, 3 << 29, (1 << 31) - 1], rng.integers(1 << 30, 1 << 31, shifts.size - 3)]
    )
    magnitudes = 128.0 * 2.0 ** np.maximum(-shifts, 0)
    acc = np.round(rng.uniform(-1, 1, (4000, shifts.size)) * magnitudes)
    acc[:100] += 2.0**32  # wraps to the same int32 values
    acc[100:110] = [
        [v] * shifts.size
        for v in (2**31 - 1, -(2**31), 2**31, 1, -1, 0, 3, -3, 2**40 + 5, -(2**40) - 5)
    ]
    stage = Requantize("int8", multipliers.astype(np.int64), shifts.astype(np.int64), -3,
                       (-128, 127))
    expected = multiply_by_quantized_multiplier(acc.astype(np.int64), multipliers, shifts)
    expected = np.clip(expected - 3, -128, 127)
    assert np.unique(expected).size > 200
    np.testing.assert_array_equal(requantize(acc, stage), expected)
