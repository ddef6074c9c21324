"""Params for the convolution family: CONV_2D, DEPTHWISE_CONV_2D and TRANSPOSE_CONV.

TFLite's reference kernels are the specification (kernels/conv.cc, depthwise_conv.cc,
transpose_conv.cc; internal/reference/{conv,depthwiseconv_float,transpose_conv}.h and
reference/integer_ops/{conv,depthwise_conv,transpose_conv}.h):

- int8 always runs the per-channel kernel; a per-tensor filter scale is broadcast over the
  output channels. Each channel's multiplier is QuantizeMultiplier of
  double(input_scale) * double(filter_scale) / double(output_scale).
- The int32 accumulator sums filter * (input - input_zero_point) over the pixels inside the
  image only, so padding behaves as the input zero point (real 0); then bias, requantize,
  output zero point, clamp to the fused activation.
- float32 sums input * filter in float, adds the bias and clamps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops.spec import (
    INT32_MAX,
    MAX_PLANE_ELEMENTS,
    OpSpec,
    required_input,
    required_options,
)
from toolchain.quant import (
    activation_range_float,
    activation_range_quantized,
    quantize_multiplier,
    scale_of,
    scales_of,
    zero_point_of,
)

FUSED_ACTIVATIONS = ("NONE", "RELU", "RELU6", "RELU_N1_TO_1")
FLOAT32_MAX = float(np.finfo(np.float32).max)
# Data dtype -> dtype its filter and bias must have.
FILTER_DTYPE = {"int8": "int8", "float32": "float32"}
BIAS_DTYPE = {"int8": "int32", "float32": "float32"}

Pair = tuple[int, int]


@dataclass(frozen=True)
class Window:
    """Where the filter window goes, per spatial axis (height, width).

    `plane` is the plane the window slides over: for CONV_2D and DEPTHWISE_CONV_2D the input
    placed at offset `padding` inside a plane of zero (real-valued) padding; for TRANSPOSE_CONV
    the plane the input pixels scatter into, of which the output is the part at `padding`.
    """

    filter: Pair
    stride: Pair
    dilation: Pair
    padding: Pair
    plane: Pair


@dataclass(frozen=True)
class Requantize:
    """int32 accumulator -> int8: TFLite's per-channel MultiplyByQuantizedMultiplier, offset,
    clamp. `multipliers` and `shifts` hold one int64 per output channel."""

    multipliers: np.ndarray
    shifts: np.ndarray
    output_zero_point: int
    clamp: tuple[int, int]


@dataclass(frozen=True)
class FloatClamp:
    """float32 output: only the fused activation's clamp."""

    clamp: tuple[float, float]


OutputStage = Requantize | FloatClamp


@dataclass(frozen=True)
class ConvParams:
    """CONV_2D (possibly grouped).

    `weights`: float64 [groups, kh * kw * in_channels_per_group, out_channels_per_group], the
    matmul operand in im2col order (row = (ky, kx, c)); float64 so int8 products sum exactly.
    `input_offset` is added to every input value (-zero point, 0 for float32); `bias` holds
    the bias per output channel (int32 or float32, zeros when the op has none).
    """

    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    window: Window
    groups: int
    input_offset: int
    weights: np.ndarray
    bias: np.ndarray
    output: OutputStage


@dataclass(frozen=True)
class DepthwiseConvParams:
    """DEPTHWISE_CONV_2D: output channel c * depth_multiplier + m reads input channel c.

    `weights`: float64 [in_channels, kh * kw, depth_multiplier].
    """

    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    window: Window
    depth_multiplier: int
    input_offset: int
    weights: np.ndarray
    bias: np.ndarray
    output: OutputStage


@dataclass(frozen=True)
class TransposeConvParams:
    """TRANSPOSE_CONV: every input pixel adds input * filter into a kh x kw patch of the plane.

    `weights`: float64 [in_channels, kh * kw * out_channels] (column = (ky, kx, o)).
    """

    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    window: Window
    input_offset: int
    weights: np.ndarray
    bias: np.ndarray
    output: OutputStage


# -- geometry ----------------------------------------------------------------------------------


def _output_size(padding: str, size: int, filter_size: int, stride: int, dilation: int) -> int:
    """TFLite's ComputeOutSize (C division; both numerators are positive when it matters)."""
    effective = (filter_size - 1) * dilation + 1
    if padding == "SAME":
        return (size + stride - 1) // stride
    return max(size + stride - effective, 0) // stride


def _pad_before(size: int, out_size: int, filter_size: int, stride: int, dilation: int) -> int:
    """TFLite's ComputePadding: half the total, the odd pixel going after."""
    effective = (filter_size - 1) * dilation + 1
    return max((out_size - 1) * stride + effective - size, 0) // 2


def _padding_kind(op: Operator) -> str:
    padding = required_options(op, "padding", "stride_h", "stride_w")["padding"]
    if padding not in ("SAME", "VALID"):
        raise UnsupportedOpError(f"padding {padding!r}")
    return padding


def _strides(op: Operator) -> tuple[Pair, Pair]:
    options = op.options
    stride = (options["stride_h"], options["stride_w"])
    dilation = (options.get("dilation_h_factor", 1), options.get("dilation_w_factor", 1))
    if min(stride + dilation) < 1:
        raise ModelError(f"stride {stride} and dilation {dilation} must be positive")
    return stride, dilation


def _gather_window(op: Operator, image: Pair, filter_hw: Pair) -> tuple[Pair, Window]:
    """Output (height, width) and window of a convolution reading `image`."""
    padding = _padding_kind(op)
    stride, dilation = _strides(op)
    out, before, plane = [], [], []
    for n, k, s, d in zip(image, filter_hw, stride, dilation):
        # the farthest index the window computes, before any bounds check
        if (n - 1) * s + (k - 1) * d + n > INT32_MAX:
            raise UnsupportedOpError(
                f"a {k}-tap window with stride {s} and dilation {d} over {n} pixels reaches "
                "beyond 32-bit indices")
        o = _output_size(padding, n, k, s, d)
        if o < 1:
            raise UnsupportedOpError(f"a {k}-tap window does not fit an image of {n}")
        p = _pad_before(n, o, k, s, d)
        out.append(o)
        before.append(p)
        plane.append(max(n + p, (o - 1) * s + (k - 1) * d + 1))
    return (out[0], out[1]), Window(filter_hw, stride, dilation, tuple(before), tuple(plane))


def _check_plane(window: Window, batch: int, channels: int) -> None:
    elements = batch * window.plane[0] * window.plane[1] * channels
    if elements > MAX_PLANE_ELEMENTS:
        raise UnsupportedOpError(
            f"the padded plane of {batch}x{window.plane[0]}x{window.plane[1]}x{channels} "
            f"({elements} elements, over {MAX_PLANE_ELEMENTS}) that this stride, dilation and "
            "padding need")


# -- tensors and checks ------------------------------------------------------------------------


def _tensor(graph: Graph, op: Operator, position: int) -> Tensor | None:
    index = op.inputs[position] if position < len(op.inputs) else -1
    return graph.tensors[index] if index >= 0 else None


def _check_dtypes(data: Tensor, out: Tensor, filt: Tensor, bias: Tensor | None) -> None:
    if data.dtype not in FILTER_DTYPE:
        raise UnsupportedOpError(f"{data.dtype} input")
    if out.dtype != data.dtype or filt.dtype != FILTER_DTYPE[data.dtype]:
        raise UnsupportedOpError(
            f"{data.dtype} input with {filt.dtype} filter and {out.dtype} output"
        )
    if bias is not None and bias.dtype != BIAS_DTYPE[data.dtype]:
        raise UnsupportedOpError(f"{bias.dtype} bias with {data.dtype} input")
    if not filt.is_constant or (bias is not None and not bias.is_constant):
        raise UnsupportedOpError("filter and bias must be constant tensors")
    if len(data.shape) != 4 or len(filt.shape) != 4:
        raise UnsupportedOpError(f"input {data.shape} and filter {filt.shape} must be 4-D")
    if 0 in data.shape or 0 in filt.shape:
        raise UnsupportedOpError(f"empty input {data.shape} or filter {filt.shape}")


def _bias_values(bias: Tensor | None, data: Tensor, channels: int) -> np.ndarray:
    """The bias per output channel, zeros when the optional bias is absent."""
    dtype = np.dtype(BIAS_DTYPE[data.dtype])
    if bias is None:
        return _frozen(np.zeros(channels, dtype))
    if bias.num_elements != channels:
        raise UnsupportedOpError(f"bias has {bias.num_elements} values for {channels} channels")
    if bias.quantization and any(bias.quantization.zero_point):
        raise UnsupportedOpError("int32 bias with a non-zero zero point")
    return bias.data.reshape(channels)


def _input_offset(data: Tensor) -> int:
    return -zero_point_of(data) if data.dtype == "int8" else 0


def _fused_activation(op: Operator) -> str:
    activation = op.options.get("fused_activation_function", "NONE")
    if activation not in FUSED_ACTIVATIONS:
        raise UnsupportedOpError(f"fused activation {activation}")
    return activation


def _output_stage(op: Operator, data: Tensor, filt: Tensor, out: Tensor, channels: int,
                  channel_axis: int) -> OutputStage:
    """The clamp (float32) or per-channel requantization (int8) of the accumulator."""
    activation = _fused_activation(op)
    if data.dtype == "float32":
        low, high = activation_range_float(activation)
        return FloatClamp((max(low, -FLOAT32_MAX), min(high, FLOAT32_MAX)))
    if data.quantization is None or out.quantization is None or filt.quantization is None:
        raise UnsupportedOpError("int8 input, filter and output need quantization parameters")
    q = filt.quantization
    if any(q.zero_point):
        raise UnsupportedOpError("int8 filter with a non-zero zero point")
    if q.per_channel and (len(q.scale) != channels or q.quantized_dimension != channel_axis):
        raise UnsupportedOpError(
            f"{len(q.scale)} filter scales along dimension {q.quantized_dimension}; expected "
            f"1 or {channels} along dimension {channel_axis}"
        )
    filter_scales = np.broadcast_to(np.asarray(scales_of(filt)), channels)
    real = [scale_of(data) * float(s) / scale_of(out) for s in filter_scales]
    multipliers, shifts = zip(*(quantize_multiplier(r) for r in real))
    return Requantize(
        multipliers=_frozen(np.array(multipliers, np.int64)),
        shifts=_frozen(np.array(shifts, np.int64)),
        output_zero_point=zero_point_of(out),
        clamp=activation_range_quantized(activation, out),
    )


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _check_output(out: Tensor, expected: tuple[int, ...]) -> None:
    if out.shape != expected:
        raise UnsupportedOpError(f"output shape {out.shape}, expected {expected}")


# -- prepare -----------------------------------------------------------------------------------


def _data_and_filter(graph: Graph, op: Operator) -> tuple[Tensor, Tensor, Tensor | None]:
    return (required_input(graph, op, 0, "input"), required_input(graph, op, 1, "filter"),
            _tensor(graph, op, 2))


def prepare_conv_2d(graph: Graph, op: Operator) -> ConvParams:
    data, filt, bias = _data_and_filter(graph, op)
    out = graph.tensors[op.outputs[0]]
    _check_dtypes(data, out, filt, bias)
    batch, height, width, in_channels = data.shape
    out_channels, kh, kw, group_channels = filt.shape
    if in_channels % group_channels or out_channels % (in_channels // group_channels):
        raise UnsupportedOpError(
            f"filter {filt.shape} does not divide into groups of input channels {in_channels}"
        )
    groups = in_channels // group_channels
    (out_h, out_w), window = _gather_window(op, (height, width), (kh, kw))
    _check_plane(window, batch, in_channels)
    _check_output(out, (batch, out_h, out_w, out_channels))
    # [o, ky, kx, c] -> [group, (ky, kx, c), o within group]
    weights = filt.data.astype(np.float64).reshape(groups, out_channels // groups, -1)
    return ConvParams(
        input_shape=data.shape,
        output_shape=out.shape,
        window=window,
        groups=groups,
        input_offset=_input_offset(data),
        weights=_frozen(np.ascontiguousarray(weights.transpose(0, 2, 1))),
        bias=_bias_values(bias, data, out_channels),
        output=_output_stage(op, data, filt, out, out_channels, channel_axis=0),
    )


def prepare_depthwise_conv_2d(graph: Graph, op: Operator) -> DepthwiseConvParams:
    data, filt, bias = _data_and_filter(graph, op)
    out = graph.tensors[op.outputs[0]]
    _check_dtypes(data, out, filt, bias)
    batch, height, width, in_channels = data.shape
    one, kh, kw, out_channels = filt.shape
    if one != 1 or out_channels % in_channels:
        raise UnsupportedOpError(f"filter {filt.shape} for {in_channels} input channels")
    # TFLite derives the multiplier from the shapes, not from the option.
    depth_multiplier = out_channels // in_channels
    (out_h, out_w), window = _gather_window(op, (height, width), (kh, kw))
    _check_plane(window, batch, in_channels)
    _check_output(out, (batch, out_h, out_w, out_channels))
    weights = filt.data.astype(np.float64).reshape(kh * kw, in_channels, depth_multiplier)
    return DepthwiseConvParams(
        input_shape=data.shape,
        output_shape=out.shape,
        window=window,
        depth_multiplier=depth_multiplier,
        input_offset=_input_offset(data),
        weights=_frozen(np.ascontiguousarray(weights.transpose(1, 0, 2))),
        bias=_bias_values(bias, data, out_channels),
        output=_output_stage(op, data, filt, out, out_channels, channel_axis=3),
    )


def prepare_transpose_conv(graph: Graph, op: Operator) -> TransposeConvParams:
    """Inputs: output_shape, weights [o, kh, kw, c], input, optional bias.

    TFLite pads as for a convolution from the output back to the input and requires that
    convolution to land exactly on the input's size.
    """
    shape = required_input(graph, op, 0, "output_shape")
    filt, data = required_input(graph, op, 1, "weights"), required_input(graph, op, 2, "input")
    bias, out = _tensor(graph, op, 3), graph.tensors[op.outputs[0]]
    _check_dtypes(data, out, filt, bias)
    if shape.is_constant and tuple(shape.data.tolist()) != out.shape:
        raise UnsupportedOpError(f"output_shape {shape.data.tolist()} but output {out.shape}")
    batch, height, width, in_channels = data.shape
    out_channels, kh, kw, filter_channels = filt.shape
    if len(out.shape) != 4 or out.shape[::3] != (batch, out_channels) or (
        filter_channels != in_channels
    ):
        raise UnsupportedOpError(f"input {data.shape}, filter {filt.shape}, output {out.shape}")
    (in_h, in_w), back = _gather_window(op, out.shape[1:3], (kh, kw))
    if (in_h, in_w) != (height, width):
        raise UnsupportedOpError(
            f"output {out.shape} with this padding and stride reads a {in_h}x{in_w} image, "
            f"but the input is {height}x{width}"
        )
    plane = tuple(
        max((n - 1) * s + k, p + o)
        for n, s, k, p, o in zip((height, width), back.stride, (kh, kw), back.padding,
                                 out.shape[1:3])
    )
    window = Window(back.filter, back.stride, back.dilation, back.padding, plane)
    _check_plane(window, batch, out_channels)
    # [o, ky, kx, c] -> [c, (ky, kx, o)]
    weights = filt.data.astype(np.float64).transpose(3, 1, 2, 0).reshape(in_channels, -1)
    return TransposeConvParams(
        input_shape=data.shape,
        output_shape=out.shape,
        window=window,
        input_offset=_input_offset(data),
        weights=_frozen(np.ascontiguousarray(weights)),
        bias=_bias_values(bias, data, out_channels),
        output=_output_stage(op, data, filt, out, out_channels, channel_axis=0),
    )


SPECS: tuple[OpSpec, ...] = (
    OpSpec("CONV_2D", frozenset(FILTER_DTYPE), prepare_conv_2d),
    OpSpec("DEPTHWISE_CONV_2D", frozenset(FILTER_DTYPE), prepare_depthwise_conv_2d),
    # Inputs are (output_shape, weights, data): the data input keys the supported dtypes.
    OpSpec("TRANSPOSE_CONV", frozenset(FILTER_DTYPE), prepare_transpose_conv, dtype_input=2),
)
