"""C emitters for ZEROS_LIKE (one memset), FILL (the value, read once, stored to every
element), SHAPE (each dimension stored) and BROADCAST_ARGS (one loop from the last dimension),
laid out by templates/c/fill.c.j2."""

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
from toolchain.ops.fill.prepare import (
    BroadcastArgsParams,
    FillParams,
    ShapeParams,
    ZerosLikeParams,
)

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


def emit_broadcast_args(ctx: OpContext) -> Kernel:
    """Each dimension narrowed to int before it is compared, as TFLite's reference reads it; two
    that differ with neither 1 fail the invoke (NAME_ERROR_INCOMPATIBLE_SHAPES), where TFLite
    stops the process."""
    p: BroadcastArgsParams = ctx.params
    a, b, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    comment = (f"BROADCAST_ARGS: the shape '{a.name}' {list(a.shape)} and '{b.name}' "
               f"{list(b.shape)} broadcast to, into '{out.name}', from the last dimension; "
               "dimensions that differ with neither 1 fail.")
    return Kernel(render_macro(TEMPLATE, "broadcast_args", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "ctype": out.ctype,
        "a": a.ptr,
        "b": b.ptr,
        "out": out.ptr,
        "x": dimension("a", p.lengths[0], p.out),
        "y": dimension("b", p.lengths[1], p.out),
        "n": p.out,
    }), helpers=("shape_failure",))


def dimension(shape: str, length: int, n: int) -> str:
    """C for dimension i from the last of `shape` (`length` long) as an int: 1 past its start."""
    read = f"(int32_t){shape}[{length - 1} - i]"
    return read if length == n else f"i < {length} ? {read} : 1"
