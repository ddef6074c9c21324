"""Params for the pooling family: AVERAGE_POOL_2D and MAX_POOL_2D on NHWC tensors.

Follows TFLite's reference kernels (tflite/kernels/pooling.cc, reference/pooling.h and
reference/integer_ops/pooling.h): windows are clipped to the input, so padding never takes part;
an average divides by the number of in-bounds elements of its window.

C emission.

C emitters for AVERAGE_POOL_2D and MAX_POOL_2D (NHWC), from the same params as runtime_py.

What differs between the two ops and the two dtypes is C text from here: the accumulator's
start, the statement adding a window element to it and the statements turning it into the
output element. A window's bounds along an axis are constants when the output has one position
along it (a global pool), else computed at run time from the output position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.numerics.quant import (
    ACTIVATION_FLOAT_RANGE,
    INT_RANGES,
    activation_range_float,
    activation_range_quantized,
    scale_of,
    zero_point_of,
)
from toolchain.ops import overlaps
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    RuntimeLoop,
    c_comment,
    c_float,
    c_offset,
    c_pointer,
    c_sum,
    render_macro,
)
from toolchain.ops.padding import fused_padding
from toolchain.ops.spec import (
    INT32_MAX,
    MAX_PLANE_ELEMENTS,
    MemoryRequest,
    OpSpec,
    kernels,
    required_input,
    required_options,
)

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
    covers, the divisor of an average (TFLite counts them per window).
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
    the arena during the op's step, not a stack array."""
    return (MemoryRequest(ACCUMULATOR_BYTES * p.channels, "one accumulator per channel"),)


def _require_same_quantization(x: Tensor, out: Tensor) -> None:
    """Quantized pooling never rescales: TFLite requires the output to keep the input's scale."""
    if x.quantization is None or out.quantization is None:
        raise UnsupportedOpError(f"{x.dtype} pooling without quantization parameters")
    if (abs(scale_of(x) - scale_of(out)) > SCALE_TOLERANCE
            or zero_point_of(x) != zero_point_of(out)):
        raise UnsupportedOpError(
            f"{x.dtype} pooling whose output quantization differs from its input's")




TEMPLATE = "c/pooling.c.j2"
# TFLite's float max pool starts from the lowest finite float and keeps the running maximum
# unless an element is strictly greater: NaN never wins, and a window of -inf gives -FLT_MAX.
FLOAT_LOWEST = c_float(-np.finfo(np.float32).max)


@dataclass(frozen=True)
class WindowAxis:
    """The window along one axis: the lines computing its bounds (none when constant), its
    loop, the input index of its position as (terms, constant), and the count of positions
    (C text)."""

    lines: list[str]
    loop: ConstantLoop | RuntimeLoop
    index: tuple[list, int]
    count: int | str


def window_axis(axis: str, out: ConstantLoop, stride: int, pad: int, size: int,
                window: int) -> WindowAxis:
    origin, var = f"{axis}0", f"f{axis}"
    if out.written:
        lines = [f"const int {origin} = {c_sum([(out, stride)], -pad)};",
                 f"const int {var}_start = {origin} < 0 ? -{origin} : 0;",
                 f"const int {var}_end = {size} - {origin} < {window} ? {size} - {origin} : "
                 f"{window};"]
        loop = RuntimeLoop(var, f"{var}_start", f"{var}_end")
        return WindowAxis(lines, loop, ([(origin, 1), (var, 1)], 0), f"({var}_end - {var}_start)")
    first = out.start * stride - pad
    loop = ConstantLoop(var, min(size - first, window), max(-first, 0))
    return WindowAxis([], loop, ([(loop, 1)], first), loop.trips)


def window_count(counts: list[int | str]) -> int | str:
    """The product of the axes' counts: a number when all are constant, else C text."""
    if all(isinstance(c, int) for c in counts):
        return int(np.prod(counts))
    return " * ".join(str(c) for c in counts if c != 1)


def _arithmetic(kind: str, dtype: str, ctype: str, low: str, high: str, c: str, o: str,
                count: int | str) -> dict:
    """The accumulator's type and start, the update from `row[c]` and the statements storing
    `o[c]`, for channel index `c` and a window of `count` elements."""
    is_float = dtype == "float32"
    constant = isinstance(count, int)
    if is_float:
        divisor = f"{count}.0f" if constant else "(float)count"
        value = f"acc[{c}] / {divisor}" if kind == "average" else f"acc[{c}]"
        finish = [f"{o}[{c}] = arenac_clampf({value}, {low}, {high});"]
    elif kind == "average" and INT_RANGES[dtype][0] >= 0:  # a sum that cannot be negative
        half, divisor = (count // 2, count) if constant else ("count / 2", "count")
        finish = [f"const int32_t avg = (acc[{c}] + {half}) / {divisor};",
                  f"{o}[{c}] = ({ctype})arenac_clamp(avg, {low}, {high});"]
    elif kind == "average":
        half, divisor = (count // 2, count) if constant else ("count / 2", "count")
        finish = [f"const int32_t avg = acc[{c}] > 0 ? (acc[{c}] + {half}) / {divisor} "
                  f": (acc[{c}] - {half}) / {divisor};",
                  f"{o}[{c}] = ({ctype})arenac_clamp(avg, {low}, {high});"]
    else:
        finish = [f"{o}[{c}] = ({ctype})arenac_clamp(acc[{c}], {low}, {high});"]
    if kind == "average":
        init, accumulate = "0", f"acc[{c}] += row[{c}];"
    else:
        init = FLOAT_LOWEST if is_float else str(INT_RANGES[dtype][0])
        accumulate = f"acc[{c}] = row[{c}] > acc[{c}] ? row[{c}] : acc[{c}];"
    # an average divides by the count of in-bounds window elements
    count_lines = [] if kind != "average" or constant else [f"const int count = {count};"]
    return {"acc_type": "float" if is_float else "int32_t", "init": init,
            "accumulate": accumulate, "finish": finish, "count_lines": count_lines}


def pool_values(ctx: OpContext, kind: str) -> dict:
    p: Pool2DParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    batch_size, height, width, channels = x.shape
    is_float = x.dtype == "float32"
    low, high = ((c_float(p.activation_min), c_float(p.activation_max)) if is_float
                 else (str(int(p.activation_min)), str(int(p.activation_max))))
    batch, out_y, out_x = (ConstantLoop("b", batch_size), ConstantLoop("oy", p.output_height),
                           ConstantLoop("ox", p.output_width))
    channel = ConstantLoop("c", channels)
    wy = window_axis("y", out_y, p.stride_height, p.pad_top, height, p.filter_height)
    wx = window_axis("x", out_x, p.stride_width, p.pad_left, width, p.filter_width)
    (y_terms, y_first), (x_terms, x_first) = wy.index, wx.index
    # input element (b, y, x, 0) of the window's position
    row = c_offset("x", [(batch, height * width * channels),
                         *[(t, c * width * channels) for t, c in y_terms],
                         *[(t, c * channels) for t, c in x_terms]],
                   (y_first * width + x_first) * channels)
    o, o_lines = c_pointer("o", x.ctype, "out",
                           [(batch, p.output_height * p.output_width * channels),
                            (out_y, p.output_width * channels), (out_x, channels)])
    arithmetic = _arithmetic(kind, x.dtype, x.ctype, low, high, channel.index, o,
                             window_count([wy.count, wx.count]))
    loops = (batch, out_y, out_x, wy.loop, wx.loop, channel)
    return {
        **arithmetic,
        "fn": ctx.fn,
        "ctype": x.ctype,
        "x": x.ptr,
        "out": out.ptr,
        "batch": batch, "out_y": out_y, "out_x": out_x, "channel": channel,
        "window_y": wy.loop, "window_x": wx.loop,
        "y_lines": wy.lines, "x_lines": wx.lines,
        "pixel_lines": arithmetic["count_lines"] + o_lines,
        "row": row,
        "counters": ", ".join(loop.var for loop in loops if loop.written),
        "comment": c_comment(f"{ctx.op.opcode} '{out.name}'"),
        # one accumulator per channel, in the arena scratch this op's binding requested
        "acc": f"({arithmetic['acc_type']} *){ctx.scratch[0]}",
    }


def emit_average(ctx: OpContext) -> Kernel:
    return Kernel(render_macro(TEMPLATE, "pool", pool_values(ctx, "average")))


def emit_max(ctx: OpContext) -> Kernel:
    return Kernel(render_macro(TEMPLATE, "pool", pool_values(ctx, "max")))


_POOLING = kernels("T -> T", T=("float32", *QUANTIZED))

SPECS: tuple[OpSpec, ...] = (
    OpSpec("AVERAGE_POOL_2D", _POOLING, prepare_pool_2d, emit_average, scratch=pool_scratch,
           overlaps=overlaps.pooling),
    OpSpec("MAX_POOL_2D", _POOLING, prepare_pool_2d, emit_max, scratch=pool_scratch,
           overlaps=overlaps.pooling),
)
