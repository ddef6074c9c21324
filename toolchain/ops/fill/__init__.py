"""ZEROS_LIKE, FILL and SHAPE: outputs that do not depend on the inputs' values (but FILL's one
value); BROADCAST_ARGS: the shape two shapes broadcast to.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops.fill.emit import emit_broadcast_args, emit_fill, emit_shape, emit_zeros_like
from toolchain.ops.fill.prepare import (
    prepare_broadcast_args,
    prepare_fill,
    prepare_shape,
    prepare_zeros_like,
)
from toolchain.ops.overlaps import unread
from toolchain.ops.spec import OpSpec, kernels

SPECS: tuple[OpSpec, ...] = (
    OpSpec("ZEROS_LIKE", kernels("T -> T", T=("float32", "int32", "int64")), prepare_zeros_like,
           emit_zeros_like, overlaps=unread(0)),
    OpSpec("FILL", kernels("I, T -> T", I=("int32", "int64"),
                           T=("bool", "float32", "int8", "int16", "int32", "int64")),
           prepare_fill, emit_fill, overlaps=unread(1)),
    OpSpec("SHAPE", kernels("T -> I", I=("int32", "int64"),
                            T=("bool", "float32", "int8", "uint8", "int16", "int32", "int64")),
           prepare_shape, emit_shape, overlaps=unread(0)),
    OpSpec("BROADCAST_ARGS", kernels("T, T -> T", T=("int32", "int64")), prepare_broadcast_args,
           emit_broadcast_args),
)
