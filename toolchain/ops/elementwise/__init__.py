"""The elementwise binary ops: ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, SQUARED_DIFFERENCE,
FLOOR_DIV and FLOOR_MOD; and ADD_N, the sum of any number of inputs of one shape.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C; arm_dsp.py holds the kernel of the cores with the DSP
extension, from the same params. `SPECS` registers the ops (toolchain.ops.REGISTRY),
`TARGET_KERNELS` the target kernels in the order binding tries them (toolchain.ops.VARIANTS).
"""

from __future__ import annotations

from toolchain.ops import overlaps
from toolchain.ops.elementwise import arm_dsp
from toolchain.ops.elementwise.emit import emit_add_n, emit_binary
from toolchain.ops.elementwise.prepare import (
    BINARY_STRIPING,
    DTYPES,
    OPCODES,
    prepare,
    prepare_add_n,
)
from toolchain.ops.spec import OpSpec, TargetKernel, kernels

# The ops whose stripes the tiler tries (the others' rows go whole).
STRIPED = ("ADD", "SUB", "MUL")

SPECS: tuple[OpSpec, ...] = (
    *(OpSpec(opcode, kernels("T, T -> T", T=DTYPES[opcode]), prepare, emit_binary,
             overlaps=overlaps.elementwise(0, 1),
             striping=BINARY_STRIPING if opcode in STRIPED else None)
      for opcode in OPCODES),
    OpSpec("ADD_N", kernels("T, T... -> T", T=("float32", "int32")), prepare_add_n, emit_add_n,
           overlaps=overlaps.elementwise()),
)

TARGET_KERNELS: tuple[TargetKernel, ...] = (*arm_dsp.TARGET_KERNELS,)
