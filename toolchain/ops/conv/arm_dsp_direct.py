"""CONV_2D (int8, or DEPTHWISE_CONV_2D of one input channel) for the Arm DSP extension without
scratch: what the rows, im2col and 1x1 kernels (arm_dsp_rows.py, arm_dsp.py) give their
widened rows, windows and pixels up for in a plan held to an arena.

A window's filter row is `values` contiguous int8 values of one input row. The kernel reads
them straight from the input a word at a time and widens each word in registers: __sxtb16
gives the values 0 and 2 of the word as an int16 pair, its rotated form the values 1 and 3. The
filter is packed at generation time in the same order (per word, the pair (0, 2) then (1, 3),
zero past the filter row's end), so each widened pair meets its weights in one __smlad: two
output pixels by two output channels a step, each input word and weight word read once for
two products. A filter row of up to MAX_ROW_WORDS words is written out; a longer one (`deep`,
its taps whole words) is read in a loop.

A word reaching past the window reads the next values of the same input row, which a zero
weight meets, so the fast path takes the columns whose last word ends inside the row; the
others (a window over the left or right padding, or reading past the row's end) go through an
edge function: it copies each filter row's window to a few bytes of stack, the padding the
input zero point, or, deep, skips the taps over the padding, its sums started from what those
taps add (`padded_sums`). A row of padding is read from a constant row of the input zero
point (whose product with the input offset added is 0, as the reference's skipped taps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from toolchain.ir import Graph, Operator
from toolchain.numerics.fixedpoint import wrap_int32
from toolchain.ops import overlaps
from toolchain.ops.arm_dsp_common import (
    DSP_TARGETS,
    TEMPLATE,
    WORD,
    block_stores,
    kernel_definitions,
    output_helpers,
    output_values,
    parted,
    runs_attribute,
    runs_helpers,
    store_order,
    sum_of,
)
from toolchain.ops.conv.arm_dsp import (
    Convolution,
    Depthwise,
    accepts_conv,
    accepts_im2col,
    conv_output,
    convolution_of,
)
from toolchain.ops.conv.arm_dsp_rows import accepts_rows, by_channel_pairs, rows_of
from toolchain.ops.conv.prepare import ConvParams, DepthwiseConvParams
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_function_head,
    c_length,
    c_offset,
    c_sum,
    definition,
    render_macro,
    written_vars,
)
from toolchain.ops.spec import TargetKernel, kernels

MAX_ROW_WORDS = 8  # int8 words a filter row reads: at most 32 values
MAX_UNROLLED = 24  # words of a window written out; a taller filter loops over its rows


@dataclass(frozen=True)
class Direct(Convolution):
    """An int8 CONV_2D (or DEPTHWISE_CONV_2D of one input channel) as the direct kernel runs
    it."""

    @property
    def values(self) -> int:
        """Values of one filter row of a window, contiguous in an input row."""
        return self.kw * self.depth

    @property
    def words(self) -> int:
        """Int8 words a filter row reads (the last one past the window where it is short)."""
        return -(-self.values // 4)

    @property
    def deep(self) -> bool:
        """Whether a filter row is more words than the kernel writes out: it loops over them.
        Its taps are then whole words (the depth a multiple of 4), so the windows over the
        padding columns skip those taps, their sums corrected for them (`padded_sums`)."""
        return self.words > MAX_ROW_WORDS

    @property
    def unrolled_words(self) -> int:
        """Of a deep kernel, the words each trip of its loop over a filter row takes: four,
        two or one, whichever divides a tap's words (and so every edge's)."""
        return next(n for n in (4, 2, 1) if (self.depth // 4) % n == 0)

    @property
    def single(self) -> bool:
        """Whether the last word holds one value of the filter row: read as a byte, it needs no
        widening and meets one weight word, not two."""
        return self.values % 4 == 1

    @property
    def steps(self) -> int:
        """Weight words of a filter row per output channel: two a word, one for a single."""
        return 2 * self.words - self.single

    @property
    def reach(self) -> int:
        """Values the kernel reads from a window's start: whole words, but a single's one."""
        return 4 * self.words - 3 * self.single

    @property
    def row_values(self) -> int:
        return self.width * self.depth

    def window_start(self, ox: int) -> int:
        """The value of the input row output column `ox`'s window starts at (below 0 in the
        left padding)."""
        return (ox * self.stride[1] - self.padding[1]) * self.depth

    @property
    def inside(self) -> tuple[int, int]:
        """The output columns [first, end) whose words all lie in the input row."""
        columns = [ox for ox in range(self.out_w) if self.window_start(ox) >= 0
                   and self.window_start(ox) + self.reach <= self.row_values]
        return (columns[0], columns[-1] + 1) if columns else (0, 0)

    def edge_columns(self) -> tuple[range, range]:
        """The output columns left and right of the fast path's."""
        first, end = self.inside
        return range(first), range(end, self.out_w)

    def padded_sums(self) -> np.ndarray:
        """Of a deep kernel, per edge column (left ones, then right ones) and output channel:
        what the filter's taps over the padding columns add with the input zero point there,
        which the edge skips (the folded sums count the zero point at every tap)."""
        m = self.matmul
        taps = m.weights.reshape(m.channels, self.kh, self.kw, self.depth).sum(axis=(1, 3))
        return padded_sums(self, taps, (*self.edge_columns()[0], *self.edge_columns()[1]),
                           -m.input_offset)

    def packed(self) -> np.ndarray:
        """The filter as int16 pairs in int32 words, the lower half first, in the order the
        kernel widens a word (values 0 and 2, then 1 and 3): per channel pair, for each filter
        row and step, the first channel's word then the second's; an odd last channel's words
        alone."""
        m = self.matmul
        rows = np.zeros((m.channels, self.kh, 4 * self.words), np.int64)
        rows[..., :self.values] = m.weights.reshape(m.channels, self.kh, self.values)
        quads = rows.reshape(m.channels, self.kh, self.words, 4) & 0xFFFF
        even = quads[..., 0] | (quads[..., 2] << 16)  # what __sxtb16 makes of the word
        odd = quads[..., 1] | (quads[..., 3] << 16)  # and its rotated form
        words = wrap_int32(np.stack([even, odd], axis=-1)).reshape(m.channels, self.kh, -1)
        # a single's odd word is 0, and left out
        return by_channel_pairs(words[..., :self.steps].reshape(m.channels, -1))


def padded_sums(d: Convolution | Depthwise, taps: np.ndarray, columns: Sequence[int],
                zero_point: int) -> np.ndarray:
    """Per output column of `columns` and channel: the zero point times the filter's taps
    (`taps`: [channels, kw], summed over rows and depth) over the padding columns, the int32
    words an edge function starts its sums from."""
    found = []
    for ox in columns:
        ix = ox * d.stride[1] - d.padding[1]
        outside = [kx for kx in range(d.kw) if not 0 <= ix + kx < d.width]
        found.append(zero_point * taps[:, outside].sum(axis=1))
    return wrap_int32(np.asarray(found, np.int64).reshape(-1))


def edge_call(prefix: str, loop: ConstantLoop, index: int, channels: int, stride: int,
              pad: int, padded: bool) -> str:
    """The call of the edge function for the output columns of `loop` (the first of them the
    edge `index` of the padded sums, where the edge takes them)."""
    at = c_offset(f"{prefix}_padded", [(loop, channels)], (index - loop.start) * channels)
    sums = f", {at}" if padded else ""
    return (f"{prefix}_edge(in, {c_offset('orow', [(loop, channels)])}, "
            f"{c_sum([(loop, stride)], -pad)}{sums});")


def padding_row(prefix: str, d: Convolution | Depthwise, what: str, row_values: int,
                zero_point: int) -> list[dict]:
    """The table of a row of padding, the input zero point, where some window of `d` reaches
    a row above or below the image (the direct kernels read such a row from it)."""
    sh, pt = d.stride[0], d.padding[0]
    if pt == 0 and (d.out_h - 1) * sh - pt + d.kh <= d.height:
        return []
    return [{"name": f"{prefix}_padding", "ctype": "int8_t", "align": "",
             "length": c_length(row_values), "data": c_array(np.full(row_values, zero_point), 16),
             "comment": c_comment(f"{what}: a row of padding, the input zero point")}]


def direct_of(p: ConvParams | DepthwiseConvParams) -> Direct:
    return convolution_of(p, Direct)


def accepts_direct(graph: Graph, op: Operator, p) -> str | None:
    """The convolutions the im2col kernel runs (a 1x1 filter: the 1x1 kernels') that the
    direct kernel reads by words (`accepts_words`)."""
    refused = accepts_im2col(graph, op, p)
    if refused:
        return refused
    if tuple(p.window.filter) == (1, 1):
        return "a pointwise convolution (the 1x1 kernels')"
    if p.window.filter[0] == 1:
        return "a filter of one row (the loops over its rows would run once)"
    return accepts_words(p)


def accepts_words(p: ConvParams | DepthwiseConvParams) -> str | None:
    """Whether the direct kernel reads the convolution's windows by words: filter rows of at
    most MAX_ROW_WORDS words or of taps of whole words, and a column inside the row."""
    d = direct_of(p)
    if d.deep and d.depth % 4:
        return "a filter row of more values than the direct kernel writes out, of taps " \
               "that are not whole words"
    first, end = d.inside
    if end <= first:
        return "no window whose words lie inside the input row"
    return None


def accepts_pointwise_direct(graph: Graph, op: Operator, p) -> str | None:
    """What the 1x1 kernel runs of whole words of depth (every pixel's words inside its row,
    so no edges), of what the direct kernel reads by words."""
    refused = accepts_conv(graph, op, p)
    if refused is None and p.input_shape[-1] % 4:
        return "a depth that is not whole words"
    return refused or accepts_words(p)


def accepts_rows_direct(graph: Graph, op: Operator, p) -> str | None:
    """What the rows kernel writes out, of what the direct kernel runs. A deep filter that
    gives the rows' scratch up goes to the im2col kernel first, whose scratch is smaller."""
    refused = accepts_rows(graph, op, p)
    if refused is None and rows_of(p).deep:
        return "a filter row too long to write out (the im2col kernel's next)"
    return refused or accepts_direct(graph, op, p)


def _steps(d: Direct, pixels: int, channels: int, accs: list[str], base: int,
           words: int, weights_at: str = "w") -> list[str]:
    """The steps of a block over `words` words of a filter row: the words of each pixel's
    window at r (the next pixel's `sx` values on), widened, times the weight words from
    weights_at[base] on."""
    sx = d.stride[1] * d.depth
    lines = []
    for j in range(words):
        if d.single and j == d.words - 1:  # one value, sign-extended by its load
            inputs = ", ".join(f"x{i} = r[{4 * j + i * sx}]" for i in range(pixels))
            weights = ", ".join(f"a{q} = {weights_at}[{base + 2 * j * channels + q}]"
                                for q in range(channels))
            lines += ["{", f"  const int32_t {inputs};", f"  const int32_t {weights};",
                      *(f"  {acc} = __smlad(x{k // channels}, a{k % channels}, {acc});"
                        for k, acc in enumerate(accs)), "}"]
            continue
        # one run of single loads, no two neighbours adjacent in memory (GCC would pair those
        # into an LDRD, three cycles where a load behind a load is one)
        step = base + 2 * j * channels
        loads = {f"a{q}": f"{weights_at}[{step + q}]" for q in range(channels)}
        loads |= {f"b{q}": f"{weights_at}[{step + channels + q}]" for q in range(channels)}
        inputs = [f"x{i}" for i in range(pixels)]
        order = ["a0", "b0", *inputs[:1], *(["a1"] if channels > 1 else []),
                 *inputs[1:], *(["b1"] if channels > 1 else [])]
        lines += ["{", *(f"  const int32_t {name} = {loads[name]};" if name in loads else
                         f"  const int32_t {name} = arenac_load32(r + {4 * j + int(name[1:]) * sx});"  # noqa: E501
                         for name in order)]
        for a, v, widen in (("a", "v", "__sxtb16"), ("b", "u", "arenac_sxtb16_ror8")):
            widened = ", ".join(f"{v}{i} = {widen}(x{i})" for i in range(pixels))
            lines += [f"  const int16x2_t {widened};",
                      *(f"  {acc} = __smlad({v}{k // channels}, {a}{k % channels}, {acc});"
                        for k, acc in enumerate(accs))]
        lines.append("}")
    return lines


def _block(prefix: str, d: Direct, tables: list[dict], output: list[str], pixels: int,
           channel: ConstantLoop, channels: int, window: str,
           words: tuple[str, str] | None = None) -> dict:
    """`pixels` output pixels (their outputs at o0, o1) by `channels` output channels from
    channel c: the sums, the filter rows' steps, the stores. `window`: the C of the first
    pixel's window row ky, with `{ky}` for the row. `words`: of a deep kernel's edge, the C of
    the first word its filter rows read and of how many (the others the padding's), whose sums
    start with those of `padded`."""
    steps = d.steps
    at = c_offset(f"{prefix}_filter", [(channel, d.kh * steps)])
    accs = [f"acc{i * channels + q}" for i in range(pixels) for q in range(channels)]
    padded = [f" + padded[{c_sum([(channel, 1)], q)}]" if words else "" for q in range(channels)]
    lines = [f"const int32_t *w = {at};",
             *(f"const int32_t s{q} = {sum_of(prefix, tables, c_sum([(channel, 1)], q))}"
               f"{padded[q]};" for q in range(channels)),
             f"int32_t {', '.join(f'{a} = s{k % channels}' for k, a in enumerate(accs))};"]
    row_step = channels * steps
    if d.deep:  # a loop over the filter rows (of more than one), and over each row's words
        first, count = words or ("0", str(d.words))
        offsets = [f"ky * {row_step}"] if d.kh > 1 else []
        offsets += [f"{first} * {2 * channels}"] if first != "0" else []
        unroll = d.unrolled_words
        lines += [f"for (ky = 0; ky < {d.kh}; ++ky) {{" if d.kh > 1 else "{",
                  f"  const int8_t *r = {window.format(ky='ky' if d.kh > 1 else 0)};",
                  f"  const int32_t *v = {' + '.join(['w', *offsets])};",
                  f"  for (j = 0; j < {count}; j += {unroll}, r += {4 * unroll}, "
                  f"v += {2 * channels * unroll}) {{",
                  *(f"    {line}" for line in _steps(d, pixels, channels, accs, 0, unroll, "v")),
                  "  }", "}"]
    elif d.kh * d.words <= MAX_UNROLLED:  # every filter row written out
        for ky in range(d.kh):
            lines += ["{", f"  const int8_t *r = {window.format(ky=ky)};",
                      *(f"  {line}" for line in _steps(d, pixels, channels, accs,
                                                       ky * row_step, d.words)), "}"]
    else:
        lines += [f"for (ky = 0; ky < {d.kh}; ++ky, w += {row_step}) {{",
                  f"  const int8_t *r = {window.format(ky='ky')};",
                  *(f"  {line}" for line in _steps(d, pixels, channels, accs, 0, d.words)),
                  "}"]
    lines += block_stores(prefix, output, [
        (f"o{i}[{c_sum([(channel, 1)], q)}]", f"acc{i * channels + q}", c_sum([(channel, 1)], q))
        for i, q in store_order(tables, pixels, channels)])
    return {"loop": channel, "lines": lines}


def _channel_loops(d: Direct) -> tuple[tuple[ConstantLoop, int], ...]:
    """The loops over output channels, two at a time then an odd last one, and their widths."""
    c = d.matmul.channels
    return ((ConstantLoop("c", c - c % 2, 0, 2), 2), (ConstantLoop("c", c, c - c % 2), 1))


def _columns(prefix: str, d: Direct, tables: list[dict], output: list[str]) -> list[dict]:
    """The fast path's loops over output columns: pairs of pixels, then an odd last one."""
    first, end = d.inside
    m = d.matmul
    loops = [(ConstantLoop("ox", end - (end - first) % 2, first, 2), 2),
             (ConstantLoop("ox", end, end - (end - first) % 2), 1)]
    found = []
    for loop, pixels in loops:
        if not loop.runs:
            continue
        second = f", *o1 = o0 + {m.channels}" if pixels == 2 else ""
        head = [f"const int start = {c_sum([(loop, d.stride[1] * d.depth)], -d.padding[1] * d.depth)};",  # noqa: E501
                f"int8_t *o0 = {c_offset('orow', [(loop, m.channels)])}{second};"]
        blocks = [_block(prefix, d, tables, output, pixels, channel, width, "in[{ky}] + start")
                  for channel, width in _channel_loops(d) if channel.runs]
        found.append({"loop": loop, "head": head, "channels": blocks})
    return found


def emit_direct(ctx: OpContext) -> Kernel:
    p: ConvParams | DepthwiseConvParams = ctx.params
    d = direct_of(p)
    m = d.matmul
    prefix = ctx.prefix
    sh, sw = d.stride
    pt, pl = d.padding
    opcode = "CONV_2D" if isinstance(p, ConvParams) else "DEPTHWISE_CONV_2D of one channel"
    what = f"{opcode} '{ctx.outputs[0].name}' {d.kh}x{d.kw}"
    tables, output, output_comment, stage_calls = output_values(
        prefix, conv_output(m, p.output),
        (m.sums(), f"{what}: per output channel, bias + input offset * the filter row's sum "
                   "(int32, wrapped)"))
    parts = parted(output, ctx.target)  # the stages its stores part, if any
    packed = d.packed()
    zero_point = -m.input_offset
    own = [{"name": f"{prefix}_filter", "ctype": "int32_t", "align": "",
            "length": c_length(packed.size), "data": c_array(packed, 8),
            "comment": c_comment(
                f"{what}: the filter widened to int16 pairs, a filter row's {d.values} values "
                f"as {d.words} words read from the input (zero past its end), each word as "
                "the pairs of its values 0 and 2, then 1 and 3: per pair of output channels, "
                "for each filter row and step, the first channel's word then the second's")}]
    padding = padding_row(prefix, d, what, d.row_values, zero_point)
    own += padding
    first, end = d.inside
    edge_count = len(d.edge_columns()[0]) + len(d.edge_columns()[1])
    if d.deep and edge_count:
        padded = d.padded_sums()
        own.append({"name": f"{prefix}_padded", "ctype": "int32_t", "align": "",
                    "length": c_length(padded.size), "data": c_array(padded, 8),
                    "comment": c_comment(
                        f"{what}: per edge column (left, then right) and output channel, the "
                        "input zero point times the filter's taps over the padding columns, "
                        "which the edge skips")})
    tables = [*own, *tables]
    batches, out_rows = ConstantLoop("b", d.batches), ConstantLoop("oy", d.out_h)
    ky_rows = ConstantLoop("ky", d.kh)  # the input row of each filter row
    row_out = d.out_w * m.channels
    image = d.height * d.row_values
    columns = _columns(prefix, d, tables, parts)
    # the columns left and right of the fast path's, each through the edge function
    left, right = ([{"loop": loop, "call": edge_call(prefix, loop, index, m.channels, sw, pl,
                                                     d.deep)}] if loop.runs else []
                   for loop, index in ((ConstantLoop("ox", first), 0),
                                       (ConstantLoop("ox", d.out_w, end), first)))
    loops = [batches, out_rows, ky_rows, *(e["loop"] for e in left + right),
             *(c["loop"] for c in columns), *(b["loop"] for c in columns for b in c["channels"])]
    values = {
        "parted": bool(parts),
        "fn": ctx.fn, "prefix": prefix, "tables": tables, "d": d,
        "output_comment": c_comment(f"Output channel c from its sum: {output_comment}"),
        "output": output, "x": ctx.inputs[0].ptr, "out": ctx.outputs[0].ptr,
        "zero_point": zero_point, "channels": m.channels,
        "comment": c_comment(
            f"{what} for the Arm DSP extension, output row by output row, without scratch: "
            "each window's words read from the input and widened in registers, two output "
            "pixels by two output channels a step, each __smlad adding two products"),
        "edge_comment": c_comment(
            f"{what}: the output pixel at o0 of the window from input column ix of the rows "
            "in[] that reaches past them: " + (
                "the taps over the padding skipped, their sums started from `padded`, what "
                "they add" if d.deep else "each filter row's window copied first, the padding "
                "the input zero point, then multiplied as the others are")),
        "edge_blocks": [_block(prefix, d, tables, parts, 1, channel, width, *(
            (f"in[{{ky}}] + ix * {d.depth} + first * 4", ("first", "end - first"))
            if d.deep else ("window[{ky}]",)))
                        for channel, width in _channel_loops(d) if channel.runs],
        "edge_counters": written_vars([channel for channel, _ in _channel_loops(d)]),
        "tap_words": d.depth // 4,
        "edge_head": c_function_head(
            f"{runs_attribute(ctx.target)} static void {prefix}_edge",
            ["const int8_t *const *in", "int8_t *o0", "int ix",
             *(["const int32_t *padded"] if d.deep else [])]),
        "padding": padding[0]["name"] if padding else None,
        "rows": ky_rows, "iy": c_sum([(out_rows, sh), (ky_rows, 1)], -pt),
        "in_row": f"in[{c_sum([(ky_rows, 1)])}]", "columns": columns,
        "left": left, "right": right,
        "batches": batches, "out_rows": out_rows,
        "orow": c_offset("out", [(batches, d.out_h * row_out), (out_rows, row_out)]),
        "xb": c_offset("x", [(batches, image)]),
        "counters": ", ".join(filter(None, (written_vars(loops), "j" if d.deep else ""))),
        "attribute": runs_attribute(ctx.target),
        "helpers": tuple(sorted({"arm_dsp", "arm_dsp_ror8", *runs_helpers(ctx.target)}
                                | output_helpers(tables, output)
                                | stage_calls)),
    }
    edge_macro = "direct_edge_deep" if d.deep else "direct_edge"
    edges = [definition(f"{prefix}_edge", render_macro(TEMPLATE, edge_macro, values),
                        gap=True)] if left or right else []
    return Kernel(render_macro(TEMPLATE, "direct_conv", values), values["helpers"],
                  includes=("arm_acle.h",), definitions=kernel_definitions(values, *edges))


_INT8 = kernels("int8, int8, int32? -> int8", targets=DSP_TARGETS)


def direct_kernels(name: str, accepts, narrows: tuple[str, ...]) -> tuple[TargetKernel, ...]:
    """The direct kernel as the form without scratch of the kernel `narrows` of the ops it
    `accepts`: bound after it (toolchain/ops/conv/__init__.py), it takes the op only where that
    one gives its scratch up. It reads input rows as the portable convolution does, row by row
    of the output: an output row is written after every input row its windows read, none above
    them read again."""
    return tuple(TargetKernel(opcode, name, _INT8, accepts, emit_direct,
                              overlaps=overlaps.convolution, scratch_alignment=WORD,
                              narrows=narrows)
                 for opcode in ("CONV_2D", "DEPTHWISE_CONV_2D"))


ROWS_DIRECT = direct_kernels("dsp-rows-direct", accepts_rows_direct, ("dsp-rows",))
IM2COL_DIRECT = direct_kernels("dsp-im2col-direct", accepts_direct, ("dsp-im2col",))
POINTWISE_DIRECT: tuple[TargetKernel, ...] = (
    TargetKernel("CONV_2D", "dsp-1x1-direct", _INT8, accepts_pointwise_direct, emit_direct,
                 overlaps=overlaps.convolution, scratch_alignment=WORD, narrows=("dsp-1x1",)),
)
