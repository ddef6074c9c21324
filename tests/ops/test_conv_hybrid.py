"""Hybrid (dynamic-range) CONV_2D and DEPTHWISE_CONV_2D: float32 input and output, int8
constant filter, float32 bias, against TFLite's reference kernels bit for bit, in runtime_py and
in the generated C.

TFLite quantizes each batch image to int8 at every invoke: CONV_2D with one filter scale (or
equal ones) symmetrically, then scales its int32 sums by image scale * filter scale; CONV_2D
with per-channel scales and DEPTHWISE_CONV_2D asymmetrically, with a zero point.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

import toolchain.ops.conv.emit as conv_codegen
from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import assert_varied, refusal
from tests.ops.test_conv_c import CONSTANT_FOR, c_text
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import random_inputs
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.lifetimes import TENSOR
from toolchain.lower.plan import ModelPlan, plan_model
from toolchain.ops.emit import LINE_LIMIT

ACTIVATIONS = ("NONE", "RELU", "RELU6", "RELU_N1_TO_1")


def _out_size(padding: str, size: int, kernel: int, stride: int, dilation: int) -> int:
    effective = (kernel - 1) * dilation + 1
    return -(-size // stride) if padding == "SAME" else -(-(size - effective + 1) // stride)


def _filter(b: ModelBuilder, rng: np.random.Generator, shape: tuple[int, ...], axis: int,
            per_channel: bool, fan_in: int, equal_scales: bool = False) -> int:
    """An int8 filter whose real values have about 1 / sqrt(fan_in) deviation: the outputs then
    keep the input's scale, so the clamps of RELU6 and RELU_N1_TO_1 cut only some."""
    values = rng.integers(-127, 128, shape).astype(np.int8)
    scale = 1.7 / 127 / math.sqrt(fan_in)
    if not per_channel:
        return b.const("filter", values, scale, 0)
    scales = rng.uniform(0.5, 1.5, shape[axis]) * scale
    if equal_scales:
        scales[:] = scale
    return b.const("filter", values, list(scales), 0, quantized_dimension=axis)


def conv_model(input_shape: tuple[int, ...], out_channels: int, kernel=(3, 3), stride=(1, 1),
               dilation=(1, 1), padding: str = "SAME", activation: str = "NONE",
               per_channel: bool = False, groups: int = 1, equal_scales: bool = False,
               seed: int = 0) -> bytes:
    batch, height, width, channels = input_shape
    rng = np.random.default_rng(seed)
    b = ModelBuilder("float32")
    x = b.input("x", input_shape, "float32")
    shape = (out_channels, *kernel, channels // groups)
    filt = _filter(b, rng, shape, 0, per_channel, math.prod(shape[1:]), equal_scales)
    bias = b.const("bias", rng.normal(0, 0.5, out_channels).astype(np.float32))
    out_shape = (batch, *(_out_size(padding, n, k, s, d) for n, k, s, d in
                          zip((height, width), kernel, stride, dilation,
                              strict=True)), out_channels)
    y = b.tensor("y", out_shape, "float32")
    b.op("CONV_2D", [x, filt, bias], [y],
         {"padding": padding, "stride_h": stride[0], "stride_w": stride[1],
          "dilation_h_factor": dilation[0], "dilation_w_factor": dilation[1],
          "fused_activation_function": activation})
    b.output(y)
    return b.build()


def depthwise_model(input_shape: tuple[int, ...], kernel=(3, 3), multiplier: int = 1,
                    stride=(1, 1), dilation=(1, 1), padding: str = "SAME",
                    activation: str = "NONE", bias: bool = True, seed: int = 0) -> bytes:
    batch, height, width, channels = input_shape
    rng = np.random.default_rng(seed)
    b = ModelBuilder("float32")
    x = b.input("x", input_shape, "float32")
    shape = (1, *kernel, channels * multiplier)
    filt = _filter(b, rng, shape, 3, True, math.prod(kernel))
    inputs = [x, filt]
    if bias:
        inputs.append(b.const("bias", rng.normal(0, 0.5, shape[3]).astype(np.float32)))
    out_shape = (batch, *(_out_size(padding, n, k, s, d) for n, k, s, d in
                          zip((height, width), kernel, stride, dilation, strict=True)), shape[3])
    y = b.tensor("y", out_shape, "float32")
    b.op("DEPTHWISE_CONV_2D", inputs, [y],
         {"padding": padding, "stride_h": stride[0], "stride_w": stride[1],
          "dilation_h_factor": dilation[0], "dilation_w_factor": dilation[1],
          "depth_multiplier": multiplier, "fused_activation_function": activation})
    b.output(y)
    return b.build()


def assert_bit_exact(model: bytes, mp: ModelPlan | None = None,
                     inputs: list[list[np.ndarray]] | None = None, sanitize: bool = False) -> None:
    """runtime_py and the C against LiteRT with every float32 output bit equal, on three random
    input sets unless `inputs` are given."""
    if mp is None:
        mp = plan_model(parse_model(model, "<built model>"), "greedy")
    if inputs is None:
        inputs = [random_inputs(mp.graph, seed) for seed in range(3)]
    oracle = LiteRTOracle(model)
    with CBackend(mp, sanitize=sanitize) as c:
        c_outputs = c.invoke_many(inputs)
    for values, from_c in zip(inputs, c_outputs, strict=True):
        want = oracle.invoke(values)[0]
        for got in (ArenaInterpreter(mp).invoke(values)[0], from_c[0]):
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def assert_exact_and_varied(model: bytes) -> None:
    assert_bit_exact(model)
    assert_varied(model, min_distinct=20)


# -- CONV_2D -----------------------------------------------------------------------------------

CONV_GEOMETRIES = [
    # input shape, out channels, kernel, stride, dilation, padding
    ((1, 7, 8, 3), 4, (3, 3), (1, 1), (1, 1), "SAME"),  # 168 values: whole 8-blocks
    ((2, 9, 7, 4), 5, (3, 2), (2, 2), (1, 1), "VALID"),  # 252: a rounding tail of 4
    ((1, 10, 9, 2), 3, (3, 3), (1, 2), (2, 2), "SAME"),
    ((1, 6, 5, 7), 6, (1, 1), (1, 1), (1, 1), "VALID"),  # 1x1: TFLite needs no im2col
    ((1, 11, 5, 16), 8, (5, 3), (2, 1), (1, 2), "SAME"),
]


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
@pytest.mark.parametrize("shape, out_channels, kernel, stride, dilation, padding",
                         CONV_GEOMETRIES)
def test_conv_2d(shape, out_channels, kernel, stride, dilation, padding, per_channel):
    assert_exact_and_varied(conv_model(shape, out_channels, kernel, stride, dilation, padding,
                                       per_channel=per_channel))


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_conv_2d_activation(activation, per_channel):
    assert_exact_and_varied(conv_model((1, 6, 6, 3), 4, stride=(1, 2), activation=activation,
                                       per_channel=per_channel, seed=1))


def test_conv_2d_equal_scales_run_per_tensor():
    """A per-channel array of equal scales takes TFLite's per-tensor (symmetric) path."""
    assert_exact_and_varied(conv_model((1, 6, 7, 3), 4, per_channel=True, equal_scales=True))


def test_conv_2d_grouped_per_channel():
    assert_exact_and_varied(conv_model((1, 6, 6, 4), 6, groups=2, per_channel=True,
                                       activation="RELU"))


def test_conv_2d_refuses_grouped_per_tensor():
    model = conv_model((1, 6, 6, 4), 6, groups=2)
    assert "grouped hybrid CONV_2D with one filter scale" in refusal(model)


def test_conv_2d_refuses_a_missing_bias():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 5, 5, 2), "float32")
    filt = b.const("filter", np.ones((2, 3, 3, 2), np.int8), 0.1, 0)
    y = b.tensor("y", (1, 5, 5, 2), "float32")
    b.op("CONV_2D", [x, filt, -1], [y], {"padding": "SAME", "stride_h": 1, "stride_w": 1})
    b.output(y)
    assert "no kernel for float32, int8, - -> float32" in refusal(b.build())


def _minus_128_model(scales) -> bytes:
    b = ModelBuilder("float32")
    x = b.input("x", (1, 5, 5, 2), "float32")
    values = np.ones((2, 3, 3, 2), np.int8)
    values[1, 1, 1, 0] = -128
    filt = b.const("filter", values, scales, 0, quantized_dimension=0)
    bias = b.const("bias", np.zeros(2, np.float32))
    y = b.tensor("y", (1, 5, 5, 2), "float32")
    b.op("CONV_2D", [x, filt, bias], [y], {"padding": "SAME", "stride_h": 1, "stride_w": 1})
    b.output(y)
    return b.build()


def test_conv_2d_refuses_minus_128_with_one_scale():
    assert "-128" in refusal(_minus_128_model(0.01))


def test_conv_2d_takes_minus_128_per_channel():
    """TFLite's per-channel path is a plain loop, exact for -128 too."""
    assert_bit_exact(_minus_128_model([0.01, 0.02]))


def _hybrid_conv_with_filter(values: np.ndarray, *quantization, **options) -> bytes:
    b = ModelBuilder("float32")
    x = b.input("x", (1, 5, 5, values.shape[3]), "float32")
    filt = b.const("filter", values, *quantization, **options)
    bias = b.const("bias", np.zeros(values.shape[0], np.float32))
    y = b.tensor("y", (1, 5, 5, values.shape[0]), "float32")
    b.op("CONV_2D", [x, filt, bias], [y], {"padding": "SAME", "stride_h": 1, "stride_w": 1})
    b.output(y)
    return b.build()


def test_conv_2d_refuses_a_filter_without_scales():
    model = _hybrid_conv_with_filter(np.ones((2, 3, 3, 2), np.int8))
    assert "without positive quantization scales" in refusal(model)


def test_conv_2d_refuses_per_channel_scales_along_another_axis():
    model = _hybrid_conv_with_filter(np.ones((2, 3, 3, 3), np.int8), [0.01, 0.02, 0.03], 0,
                                     quantized_dimension=3)
    assert "hybrid filter with 3 scales along dimension 3; expected 2 along 0" in refusal(model)


# -- DEPTHWISE_CONV_2D -------------------------------------------------------------------------

DEPTHWISE_GEOMETRIES = [
    # input shape, kernel, depth multiplier, stride, dilation, padding
    ((1, 8, 8, 4), (3, 3), 1, (1, 1), (1, 1), "SAME"),
    ((2, 7, 5, 10), (3, 3), 2, (2, 1), (2, 1), "VALID"),
    ((1, 9, 9, 3), (3, 3), 3, (2, 2), (1, 1), "SAME"),
    ((1, 6, 7, 20), (5, 5), 1, (1, 1), (1, 1), "SAME"),
    ((1, 5, 5, 6), (1, 1), 1, (1, 1), (1, 1), "VALID"),
]


@pytest.mark.parametrize("shape, kernel, multiplier, stride, dilation, padding",
                         DEPTHWISE_GEOMETRIES)
def test_depthwise_conv_2d(shape, kernel, multiplier, stride, dilation, padding):
    assert_exact_and_varied(depthwise_model(shape, kernel, multiplier, stride, dilation,
                                            padding))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_depthwise_conv_2d_activation(activation):
    assert_exact_and_varied(depthwise_model((1, 7, 7, 5), (3, 2), 2, (2, 2),
                                            activation=activation, seed=1))


def test_depthwise_conv_2d_without_bias():
    assert_exact_and_varied(depthwise_model((1, 6, 6, 2), multiplier=2, bias=False))


def test_depthwise_conv_2d_refuses_one_scale():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 5, 5, 2), "float32")
    filt = b.const("filter", np.ones((1, 3, 3, 2), np.int8), 0.1, 0)
    y = b.tensor("y", (1, 5, 5, 2), "float32")
    b.op("DEPTHWISE_CONV_2D", [x, filt], [y], {"padding": "SAME", "stride_h": 1, "stride_w": 1,
                                               "depth_multiplier": 1})
    b.output(y)
    assert "hybrid filter with 1 scales" in refusal(b.build())


# -- inputs that meet the quantizer's edges ----------------------------------------------------


def _edge_images(shape: tuple[int, ...]) -> np.ndarray:
    """Batch images that take every path of TFLite's x86 quantizer: all zero (scale 1), all
    positive (the asymmetric zero point -128), and values a float step below a rounding tie
    (0.49999997 rounds up in the 8-wide blocks, down in the tail), the largest 127 so that the
    symmetric scale is 1."""
    rng = np.random.default_rng(5)
    images = np.zeros(shape, np.float32)
    images[1] = rng.uniform(0.1, 3.0, shape[1:])
    near = np.array([0.49999997, -0.49999997, 0.5, -0.5, 1.5, -2.5, 0.25, 3.0], np.float32)
    ties = rng.choice(near, shape[1:])
    ties.reshape(-1)[0] = 127.0
    images[2] = ties
    return images


@pytest.mark.parametrize("model", [
    conv_model((3, 5, 5, 3), 4),  # 75 values: a rounding tail of 3
    conv_model((3, 5, 5, 3), 4, per_channel=True),
    depthwise_model((3, 6, 5, 3), multiplier=2),
], ids=["conv-per-tensor", "conv-per-channel", "depthwise"])
def test_quantizer_edges(model):
    images = _edge_images((3, *parse_model(model, "<m>").main.tensors[0].shape[1:]))
    assert_bit_exact(model, inputs=[[images]])


# -- the generated C beyond the oracle runs above -----------------------------------------------

C_CASES = [
    conv_model((2, 6, 7, 16), 22, (1, 1)),  # 1x1: blocks of 4 output channels and 2 single ones
    conv_model((1, 8, 9, 6), 4, (3, 2), dilation=(2, 3), per_channel=True,
               activation="RELU6"),
    conv_model((1, 6, 6, 8), 6, groups=2, per_channel=True),
    depthwise_model((2, 7, 9, 4), (3, 3)),  # interior windows unrolled, the rest tap by tap
    depthwise_model((1, 6, 6, 3), (7, 7), bias=False),  # 49 taps: nothing unrolled
    depthwise_model((1, 8, 7, 1), (3, 3), 8, (2, 2)),
]


@pytest.mark.parametrize("index", range(len(C_CASES)))
def test_c_sanitized(index):
    assert_bit_exact(C_CASES[index], sanitize=True)


@pytest.fixture
def tiny_stack(monkeypatch):
    """A stack budget so small that every kernel takes its fallback path, in channel blocks."""
    monkeypatch.setattr(conv_codegen, "MAX_STACK_BYTES", 48)


def test_c_fallbacks(tiny_stack):
    for per_channel in (False, True):
        model = conv_model((1, 7, 6, 6), 24, (3, 3), (1, 2), (1, 2), per_channel=per_channel)
        assert "too large" in c_text(model)
        assert_bit_exact(model)
    model = depthwise_model((1, 6, 5, 36), (3, 3), 1, (2, 1))
    assert "c0 += 12" in c_text(model)
    assert_bit_exact(model)


def overlapped_plan(model: bytes) -> ModelPlan:
    """The one-op model's plan with its output starting the declared windowed shift below its
    input (as tests/ops/test_conv_c.py places them) and the scratch after both."""
    mp = plan_model(parse_model(model, "<built model>"), "greedy")
    op = mp.graph.operators[0]
    (rule,) = [r for r in mp.program.bindings[0].overlaps if r.kind == "windowed"]
    x, out = (mp.graph.tensors[t] for t in (op.inputs[0], op.outputs[0]))
    assert rule.shift < out.nbytes, "the output would not overlap the input"
    end = max(rule.shift + x.nbytes, out.nbytes)
    place = {op.inputs[0]: rule.shift, op.outputs[0]: 0}
    offsets = tuple(place[key.index] if key.kind == TENSOR else end for key in mp.lifetimes.keys)
    scratch = sum(r.size for r in mp.lifetimes.scratch)
    plan = dataclasses.replace(mp.plan, offsets=offsets, arena_bytes=end + scratch, alignment=1)
    return dataclasses.replace(mp, plan=plan)


@pytest.mark.parametrize("model", [conv_model((2, 9, 8, 4), 6, activation="RELU"),
                                   conv_model((1, 8, 8, 3), 5, per_channel=True),
                                   depthwise_model((1, 9, 10, 4), (3, 3))],
                         ids=["conv-per-tensor", "conv-per-channel", "depthwise"])
def test_c_output_over_input(model):
    """Each image is quantized whole before its pixels are written: the order contract holds."""
    assert_bit_exact(model, mp=overlapped_plan(model))


def test_c_text_reads_like_hand_written_c():
    for model in [*C_CASES, conv_model((1, 7, 8, 3), 4)]:
        text = c_text(model)
        long = [line for line in text.splitlines() if len(line) > LINE_LIMIT]
        assert not long, long[0]
        for var, start, stop, step in CONSTANT_FOR.findall(text):
            assert -(-(int(stop) - int(start)) // int(step or 1)) > 1, var


def test_c_keeps_the_filter_int8_and_quantizes_into_the_scratch():
    text = c_text(conv_model((1, 6, 7, 16), 5, (1, 1)))
    assert "static const int8_t model_t1[80]" in text and "const int8_t *w = model_t1;" in text
    assert "float model_t1" not in text
    mp = plan_model(parse_model(conv_model((2, 6, 7, 16), 5, (1, 1)), "<m>"), "greedy")
    (request,) = mp.program.bindings[0].scratch
    assert request.size == 2 * 6 * 7 * 16

