"""Kernels for the Arm cores with the DSP extension: cortex-m4, cortex-m7 and cortex-m33.

They run from the params of the portable kernels (toolchain/ops/conv.py, fully_connected.py)
and compute the same int32 sums and the same requantized values, bit for bit; only the order
of the work and the instructions differ. The C uses ACLE's intrinsics from <arm_acle.h>
(__sxtb16, __smlad), which GCC and Clang both provide for these cores; templates/c/arm_dsp.c.j2
lays it out.

Pointwise matrix multiply (int8 FULLY_CONNECTED, and CONV_2D with a 1x1 filter, any stride):
the output is a matrix of pixels (FULLY_CONNECTED: batch rows) by output channels (units), each
value a dot product of a pixel's input channels with a filter row. Two pixels by two channels
at a time (2x2 register blocking: four sums, each input word and weight word loaded once for
two products), three pixels by two channels where the depth takes a loop of steps (3x2: six
sums, both channels' weights loaded once for three pixels; `Matmul.block`):

- the block's inputs are widened once into the op's scratch (planned in the arena: 8 bytes
  per four input channels and pixel) as int16 pairs, four values x0..x3 becoming the words (x0, x2)
  and (x1, x3), which is what __sxtb16 and its rotated form make of one word;
- the filter is reordered at generation time so that the rows of each pair of channels
  alternate four weights at a time (the 2x2 step reads eight consecutive bytes), each row
  padded with zeros to a multiple of four; the weights widen in the loop as the inputs did, so
  lane (x0, x2) meets (w0, w2) and lane (x1, x3) meets (w1, w3): __smlad adds both products;
  over WIDE_FILTER_PIXELS pixels or more the filter is stored widened instead (int16 pairs in
  flash, no widening in the loop);
- the bias and the input offset times each filter row's sum are folded into one int32 per
  channel (wrapping as TFLite's int32 sums do), so the loop is a plain int8 dot product;
- the requantization is one 32 x 32 -> 64-bit multiply-add and a shift where
  toolchain/numerics/rounding.py proves it equal to the reference's rounding (FULLY_CONNECTED's
  double one, the convolutions' MultiplyByQuantizedMultiplier) on every accumulator the op can
  produce (the output zero point folded into its rounding where the 64-bit sum has room, so
  that the clamp is one SSAT); where the rounding can be an offset folded into the channel's
  sum plus a multiple of 2^32 (`high_word`), the multiply-add is one SMMLA, its high word
  alone; otherwise it is the reference's arithmetic itself.

Its write order differs from the portable convolution's: all the output channels of a block's
pixels after all of the block's inputs were read. `pointwise_overlaps` declares what that order
makes safe for CONV_2D; FULLY_CONNECTED declares no overlap, as its portable kernel.

Depthwise (int8 DEPTHWISE_CONV_2D, depth multiplier 1, no dilation, any filter and stride,
SAME or VALID): see `Depthwise`. The input rows are widened to int16 into filter-height
slots of the scratch, channel-planar, the padding filled with the input zero point so that the
folded sums hold on every window; two adjacent taps of a channel are then one word and one
__smlad, the filter packed as int16 pairs at generation time and kept in registers along an
output row; at stride 1 two adjacent output pixels share the words they read. Same sums, same
requantization (`conv_output`), and the portable convolution's row overlap rule, which its
order keeps.

General convolution (int8 CONV_2D of any filter and stride, no dilation, and a
DEPTHWISE_CONV_2D of one input channel): see `Im2col`; each pixel's window becomes the
pointwise kernel's widened inputs, the rest is the pointwise matrix multiply.

A stride-1 1x1 CONV_2D of a small input (`staged`): the whole input widened first, then channel
pair by channel pair, three pixels a step, see `emit_staged`.

ADD and SUB (int8): the portable kernel, its output stage in one proven rounding (`add_rounding`).

AVERAGE_POOL_2D and MAX_POOL_2D (int8, channels a multiple of four): four channels a word, see
`emit_pool`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from toolchain.ir import Graph, Operator
from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier, wrap_int32
from toolchain.numerics.rounding import (
    HighWord,
    SingleRounding,
    accumulator_range,
    double_to_int32,
    fc_multiplier,
    high_word,
    round_half_away,
    shared_roundings,
    single_roundings,
)
from toolchain.ops import overlaps
from toolchain.ops.conv import ConvParams, DepthwiseConvParams, Requantize
from toolchain.ops.elementwise import TEMPLATE as ELEMENTWISE_TEMPLATE
from toolchain.ops.elementwise import RescaledParams, binary_values, rescaled_inputs
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_int64,
    c_length,
    c_offset,
    c_pointer,
    c_sum,
    render_macro,
    written_vars,
)
from toolchain.ops.fully_connected import FullyConnectedQuantizedParams
from toolchain.ops.overlaps import OverlapRule
from toolchain.ops.pooling import Pool2DParams, window_axis, window_count
from toolchain.ops.spec import MemoryRequest, TargetKernel, kernels

DSP_TARGETS = ("cortex-m4", "cortex-m7", "cortex-m33")
TEMPLATE = "c/arm_dsp.c.j2"
GROUP = 4  # int8 values a word holds
WORD = 4  # the scratch is read in words (LDRD needs them aligned)
UNROLLED = 16  # depth groups written out without a loop
UNROLL = 8  # depth groups a loop trip takes beyond that
UNROLLED_PIXELS = 24  # a depthwise output row at most this wide is written out, pair by pair
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# A matrix multiply over at least this many pixels keeps its filter widened to int16 in flash:
# it then reads each weight word with no __sxtb16, which saves about pixels / 4 instructions
# per byte the wider filter adds (a 2-pixel block widens 8 weights in 4 instructions).
WIDE_FILTER_PIXELS = 100


@dataclass(frozen=True)
class Matmul:
    """The pointwise product an op computes: `batches` images of `rows` rows of `pixels`
    pixels; pixel i of row r of image b reads `depth` input values from element
    b * image_in + r * row_in + i * pixel_in of the input and writes `channels` outputs, the
    output pixels following each other. `weights` [channels, depth] and `bias` [channels] as
    int64; `input_offset` is added to every input value."""

    batches: int
    rows: int
    pixels: int
    image_in: int
    row_in: int
    pixel_in: int
    depth: int
    channels: int
    weights: np.ndarray
    bias: np.ndarray
    input_offset: int

    @property
    def groups(self) -> int:
        return -(-self.depth // GROUP)

    def sums(self) -> np.ndarray:
        """Per channel, bias + input offset * the filter row's sum, wrapped to int32."""
        total = self.bias + self.input_offset * self.weights.sum(axis=1)
        return wrap_int32(total)

    def accumulators(self) -> tuple[np.ndarray, np.ndarray]:
        return accumulator_range(self.weights, self.input_offset, self.bias)

    def packed(self) -> np.ndarray:
        """The filter as the loops read it: for each pair of channels, their rows four weights
        at a time, alternating; an odd last channel's row alone; rows padded with zeros."""
        padded = np.zeros((self.channels, self.groups * GROUP), np.int64)
        padded[:, :self.depth] = self.weights
        pairs = self.channels // 2
        quads = padded[:pairs * 2].reshape(pairs, 2, self.groups, GROUP).transpose(0, 2, 1, 3)
        return np.concatenate([quads.reshape(-1), padded[pairs * 2:].reshape(-1)])

    @property
    def block(self) -> int:
        """Pixels a block takes along a row: three (the 3x2 step) where the depth makes a loop
        of steps (written out, GCC spills the 3x2 step's fourteen registers), else two; a
        row's last one or two pixels are a block of their own."""
        return 3 if self.groups > UNROLL and self.pixels >= 3 else 2

    def blocks(self) -> list[tuple[int, int]]:
        """The blocks of pixels in the order the kernel runs them: (first output pixel, how
        many), `block` at a time along each row."""
        size = self.block
        return [((b * self.rows + r) * self.pixels + i, min(size, self.pixels - i))
                for b in range(self.batches) for r in range(self.rows)
                for i in range(0, self.pixels, size)]

    def input_at(self, pixel: int) -> int:
        """The first input element output pixel `pixel` reads."""
        image, rest = divmod(pixel, self.rows * self.pixels)
        row, i = divmod(rest, self.pixels)
        return image * self.image_in + row * self.row_in + i * self.pixel_in


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


def fc_matmul(p: FullyConnectedQuantizedParams, weights: np.ndarray | None,
              bias: np.ndarray | None) -> Matmul:
    w = (np.zeros((p.units, p.depth), np.int64) if weights is None
         else np.asarray(weights, np.int64).reshape(p.units, p.depth))
    b = np.zeros(p.units, np.int64) if bias is None else np.asarray(bias, np.int64).reshape(-1)
    return Matmul(1, 1, p.batches, 0, 0, p.depth, p.depth, p.units, w, b, p.input_offset)


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


def accepts_fc(graph: Graph, op: Operator, p) -> str | None:
    if not isinstance(p, FullyConnectedQuantizedParams) or p.dtype != "int8":
        return "not an int8 FULLY_CONNECTED"
    if p.filter_offset != 0:
        return "a filter with a zero point"
    weights = graph.tensors[op.inputs[1]]
    if not weights.is_constant or weights.data is None:
        return "weights computed at run time"
    bias_index = op.inputs[2] if len(op.inputs) > 2 else -1
    if bias_index >= 0 and (graph.tensors[bias_index].data is None
                            or not graph.tensors[bias_index].is_constant):
        return "bias computed at run time"
    return None


def pointwise_scratch(m: Matmul) -> tuple[MemoryRequest, ...]:
    """Room for one block's inputs widened: 8 bytes per four input values and pixel."""
    pixels = min(m.block, m.pixels)
    return (MemoryRequest(pixels * m.groups * 8,
                          f"the inputs of {pixels} pixel{'s' if pixels > 1 else ''} widened "
                          "to int16 pairs"),)


def pointwise_overlaps(graph: Graph, op: Operator, p: ConvParams) -> list[OverlapRule]:
    """The output may start `shift` bytes below the input: after each block of pixels the
    kernel has written the outputs of every pixel up to it, and later reads only the inputs of
    the pixels after it, from the next one's first input byte on (int8: bytes are elements)."""
    m = conv_matmul(p)
    blocks = m.blocks()
    shift = 0
    for (first, count), (following, _) in zip(blocks, blocks[1:]):
        shift = max(shift, (first + count) * m.channels - m.input_at(following))
    return [OverlapRule(0, 0, shift, kind="windowed")]


# -- requantization ------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputStage:
    """How the kernel turns a channel's int32 sum into int8: `single` (one rounding per
    channel, proven) or, without one, the reference's arithmetic: `multipliers`/`shifts`
    (MultiplyByQuantizedMultiplier) or `scales` (FULLY_CONNECTED's double rounding)."""

    low: int  # the clamp, before the zero point is added
    high: int
    zero_point: int
    single: tuple[SingleRounding, ...] | None = None
    multipliers: tuple[int, ...] = ()
    shifts: tuple[int, ...] = ()
    scales: tuple[float, ...] = ()
    # per channel, the least and the greatest sum (none: any int32)
    accumulators: tuple[tuple[int, int], ...] = ()


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
                              [mu * 2.0 ** (s - 31) for mu, s in zip(multipliers, shifts)])
    if (single is None and all(s <= 0 for s in shifts) and acc_lo.min() >= INT32_MIN
            and acc_hi.max() <= INT32_MAX):
        single = single_roundings(
            reference, low, high, acc_lo, acc_hi, multipliers,
            [31 + max(-s, 1 if mu == 0 else 0) for mu, s in zip(multipliers, shifts)])
    return OutputStage(low, high, zp, tuple(single) if single else None, tuple(multipliers),
                       tuple(shifts), accumulators=_ranges(acc_lo, acc_hi))


def fc_output(m: Matmul, p: FullyConnectedQuantizedParams) -> OutputStage:
    zp = p.output_offset
    low, high = p.activation_min - zp, p.activation_max - zp
    scales = list(p.requant_scales) * (m.channels if len(p.requant_scales) == 1 else 1)
    found = [fc_multiplier(s) for s in scales]
    acc_lo, acc_hi = m.accumulators()
    column = np.asarray(scales, np.float64)[:, None]

    def reference(acc: np.ndarray) -> np.ndarray:
        return double_to_int32(round_half_away(acc.astype(np.float64) * column))

    single = shared_roundings(reference, low, high, acc_lo, acc_hi, scales)
    if single is None and all(found) and acc_lo.min() >= INT32_MIN and acc_hi.max() <= INT32_MAX:
        single = single_roundings(reference, low, high, acc_lo, acc_hi, [f[0] for f in found],
                                  [f[1] for f in found])
    return OutputStage(low, high, zp, tuple(single) if single else None,
                       scales=tuple(scales), accumulators=_ranges(acc_lo, acc_hi))


def _ranges(acc_lo: np.ndarray, acc_hi: np.ndarray) -> tuple[tuple[int, int], ...]:
    return tuple(zip(acc_lo.tolist(), acc_hi.tolist()))


def _double(value: float) -> str:
    text = repr(float(value))
    return text if ("." in text or "e" in text) else text + ".0"


PROVEN = (": at generation time toolchain/numerics/rounding.py proved it equal, after the clamp, "
          "to the reference's requantization on every sum this op can produce")


def output_values(prefix: str, stage: OutputStage, sums: tuple[np.ndarray, str] | None = None
                  ) -> tuple[list[dict], list[str], str]:
    """The tables, body lines and comment of the op's output function. `sums`: the channels'
    folded sums and their table's comment, for a kernel that starts its sums from them (read
    them with `sum_of`): they share a table with the requantization's per-channel constants
    where it has some, so that a channel's values are one address."""
    tables: list[dict] = []

    def per_channel(name: str, ctype: str, values: list, literal=str) -> str:
        return _per_channel(tables, prefix, name, ctype, values, literal)

    clamp = f"arenac_clamp(q, {stage.low}, {stage.high})"
    store = [f"return (int8_t)({clamp}{_plus(stage.zero_point)});"]
    if stage.single is not None:
        s = stage.single
        zp = stage.zero_point
        # the zero point folded into the rounding, (acc * m + r + zp * 2^n) >> n being the
        # rounding plus zp, when the sum stays below 2^63 on every accumulator (and the high
        # word in int32): the clamp is then on the int8 value itself, one SSAT without an
        # activation
        ranges = stage.accumulators or ((INT32_MIN, INT32_MAX),) * len(s)
        magnitudes = [max(-lo, hi) for lo, hi in ranges]
        folded = all(
            a * r.multiplier + max(abs(r.rounding), abs(r.negative_rounding))
            + (abs(zp) << r.shift) < 2**62 for r, a in zip(s, magnitudes))
        fold = zp if folded else 0
        fields = [(r.rounding + (fold << r.shift), r.negative_rounding + (fold << r.shift),
                   r.multiplier, r.shift - 32) for r in s]
        low, high = stage.low + zp, stage.high + zp
        if folded and (low == -128 or high == 127):  # SSAT, and the activation's other end
            rest = ("v" if (low, high) == (-128, 127) else
                    f"(v < {low} ? {low} : v)" if high == 127 else f"(v > {high} ? {high} : v)")
            store = ["const int32_t v = __ssat(q, 8);", f"return (int8_t){rest};"]
        elif folded:
            store = [f"return (int8_t)arenac_clamp(q, {low}, {high});"]
        shared = all(a == b and n == fields[0][3] for a, b, _, n in fields)
        highs = [high_word(r, fold << r.shift, lo, hi) for r, (lo, hi) in zip(s, ranges)
                 ] if shared and folded and sums is not None else []
        struct = shared and sums is not None and len({f[:3] for f in fields}) > 1
        if highs and all(highs):
            lines, comment, sums = _high_word_output(prefix, tables, s, highs, sums,
                                                     fields[0][3], store)
        else:
            lines, comment, sums = _rounding_output(prefix, tables, fields, shared, struct,
                                                    folded, sums, store)
    elif stage.scales:
        scale = per_channel("scale", "double", list(stage.scales), _double)
        lines = [f"const double scaled = (double)acc * {scale};",
                 "int32_t q = INT32_MIN;",
                 "if (scaled > -2147483648.5 && scaled < 2147483647.5) {",
                 "  const int32_t t = (int32_t)scaled;",
                 "  const double frac = scaled - (double)t;",
                 "  q = t + (frac >= 0.5) - (frac <= -0.5);",
                 "}",
                 f"return (int8_t)arenac_clamp((int32_t)((uint32_t)q{_plus(stage.zero_point)}"
                 f"{'u' if stage.zero_point else ''}), {stage.low + stage.zero_point}, "
                 f"{stage.high + stage.zero_point});"]
        comment = ("TFLite's FULLY_CONNECTED rescale in double: round((double)acc * scale), "
                   "halves away from zero (no single rounding matched it)")
    else:
        mult = per_channel("multiplier", "int32_t", list(stage.multipliers))
        shift = per_channel("shift", "int8_t", list(stage.shifts))
        lines = [f"const int32_t q = arenac_mbqm(acc, {mult}, {shift});", *store]
        comment = ("TFLite's MultiplyByQuantizedMultiplier (no single rounding matched it)")
    if not any("[c]" in line for line in lines):
        lines.insert(0, "(void)c;")
    if sums is not None:
        tables.insert(0, {"name": f"{prefix}_sum", "ctype": "int32_t", "align": "",
                          "length": c_length(sums[0].size), "data": c_array(sums[0]),
                          "comment": c_comment(sums[1])})
    return tables, lines, comment


def _per_channel(tables: list[dict], prefix: str, name: str, ctype: str, values: list,
                 literal=str) -> str:
    """A constant when every channel has the same, else a table indexed by c (appended to
    `tables`)."""
    if len(set(values)) == 1:
        return literal(values[0])
    tables.append({"name": f"{prefix}_{name}", "ctype": ctype, "align": "",
                   "length": c_length(len(values)),
                   "data": _lines([literal(v) for v in values]),
                   "comment": c_comment(f"Per output channel: the {name.replace('_', ' ')} "
                                        "of the requantization")})
    return f"{prefix}_{name}[c]"


def _high_word_output(prefix: str, tables: list[dict], single: tuple[SingleRounding, ...],
                      highs: list[HighWord], sums: tuple[np.ndarray, str], shift: int,
                      store: list[str]) -> tuple[list[str], str, tuple[np.ndarray, str] | None]:
    """The output function's lines and comment with one SMMLA (`high_word`), and the sums
    still to tabulate: the channels' offsets go into their sums, which share the struct of
    the multipliers and high words where channels differ."""
    totals = wrap_int32(sums[0] + np.asarray([h.offset for h in highs], np.int64))
    constants = [(r.multiplier, h.high) for r, h in zip(single, highs)]
    shifted = f" >> {shift};" if shift else ";"
    if len(set(constants)) > 1:
        tables.append({
            "name": f"{prefix}_channel", "ctype": "arenac_high_channel", "align": "",
            "length": c_length(len(constants)),
            "data": ",\n  ".join(f"{{ {m}, {h}, {total} }}"
                                  for (m, h), total in zip(constants, totals.tolist())),
            "comment": c_comment(f"{sums[1]}, plus the requantization's offset; and the "
                                 "requantization's multiplier and high word")})
        lines = [f"const arenac_high_channel *k = &{prefix}_channel[c];",
                 f"const int32_t q = arenac_smmla(acc, k->multiplier, k->high){shifted}"]
        rest = None
    else:
        lines = [f"const int32_t q = arenac_smmla(acc, {constants[0][0]}, {constants[0][1]})"
                 f"{shifted}"]
        rest = (totals, f"{sums[1]}, plus the requantization's offset")
    comment = (f"one rounding, (acc * m + h * 2^32) >> {32 + shift}, the high word of one SMMLA "
               "shifted, with the sum offset so that h * 2^32 is the rounding (and holds the "
               f"output zero point times 2^{32 + shift}){PROVEN}")
    return lines + store, comment, rest


def _rounding_output(prefix: str, tables: list[dict], fields: list[tuple], shared: bool,
                     struct: bool, folded: bool, sums: tuple[np.ndarray, str] | None,
                     store: list[str]) -> tuple[list[str], str, tuple[np.ndarray, str] | None]:
    """The output function's lines and comment with a 64-bit rounding (SMLAL), and the sums
    still to tabulate. `fields`: per channel (rounding, negative rounding, multiplier, shift
    after the high word), the zero point folded in where `folded`; `shared`: one shift and one
    rounding for both signs; `struct`: the channels' constants differ and sit with their sums."""
    if struct:
        tables.append({
            "name": f"{prefix}_channel", "ctype": "arenac_channel", "align": "",
            "length": c_length(len(fields)),
            "data": ",\n  ".join(f"{{ {c_int64(f[0])}, {f[2]}, {total} }}"
                                  for f, total in zip(fields, sums[0].tolist())),
            "comment": c_comment(f"{sums[1]}; and its rounding and multiplier")})
        mult, rounding = "k->multiplier", "k->rounding"
        sums = None
    elif shared:  # one N, and one R for both signs: no select, the shift a constant
        mult = _per_channel(tables, prefix, "multiplier", "int32_t", [f[2] for f in fields])
        rounding = _per_channel(tables, prefix, "rounding", "int64_t", [f[0] for f in fields],
                                c_int64)
    if shared:
        lines = [f"const arenac_channel *k = &{prefix}_channel[c];"] if struct else []
        lines += [f"const int32_t q = (int32_t)(((int64_t)acc * {mult} + {rounding}) >> "
                 f"{32 + fields[0][3]});"]
    elif len(set(fields)) == 1:
        rounding, negative, mult, shift = (c_int64(fields[0][0]), c_int64(fields[0][1]),
                                           str(fields[0][2]), str(fields[0][3]))
        lines = []
    else:
        tables.append({
            "name": f"{prefix}_rounding", "ctype": "arenac_rounding", "align": "",
            "length": c_length(len(fields)),
            "data": ",\n  ".join(f"{{ {c_int64(a)}, {c_int64(b)}, {m}, {n} }}"
                                  for a, b, m, n in fields),
            "comment": c_comment("Per output channel: rounding, negative rounding, "
                                 "multiplier and shift of the requantization")})
        lines = [f"const arenac_rounding *r = &{prefix}_rounding[c];"]
        rounding, negative, mult, shift = ("r->rounding", "r->negative_rounding",
                                           "r->multiplier", "r->shift")
    if not shared:
        lines += [f"const int64_t rounding = acc < 0 ? {negative} : {rounding};",
                  f"const int32_t q = (int32_t)(((int64_t)acc * {mult} + rounding) >> 32)"
                  + (f" >> {shift};" if shift != "0" else ";")]
    lines += store
    comment = ((f"one rounding, (acc * m + r) >> {32 + fields[0][3]}, the same r for both "
                "signs" if shared else
                "one rounding, (acc * m + r) >> 32 >> s, r depending on the sign of acc")
               + ((f" (and holding the output zero point times 2^{32 + fields[0][3]})"
                   if shared else " (and holding the output zero point times 2^(32 + s))")
                  if folded else "")
               + PROVEN)
    return lines, comment, sums


def output_helpers(tables: list[dict], output: list[str]) -> set[str]:
    """The helper groups the output function needs: those defining its tables' struct types,
    and arenac_smmla where it calls it."""
    types = {"arenac_rounding": "arm_dsp_rounding", "arenac_channel": "arm_dsp_channel",
             "arenac_high_channel": "arm_dsp_high_channel"}
    groups = {types[t["ctype"]] for t in tables if t["ctype"] in types}
    return groups | ({"arm_dsp_smmla"} if any("arenac_smmla" in line for line in output)
                     else set())


def sum_of(prefix: str, tables: list[dict], channel: str) -> str:
    """The C of channel `channel`'s folded sum in the tables output_values made."""
    if any(t["name"] == f"{prefix}_channel" for t in tables):
        return f"{prefix}_channel[{channel}].sum"
    return f"{prefix}_sum[{channel}]"


def _lines(items: list[str], width: int = 96) -> str:
    """Initializer items, comma-separated, in lines of at most `width` characters."""
    lines, line = [], ""
    for item in items:
        if line and len(line) + len(item) + 2 > width:
            lines.append(line)
            line = ""
        line = f"{line}, {item}" if line else item
    return ",\n  ".join([*lines, line])


def _plus(value: int) -> str:
    return f" + {value}" if value > 0 else f" - {-value}" if value < 0 else ""


# -- emission --------------------------------------------------------------------------------


def _steps(kind: str, m: Matmul, wide: bool) -> dict:
    """The calls of one block's depth steps: written out up to UNROLLED groups (UNROLL for
    the 3x2 step), else a loop of UNROLL groups a trip and the rest written out. `wide`: the
    filter is int16 pairs."""
    x_words = 2 * int(kind[0])
    w_step = (8 if kind[2] == "2" else 4) // (2 if wide else 1)  # bytes, or int32 words
    name = f"arenac_mac{'16' if wide else ''}_{kind}"

    def call(k: ConstantLoop | None, extra: int) -> str:
        terms = [(k, x_words)] if k is not None else []
        w_terms = [(k, w_step)] if k is not None else []
        return (f"{name}(acc, {c_offset('pairs', terms, extra * x_words)}, "
                f"{c_offset('w', w_terms, extra * w_step)});")

    groups = m.groups
    # the 3x2 step holds every register: written out beyond one trip's groups, GCC spills
    if groups <= (UNROLL if kind == "3x2" else UNROLLED):
        return {"loop": None, "body": [], "rest": [call(None, g) for g in range(groups)]}
    main = groups - groups % UNROLL
    k = ConstantLoop("k", main, 0, UNROLL)
    return {"loop": k, "body": [call(k, u) for u in range(UNROLL)],
            "rest": [call(None, g) for g in range(main, groups)]}


def _channel_blocks(prefix: str, m: Matmul, pixels: int, outs: list[str], wide: bool,
                    sum_at: Callable[[str], str]) -> list[dict]:
    blocks = []
    pairs = ConstantLoop("c", m.channels - m.channels % 2, 0, 2)
    odd = ConstantLoop("c", m.channels, m.channels - m.channels % 2)
    for loop, width in ((pairs, 2), (odd, 1)):
        if not loop.runs:
            continue
        kind = f"{pixels}x{width}"
        w_at = c_offset(f"{prefix}_filter", [(loop, m.groups * GROUP // (2 if wide else 1))])
        sums = [sum_at(c_sum([(loop, 1)], j)) for j in range(width)]
        head = [f"const {'int32_t' if wide else 'int8_t'} *w = {w_at};",
                *_accumulators(sums, pixels)]
        stores = [f"{outs[i]}[{c_sum([(loop, 1)], j)}] = {prefix}_output(acc[{i * width + j}], "
                  f"{c_sum([(loop, 1)], j)});"
                  for i in range(pixels) for j in range(width)]
        blocks.append({"loop": loop, "head": head, "steps": _steps(kind, m, wide),
                       "stores": stores,
                       "helper": f"arm_dsp_mac{'16' if wide else ''}_{kind}"})
    return blocks


def _accumulators(sums: list[str], pixels: int) -> list[str]:
    """A block's sums, each channel's folded sum for each of its pixels."""
    names = [f"s{j}" for j in range(len(sums))]
    return [*(f"const int32_t {n} = {e};" for n, e in zip(names, sums)),
            f"int32_t acc[{pixels * len(sums)}] = {{ {', '.join(names * pixels)} }};"]


def pointwise_values(ctx: OpContext, m: Matmul, stage: OutputStage, what: str) -> dict:
    batches, rows = ConstantLoop("b", m.batches), ConstantLoop("r", m.rows)
    size = m.block
    whole = m.pixels - m.pixels % size
    block = ConstantLoop("p", whole, 0, size)
    rest = ConstantLoop("p", m.pixels, whole, max(m.pixels % size, 1))
    full, tail = divmod(m.depth, GROUP)
    row_head = []
    xr, orow = "x", "out"
    if m.batches > 1 or m.rows > 1:
        row_out = m.pixels * m.channels
        out_at = c_offset("out", [(batches, m.rows * row_out), (rows, row_out)])
        row_head = [
            f"const int8_t *xr = {c_offset('x', [(batches, m.image_in), (rows, m.row_in)])};",
            f"int8_t *orow = {out_at};"]
        xr, orow = "xr", "orow"

    def head(count: int, loop: ConstantLoop) -> list[str]:
        """The block's pointers, and its inputs widened into the scratch."""
        lines = [f"const int8_t *x0 = {c_offset(xr, [(loop, m.pixel_in)])};",
                 *(f"const int8_t *x{i} = x{i - 1} + {m.pixel_in};" for i in range(1, count))]
        outs = "".join(f", *o{i} = o{i - 1} + {m.channels}" for i in range(1, count))
        lines.append(f"int8_t *o0 = {c_offset(orow, [(loop, m.channels)])}{outs};")
        if full:
            names = ", ".join(f"x{i}" for i in range(count))
            lines.append(f"arenac_widen_{count}(pairs, {names}, {full});")
        words = 2 * count  # per group
        for i in range(count if tail else 0):
            lines.append(f"arenac_widen4({c_offset('pairs', [], full * words + 2 * i)}, "
                         f"arenac_load_partial(x{i} + {full * GROUP}, {tail}));")
        return lines

    pixels = [{"loop": loop, "head": head(count, loop), "count": count}
              for loop, count in ((block, size), (rest, m.pixels % size)) if loop.runs]
    helpers = {f"arm_dsp_widen_{p['count']}" for p in pixels if full}
    helpers |= {"arm_dsp_partial"} if tail else set()
    comment = (
        f"{what} for the Arm DSP extension: a matrix multiply of "
        f"{m.batches * m.rows * m.pixels} pixels of {m.depth} values by {m.channels} filter "
        f"rows, {('one pixel', 'two pixels', 'three pixels')[min(size, m.pixels) - 1]} by two "
        "output channels at a "
        "time: the inputs widened once to int16 pairs in the arena, the filter read four int8 "
        "weights a word, each __smlad adding two products")
    return matmul_values(ctx, m, stage, what, comment, [batches, rows, block, rest],
                         row_head, pixels, helpers)


def matmul_values(ctx: OpContext, m: Matmul, stage: OutputStage, what: str, comment: str,
                  loops: list[ConstantLoop], row_head: list[str], pixels: list[dict],
                  helpers: set[str]) -> dict:
    """The template's values for a kernel of blocks of pixels whose inputs `pixels[i]["head"]`
    widens into the scratch, each block then multiplied by the filter two channels at a time:
    the pointwise kernel's and the im2col convolution's."""
    prefix = ctx.prefix
    pixels_in_all = m.batches * m.rows * m.pixels  # of every call sharing the filter
    if ctx.op_rows:  # a stripe's: the stripes of the op share its filter
        pixels_in_all = pixels_in_all * ctx.op_rows // ctx.outputs[0].shape[1]
    wide = pixels_in_all >= WIDE_FILTER_PIXELS
    tables, output, output_comment = output_values(
        prefix, stage, (m.sums(), f"{what}: per output channel, bias + input offset * the "
                                  "filter row's sum (int32, wrapped)"))
    for pixel in pixels:
        pixel["channels"] = _channel_blocks(prefix, m, pixel["count"],
                                            [f"o{i}" for i in range(pixel["count"])], wide,
                                            lambda channel: sum_of(prefix, tables, channel))
    packed = m.packed()
    order = ("for each pair of output channels, their rows four weights at a time, "
             f"alternating; each row padded with zeros to {m.groups * GROUP}")
    if wide:
        quads = packed.reshape(-1, GROUP)
        words = (quads[:, :2] & 0xFFFF) | ((quads[:, 2:] & 0xFFFF) << 16)
        filter_table = {
            "name": f"{prefix}_filter", "ctype": "int32_t", "align": "",
            "length": c_length(words.size), "data": c_array((words + 2**31) % 2**32 - 2**31, 8),
            "comment": c_comment(
                f"{what}: the filter ({m.channels} x {m.depth}) widened to int16 pairs in the "
                f"order the loop reads it: {order}; four weights w0..w3 as the words (w0, w2) "
                "and (w1, w3), the lower half first")}
    else:
        filter_table = {
            "name": f"{prefix}_filter", "ctype": "int8_t", "align": "ARENAC_ALIGN(4) ",
            "length": c_length(packed.size), "data": c_array(packed),
            "comment": c_comment(f"{what}: the filter ({m.channels} x {m.depth}) in the order "
                                 f"the loop reads it: {order}")}
    tables = [filter_table, *tables]
    blocks = [b for p in pixels for b in p["channels"]]
    helpers = {"arm_dsp", *helpers, *(b["helper"] for b in blocks)}
    helpers |= output_helpers(tables, output)
    counters = written_vars([*loops, *[b["loop"] for b in blocks],
                             *[b["steps"]["loop"] for b in blocks if b["steps"]["loop"]]])
    return {
        "fn": ctx.fn, "prefix": prefix, "comment": c_comment(comment), "tables": tables,
        "output_comment": c_comment(f"Output channel c from its sum: {output_comment}"),
        "output": output, "x": ctx.inputs[0].ptr, "out": ctx.outputs[0].ptr,
        "scratch": ctx.scratch[0], "counters": counters, "batches": loops[0],
        "rows": loops[1], "row_head": row_head, "pixels": pixels,
        "helpers": tuple(sorted(helpers)), "patch": None, "windows": None, "setup": [],
    }


def emit_conv(ctx: OpContext) -> Kernel:
    p: ConvParams = ctx.params
    m = conv_matmul(p)
    values = pointwise_values(ctx, m, conv_output(m, p.output),
                              f"CONV_2D '{ctx.outputs[0].name}' 1x1")
    return Kernel(render_macro(TEMPLATE, "pointwise", values), values["helpers"],
                  includes=("arm_acle.h",))


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


def emit_staged(ctx: OpContext) -> Kernel:
    """The whole input widened into the scratch first, then channel pair by channel pair: the
    pair's filter rows widened into the scratch, and every three pixels a 3x2 step of int16
    words alone (arenac_mac16_3x2; a last one or two pixels a 2x2 or 1x2 step), as the filter
    kept widened in flash is read, without its flash."""
    p: ConvParams = ctx.params
    m = conv_matmul(p)
    prefix = ctx.prefix
    what = f"CONV_2D '{ctx.outputs[0].name}' 1x1"
    tables, output, output_comment = output_values(
        prefix, conv_output(m, p.output),
        (m.sums(), f"{what}: per output channel, bias + input offset * the filter row's sum "
                   "(int32, wrapped)"))
    full, tail = divmod(m.depth, GROUP)
    words = m.groups * 2  # of one pixel, widened
    # three pixels a block (arenac_mac16_3x2), the last one or two pixels a block of their own
    triples, rest = m.pixels - m.pixels % 3, m.pixels % 3
    pixel_loops = ((ConstantLoop("p", triples, 0, 3), 3),
                   (ConstantLoop("p", m.pixels, triples, max(rest, 1)), rest))

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

    widening = [{"loop": loop, "lines": widen(loop, count)}
                for loop, count in pixel_loops if loop.runs]
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
            sums = [sum_of(prefix, tables, c) for c in channels]
            out = c_offset("out", [(ploop, m.channels), (loop, 1)])
            steps = _steps(kind, m, True)
            step_loops += [steps["loop"]] if steps["loop"] else []
            outs = "".join(f", *o{i} = o{i - 1} + {m.channels}" for i in range(1, count))
            pixels.append({
                "loop": ploop, "steps": steps,
                "head": [f"const int32_t *pairs = {c_offset('input', [(ploop, words)])};",
                         f"int8_t *o0 = {out}{outs};", *_accumulators(sums, count)],
                "stores": [f"o{i}[{j}] = {prefix}_output(acc[{i * width + j}], {c});"
                           for i in range(count) for j, c in enumerate(channels)]})
        blocks.append({"loop": loop, "pixels": pixels,
                       "head": [f"arenac_widen_1(w, {rows}, {width * m.groups});"]})
    helpers = {"arm_dsp", "arm_dsp_widen_1", *(f"arm_dsp_mac16_{k}" for k in kinds),
               *(f"arm_dsp_widen_{count}" for loop, count in pixel_loops
                 if full and loop.runs),
               *(["arm_dsp_partial"] if tail else []), *output_helpers(tables, output)}
    tables = [{"name": f"{prefix}_filter", "ctype": "int8_t", "align": "ARENAC_ALIGN(4) ",
               "length": c_length(m.packed().size), "data": c_array(m.packed()),
               "comment": c_comment(
                   f"{what}: the filter ({m.channels} x {m.depth}) in the order the loop reads "
                   "it: for each pair of output channels, their rows four weights at a time, "
                   f"alternating; each row padded with zeros to {m.groups * GROUP}")},
              *tables]
    values = {
        "fn": ctx.fn, "prefix": prefix, "tables": tables, "output": output,
        "output_comment": c_comment(f"Output channel c from its sum: {output_comment}"),
        "x": ctx.inputs[0].ptr, "out": ctx.outputs[0].ptr, "input": ctx.scratch[0],
        "filter": ctx.scratch[1], "widening": widening, "blocks": blocks,
        "counters": written_vars([loop for loop, _ in pixel_loops]
                                 + [b["loop"] for b in blocks] + step_loops),
        "comment": c_comment(
            f"{what} for the Arm DSP extension: a matrix multiply of {m.pixels} pixels of "
            f"{m.depth} values by {m.channels} filter rows, the whole input first widened to "
            "int16 pairs in the arena, then two output channels at a time: their filter rows "
            "widened into the arena, and three pixels by the two channels a step, each __smlad "
            "adding two products of int16 words read as they are")}
    return Kernel(render_macro(TEMPLATE, "pointwise_staged", values),
                  tuple(sorted(helpers)), includes=("arm_acle.h",))


def emit_fc(ctx: OpContext) -> Kernel:
    p: FullyConnectedQuantizedParams = ctx.params
    bias = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    m = fc_matmul(p, ctx.inputs[1].data, None if bias is None else bias.data)
    values = pointwise_values(ctx, m, fc_output(m, p),
                              f"FULLY_CONNECTED '{ctx.outputs[0].name}'")
    return Kernel(render_macro(TEMPLATE, "pointwise", values), values["helpers"],
                  includes=("arm_acle.h",))


# -- CONV_2D through im2col -----------------------------------------------------------------


@dataclass(frozen=True)
class Im2col:
    """An int8 CONV_2D of any filter and stride (no dilation) as the DSP kernel runs it: output
    row by output row, a block of pixels at a time (`Matmul.block`), each pixel's window (`kh`
    rows of `kw` * `depth` values, in the filter's (ky, kx, c) order) copied into the scratch
    as int8, the padding the input zero point (whose product with the input offset added is 0,
    as the reference's skipped taps), then widened into the pairs the pointwise kernel's steps
    read. `matmul`: the
    windows times the filter rows, with its packed filter, folded sums and output stage."""

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
    """A CONV_2D's, or a DEPTHWISE_CONV_2D's of one input channel: a convolution whose filter
    rows are the depth multiplier's."""
    batch, height, width, depth = p.input_shape
    _, out_h, out_w, channels = p.output_shape
    kh, kw = p.window.filter
    # [channels, kh * kw * depth]; a depthwise filter of one channel is [1, taps, channels]
    weights = np.asarray(p.weights[0], np.float64).T.astype(np.int64)
    bias = np.asarray(p.bias, np.float64).astype(np.int64)
    m = Matmul(1, 1, batch * out_h * out_w, 0, 0, 0, kh * kw * depth, channels, weights, bias,
               p.input_offset)
    return Im2col(batch, height, width, depth, out_h, out_w, kh, kw, tuple(p.window.stride),
                  tuple(p.window.padding), m)


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


def im2col_scratch(p: ConvParams | DepthwiseConvParams) -> tuple[MemoryRequest, ...]:
    """A block's windows widened (8 bytes per four values and pixel), and as int8."""
    d = im2col_of(p)
    pixels = min(d.matmul.block, d.matmul.pixels)
    plural = "s" if pixels > 1 else ""
    return (MemoryRequest(pixels * d.matmul.groups * 8,
                          f"the windows of {pixels} pixel{plural} widened to int16 pairs"),
            MemoryRequest(pixels * d.window, f"the windows of {pixels} pixel{plural} as int8"))


def window_values(prefix: str, d: Im2col, direct: int, window: bool) -> dict:
    """The values of the functions that copy windows out of the input (the template's
    `window`): `{prefix}_row` always, `{prefix}_window` (one pixel's window, int8) if `window`,
    `{prefix}_widen` (the windows of `direct` pixels widened, filter row by filter row) if
    `direct`."""
    sw = d.stride[1]
    rows_outside, columns_outside = d.reaches_outside(0), d.reaches_outside(1)
    last = d.width - d.kw - (direct - 1) * sw  # the last column all the block's rows are in
    inside = [*(["iy + ky >= 0", f"iy + ky < {d.height}"] if rows_outside else []),
              *(["ix >= 0", f"ix <= {last}"] if columns_outside else [])]
    pixels = range(direct)
    return {
        "prefix": prefix, "d": d, "zero_point": -d.matmul.input_offset,
        "rows_outside": rows_outside, "columns_outside": columns_outside,
        "last_column": d.width - d.kw, "direct": direct, "window": window,
        "inside": " && ".join(inside) or "1", "row_words": 2 * direct * (d.row // GROUP),
        "row_groups": d.row // GROUP, "count": direct,
        "rows_in": ", ".join(["xr", *(f"xr + {i * sw * d.depth}" for i in pixels[1:])]),
        "rows_copied": ", ".join(["windows", *(f"windows + {i * d.row}" for i in pixels[1:])]),
        "copies": [(f"windows + {i * d.row}" if i else "windows", f"ix + {i * sw}" if i else "ix")
                   for i in pixels],
        "row_comment": c_comment(
            f"Filter row y - iy of one output pixel's window into `row`: {d.kw} x {d.depth} "
            "values from input row y, column ix on; those outside the image the input zero "
            "point"),
        "window_comment": c_comment(
            f"One output pixel's window into `window`, in the filter's order: {d.kh} rows of "
            f"{d.kw} x {d.depth} values; (iy, ix) is its top left corner in the input, which "
            "may lie in the padding"),
        "direct_comment": c_comment(
            f"The windows of the {direct} output pixels from column ix on (every {sw}) widened "
            "into `pairs` filter row by filter row: a row inside the image straight from the "
            "input, another copied into `windows` first")}


def emit_im2col(ctx: OpContext) -> Kernel:
    p: ConvParams | DepthwiseConvParams = ctx.params
    d = im2col_of(p)
    m = d.matmul
    prefix = ctx.prefix
    sh, sw = d.stride
    pt, pl = d.padding
    batches, rows = ConstantLoop("b", d.batches), ConstantLoop("r", d.out_h)
    size = m.block
    whole = d.out_w - d.out_w % size
    block = ConstantLoop("p", whole, 0, size)
    rest = ConstantLoop("p", d.out_w, whole, max(d.out_w % size, 1))
    image, row_out = d.height * d.width * d.depth, d.out_w * m.channels
    orow = c_offset("out", [(batches, d.out_h * row_out), (rows, row_out)])
    row_head = [f"const int8_t *xb = {c_offset('x', [(batches, image)])};",
                f"const int iy = {c_sum([(rows, sh)], -pt)};",
                f"int8_t *orow = {orow};"]

    # a filter row holding whole groups: the rows of a whole block's windows inside the image
    # widen straight from the input
    direct = d.row % GROUP == 0 and size > 1 and block.runs

    def head(count: int, loop: ConstantLoop) -> list[str]:
        """The block's outputs, and its windows copied and widened into the scratch."""
        outs = "".join(f", *o{i} = o{i - 1} + {m.channels}" for i in range(1, count))
        lines = [f"int8_t *o0 = {c_offset('orow', [(loop, m.channels)])}{outs};"]
        if count == size and direct:
            return [*lines, f"{prefix}_widen(pairs, windows, xb, iy, "
                            f"{c_sum([(loop, sw)], -pl)});"]
        for i in range(count):
            lines.append(f"{prefix}_window({c_offset('windows', [], i * d.window)}, xb, iy, "
                         f"{c_sum([(loop, sw)], i * sw - pl)});")
        names = ", ".join(["windows", *(f"windows + {i * d.window}" for i in range(1, count))])
        lines.append(f"arenac_widen_{count}(pairs, {names}, {m.groups});")
        return lines

    pixels = [{"loop": loop, "head": head(count, loop), "count": count}
              for loop, count in ((block, size), (rest, d.out_w % size)) if loop.runs]
    opcode = "CONV_2D" if isinstance(p, ConvParams) else "DEPTHWISE_CONV_2D of one channel"
    what = f"{opcode} '{ctx.outputs[0].name}' {d.kh}x{d.kw}"
    comment = (
        f"{what} for the Arm DSP extension, output row by output row: "
        f"{('one pixel', 'two pixels', 'three pixels')[min(size, d.out_w) - 1]} at a time, "
        "each pixel's window of "
        f"{m.depth} values widened to int16 pairs in the arena ("
        + ("filter rows inside the image straight from the input, the others copied first"
           if direct else "copied first")
        + ", the padding the input zero point), then multiplied by the filter two output "
        "channels at a time, each __smlad adding two products")
    values = matmul_values(ctx, m, conv_output(m, p.output), what, comment,
                           [batches, rows, block, rest], row_head, pixels,
                           {f"arm_dsp_widen_{p['count']}" for p in pixels})
    tail = d.window - m.depth
    values["patch"] = window_values(prefix, d, size if direct else 0,
                                    not direct or rest.runs)
    values["windows"] = ctx.scratch[1]
    values["setup"] = [f"memset({c_offset('windows', [], i * d.window + m.depth)}, 0, {tail});"
                       for i in range(pixels[0]["count"]) if tail]
    return Kernel(render_macro(TEMPLATE, "pointwise", values), values["helpers"],
                  includes=("arm_acle.h",))


# -- DEPTHWISE_CONV_2D ---------------------------------------------------------------------


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


def depthwise_of(p) -> Depthwise:
    batch, height, width, channels = p.input_shape
    _, out_h, out_w, _ = p.output_shape
    kh, kw = p.window.filter
    weights = np.asarray(p.weights[:, :, 0], np.float64).astype(np.int64)  # [channels, taps]
    bias = np.asarray(p.bias, np.float64).astype(np.int64)
    return Depthwise(batch, height, width, channels, out_h, out_w, kh, kw,
                     tuple(p.window.stride), tuple(p.window.padding), weights, bias,
                     p.input_offset)


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


def depthwise_scratch(p) -> tuple[MemoryRequest, ...]:
    d = depthwise_of(p)
    return (MemoryRequest(d.kh * d.channels * d.line * 2,
                          f"the {d.kh} input rows an output row reads, widened to int16, "
                          "per channel"),)


def depthwise_overlaps(graph: Graph, op: Operator, p) -> list[OverlapRule]:
    """The portable convolution's rule, row by row of the output: this kernel reads an input
    row only when it widens it, before it writes the first output row whose window holds it,
    so after output row r it has read no input row below the last of r's window, and it reads
    none above the first of it again."""
    return overlaps.convolution(graph, op)


def emit_depthwise(ctx: OpContext) -> Kernel:
    p = ctx.params
    d = depthwise_of(p)
    prefix = ctx.prefix
    m = d.matmul()
    name = ctx.outputs[0].name
    what = f"DEPTHWISE_CONV_2D '{name}' {d.kh}x{d.kw}"
    tables, output, output_comment = output_values(
        prefix, conv_output(m, p.output),
        (m.sums(), f"{what}: per channel, bias + input offset * the filter's sum (int32, "
                   "wrapped)"))
    tables = [
        {"name": f"{prefix}_filter", "ctype": "int32_t", "align": "",
         "length": c_length(d.channels * d.kh * d.row_words),
         "data": c_array(d.packed().ravel(), 8),
         "comment": c_comment(
             f"{what}: per channel and filter row, the weights of two adjacent taps as an "
             "int16 pair (left tap in the lower half" +
             ("), then those pairs one tap on (for the second pixel of a pair)"
              if d.shared_loads else ", the last one with 0)" if d.kw % 2 else ")"))},
        *tables,
    ]
    sh, sw = d.stride
    slot, channel = d.line, d.kh * d.line  # the scratch is [channel][slot][line]
    # input row py sits at slot py % kh; output row oy's window starts at row oy * sh (its
    # turn, mod kh), so slot s holds its filter row (s - turn) mod kh, whose words start at f_s:
    # one call of the row function per turn, the f_s constants in each
    words = d.row_words
    turn_args = [f"f{s}" for s in range(d.kh)] if d.kh > 1 else []
    loads = [f"const int32_t w{s * words + j} = wc[{f'f{s}' + _plus(j) if turn_args else j}];"
             for s in range(d.kh) for j in range(words)]
    row_out = f"out + oy * {d.out_w * d.channels}"
    turns = sorted({oy * sh % d.kh for oy in range(d.out_h)})

    def call(turn: int) -> str:
        offsets = [str((s + d.kh - turn) % d.kh * words) for s in range(len(turn_args))]
        return f"{prefix}_row(rows, {', '.join([row_out, *offsets])});"

    calls = [call(turns[0])] if len(turns) == 1 else [
        f"switch ({'oy' if sh == 1 else f'oy * {sh}'} % {d.kh}) {{",
        *(line for t in turns for line in (f"case {t}:", f"  {call(t)}", "  break;")), "}"]
    even = d.out_w - d.out_w % 2

    def word_loads(row: int, count: int, pairs: bool) -> list[str]:
        """Words a0..a{count - 1} of a filter row from r + row on, two by two with LDRD where
        `pairs` (both pixels' words: the pair's first pixel is even, so they are aligned)."""
        lines = []
        for j in range(0, count, 2):
            at = c_offset("r", [], row + 2 * j)
            if pairs and j + 1 < count:
                lines.append(f"arenac_load2((const int32_t *)(const void *)({at}), &a{j}, "
                             f"&a{j + 1});")
                continue
            lines += [f"a{i} = arenac_load32((const int8_t *)({c_offset('r', [], row + 2 * i)}));"
                      for i in range(j, min(j + 2, count))]
        return lines

    def shared_taps(count: int) -> list[str]:
        """Pixel ox (and ox + 1) from the k + 1 words of each filter row (`shared_loads`)."""
        k = d.kw // 2
        lines = [f"int32_t {', '.join(f'a{j}' for j in range(k + 1))};"]
        for ky in range(d.kh):
            row, w = ky * slot, ky * words
            lines += word_loads(row, k + 1, count == 2)
            lines += [f"acc0 = __smlad(a{j}, w{w + j}, acc0);" for j in range(k)]
            lines.append(f"acc0 = __smlabt(a{k}, w{w + 2 * k - 1}, acc0);")
            if count == 2:
                lines.append(f"acc1 = __smlatb(a0, w{w}, acc1);")
                lines += [f"acc1 = __smlad(a{j + 1}, w{w + k + j}, acc1);" for j in range(k)]
        return lines

    def pixels(loop: ConstantLoop, count: int) -> dict:
        """Output pixels ox (and ox + 1) of channel c: tap pair j of filter row ky at
        wr + ky * slot + ox * sw + 2 * j."""
        lines = [f"const int16_t *r = {c_offset('wr', [(loop, sw)])};",
                 f"int32_t {', '.join(f'acc{i} = sum' for i in range(count))};"]
        stores = [f"o[{c_sum([(loop, d.channels)], i * d.channels)}] = "
                  f"{prefix}_output(acc{i}, c);" for i in range(count)]
        if d.shared_loads:
            return {"loop": loop, "lines": lines + shared_taps(count) + stores}
        if sw == 2 and count == 2:  # pixel ox + 1's words are pixel ox's from the second on
            lines.append(f"int32_t {', '.join(f'a{j}' for j in range(d.pairs + 1))};")
            for ky in range(d.kh):
                lines += word_loads(ky * slot, d.pairs + 1, True)
                lines += [f"acc{i} = __smlad(a{j + i}, w{ky * d.pairs + j}, acc{i});"
                          for i in range(2) for j in range(d.pairs)]
            return {"loop": loop, "lines": lines + stores}
        for i in range(count):
            lines += [f"acc{i} = __smlad(arenac_load32((const int8_t *)"
                      f"({c_offset('r', [], ky * slot + 2 * j + i * sw)})), "
                      f"w{ky * d.pairs + j}, acc{i});"
                      for ky in range(d.kh) for j in range(d.pairs)]
        return {"loop": loop, "lines": lines + stores}

    pair, single = ConstantLoop("ox", even, 0, 2), ConstantLoop("ox", d.out_w, even)
    if d.out_w <= UNROLLED_PIXELS:  # the pairs written out: no loop, every offset a constant
        pairs = [ConstantLoop("ox", ox + 2, ox, 2) for ox in range(0, even, 2)]
    else:
        pairs = [pair]
    blocks = [pixels(loop, count) for loop, count in [*((p, 2) for p in pairs), (single, 1)]
              if loop.runs]
    # one input pixel's channels into their lines: written out, or UNROLL a trip
    copies = [f"lp[{j * channel}] = xp[{j}];" for j in range(min(d.channels, UNROLLED))]
    if d.channels > UNROLLED:
        unroll = next(u for u in (UNROLL, 4, 2, 1) if d.channels % u == 0)
        copies = [f"for (c = 0; c < {d.channels}; c += {unroll}, xp += {unroll}, "
                  f"lp += {unroll * channel}) {{",
                  *(f"  {line}" for line in copies[:unroll]), "}"]
    # stride below the filter height: the window's rows overlap the previous output row's
    first_row = (f"oy == 0 ? 0 : (oy - 1) * {sh} + {d.kh}" if sh < d.kh else
                 "oy" if sh == 1 else f"oy * {sh}")
    values = {
        "fn": ctx.fn, "prefix": prefix, "tables": tables,
        "output_comment": c_comment(f"Output channel c from its sum: {output_comment}"),
        "output": output, "x": ctx.inputs[0].ptr, "out": ctx.outputs[0].ptr,
        "scratch": ctx.scratch[0],
        "comment": c_comment(
            f"{what} for the Arm DSP extension, output row by output row: the input rows it "
            f"reads that the previous one did not widened to int16 into the {d.kh} slots of "
            f"the arena (a line of {d.line} values per channel, the padding the input zero "
            "point), then per channel its filter words kept in registers, two output pixels "
            "at a time" + (" sharing the words they read" if d.shared_loads or sw == 2 else "")
            + ", each __smlad adding two taps' products"),
        "d": d, "zero_point": -d.input_offset, "channel": channel, "loads": loads,
        "pixels": blocks, "ox": any(p.written for p in pairs), "first_row": first_row,
        "copies": copies,
        "turn_args": turn_args, "calls": calls,
        "row_comment": c_comment(
            f"One output row of {what}, channel by channel: o its first output, and the filter "
            "row of slot s starting at the channel's word f_s (the slots turn as output rows "
            "go down)" if turn_args else f"One output row of {what}, channel by channel: o its "
            "first output"),
        "slot_of_row": f"(py % {d.kh})" if d.kh > 1 else "0",
        "column": f"ix - {d.padding[1]}" if d.padding[1] else "ix",
        "left": min(d.padding[1], d.line), "inside": min(d.padding[1] + d.width, d.line),
        "sum": sum_of(prefix, tables, "c"),
        "helpers": tuple(sorted({"arm_dsp", *(["arm_dsp_load2"] if any(
            "arenac_load2" in line for b in blocks for line in b["lines"]) else [])}
                                | output_helpers(tables, output))),
    }
    return Kernel(render_macro(TEMPLATE, "depthwise", values), values["helpers"],
                  includes=("arm_acle.h",))


# -- ADD and SUB ---------------------------------------------------------------------------


def add_rounding(p) -> SingleRounding | None:
    """The output stage of an int8 ADD or SUB in one rounding: its inputs' rescaled values
    (tables, as the portable kernel's) combine into a sum within the tables' extremes, which
    TFLite's MultiplyByQuantizedMultiplier turns into the output; None where no single rounding
    matches it on every such sum."""
    if p.output_shift > 0:
        return None
    first = rescaled_inputs(p, p.input1_offset, p.input1_multiplier, p.input1_shift)
    second = rescaled_inputs(p, p.input2_offset, p.input2_multiplier, p.input2_shift)
    if p.opcode == "SUB":
        second = -second
    low, high = p.activation_min - p.output_offset, p.activation_max - p.output_offset
    mult, shift = p.output_multiplier, p.output_shift
    found = single_roundings(
        lambda acc: multiply_by_quantized_multiplier(acc, mult, shift), low, high,
        np.array([first.min() + second.min()]), np.array([first.max() + second.max()]),
        [mult], [31 - shift + (1 if mult == 0 else 0)])
    return found[0] if found else None


def accepts_add(graph: Graph, op: Operator, p) -> str | None:
    if not isinstance(p, RescaledParams) or p.dtype != "int8" or p.opcode not in ("ADD", "SUB"):
        return "not an int8 ADD or SUB"
    if add_rounding(p) is None:
        return "no single rounding matches its output stage"
    return None


def emit_add(ctx: OpContext) -> Kernel:
    """The portable kernel's loops and input tables; the output stage in one rounding."""
    p = ctx.params
    r = add_rounding(p)
    stage = OutputStage(p.activation_min - p.output_offset, p.activation_max - p.output_offset,
                        p.output_offset, (r,))
    _, lines, _ = output_values(ctx.prefix, stage)
    values = binary_values(ctx)
    values["body"] = [f"const int32_t acc = {'x + y' if p.opcode == 'ADD' else 'x - y'};",
                      *(line for line in lines if line != "(void)c;")]
    values["op_function"] = render_macro(ELEMENTWISE_TEMPLATE, values["macro"], values)
    text = render_macro(ELEMENTWISE_TEMPLATE, "binary", values)
    uses_ivdep = values["nest"] is not None and values["nest"]["inner"]["ivdep"]
    return Kernel(text, ("ivdep",) if uses_ivdep else (), includes=("arm_acle.h",))


# -- AVERAGE_POOL_2D and MAX_POOL_2D -------------------------------------------------------

MAX_AVERAGE_TAPS = 256  # an int16 lane holds the sum of this many int8 values


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
    average (halves away from zero) and the activation's clamp, per channel."""
    p: Pool2DParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    batch_size, height, width, channels = x.shape
    average = ctx.op.opcode == "AVERAGE_POOL_2D"
    batch, out_y, out_x = (ConstantLoop("b", batch_size), ConstantLoop("oy", p.output_height),
                           ConstantLoop("ox", p.output_width))
    group = ConstantLoop("c", channels, 0, GROUP)
    wy = window_axis("y", out_y, p.stride_height, p.pad_top, height, p.filter_height)
    wx = window_axis("x", out_x, p.stride_width, p.pad_left, width, p.filter_width)
    (y_terms, y_first), (x_terms, x_first) = wy.index, wx.index
    row = c_offset("x", [(batch, height * width * channels),
                         *[(t, c * width * channels) for t, c in y_terms],
                         *[(t, c * channels) for t, c in x_terms], (group, 1)],
                   (y_first * width + x_first) * channels)
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
    loops = (batch, out_y, out_x, wy.loop, wx.loop, group)
    values = {
        "fn": ctx.fn, "x": x.ptr, "out": out.ptr, "batch": batch, "out_y": out_y,
        "out_x": out_x, "group": group, "window_y": wy.loop, "window_x": wx.loop,
        "y_lines": wy.lines, "x_lines": wx.lines, "pixel_lines": count_lines + o_lines,
        "row": row, "init": init, "accumulate": accumulate, "finish": finish,
        "counters": ", ".join(loop.var for loop in loops if loop.written),
        "comment": c_comment(
            f"{ctx.op.opcode} '{out.name}' for the Arm DSP extension: four channels a word, "
            + ("their sums in int16 lanes (__sxtab16), then each divided as the reference "
               "does (halves away from zero)" if average else
               "their maxima per byte lane (SSUB8 and SEL)")
            + ", the activation's clamp")}
    helpers = ("arm_dsp", "arm_dsp_sxtab16") if average else ("arm_dsp", "arm_dsp_max8")
    return Kernel(render_macro(TEMPLATE, "pool", values), helpers, includes=("arm_acle.h",))


def _lanes(value: int) -> str:
    """An int8 value in each byte of a word, as C."""
    return f"(int32_t)0x{(value & 0xFF) * 0x01010101:08X}u"


_INT8 = kernels("int8, int8, int32? -> int8", targets=DSP_TARGETS)

TARGET_KERNELS: tuple[TargetKernel, ...] = (
    TargetKernel("CONV_2D", "dsp-1x1-staged", _INT8, accepts_staged, emit_staged,
                 scratch=staged_scratch, overlaps=staged_overlaps, scratch_alignment=WORD),
    TargetKernel("CONV_2D", "dsp-1x1", _INT8, accepts_conv, emit_conv,
                 scratch=lambda p: pointwise_scratch(conv_matmul(p)),
                 overlaps=pointwise_overlaps, scratch_alignment=WORD),
    TargetKernel("CONV_2D", "dsp-im2col", _INT8, accepts_im2col, emit_im2col,
                 scratch=im2col_scratch, overlaps=lambda graph, op, p: overlaps.convolution(
                     graph, op), scratch_alignment=WORD),
    TargetKernel("ADD", "dsp-add", kernels("int8, int8 -> int8", targets=DSP_TARGETS),
                 accepts_add, emit_add, overlaps=lambda graph, op, p: overlaps.elementwise(0, 1)(
                     graph, op)),
    TargetKernel("SUB", "dsp-add", kernels("int8, int8 -> int8", targets=DSP_TARGETS),
                 accepts_add, emit_add, overlaps=lambda graph, op, p: overlaps.elementwise(0, 1)(
                     graph, op)),
    TargetKernel("FULLY_CONNECTED", "dsp", _INT8, accepts_fc, emit_fc,
                 scratch=lambda p: pointwise_scratch(fc_matmul(p, None, None)),
                 scratch_alignment=WORD),
    TargetKernel("DEPTHWISE_CONV_2D", "dsp-im2col", _INT8, accepts_im2col, emit_im2col,
                 scratch=im2col_scratch, overlaps=lambda graph, op, p: overlaps.convolution(
                     graph, op), scratch_alignment=WORD),
    TargetKernel("DEPTHWISE_CONV_2D", "dsp-depthwise", _INT8, accepts_depthwise,
                 emit_depthwise, scratch=depthwise_scratch, overlaps=depthwise_overlaps,
                 scratch_alignment=WORD),
    # the window's order of reads and the output pixel's writes as the portable kernel's
    TargetKernel("AVERAGE_POOL_2D", "dsp", kernels("int8 -> int8", targets=DSP_TARGETS),
                 accepts_pool, emit_pool, overlaps=lambda graph, op, p: overlaps.pooling(
                     graph, op)),
    TargetKernel("MAX_POOL_2D", "dsp", kernels("int8 -> int8", targets=DSP_TARGETS),
                 accepts_pool, emit_pool, overlaps=lambda graph, op, p: overlaps.pooling(
                     graph, op)),
)
