"""C emitters for GATHER_ND and EMBEDDING_LOOKUP, laid out by templates/c/lookup.c.j2: a loop
over the index vectors or ids, each checked before its slice or row is copied (helper group
"index_failure" holds the flag an index out of range sets)."""

from __future__ import annotations

import numpy as np

from toolchain.ops.emit import Kernel, OpContext, c_comment, c_float, render_macro
from toolchain.ops.lookup.prepare import EmbeddingLookupParams, GatherNdParams

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
