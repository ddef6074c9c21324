"""The pooling family: AVERAGE_POOL_2D, MAX_POOL_2D and L2_POOL_2D (float32).

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C; arm_dsp.py holds the kernels of the cores with the DSP
extension, from the same params. `SPECS` registers the ops (toolchain.ops.REGISTRY),
`TARGET_KERNELS` the target kernels in the order binding tries them (toolchain.ops.VARIANTS).
"""

from __future__ import annotations

from toolchain.ops import overlaps
from toolchain.ops.padding import PadRule
from toolchain.ops.pooling import arm_dsp
from toolchain.ops.pooling.emit import emit_average, emit_l2, emit_max
from toolchain.ops.pooling.prepare import (
    POOL_STRIPING,
    QUANTIZED,
    pads_below_the_maximum,
    pads_the_count,
    pool_axes,
    pool_scratch,
    prepare_pool_2d,
)
from toolchain.ops.spec import OpSpec, TargetKernel, kernels

_POOLING = kernels("T -> T", T=("float32", *QUANTIZED))


SPECS: tuple[OpSpec, ...] = (
    OpSpec("AVERAGE_POOL_2D", _POOLING, prepare_pool_2d, emit_average, scratch=pool_scratch,
           overlaps=overlaps.pooling, striping=POOL_STRIPING,
           pad=PadRule(pads_the_count, pool_axes)),
    OpSpec("MAX_POOL_2D", _POOLING, prepare_pool_2d, emit_max, scratch=pool_scratch,
           overlaps=overlaps.pooling, striping=POOL_STRIPING,
           pad=PadRule(pads_below_the_maximum, pool_axes)),
    # a PAD's zeros add nothing to the squares but count in the mean, as in an average
    OpSpec("L2_POOL_2D", kernels("float32 -> float32"), prepare_pool_2d, emit_l2,
           scratch=pool_scratch, overlaps=overlaps.pooling, striping=POOL_STRIPING,
           pad=PadRule(pads_the_count, pool_axes)),
)

TARGET_KERNELS: tuple[TargetKernel, ...] = (*arm_dsp.TARGET_KERNELS,)
