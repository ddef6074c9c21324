"""The shape and data-movement family: RESHAPE, SQUEEZE, EXPAND_DIMS, PAD, PADV2, MIRROR_PAD,
CONCATENATION, PACK, UNPACK, SPLIT, SPLIT_V, TRANSPOSE, DEPTH_TO_SPACE, SPACE_TO_DEPTH,
SPACE_TO_BATCH_ND and BATCH_TO_SPACE_ND (without padding or crops), SLICE,
STRIDED_SLICE, REVERSE_V2, BROADCAST_TO and GATHER.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops import overlaps
from toolchain.ops.shape.emit import (
    emit_concatenation,
    emit_gather,
    emit_mirror_pad,
    emit_pack,
    emit_pad,
    emit_reshape,
    emit_slice,
    emit_space_batch,
    emit_split,
    emit_transpose,
    emit_unpack,
)
from toolchain.ops.shape.prepare import (
    ALIASED_DTYPES,
    INDEX_DTYPES,
    MOVED_DTYPES,
    prepare_batch_to_space,
    prepare_broadcast_to,
    prepare_concatenation,
    prepare_depth_to_space,
    prepare_expand_dims,
    prepare_gather,
    prepare_mirror_pad,
    prepare_pack,
    prepare_pad,
    prepare_reshape,
    prepare_reverse,
    prepare_slice,
    prepare_space_to_batch,
    prepare_space_to_depth,
    prepare_split,
    prepare_split_v,
    prepare_squeeze,
    prepare_strided_slice,
    prepare_transpose,
    prepare_unpack,
)
from toolchain.ops.spec import OpSpec, kernels

# Index inputs (shapes, paddings, begins, axes, ...) are int32 or int64, as TFLite allows.
_MOVED = {"T": MOVED_DTYPES}


_ALIASED = {"T": ALIASED_DTYPES}


SPECS: tuple[OpSpec, ...] = (
    OpSpec("RESHAPE", kernels("T, I? -> T", **_ALIASED, I=INDEX_DTYPES), prepare_reshape,
           emit_reshape, overlaps=overlaps.alias),
    OpSpec("SQUEEZE", kernels("T -> T", **_ALIASED), prepare_squeeze, emit_reshape,
           overlaps=overlaps.alias),
    OpSpec("EXPAND_DIMS", kernels("T, I -> T", **_ALIASED, I=INDEX_DTYPES), prepare_expand_dims,
           emit_reshape, overlaps=overlaps.alias),
    OpSpec("PAD", kernels("T, I -> T", **_MOVED, I=INDEX_DTYPES), prepare_pad, emit_pad),
    OpSpec("PADV2", kernels("T, I, T? -> T", **_MOVED, I=INDEX_DTYPES), prepare_pad, emit_pad),
    OpSpec("MIRROR_PAD", kernels("T, I -> T", **_MOVED, I=INDEX_DTYPES), prepare_mirror_pad,
           emit_mirror_pad),
    OpSpec("CONCATENATION", kernels("T... -> T", **_MOVED), prepare_concatenation,
           emit_concatenation),
    OpSpec("PACK", kernels("T... -> T", **_MOVED), prepare_pack, emit_pack),
    OpSpec("UNPACK", kernels("T -> T...", T=MOVED_DTYPES - {"int64"}), prepare_unpack,
           emit_unpack),
    OpSpec("SPLIT", kernels("int32, T -> T...", **_MOVED), prepare_split, emit_split),
    OpSpec("SPLIT_V", kernels("T, I, int32 -> T...", **_MOVED, I=INDEX_DTYPES), prepare_split_v,
           emit_split),
    OpSpec("TRANSPOSE", kernels("T, I -> T", **_MOVED, I=INDEX_DTYPES), prepare_transpose,
           emit_transpose),
    # LiteRT's kernels move no int16 blocks, nor take the axes of a reverse as int64
    OpSpec("DEPTH_TO_SPACE", kernels("T -> T", T=MOVED_DTYPES - {"int16"}),
           prepare_depth_to_space, emit_transpose),
    OpSpec("SPACE_TO_DEPTH", kernels("T -> T", T=MOVED_DTYPES - {"int16"}),
           prepare_space_to_depth, emit_transpose),
    OpSpec("SPACE_TO_BATCH_ND", kernels("T, int32, int32 -> T", **_MOVED),
           prepare_space_to_batch, emit_space_batch),
    OpSpec("BATCH_TO_SPACE_ND", kernels("T, int32, int32 -> T", **_MOVED),
           prepare_batch_to_space, emit_space_batch),
    OpSpec("SLICE", kernels("T, I, I -> T", **_MOVED, I=INDEX_DTYPES), prepare_slice, emit_slice),
    OpSpec("REVERSE_V2", kernels("T, int32 -> T", **_MOVED), prepare_reverse, emit_slice),
    OpSpec("BROADCAST_TO", kernels("T, I -> T", **_MOVED, I=INDEX_DTYPES), prepare_broadcast_to,
           emit_slice),
    OpSpec("STRIDED_SLICE", kernels("T, I, I, I -> T", **_MOVED, I=INDEX_DTYPES),
           prepare_strided_slice, emit_slice),
    OpSpec("GATHER", kernels("T, I -> T", **_MOVED, I=("int16", *INDEX_DTYPES)), prepare_gather,
           emit_gather),
)
