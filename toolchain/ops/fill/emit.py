"""C emitters for ZEROS_LIKE (one memset), FILL (the value, read once, stored to every
element) and SHAPE (each dimension stored), laid out by templates/c/fill.c.j2."""

from __future__ import annotations

from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_comment,
    c_int64,
    render_macro,
    written_vars,
)
from toolchain.ops.fill.prepare import FillParams, ShapeParams, ZerosLikeParams

TEMPLATE = "c/fill.c.j2"


def emit_zeros_like(ctx: OpContext) -> Kernel:
    p: ZerosLikeParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    comment = (f"ZEROS_LIKE of '{x.name}' {x.dtype}{list(x.shape)}: '{out.name}' all zeros "
               "(the input's values are not read).")
    return Kernel(render_macro(TEMPLATE, "zeros_like", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "out": out.ptr,
        "nbytes": p.nbytes,
    }))


def emit_fill(ctx: OpContext) -> Kernel:
    p: FillParams = ctx.params
    value, out = ctx.inputs[1], ctx.outputs[0]
    each = ConstantLoop("i", p.elements)
    comment = (f"FILL '{out.name}' {out.dtype}{list(out.shape)} with the value of '{value.name}', "
               "read once before any element is written.")
    return Kernel(render_macro(TEMPLATE, "fill", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "ctype": out.ctype,
        "value": value.ptr,
        "out": out.ptr,
        "each": each,
        "counters": written_vars([each]),
    }))


def emit_shape(ctx: OpContext) -> Kernel:
    p: ShapeParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    comment = (f"SHAPE of '{x.name}' {x.dtype}{list(x.shape)} into '{out.name}' "
               f"{out.dtype}: {list(p.dims)} (the input's values are not read).")
    return Kernel(render_macro(TEMPLATE, "shape", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "ctype": out.ctype,
        "out": out.ptr,
        "dims": [c_int64(d) for d in p.dims],
    }))
