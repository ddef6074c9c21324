"""AVERAGE_POOL_2D and MAX_POOL_2D (int8, channels a multiple of four) for the Arm cores with
the DSP extension (cortex-m4, cortex-m7 and cortex-m33): four channels a word, see `emit_pool`.
"""

from __future__ import annotations

import re

from toolchain.ir import Graph, Operator
from toolchain.ops import overlaps
from toolchain.ops.arm_dsp_common import DSP_TARGETS, GROUP, TEMPLATE
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_comment,
    c_offset,
    c_pointer,
    c_sum,
    render_macro,
)
from toolchain.ops.pooling.emit import emit_average, emit_max, window_axis, window_count
from toolchain.ops.pooling.prepare import Pool2DParams
from toolchain.ops.spec import TargetKernel, kernels

MAX_AVERAGE_TAPS = 256  # an int16 lane holds the sum of this many int8 values
MAX_WRITTEN_COLUMNS = 8  # a window row of at most this many columns is written out


def accepts_pool(graph: Graph, op: Operator, p) -> str | None:
    if not isinstance(p, Pool2DParams) or graph.tensors[op.inputs[0]].dtype != "int8":
        return "not an int8 pooling"
    if p.channels % GROUP:
        return "channels not a multiple of four"
    if op.opcode == "AVERAGE_POOL_2D" and p.filter_height * p.filter_width > MAX_AVERAGE_TAPS:
        return f"a window of more than {MAX_AVERAGE_TAPS} values"
    return None


def emit_pool(ctx: OpContext) -> Kernel:
    """Four channels a word, output pixel by output pixel: their window read a word per
    position into registers, an average's sums in int16 lanes (__sxtab16: bytes 0 and 2, and
    1 and 3), a maximum per byte lane (SSUB8 then SEL); then the reference's rounding of the
    average (halves away from zero) and the activation's clamp, per channel. A global pool's
    band of a striped segment adds its rows to the segment's accumulators as the portable
    kernel does (its int16 lanes would not outlast the band)."""
    p: Pool2DParams = ctx.params
    if p.reduction is not None:
        return (emit_average if ctx.op.opcode == "AVERAGE_POOL_2D" else emit_max)(ctx)
    x, out = ctx.inputs[0], ctx.outputs[0]
    batch_size, height, width, channels = x.shape
    average = ctx.op.opcode == "AVERAGE_POOL_2D"
    batch, out_y, out_x = (ConstantLoop("b", batch_size), ConstantLoop("oy", p.output_height),
                           ConstantLoop("ox", p.output_width))
    group = ConstantLoop("c", channels, 0, GROUP)
    wy = window_axis("y", out_y, p.stride_height, p.pad_top, height, p.filter_height)
    wx = window_axis("x", out_x, p.stride_width, p.pad_left, width, p.filter_width)
    (y_terms, y_first), (x_terms, x_first) = wy.index, wx.index

    def row_at(column: ConstantLoop | None = None) -> str:
        """The window position's word: at column `column` (a one-trip loop) of a window row
        written out, else at the window loop's."""
        terms = [(column if column is not None and t is wx.loop else t, c) for t, c in x_terms]
        return c_offset("x", [(batch, height * width * channels),
                              *[(t, c * width * channels) for t, c in y_terms],
                              *[(t, c * channels) for t, c in terms], (group, 1)],
                        (y_first * width + x_first) * channels)

    row = row_at()
    o, o_lines = c_pointer("o", "int8_t", "out",
                           [(batch, p.output_height * p.output_width * channels),
                            (out_y, p.output_width * channels), (out_x, channels)])
    low, high = int(p.activation_min), int(p.activation_max)
    count = window_count([wy.count, wx.count])
    if average:
        half, divisor = (count // 2, count) if isinstance(count, int) else ("count / 2", "count")
        init = ["int32_t even = 0, odd = 0; /* the sums of channels c, c + 2 and c + 1, c + 3 */"]
        accumulate = ["even = __sxtab16(even, v);", "odd = arenac_sxtab16_ror8(odd, v);"]
        lanes = ["((even & 0xFFFF) ^ 0x8000) - 0x8000", "((odd & 0xFFFF) ^ 0x8000) - 0x8000",
                 "even >> 16", "odd >> 16"]
        finish = [f"const int32_t s{j} = {lane};" for j, lane in enumerate(lanes)]
        finish += [f"const int32_t a{j} = s{j} > 0 ? (s{j} + {half}) / {divisor} : "
                   f"(s{j} - {half}) / {divisor};" for j in range(GROUP)]
        finish += [f"{o}[{c_sum([(group, 1)], j)}] = (int8_t)arenac_clamp(a{j}, {low}, {high});"
                   for j in range(GROUP)]
        count_lines = [] if isinstance(count, int) else [f"const int count = {count};"]
    else:
        init = ["int32_t m = (int32_t)0x80808080u; /* four int8 lanes, each its channel's */"]
        accumulate = ["m = arenac_max8(m, v);"]
        finish = [*([f"m = arenac_max8(m, {_lanes(low)});"] if low > -128 else []),
                  *([f"m = arenac_min8(m, {_lanes(high)});"] if high < 127 else []),
                  f"memcpy({o} + {group.index}, &m, 4);"]
        count_lines = []
    # a window row of a few constant columns written out: its words read in one run of
    # loads (one cycle each behind another), with no loop counter or branch between them
    taps = []
    if isinstance(wx.loop, ConstantLoop) and 1 < wx.loop.trips <= MAX_WRITTEN_COLUMNS:
        for k, fx in enumerate(range(wx.loop.start, wx.loop.stop)):
            column = ConstantLoop(wx.loop.var, fx + 1, fx)
            taps.append(f"const int32_t v{k} = arenac_load32({row_at(column)});")
        taps += [re.sub(r"\bv\b", f"v{k}", line)
                 for k in range(wx.loop.trips) for line in accumulate]
    loops = (batch, out_y, out_x, wy.loop, *([] if taps else [wx.loop]), group)
    values = {
        "fn": ctx.fn, "x": x.ptr, "out": out.ptr, "batch": batch, "out_y": out_y,
        "out_x": out_x, "group": group, "window_y": wy.loop, "window_x": wx.loop,
        "y_lines": wy.lines, "x_lines": wx.lines, "pixel_lines": count_lines + o_lines,
        "row": row, "taps": taps, "init": init, "accumulate": accumulate, "finish": finish,
        "counters": ", ".join(loop.var for loop in loops if loop.written),
        "comment": c_comment(
            f"{ctx.op.opcode} '{out.name}' for the Arm DSP extension: four channels a word, "
            + ("their sums in int16 lanes (__sxtab16), then each divided as the reference "
               "does (halves away from zero)" if average else
               "their maxima per byte lane (SSUB8 and SEL)")
            + ", the activation's clamp")}
    helpers = ("arm_dsp", "arm_dsp_sxtab16", "clamp") if average else ("arm_dsp", "arm_dsp_max8")
    return Kernel(render_macro(TEMPLATE, "pool", values), helpers, includes=("arm_acle.h",))


def _lanes(value: int) -> str:
    """An int8 value in each byte of a word, as C."""
    return f"(int32_t)0x{(value & 0xFF) * 0x01010101:08X}u"


# the window's order of reads and the output pixel's writes as the portable kernel's
TARGET_KERNELS: tuple[TargetKernel, ...] = (
    TargetKernel("AVERAGE_POOL_2D", "dsp", kernels("int8 -> int8", targets=DSP_TARGETS),
                 accepts_pool, emit_pool, overlaps=overlaps.pooling),
    TargetKernel("MAX_POOL_2D", "dsp", kernels("int8 -> int8", targets=DSP_TARGETS),
                 accepts_pool, emit_pool, overlaps=overlaps.pooling),
)
