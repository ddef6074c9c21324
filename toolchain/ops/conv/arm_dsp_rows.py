"""CONV_2D (int8) for the Arm DSP extension from widened input rows: the first convolution of
an image or audio network (3 colours, 1 channel), whose windows the im2col kernel would copy out
a few bytes at a time; and a deep filter over many pixels (a ResNet's 3x3 layers), whose
windows im2col would widen once per window, nine times per value at stride 1, where a line is
widened once.

For each output row the kernel keeps the `kh` input rows its windows read widened to int16 in
the scratch, one line each with the padding columns the input zero point (the rows the previous
output row read moved up, the others widened once). A window's filter row is then `words`
int16 pairs of one line in a run, which the filter, widened at generation time into the same
pairs (zero where a pair reaches past the window), multiplies with one __smlad each: three
output pixels by two output channels a step, the weights of the channel pair and the words of
the three pixels read in one run of single loads (Cortex-M4: one cycle each behind another;
on the dual-issue Cortex-M7 a written-out block's steps are one software pipeline instead); a
row's last one or two pixels take four channels a step.
A filter of up to MAX_STEPS steps is written out. A deeper one (`deep`) is written out too up
to MAX_WRITTEN_STEPS steps whose words all lie within one load's offset of the line (a loop
over three filter rows costs about 8 cycles a row on a Cortex-M4, 1-2% of a 3x3 layer's
cycles); beyond that it loops over its filter rows and each row's words, `trip` steps a trip
(`looped`). A deep filter is taken over WIDE_FILTER_PIXELS or more output pixels only: over
fewer, the im2col kernel keeps the filter int8 (half the flash), and it is what the rows
kernel gives its lines up for in a plan held to an arena.
At a stride and depth whose product is odd, each pixel's values are padded to an even count,
so that every window starts on a word (a zero weight meets the pad): taken for three values a
pixel or more (an image's colours at stride 1) over WIDE_FILTER_PIXELS output pixels or more."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolchain.ir import Graph, Operator
from toolchain.numerics.fixedpoint import wrap_int32
from toolchain.ops import overlaps
from toolchain.ops.arm_dsp_common import (
    DSP_TARGETS,
    PIPELINE,
    PIPELINED_TARGETS,
    TEMPLATE,
    WIDE_FILTER_PIXELS,
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
from toolchain.ops.conv.arm_dsp import Convolution, accepts_im2col, conv_output, convolution_of
from toolchain.ops.conv.prepare import ConvParams, DepthwiseConvParams
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_length,
    c_offset,
    c_sum,
    render_macro,
    written_vars,
)
from toolchain.ops.spec import MemoryRequest, TargetKernel, kernels

MAX_ROW_WORDS = 8  # int16 pairs of one filter row: at most 16 values (kw x depth, padded)
MAX_STEPS = 24  # steps of a block (filter rows x their words), each written out
# steps of a deep filter written out: pretrainedResnet_quant's 3x3 layers of 16 and 32 channels
# (72 and 144 steps), 1.5-3% fewer estimated cycles each than their loops, about 2 KiB of code
MAX_WRITTEN_STEPS = 144
LOAD_REACH = 4095  # bytes past its base a load's immediate offset reaches (Thumb-2 LDR)
MAX_TRIP = 48  # steps of one trip of a deep filter row's loop
MIN_TRIP = 4  # fewer a trip, and the loop's own cycles would outweigh what rows save
PIXELS = 3  # output pixels a block takes
# The fewest values a pixel whose windows start between words may have for the kernel to pad
# it by one: three colours (pretrainedResnet_quant's first layer, stride 1: 734,104 estimated
# cycles from rows against 814,361 through im2col on a Cortex-M4), not one channel (half of
# every window's products on padding)
MIN_PADDED_DEPTH = 3


@dataclass(frozen=True)
class Rows(Convolution):
    """An int8 CONV_2D (or DEPTHWISE_CONV_2D of one input channel) as the rows kernel runs it."""

    @property
    def pixel_values(self) -> int:
        """Values a pixel takes in a line: its depth, one more where stride x depth is odd (a
        zero weight meets it), so that every window starts on an even value."""
        return self.depth + (self.stride[1] * self.depth) % 2

    @property
    def words(self) -> int:
        """Int16 pairs of one filter row of a window."""
        return -(-self.kw * self.pixel_values // 2)

    @property
    def deep(self) -> bool:
        """A filter of rows longer than MAX_ROW_WORDS or of more than MAX_STEPS steps: taken
        over many pixels only, written out only where `looped` is not."""
        return self.words > MAX_ROW_WORDS or self.kh * self.words > MAX_STEPS

    @property
    def looped(self) -> bool:
        """A deep filter whose steps run in a loop over its rows: more than MAX_WRITTEN_STEPS,
        or words further from the block's first than a load's offset reaches."""
        sx = self.stride[1] * self.pixel_values
        reach = 2 * ((self.kh - 1) * self.line + 2 * (self.words - 1) + (PIXELS - 1) * sx)
        return self.deep and (self.kh * self.words > MAX_WRITTEN_STEPS or reach > LOAD_REACH)

    @property
    def trip(self) -> int:
        """Steps of one trip of a deep filter row's loop: the most that divide its words."""
        return max(n for n in range(1, MAX_TRIP + 1) if self.words % n == 0)

    @property
    def line(self) -> int:
        """Values of one widened line: the padded row, and the last window's last word."""
        c = self.pixel_values
        reach = (self.out_w - 1) * self.stride[1] * c + 2 * self.words
        length = max(reach, (self.padding[1] + self.width) * c)
        return length + length % 2

    def packed(self) -> np.ndarray:
        """The filter as int16 pairs in int32 words, the lower half the value at the lower
        address: per channel pair, for each filter row and word, the first channel's word
        then the second's; an odd last channel's words alone."""
        m, c = self.matmul, self.pixel_values
        taps = np.zeros((m.channels, self.kh, self.kw, c), np.int64)
        taps[..., :self.depth] = m.weights.reshape(m.channels, self.kh, self.kw, self.depth)
        rows = np.zeros((m.channels, self.kh, 2 * self.words), np.int64)
        rows[:, :, :self.kw * c] = taps.reshape(m.channels, self.kh, self.kw * c)
        words = wrap_int32((rows[..., 0::2] & 0xFFFF) | ((rows[..., 1::2] & 0xFFFF) << 16))
        return by_channel_pairs(words.reshape(m.channels, -1))


def by_channel_pairs(words: np.ndarray) -> np.ndarray:
    """A filter's words [channels, steps] in the order a kernel of two channels a step reads
    them: per channel pair, for each step, the first channel's word then the second's; an odd
    last channel's words alone."""
    pairs = words.shape[0] // 2
    interleaved = words[:2 * pairs].reshape(pairs, 2, -1).transpose(0, 2, 1)
    return np.concatenate([interleaved.reshape(-1), words[2 * pairs:].reshape(-1)])


def rows_of(p: ConvParams | DepthwiseConvParams) -> Rows:
    return convolution_of(p, Rows)


def accepts_rows(graph: Graph, op: Operator, p) -> str | None:
    refused = accepts_im2col(graph, op, p)
    if refused:
        return refused
    if tuple(p.window.filter) == (1, 1):
        return "a pointwise convolution (the 1x1 kernels')"
    d = rows_of(p)
    pixels = d.batches * d.out_h * d.out_w
    # each pixel padded by one zero: over few pixels, or of one value a pixel (half of every
    # window padding), the im2col kernel's windows, which waste none, cost less
    if d.pixel_values > d.depth and (d.depth < MIN_PADDED_DEPTH or pixels < WIDE_FILTER_PIXELS):
        return ("an odd stride times depth (windows starting between words) over fewer than "
                f"{WIDE_FILTER_PIXELS} output pixels or {MIN_PADDED_DEPTH} values a pixel")
    if d.looped and d.trip < MIN_TRIP:
        return "a filter row of more values than the rows kernel writes out, of a count " \
               "its loop takes only a few at a time"
    if d.deep and pixels < WIDE_FILTER_PIXELS:
        return "a deep filter over few pixels (the im2col kernel keeps it int8)"
    return None


def rows_scratch(p: ConvParams | DepthwiseConvParams) -> tuple[MemoryRequest, ...]:
    d = rows_of(p)
    return (MemoryRequest(d.kh * d.line * 2,
                          f"the {d.kh} input rows an output row reads, widened to int16"),)


def _loads(d: Rows, pixels: int, channels: int, step: int, at: int, line: str = "r"
           ) -> list[list[tuple[str, str]]]:
    """One step's runs of single loads, each as (the register it fills, the word's C): the
    channels' weight words and the pixels' input words (at `at` values on from each pixel's
    window in `line`), ordered so that no two neighbours are adjacent in memory (GCC would pair
    those into an LDRD). Four channels are two pairs, the second's words a pair's filter further
    on (`pair_words`); with two pixels, the second pair's words are a run of their own after the
    first pair's products (a run of six would leave too few registers)."""
    sx = d.stride[1] * d.pixel_values
    pair_words = 2 * d.kh * d.words
    weights = [(f"a{j}", f"w[{(j // 2) * pair_words + step * min(channels, 2) + j % 2}]")
               for j in range(channels)]
    inputs = [(f"x{i}", f"arenac_load32((const int8_t *)({c_offset(line, [], at + i * sx)}))")
              for i in range(pixels)]
    inputs = inputs[0::2] + inputs[1::2]  # pixels two apart first: their words never touch
    if channels == 4:
        if pixels == 1:
            return [[weights[0], weights[2], inputs[0], weights[1], weights[3]]]
        return [[inputs[0], weights[0], inputs[1], weights[1]], [weights[2], weights[3]]]
    if pixels < channels:
        return [[weights[0], inputs[0], *weights[1:]]]
    run = inputs[:pixels - channels]
    for weight, word in zip(weights, inputs[pixels - channels:], strict=True):
        run += [weight, word]
    return [run]


def _pipeline(d: Rows, accs: list[str], channels: int, pixels: int,
              steps: list[tuple[int, int]]) -> list[str]:
    """A block's steps (index, values on from each window's start) written out as one software
    pipeline for the dual-issue Cortex-M7: each word of the next step loaded right after the
    last __smlad that reads the register it fills, so that every load issues beside a
    multiply-add (one MAC pipe: a cycle for two products). The line is hidden from the
    optimizer before each step's loads, as in the steps of runs."""
    def words(index: int, at: int) -> dict[str, str]:
        return dict(word for run in _loads(d, pixels, channels, index, at) for word in run)

    first = words(*steps[0])
    lines = ["{", "  ARENAC_KEEP(r);",
             *(f"  int32_t {name} = {word};" for name, word in first.items())]
    products = [(a, f"x{k // channels}", f"a{k % channels}") for k, a in enumerate(accs)]
    for s in range(len(steps)):
        following = words(*steps[s + 1]) if s + 1 < len(steps) else {}
        kept = False
        for k, (acc, x, w) in enumerate(products):
            lines.append(f"  {acc} = __smlad({x}, {w}, {acc});")
            later = {name for _, *names in products[k + 1:] for name in names}
            for name in (n for n in following if n in (x, w) and n not in later):
                if not kept:
                    lines.append("  ARENAC_KEEP(r);")
                    kept = True
                lines.append(f"  {name} = {following[name]};")
    return [*lines, "}"]


def _block(prefix: str, d: Rows, tables: list[dict], output: list[str], pixels: int,
           loop: ConstantLoop, channels: int, pipelined: bool) -> dict:
    """A block of `pixels` output pixels (from r on, their outputs at o0...) by `channels`
    output channels (from channel c): its sums, its steps written out (`pipelined`: the
    three-pixel blocks' as one software pipeline), its stores."""
    w_at = c_offset(f"{prefix}_filter", [(loop, d.kh * d.words)])
    accs = [f"acc{i * channels + q}" for i in range(pixels) for q in range(channels)]
    lines = [f"const int32_t *w = {w_at};",
             *(f"const int32_t s{q} = {sum_of(prefix, tables, c_sum([(loop, 1)], q))};"
               for q in range(channels)),
             f"int32_t {', '.join(f'{a} = s{k % channels}' for k, a in enumerate(accs))};"]

    def step(index: int, at: int, line: str) -> list[str]:
        # the line hidden from the optimizer at each step: a pixel's word is often another's
        # a few steps on, and GCC would keep it in a register the step needs
        lines = ["{", f"  ARENAC_KEEP({line});"]
        # after each run of loads, the products of the words read so far not yet taken
        read: set[str] = set()
        done: set[str] = set()
        for run in _loads(d, pixels, channels, index, at, line):
            lines += [f"  const int32_t {name} = {word};" for name, word in run]
            read |= {name for name, _ in run}
            for k, a in enumerate(accs):
                x, w = f"x{k // channels}", f"a{k % channels}"
                if a not in done and x in read and w in read:
                    lines.append(f"  {a} = __smlad({x}, {w}, {a});")
                    done.add(a)
        return [*lines, "}"]

    if d.looped:  # each filter row's words in a loop, `trip` steps a trip
        trip = d.trip
        body = [text for t in range(trip) for text in step(t, 2 * t, "q")]
        lines += ["const int16_t *q = r;", "int fy, j;",
                  f"for (fy = 0; fy < {d.kh}; ++fy, q += {d.line - 2 * d.words}) {{",
                  f"  for (j = 0; j < {d.words // trip}; ++j, q += {2 * trip}, "
                  f"w += {min(channels, 2) * trip}) {{",
                  *(f"    {text}" for text in body), "  }", "}"]
    else:
        steps = [(ky * d.words + j, ky * d.line + 2 * j)
                 for ky in range(d.kh) for j in range(d.words)]
        if pipelined and (pixels, channels) == (PIXELS, 2):
            lines += _pipeline(d, accs, channels, pixels, steps)
        else:
            for index, at in steps:
                lines += step(index, at, "r")
    lines += block_stores(prefix, output, [
        (f"o{i}[{c_sum([(loop, 1)], q)}]", f"acc{i * channels + q}", c_sum([(loop, 1)], q))
        for i, q in store_order(tables, pixels, channels)])
    return {"loop": loop, "lines": lines}


def _channel_loops(channels: int, pixels: int) -> list[tuple[ConstantLoop, int]]:
    """The channel blocks of a block of `pixels` output pixels, with how many channels each
    step takes: four (two pairs) beside fewer than three pixels, where two channels a step
    would spend a cycle on a load for every product or two (Cortex-M4, pretrainedResnet_quant's
    layers 16 pixels wide: the last pixel's 1.5 cycles a product to 1.25), then pairs, then
    one."""
    quads = channels - channels % 4 if pixels < PIXELS else 0
    pairs = channels - channels % 2
    return [(ConstantLoop("c", quads, 0, 4), 4), (ConstantLoop("c", pairs, quads, 2), 2),
            (ConstantLoop("c", channels, pairs), 1)]


def _padding_columns(d: Rows) -> list[tuple[int, int]]:
    """The values of each line no input row writes: those left and right of the row's."""
    left, right = d.padding[1] * d.depth, (d.padding[1] + d.width) * d.depth
    return [(start, end) for start, end in ((0, left), (right, d.line)) if end > start]


def emit_rows(ctx: OpContext) -> Kernel:
    p: ConvParams | DepthwiseConvParams = ctx.params
    d = rows_of(p)
    m = d.matmul
    prefix = ctx.prefix
    sh, sw = d.stride
    pt, pl = d.padding
    c = d.pixel_values
    opcode = "CONV_2D" if isinstance(p, ConvParams) else "DEPTHWISE_CONV_2D of one channel"
    what = f"{opcode} '{ctx.outputs[0].name}' {d.kh}x{d.kw}"
    tables, output, output_comment, stage_calls = output_values(
        prefix, conv_output(m, p.output),
        (m.sums(), f"{what}: per output channel, bias + input offset * the filter row's sum "
                   "(int32, wrapped)"))
    parts = parted(output, ctx.target)  # the stages its stores part, if any
    packed = d.packed()
    tables = [{"name": f"{prefix}_filter", "ctype": "int32_t", "align": "",
               "length": c_length(packed.size), "data": c_array(packed, 8),
               "comment": c_comment(
                   f"{what}: the filter widened to int16 pairs, a filter row's {d.kw} x "
                   f"{c} values as {d.words} words (zero past its end"
                   + (f" and for the pixel's value {d.depth}" if c > d.depth else "")
                   + "), the lower half first: per pair of output channels, for each filter "
                   "row and word, the first channel's word then the second's")}, *tables]
    whole = d.out_w - d.out_w % PIXELS
    pixel_loops = [(ConstantLoop("p", whole, 0, PIXELS), PIXELS),
                   (ConstantLoop("p", d.out_w, whole, max(d.out_w % PIXELS, 1)),
                    d.out_w % PIXELS)]
    channel_loops = {count: _channel_loops(m.channels, count) for _, count in pixel_loops}
    # on the dual-issue core, the written-out three-pixel blocks as one software pipeline
    pipelined = ctx.target in PIPELINED_TARGETS and not d.looped
    batches, out_rows = ConstantLoop("b", d.batches), ConstantLoop("oy", d.out_h)
    row_out = d.out_w * m.channels
    pixel_blocks = []
    for loop, count in pixel_loops:
        if not loop.runs:
            continue
        outs = "".join(f", *o{i} = o{i - 1} + {m.channels}" for i in range(1, count))
        head = [f"const int16_t *r = {c_offset('rows', [(loop, sw * c)])};",
                f"int8_t *o0 = {c_offset('orow', [(loop, m.channels)])}{outs};"]
        channel_blocks = [_block(prefix, d, tables, parts, count, channel_loop, width,
                                 pipelined)
                          for channel_loop, width in channel_loops[count] if channel_loop.runs]
        pixel_blocks.append({"loop": loop, "head": head, "channels": channel_blocks})
    image = d.height * d.width * d.depth
    # rows an output row reads that the previous one did (none where there is one output row)
    kept = max(d.kh - sh, 0) if d.out_h > 1 else 0
    values = {
        "parted": bool(parts),
        "fn": ctx.fn, "prefix": prefix, "tables": tables, "d": d,
        "output_comment": c_comment(f"Output channel c from its sum: {output_comment}"),
        "output": output, "x": ctx.inputs[0].ptr, "out": ctx.outputs[0].ptr,
        "scratch": ctx.scratch[0], "zero_point": -m.input_offset,
        "comment": c_comment(
            f"{what} for the Arm DSP extension, output row by output row from the {d.kh} "
            f"input rows it reads widened to int16 in the arena (lines of {d.line} values, "
            "the padding the input zero point): three output pixels by two output channels "
            "a step, a word of the channel pair's filter row and the same word of each "
            "pixel's window read in one run of single loads, each __smlad adding two "
            "products"),
        "image": image, "row_values": d.width * d.depth, "pixel_values": c,
        "left": pl * c, "kept": kept, "padding": _padding_columns(d),
        "first": f"oy == 0 ? 0 : {kept}" if kept else "0",
        "iy": c_sum([(out_rows, sh), ("ky", 1)], -pt), "blocks": pixel_blocks,
        "batches": batches, "out_rows": out_rows,
        "orow": c_offset("out", [(batches, d.out_h * row_out), (out_rows, row_out)]),
        "xb": c_offset("x", [(batches, image)]),
        "counters": written_vars([batches, out_rows, *(loop for loop, _ in pixel_loops),
                                  *(loop for loops in channel_loops.values()
                                    for loop, _ in loops)]),
        "groups": d.width * d.depth - (d.width * d.depth) % 4,
        # two words a trip where they divide the row: the loop's own cycles over 8 values
        "group_step": 8 if (d.width * d.depth) % 8 == 0 else 4,
        "attribute": "ARENAC_DSP_IN_ORDER" if pipelined else runs_attribute(ctx.target),
        "helpers": tuple(sorted({"arm_dsp",
                                 *([PIPELINE] if pipelined else runs_helpers(ctx.target)),
                                 *(["arm_dsp_widen4_in_order"] if c == d.depth and pl * c % 2 == 0
                                   and d.width * d.depth >= 4 else [])}
                                | output_helpers(tables, output) | stage_calls)),
    }
    return Kernel(render_macro(TEMPLATE, "rows_conv", values), values["helpers"],
                  includes=("arm_acle.h",), definitions=kernel_definitions(values))


_INT8 = kernels("int8, int8, int32? -> int8", targets=DSP_TARGETS)

# Tried before the im2col kernel (toolchain/ops/conv/__init__.py). The portable convolution's
# overlap rule holds, row by row of the output: an input row is read only when it is widened,
# before the first output row whose window holds it is written.
TARGET_KERNELS: tuple[TargetKernel, ...] = tuple(
    TargetKernel(opcode, "dsp-rows", _INT8, accepts_rows, emit_rows, scratch=rows_scratch,
                 overlaps=overlaps.convolution, scratch_alignment=WORD)
    for opcode in ("CONV_2D", "DEPTHWISE_CONV_2D"))
