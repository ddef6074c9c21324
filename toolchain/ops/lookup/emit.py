"""C emitters for GATHER_ND and EMBEDDING_LOOKUP, laid out by templates/c/lookup.c.j2: a loop
over the index vectors or ids, each checked before its slice or row is copied (helper group
"index_failure" holds the flag an index out of range sets); and for DYNAMIC_UPDATE_SLICE, the
operand copied, then the update's rows copied from a clamped start."""

from __future__ import annotations

import math

import numpy as np

from toolchain.ops.emit import Kernel, OpContext, c_comment, c_float, c_sum, render_macro
from toolchain.ops.lookup.prepare import (
    DynamicUpdateSliceParams,
    EmbeddingLookupParams,
    GatherNdParams,
)

TEMPLATE = "c/lookup.c.j2"
HELPERS = ("index_failure",)


def emit_gather_nd(ctx: OpContext) -> Kernel:
    p: GatherNdParams = ctx.params
    params, indices, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    if p.slices == 0 or p.slice_size == 0:
        return Kernel("", note="GATHER_ND: nothing to copy")
    depth = len(p.dims)
    comment = (f"GATHER_ND of '{params.name}' {params.dtype}{list(params.shape)} at the "
               f"{depth}-coordinate index vectors of '{indices.name}' into '{out.name}': each "
               f"vector's coordinates, checked within {list(p.dims)} as LiteRT checks them, "
               f"times the strides {list(p.strides)} give where its slice of {p.slice_size} "
               "elements starts.")
    out_of_range = " || ".join(f"index[{j}] < 0 || index[{j}] >= {d}"
                               for j, d in enumerate(p.dims))
    start = " + ".join(f"(int32_t)index[{j}]" + (f" * {s}" if s != 1 else "")
                       for j, s in enumerate(p.strides))
    return Kernel(render_macro(TEMPLATE, "gather_nd", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "ctype": out.ctype,
        "index_ctype": indices.ctype,
        "params": params.ptr,
        "indices": indices.ptr,
        "out": out.ptr,
        "slices": p.slices,
        "depth": depth,
        "coordinate_out_of_range": out_of_range,
        "start": start,
        "slice_size": p.slice_size,
        "slice_bytes": p.slice_size * np.dtype(out.dtype).itemsize,
    }), helpers=HELPERS)


def emit_embedding_lookup(ctx: OpContext) -> Kernel:
    p: EmbeddingLookupParams = ctx.params
    ids, value, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    if p.ids == 0 or p.row_size == 0:
        return Kernel("", note="EMBEDDING_LOOKUP: nothing to copy")
    how = ("multiplied by the value's scale, in float" if p.scale is not None else "copied")
    comment = (f"EMBEDDING_LOOKUP of the rows of '{value.name}' {value.dtype}"
               f"{list(value.shape)} that '{ids.name}' names into '{out.name}' {out.dtype}, "
               f"{how}; an id outside [0, {p.rows}) fails.")
    return Kernel(render_macro(TEMPLATE, "embedding_lookup", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "ids": ids.ptr,
        "value": value.ptr,
        "value_ctype": value.ctype,
        "out": out.ptr,
        "out_ctype": out.ctype,
        "count": p.ids,
        "rows": p.rows,
        "row_size": p.row_size,
        "row_bytes": p.row_size * np.dtype(out.dtype).itemsize,
        "scale": c_float(p.scale) if p.scale is not None else None,
    }), helpers=HELPERS)


def emit_dynamic_update_slice(ctx: OpContext) -> Kernel:
    """Coordinates where the update spans the operand start at 0 and are not read; the others
    are clamped as LiteRT clamps them (in int64 for int64 starts, so none wraps)."""
    p: DynamicUpdateSliceParams = ctx.params
    operand, update, start, out = ctx.inputs[0], ctx.inputs[1], ctx.inputs[2], ctx.outputs[0]
    itemsize = np.dtype(out.dtype).itemsize
    rank = len(p.shape)
    moved = [k for k in range(rank) if p.update_shape[k] < p.shape[k]]
    comment = (f"DYNAMIC_UPDATE_SLICE: '{operand.name}' {out.dtype}{list(p.shape)} copied into "
               f"'{out.name}', then '{update.name}' {list(p.update_shape)} written from the "
               f"start '{start.name}' gives, each coordinate clamped so the update fits.")
    # the update's rows: one memcpy per row of its last axis, a loop per axis before it
    loops = [k for k in range(rank - 1) if p.update_shape[k] > 1]
    out_strides = [math.prod(p.shape[k + 1:]) for k in range(rank)]
    update_strides = [math.prod(p.update_shape[k + 1:]) for k in range(rank)]
    out_at = c_sum([(f"{name}{k}", out_strides[k]) for k in range(rank)
                    for name, used in (("s", k in moved), ("i", k in loops)) if used])
    update_at = c_sum([(f"i{k}", update_strides[k]) for k in loops])
    row = p.update_shape[-1] if rank else 1
    return Kernel(render_macro(TEMPLATE, "dynamic_update_slice", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "ctype": out.ctype,
        "start_ctype": start.ctype,
        "operand": operand.ptr,
        "source": update.ptr,
        "start": start.ptr,
        "out": out.ptr,
        "bytes": math.prod(p.shape) * itemsize,
        "updated": math.prod(p.update_shape),
        "clamps": [(k, p.shape[k] - p.update_shape[k]) for k in moved],
        "loops": [(k, p.update_shape[k]) for k in loops],
        "out_at": out_at,
        "update_at": update_at,
        "row_bytes": row * itemsize,
    }))
