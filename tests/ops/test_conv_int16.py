"""16x8 CONV_2D, DEPTHWISE_CONV_2D and TRANSPOSE_CONV (int16 activations with zero point 0,
int8 filters, int64 or int32 bias) against TFLite's reference kernels, bit for bit, in
runtime_py and in the generated C.

TFLite sums in int64 and requantizes with its 64-bit MultiplyByQuantizedMultiplier (a 16-bit
multiplier, one rounding) unless a CONV_2D or TRANSPOSE_CONV's options say quantized_bias_type
INT32: then the sum is int32 and the requantization the int8 one. The output scale spreads the
outputs over about +-4 deviations of the accumulator, so they neither saturate nor collapse.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import toolchain.ops.conv.emit as conv_codegen
from runtime_py.kernels.conv import requantize_wide
from tests.opcheck import assert_matches_oracle, assert_varied, refusal
from tests.ops.test_conv_c import CONSTANT_FOR, assert_c_matches, c_text, overlapped_plan
from toolchain.front.builder import ModelBuilder
from toolchain.ops.conv.prepare import WideRequantize
from toolchain.ops.emit import LINE_LIMIT

INPUT_SCALE = 1 / 4096
# Root mean square of int16 values uniform over the whole range, and of int8 filter values
# uniform over [-127, 127].
INPUT_RMS, FILTER_RMS = 32768 / math.sqrt(3), 73.0
ACTIVATIONS = ("NONE", "RELU", "RELU6", "RELU_N1_TO_1")
# The activations clamping at a small real value, and that value.
CLAMP_BOUNDS = {"RELU6": 6.0, "RELU_N1_TO_1": 1.0}


def _out_size(padding: str, size: int, kernel: int, stride: int, dilation: int) -> int:
    effective = (kernel - 1) * dilation + 1
    return -(-size // stride) if padding == "SAME" else -(-(size - effective + 1) // stride)


def _options(padding: str, stride, activation: str, **more) -> dict:
    return {"padding": padding, "stride_h": stride[0], "stride_w": stride[1],
            "fused_activation_function": activation, **more}


def _filter_and_bias(b: ModelBuilder, rng: np.random.Generator, shape: tuple[int, ...],
                     axis: int, per_channel: bool, fan_in: float, bias: str | None,
                     activation: str) -> tuple[int, int, float]:
    """The filter and bias tensors (-1 without a bias) and an output scale for them."""
    channels = shape[axis]
    values = rng.integers(-127, 128, shape).astype(np.int8)
    scales = rng.uniform(0.002, 0.02, channels) if per_channel else np.array([0.01])
    accumulator_rms = math.sqrt(fan_in) * INPUT_RMS * FILTER_RMS
    real_rms = accumulator_rms * INPUT_SCALE * float(np.sqrt(np.mean(scales**2)))
    bound = CLAMP_BOUNDS.get(activation)
    if bound is not None:  # real values of about half the clamp's bound: most land inside
        scales *= bound / 2 / real_rms
        real_rms = bound / 2
    filter_index = b.const("filter", values, list(scales) if per_channel else float(scales[0]),
                           0, quantized_dimension=axis)
    bias_index = -1
    if bias is not None:
        reach = int(0.5 * accumulator_rms)
        bias_values = rng.integers(-reach, reach + 1, channels).astype(bias)
        bias_index = b.const("bias", bias_values, list(INPUT_SCALE * scales), 0)
    return filter_index, bias_index, 8.0 * real_rms / 65536


def conv_model(input_shape: tuple[int, ...], out_channels: int, kernel=(3, 3), stride=(1, 1),
               dilation=(1, 1), padding: str = "SAME", activation: str = "NONE",
               per_channel: bool = True, groups: int = 1, bias: str | None = "int64",
               bias_type: str | None = None, seed: int = 0) -> bytes:
    batch, height, width, channels = input_shape
    rng = np.random.default_rng(seed)
    b = ModelBuilder("float32")
    x = b.input("x", input_shape, "int16", INPUT_SCALE, 0)
    shape = (out_channels, *kernel, channels // groups)
    filt, bias_index, out_scale = _filter_and_bias(b, rng, shape, 0, per_channel,
                                                   math.prod(shape[1:]), bias, activation)
    out_shape = (batch, *(_out_size(padding, n, k, s, d) for n, k, s, d in
                          zip((height, width), kernel, stride, dilation,
                              strict=True)), out_channels)
    y = b.tensor("y", out_shape, "int16", out_scale, 0)
    more = {"dilation_h_factor": dilation[0], "dilation_w_factor": dilation[1]}
    if bias_type is not None:
        more["quantized_bias_type"] = bias_type
    b.op("CONV_2D", [x, filt, bias_index], [y], _options(padding, stride, activation, **more),
         version=7)
    b.output(y)
    return b.build()


def depthwise_model(input_shape: tuple[int, ...], kernel=(3, 3), multiplier: int = 1,
                    stride=(1, 1), dilation=(1, 1), padding: str = "SAME",
                    activation: str = "NONE", per_channel: bool = True, bias: str | None = "int64",
                    seed: int = 0) -> bytes:
    batch, height, width, channels = input_shape
    rng = np.random.default_rng(seed)
    b = ModelBuilder("float32")
    x = b.input("x", input_shape, "int16", INPUT_SCALE, 0)
    shape = (1, *kernel, channels * multiplier)
    filt, bias_index, out_scale = _filter_and_bias(b, rng, shape, 3, per_channel,
                                                   math.prod(kernel), bias, activation)
    out_shape = (batch, *(_out_size(padding, n, k, s, d) for n, k, s, d in
                          zip((height, width), kernel, stride, dilation, strict=True)), shape[3])
    y = b.tensor("y", out_shape, "int16", out_scale, 0)
    options = _options(padding, stride, activation, depth_multiplier=multiplier,
                       dilation_h_factor=dilation[0], dilation_w_factor=dilation[1])
    inputs = [x, filt] + ([bias_index] if bias is not None else [])
    b.op("DEPTHWISE_CONV_2D", inputs, [y], options, version=5)
    b.output(y)
    return b.build()


def transpose_conv_model(input_shape: tuple[int, ...], out_channels: int, out_hw, kernel=(3, 3),
                         stride=(2, 2), padding: str = "SAME", activation: str = "NONE",
                         per_channel: bool = True, bias: str | None = "int64",
                         bias_type: str | None = None, seed: int = 0,
                         shape_input: bool = False) -> bytes:
    """`shape_input`: the output shape is the model's first input, as some converters write it."""
    batch, _, _, channels = input_shape
    rng = np.random.default_rng(seed)
    b = ModelBuilder("float32")
    out_shape = (batch, *out_hw, out_channels)
    shape_index = (b.input("output_shape", (4,), "int32") if shape_input
                   else b.const("output_shape", np.asarray(out_shape, np.int32)))
    shape = (out_channels, *kernel, channels)
    fan_in = max(math.prod(kernel) / math.prod(stride), 1.0) * channels
    filt, bias_index, out_scale = _filter_and_bias(b, rng, shape, 0, per_channel, fan_in, bias,
                                                   activation)
    x = b.input("x", input_shape, "int16", INPUT_SCALE, 0)
    y = b.tensor("y", out_shape, "int16", out_scale, 0)
    more = {} if bias_type is None else {"quantized_bias_type": bias_type}
    inputs = [shape_index, filt, x] + ([bias_index] if bias is not None else [])
    b.op("TRANSPOSE_CONV", inputs, [y], _options(padding, stride, activation, **more),
         version=4)
    b.output(y)
    return b.build()


def assert_exact_and_varied(model: bytes) -> None:
    assert_matches_oracle(model)
    assert_varied(model, min_distinct=20)


# -- CONV_2D -----------------------------------------------------------------------------------

CONV_GEOMETRIES = [
    # input shape, out channels, kernel, stride, dilation, padding
    ((1, 7, 8, 3), 4, (3, 3), (1, 1), (1, 1), "SAME"),
    ((2, 9, 7, 4), 5, (3, 2), (2, 2), (1, 1), "VALID"),
    ((1, 10, 9, 2), 3, (3, 3), (1, 2), (2, 2), "SAME"),
    ((1, 6, 6, 8), 6, (1, 1), (1, 1), (1, 1), "VALID"),
    ((1, 11, 5, 16), 8, (5, 3), (2, 1), (1, 2), "SAME"),
]


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("shape, out_channels, kernel, stride, dilation, padding",
                         CONV_GEOMETRIES)
def test_conv_2d(shape, out_channels, kernel, stride, dilation, padding, per_channel):
    assert_exact_and_varied(conv_model(shape, out_channels, kernel, stride, dilation, padding,
                                       per_channel=per_channel))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_conv_2d_activation(activation):
    assert_exact_and_varied(conv_model((1, 6, 6, 3), 4, stride=(2, 2), activation=activation,
                                       seed=1))


def test_conv_2d_grouped():
    assert_exact_and_varied(conv_model((1, 6, 6, 4), 6, groups=2, activation="RELU"))


@pytest.mark.parametrize("bias_type", [None, "INT64"])
def test_conv_2d_int64_bias(bias_type):
    assert_exact_and_varied(conv_model((1, 5, 6, 3), 4, bias_type=bias_type, seed=2))


@pytest.mark.parametrize("shape, out_channels, kernel, stride",
                         [((1, 7, 8, 3), 4, (3, 3), (1, 1)), ((2, 6, 5, 8), 5, (1, 1), (2, 1)),
                          ((1, 9, 9, 24), 3, (3, 3), (2, 2))])
def test_conv_2d_int32_bias(shape, out_channels, kernel, stride):
    """quantized_bias_type INT32: an int32 accumulator and the int8 requantization."""
    assert_exact_and_varied(conv_model(shape, out_channels, kernel, stride, bias="int32",
                                       bias_type="INT32", seed=3))


def test_conv_2d_refuses_int32_bias_without_the_option():
    model = conv_model((1, 5, 5, 2), 2, bias="int32")
    assert "int32 bias without quantized_bias_type INT32" in refusal(model)


def test_conv_2d_refuses_a_bias_of_another_type_than_the_option():
    assert "int64 bias with quantized_bias_type INT32" in refusal(
        conv_model((1, 5, 5, 2), 2, bias_type="INT32"))


def test_conv_2d_refuses_a_missing_bias():
    assert "no kernel for int16, int8, - -> int16" in refusal(
        conv_model((1, 5, 5, 2), 2, bias=None))


def test_conv_2d_refuses_a_bias_beyond_the_requantization():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4, 4, 2), "int16", INPUT_SCALE, 0)
    filt = b.const("filter", np.ones((2, 3, 3, 2), np.int8), 0.01, 0)
    bias = b.const("bias", np.array([2**47, 0], np.int64), INPUT_SCALE * 0.01, 0)
    y = b.tensor("y", (1, 4, 4, 2), "int16", 0.01, 0)
    b.op("CONV_2D", [x, filt, bias], [y], _options("SAME", (1, 1), "NONE"))
    b.output(y)
    assert "+-2^47" in refusal(b.build())


def test_conv_2d_refuses_a_nonzero_input_zero_point():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4, 4, 2), "int16", INPUT_SCALE, 3)
    filt = b.const("filter", np.ones((2, 3, 3, 2), np.int8), 0.01, 0)
    bias = b.const("bias", np.zeros(2, np.int64), INPUT_SCALE * 0.01, 0)
    y = b.tensor("y", (1, 4, 4, 2), "int16", 0.01, 0)
    b.op("CONV_2D", [x, filt, bias], [y], _options("SAME", (1, 1), "NONE"))
    b.output(y)
    assert "needs zero point 0" in refusal(b.build())


def test_refuses_an_unknown_quantized_bias_type():
    assert "quantized_bias_type INT8 (TFLite takes INT32 or INT64)" in refusal(
        conv_model((1, 5, 5, 2), 2, bias_type="INT8"))


def test_refuses_a_filter_zero_point():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4, 4, 2), "int16", INPUT_SCALE, 0)
    filt = b.const("filter", np.ones((2, 3, 3, 2), np.int8), 0.01, 1)
    bias = b.const("bias", np.zeros(2, np.int64), INPUT_SCALE * 0.01, 0)
    y = b.tensor("y", (1, 4, 4, 2), "int16", 0.01, 0)
    b.op("CONV_2D", [x, filt, bias], [y], _options("SAME", (1, 1), "NONE"))
    b.output(y)
    assert "int8 filter with a non-zero zero point" in refusal(b.build())


# -- DEPTHWISE_CONV_2D -------------------------------------------------------------------------

DEPTHWISE_GEOMETRIES = [
    # input shape, kernel, depth multiplier, stride, dilation, padding
    ((1, 8, 8, 4), (3, 3), 1, (1, 1), (1, 1), "SAME"),
    ((2, 7, 5, 10), (3, 3), 2, (2, 1), (2, 1), "VALID"),
    ((1, 9, 9, 3), (3, 3), 3, (2, 2), (1, 1), "SAME"),
    ((1, 6, 7, 20), (5, 5), 1, (1, 1), (1, 1), "SAME"),
    ((1, 5, 5, 6), (1, 1), 1, (1, 1), (1, 1), "VALID"),
]


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("shape, kernel, multiplier, stride, dilation, padding",
                         DEPTHWISE_GEOMETRIES)
def test_depthwise_conv_2d(shape, kernel, multiplier, stride, dilation, padding, per_channel):
    assert_exact_and_varied(depthwise_model(shape, kernel, multiplier, stride, dilation, padding,
                                            per_channel=per_channel))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_depthwise_conv_2d_activation(activation):
    assert_exact_and_varied(depthwise_model((1, 7, 7, 5), (3, 2), 2, (2, 2),
                                            activation=activation, seed=1))


def test_depthwise_conv_2d_without_bias():
    assert_exact_and_varied(depthwise_model((1, 6, 6, 2), multiplier=2, bias=None))


def test_depthwise_conv_2d_refuses_an_int32_bias():
    assert "no kernel for int16, int8, int32 -> int16" in refusal(
        depthwise_model((1, 5, 5, 2), bias="int32"))


# -- TRANSPOSE_CONV ----------------------------------------------------------------------------

TRANSPOSE_GEOMETRIES = [
    # input shape, out channels, kernel, stride, padding, output (height, width)
    ((1, 4, 4, 3), 2, (3, 3), (2, 2), "SAME", (8, 8)),
    ((1, 3, 5, 2), 4, (3, 3), (2, 2), "VALID", (7, 11)),
    ((2, 5, 5, 4), 3, (3, 3), (1, 1), "SAME", (5, 5)),
    ((1, 4, 3, 2), 2, (4, 4), (3, 2), "SAME", (12, 6)),
]


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("shape, out_channels, kernel, stride, padding, out_hw",
                         TRANSPOSE_GEOMETRIES)
def test_transpose_conv(shape, out_channels, kernel, stride, padding, out_hw, per_channel):
    assert_exact_and_varied(transpose_conv_model(shape, out_channels, out_hw, kernel, stride,
                                                 padding, per_channel=per_channel))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_transpose_conv_activation(activation):
    assert_exact_and_varied(transpose_conv_model((1, 4, 4, 3), 3, (8, 8), activation=activation,
                                                 seed=1))


def test_transpose_conv_without_bias():
    assert_exact_and_varied(transpose_conv_model((1, 3, 3, 2), 2, (6, 6), bias=None))


def test_transpose_conv_int32_bias():
    assert_exact_and_varied(transpose_conv_model((1, 4, 4, 6), 3, (8, 8), bias="int32",
                                                 bias_type="INT32", seed=2))


def test_transpose_conv_refuses_int32_bias_without_the_option():
    model = transpose_conv_model((1, 3, 3, 2), 2, (6, 6), bias="int32")
    assert "int32 bias without quantized_bias_type INT32" in refusal(model)


def test_refuses_a_requantization_shifting_left_too_far():
    """TFLite's 64-bit requantization asserts a left shift below 8 (a real multiplier < 128)."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4, 4, 2), "int16", INPUT_SCALE, 0)
    filt = b.const("filter", np.ones((1, 3, 3, 2), np.int8), 0.5, 0, quantized_dimension=3)
    y = b.tensor("y", (1, 4, 4, 2), "int16", INPUT_SCALE * 0.5 / 300, 0)
    b.op("DEPTHWISE_CONV_2D", [x, filt], [y], _options("SAME", (1, 1), "NONE"))
    b.output(y)
    assert "shifts left by at most 7" in refusal(b.build())


# -- the generated C beyond the oracle runs above -----------------------------------------------

C_CASES = [
    conv_model((1, 6, 7, 16), 22, (1, 1)),  # 1x1: blocks of 4 output channels and 2 single ones
    conv_model((1, 5, 5, 64), 3, (3, 3)),  # depth 576: int64 sums, no column
    conv_model((1, 5, 5, 64), 3, (3, 3), bias="int32", bias_type="INT32"),  # wrapping int32 sums
    conv_model((1, 6, 6, 8), 4, (3, 3), dilation=(2, 3), groups=2, per_channel=False),
    depthwise_model((2, 7, 9, 4), (3, 3)),  # interior windows unrolled, the rest tap by tap
    depthwise_model((1, 6, 6, 3), (7, 7), bias=None),  # 49 taps: nothing unrolled
    depthwise_model((1, 8, 7, 1), (3, 3), 8, (2, 2), activation="RELU6"),
    transpose_conv_model((1, 4, 3, 5), 20, (8, 6)),
    transpose_conv_model((2, 3, 4, 2), 3, (7, 12), (2, 3), (2, 3), "VALID", bias=None),
]


@pytest.mark.parametrize("index", range(len(C_CASES)))
def test_c_sanitized(index):
    """Built with ASan and UBSan: no overflow in the int64 sums or the requantization."""
    assert_c_matches(C_CASES[index])


@pytest.fixture
def tiny_stack(monkeypatch):
    """A stack budget so small that every kernel takes its fallback path, in channel blocks."""
    monkeypatch.setattr(conv_codegen, "MAX_STACK_BYTES", 48)


def test_c_fallbacks(tiny_stack):
    model = conv_model((1, 7, 6, 6), 24, (3, 3), (1, 2), (1, 2), groups=2)
    assert "too large" in c_text(model)
    assert_c_matches(model)
    model = depthwise_model((1, 6, 5, 36), (3, 3), 1, (2, 1))
    assert "c0 += 6" in c_text(model)  # 6 int64 accumulators in 48 bytes
    assert_c_matches(model)
    assert_c_matches(transpose_conv_model((1, 3, 3, 4), 24, (6, 6)))


@pytest.mark.parametrize("model", [conv_model((2, 9, 8, 4), 6, activation="RELU"),
                                   depthwise_model((1, 9, 10, 4), (3, 3))],
                         ids=["conv", "depthwise"])
def test_c_output_over_input(model):
    """The order contract holds for int16 too: the output may start below the input."""
    assert_c_matches(model, mp=overlapped_plan(model))


def test_c_text_reads_like_hand_written_c():
    for model in [*C_CASES, conv_model((1, 7, 8, 3), 4, per_channel=False)]:
        text = c_text(model)
        long = [line for line in text.splitlines() if len(line) > LINE_LIMIT]
        assert not long, long[0]
        for var, start, stop, step in CONSTANT_FOR.findall(text):
            assert -(-(int(stop) - int(start)) // int(step or 1)) > 1, var


def test_per_tensor_constants_are_written_in_place():
    text = c_text(conv_model((1, 5, 5, 3), 4, per_channel=False))
    assert "_mult[" not in text and "_shift[" not in text
    assert "int32_t q = (int32_t)((acc[o] * " in text


def _tflite_wide_multiply(x: int, multiplier: int, exponent: int) -> int:
    """TFLite's 64-bit MultiplyByQuantizedMultiplier, transcribed for one value."""
    reduced = (multiplier + (1 << 15)) >> 16 if multiplier < 0x7FFF0000 else 0x7FFF
    total = 15 - exponent
    result = (x * reduced + (1 << (total - 1))) >> total
    return (result + 2**31) % 2**32 - 2**31


def test_requantize_wide_equals_tflite():
    """Multipliers at and past 0x7FFF0000, ties, every exponent from -31 to 7 and accumulators
    up to +-2^47, against the step-by-step transcription."""
    rng = np.random.default_rng(0)
    exponents = np.arange(-31, 8)
    multipliers = rng.integers(1 << 30, 1 << 31, exponents.size)
    multipliers[::4] = 0x7FFF0000
    multipliers[1::5] = (1 << 31) - 1
    multipliers[2::6] = 1 << 30
    stage = WideRequantize(np.array([(m + (1 << 15)) >> 16 if m < 0x7FFF0000 else 0x7FFF
                                     for m in multipliers], np.int64),
                           (15 - exponents).astype(np.int64), (-32768, 32767))
    # about 2^16 output steps at every exponent; the first rows also wrap the int32 cast
    magnitudes = np.minimum(2.0 ** (16 - exponents), 2.0**47 - 1)
    acc = np.round(rng.uniform(-1, 1, (500, exponents.size)) * magnitudes).astype(np.int64)
    acc[:6] = [[v] * exponents.size for v in (0, 1, -1, 2**47 - 1, -(2**47), 12345678901)]
    expected = np.array([[_tflite_wide_multiply(int(a), int(m), int(e))
                          for a, m, e in zip(row, multipliers, exponents,
                                             strict=True)] for row in acc])
    expected = np.clip(expected, -32768, 32767)
    assert np.unique(expected).size > 1000
    np.testing.assert_array_equal(requantize_wide(acc.astype(np.float64), stage), expected)



def test_transpose_conv_output_shape_given_at_run_time(tmp_path, capsys):
    """The output shape as a model input (TFLite's converter writes some so): planned as
    declared, checked with that value, and any other value refused with one line."""
    from toolchain.cli import main

    model = transpose_conv_model((1, 1, 5, 8), 4, (3, 12), kernel=(3, 4), stride=(1, 2),
                                 padding="VALID", shape_input=True)
    assert_exact_and_varied(model)
    path = tmp_path / "m.tflite"
    path.write_bytes(model)
    np.save(tmp_path / "x.npy", np.zeros((1, 1, 5, 8), np.int16))
    for shape, status in [((1, 3, 12, 4), 0), ((1, 3, 12, 5), 2)]:
        np.save(tmp_path / "shape.npy", np.asarray(shape, np.int32))
        args = ["run", str(path), "--input", str(tmp_path / "shape.npy"), "--input",
                str(tmp_path / "x.npy"), "--output-dir", str(tmp_path / "out")]
        assert main(args) == status
    err = capsys.readouterr().err.strip()
    assert err == (f"arenac: {path}: input 0 ('output_shape') is an output shape, "
                   "[1, 3, 12, 4] when planned, got [1, 3, 12, 5]")
