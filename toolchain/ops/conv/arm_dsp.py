"""The convolutions' kernels for the Arm cores with the DSP extension (cortex-m4, cortex-m7 and
cortex-m33), from the params of the portable ones (prepare.py); the matrix multiply and the
output stage they share with FULLY_CONNECTED are toolchain/ops/arm_dsp_common.py's.

CONV_2D with a 1x1 filter, any stride (int8): the pointwise matrix multiply (`conv_matmul`). Its
write order differs from the portable convolution's: all the output channels of a block's pixels
after all of the block's inputs were read. `pointwise_overlaps` declares what that order makes
safe.

A stride-1 1x1 CONV_2D of a small input (`staged`): the whole input widened first, then channel
pair by channel pair, three pixels a step, see `emit_staged`.

General convolution (int8 CONV_2D of any filter and stride, no dilation, and a
DEPTHWISE_CONV_2D of one input channel): see `Im2col`; each pixel's window becomes the
pointwise kernel's widened inputs, the rest is the pointwise matrix multiply.

Depthwise (int8 DEPTHWISE_CONV_2D, depth multiplier 1, no dilation, any filter and stride,
SAME or VALID): see `Depthwise`. The input rows are widened to int16 into filter-height
slots of the scratch, channel-planar, the padding filled with the input zero point so that the
folded sums hold on every window; two adjacent taps of a channel are then one word and one
__smlad, the filter packed as int16 pairs at generation time and kept in registers along an
output row; at stride 1 two adjacent output pixels share the words they read. Same sums, same
requantization (`conv_output`), and the portable convolution's row overlap rule, which its
order keeps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeVar

import numpy as np

from toolchain.ir import INT32_MAX, INT32_MIN, Graph, Operator
from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier, wrap_int32
from toolchain.numerics.rounding import shared_roundings, single_roundings
from toolchain.ops import overlaps
from toolchain.ops.arm_dsp_common import (
    DSP_TARGETS,
    GROUP,
    IN_ORDER_TARGETS,
    TEMPLATE,
    UNROLLED,
    WIDE_FILTER_PIXELS,
    WORD,
    Matmul,
    OutputStage,
    accumulator_lines,
    accumulator_ranges,
    block_stores,
    channel_record,
    depth_steps,
    kernel_attribute,
    kernel_definitions,
    mac16_helper,
    matmul_values,
    output_helpers,
    output_values,
    parted,
    plus_term,
    pointwise_scratch,
    pointwise_values,
    record_pointer,
    runs_attribute,
    runs_helpers,
    store_order,
    sum_of,
    widen_helper,
    with_attribute_helpers,
)
from toolchain.ops.conv.prepare import ConvParams, DepthwiseConvParams, Requantize
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_length,
    c_offset,
    c_sum,
    definition,
    render_macro,
    written_vars,
)
from toolchain.ops.overlaps import OverlapRule
from toolchain.ops.spec import MemoryRequest, TargetKernel, kernels

UNROLLED_PIXELS = 24  # a depthwise output row at most this wide is written out, pair by pair
# Channels whose widened rows the depthwise kernel keeps at a time: the scratch is the rows of
# this many channels, not of all, for a few more loop trips (each group's rows are widened once,
# as all channels' were; 8 would save more arena for 1-3% more cycles on the shared models).
MAX_GROUP_CHANNELS = 16
# The group of dsp-depthwise-narrow, the kernel a plan held to an arena steps down to: a quarter
# of the scratch for a few percent more of the op's cycles.
NARROW_GROUP_CHANNELS = 4


def conv_matmul(p: ConvParams) -> Matmul:
    batch, height, width, depth = p.input_shape
    _, out_h, out_w, channels = p.output_shape
    stride_h, stride_w = p.window.stride
    weights = np.asarray(p.weights[0], np.float64).T.astype(np.int64)  # [channels, depth]
    bias = np.asarray(p.bias, np.float64).astype(np.int64)
    if stride_h == 1 and stride_w == 1:  # every pixel in turn, as one row
        return Matmul(1, 1, batch * out_h * out_w, 0, 0, depth, depth, channels, weights, bias,
                      p.input_offset)
    return Matmul(batch, out_h, out_w, height * width * depth, stride_h * width * depth,
                  stride_w * depth, depth, channels, weights, bias, p.input_offset)


def accepts_conv(graph: Graph, op: Operator, p) -> str | None:
    if not isinstance(p, ConvParams) or not isinstance(p.output, Requantize):
        return "not an int8 convolution"
    if p.output.dtype != "int8" or graph.tensors[op.inputs[0]].dtype != "int8":
        return "not an int8 convolution"
    if p.groups != 1:
        return "a grouped convolution"
    if p.window.filter != (1, 1) or p.window.padding != (0, 0):
        return "not a 1x1 filter"
    batch, height, width, _ = p.input_shape
    _, out_h, out_w, _ = p.output_shape
    stride_h, stride_w = p.window.stride
    if (out_h - 1) * stride_h >= height or (out_w - 1) * stride_w >= width or batch < 1:
        return "an output pixel outside the input"
    return None


def pointwise_overlaps(graph: Graph, op: Operator, p: ConvParams) -> list[OverlapRule]:
    """The output may start `shift` bytes below the input: after each block of pixels the
    kernel has written the outputs of every pixel up to it, and later reads only the inputs of
    the pixels after it, from the next one's first input byte on (int8: bytes are elements);
    the most any DSP core's blocks need."""
    m = conv_matmul(p)
    shift = 0
    for size in {m.block_on(target) for target in DSP_TARGETS}:
        for (first, count), (following, _) in pairwise(m.blocks(size)):
            shift = max(shift, (first + count) * m.channels - m.input_at(following))
    return [OverlapRule(0, 0, shift, kind="windowed")]


def conv_output(m: Matmul, stage: Requantize) -> OutputStage:
    zp = stage.output_zero_point
    low, high = stage.clamp[0] - zp, stage.clamp[1] - zp
    multipliers = [int(v) for v in stage.multipliers.tolist()]
    shifts = [int(v) for v in stage.shifts.tolist()]
    if len(multipliers) == 1:
        multipliers, shifts = multipliers * m.channels, shifts * m.channels
    mult = np.asarray(multipliers, np.int64)[:, None]
    exp = np.asarray(shifts, np.int64)[:, None]
    acc_lo, acc_hi = m.accumulators()

    def reference(acc: np.ndarray) -> np.ndarray:
        return multiply_by_quantized_multiplier(acc, mult, exp)

    single = shared_roundings(reference, low, high, acc_lo, acc_hi,
                              [mu * 2.0 ** (s - 31) for mu, s in zip(multipliers, shifts,
                                                                     strict=True)])
    if (single is None and all(s <= 0 for s in shifts) and acc_lo.min() >= INT32_MIN
            and acc_hi.max() <= INT32_MAX):
        single = single_roundings(
            reference, low, high, acc_lo, acc_hi, multipliers,
            [31 + max(-s, 1 if mu == 0 else 0) for mu, s in zip(multipliers, shifts, strict=True)])
    return OutputStage(low, high, zp, tuple(single) if single else None, tuple(multipliers),
                       tuple(shifts), accumulators=accumulator_ranges(acc_lo, acc_hi))


def emit_conv(ctx: OpContext) -> Kernel:
    p: ConvParams = ctx.params
    m = conv_matmul(p)
    values = pointwise_values(ctx, m, conv_output(m, p.output),
                              f"CONV_2D '{ctx.outputs[0].name}' 1x1")
    return Kernel(render_macro(TEMPLATE, "pointwise", values), values["helpers"],
                  includes=("arm_acle.h",), definitions=kernel_definitions(values))


# -- CONV_2D 1x1 on a small input, channel pair by channel pair ------------------------------


MAX_STAGED_INPUT = 16 * 1024  # bytes of a staged kernel's widened input


def staged(m: Matmul) -> bool:
    """Whether a 1x1 convolution keeps its whole input widened (`emit_staged`): one image of
    contiguous pixels (stride 1), too few of them for the filter to be kept widened in flash,
    and a widened input of at most MAX_STAGED_INPUT bytes."""
    return (m.batches == 1 and m.rows == 1 and 4 <= m.pixels < WIDE_FILTER_PIXELS
            and m.pixels * m.groups * 8 <= MAX_STAGED_INPUT)


def accepts_staged(graph: Graph, op: Operator, p) -> str | None:
    reason = accepts_conv(graph, op, p)
    if reason is None and not staged(conv_matmul(p)):
        return "not a 1x1 convolution of a small input"
    return reason


def staged_scratch(p: ConvParams) -> tuple[MemoryRequest, ...]:
    m = conv_matmul(p)
    return (MemoryRequest(m.pixels * m.groups * 8,
                          f"the input's {m.pixels} pixels widened to int16 pairs"),
            MemoryRequest(2 * m.groups * 8,
                          "the filter rows of two output channels widened to int16 pairs"))


def staged_overlaps(graph: Graph, op: Operator, p: ConvParams) -> list[OverlapRule]:
    """The kernel reads the whole input (widening it) before it writes any output."""
    return [OverlapRule(0, 0, 0, any_offset=True, kind="windowed")]


def _staged_widening(m: Matmul, pixel_loops: tuple) -> list[dict]:
    """The whole input widened into the scratch, three pixels (then the last one or two) a
    step."""
    full, tail = divmod(m.depth, GROUP)
    words = m.groups * 2  # of one pixel, widened

    def widen(loop: ConstantLoop, count: int) -> list[str]:
        names = ", ".join(f"x{i}" for i in range(count))
        lines = [f"int32_t *pairs = {c_offset('input', [(loop, words)])};",
                 f"const int8_t *x0 = {c_offset('x', [(loop, m.depth)])};",
                 *(f"const int8_t *x{i} = x0 + {i * m.depth};" for i in range(1, count))]
        if full:
            lines.append(f"arenac_widen_{count}(pairs, {names}, {full});")
        lines += [f"arenac_widen4({c_offset('pairs', [], full * 2 * count + 2 * i)}, "
                  f"arenac_load_partial(x{i} + {full * GROUP}, {tail}));"
                  for i in range(count if tail else 0)]
        return lines

    return [{"loop": loop, "lines": widen(loop, count)}
            for loop, count in pixel_loops if loop.runs]


def _staged_blocks(prefix: str, m: Matmul, tables: list[dict], output: list[str],
                   pixel_loops: tuple, target: str, record: str | None
                   ) -> tuple[list[dict], set[str], list[ConstantLoop]]:
    """Channel pair by channel pair (then a last odd channel): the filter rows widened, then
    the steps of each block of pixels; the blocks, the steps' kinds and their loops. With a
    `record` (channel_record), each block reads its channels' sums and output constants
    through a pointer to their records that every block reads again (kc, ARENAC_KEEP):
    hoisted out of the loop over pixels, GCC kept them on the stack and reloaded them all
    for every block."""
    words = m.groups * 2
    blocks, kinds, step_loops = [], set(), []
    channel_pairs = ConstantLoop("c", m.channels - m.channels % 2, 0, 2)
    odd = ConstantLoop("c", m.channels, m.channels - m.channels % 2)
    for loop, width in ((channel_pairs, 2), (odd, 1)):
        if not loop.runs:
            continue
        rows = c_offset(f"{prefix}_filter", [(loop, m.groups * GROUP)])
        pixels = []
        for ploop, count in pixel_loops:
            if not ploop.runs:
                continue
            kind = f"{count}x{width}"
            kinds.add(kind)
            channels = [c_sum([(loop, 1)], j) for j in range(width)]
            sums = ([f"kc[{j}].sum" for j in range(width)] if record else
                    [sum_of(prefix, tables, c) for c in channels])
            kept = ([record_pointer(prefix, record, channels[0]),
                     "ARENAC_KEEP(kc);"] if record else [])
            out = c_offset("out", [(ploop, m.channels), (loop, 1)])
            steps = depth_steps(kind, m, True, target)
            step_loops += [steps["loop"]] if steps["loop"] else []
            outs = "".join(f", *o{i} = o{i - 1} + {m.channels}" for i in range(1, count))
            pixels.append({
                "loop": ploop, "steps": steps,
                "head": [f"const int32_t *pairs = {c_offset('input', [(ploop, words)])};",
                         f"int8_t *o0 = {out}{outs};", *kept,
                         *accumulator_lines(sums, count)],
                "stores": block_stores(prefix, output, [
                    (f"o{i}[{j}]", f"acc[{i * width + j}]",
                     f"kc{plus_term(j)}" if record else channels[j])
                    for i, j in store_order(tables, count, width)],
                    record is not None, target not in IN_ORDER_TARGETS)})
        blocks.append({"loop": loop, "pixels": pixels,
                       "head": [f"arenac_widen_1(w, {rows}, {width * m.groups});"]})
    return blocks, kinds, step_loops


def emit_staged(ctx: OpContext) -> Kernel:
    """The whole input widened into the scratch first, then channel pair by channel pair: the
    pair's filter rows widened into the scratch, and every three pixels a 3x2 step of int16
    words alone (arenac_mac16_3x2; a last one or two pixels a 2x2 or 1x2 step), as the filter
    kept widened in flash is read, without its flash."""
    p: ConvParams = ctx.params
    m = conv_matmul(p)
    prefix = ctx.prefix
    what = f"CONV_2D '{ctx.outputs[0].name}' 1x1"
    tables, output, output_comment, stage_calls = output_values(
        prefix, conv_output(m, p.output),
        (m.sums(), f"{what}: per output channel, bias + input offset * the filter row's sum "
                   "(int32, wrapped)"))
    parts = parted(output, ctx.target)  # the stages its stores part, if any
    full, tail = divmod(m.depth, GROUP)
    # three pixels a block (arenac_mac16_3x2), the last one or two pixels a block of their own
    triples, rest = m.pixels - m.pixels % 3, m.pixels % 3
    pixel_loops = ((ConstantLoop("p", triples, 0, 3), 3),
                   (ConstantLoop("p", m.pixels, triples, max(rest, 1)), rest))
    widening = _staged_widening(m, pixel_loops)
    record = channel_record(prefix, output)
    blocks, kinds, step_loops = _staged_blocks(prefix, m, tables, output if record else parts,
                                               pixel_loops, ctx.target, record)
    helpers = with_attribute_helpers(
        {"arm_dsp", widen_helper(1, ctx.target), *(mac16_helper(k, ctx.target) for k in kinds),
         *(widen_helper(count, ctx.target) for loop, count in pixel_loops
           if full and loop.runs),
         *(["arm_dsp_partial", "arm_dsp_widen4"] if tail else []),
         *output_helpers(tables, output) | stage_calls}, ctx.target)
    tables = [{"name": f"{prefix}_filter", "ctype": "int8_t", "align": "ARENAC_ALIGN(4) ",
               "length": c_length(m.packed().size), "data": c_array(m.packed()),
               "comment": c_comment(
                   f"{what}: the filter ({m.channels} x {m.depth}) in the order the loop reads "
                   "it: for each pair of output channels, their rows four weights at a time, "
                   f"alternating; each row padded with zeros to {m.groups * GROUP}")},
              *tables]
    values = {
        "parted": bool(parts), "record": record,
        "fn": ctx.fn, "prefix": prefix, "tables": tables, "output": output,
        "output_comment": c_comment(f"Output channel c from its sum: {output_comment}"),
        "x": ctx.inputs[0].ptr, "out": ctx.outputs[0].ptr, "input": ctx.scratch[0],
        "filter": ctx.scratch[1], "attribute": kernel_attribute(helpers, ctx.target),
        "widening": widening, "blocks": blocks,
        "counters": written_vars([loop for loop, _ in pixel_loops]
                                 + [b["loop"] for b in blocks] + step_loops),
        "comment": c_comment(
            f"{what} for the Arm DSP extension: a matrix multiply of {m.pixels} pixels of "
            f"{m.depth} values by {m.channels} filter rows, the whole input first widened to "
            "int16 pairs in the arena, then two output channels at a time: their filter rows "
            "widened into the arena, and three pixels by the two channels a step, each __smlad "
            "adding two products of int16 words read as they are")}
    return Kernel(render_macro(TEMPLATE, "pointwise_staged", values),
                  tuple(sorted(helpers)), includes=("arm_acle.h",),
                  definitions=kernel_definitions(values))


# -- CONV_2D through im2col -----------------------------------------------------------------


@dataclass(frozen=True)
class Convolution:
    """An int8 CONV_2D (or DEPTHWISE_CONV_2D of one input channel, whose depth multiplier is
    then the output channels) as a matrix multiply of its windows by its filter rows: `matmul`
    holds the filter [channels, kh * kw * depth] in (ky, kx, c) order, its folded sums and what
    proves the output stage. The kernels that run it so say how (Im2col, and Rows in
    arm_dsp_rows.py)."""

    batches: int
    height: int
    width: int
    depth: int
    out_h: int
    out_w: int
    kh: int
    kw: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    matmul: Matmul


ConvolutionKind = TypeVar("ConvolutionKind", bound=Convolution)


def convolution_of(p: ConvParams | DepthwiseConvParams,
                   kind: type[ConvolutionKind]) -> ConvolutionKind:
    """The convolution of a CONV_2D's params, or a DEPTHWISE_CONV_2D's of one input channel,
    as `kind`."""
    batch, height, width, depth = p.input_shape
    _, out_h, out_w, channels = p.output_shape
    kh, kw = p.window.filter
    # [channels, kh * kw * depth]; a depthwise filter of one channel is [1, taps, channels]
    weights = np.asarray(p.weights[0], np.float64).T.astype(np.int64)
    bias = np.asarray(p.bias, np.float64).astype(np.int64)
    m = Matmul(1, 1, batch * out_h * out_w, 0, 0, 0, kh * kw * depth, channels, weights, bias,
               p.input_offset)
    return kind(batch, height, width, depth, out_h, out_w, kh, kw, tuple(p.window.stride),
                tuple(p.window.padding), m)


@dataclass(frozen=True)
class Im2col(Convolution):
    """An int8 CONV_2D of any filter and stride (no dilation) as the DSP kernel runs it: output
    row by output row, a block of pixels at a time (`Matmul.block`), each pixel's window (`kh`
    rows of `kw` * `depth` values, in the filter's (ky, kx, c) order) copied into the scratch
    as int8, the padding the input zero point (whose product with the input offset added is 0,
    as the reference's skipped taps), then widened into the pairs the pointwise kernel's steps
    read. `matmul`: the
    windows times the filter rows, with its packed filter, folded sums and output stage."""

    @property
    def row(self) -> int:
        """Values of one filter row of the window: contiguous in the input."""
        return self.kw * self.depth

    @property
    def window(self) -> int:
        """Bytes of one pixel's window in the scratch, padded to whole groups."""
        return self.matmul.groups * GROUP

    def reaches_outside(self, axis: int) -> bool:
        """Whether some window reaches the padding along `axis` (0: rows, 1: columns)."""
        size, out, k = ((self.height, self.out_h, self.kh),
                        (self.width, self.out_w, self.kw))[axis]
        pad = self.padding[axis]
        return pad > 0 or (out - 1) * self.stride[axis] - pad + k > size


def im2col_of(p: ConvParams | DepthwiseConvParams) -> Im2col:
    return convolution_of(p, Im2col)


def accepts_im2col(graph: Graph, op: Operator, p) -> str | None:
    if not isinstance(p, ConvParams | DepthwiseConvParams) or not isinstance(p.output,
                                                                              Requantize):
        return "not an int8 convolution"
    if p.output.dtype != "int8" or graph.tensors[op.inputs[0]].dtype != "int8":
        return "not an int8 convolution"
    if isinstance(p, ConvParams) and p.groups != 1:
        return "a grouped convolution"
    if isinstance(p, DepthwiseConvParams) and p.input_shape[-1] != 1:
        return "a depthwise convolution of more than one input channel"
    if tuple(p.window.dilation) != (1, 1):
        return "a dilated filter"
    if p.input_shape[0] < 1 or min(p.output_shape) < 1:
        return "an empty tensor"
    return None


def widens_directly(d: Im2col) -> bool:
    """Whether a block's windows widen straight from the input, filter row by filter row (a
    filter row holds whole groups), only their rows outside the image copied first."""
    return d.row % GROUP == 0


def im2col_scratch(p: ConvParams | DepthwiseConvParams) -> tuple[MemoryRequest, ...]:
    """A block's windows widened (8 bytes per four values and pixel), and the int8 copies they
    widen from: the block's windows, or when they widen directly, one filter row of each (a row
    outside the image), the image's last, shorter block's too."""
    d = im2col_of(p)
    size = d.matmul.block
    pixels = min(size, d.matmul.pixels)
    plural = "s" if pixels > 1 else ""
    widened = MemoryRequest(pixels * d.matmul.groups * 8,
                            f"the windows of {pixels} pixel{plural} widened to int16 pairs")
    if not widens_directly(d):
        return (widened, MemoryRequest(pixels * d.window,
                                       f"the windows of {pixels} pixel{plural} as int8"))
    return (widened, MemoryRequest(size * d.row, f"a filter row of {size} windows as int8"))


def pixel_corners(d: Im2col, first: int | str, count: int) -> list[tuple[str, str]]:
    """The input row and column (C expressions, or numbers where `first` is one) of the top
    left corners of the windows of `count` output pixels from `first` on, an index into the
    image's pixels in the output's order: a block may end one output row and start the next."""
    (sh, sw), (pt, pl) = d.stride, d.padding
    if isinstance(first, int):
        return [(str((n // d.out_w) * sh - pt), str((n % d.out_w) * sw - pl))
                for n in range(first, first + count)]

    def corner(n: str) -> tuple[str, str]:
        if d.out_w == 1:  # a column of pixels: n is the row
            return c_sum([(n, sh)], -pt), str(-pl)
        return c_sum([(f"{n} / {d.out_w}", sh)], -pt), c_sum([(f"{n} % {d.out_w}", sw)], -pl)

    return [corner(n) for n in ([first] + [f"({first} + {i})" for i in range(1, count)])]


def widen_name(prefix: str, last: bool) -> str:
    """The function that widens a whole block straight from the input, or the image's last,
    shorter block."""
    return f"{prefix}_widen{'_last' if last else ''}"


def window_values(prefix: str, d: Im2col, direct: tuple[int, ...], window: bool) -> dict:
    """The values of the functions that copy windows out of the input (the template's
    `window`): `{prefix}_row` always, `{prefix}_window` (one pixel's window, int8) if `window`,
    and where blocks widen straight from the input (`direct`: their pixel counts), `{prefix}_source`
    and a widening function per count (`widens`: `{prefix}_widen` for the first, then
    `{prefix}_widen_last`), the windows of that many pixels from pixel n on widened filter row
    by filter row."""
    rows_outside, columns_outside = d.reaches_outside(0), d.reaches_outside(1)
    last_column = d.width - d.kw  # the last a window starts at that stays inside the row
    inside = [*(["y >= 0", f"y < {d.height}"] if rows_outside else []),
              *(["ix >= 0", f"ix <= {last_column}"] if columns_outside else [])]
    widens = [{
        "name": widen_name(prefix, last=k > 0), "count": count,
        "row_words": 2 * count * (d.row // GROUP), "corners": pixel_corners(d, "n", count),
        "sources": [(f"{prefix}_source({c_offset('windows', [], i * d.row)}, x, "
                     f"iy{i} + ky, ix{i})") for i in range(count)],
        "comment": c_comment(
            f"The windows of the {count} output pixel{'s' if count > 1 else ''} from pixel n "
            "of the image on (in the output's order, so possibly across two output rows) "
            "widened into `pairs` filter row by filter row, each pixel's row from the input "
            "or copied into `windows` first")}
        for k, count in enumerate(direct)]
    return {
        "prefix": prefix, "d": d, "zero_point": -d.matmul.input_offset,
        "rows_outside": rows_outside, "columns_outside": columns_outside,
        "last_column": last_column, "window": window, "widens": widens,
        "inside": " && ".join(inside), "row_groups": d.row // GROUP,
        "row_comment": c_comment(
            f"Filter row y - iy of one output pixel's window into `row`: {d.kw} x {d.depth} "
            "values from input row y, column ix on; those outside the image the input zero "
            "point"),
        "window_comment": c_comment(
            f"One output pixel's window into `window`, in the filter's order: {d.kh} rows of "
            f"{d.kw} x {d.depth} values; (iy, ix) is its top left corner in the input, which "
            "may lie in the padding"),
        "source_comment": c_comment(
            "Filter row y - iy of one output pixel's window: in the input where it lies inside "
            "the image, else copied into `copy` (the padding the input zero point)")}


def emit_im2col(ctx: OpContext) -> Kernel:
    p: ConvParams | DepthwiseConvParams = ctx.params
    d = im2col_of(p)
    m = d.matmul
    prefix = ctx.prefix
    # the image's pixels in the output's order, a block at a time: a block may end one output
    # row and start the next, so that only the image's last block is short
    batches, image_rows = ConstantLoop("b", d.batches), ConstantLoop("r", 1)
    size = m.block_on(ctx.target)
    image_pixels = d.out_h * d.out_w
    whole = image_pixels - image_pixels % size
    block = ConstantLoop("n", whole, 0, size)
    rest = ConstantLoop("n", image_pixels, whole, max(image_pixels % size, 1))
    image = d.height * d.width * d.depth
    row_head = [f"const int8_t *xb = {c_offset('x', [(batches, image)])};",
                f"int8_t *ob = {c_offset('out', [(batches, image_pixels * m.channels)])};"]

    direct = widens_directly(d)

    def head(count: int, loop: ConstantLoop) -> list[str]:
        """The block's outputs, and its windows copied and widened into the scratch."""
        outs = "".join(f", *o{i} = o{i - 1} + {m.channels}" for i in range(1, count))
        lines = [f"int8_t *o0 = {c_offset('ob', [(loop, m.channels)])}{outs};"]
        if direct:
            return [*lines, f"{widen_name(prefix, last=count < size)}(pairs, windows, xb, "
                            f"{loop.index});"]
        first = loop.index if loop.written else loop.start
        for i, (iy, ix) in enumerate(pixel_corners(d, first, count)):
            lines.append(f"{prefix}_window({c_offset('windows', [], i * d.window)}, xb, {iy}, "
                         f"{ix});")
        names = ", ".join(["windows", *(f"windows + {i * d.window}" for i in range(1, count))])
        lines.append(f"arenac_widen_{count}(pairs, {names}, {m.groups});")
        return lines

    pixels = [{"loop": loop, "head": head(count, loop), "count": count}
              for loop, count in ((block, size), (rest, image_pixels % size)) if loop.runs]
    opcode = "CONV_2D" if isinstance(p, ConvParams) else "DEPTHWISE_CONV_2D of one channel"
    what = f"{opcode} '{ctx.outputs[0].name}' {d.kh}x{d.kw}"
    comment = (
        f"{what} for the Arm DSP extension, "
        f"{('one pixel', 'two pixels', 'three pixels')[min(size, image_pixels) - 1]} at a time "
        "in the output's order (a block may end one output row and start the next), each "
        f"pixel's window of {m.depth} values widened to int16 pairs in the arena ("
        + ("filter rows inside the image straight from the input, the others copied first"
           if direct else "copied first")
        + ", the padding the input zero point), then multiplied by the filter two output "
        "channels at a time, each __smlad adding two products")
    values = matmul_values(ctx, m, conv_output(m, p.output), what, comment,
                           [batches, image_rows, block, rest], row_head, pixels,
                           {widen_helper(p["count"], ctx.target) for p in pixels})
    tail = d.window - m.depth
    values["patch"] = window_values(
        prefix, d, tuple(p["count"] for p in pixels) if direct else (), not direct)
    values["windows"] = ctx.scratch[1]
    values["setup"] = [f"memset({c_offset('windows', [], i * d.window + m.depth)}, 0, {tail});"
                       for i in range(pixels[0]["count"]) if tail]
    return Kernel(render_macro(TEMPLATE, "pointwise", values), values["helpers"],
                  includes=("arm_acle.h",), definitions=kernel_definitions(values))


# -- DEPTHWISE_CONV_2D ---------------------------------------------------------------------

COPY_TRIP = 8  # channels a trip of the loop that copies a pixel's channels into their lines


@dataclass(frozen=True)
class Depthwise:
    """An int8 DEPTHWISE_CONV_2D with depth multiplier 1, as the DSP kernel runs it.

    For each output row, the kernel copies the rows its windows read and the previous output
    row's did not into the slots of the rows no longer read (input row py, counting the
    padding rows above the image, at slot py % kh: the rows read again stay where they are, and
    each channel's filter rows are taken in the order of the slots instead), as int16, one
    line of `line` values per channel and slot (a channel's kh slots adjacent, so that its
    words are within LDRD's reach of one pointer), the left and right padding and the rows
    above and below the image filled with the input zero point (whose product with the input
    offset added is 0, as the reference's skipped taps). Two horizontally adjacent taps of a
    channel are then one word of that line, and one __smlad adds both products with the
    filter's pair of weights, packed at generation time (an odd filter width pairs its last
    tap with a zero weight; see `shared_loads` for the pairs of pixels at stride 1)."""

    batches: int
    height: int
    width: int
    channels: int
    out_h: int
    out_w: int
    kh: int
    kw: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    weights: np.ndarray  # [channels, kh * kw]
    bias: np.ndarray
    input_offset: int
    max_group: int = MAX_GROUP_CHANNELS

    @property
    def pairs(self) -> int:
        return -(-self.kw // 2)

    @property
    def shared_loads(self) -> bool:
        """Whether two adjacent output pixels share their input words: at stride 1 and an odd
        filter width kw = 2k + 1 >= 3, pixels ox and ox + 1 (ox even) read the k + 1 words
        from ox on, word j the pair (x2j, x2j+1). Pixel ox adds (w2j, w2j+1) . word j for
        j < k and x2k * w2k; pixel ox + 1 adds x1 * w0 and (w2j+1, w2j+2) . word j + 1: __smlad
        for the pairs, __smlabt/__smlatb for the halves (`packed`). Per filter row, k + 1
        loads (one LDRD for each two) serve both pixels, where each pixel alone takes k + 1."""
        return self.stride[1] == 1 and self.kw % 2 == 1 and self.kw >= 3

    @property
    def row_words(self) -> int:
        """Filter words per filter row: its pairs; with shared loads also the pairs one tap
        on, (w1, w2), (w3, w4)..."""
        return self.kw - 1 if self.shared_loads else self.pairs

    @property
    def group(self) -> int:
        """Channels the kernel takes through all output rows at a time, whose rows the
        scratch holds: the most of `max_group` down to half of it, in fours (the runs of four
        copies), that divides the channels; else all of them."""
        if self.channels <= self.max_group:
            return self.channels
        sizes = range(self.max_group, self.max_group // 2 - 1, -4)
        return next((g for g in sizes if self.channels % g == 0), self.channels)

    @property
    def line(self) -> int:
        """Values of one widened line: the last window's last pair included; even with shared
        loads, so that every even pixel's words are aligned for LDRD."""
        if self.shared_loads:
            return self.out_w + self.kw + (self.out_w + self.kw) % 2
        return (self.out_w - 1) * self.stride[1] + 2 * self.pairs

    def matmul(self) -> Matmul:
        """The same sums as a matrix multiply: what the output stage is proven on. Taps outside
        the image add 0, which every tap's range holds, so the whole window's range bounds all."""
        return Matmul(1, 1, 1, 0, 0, self.kh * self.kw, self.kh * self.kw, self.channels,
                      self.weights, self.bias, self.input_offset)

    def packed(self) -> np.ndarray:
        """Per channel and filter row, the weights as int16 pairs in int32 words, the lower
        half for the left tap (the one at the lower address): (w0, w1), (w2, w3)... and with
        shared loads, after the first k of them, (w1, w2), (w3, w4)..."""
        w = np.zeros((self.channels, self.kh, 2 * self.pairs), np.int64)
        w[:, :, :self.kw] = self.weights.reshape(self.channels, self.kh, self.kw)
        if self.shared_loads:
            w = np.concatenate([w[:, :, :self.kw - 1], w[:, :, 1:self.kw]], axis=2)
        low, high = w[:, :, 0::2] & 0xFFFF, (w[:, :, 1::2] & 0xFFFF) << 16
        return wrap_int32(low | high)


def depthwise_of(p, max_group: int = MAX_GROUP_CHANNELS) -> Depthwise:
    batch, height, width, channels = p.input_shape
    _, out_h, out_w, _ = p.output_shape
    kh, kw = p.window.filter
    weights = np.asarray(p.weights[:, :, 0], np.float64).astype(np.int64)  # [channels, taps]
    bias = np.asarray(p.bias, np.float64).astype(np.int64)
    return Depthwise(batch, height, width, channels, out_h, out_w, kh, kw,
                     tuple(p.window.stride), tuple(p.window.padding), weights, bias,
                     p.input_offset, max_group)


MAX_DEPTHWISE_WORDS = 32  # filter words a channel keeps in registers, written out


def accepts_depthwise(graph: Graph, op: Operator, p) -> str | None:
    if not isinstance(p, DepthwiseConvParams) or not isinstance(p.output, Requantize):
        return "not an int8 depthwise convolution"
    if p.output.dtype != "int8" or graph.tensors[op.inputs[0]].dtype != "int8":
        return "not an int8 depthwise convolution"
    if p.depth_multiplier != 1:
        return "a depth multiplier other than 1"
    if tuple(p.window.dilation) != (1, 1):
        return "a dilated filter"
    if p.input_shape[0] < 1 or p.output_shape[1] < 1 or p.output_shape[2] < 1:
        return "an empty tensor"
    d = depthwise_of(p)
    if d.kh * d.row_words > MAX_DEPTHWISE_WORDS:
        return "a filter too large to keep in registers"
    return None


def accepts_narrow_depthwise(graph: Graph, op: Operator, p) -> str | None:
    reason = accepts_depthwise(graph, op, p)
    if reason is None and (depthwise_of(p, NARROW_GROUP_CHANNELS).group
                           >= depthwise_of(p).group):
        return "no smaller group of channels than dsp-depthwise's"
    return reason


def depthwise_scratch(p, max_group: int = MAX_GROUP_CHANNELS) -> tuple[MemoryRequest, ...]:
    d = depthwise_of(p, max_group)
    return (MemoryRequest(d.kh * d.group * d.line * 2,
                          f"the {d.kh} input rows an output row reads, widened to int16, "
                          f"per channel of a group of {d.group}"),)


def _depthwise_filter(prefix: str, d: Depthwise, what: str) -> dict:
    """The filter table: per channel and filter row, the packed pairs of taps."""
    return {
        "name": f"{prefix}_filter", "ctype": "int32_t", "align": "",
        "length": c_length(d.channels * d.kh * d.row_words),
        "data": c_array(d.packed().ravel(), 8),
        "comment": c_comment(
            f"{what}: per channel and filter row, the weights of two adjacent taps as an "
            "int16 pair (left tap in the lower half" +
            ("), then those pairs one tap on (for the second pixel of a pair)"
             if d.shared_loads else ", the last one with 0)" if d.kw % 2 else ")"))}


def _row_calls(prefix: str, d: Depthwise) -> tuple[list[str], list[list[str]], list[str]]:
    """The row function's slot arguments, its filter loads per slot, and its calls per output
    row.

    Input row py sits at slot py % kh; output row oy's window starts at row oy * sh (its turn,
    mod kh), so slot s holds its filter row (s - turn) mod kh, whose words start at f_s: one
    call of the row function per turn, the f_s constants in each."""
    sh = d.stride[0]
    words = d.row_words
    turn_args = [f"f{s}" for s in range(d.kh)] if d.kh > 1 else []
    loads = [[f"const int32_t w{s * words + j} = "
              f"wc[{f'f{s}' + plus_term(j) if turn_args else j}];" for j in range(words)]
             for s in range(d.kh)]
    row_out = f"out + oy * {d.out_w * d.channels}" + (" + g, g" if d.group < d.channels else "")
    turns = sorted({oy * sh % d.kh for oy in range(d.out_h)})

    def call(turn: int) -> str:
        offsets = [str((s + d.kh - turn) % d.kh * words) for s in range(len(turn_args))]
        return f"{prefix}_row(rows, {', '.join([row_out, *offsets])});"

    calls = [call(turns[0])] if len(turns) == 1 else [
        f"switch ({'oy' if sh == 1 else f'oy * {sh}'} % {d.kh}) {{",
        *(line for t in turns for line in (f"case {t}:", f"  {call(t)}", "  break;")), "}"]
    return turn_args, loads, calls


def _word(base: str, at: int) -> str:
    """The int16 pair at base + at (int16 values), one single load."""
    return f"arenac_load32((const int8_t *)({c_offset(base, [], at)}))"


def _run(words: list[str], weights: list[str]) -> list[str]:
    """One run of single loads: a filter row's input words and its weight words alternating
    (two loads of adjacent words from one base, GCC would pair into an LDRD)."""
    run = []
    for i in range(max(len(words), len(weights))):
        run += words[i:i + 1] + weights[i:i + 1]
    return run


@dataclass(frozen=True)
class FilterRow:
    """What one pixel block does with the filter row at one slot: the input words it reads
    (`words`: `a_j = <load>` lines), and the multiply-adds that follow."""

    words: list[str]
    macs: list[str]


def _shared_taps(d: Depthwise, count: int) -> list[FilterRow]:
    """Pixel ox (and ox + 1, and with four pixels ox + 2 and ox + 3) from the words of each
    filter row (`shared_loads`): each pair of pixels from the k + 1 words from its first on,
    so four pixels read k + 2 words where two pairs apart read 2k + 2."""
    k = d.kw // 2
    rows = []
    for ky in range(d.kh):
        row, w = ky * d.line, ky * d.row_words
        macs = []
        for q in range(0, count, 2):  # pixel pair ox + q, ox + q + 1: words from q / 2 on
            at, first, second = q // 2, f"acc{q}", f"acc{q + 1}"
            macs += [f"{first} = __smlad(a{at + j}, w{w + j}, {first});" for j in range(k)]
            macs.append(f"{first} = __smlabt(a{at + k}, w{w + 2 * k - 1}, {first});")
            if q + 1 < count:
                macs.append(f"{second} = __smlatb(a{at}, w{w}, {second});")
                macs += [f"{second} = __smlad(a{at + j + 1}, w{w + k + j}, {second});"
                         for j in range(k)]
        words = k + 1 + (count - 1) // 2
        rows.append(FilterRow([f"a{j} = {_word('r', row + 2 * j)};" for j in range(words)],
                              macs))
    return rows


def _depthwise_pixels(prefix: str, d: Depthwise, output: list[str], loop: ConstantLoop,
                      count: int, weights: list[list[str]], record: bool, dual_issue: bool
                      ) -> dict:
    """Output pixels ox (and ox + 1) of channel c: tap pair j of filter row ky at
    wr + ky * slot + ox * sw + 2 * j. Each filter row's input words and weight words (`weights`:
    each slot's weight loads) are read in one run of single loads before its multiply-adds (a
    Cortex-M4's load costs one cycle behind another, two elsewhere, LDRD three; a Cortex-M7
    issues a single load beside a multiply, an LDRD alone), the weights again for every pixel
    block, which keeps the registers for the loads; with `record`, the channel's sum and
    output constants too (through kc, see emit_depthwise)."""
    sw, slot = d.stride[1], d.line
    lines = [f"const int16_t *r = {c_offset('wr', [(loop, sw)])};",
             *(["ARENAC_KEEP(kc);", "const int32_t sum = kc->sum;"] if record else []),
             f"int32_t {', '.join(f'acc{i} = sum' for i in range(count))};"]
    stores = block_stores(prefix, output, [
        (f"o[{c_sum([(loop, d.channels)], i * d.channels)}]", f"acc{i}", "kc" if record else "c")
        for i in range(count)], record, dual_issue)
    if d.shared_loads:
        filter_rows = _shared_taps(d, count)
    elif sw == 2 and count == 2:  # pixel ox + 1's words are pixel ox's from the second on
        filter_rows = [FilterRow([f"a{j} = {_word('r', ky * slot + 2 * j)};"
                                  for j in range(d.pairs + 1)],
                                 [f"acc{i} = __smlad(a{j + i}, w{ky * d.pairs + j}, acc{i});"
                                  for i in range(2) for j in range(d.pairs)])
                       for ky in range(d.kh)]
    else:
        filter_rows = [FilterRow([f"a{i * d.pairs + j} = "
                                  f"{_word('r', ky * slot + 2 * j + i * sw)};"
                                  for i in range(count) for j in range(d.pairs)],
                                 [f"acc{i} = __smlad(a{i * d.pairs + j}, w{ky * d.pairs + j}, "
                                  f"acc{i});" for i in range(count) for j in range(d.pairs)])
                       for ky in range(d.kh)]
    names = max(len(f.words) for f in filter_rows)
    lines.append(f"int32_t {', '.join(f'a{j}' for j in range(names))};")
    lines.append("ARENAC_KEEP(wc);")  # read again here, not kept from the block before
    for ky, f in enumerate(filter_rows):
        # the weights its multiply-adds use (one pixel: not all)
        used = [w for w in weights[ky] if re.search(rf"\b{w.split()[2]}\b", " ".join(f.macs))]
        lines += _run(f.words, used)
        lines += f.macs
    return {"loop": loop, "lines": lines + stores}


def _depthwise_blocks(prefix: str, d: Depthwise, output: list[str], weights: list[list[str]],
                      record: bool, dual_issue: bool
                      ) -> tuple[list[dict], list[ConstantLoop]]:
    """The pixel blocks of an output row (written out up to UNROLLED_PIXELS, else a loop of
    the first ones) and the loops of more than one pixel: pairs and a last odd pixel. With
    shared loads (see _depthwise_pixels), four pixels a block, the row's last
    one to three pixels in one block of their own or, for a 3-wide filter, in the last block
    (five or six pixels): a block of n pixels reads k + 1 + (n - 1) // 2 words of a filter
    row, where pairs apart read k + 1 each."""
    if d.shared_loads:
        width, rest = 4, d.out_w % 4
        last = 4 + rest if rest in (1, 2) and d.out_w > 4 and d.kw == 3 else rest
    else:
        width, rest = 2, d.out_w % 2
        last = rest
    whole = d.out_w - last  # the pixels of blocks of `width`
    if d.out_w <= UNROLLED_PIXELS:  # the blocks written out: no loop, every offset a constant
        loops = [(ConstantLoop("ox", ox + width, ox, width), width)
                 for ox in range(0, whole, width)]
    else:
        loops = [(ConstantLoop("ox", whole, 0, width), width)]
    loops.append((ConstantLoop("ox", d.out_w, whole, max(last, 1)), last))
    return ([_depthwise_pixels(prefix, d, output, loop, count, weights, record, dual_issue)
             for loop, count in loops if loop.runs and count],
            [loop for loop, count in loops if count > 1])


def _channel_copies(d: Depthwise) -> list[str]:
    """One input pixel's channels into their lines: written out, or COPY_TRIP a trip; each four
    values read in one run of loads before their four stores (a load behind a store costs two
    cycles on a Cortex-M4, behind a load one)."""
    channel = d.kh * d.line
    looped = d.group > UNROLLED
    unroll = next(u for u in (COPY_TRIP, 4, 2, 1) if d.group % u == 0) if looped else d.group
    copies = []
    for g in range(0, unroll, GROUP):
        group = range(g, min(g + GROUP, unroll))
        copies += [f"{{ const int16_t {', '.join(f'v{j} = xp[{j}]' for j in group)};",
                   *(f"  lp[{j * channel}] = v{j};" for j in group), "}"]
    if looped:
        copies = [f"for (c = 0; c < {d.group}; c += {unroll}, xp += {unroll}, "
                  f"lp += {unroll * channel}) {{", *(f"  {line}" for line in copies), "}"]
    return copies


def _pair_copies(d: Depthwise) -> list[str]:
    """Two adjacent input pixels' channels into their lines, four channels a call of
    arenac_pixel_pair: written out up to UNROLLED channels, else a loop of four a trip."""
    channel = d.kh * d.line
    if d.group <= UNROLLED:
        return [f"arenac_pixel_pair({c_offset('lp', [], j * channel)}, "
                f"arenac_load32({c_offset('xp', [], j)}), arenac_load32(xp + {d.channels + j}), "
                f"{channel});" for j in range(0, d.group, GROUP)]
    return [f"for (c = 0; c < {d.group}; c += {GROUP}, xp += {GROUP}, "
            f"lp += {GROUP * channel}) {{",
            f"  arenac_pixel_pair(lp, arenac_load32(xp), arenac_load32(xp + {d.channels}), "
            f"{channel});", "}"]


def pairs_copied(d: Depthwise) -> bool:
    """Whether an input row's pixels are copied two at a time (`_copy_loops`): a group's
    channels come in fours (a word of each pixel) and the lines are of an even length, so
    that each line's even columns are word-aligned in the word-aligned scratch."""
    return d.group % GROUP == 0 and d.line % 2 == 0


def _copy_loops(d: Depthwise, left: int, inside: int) -> list[dict]:
    """The loops that copy an input row's pixels into columns left to inside of their lines:
    two pixels a trip from the first even column on where `pairs_copied`, an odd first or
    last pixel alone; else pixel by pixel."""
    single = _channel_copies(d)
    if not pairs_copied(d):
        return [{"first": left, "end": inside, "step": "++ix", "lines": single}]
    first = min(left + left % 2, inside)
    end = first + (inside - first) // 2 * 2
    loops = ((left, first, "++ix", single), (first, end, "ix += 2", _pair_copies(d)),
             (end, inside, "++ix", single))
    return [{"first": a, "end": b, "step": step, "lines": lines}
            for a, b, step, lines in loops if b > a]


def emit_depthwise(ctx: OpContext, max_group: int = MAX_GROUP_CHANNELS) -> Kernel:
    p = ctx.params
    d = depthwise_of(p, max_group)
    prefix = ctx.prefix
    m = d.matmul()
    name = ctx.outputs[0].name
    what = f"DEPTHWISE_CONV_2D '{name}' {d.kh}x{d.kw}"
    tables, output, output_comment, stage_calls = output_values(
        prefix, conv_output(m, p.output),
        (m.sums(), f"{what}: per channel, bias + input offset * the filter's sum (int32, "
                   "wrapped)"))
    parts = parted(output, ctx.target)  # the stages its stores part, if any
    tables = [_depthwise_filter(prefix, d, what), *tables]
    sh, sw = d.stride
    channel = d.kh * d.line  # the scratch is [channel][slot][line]
    turn_args, loads, calls = _row_calls(prefix, d)
    # A row whose blocks are a loop reads a channel's sum and output constants through a
    # pointer to its record that every trip reads again (kc, ARENAC_KEEP): kept in registers
    # through the loop, beside a block's sums and words, they were spilled on every trip. On
    # the dual-issue Cortex-M7 a written-out row does too (its loads issue beside the
    # multiplies); the single-issue cores keep them in registers along such a row, which
    # measures faster there.
    dual_issue = ctx.target not in IN_ORDER_TARGETS
    record = (channel_record(prefix, output) if d.out_w > UNROLLED_PIXELS or dual_issue
              else None)
    blocks, pairs = _depthwise_blocks(prefix, d, output if record else parts, loads,
                                      record is not None, dual_issue)
    left, inside = min(d.padding[1], d.line), min(d.padding[1] + d.width, d.line)  # columns
    # stride below the filter height: the window's rows overlap the previous output row's
    first_row = (f"oy == 0 ? 0 : (oy - 1) * {sh} + {d.kh}" if sh < d.kh else
                 "oy" if sh == 1 else f"oy * {sh}")
    values = {
        "parted": bool(parts),
        "fn": ctx.fn, "prefix": prefix, "tables": tables,
        "output_comment": c_comment(f"Output channel c from its sum: {output_comment}"),
        "output": output, "x": ctx.inputs[0].ptr, "out": ctx.outputs[0].ptr,
        "scratch": ctx.scratch[0],
        "comment": c_comment(
            f"{what} for the Arm DSP extension, output row by output row: the input rows it "
            f"reads that the previous one did not widened to int16 into the {d.kh} slots of "
            f"the arena (a line of {d.line} values per channel, the padding the input zero "
            "point), then per channel two output pixels at a time, each filter row's input "
            "and weight words read in one run of single loads" +
            (" sharing the words they read" if d.shared_loads or sw == 2 else "")
            + ", each __smlad adding two taps' products"),
        "d": d, "zero_point": -d.input_offset, "channel": channel,
        "grouped": d.group < d.channels,
        "attribute": runs_attribute(ctx.target),
        "pixels": blocks, "ox": any(p.written for p in pairs), "first_row": first_row,
        "copies": _copy_loops(d, left, inside),
        "turn_args": turn_args, "calls": calls,
        "row_comment": c_comment(
            f"One output row of {what}, channel by channel: o its first output, and the filter "
            "row of slot s starting at the channel's word f_s (the slots turn as output rows "
            "go down)" if turn_args else f"One output row of {what}, channel by channel: o its "
            "first output"),
        "slot_of_row": f"(py % {d.kh})" if d.kh > 1 else "0",
        "column": f"ix - {d.padding[1]}" if d.padding[1] else "ix",
        "left": left, "inside": inside,
        "record": record,
        "channel_line": (record_pointer(prefix, record, "c") if record else
                         f"const int32_t sum = {sum_of(prefix, tables, 'c')};"),
        "helpers": tuple(sorted({"arm_dsp", *runs_helpers(ctx.target),
                                 *(["arm_dsp_pixel_pair"] if pairs_copied(d) else [])}
                                | output_helpers(tables, output) | stage_calls)),
    }
    row = definition(f"{values['prefix']}_row", render_macro(TEMPLATE, "depthwise_row", values),
                     gap=True)
    return Kernel(render_macro(TEMPLATE, "depthwise", values), values["helpers"],
                  includes=("arm_acle.h",), definitions=kernel_definitions(values, row))


_INT8 = kernels("int8, int8, int32? -> int8", targets=DSP_TARGETS)

# The 1x1 kernels, then the windowed ones (toolchain/ops/conv/__init__.py puts the forms
# without scratch of each after them).
POINTWISE_KERNELS: tuple[TargetKernel, ...] = (
    TargetKernel("CONV_2D", "dsp-1x1-staged", _INT8, accepts_staged, emit_staged,
                 scratch=staged_scratch, overlaps=staged_overlaps, scratch_alignment=WORD),
    # the staged kernel's form with less scratch (a block of pixels widened at a time, not the
    # whole input): given up for where its scratch sets the arena, as a streamed plan's does
    TargetKernel("CONV_2D", "dsp-1x1", _INT8, accepts_conv, emit_conv,
                 scratch=lambda p: pointwise_scratch(conv_matmul(p)),
                 overlaps=pointwise_overlaps, scratch_alignment=WORD,
                 narrows=("dsp-1x1-staged",), narrows_at_peak=True),
)
# im2col is also what the rows kernel gives a deep filter's lines up for (arm_dsp_rows.py): a
# block's windows take less scratch than the filter's rows of the whole width
WINDOWED_KERNELS: tuple[TargetKernel, ...] = tuple(
    TargetKernel(opcode, "dsp-im2col", _INT8, accepts_im2col, emit_im2col,
                 scratch=im2col_scratch, overlaps=overlaps.convolution, scratch_alignment=WORD,
                 narrows=("dsp-rows",))
    for opcode in ("CONV_2D", "DEPTHWISE_CONV_2D")) + (
    TargetKernel("DEPTHWISE_CONV_2D", "dsp-depthwise", _INT8, accepts_depthwise,
                 # the portable convolution's rule, row by row of the output: this kernel reads
                 # an input row only when it widens it, before it writes the first output row
                 # whose window holds it, and reads none above that window's first row again
                 emit_depthwise, scratch=depthwise_scratch, overlaps=overlaps.convolution,
                 scratch_alignment=WORD),
    # the same kernel in groups of NARROW_GROUP_CHANNELS: what dsp-depthwise gives its scratch
    # up for in a plan held to an arena
    TargetKernel("DEPTHWISE_CONV_2D", "dsp-depthwise-narrow", _INT8, accepts_narrow_depthwise,
                 lambda ctx: emit_depthwise(ctx, NARROW_GROUP_CHANNELS),
                 scratch=lambda p: depthwise_scratch(p, NARROW_GROUP_CHANNELS),
                 overlaps=overlaps.convolution, scratch_alignment=WORD, narrows=("dsp-depthwise",)),
)
