"""C emitters for AVERAGE_POOL_2D, MAX_POOL_2D and L2_POOL_2D (NHWC), from the same params as
runtime_py.

What differs between the ops and the two dtypes is C text from here: the accumulator's
start, the statement adding a window element to it and the statements turning it into the
output element. A window's bounds along an axis are constants when the output has one position
along it (a global pool), else computed at run time from the output position. A global pool's
band of a striped segment (Pool2DParams.reduction) adds its rows to accumulators that outlast
it: only the first band starts them and only the last writes the output, from the whole
window's count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolchain.numerics.quant import INT_RANGES
from toolchain.ops.emit import (
    MATH_H,
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
from toolchain.ops.pooling.prepare import Pool2DParams

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
        value = {"average": f"acc[{c}] / {divisor}", "l2": f"sqrtf(acc[{c}] / {divisor})",
                 "max": f"acc[{c}]"}[kind]
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
    elif kind == "l2":  # the square, then the sum: two roundings, as TFLite's
        init, accumulate = "0", f"acc[{c}] += row[{c}] * row[{c}];"
    else:
        init = FLOAT_LOWEST if is_float else str(INT_RANGES[dtype][0])
        accumulate = f"acc[{c}] = row[{c}] > acc[{c}] ? row[{c}] : acc[{c}];"
    # an average (and L2's mean square) divides by the count of in-bounds window elements
    count_lines = [] if kind == "max" or constant else [f"const int count = {count};"]
    return {"acc_type": "float" if is_float else "int32_t", "init": init,
            "accumulate": accumulate, "finish": finish, "count_lines": count_lines,
            "helpers": () if is_float else ("clamp",)}


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
    reduction = p.reduction
    count = (int(p.window_counts[0, 0]) if reduction is not None
             else window_count([wy.count, wx.count]))
    arithmetic = _arithmetic(kind, x.dtype, x.ctype, low, high, channel.index, o, count)
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
        "starts": reduction is None or reduction.starts,
        "finishes": reduction is None or reduction.finishes,
        "comment": c_comment(f"{ctx.op.opcode} '{out.name}'"),
        # one accumulator per channel, in the arena scratch this op's binding requested (a
        # band's: after its input's stripe rows)
        "acc": f"({arithmetic['acc_type']} *){ctx.scratch[0]}",
    }


def _pool(ctx: OpContext, kind: str, includes: tuple[str, ...] = ()) -> Kernel:
    values = pool_values(ctx, kind)
    return Kernel(render_macro(TEMPLATE, "pool", values), values["helpers"], includes=includes)


def emit_average(ctx: OpContext) -> Kernel:
    return _pool(ctx, "average")


def emit_max(ctx: OpContext) -> Kernel:
    return _pool(ctx, "max")


def emit_l2(ctx: OpContext) -> Kernel:
    """L2_POOL_2D (float32): the square root of the window's mean square."""
    return _pool(ctx, "l2", includes=(MATH_H,))
