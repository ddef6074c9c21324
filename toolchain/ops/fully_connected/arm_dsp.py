"""FULLY_CONNECTED (int8) for the Arm cores with the DSP extension (cortex-m4, cortex-m7 and
cortex-m33): the pointwise matrix multiply of toolchain/ops/arm_dsp_common.py over batch rows by
units, from the portable kernel's params (prepare.py), its output stage FULLY_CONNECTED's double
rounding or the one rounding proven equal to it (`fc_output`). It declares no overlap, as its
portable kernel.
"""

from __future__ import annotations

import numpy as np

from toolchain.ir import INT32_MAX, INT32_MIN, Graph, Operator
from toolchain.numerics.rounding import (
    double_to_int32,
    fc_multiplier,
    round_half_away,
    shared_roundings,
    single_roundings,
)
from toolchain.ops.arm_dsp_common import (
    DSP_TARGETS,
    TEMPLATE,
    WORD,
    Matmul,
    OutputStage,
    accumulator_ranges,
    kernel_definitions,
    pointwise_scratch,
    pointwise_values,
)
from toolchain.ops.emit import Kernel, OpContext, render_macro
from toolchain.ops.fully_connected.emit import emit_fc_band
from toolchain.ops.fully_connected.prepare import FullyConnectedQuantizedParams
from toolchain.ops.spec import TargetKernel, kernels


def fc_matmul(p: FullyConnectedQuantizedParams, weights: np.ndarray | None,
              bias: np.ndarray | None) -> Matmul:
    w = (np.zeros((p.units, p.depth), np.int64) if weights is None
         else np.asarray(weights, np.int64).reshape(p.units, p.depth))
    b = np.zeros(p.units, np.int64) if bias is None else np.asarray(bias, np.int64).reshape(-1)
    return Matmul(1, 1, p.batches, 0, 0, p.depth, p.depth, p.units, w, b, p.input_offset)


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
                       scales=tuple(scales), accumulators=accumulator_ranges(acc_lo, acc_hi))


def emit_fc(ctx: OpContext, direct: bool = False) -> Kernel:
    """`direct`: dsp-direct's form, the inputs widened in registers (pointwise_values). A band
    of a striped segment's last op adds up as the portable kernel does (emit_fc_band)."""
    p: FullyConnectedQuantizedParams = ctx.params
    if p.reduction is not None:
        return emit_fc_band(ctx)
    bias = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    m = fc_matmul(p, ctx.inputs[1].data, None if bias is None else bias.data)
    values = pointwise_values(ctx, m, fc_output(m, p),
                              f"FULLY_CONNECTED '{ctx.outputs[0].name}'", direct)
    return Kernel(render_macro(TEMPLATE, "pointwise", values), values["helpers"],
                  includes=("arm_acle.h",), definitions=kernel_definitions(values))


def accepts_fc_direct(graph: Graph, op: Operator, p) -> str | None:
    reason = accepts_fc(graph, op, p)
    if reason is None and p.batches != 1:
        return "more than one batch row"
    return reason


TARGET_KERNELS: tuple[TargetKernel, ...] = (
    TargetKernel("FULLY_CONNECTED", "dsp",
                 kernels("int8, int8, int32? -> int8", targets=DSP_TARGETS), accepts_fc,
                 emit_fc, scratch=lambda p: pointwise_scratch(fc_matmul(p, None, None)),
                 scratch_alignment=WORD),
    # one batch row without scratch, its inputs widened in registers: what `dsp` gives its
    # scratch up for in a plan held to an arena
    TargetKernel("FULLY_CONNECTED", "dsp-direct",
                 kernels("int8, int8, int32? -> int8", targets=DSP_TARGETS), accepts_fc_direct,
                 lambda ctx: emit_fc(ctx, direct=True), narrows=("dsp",)),
)
