"""numpy kernels for the convolution family, executing the params of toolchain.ops.conv.prepare.

All arithmetic runs in float64: every int8 (or int16 x int8) product and every sum of them is
an integer far below 2^53 (prepare bounds int16's int64 sums, bias included, by 2^47), so
float64 sums (and BLAS matmuls) are exact whatever their order, and the integer paths then
follow TFLite's pipeline from the exact accumulator. float32 models get a more precise sum than
TFLite's float32 loop, well within the check's tolerance; hybrid ones (an int8 filter) sum
their quantized input exactly and then round in float32 as TFLite does, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from runtime_py.hybrid import quantize_asymmetric, quantize_symmetric
from toolchain.numerics.fixedpoint import wrap_int32
from toolchain.ops.conv.prepare import (
    ConvParams,
    DepthwiseConvParams,
    FloatClamp,
    HybridRescale,
    OutputStage,
    Requantize,
    TransposeConvParams,
    WideRequantize,
    Window,
)


def _plane(x: np.ndarray, window: Window, input_offset: int) -> np.ndarray:
    """The input plus its offset, placed in a zero plane: padding reads as real zero."""
    batch, height, width, channels = x.shape
    top, left = window.padding
    plane = np.zeros((batch, *window.plane, channels))
    np.add(x, input_offset, out=plane[:, top:top + height, left:left + width], dtype=np.float64)
    return plane


def _patches(plane: np.ndarray, window: Window, out_hw: tuple[int, int]) -> np.ndarray:
    """im2col as a view: [N, OH, OW, KH, KW, C], each output pixel's receptive field."""
    batch, _, _, channels = plane.shape
    n_step, y_step, x_step, c_step = plane.strides
    (stride_h, stride_w), (dilation_h, dilation_w) = window.stride, window.dilation
    return as_strided(
        plane,
        (batch, *out_hw, *window.filter, channels),
        (n_step, y_step * stride_h, x_step * stride_w, y_step * dilation_h, x_step * dilation_w,
         c_step),
        writeable=False,
    )


def requantize(acc: np.ndarray, stage: Requantize) -> np.ndarray:
    """TFLite's int32 accumulator (C wrap-around included) -> int8, per output channel.

    The arithmetic of fixedpoint.multiply_by_quantized_multiplier in fewer numpy passes, this
    being the kernels' hot spot: for a positive multiplier, SaturatingRoundingDoublingHighMul
    (nudge, then a division truncating toward zero) is (x * m + 2^30) >> 31, and
    RoundingDivideByPOT by n >= 1 is (x + 2^(n-1) - (x < 0)) >> n.
    """
    right_shifts = np.maximum(-stage.shifts, 0)
    x = acc.astype(np.int64)
    x <<= np.maximum(stage.shifts, 0)
    x = x.astype(np.int32).astype(np.int64)  # C's int32 wrap-around
    x *= stage.multipliers
    x += 1 << 30
    x >>= 31
    minus_one_if_negative = (x >> 63) & -np.sign(right_shifts)  # 0 where nothing is divided
    x += (1 << right_shifts) >> 1
    x += minus_one_if_negative
    x >>= right_shifts
    x += stage.output_zero_point
    return np.clip(x, *stage.clamp).astype(stage.dtype)


def requantize_wide(acc: np.ndarray, stage: WideRequantize) -> np.ndarray:
    """TFLite's int64 accumulator -> int16 by its 64-bit MultiplyByQuantizedMultiplier: one
    rounding shift of acc * m (prepare keeps acc within +-2^47, so nothing overflows), the
    int32 cast wrapping, then the clamp."""
    x = acc.astype(np.int64)
    x *= stage.multipliers
    x += np.int64(1) << (stage.shifts - 1)
    x >>= stage.shifts
    return np.clip(wrap_int32(x), *stage.clamp).astype(stage.dtype)


def _clamp(acc: np.ndarray, stage: FloatClamp) -> np.ndarray:
    return np.clip(acc, *stage.clamp).astype(np.float32)


_OUTPUT_STAGES: dict[type, Callable[[np.ndarray, OutputStage], np.ndarray]] = {
    Requantize: requantize,
    WideRequantize: requantize_wide,
    FloatClamp: _clamp,
}


def _finish(acc: np.ndarray, bias: np.ndarray, stage: OutputStage, out: np.ndarray) -> None:
    """Bias, then the output stage, written into the arena view."""
    acc += bias
    out[...] = _OUTPUT_STAGES[type(stage)](acc, stage)


f32 = np.float32


def _quantized(x: np.ndarray, stage: HybridRescale) -> tuple[np.ndarray, np.ndarray]:
    """A hybrid kernel's input as TFLite quantizes it, image by image: the values minus their
    zero point (what the sums multiply; padding adds 0), and each image's scale."""
    quantize = quantize_asymmetric if stage.asymmetric else quantize_symmetric
    values, scales = np.empty(x.shape), np.empty(x.shape[0], f32)
    for b, image in enumerate(x):
        q, scales[b], zero_point = quantize(image.reshape(-1).astype(f32))
        values[b] = (q - zero_point).reshape(image.shape)
    return values, scales


def _rescale(acc: np.ndarray, scales: np.ndarray, bias: np.ndarray | None,
             stage: HybridRescale, out: np.ndarray) -> None:
    """The exact int32 sums [N, OH, OW, O] back to float32 in TFLite's order, every product and
    sum rounded to float32, then the bias and the clamp."""
    filter_scales = np.asarray(stage.filter_scales, f32)
    image_scales = scales.reshape(-1, 1, 1, 1)
    total = wrap_int32(acc.astype(np.int64)).astype(f32)
    if stage.scales_first:
        y = total * (filter_scales * image_scales).astype(f32)
    else:
        y = (total * filter_scales).astype(f32) * image_scales
    y = y.astype(f32)
    if bias is not None:
        y = (y + bias.astype(f32)).astype(f32)
    out[...] = np.clip(y, f32(stage.clamp[0]), f32(stage.clamp[1]))


def conv_2d(params: ConvParams, inputs: list[np.ndarray | None],
            outputs: list[np.ndarray]) -> None:
    """im2col (one copy of the strided view) and one matmul per group."""
    out = outputs[0]
    batch, out_h, out_w, _ = out.shape
    hybrid = isinstance(params.output, HybridRescale)
    x = inputs[0]
    if hybrid:
        x, image_scales = _quantized(x, params.output)
    plane = _plane(x, params.window, params.input_offset)
    patches = _patches(plane, params.window, (out_h, out_w))
    groups = params.groups
    # [N, OH, OW, KH, KW, G, C/G] -> [G, N * OH * OW, KH * KW * C/G]
    grouped = patches.reshape(*patches.shape[:-1], groups, -1)
    columns = np.ascontiguousarray(np.moveaxis(grouped, -2, 0))
    columns = columns.reshape(groups, batch * out_h * out_w, -1)
    with np.errstate(invalid="ignore", over="ignore"):  # IEEE infinities and NaN, as in C
        acc = np.matmul(columns, params.weights)  # [G, pixels, O/G]
    acc = np.moveaxis(acc, 0, 1).reshape(out.shape)
    if hybrid:
        _rescale(acc, image_scales, params.bias, params.output, out)
        return
    _finish(acc, params.bias, params.output, out)


def depthwise_conv_2d(params: DepthwiseConvParams, inputs: list[np.ndarray | None],
                      outputs: list[np.ndarray]) -> None:
    """The receptive fields as a strided view, summed tap by tap or by per-channel matmuls,
    whichever numpy does faster for this shape."""
    out = outputs[0]
    hybrid = isinstance(params.output, HybridRescale)
    x = inputs[0]
    if hybrid:
        x, image_scales = _quantized(x, params.output)
    plane = _plane(x, params.window, params.input_offset)
    patches = _patches(plane, params.window, out.shape[1:3])
    in_channels, taps, _ = params.weights.shape
    sum_taps = _matmul_per_channel if taps > in_channels else _multiply_add_per_tap
    with np.errstate(invalid="ignore", over="ignore"):  # IEEE infinities and NaN, as in C
        acc = sum_taps(patches, params.weights)
    if hybrid:
        bias = inputs[2] if len(inputs) > 2 else None
        _rescale(acc.reshape(out.shape), image_scales, bias, params.output, out)
        return
    _finish(acc.reshape(out.shape), params.bias, params.output, out)


def _multiply_add_per_tap(patches: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[N, OH, OW, C, M]: one multiply-add over all pixels and channels per filter tap; the
    fast way when channels outnumber taps."""
    batch, out_h, out_w, kh, kw, channels = patches.shape
    acc = np.zeros((batch, out_h, out_w, channels, weights.shape[-1]))
    for tap, (ky, kx) in enumerate(np.ndindex(kh, kw)):
        acc += patches[:, :, :, ky, kx, :, None] * weights[:, tap]
    return acc


def _matmul_per_channel(patches: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[N * OH * OW, C, M]: im2col per channel and one matmul each; the fast way for large
    filters over few channels."""
    channels = patches.shape[-1]
    columns = np.ascontiguousarray(np.moveaxis(patches, -1, 0)).reshape(channels, -1,
                                                                         weights.shape[1])
    return np.moveaxis(np.matmul(columns, weights), 0, 1)


def transpose_conv(params: TransposeConvParams, inputs: list[np.ndarray | None],
                   outputs: list[np.ndarray]) -> None:
    """TFLite's scatter: one matmul gives every input pixel's kh x kw x O contribution; each
    filter tap's contributions then add into the plane at stride steps (col2im)."""
    out = outputs[0]
    x = inputs[2]  # inputs: output_shape, weights, input, bias
    batch, height, width, _ = x.shape
    window = params.window
    (kh, kw), (stride_h, stride_w) = window.filter, window.stride
    out_channels = out.shape[-1]
    values = np.add(x, params.input_offset, dtype=np.float64).reshape(-1, x.shape[-1])
    contributions = (values @ params.weights).reshape(batch, height, width, kh, kw, out_channels)
    plane = np.zeros((batch, *window.plane, out_channels))
    for ky, kx in np.ndindex(kh, kw):
        rows = slice(ky, ky + (height - 1) * stride_h + 1, stride_h)
        cols = slice(kx, kx + (width - 1) * stride_w + 1, stride_w)
        plane[:, rows, cols, :] += contributions[:, :, :, ky, kx, :]
    top, left = window.padding
    acc = plane[:, top:top + out.shape[1], left:left + out.shape[2], :]
    _finish(acc, params.bias, params.output, out)


KERNELS: dict = {
    "CONV_2D": conv_2d,
    "DEPTHWISE_CONV_2D": depthwise_conv_2d,
    "TRANSPOSE_CONV": transpose_conv,
}
