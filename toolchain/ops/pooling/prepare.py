"""Params for the pooling family: AVERAGE_POOL_2D and MAX_POOL_2D on NHWC tensors.

Follows TFLite's reference kernels (tflite/kernels/pooling.cc, reference/pooling.h and
reference/integer_ops/pooling.h): windows are clipped to the input, so padding never takes part;
an average divides by the number of in-bounds elements of its window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import INT32_MAX, Graph, Operator, Tensor
from toolchain.numerics.quant import (
    ACTIVATION_FLOAT_RANGE,
    activation_range_float,
    activation_range_quantized,
    scale_of,
    zero_point_of,
)
from toolchain.ops.padding import fused_padding
from toolchain.ops.spec import MAX_PLANE_ELEMENTS, MemoryRequest, required_input, required_options
from toolchain.ops.striping import Reduction, RowMap, Striping

# TFLite requires int8 pooling to keep the input's quantization (to this tolerance on the scale).
SCALE_TOLERANCE = 1e-6
# Most input positions all windows together may cover: runtime_py sums every window in full.
# (A convolution's work is bounded by its filter, which the file holds; a pooling window is
# only two numbers in the options.)
MAX_WINDOW_TAPS = 2**30


@dataclass(frozen=True)
class Pool2DParams:
    """Window geometry and the fused activation's clamp (in output integers for int8).

    `pad_top` / `pad_left` are TFLite's padding values: window (oy, ox) starts at input row
    oy * stride_height - pad_top. `window_counts[oy, ox]` is how many input positions that window
    covers, the divisor of an average (TFLite counts them per window). A band of a global pool
    that ends a striped segment has a `reduction`: it adds its rows to the accumulators
    (toolchain.ops.striping).
    """

    filter_height: int
    filter_width: int
    stride_height: int
    stride_width: int
    pad_top: int
    pad_left: int
    output_height: int
    output_width: int
    window_counts: np.ndarray
    activation_min: float | int
    activation_max: float | int
    channels: int
    reduction: Reduction | None = None


def output_size(padding: str, size: int, window: int, stride: int) -> int:
    """ComputeOutSize: SAME covers every input position, VALID only whole windows."""
    if padding == "SAME":
        return (size + stride - 1) // stride
    return (size + stride - window) // stride


def leading_padding(size: int, window: int, stride: int, out: int) -> int:
    """ComputePaddingWithOffset: half the total padding, the smaller half before the input."""
    return max((out - 1) * stride + window - size, 0) // 2


def covered(size: int, window: int, stride: int, pad: int, out: int) -> np.ndarray:
    """Per output position along one axis: how many window positions fall inside the input."""
    start = np.arange(out) * stride - pad
    return np.minimum(start + window, size) - np.maximum(start, 0)


def prepare_pool_2d(graph: Graph, op: Operator) -> Pool2DParams:
    x, out = required_input(graph, op, 0, "input"), graph.tensors[op.outputs[0]]
    if len(x.shape) != 4:
        raise UnsupportedOpError(f"input of rank {len(x.shape)} (must be 4, NHWC)")
    if out.dtype != x.dtype:
        raise UnsupportedOpError(f"{x.dtype} input with {out.dtype} output")
    options = required_options(op, "padding", "filter_height", "filter_width", "stride_h",
                               "stride_w")
    padding = options["padding"]
    activation = options.get("fused_activation_function", "NONE")
    if padding not in ("SAME", "VALID"):
        raise UnsupportedOpError(f"padding {padding}")
    if activation not in ACTIVATION_FLOAT_RANGE:
        raise UnsupportedOpError(f"fused activation {activation}")
    fh, fw = options["filter_height"], options["filter_width"]
    sh, sw = options["stride_h"], options["stride_w"]
    if min(fh, fw, sh, sw) <= 0:
        raise ModelError(f"filter {fh}x{fw} with strides {sh}x{sw} (each must be positive)")
    batch, height, width, channels = x.shape
    (top, bottom), (left, right) = fused_padding(op)  # a fused PAD's (toolchain/ops/padding.py)
    padded_h, padded_w = height + top + bottom, width + left + right
    for n, f, s in ((padded_h, fh, sh), (padded_w, fw, sw)):
        if (n - 1) * s + f + n > INT32_MAX:
            raise UnsupportedOpError(
                f"a {f}-wide window with stride {s} over {n} pixels reaches beyond 32-bit indices")
    oh, ow = output_size(padding, padded_h, fh, sh), output_size(padding, padded_w, fw, sw)
    expected = (batch, oh, ow, channels)
    if oh <= 0 or ow <= 0 or out.shape != expected:
        raise UnsupportedOpError(f"output shape {out.shape}, TFLite computes {expected}")
    plane = batch * (max(padded_h, (oh - 1) * sh + fh) * max(padded_w, (ow - 1) * sw + fw)) \
        * channels
    taps = batch * oh * ow * channels * fh * fw
    if plane > MAX_PLANE_ELEMENTS or taps > MAX_WINDOW_TAPS:
        raise UnsupportedOpError(
            f"{fh}x{fw} windows with strides {sh}x{sw} over {list(x.shape)}: a padded plane of "
            f"{plane} elements and {taps} taps (at most {MAX_PLANE_ELEMENTS} and "
            f"{MAX_WINDOW_TAPS})")
    top += leading_padding(padded_h, fh, sh, oh)
    left += leading_padding(padded_w, fw, sw, ow)
    counts = np.outer(covered(height, fh, sh, top, oh), covered(width, fw, sw, left, ow))
    counts.setflags(write=False)
    if x.dtype in QUANTIZED:
        _require_same_quantization(x, out)
        low, high = activation_range_quantized(activation, out)
    else:
        low, high = activation_range_float(activation)
    return Pool2DParams(fh, fw, sh, sw, top, left, oh, ow, counts, low, high, x.shape[3])


ACCUMULATOR_BYTES = 4  # int32 for int8, uint8 and int16 data, float for float32
QUANTIZED = ("int8", "uint8", "int16")


def pool_scratch(p: Pool2DParams) -> tuple[MemoryRequest, ...]:
    """The C kernel keeps one accumulator per channel for the window it is reducing: a row of
    the arena during the op's step, not a stack array. A band of a global pool keeps them after
    its input's stripe rows instead, as they must outlast the segment's other kernels."""
    if p.reduction is not None:
        return ()
    return (MemoryRequest(ACCUMULATOR_BYTES * p.channels, "one accumulator per channel"),)


def _require_same_quantization(x: Tensor, out: Tensor) -> None:
    """Quantized pooling never rescales: TFLite requires the output to keep the input's scale."""
    if x.quantization is None or out.quantization is None:
        raise UnsupportedOpError(f"{x.dtype} pooling without quantization parameters")
    if (abs(scale_of(x) - scale_of(out)) > SCALE_TOLERANCE
            or zero_point_of(x) != zero_point_of(out)):
        raise UnsupportedOpError(
            f"{x.dtype} pooling whose output quantization differs from its input's")


# -- by bands of output rows (toolchain.ops.striping) and with a fused PAD ----------------------


def pool_rows(p: Pool2DParams) -> RowMap:
    return RowMap(p.filter_height, p.stride_height, 1, p.pad_top, -1)


def pool_band(p: Pool2DParams, out_lo: int, out_hi: int, in_lo: int, in_hi: int) -> Pool2DParams:
    """The pooling of output rows [out_lo, out_hi) from input rows [in_lo, in_hi); of a global
    pool (its one output row only ever ends a segment, pool_accumulates), input rows [in_lo,
    in_hi) added up, the output written when the band has it."""
    if p.output_height == 1:
        return replace(p, reduction=Reduction(in_lo == 0, out_hi > out_lo, in_hi - in_lo))
    return replace(p, pad_top=in_lo - (out_lo * p.stride_height - p.pad_top),
                   output_height=out_hi - out_lo, window_counts=p.window_counts[out_lo:out_hi])


def pool_columns(p: Pool2DParams) -> RowMap:
    """How output columns read input columns (the width filled in by the tiler)."""
    return RowMap(p.filter_width, p.stride_width, 1, p.pad_left, -1)


def pool_column_band(p: Pool2DParams, out_lo: int, out_hi: int, in_lo: int,
                     in_hi: int) -> Pool2DParams:
    """The pooling of output columns [out_lo, out_hi) from input columns [in_lo, in_hi)."""
    return replace(p, pad_left=in_lo - (out_lo * p.stride_width - p.pad_left),
                   output_width=out_hi - out_lo, window_counts=p.window_counts[:, out_lo:out_hi])


def pool_band_key(p: Pool2DParams) -> tuple:
    return (p.pad_top, p.output_height, p.pad_left, p.output_width, p.window_counts.tobytes(),
            p.reduction)


def pool_accumulates(p: Pool2DParams, shape: tuple[int, ...]) -> int:
    """A global pool (one window over the whole input) adds its input up row by row, in one
    accumulator per channel."""
    _, height, width, _ = shape
    whole = (p.output_height == p.output_width == 1 and p.pad_top == p.pad_left == 0
             and p.filter_height >= height and p.filter_width >= width)
    return ACCUMULATOR_BYTES * p.channels if whole else 0


POOL_STRIPING = Striping(pool_rows, pool_band, pool_band_key, columns=pool_columns,
                         column_band=pool_column_band, accumulates=pool_accumulates)


def pads_below_the_maximum(x: Tensor, value: float, op: Operator, graph: Graph) -> str:
    """A maximum starts at the dtype's lowest value: a PAD fused into it must write that or
    less, "" when it does, else why not."""
    dtype = np.dtype(x.dtype)
    lowest = np.finfo(dtype).min if dtype.kind == "f" else np.iinfo(dtype).min
    if not value <= lowest:
        return f"it pads with {value}, which can exceed the input (fused, a window skips it)"
    return ""


def pads_the_count(x: Tensor, value: float, op: Operator, graph: Graph) -> str:
    """An average's divisor counts its window's elements inside the image: never fused."""
    return ("an average divides by its window's elements inside the image, which would then "
            "leave out the PAD's")


def pool_axes(p: Pool2DParams) -> tuple[tuple[int, int, int, int], ...]:
    """Per axis (height, width): outputs, the window's extent, the padding before, stride."""
    return ((p.output_height, p.filter_height, p.pad_top, p.stride_height),
            (p.output_width, p.filter_width, p.pad_left, p.stride_width))
