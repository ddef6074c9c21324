"""FULLY_CONNECTED (int8) for Helium (cortex-m55): the pointwise matrix multiply of
toolchain/ops/arm_mve_common.py, from the DSP kernel's acceptance, sums and output stage
(arm_dsp.py).
"""

from __future__ import annotations

from toolchain.ops.arm_dsp_common import kernel_definitions
from toolchain.ops.arm_mve_common import MVE_TARGETS, TEMPLATE, mve_values
from toolchain.ops.emit import Kernel, OpContext, render_macro
from toolchain.ops.fully_connected.arm_dsp import accepts_fc, fc_matmul, fc_output
from toolchain.ops.fully_connected.emit import emit_fc_band
from toolchain.ops.spec import TargetKernel, kernels


def emit_fc(ctx: OpContext) -> Kernel:
    """A band of a striped segment's last op adds up as the portable kernel does."""
    p = ctx.params
    if p.reduction is not None:
        return emit_fc_band(ctx)
    bias = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    m = fc_matmul(p, ctx.inputs[1].data, None if bias is None else bias.data)
    values = mve_values(ctx, m, fc_output(m, p), f"FULLY_CONNECTED '{ctx.outputs[0].name}'")
    return Kernel(render_macro(TEMPLATE, "pointwise", values), values["helpers"],
                  includes=("arm_mve.h", "arm_acle.h"),
                  definitions=kernel_definitions(values))


TARGET_KERNELS: tuple[TargetKernel, ...] = (
    TargetKernel("FULLY_CONNECTED", "mve",
                 kernels("int8, int8, int32? -> int8", targets=MVE_TARGETS), accepts_fc, emit_fc),
)
