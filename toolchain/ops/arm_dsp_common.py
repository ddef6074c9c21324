"""What the kernels for the Arm cores with the DSP extension (cortex-m4, cortex-m7 and
cortex-m33) share across op families: the pointwise matrix multiply and the output stage.

The kernels themselves sit in their families' folders, beside the portable ones
(toolchain/ops/{conv,fully_connected,elementwise,pooling}/arm_dsp.py). They run from the params
of the portable kernels and compute the same int32 sums and the same requantized values, bit
for bit; only the order of the work and the instructions differ. The C uses ACLE's intrinsics
from <arm_acle.h> (__sxtb16, __smlad), which GCC and Clang both provide for these cores;
templates/c/arm_dsp.c.j2 lays it out.

Pointwise matrix multiply (int8 FULLY_CONNECTED, and CONV_2D with a 1x1 filter, any stride):
the output is a matrix of pixels (FULLY_CONNECTED: batch rows) by output channels (units), each
value a dot product of a pixel's input channels with a filter row. Two pixels by two channels
at a time (2x2 register blocking: four sums, each input word and weight word loaded once for
two products), three pixels by two channels over more than one group of four input channels
on the single-issue cores, more than eight on the Cortex-M7 (3x2: six sums, both channels'
weights loaded once for three pixels; `Matmul.block_on`):

- the block's inputs are widened once into the op's scratch (planned in the arena: 8 bytes
  per four input channels and pixel) as int16 pairs, four values x0..x3 becoming the words (x0, x2)
  and (x1, x3), which is what __sxtb16 and its rotated form make of one word;
- the filter is reordered at generation time so that the rows of each pair of channels
  alternate four weights at a time (the 2x2 step reads eight consecutive bytes), each row
  padded with zeros to a multiple of four; the weights widen in the loop as the inputs did, so
  lane (x0, x2) meets (w0, w2) and lane (x1, x3) meets (w1, w3): __smlad adds both products;
  over WIDE_FILTER_PIXELS pixels or more the filter is stored widened instead (int16 pairs in
  flash, no widening in the loop);
- where it pays (`Matmul.joint_pays`: many channels, few pixels a block, such as a dense
  layer's) each channel pair a, b is stored as joint words instead (`joint_words`): four
  depths as (a0 + 128, b0, a2 + 128, b2) and (a1 + 128, b1, a3 + 128, b3). __smlad of a joint
  word adds a's products plus 256 times b's plus 128 times the inputs; __sxtb16 of its high
  bytes gives b's weights, whose products a second __smlad adds alone; b's sum times 256 and
  the inputs' sum times 128 (the pixel's lift, taken once a block) come off at the end. That is
  two __sxtb16 per pair and group where widening both channels' weights takes four;
- the bias and the input offset times each filter row's sum are folded into one int32 per
  channel (wrapping as TFLite's int32 sums do), so the loop is a plain int8 dot product;
- the requantization is one 32 x 32 -> 64-bit multiply-add and a shift where
  toolchain/numerics/rounding.py proves it equal to the reference's rounding (FULLY_CONNECTED's
  double one, the convolutions' MultiplyByQuantizedMultiplier) on every accumulator the op can
  produce (the output zero point folded into its rounding where the 64-bit sum has room, so
  that the clamp is one SSAT); where the rounding can be an offset folded into the channel's
  sum plus a multiple of 2^32 (`high_word`), the multiply-add is one SMMLA, its high word
  alone; otherwise it is the reference's arithmetic itself (`OutputStage`, `output_values`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from toolchain.ir import INT32_MAX, INT32_MIN
from toolchain.numerics.fixedpoint import wrap_int32
from toolchain.numerics.rounding import (
    SIGN_STEP,
    HighWord,
    SingleRounding,
    accumulator_range,
    high_word,
)
from toolchain.ops.emit import (
    CDefinition,
    ConstantLoop,
    OpContext,
    c_array,
    c_comment,
    c_int64,
    c_length,
    c_offset,
    c_sum,
    definition,
    render_macro,
    table_definition,
    written_vars,
)
from toolchain.ops.spec import MemoryRequest

DSP_TARGETS = ("cortex-m4", "cortex-m7", "cortex-m33")
TEMPLATE = "c/arm_dsp.c.j2"


def output_stages(output: list[str]) -> dict | None:
    """An output function's lines as two stages, where they are: `rounded`, up to the rounded
    sum q (the multiply, which the dual-issue Cortex-M7 takes two cycles to hand on), and
    `saturated`, from q alone; None where its lines do not part there."""
    rounded = next((k for k, line in enumerate(output) if line.startswith("const int32_t q = ")),
                   None)
    if rounded is None or any("c" in re.findall(r"\w+", line) for line in output[rounded + 1:]):
        return None
    return {"rounded": output[:rounded + 1], "saturated": output[rounded + 1:]}


def parted(output: list[str], target: str) -> list[str]:
    """The output lines whose stages block_stores may part: on a core that issues two
    instructions a cycle (the Cortex-M7), where each saturation issues beside a rounding or a
    store; none on the single-issue cores, whose parted stores measure no faster."""
    return [] if target in IN_ORDER_TARGETS else output


def channel_record(prefix: str, output: list[str]) -> str | None:
    """The struct type of the output function's channel record where a kernel may read the
    channel's constants and folded sum through a pointer to it (`{prefix}_rounded_at`): the
    function parts in two stages and reads nothing of channel c but that record, k."""
    found = output and re.fullmatch(rf"const (\w+) \*k = &{prefix}_channel\[c\];", output[0])
    if (not found or output_stages(output) is None
            or any("c" in re.findall(r"\w+", line) for line in output[1:])):
        return None
    return found.group(1)


def record_pointer(prefix: str, record: str, channel: str) -> str:
    """The line that points kc at channel `channel`'s record (channel_record): the kernels'
    stores read the channel's constants through it (`{prefix}_rounded_at`)."""
    return f"const {record} *kc = &{prefix}_channel[{channel}];"


def block_stores(prefix: str, output: list[str], stores: list[tuple[str, str, str]],
                 record: bool = False, dual_issue: bool = True) -> list[str]:
    """A block's stores (target, sum, channel): where the output function parts in two stages,
    every saturation beside an instruction that does not read its result, the next rounding's
    multiply or an earlier saturation's store (the dual-issue Cortex-M7 then issues the two in
    one cycle), in that order against GCC's scheduling (ARENAC_IN_TURN between them); else
    one output call each. `record`: the channel is a pointer to its record (channel_record),
    read before the first store, which could alias it for all GCC knows; `dual_issue`: false
    on the single-issue cores, whose stages then run in the order written, each rounding
    first."""
    if output_stages(output) is None:
        return [f"{target} = {prefix}_output({acc}, {channel});"
                for target, acc, channel in stores]
    rounded = f"{prefix}_rounded_at" if record else f"{prefix}_rounded"
    roundings = [f"const int32_t q{k} = {rounded}({acc}, {channel});"
                 for k, (_, acc, channel) in enumerate(stores)]
    saturations = [f"const int8_t y{k} = {prefix}_saturated(q{k});" for k in range(len(stores))]
    writes = [f"{target} = y{k};" for k, (target, _, _) in enumerate(stores)]
    if not dual_issue:
        return roundings + [line for pair in zip(saturations, writes, strict=True)
                            for line in pair]
    order, written = roundings[:2], 0
    for k, saturation in enumerate(saturations):
        order.append(saturation)
        if k + 2 < len(roundings):
            order.append(roundings[k + 2])
        elif written < k:
            order.append(writes[written])
            written += 1
    order += writes[written:]
    return [line for k, statement in enumerate(order)
            for line in ([statement] if k == 0 else ["ARENAC_IN_TURN();", statement])]


def kernel_definitions(v: dict, *functions: CDefinition) -> tuple[CDefinition, ...]:
    """What a DSP or Helium kernel's function uses at file scope, in file order: its tables,
    its `_output` (and its two stages, where it has them), the functions that gather its
    windows (`patch`, window_values) and any further `functions` of its own; a blank line after
    each."""
    found = [table_definition(t, gap=True) for t in v["tables"]]
    stages = output_stages(v["output"])
    record = v.get("record")
    if record:  # the stores pass a pointer to the channel's record: no line to find it
        stages = {**stages, "rounded": stages["rounded"][1:]}
    # `parted` or `record`: the kernel's stores call the two stages (block_stores), not `_output`
    whole = not (stages and (v.get("parted") or record))
    found.append(definition(f"{v['prefix']}_output",
                            render_macro(TEMPLATE, "output_function",
                                         {**v, "stages": stages, "record": record,
                                          "whole": whole}),
                            gap=True))
    patch = v.get("patch")
    if patch:
        found += [definition(f"{patch['prefix']}_{part}",
                             render_macro(TEMPLATE, f"window_{part}", patch), gap=True)
                  for part, wanted in (("row", True), ("window", patch["window"]),
                                       ("source", bool(patch["widens"]))) if wanted]
        found += [definition(w["name"], render_macro(TEMPLATE, "window_widen", {**patch, **w}),
                             gap=True) for w in patch["widens"]]
    return (*found, *functions)
GROUP = 4  # int8 values a word holds
WORD = 4  # the scratch is read in words (LDRD needs them aligned)
UNROLLED = 16  # depth groups written out without a loop
# depth groups a loop trip takes beyond that: its counter, compare and branch (about 6 cycles
# on a Cortex-M4) over 16 steps, not 8, take 1.5-2.5% fewer estimated cycles on
# pretrainedResnet_quant's im2col layers, for about 1 KiB of code a layer
TRIP = 16
# More depth groups than this, and a block takes three pixels (the 3x2 step), on each DSP core:
# on the single-issue cores from two groups on (vww_96_int8's 1x1 layers of 8 to 32 input
# channels: 10.89 to 10.72 million estimated cycles on a Cortex-M4), on the dual-issue
# Cortex-M7 from three, where its pipelined 2x2 step runs the layers of 8 input channels
# faster (vww_96_int8: 5.52 million cycles, against 5.59 from two; from nine, as before, the
# same cycles for 1.3% more instructions)
THREE_PIXEL_GROUPS = {"cortex-m4": 1, "cortex-m33": 1, "cortex-m7": 2}
# Depth groups the 3x2 step writes out without a loop: a depth of up to 256 in one run saves
# the loop's counter, reload and branch, and the spills around the loop of the block's
# pointers and sums (vww_96_int8's 1x1 layers of 128 channels: 10.61 to 10.51 million cycles
# on the M4, for 1.3 KB of code a layer; of 256: a further 0.02 million for 4 KB); deeper
# ones loop by TRIP, their code growing no further.
UNROLLED_3X2 = 64
# A matrix multiply over at least this many pixels keeps its filter widened to int16 in flash:
# it then reads each weight word with no __sxtb16, which saves about pixels / 4 instructions
# per byte the wider filter adds (a 2-pixel block widens 8 weights in 4 instructions).
WIDE_FILTER_PIXELS = 100
# The `_runs` steps read their words with single loads, in runs, where the others pair them
# into LDRD. On a Cortex-M4 (and M33, whose timing is taken as the M4's) a load costs two
# cycles, one in a run behind another, and LDRD three, so five loads in a run serve six __smlad
# for six cycles where LDRD steps take nine. The dual-issue Cortex-M7 reads an LDRD in one cycle
# but issues it alone, where a single load issues beside a __smlad: it reads single loads too,
# in the `_runs` steps, in its own pipelines of the int16 steps (PIPELINED_TARGETS) and in the
# int8 step of three pixels (arenac_mac_3x2, whose LDRD costs the M4 no more than two loads).
# The single-issue cores, whose kernels of load runs keep GCC's scheduling after register
# allocation off (ARENAC_DSP_IN_ORDER): it would spread each run between the multiplies. On the
# Cortex-M7 that spreading pairs each load with a multiply, and the kernels keep it.
IN_ORDER_TARGETS = ("cortex-m4", "cortex-m33")
# The dual-issue cores whose int16 3x2 and 2x2 steps are written out as one software pipeline
# (`paired_steps`): each load of the next half-step placed after the last multiply-add that
# reads the register it fills, so that each issues beside a multiply-add. Such a kernel keeps
# its order (PIPELINE, the helper group of a comment, brings ARENAC_DSP_IN_ORDER).
PIPELINED_TARGETS = ("cortex-m7",)
PIPELINE = "arm_dsp_pipeline"


def mac16_helper(kind: str, target: str) -> str:
    """The helper group of the int16 step `kind` (e.g. "3x2") on `target`: PIPELINE where the
    steps are written out in the kernel (`paired_steps`)."""
    if kind in ("3x2", "2x2") and target in PIPELINED_TARGETS:
        return PIPELINE
    return f"arm_dsp_mac16_{kind}{'_runs' if kind in ('3x2', '2x2') else ''}"


def widen_helper(pixels: int, target: str) -> str:
    """The helper group of arenac_widen_`pixels` on `target`: on the single-issue cores each
    widened word stored alone (an STRD costs three cycles there, two STRs two), elsewhere in
    STRD pairs (one cycle on the Cortex-M7)."""
    return f"arm_dsp_widen_{pixels}{'_apart' if target in IN_ORDER_TARGETS else ''}"


def runs_attribute(target: str) -> str:
    """The attribute of a kernel built from runs of single loads on `target`: GCC's scheduling
    after register allocation off on the single-issue cores, on for the dual-issue one."""
    return "ARENAC_DSP_IN_ORDER" if target in IN_ORDER_TARGETS else "ARENAC_DSP_KERNEL"


def runs_helpers(target: str) -> set[str]:
    """The helper group of a kernel built from runs of single loads on `target`: the definition
    of runs_attribute's ARENAC_DSP_IN_ORDER, or the Cortex-M7's reason to keep scheduling."""
    return {"arm_dsp_in_order"} if target in IN_ORDER_TARGETS else {"arm_dsp_dual_issue"}


def with_attribute_helpers(helpers: set[str], target: str) -> set[str]:
    """`helpers` and the groups kernel_attribute's attribute needs: a written-out pipeline
    keeps its order (its group brings ARENAC_DSP_IN_ORDER), else runs_helpers for the steps
    of load runs."""
    if PIPELINE in helpers or not any(h.endswith("_runs") for h in helpers):
        return helpers
    return helpers | runs_helpers(target)


def kernel_attribute(helpers: set[str], target: str) -> str:
    """The kernel function's attribute: GCC's scheduling after register allocation off where
    the kernel writes out a pipeline of its own, else runs_attribute where its steps are runs
    of loads."""
    if PIPELINE in helpers:
        return "ARENAC_DSP_IN_ORDER"
    return (runs_attribute(target) if any(h.endswith("_runs") for h in helpers)
            else "ARENAC_DSP_KERNEL")


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

    def packed(self, joint: bool = False) -> np.ndarray:
        """The filter as the loops read it: for each pair of channels, their rows four weights
        at a time, alternating, or (`joint`) their joint words (`joint_words`); an odd last
        channel's row alone; rows padded with zeros."""
        padded = np.zeros((self.channels, self.groups * GROUP), np.int64)
        padded[:, :self.depth] = self.weights
        pairs = self.channels // 2
        quads = padded[:pairs * 2].reshape(pairs, 2, self.groups, GROUP).transpose(0, 2, 1, 3)
        quads = joint_words(quads) if joint else quads
        return np.concatenate([quads.reshape(-1), padded[pairs * 2:].reshape(-1)])

    def joint_pays(self, pixels: int) -> bool:
        """Whether joint words (`joint_words`) save cycles in blocks of `pixels` pixels: two
        __sxtb16 per channel pair and depth group, against each pixel's lift (about six
        cycles a group and twelve a call) and its pairs' joint starts and ends (three)."""
        pairs = self.channels // 2
        return 2 * pairs * self.groups > pixels * (6 * self.groups + 3 * pairs + 12)

    def block_on(self, target: str) -> int:
        """Pixels a block takes along a row on `target`: three (the 3x2 step) over more depth
        groups than THREE_PIXEL_GROUPS says for the core, else two; a row's last one or two
        pixels are a block of their own."""
        return 3 if self.groups > THREE_PIXEL_GROUPS[target] and self.pixels >= 3 else 2

    @property
    def block(self) -> int:
        """The most pixels a block takes on any DSP core: what the scratch holds."""
        return max(self.block_on(target) for target in DSP_TARGETS)

    def blocks(self, size: int) -> list[tuple[int, int]]:
        """The blocks of pixels in the order the kernel runs them: (first output pixel, how
        many), `size` at a time along each row."""
        return [((b * self.rows + r) * self.pixels + i, min(size, self.pixels - i))
                for b in range(self.batches) for r in range(self.rows)
                for i in range(0, self.pixels, size)]

    def input_at(self, pixel: int) -> int:
        """The first input element output pixel `pixel` reads."""
        image, rest = divmod(pixel, self.rows * self.pixels)
        row, i = divmod(rest, self.pixels)
        return image * self.image_in + row * self.row_in + i * self.pixel_in


def joint_words(quads: np.ndarray) -> np.ndarray:
    """Channel pairs' weights [pair, group, channel, 4] as joint words, in the same shape:
    the group's four depths d0..d3 as the words (a0 + 128, b0, a2 + 128, b2) and (a1 + 128, b1,
    a3 + 128, b3), which meet the inputs' pairs (x0, x2) and (x1, x3) (arenac_mac_1x4_joint);
    the bytes as int8."""
    lifted = quads[:, :, 0] + 128  # a's weights as unsigned bytes, 0 to 255
    first = np.where(lifted > 127, lifted - 256, lifted)  # the same bytes as int8
    lanes = np.stack([first, quads[:, :, 1]], axis=-1)  # [pair, group, depth, channel]
    return lanes[:, :, [0, 2, 1, 3]].reshape(quads.shape)


def pointwise_scratch(m: Matmul) -> tuple[MemoryRequest, ...]:
    """Room for one block's inputs widened: 8 bytes per four input values and pixel."""
    pixels = min(m.block, m.pixels)
    return (MemoryRequest(pixels * m.groups * 8,
                          f"the inputs of {pixels} pixel{'s' if pixels > 1 else ''} widened "
                          "to int16 pairs"),)


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


def accumulator_ranges(acc_lo: np.ndarray, acc_hi: np.ndarray) -> tuple[tuple[int, int], ...]:
    return tuple(zip(acc_lo.tolist(), acc_hi.tolist(), strict=True))


def _double(value: float) -> str:
    text = repr(float(value))
    return text if ("." in text or "e" in text) else text + ".0"


PROVEN = (": at generation time toolchain/numerics/rounding.py proved it equal, after the clamp, "
          "to the reference's requantization on every sum this op can produce")


def int8_store(low: int, high: int) -> tuple[list[str], set[str]]:
    """The lines returning q (the zero point in it) as int8 clamped to [low, high], and the
    helper groups they call: one SSAT where an end of the clamp is int8's own, else a clamp."""
    if low == -128 or high == 127:  # SSAT, and the activation's other end
        rest = ("v" if (low, high) == (-128, 127) else
                f"(v < {low} ? {low} : v)" if high == 127 else f"(v > {high} ? {high} : v)")
        return ["const int32_t v = __ssat(q, 8);", f"return (int8_t){rest};"], set()
    return [f"return (int8_t)arenac_clamp(q, {low}, {high});"], {"clamp"}


def output_values(prefix: str, stage: OutputStage, sums: tuple[np.ndarray, str] | None = None
                  ) -> tuple[list[dict], list[str], str, set[str]]:
    """The tables, body lines and comment of the op's output function, and the fixed-point
    helper groups its lines call. `sums`: the channels' folded sums and their table's comment,
    for a kernel that starts its sums from them (read them with `sum_of`): they share a table
    with the requantization's per-channel constants where it has some, so that a channel's
    values are one address."""
    tables: list[dict] = []
    calls = {"clamp"}  # the store's, but where SSAT saturates

    def per_channel(name: str, ctype: str, values: list, literal=str) -> str:
        return _per_channel(tables, prefix, name, ctype, values, literal)

    clamp = f"arenac_clamp(q, {stage.low}, {stage.high})"
    store = [f"return (int8_t)({clamp}{plus_term(stage.zero_point)});"]
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
            + (abs(zp) << r.shift) < 2**62 for r, a in zip(s, magnitudes, strict=True))
        fold = zp if folded else 0
        fields = [(r.rounding + (fold << r.shift), r.negative_rounding + (fold << r.shift),
                   r.multiplier, r.shift - 32) for r in s]
        if folded:
            store, calls = int8_store(stage.low + zp, stage.high + zp)
        shared = all(a == b and n == fields[0][3] for a, b, _, n in fields)
        # the high-word forms: of one R for both signs, or of the negative R, 2^31 below the
        # other's (each in its interval: least and greatest)
        stepped = not shared and all(a - b == SIGN_STEP for a, b, _, _ in fields)
        highs = [high_word(r, fold << r.shift, lo, hi) for r, (lo, hi) in zip(s, ranges,
                                                                              strict=True)
                 ] if (shared or stepped) and folded and sums is not None else []
        struct = shared and sums is not None and len({f[:3] for f in fields}) > 1
        if highs and all(highs) and shared:
            lines, comment, sums = _high_word_output(prefix, tables, s, highs, sums,
                                                     fields[0][3], store)
        elif highs and all(highs):
            lines, comment, sums = _stepped_high_word_output(prefix, tables, s, highs, sums,
                                                             [f[3] for f in fields], store)
        else:
            lines, comment, sums = _rounding_output(prefix, tables, fields, shared, stepped,
                                                    struct, folded, sums, store)
    elif stage.scales:
        scale = per_channel("scale", "double", list(stage.scales), _double)
        lines = [f"const double scaled = (double)acc * {scale};",
                 "int32_t q = INT32_MIN;",
                 "if (scaled > -2147483648.5 && scaled < 2147483647.5) {",
                 "  const int32_t t = (int32_t)scaled;",
                 "  const double frac = scaled - (double)t;",
                 "  q = t + (frac >= 0.5) - (frac <= -0.5);",
                 "}",
                 f"return (int8_t)arenac_clamp((int32_t)((uint32_t)q{plus_term(stage.zero_point)}"
                 f"{'u' if stage.zero_point else ''}), {stage.low + stage.zero_point}, "
                 f"{stage.high + stage.zero_point});"]
        comment = ("TFLite's FULLY_CONNECTED rescale in double: round((double)acc * scale), "
                   "halves away from zero (no single rounding matched it)")
    else:
        mult = per_channel("multiplier", "int32_t", list(stage.multipliers))
        shift = per_channel("shift", "int8_t", list(stage.shifts))
        lines = [f"const int32_t q = arenac_mbqm(acc, {mult}, {shift});", *store]
        calls.add("mbqm")
        comment = ("TFLite's MultiplyByQuantizedMultiplier (no single rounding matched it)")
    calls |= called(lines)
    if not any("[c]" in line for line in lines):
        lines.insert(0, "(void)c;")
    if sums is not None:
        tables.insert(0, {"name": f"{prefix}_sum", "ctype": "int32_t", "align": "",
                          "length": c_length(sums[0].size), "data": c_array(sums[0]),
                          "comment": c_comment(sums[1])})
    return tables, lines, comment, calls


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
    constants = [(r.multiplier, h.high) for r, h in zip(single, highs, strict=True)]
    shifted = f" >> {shift};" if shift else ";"
    if len(set(constants)) > 1:
        tables.append({
            "name": f"{prefix}_channel", "ctype": "arenac_high_channel", "align": "",
            "length": c_length(len(constants)),
            "data": ",\n  ".join(f"{{ {m}, {h}, {total} }}"
                                  for (m, h), total in zip(constants, totals.tolist(),
                                                           strict=True)),
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


def _stepped_high_word_output(prefix: str, tables: list[dict],
                              single: tuple[SingleRounding, ...], highs: list[HighWord],
                              sums: tuple[np.ndarray, str], shifts: list[int], store: list[str]
                              ) -> tuple[list[str], str, None]:
    """The output function's lines and comment with one SMMLA or SMMLAR by the sign of the sum
    (`high_word` of the negative R, the other 2^31 above it, which SMMLAR adds), the channel's
    offset in its sum and, for the sign, in the table beside it."""
    totals = wrap_int32(sums[0] + np.asarray([h.offset for h in highs], np.int64))
    tables.append({
        "name": f"{prefix}_channel", "ctype": "arenac_high_stepped", "align": "",
        "length": c_length(len(highs)),
        "data": ",\n  ".join(f"{{ {r.multiplier}, {h.high}, {total}, {h.offset} }}"
                              for r, h, total in zip(single, highs, totals.tolist(),
                                                     strict=True)),
        "comment": c_comment(f"{sums[1]}, plus the requantization's offset; and the "
                             "requantization's multiplier, high word and offset")})
    shift = _per_channel(tables, prefix, "shift", "int8_t", shifts)
    shifted = "" if shift == "0" else f" >> {shift}"
    lines = [f"const arenac_high_stepped *k = &{prefix}_channel[c];",
             "const int32_t q = arenac_smmla_by_sign(acc, k->offset, k->multiplier, k->high)"
             f"{shifted};"]
    comment = ("one rounding, (acc * m + h * 2^32) >> 32 >> s, plus 2^31 before the shift where "
               "the sum less its offset is not negative (SMMLAR), the sum offset so that "
               "h * 2^32 is the rounding below zero (and holds the output zero point times "
               f"2^(32 + s)){PROVEN}")
    return lines + store, comment, None


def _rounding_output(prefix: str, tables: list[dict], fields: list[tuple], shared: bool,
                     stepped: bool, struct: bool, folded: bool,
                     sums: tuple[np.ndarray, str] | None, store: list[str]
                     ) -> tuple[list[str], str, tuple[np.ndarray, str] | None]:
    """The output function's lines and comment with a 64-bit rounding (SMLAL), and the sums
    still to tabulate. `fields`: per channel (rounding, negative rounding, multiplier, shift
    after the high word), the zero point folded in where `folded`; `shared`: one shift and one
    rounding for both signs; `stepped`: the negative rounding SIGN_STEP below the other;
    `struct`: the channels' constants differ and sit with their sums."""
    if struct:
        tables.append({
            "name": f"{prefix}_channel", "ctype": "arenac_channel", "align": "",
            "length": c_length(len(fields)),
            "data": ",\n  ".join(f"{{ {c_int64(f[0])}, {f[2]}, {total} }}"
                                  for f, total in zip(fields, sums[0].tolist(), strict=True)),
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
    elif stepped:
        tables.append({
            "name": f"{prefix}_rounding", "ctype": "arenac_stepped", "align": "",
            "length": c_length(len(fields)),
            "data": ",\n  ".join(f"{{ {c_int64(a)}, {m}, {n} }}" for a, _, m, n in fields),
            "comment": c_comment("Per output channel: rounding (for acc >= 0), multiplier and "
                                 "shift of the requantization")})
        lines = [f"const arenac_stepped *r = &{prefix}_rounding[c];"]
        rounding, mult, shift = "r->rounding", "r->multiplier", "r->shift"
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
    if stepped:  # an LSR and an SMLAL where a select would load both roundings
        lines += [f"const int64_t sum = arenac_sign_step((int64_t)acc * {mult} + {rounding}, "
                  "acc);",
                  "const int32_t q = (int32_t)(sum >> 32)"
                  + (f" >> {shift};" if shift != "0" else ";")]
    elif not shared:
        lines += [f"const int64_t rounding = acc < 0 ? {negative} : {rounding};",
                  f"const int32_t q = (int32_t)(((int64_t)acc * {mult} + rounding) >> 32)"
                  + (f" >> {shift};" if shift != "0" else ";")]
    lines += store
    comment = ((f"one rounding, (acc * m + r) >> {32 + fields[0][3]}, the same r for both "
                "signs" if shared else
                "one rounding, (acc * m + r) >> 32 >> s, r less 2^31 for acc < 0" if stepped else
                "one rounding, (acc * m + r) >> 32 >> s, r depending on the sign of acc")
               + ((f" (and holding the output zero point times 2^{32 + fields[0][3]})"
                   if shared else " (and holding the output zero point times 2^(32 + s))")
                  if folded else "")
               + PROVEN)
    return lines, comment, sums


def store_order(tables: list[dict], pixels: int, channels: int) -> list[tuple[int, int]]:
    """The (pixel, channel) order of a block's stores: channel by channel where the output
    function reads a channel's rounding of both signs from a table (arenac_stepped), so that
    GCC loads it once for all the block's pixels, which the block's sums leave no registers to
    keep for two channels; else pixel by pixel, which measures best with the other forms."""
    if any(t["ctype"] in ("arenac_stepped", "arenac_high_stepped") for t in tables):
        return [(i, q) for q in range(channels) for i in range(pixels)]
    return [(i, q) for i in range(pixels) for q in range(channels)]


def output_helpers(tables: list[dict], output: list[str]) -> set[str]:
    """The helper groups the output function needs: those defining its tables' struct types,
    and arenac_smmla or arenac_sign_step where it calls them."""
    types = {"arenac_rounding": "arm_dsp_rounding", "arenac_stepped": "arm_dsp_stepped",
             "arenac_high_stepped": "arm_dsp_high_stepped",
             "arenac_channel": "arm_dsp_channel",
             "arenac_high_channel": "arm_dsp_high_channel"}
    return {types[t["ctype"]] for t in tables if t["ctype"] in types} | called(output)


def called(lines: list[str]) -> set[str]:
    """The helper groups of the arithmetic an output function's lines call."""
    return {group for group, name in (("arm_dsp_smmla", "arenac_smmla("),
                                      ("arm_dsp_smmla_by_sign", "arenac_smmla_by_sign("),
                                      ("arm_dsp_sign_step", "arenac_sign_step("))
            if any(name in line for line in lines)}


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


def plus_term(value: int) -> str:
    return f" + {value}" if value > 0 else f" - {-value}" if value < 0 else ""


# -- emission --------------------------------------------------------------------------------


def pipelined(kind: str, wide: bool, target: str) -> bool:
    """Whether a block's depth steps are one software pipeline (paired_steps)."""
    return wide and kind in ("3x2", "2x2") and target in PIPELINED_TARGETS


def depth_steps(kind: str, m: Matmul, wide: bool, target: str, joint: bool = False,
                tail: tuple[str, ...] = ()) -> dict:
    """The calls of one block's depth steps: written out up to UNROLLED groups (UNROLLED_3X2
    for the 3x2 step), else a loop of TRIP groups a trip and the rest written out. `wide`: the
    filter is int16 pairs; `joint`: the channel pairs' joint words; `tail`: a pipeline's last
    statements (paired_steps)."""
    if pipelined(kind, wide, target):
        return paired_steps(m, int(kind[0]), tail)
    x_words = 2 * int(kind[0])
    # a channel pair's weights of a group: 8 bytes, or 4 int32 words; the 1x4 step's second
    # pair is the next pair's row block, `pair_block` further on
    w_step = (4 if kind[2] == "1" else 8) // (2 if wide else 1)
    name = f"arenac_mac{'16' if wide else ''}_{kind}{'_joint' if joint else ''}"
    pair_block = f", {2 * m.groups * GROUP}" if kind == "1x4" else ""

    def call(k: ConstantLoop | None, extra: int) -> str:
        terms = [(k, x_words)] if k is not None else []
        w_terms = [(k, w_step)] if k is not None else []
        return (f"{name}(acc, {c_offset('pairs', terms, extra * x_words)}, "
                f"{c_offset('w', w_terms, extra * w_step)}{pair_block});")

    return unrolled_steps(m.groups, UNROLLED_3X2 if kind == "3x2" else UNROLLED, call)


def paired_steps(m: Matmul, pixels: int, tail: tuple[str, ...] = ()) -> dict:
    """The int16 steps of `pixels` pixels by two channels over `pairs` and `w` written out as one
    software pipeline per run of groups (a loop trip of TRIP, or the groups written out):
    each half-step's __smlad with the next half-step's words loaded between them, each load
    after the last multiply-add reading the register it fills, so that the Cortex-M7 issues
    every load beside a multiply-add (one MAC pipe: a cycle for two products). `tail`: the
    statements (loads of the output constants) that follow the last half-step's multiply-adds,
    one after each, which would otherwise issue alone."""
    last = pixels - 1

    def run(k: ConstantLoop | None, groups: range, last_run: bool) -> list[str]:
        def word(array: str, group: int, index: int) -> str:
            step = 2 * pixels if array == "pairs" else 4
            return f"{array}[{c_sum([(k, step)] if k is not None else [], group * step + index)}]"

        def words(group: int, half: int) -> dict[str, str]:
            return {"wa": word("w", group, half), "wb": word("w", group, 2 + half),
                    **{f"xw{p}": word("pairs", group, 2 * p + half) for p in range(pixels)}}

        halves = [(g, h) for g in groups for h in (0, 1)]
        after = list(tail) if last_run else []
        first = words(*halves[0])
        xs = ", ".join(f"xw{p} = {first[f'xw{p}']}" for p in range(pixels))
        lines = ["{", f"  int32_t wa = {first['wa']}, wb = {first['wb']};", f"  int32_t {xs};"]
        for i in range(len(halves)):
            following = words(*halves[i + 1]) if i + 1 < len(halves) else {}
            for p in range(pixels):
                lines.append(f"  acc[{2 * p}] = __smlad(xw{p}, wa, acc[{2 * p}]);")
                if p == last and following:  # wa is free after the last pixel's first
                    lines.append(f"  wa = {following['wa']};")
                lines += [] if following or not after else [f"  {after.pop(0)}"]
                lines.append(f"  acc[{2 * p + 1}] = __smlad(xw{p}, wb, acc[{2 * p + 1}]);")
                if following:
                    lines.append(f"  xw{p} = {following[f'xw{p}']};")
                lines += [] if following or not after else [f"  {after.pop(0)}"]
            if following:
                lines.append(f"  wb = {following['wb']};")
        return [*lines, *(f"  {statement}" for statement in after), "}"]

    if m.groups <= (UNROLLED_3X2 if pixels == 3 else UNROLLED):
        return {"loop": None, "body": [], "rest": run(None, range(m.groups), True)}
    main = m.groups - m.groups % TRIP
    k = ConstantLoop("k", main, 0, TRIP)
    return {"loop": k, "body": run(k, range(TRIP), False),
            "rest": run(None, range(main, m.groups), True) if main < m.groups else list(tail)}


def unrolled_steps(groups: int, unrolled: int,
                   call: Callable[[ConstantLoop | None, int], str]) -> dict:
    """`call(k, g)` for groups 0..groups-1: all written out up to `unrolled` groups, else a loop
    k of TRIP groups a trip (call(k, u) for its u-th) and the rest written out."""
    if groups <= unrolled:
        return {"loop": None, "body": [], "rest": [call(None, g) for g in range(groups)]}
    main = groups - groups % TRIP
    k = ConstantLoop("k", main, 0, TRIP)
    return {"loop": k, "body": [call(k, u) for u in range(TRIP)],
            "rest": [call(None, g) for g in range(main, groups)]}


def word_steps(kind: str, m: Matmul, joint: bool = False) -> dict:
    """As depth_steps for one pixel read straight from the input (`direct`): each group's four
    int8 values one word, widened in registers, the last group's a partial word; `joint`: the
    channel pairs' joint words."""
    full, tail = divmod(m.depth, GROUP)
    w_step = 4 if kind[2] == "1" else 8
    pair_block = f", {2 * m.groups * GROUP}" if kind == "1x4" else ""

    def call(k: ConstantLoop | None, extra: int, word: str | None = None) -> str:
        terms = [(k, GROUP)] if k is not None else []
        word = word or f"arenac_load32({c_offset('x0', terms, extra * GROUP)})"
        w_terms = [(k, w_step)] if k is not None else []
        return (f"arenac_mac_{kind}_word{'_joint' if joint else ''}(acc, {word}, "
                f"{c_offset('w', w_terms, extra * w_step)}{pair_block});")

    steps = unrolled_steps(full, UNROLLED, call)
    if tail:
        steps["rest"].append(call(None, full, f"arenac_load_partial("
                                              f"{c_offset('x0', [], full * GROUP)}, {tail})"))
    return steps


def _channel_blocks(prefix: str, m: Matmul, pixels: int, outs: list[str], wide: bool,
                    sum_at: Callable[[str], str], target: str, tables: list[dict],
                    output: list[str], direct: bool = False, joint: bool = False,
                    record: str | None = None) -> list[dict]:
    """A pixel block's channel blocks: two channels at a time, then an odd last one; for one
    pixel of int8 weights, four (two pairs) first. `direct`: the pixel's inputs read from x0
    and widened in registers (`word_steps`); `joint`: the channel pairs read joint words
    (`joint_words`), each pixel's lift taken (lift0, lift1, ...). `record` (channel_record):
    the stores read the channels' records through kc; a two-pixel software pipeline copies
    the fields its rounding needs into local records (r0, r1) between its last multiply-adds
    instead, single loads that issue beside them, where the rounding's would pair into an
    LDRD that issues alone (the three-pixel one has no registers left for them: vww_96_int8
    +0.16 million cycles)."""
    fields = list(dict.fromkeys(re.findall(r"k->(\w+)", " ".join(output_stages(output)[
        "rounded"])))) if record else []
    blocks = []
    quads = pixels == 1 and not wide
    start = 0
    for width in (4, 2, 1) if quads else (2, 1):
        loop = ConstantLoop("c", m.channels - m.channels % width, start, width)
        start = max(start, loop.stop)
        if not loop.runs:
            continue
        kind = f"{pixels}x{width}"
        w_at = c_offset(f"{prefix}_filter", [(loop, m.groups * GROUP // (2 if wide else 1))])
        sums = [sum_at(c_sum([(loop, 1)], j)) for j in range(width)]
        joined = joint and width > 1
        copied = record is not None and pipelined(kind, wide, target) and kind == "2x2"
        kept = ([record_pointer(prefix, record, c_sum([(loop, 1)], 0)),
                 *([f"{record} {', '.join(f'r{j}' for j in range(width))};"] if copied
                   else [])] if record else [])
        head = [f"const {'int32_t' if wide else 'int8_t'} *w = {w_at};", *kept,
                *(joint_accumulator_lines(sums, pixels) if joined
                  else accumulator_lines(sums, pixels))]
        sum_names = [f"acc[{k}]" for k in range(pixels * width)]
        if joined:  # each pair's first channel
            sum_names[0::2] = [f"arenac_joint_first(acc[{k}], acc[{k + 1}])"
                               for k in range(0, pixels * width, 2)]
        channels = ([f"&r{j}" for j in range(width)] if copied else
                    [f"kc{plus_term(j)}" for j in range(width)] if record else
                    [c_sum([(loop, 1)], j) for j in range(width)])
        stores = block_stores(prefix, output, [
            (f"{outs[i]}[{c_sum([(loop, 1)], j)}]", sum_names[i * width + j], channels[j])
            for i, j in store_order(tables, pixels, width)], record is not None,
            target not in IN_ORDER_TARGETS)
        tail = tuple(f"r{j}.{f} = kc[{j}].{f};" for j in range(width) for f in fields)
        # the joint 3x2 step reads single loads on every core: half a group a run where the
        # core issues one instruction a cycle
        runs = width == 4 or (kind == "3x2" and (joined or target not in IN_ORDER_TARGETS))
        half = "_half" if joined and kind == "3x2" and target in IN_ORDER_TARGETS else ""
        form = f"{kind}{'_word' if direct else ''}{'_joint' if joined else ''}{half}"
        helper = (mac16_helper(kind, target) if wide
                  else f"arm_dsp_mac_{form}{'_runs' if runs else ''}")
        steps = (word_steps(kind, m, joined) if direct
                 else depth_steps(kind, m, wide, target, joined, tail if copied else ()))
        blocks.append({"loop": loop, "head": head, "steps": steps, "stores": stores,
                       "helper": helper})
    return blocks


def accumulator_lines(sums: list[str], pixels: int) -> list[str]:
    """A block's sums, each channel's folded sum for each of its pixels."""
    names = [f"s{j}" for j in range(len(sums))]
    return [*(f"const int32_t {n} = {e};" for n, e in zip(names, sums, strict=True)),
            f"int32_t acc[{pixels * len(sums)}] = {{ {', '.join(names * pixels)} }};"]


def joint_accumulator_lines(sums: list[str], pixels: int) -> list[str]:
    """A block's sums over joint words: for each pixel, each channel pair's joint start (its
    first channel's sum, its second's times 256, less the pixel's lift) and its second
    channel's sum."""
    names = [f"s{j}" for j in range(len(sums))]
    starts = [f"arenac_joint_start(s{j}, s{j + 1}, lift{i}), s{j + 1}"
              for i in range(pixels) for j in range(0, len(sums), 2)]
    return [*(f"const int32_t {n} = {e};" for n, e in zip(names, sums, strict=True)),
            f"int32_t acc[{pixels * len(sums)}] = {{",
            *(f"  {start}," for start in starts), "};"]


def pointwise_values(ctx: OpContext, m: Matmul, stage: OutputStage, what: str,
                     direct: bool = False) -> dict:
    """The pointwise kernel's template values; `direct` (one pixel): no scratch, each input word
    widened in registers where the multiply reads it."""
    batches, rows = ConstantLoop("b", m.batches), ConstantLoop("r", m.rows)
    size = m.block_on(ctx.target)
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
        if direct:
            return lines
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
    if direct:
        helpers = {"arm_dsp_partial"} if tail else set()
        comment = (f"{what} for the Arm DSP extension, without scratch: {m.channels} filter "
                   f"rows by one input of {m.depth} values, a few output channels at a time, "
                   "each word of four inputs widened to int16 pairs in registers where the "
                   "multiply reads it, the filter read four int8 weights a word, each __smlad "
                   "adding two products")
    else:
        helpers = {widen_helper(p["count"], ctx.target) for p in pixels if full}
        helpers |= {"arm_dsp_partial", "arm_dsp_widen4"} if tail else set()
        comment = (
            f"{what} for the Arm DSP extension: a matrix multiply of "
            f"{m.batches * m.rows * m.pixels} pixels of {m.depth} values by {m.channels} filter "
            f"rows, {('one pixel', 'two pixels', 'three pixels')[min(size, m.pixels) - 1]} by "
            "two output channels at a time: the inputs widened once to int16 pairs in the "
            "arena, the filter read four int8 weights a word, each __smlad adding two products")
    return matmul_values(ctx, m, stage, what, comment, [batches, rows, block, rest],
                         row_head, pixels, helpers, direct)


def matmul_values(ctx: OpContext, m: Matmul, stage: OutputStage, what: str, comment: str,
                  loops: list[ConstantLoop], row_head: list[str], pixels: list[dict],
                  helpers: set[str], direct: bool = False) -> dict:
    """The template's values for a kernel of blocks of pixels whose inputs `pixels[i]["head"]`
    widens into the scratch, each block then multiplied by the filter two channels at a time:
    the pointwise kernel's and the im2col convolution's."""
    prefix = ctx.prefix
    pixels_in_all = m.batches * m.rows * m.pixels  # of every call sharing the filter
    if ctx.op_rows:  # a stripe's: the stripes of the op share its filter
        pixels_in_all = pixels_in_all * ctx.op_rows // ctx.outputs[0].shape[1]
    wide = pixels_in_all >= WIDE_FILTER_PIXELS
    # int8 weights: the channel pairs read joint words where that pays in the largest blocks,
    # each pixel's lift taken once its inputs are widened (or, `direct`, from its int8 values)
    joint = not wide and m.joint_pays(max(p["count"] for p in pixels))
    for pixel in pixels if joint else ():
        if direct:  # one pixel
            pixel["head"].append(f"const uint32_t lift0 = arenac_lift_bytes(x0, {m.depth});")
            continue
        count = pixel["count"]
        pixel["head"] += [f"const uint32_t lift{i} = arenac_lift({c_offset('pairs', [], 2 * i)}, "
                          f"{m.groups}, {2 * count});" for i in range(count)]
    if joint:
        helpers = helpers | {"arm_dsp_lift_bytes" if direct else "arm_dsp_lift"}
    tables, output, output_comment, stage_calls = output_values(
        prefix, stage, (m.sums(), f"{what}: per output channel, bias + input offset * the "
                                  "filter row's sum (int32, wrapped)"))
    parts = parted(output, ctx.target)  # the stages its stores part, if any
    # the Cortex-M7's two-pixel pipelines load their output constants beside their last
    # multiply-adds (_channel_blocks)
    record = (channel_record(prefix, output)
              if wide and not joint and not direct and ctx.target in PIPELINED_TARGETS else None)
    for pixel in pixels:
        pixel["channels"] = _channel_blocks(prefix, m, pixel["count"],
                                            [f"o{i}" for i in range(pixel["count"])], wide,
                                            lambda channel: sum_of(prefix, tables, channel),
                                            ctx.target, tables, output if record else parts,
                                            direct, joint, record)
    packed = m.packed(joint)
    order = ("for each pair of output channels, their rows four weights at a time, "
             f"alternating; each row padded with zeros to {m.groups * GROUP}")
    if joint:
        order += ("; each pair's in joint words, its two channels a and b four depths at a "
                  "time as (a0 + 128, b0, a2 + 128, b2) and (a1 + 128, b1, a3 + 128, b3)")
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
    helpers = with_attribute_helpers(helpers | output_helpers(tables, output) | stage_calls,
                                     ctx.target)
    counters = written_vars([*loops, *[b["loop"] for b in blocks],
                             *[b["steps"]["loop"] for b in blocks if b["steps"]["loop"]]])
    return {
        "parted": bool(parts), "record": record,
        "fn": ctx.fn, "prefix": prefix, "comment": c_comment(comment), "tables": tables,
        "output_comment": c_comment(f"Output channel c from its sum: {output_comment}"),
        "output": output, "x": ctx.inputs[0].ptr, "out": ctx.outputs[0].ptr,
        "scratch": None if direct else ctx.scratch[0], "counters": counters, "batches": loops[0],
        "rows": loops[1], "row_head": row_head, "pixels": pixels,
        "helpers": tuple(sorted(helpers)), "attribute": kernel_attribute(helpers, ctx.target),
        "patch": None, "windows": None, "setup": [],
    }
