"""The reductions: MEAN, SUM, REDUCE_MAX, REDUCE_MIN, REDUCE_ANY, REDUCE_ALL, ARG_MAX and ARG_MIN.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops.reductions.emit import emit_arg, emit_reduce
from toolchain.ops.reductions.prepare import prepare_arg, prepare_reduce
from toolchain.ops.spec import OpSpec, kernels

_REDUCE_DTYPES = frozenset({"float32", "int32", "int8", "uint8", "int16"})

_ARG_DTYPES = frozenset({"float32", "int32", "int8", "uint8"})


# The axes (or axis) are a constant second input.
_REDUCE = kernels("T, int32 -> T", T=_REDUCE_DTYPES)


# REDUCE_ANY and REDUCE_ALL: the largest and the smallest of bools (false below true)
_LOGICAL = kernels("bool, int32 -> bool")


_ARG = kernels("T, int32|int64 -> int32|int64", T=_ARG_DTYPES)


SPECS: tuple[OpSpec, ...] = (
    OpSpec("MEAN", _REDUCE, prepare_reduce, emit_reduce),
    OpSpec("SUM", _REDUCE, prepare_reduce, emit_reduce),
    OpSpec("REDUCE_MAX", _REDUCE, prepare_reduce, emit_reduce),
    OpSpec("REDUCE_MIN", _REDUCE, prepare_reduce, emit_reduce),
    OpSpec("REDUCE_ANY", _LOGICAL, prepare_reduce, emit_reduce),
    OpSpec("REDUCE_ALL", _LOGICAL, prepare_reduce, emit_reduce),
    OpSpec("ARG_MAX", _ARG, prepare_arg, emit_arg),
    OpSpec("ARG_MIN", _ARG, prepare_arg, emit_arg),
)
