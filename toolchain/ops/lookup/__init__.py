"""GATHER_ND and EMBEDDING_LOOKUP: slices of a tensor picked by indices the model computes, each
checked when it is read; DYNAMIC_UPDATE_SLICE: a slice written where the model says, clamped.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops import overlaps
from toolchain.ops.lookup.emit import (
    emit_dynamic_update_slice,
    emit_embedding_lookup,
    emit_gather_nd,
)
from toolchain.ops.lookup.prepare import (
    prepare_dynamic_update_slice,
    prepare_embedding_lookup,
    prepare_gather_nd,
)
from toolchain.ops.spec import OpSpec, kernels

# the element types LiteRT's kernels copy
COPIED = ("float32", "int8", "uint8", "int16", "int32", "int64")

SPECS: tuple[OpSpec, ...] = (
    OpSpec("GATHER_ND", kernels("T, I -> T", T=COPIED, I=("int16", "int32", "int64")),
           prepare_gather_nd, emit_gather_nd),
    OpSpec("EMBEDDING_LOOKUP", kernels("int32, T -> T", "int32, int8 -> float32", T=COPIED),
           prepare_embedding_lookup, emit_embedding_lookup),
    # the operand copied first (a memmove, skipped in place), so the output may lie over it
    OpSpec("DYNAMIC_UPDATE_SLICE",
           kernels("T, T, I -> T", T=(*COPIED, "bool"), I=("int32", "int64")),
           prepare_dynamic_update_slice, emit_dynamic_update_slice, overlaps=overlaps.alias),
)
