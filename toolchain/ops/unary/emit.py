"""C emitters for the math functions: one loop applying the function's C expression to every
element, laid out by templates/c/unary.c.j2."""

from __future__ import annotations

from toolchain.ops.emit import (
    MATH_H,
    ConstantLoop,
    Kernel,
    OpContext,
    c_comment,
    render_macro,
    written_vars,
)
from toolchain.ops.unary.prepare import UnaryMathParams

TEMPLATE = "c/unary.c.j2"

# Each function as TFLite's reference kernel computes it (elementwise.cc, floor.cc, ceil.cc,
# round.h, exp.cc): the same IEEE operation or C library function in C99's <math.h>, or ROUND's
# steps in a helper.
EXPRESSIONS = {
    "ABS": "fabsf({x})",
    "NEG": "-{x}",
    "SQUARE": "{x} * {x}",
    "SQRT": "sqrtf({x})",
    "RSQRT": "1.0f / sqrtf({x})",
    "FLOOR": "floorf({x})",
    "CEIL": "ceilf({x})",
    "ROUND": "arenac_round_half_even({x})",
    "EXP": "expf({x})",
    "LOG": "logf({x})",
    "SIN": "sinf({x})",
    "COS": "cosf({x})",
}
# the functions whose expression calls <math.h>, and the helper groups they call
CALLS_MATH = frozenset({"ABS", "SQRT", "RSQRT", "FLOOR", "CEIL", "ROUND", "EXP", "LOG", "SIN",
                        "COS"})
HELPERS = {"ROUND": ("round_half_even",)}
# NEG of an integer, wrapping as LiteRT's does on its targets, in unsigned arithmetic (negating
# INT32_MIN as a signed value is undefined in C)
INTEGER_NEG = {"int32": "(int32_t)(0u - (uint32_t){x})", "int64": "(int64_t)(0u - (uint64_t){x})"}


def emit_unary_math(ctx: OpContext) -> Kernel:
    """The function of each element, read before its output is written: in-place safe."""
    p: UnaryMathParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    each = ConstantLoop("i", p.elements)
    expression = INTEGER_NEG.get(x.dtype, EXPRESSIONS[p.function])
    comment = (f"{p.function} of '{x.name}' {x.dtype}{list(x.shape)} into '{out.name}': "
               f"{expression.format(x='x')} of each element x, read before its output is "
               "written.")
    return Kernel(render_macro(TEMPLATE, "unary", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "x": x.ptr,
        "out": out.ptr,
        "each": each,
        "counters": written_vars([each]),
        "ctype": x.ctype,
        "value": expression.format(x=f"x[{each.index}]"),
    }), helpers=HELPERS.get(p.function, ()),
        includes=(MATH_H,) if p.function in CALLS_MATH else ())
