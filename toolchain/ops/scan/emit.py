"""C emitter for CUMSUM: a loop over the rows along the axis, each summed from 0 in the
tensor's type (unsigned for the integers, which wrap), laid out by templates/c/scan.c.j2."""

from __future__ import annotations

from toolchain.ops.emit import Kernel, OpContext, c_comment, render_macro
from toolchain.ops.scan.prepare import CumSumParams

TEMPLATE = "c/scan.c.j2"

# The type the sum runs in: the integers in unsigned arithmetic, which wraps without undefined
# behaviour as LiteRT's int32 and int64 sums wrap.
SUM_TYPES = {"float32": ("float", "0.0f"), "int32": ("uint32_t", "0u"),
             "int64": ("uint64_t", "0u")}


def emit_cumsum(ctx: OpContext) -> Kernel:
    p: CumSumParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    sum_type, zero = SUM_TYPES[x.dtype]
    cast = "" if x.dtype == "float32" else f"({sum_type})"
    position = f"{p.depth - 1} - d" if p.reverse else "d"  # along the axis
    terms = [f"o * {p.depth * p.inner}"] if p.outer > 1 else []
    if p.inner > 1:
        terms += [f"({position}) * {p.inner}" if p.reverse else f"d * {p.inner}", "k"]
    else:
        terms.append(position)
    at = " + ".join(terms)
    comment = (f"CUMSUM of '{x.name}' {x.dtype}{list(x.shape)} into '{out.name}' along an axis "
               f"of {p.depth}{', from its end' if p.reverse else ''}: each sum from 0, element "
               f"by element{', stored before the element is added' if p.exclusive else ''}.")
    return Kernel(render_macro(TEMPLATE, "cumsum", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "ctype": x.ctype,
        "x": x.ptr,
        "out": out.ptr,
        "loops": [(var, count) for var, count in (("o", p.outer), ("k", p.inner)) if count > 1],
        "depth": p.depth,
        "at": at,
        "sum_type": sum_type,
        "zero": zero,
        "load": cast,
        "store": "" if x.dtype == "float32" else f"({x.ctype})",
        "exclusive": p.exclusive,
    }))
