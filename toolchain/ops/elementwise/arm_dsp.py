"""ADD and SUB (int8) for the Arm cores with the DSP extension (cortex-m4, cortex-m7 and
cortex-m33): the portable kernel's loops and input tables (emit.py), its output stage in one
rounding proven equal to the reference's (`add_rounding`).
"""

from __future__ import annotations

import numpy as np

from toolchain.ir import Graph, Operator
from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier
from toolchain.numerics.rounding import SingleRounding, single_roundings
from toolchain.ops import overlaps
from toolchain.ops.arm_dsp_common import DSP_TARGETS, OutputStage, output_values
from toolchain.ops.elementwise.emit import TEMPLATE as ELEMENTWISE_TEMPLATE
from toolchain.ops.elementwise.emit import binary_values, op_definitions, rescaled_inputs
from toolchain.ops.elementwise.prepare import RescaledParams
from toolchain.ops.emit import Kernel, OpContext, render_macro
from toolchain.ops.spec import TargetKernel, kernels


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
    _, lines, _, calls = output_values(ctx.prefix, stage)
    values = binary_values(ctx)
    values["body"] = [f"const int32_t acc = {'x + y' if p.opcode == 'ADD' else 'x - y'};",
                      *(line for line in lines if line != "(void)c;")]
    text = render_macro(ELEMENTWISE_TEMPLATE, "binary", values)
    uses_ivdep = values["nest"] is not None and values["nest"]["inner"]["ivdep"]
    return Kernel(text, (*sorted(calls), *(("ivdep",) if uses_ivdep else ())),
                  includes=("arm_acle.h",), definitions=op_definitions(values))


TARGET_KERNELS: tuple[TargetKernel, ...] = (
    TargetKernel("ADD", "dsp-add", kernels("int8, int8 -> int8", targets=DSP_TARGETS),
                 accepts_add, emit_add, overlaps=overlaps.elementwise(0, 1)),
    TargetKernel("SUB", "dsp-add", kernels("int8, int8 -> int8", targets=DSP_TARGETS),
                 accepts_add, emit_add, overlaps=overlaps.elementwise(0, 1)),
)
