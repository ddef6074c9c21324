"""The fully connected family: FULLY_CONNECTED and BATCH_MATMUL.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C; arm_dsp.py and arm_mve.py hold the kernels of the cores with
the DSP extension and of Helium, from the same params. `SPECS` registers the ops
(toolchain.ops.REGISTRY), `TARGET_KERNELS` the target kernels in the order binding tries them
(toolchain.ops.VARIANTS).
"""

from __future__ import annotations

from toolchain.ops.fully_connected import arm_dsp, arm_mve
from toolchain.ops.fully_connected.emit import emit_batch_matmul, emit_fully_connected
from toolchain.ops.fully_connected.prepare import (
    FC_STRIPING,
    batch_matmul_scratch,
    fully_connected_scratch,
    prepare_batch_matmul,
    prepare_fully_connected,
)
from toolchain.ops.spec import OpSpec, TargetKernel, kernels

SPECS: tuple[OpSpec, ...] = (
    OpSpec("FULLY_CONNECTED",
           kernels("float32, float32, float32? -> float32", "T, T, int32? -> T",
                   "int16, int8, int32|int64? -> int16", "float32, int8, float32? -> float32",
                   T=("int8", "uint8")),
           prepare_fully_connected, emit_fully_connected, scratch=fully_connected_scratch,
           macs=lambda p: p.batches * p.depth * p.units, striping=FC_STRIPING),
    OpSpec("BATCH_MATMUL",
           kernels("T, T -> T", "int8, int8 -> int32", "float32, int8 -> float32",
                   "int16, int8 -> int16", T=("float32", "int8", "int16")),
           prepare_batch_matmul, emit_batch_matmul, scratch=batch_matmul_scratch),
)

TARGET_KERNELS: tuple[TargetKernel, ...] = (*arm_dsp.TARGET_KERNELS, *arm_mve.TARGET_KERNELS)
