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
- 16x8 (int16 data, zero point 0, int8 filter) uses the same multipliers but sums in int64 and
  requantizes with the 64-bit MultiplyByQuantizedMultiplier, unless a CONV_2D's or
  TRANSPOSE_CONV's options say quantized_bias_type INT32: then int32 and the int8 one. No zero
  points anywhere.
- Hybrid (float32 data and output, int8 constant filter): each batch image is quantized to int8
  at every invoke (symmetric for a CONV_2D with one filter scale, else asymmetric), summed as
  int8 is, and scaled back to float32 (HybridRescale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.front.schema import DTYPE_NAMES
from toolchain.ir import INT32_MAX, Graph, Operator, Tensor
from toolchain.numerics.quant import (
    activation_range_float,
    activation_range_quantized,
    quantize_multiplier,
    require_int16_zero_points,
    scale_of,
    scales_of,
    zero_point_of,
)
from toolchain.ops.padding import fused_padding
from toolchain.ops.spec import MAX_PLANE_ELEMENTS, required_input, required_options
from toolchain.ops.striping import RowMap, Striping, with_columns, with_rows

FUSED_ACTIVATIONS = ("NONE", "RELU", "RELU6", "RELU_N1_TO_1")
FLOAT32_MAX = float(np.finfo(np.float32).max)
# Data dtype -> dtype its filter and bias must have.
FILTER_DTYPE = {"int8": "int8", "uint8": "uint8", "int16": "int8", "float32": "float32"}
BIAS_DTYPE = {"int8": "int32", "uint8": "int32", "int16": "int64", "float32": "float32"}
QUANTIZED = ("int8", "uint8")
# |int16 * int8|: what each product of a 16x8 convolution adds to its accumulator at most.
INT16_PRODUCT = 32768 * 128
# TFLite's 64-bit MultiplyByQuantizedMultiplier asserts accumulators within +-2^47 and
# exponents below 8.
WIDE_REACH = 2**47
MAX_WIDE_EXPONENT = 7
# GetQuantizedConvolutionMultipler: TFLite refuses a bias scale this far (in output steps) from
# input scale * filter scale.
BIAS_SCALE_TOLERANCE = 0.02

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
    """int32 accumulator -> int8 or uint8 (`dtype`): TFLite's per-channel
    MultiplyByQuantizedMultiplier, offset, clamp. `multipliers` and `shifts` hold one int64 per
    output channel (uint8 has one multiplier, repeated)."""

    dtype: str
    multipliers: np.ndarray
    shifts: np.ndarray
    output_zero_point: int
    clamp: tuple[int, int]


@dataclass(frozen=True)
class WideRequantize:
    """int64 accumulator -> int16 (the 16x8 kernels): TFLite's 64-bit
    MultiplyByQuantizedMultiplier, which rounds each channel's QuantizeMultiplier multiplier to
    16 bits (`multipliers`) and divides once, halves rounding up: (acc * m + 2^(s - 1)) >> s
    with s = 15 - exponent (`shifts`); then a cast to int32, which wraps, and the clamp. There
    is no zero point."""

    multipliers: np.ndarray
    shifts: np.ndarray
    clamp: tuple[int, int]
    dtype: str = "int16"


@dataclass(frozen=True)
class HybridRescale:
    """float32 input, int8 constant filter (dynamic range): TFLite quantizes each batch image
    to int8 as it is read (toolchain/ops/hybrid.py), symmetric or `asymmetric` (with a zero
    point), and sums filter * (value - zero point) in int32 over the taps inside the image;
    that sum goes back to float32 through the image's scale and `filter_scales` (one, or one per
    output channel): with `scales_first` as acc * (filter scale * image scale), else as
    (acc * filter scale) * image scale, each product rounded to float32; then the float bias,
    if any, and the clamp."""

    asymmetric: bool
    filter_scales: tuple[float, ...]
    scales_first: bool
    clamp: tuple[float, float]


@dataclass(frozen=True)
class FloatClamp:
    """float32 output: only the fused activation's clamp."""

    clamp: tuple[float, float]


OutputStage = Requantize | WideRequantize | HybridRescale | FloatClamp


@dataclass(frozen=True)
class ConvParams:
    """CONV_2D (possibly grouped).

    `weights`: float64 [groups, kh * kw * in_channels_per_group, out_channels_per_group], the
    matmul operand in im2col order (row = (ky, kx, c)); float64 so integer products sum
    exactly. A uint8 filter's zero point is subtracted already (TFLite's weights offset).
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
    for n, k, s, d, (fused_before, fused_after) in zip(image, filter_hw, stride, dilation,
                                                        fused_padding(op), strict=True):
        padded = n + fused_before + fused_after  # a fused PAD's (toolchain/ops/padding.py)
        # the farthest index the window computes, before any bounds check
        if (padded - 1) * s + (k - 1) * d + padded > INT32_MAX:
            raise UnsupportedOpError(
                f"a {k}-tap window with stride {s} and dilation {d} over {padded} pixels "
                "reaches beyond 32-bit indices")
        o = _output_size(padding, padded, k, s, d)
        if o < 1:
            raise UnsupportedOpError(f"a {k}-tap window does not fit an image of {padded}")
        p = fused_before + _pad_before(padded, o, k, s, d)
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


def _is_hybrid(data: Tensor, filt: Tensor) -> bool:
    """float32 data with an int8 filter: TFLite's dynamic-range (hybrid) kernels."""
    return data.dtype == "float32" and filt.dtype == "int8"


def _check_dtypes(data: Tensor, out: Tensor, filt: Tensor, bias: Tensor | None) -> None:
    if data.dtype not in FILTER_DTYPE:
        raise UnsupportedOpError(f"{data.dtype} input")
    if out.dtype != data.dtype or (filt.dtype != FILTER_DTYPE[data.dtype]
                                   and not _is_hybrid(data, filt)):
        raise UnsupportedOpError(
            f"{data.dtype} input with {filt.dtype} filter and {out.dtype} output"
        )
    # an int16 bias may be int32 too: _int16_accumulator decides
    if bias is not None and bias.dtype != BIAS_DTYPE[data.dtype] and (
            data.dtype != "int16" or bias.dtype != "int32"):
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
        raise UnsupportedOpError(f"{bias.dtype} bias with a non-zero zero point")
    return bias.data.reshape(channels)


def _input_offset(data: Tensor) -> int:
    return -zero_point_of(data) if data.dtype in QUANTIZED else 0


def _offset_filter(filt: Tensor) -> np.ndarray:
    """The filter's values as float64, minus a uint8 filter's zero point."""
    values = filt.data.astype(np.float64)
    return values - zero_point_of(filt) if filt.dtype == "uint8" else values


def _fused_activation(op: Operator) -> str:
    activation = op.options.get("fused_activation_function", "NONE")
    if activation not in FUSED_ACTIVATIONS:
        raise UnsupportedOpError(f"fused activation {activation}")
    return activation


def _int16_accumulator(op: Operator, bias: Tensor | None) -> str:
    """What TFLite's 16x8 CONV_2D and TRANSPOSE_CONV sum in, and read their bias as: int64
    unless the options' quantized_bias_type says INT32. FLOAT32, the schema's default, leaves
    TFLite's int64: it would then read an int32 bias as int64 values, past the bias's end.
    DEPTHWISE_CONV_2D has no such option and always sums in int64 (its bias must be int64)."""
    if op.opcode == "DEPTHWISE_CONV_2D":
        return "int64"
    bias_type = DTYPE_NAMES.get(op.options.get("quantized_bias_type", 0), "unknown")
    if bias_type not in ("float32", "int32", "int64"):
        raise UnsupportedOpError(f"quantized_bias_type {bias_type.upper()} (TFLite takes INT32 "
                                 "or INT64)")
    accumulator = "int32" if bias_type == "int32" else "int64"
    if bias is not None and bias.dtype != accumulator:
        if bias_type == "float32":
            raise UnsupportedOpError("int32 bias without quantized_bias_type INT32 (TFLite "
                                     "reads it as int64 values)")
        raise UnsupportedOpError(f"{bias.dtype} bias with quantized_bias_type "
                                 f"{bias_type.upper()} (TFLite refuses)")
    return accumulator


def _output_stage(op: Operator, data: Tensor, filt: Tensor, bias: Tensor | None, out: Tensor,
                  channels: int, channel_axis: int, products: int = 0) -> OutputStage:
    """The clamp (float32) or per-channel requantization (int8, uint8, int16) of the
    accumulator, which sums at most `products` products per output (for int16's reach)."""
    activation = _fused_activation(op)
    if _is_hybrid(data, filt):
        return _hybrid_rescale(op, filt, channels)
    if data.dtype == "float32":
        low, high = activation_range_float(activation)
        return FloatClamp((max(low, -FLOAT32_MAX), min(high, FLOAT32_MAX)))
    if data.quantization is None or out.quantization is None or filt.quantization is None:
        raise UnsupportedOpError(
            f"{data.dtype} input, filter and output need quantization parameters")
    if data.dtype == "uint8":
        return _uint8_output_stage(activation, data, filt, bias, out, channels)
    q = filt.quantization
    if any(q.zero_point):
        raise UnsupportedOpError("int8 filter with a non-zero zero point")
    accumulator = "int32"
    if data.dtype == "int16":
        require_int16_zero_points(data, out)
        accumulator = _int16_accumulator(op, bias)
    if q.per_channel and (len(q.scale) != channels or q.quantized_dimension != channel_axis):
        raise UnsupportedOpError(
            f"{len(q.scale)} filter scales along dimension {q.quantized_dimension}; expected "
            f"1 or {channels} along dimension {channel_axis}"
        )
    filter_scales = np.broadcast_to(np.asarray(scales_of(filt)), channels)
    real = [scale_of(data) * float(s) / scale_of(out) for s in filter_scales]
    if accumulator == "int64":
        _check_wide_reach(bias, products)
        return _wide_requantize(real, activation, out)
    return _requantize(real, activation, out)


def _hybrid_rescale(op: Operator, filt: Tensor, channels: int) -> HybridRescale:
    """How TFLite's hybrid CONV_2D and DEPTHWISE_CONV_2D quantize their input and scale the
    sums back (see HybridRescale); what they would compute otherwise is refused."""
    q = filt.quantization
    if q is None or not all(math.isfinite(s) and s > 0 for s in q.scale):
        raise UnsupportedOpError("hybrid int8 filter without positive quantization scales")
    scales = tuple(float(np.float32(s)) for s in q.scale)
    clamp = activation_range_float(_fused_activation(op))
    if op.opcode == "DEPTHWISE_CONV_2D":  # always per channel, the input asymmetric
        if len(scales) != channels or (channels > 1 and q.quantized_dimension != 3):
            raise UnsupportedOpError(
                f"hybrid filter with {len(scales)} scales along dimension "
                f"{q.quantized_dimension} (TFLite reads one per output channel, along dimension "
                "3, past the end of fewer)")
        return HybridRescale(True, scales, True, clamp)
    if len(set(scales)) == 1:  # TFLite's per-tensor path, also for equal per-channel scales
        if (filt.data == -128).any():
            raise UnsupportedOpError("hybrid filter holding -128 with one scale (TFLite's x86 "
                                     "kernel miscounts it; converters write [-127, 127])")
        return HybridRescale(False, scales[:1], True, clamp)
    if len(scales) != channels or q.quantized_dimension != 0:
        raise UnsupportedOpError(f"hybrid filter with {len(scales)} scales along dimension "
                                 f"{q.quantized_dimension}; expected {channels} along 0")
    return HybridRescale(True, scales, False, clamp)


def _check_wide_reach(bias: Tensor | None, products: int) -> None:
    """TFLite's 64-bit requantization takes accumulators within +-2^47 (it asserts so, and its
    product with the multiplier must not overflow): refuse a bias that could leave them."""
    largest = int(np.abs(bias.data.astype(np.int64)).max(initial=0)) if bias is not None else 0
    if largest + products * INT16_PRODUCT >= WIDE_REACH:
        raise UnsupportedOpError(f"int64 bias values up to {largest}: the accumulators could "
                                 "leave the +-2^47 TFLite's 64-bit requantization takes")


def _wide_requantize(real: list[float], activation: str, out: Tensor) -> WideRequantize:
    """The constants of TFLite's 64-bit MultiplyByQuantizedMultiplier (see WideRequantize)."""
    multipliers, shifts = [], []
    for r in real:
        m, exponent = quantize_multiplier(r)
        if exponent > MAX_WIDE_EXPONENT:
            raise UnsupportedOpError(f"requantization by {r:.6g}: TFLite's 64-bit "
                                     f"requantization shifts left by at most {MAX_WIDE_EXPONENT}")
        multipliers.append((m + (1 << 15)) >> 16 if m < 0x7FFF0000 else 0x7FFF)
        shifts.append(15 - exponent)
    return WideRequantize(
        multipliers=_frozen(np.array(multipliers, np.int64)),
        shifts=_frozen(np.array(shifts, np.int64)),
        clamp=activation_range_quantized(activation, out),
    )


def _uint8_output_stage(activation: str, data: Tensor, filt: Tensor, bias: Tensor | None,
                        out: Tensor, channels: int) -> Requantize:
    """The legacy uint8 kernels' one multiplier (GetQuantizedConvolutionMultipler): the input
    and filter scales multiply in float32, and only that product is widened to double."""
    if len(scales_of(filt)) != 1:
        raise UnsupportedOpError("uint8 filter with per-channel scales (TFLite refuses)")
    product = float(np.float32(scale_of(data)) * np.float32(scale_of(filt)))
    if bias is not None and bias.quantization is not None and abs(
            scale_of(data) * scale_of(filt) - scale_of(bias)) / scale_of(out) > (
            BIAS_SCALE_TOLERANCE):
        raise UnsupportedOpError("bias scale differs from input scale * filter scale "
                                 "(TFLite refuses)")
    return _requantize([product / scale_of(out)] * channels, activation, out)


def _requantize(real: list[float], activation: str, out: Tensor) -> Requantize:
    """QuantizeMultiplier of each channel's real multiplier, within the C kernel's reach."""
    multipliers, shifts = zip(*(quantize_multiplier(r) for r in real), strict=True)
    for m, s in zip(multipliers, shifts, strict=True):
        if not (0 <= m < 2**31 and -31 <= s <= 31):  # the C requantization's reach
            raise UnsupportedOpError(f"requantization multiplier {m} with shift {s}")
    return Requantize(
        dtype=out.dtype,
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
    if _is_hybrid(data, filt) and groups > 1 and len(set(scales_of(filt))) == 1:
        raise UnsupportedOpError("grouped hybrid CONV_2D with one filter scale (TFLite runs it "
                                 "on its per-channel path, which reads a scale per output "
                                 "channel)")
    (out_h, out_w), window = _gather_window(op, (height, width), (kh, kw))
    _check_plane(window, batch, in_channels)
    _check_output(out, (batch, out_h, out_w, out_channels))
    # [o, ky, kx, c] -> [group, (ky, kx, c), o within group]
    weights = _offset_filter(filt).reshape(groups, out_channels // groups, -1)
    return ConvParams(
        input_shape=data.shape,
        output_shape=out.shape,
        window=window,
        groups=groups,
        input_offset=_input_offset(data),
        weights=_frozen(np.ascontiguousarray(weights.transpose(0, 2, 1))),
        bias=_bias_values(bias, data, out_channels),
        output=_output_stage(op, data, filt, bias, out, out_channels, channel_axis=0,
                             products=kh * kw * group_channels),
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
    weights = _offset_filter(filt).reshape(kh * kw, in_channels, depth_multiplier)
    return DepthwiseConvParams(
        input_shape=data.shape,
        output_shape=out.shape,
        window=window,
        depth_multiplier=depth_multiplier,
        input_offset=_input_offset(data),
        weights=_frozen(np.ascontiguousarray(weights.transpose(1, 0, 2))),
        bias=_bias_values(bias, data, out_channels),
        output=_output_stage(op, data, filt, bias, out, out_channels, channel_axis=3,
                             products=kh * kw),
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
    if back.dilation != (1, 1):
        raise UnsupportedOpError("TRANSPOSE_CONV with dilation")
    if (in_h, in_w) != (height, width):
        raise UnsupportedOpError(
            f"output {out.shape} with this padding and stride reads a {in_h}x{in_w} image, "
            f"but the input is {height}x{width}"
        )
    plane = tuple(
        max((n - 1) * s + k, p + o)
        for n, s, k, p, o in zip((height, width), back.stride, (kh, kw), back.padding,
                                 out.shape[1:3], strict=True)
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
        output=_output_stage(op, data, filt, bias, out, out_channels, channel_axis=0,
                             products=-(-kh // back.stride[0]) * -(-kw // back.stride[1])
                             * in_channels),
    )


# -- by bands of output rows (toolchain.ops.striping) and with a fused PAD ----------------------


def convolution_rows(p: ConvParams | DepthwiseConvParams) -> RowMap | None:
    return _convolution_axis(p, 0)


def convolution_band(p: ConvParams | DepthwiseConvParams, out_lo: int, out_hi: int, in_lo: int,
                     in_hi: int) -> ConvParams | DepthwiseConvParams:
    """The convolution of output rows [out_lo, out_hi) from input rows [in_lo, in_hi)."""
    return _convolution_cut(p, 0, out_lo, out_hi, in_lo, in_hi)


def convolution_columns(p: ConvParams | DepthwiseConvParams) -> RowMap | None:
    return _convolution_axis(p, 1)


def convolution_column_band(p: ConvParams | DepthwiseConvParams, out_lo: int, out_hi: int,
                            in_lo: int, in_hi: int) -> ConvParams | DepthwiseConvParams:
    """The convolution of output columns [out_lo, out_hi) from input columns [in_lo, in_hi)."""
    return _convolution_cut(p, 1, out_lo, out_hi, in_lo, in_hi)


def _convolution_axis(p: ConvParams | DepthwiseConvParams, axis: int) -> RowMap | None:
    """How the output reads the input along spatial `axis` (0 rows, 1 columns)."""
    if isinstance(p.output, HybridRescale):
        return None  # each image is quantized with its own range: no part of it goes alone
    w = p.window
    return RowMap(w.filter[axis], w.stride[axis], w.dilation[axis], w.padding[axis],
                  p.input_shape[1 + axis])


def _convolution_cut(p: ConvParams | DepthwiseConvParams, axis: int, out_lo: int, out_hi: int,
                     in_lo: int, in_hi: int) -> ConvParams | DepthwiseConvParams:
    """The same convolution on fewer rows or columns (`axis` 0 or 1): its leading padding what
    is left of it before input position `in_lo`, its plane at least what its windows span."""
    w = p.window
    stride, taps, dilation = w.stride[axis], w.filter[axis], w.dilation[axis]
    pad = in_lo - (out_lo * stride - w.padding[axis])
    size = out_hi - out_lo
    plane = max(in_hi - in_lo + pad, (size - 1) * stride + (taps - 1) * dilation + 1)
    cut = with_rows if axis == 0 else with_columns
    return replace(p, input_shape=cut(p.input_shape, in_hi - in_lo),
                   output_shape=cut(p.output_shape, size),
                   window=replace(w, padding=_with(w.padding, axis, pad),
                                  plane=_with(w.plane, axis, plane)))


def _with(pair: Pair, axis: int, value: int) -> Pair:
    return (value, pair[1]) if axis == 0 else (pair[0], value)


def convolution_macs(p: ConvParams | DepthwiseConvParams) -> int:
    """Every output element sums one row of the matmul operand: kh * kw (* input channels of
    its group, for CONV_2D) products."""
    return math.prod(p.output_shape) * p.weights.shape[1]


def convolution_band_key(p: ConvParams | DepthwiseConvParams) -> tuple:
    return (p.input_shape, p.output_shape, p.window)


CONVOLUTION_STRIPING = Striping(convolution_rows, convolution_band, convolution_band_key,
                                macs=convolution_macs, columns=convolution_columns,
                                column_band=convolution_column_band)


def pads_with_nothing(x: Tensor, value: float, op: Operator, graph: Graph) -> str:
    """A convolution's padding adds nothing: a PAD fused into it must write the input's zero
    point, "" when it does, else why not."""
    filt = graph.tensors[op.inputs[1]] if len(op.inputs) > 1 and op.inputs[1] >= 0 else None
    if x.dtype == "float32" and filt is not None and filt.dtype != "float32":
        return "a hybrid convolution quantizes the padded image as a whole"
    zero = 0 if x.dtype == "float32" else zero_point_of(x)
    if value != zero or (x.dtype == "float32" and np.signbit(value)):
        return f"it pads with {value}, not the input's zero point {zero}"
    return ""


def convolution_axes(p: ConvParams | DepthwiseConvParams) -> tuple[tuple[int, int, int, int], ...]:
    """Per axis (height, width): outputs, the window's extent, the padding before, stride."""
    w = p.window
    return tuple((p.output_shape[1 + axis], (w.filter[axis] - 1) * w.dilation[axis] + 1,
                  w.padding[axis], w.stride[axis]) for axis in (0, 1))
