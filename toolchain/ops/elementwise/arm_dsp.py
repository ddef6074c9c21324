"""ADD and SUB (int8) for the Arm cores with the DSP extension (cortex-m4, cortex-m7 and
cortex-m33): the portable kernel's loops and input tables (emit.py), its output stage in one
rounding proven equal to the reference's.

Where it can (`high_word_add`), the rounding is the high word of one SMMLA: the first input's
table is lifted so that every sum is at least zero (one rounding then serves them all, with no
step by the sign) and carries the rounding's offset, and the output zero point rides in the
high word. An element is then two table loads, an add, an SMMLA and an SSAT. Else the sum is
rounded in 64 bits with a step by its sign (`add_rounding`): an SMLAL more and its set-up.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from toolchain.ir import INT32_MAX, INT32_MIN, Graph, Operator
from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier
from toolchain.numerics.rounding import SIGN_STEP, SingleRounding, high_word, single_roundings
from toolchain.ops import overlaps
from toolchain.ops.arm_dsp_common import DSP_TARGETS, OutputStage, int8_store, output_values
from toolchain.ops.elementwise.emit import (
    BYTE_VALUES,
    binary_values,
    op_definitions,
    rescaled_inputs,
)
from toolchain.ops.elementwise.emit import TEMPLATE as ELEMENTWISE_TEMPLATE
from toolchain.ops.elementwise.prepare import RescaledParams
from toolchain.ops.emit import Kernel, OpContext, c_array, c_comment, render_macro
from toolchain.ops.spec import TargetKernel, kernels


def rescaled_pair(p) -> tuple[np.ndarray, np.ndarray]:
    """The two inputs' rescaled values (the portable kernel's tables), the second negated for
    a SUB: the sum of an entry of each is the op's accumulator."""
    first = rescaled_inputs(p, p.input1_offset, p.input1_multiplier, p.input1_shift)
    second = rescaled_inputs(p, p.input2_offset, p.input2_multiplier, p.input2_shift)
    return first, (-second if p.opcode == "SUB" else second)


def reference_outputs(p) -> np.ndarray:
    """The op's output for every pair of int8 inputs [first's value, second's value], as
    TFLite's reference computes it (runtime_py's output stage)."""
    first, second = rescaled_pair(p)
    acc = first[:, None] + second[None, :]
    return np.clip(multiply_by_quantized_multiplier(acc, p.output_multiplier, p.output_shift)
                   + p.output_offset, p.activation_min, p.activation_max)


@dataclass(frozen=True)
class HighWordAdd:
    """An int8 ADD's or SUB's output stage as the high word of one SMMLA: with the first
    input's table lifted by `lift`, (acc * multiplier + high * 2^32) >> (32 + shift) is the
    output, its zero point included, before the activation's clamp."""

    lift: int
    multiplier: int
    high: int
    shift: int

    def outputs(self, first: np.ndarray, second: np.ndarray, low: int, high: int
                ) -> np.ndarray:
        """What the C computes for every pair of table entries, clamped to [low, high]."""
        acc = (first + self.lift)[:, None] + second[None, :]
        return np.clip((acc * self.multiplier + (self.high << 32)) >> (32 + self.shift),
                       low, high)


def high_word_add(p) -> HighWordAdd | None:
    """The SMMLA form of the op's output stage: every sum lifted to zero or above, where the
    rounding of the sums at least zero (add_rounding's of the lifted sums) is one R, a high
    word (high_word) with the zero point folded in; then checked against the reference on all
    256 x 256 pairs of inputs. None where there is none."""
    first, second = rescaled_pair(p)
    lo, hi = int(first.min() + second.min()), int(first.max() + second.max())
    lift = max(0, -lo)
    r = add_rounding(p, lift)
    if r is None or r.least is None or r.greatest is None:
        return None
    # no sum is below zero: the R of the others serves them all (SIGN_STEP above the one
    # below zero, with its interval)
    shared = replace(r, negative_rounding=r.rounding, least=r.least + SIGN_STEP,
                     greatest=r.greatest + SIGN_STEP)
    word = high_word(shared, p.output_offset << r.shift, lo + lift, hi + lift)
    if word is None:
        return None
    stage = HighWordAdd(lift + word.offset, r.multiplier, word.high, r.shift - 32)
    lifted = first + stage.lift
    if lifted.min() < INT32_MIN or lifted.max() > INT32_MAX:
        return None
    got = stage.outputs(first, second, p.activation_min, p.activation_max)
    return stage if np.array_equal(got, reference_outputs(p)) else None


def add_rounding(p, lift: int = 0) -> SingleRounding | None:
    """The output stage of an int8 ADD or SUB in one rounding: its inputs' rescaled values
    (tables, as the portable kernel's) combine into a sum within the tables' extremes, which
    TFLite's MultiplyByQuantizedMultiplier turns into the output; None where no single rounding
    matches it on every such sum. With `lift`, of the sums raised by it."""
    if p.output_shift > 0:
        return None
    first, second = rescaled_pair(p)
    low, high = p.activation_min - p.output_offset, p.activation_max - p.output_offset
    mult, shift = p.output_multiplier, p.output_shift
    found = single_roundings(
        lambda acc: multiply_by_quantized_multiplier(acc - lift, mult, shift), low, high,
        np.array([first.min() + second.min() + lift]),
        np.array([first.max() + second.max() + lift]),
        [mult], [31 - shift + (1 if mult == 0 else 0)])
    return found[0] if found else None


def accepts_add(graph: Graph, op: Operator, p) -> str | None:
    if not isinstance(p, RescaledParams) or p.dtype != "int8" or p.opcode not in ("ADD", "SUB"):
        return "not an int8 ADD or SUB"
    if high_word_add(p) is None and add_rounding(p) is None:
        return "no single rounding matches its output stage"
    return None


def emit_add(ctx: OpContext) -> Kernel:
    """The portable kernel's loops and input tables; the output stage in one rounding. The
    loop is not marked for vectorizing: no compiler vectorizes the rounding's inline assembly,
    and Clang turns a vectorize pragma it cannot honour into an error under -Werror."""
    p = ctx.params
    acc = f"const int32_t acc = {'x + y' if p.opcode == 'ADD' else 'x - y'};"
    word = high_word_add(p)
    if word is None:
        values = binary_values(ctx, ivdep=False)
        r = add_rounding(p)
        stage = OutputStage(p.activation_min - p.output_offset,
                            p.activation_max - p.output_offset, p.output_offset, (r,))
        _, lines, _, calls = output_values(ctx.prefix, stage)
        values["body"] = [acc, *(line for line in lines if line != "(void)c;")]
    else:
        # each table indexed by the value's byte, which an LDRB and one indexed load read
        values = binary_values(ctx, tuple(
            (lambda e, n=n: f"{ctx.prefix}_in{n}[(uint8_t){e}]") for n in (1, 2)),
            ivdep=False, unroll=True)
        first, second = rescaled_pair(p)  # the table holds the second's own values (x - y)
        if p.opcode == "SUB":
            second = -second
        for table, entries in zip(values["input_tables"], (first + word.lift, second),
                                  strict=True):
            table["data"] = c_array(np.roll(entries, BYTE_VALUES // 2), per_line=8)
        values["lead"] += "\n" + c_comment(
            "Each table is indexed by the value's byte: 0 to 127, then -128 to -1. The first "
            f"input's values are lifted by {word.lift}: every sum is then at least zero and "
            "carries the output rounding's offset.")
        shifted = f" >> {word.shift}" if word.shift else ""
        store, calls = int8_store(p.activation_min, p.activation_max)
        values["op_comment"] = c_comment(
            f"The output of a sum: one rounding, (acc * m + h * 2^32) >> {32 + word.shift}, the "
            "high word of one SMMLA shifted (h holding the output zero point): at generation "
            "time it was checked equal, after the clamp, to the reference's requantization on "
            "every pair of int8 inputs.")
        values["body"] = [acc, f"const int32_t q = arenac_smmla(acc, {word.multiplier}, "
                               f"{word.high}){shifted};", *store]
        unrolled = values["nest"] is not None and values["nest"]["inner"]["unroll"]
        calls = {*calls, "arm_dsp_smmla", *(["arm_dsp_unroll4"] if unrolled else [])}
    text = render_macro(ELEMENTWISE_TEMPLATE, "binary", values)
    return Kernel(text, tuple(sorted(calls)), includes=("arm_acle.h",),
                  definitions=op_definitions(values))


TARGET_KERNELS: tuple[TargetKernel, ...] = (
    TargetKernel("ADD", "dsp-add", kernels("int8, int8 -> int8", targets=DSP_TARGETS),
                 accepts_add, emit_add, overlaps=overlaps.elementwise(0, 1)),
    TargetKernel("SUB", "dsp-add", kernels("int8, int8 -> int8", targets=DSP_TARGETS),
                 accepts_add, emit_add, overlaps=overlaps.elementwise(0, 1)),
)
