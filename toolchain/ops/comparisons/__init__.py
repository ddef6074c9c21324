"""The comparison and logical ops, and SELECT and SELECT_V2.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops import overlaps
from toolchain.ops.comparisons.emit import emit_binary, emit_not, emit_select
from toolchain.ops.comparisons.prepare import (
    OPCODES,
    SELECT_DTYPES,
    SIGNATURES,
    prepare,
    prepare_not,
    prepare_select,
)
from toolchain.ops.spec import OpSpec, kernels

SPECS: tuple[OpSpec, ...] = (
    *(OpSpec(opcode, kernels("bool, T, T -> T", T=SELECT_DTYPES), prepare_select, emit_select,
             overlaps=overlaps.elementwise(0, 1, 2))
      for opcode in ("SELECT", "SELECT_V2")),
    *(OpSpec(opcode, SIGNATURES[opcode], prepare, emit_binary,
             overlaps=overlaps.elementwise(0, 1))
      for opcode in OPCODES),
    OpSpec("LOGICAL_NOT", kernels("bool -> bool"), prepare_not, emit_not,
           overlaps=overlaps.elementwise(0)),
)
