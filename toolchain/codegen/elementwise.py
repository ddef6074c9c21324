"""C emitters for the elementwise binary ops (ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM,
SQUARED_DIFFERENCE), from the same params as runtime_py.

The broadcast is collapsed here to the fewest loops with constant strides: dimensions of size 1
vanish and adjacent dimensions that both inputs walk (or skip) alike merge, so equal shapes are
one flat loop and, e.g., a per-channel operand is two loops. Each op's arithmetic is C text
from the tables below; the template only lays out the function and the loop nest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from toolchain.codegen.context import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_int32,
    c_offset,
    legacy_text,
    render_macro,
)
from toolchain.fixedpoint import multiply_by_quantized_multiplier
from toolchain.ops.elementwise import (
    OPCODES,
    PlainParams,
    RescaledParams,
    ScaledProductParams,
)
from toolchain.quant import INT_RANGES

TEMPLATE = "c/elementwise.c.j2"
# The rescaled int8 inputs and the int8 products are int32 values.
WIDE_TYPE = "int32_t"
INT8_VALUES = 256


def _plus(value: int) -> str:
    """`+ 3` or `- 10`: an added constant as it reads best after an operand."""
    return f"+ {value}" if value >= 0 else f"- {-value}"


@dataclass(frozen=True)
class Loop:
    """One collapsed dimension: `n` iterations, element strides of input1, input2 (0 where that
    input is broadcast) and of the output."""

    n: int
    sa: int
    sb: int
    so: int


def broadcast_loops(shape1: tuple[int, ...], shape2: tuple[int, ...],
                    out_shape: tuple[int, ...]) -> list[Loop]:
    """Loops, outermost first, that visit the output in order. The innermost loop has stride 1
    for the output and for each input it walks. An empty list means an empty output."""
    if any(n == 0 for n in out_shape):
        return []
    rank = len(out_shape)
    s1 = (1,) * (rank - len(shape1)) + tuple(shape1)
    s2 = (1,) * (rank - len(shape2)) + tuple(shape2)
    merged: list[list] = []  # [size, input1 walks it, input2 walks it]
    for n, d1, d2 in zip(out_shape, s1, s2):
        if n == 1:
            continue
        walks = (d1 == n, d2 == n)
        if merged and tuple(merged[-1][1:]) == walks:
            merged[-1][0] *= n
        else:
            merged.append([n, *walks])
    if not merged:  # a single element
        merged = [[1, True, True]]
    loops, stride1, stride2, stride_out = [], 1, 1, 1
    for n, walks1, walks2 in reversed(merged):
        loops.append(Loop(n, stride1 if walks1 else 0, stride2 if walks2 else 0, stride_out))
        stride1 *= n if walks1 else 1
        stride2 *= n if walks2 else 1
        stride_out *= n
    return loops[::-1]


Load = Callable[[str], str]  # an input element's C text -> the value `_op` takes
_CONSTANT_HERE = " /* constant along this loop */"


def broadcast_nest(loops: list[Loop], ctype: str, wide: str, op: str,
                   loads: tuple[Load, Load] = (str, str), ivdep: bool = True) -> dict:
    """The loop nest of `loops` as C text: loop k derives the pointers a<k+1>, b<k+1>, o<k+1>
    from a<k>, b<k>, o<k> (the operands at level 0); the innermost loop stores `op(x, y)` of
    one element of each input, hoisting an input it does not walk into a constant of type
    `wide`. The nest writes output element j right after reading the input elements it needs."""
    levels = []
    for k, loop in enumerate(loops[:-1]):
        i = ConstantLoop(f"i{k}", loop.n)
        levels.append({
            "header": i.header,
            "pad": "  " * (k + 1),
            "pointers": [
                f"const {ctype} *a{k + 1} = {c_offset(f'a{k}', [(i, loop.sa)])};",
                f"const {ctype} *b{k + 1} = {c_offset(f'b{k}', [(i, loop.sb)])};",
                f"{ctype} *o{k + 1} = {c_offset(f'o{k}', [(i, loop.so)])};",
            ],
        })
    depth = len(loops) - 1
    inner = ConstantLoop("i", loops[-1].n)
    a, b = (loads[0](f"a{depth}[{inner.index}]"), loads[1](f"b{depth}[{inner.index}]"))
    hoisted = None
    if not loops[-1].sa:
        hoisted, a = f"const {wide} x = {loads[0](f'a{depth}[0]')};{_CONSTANT_HERE}", "x"
    elif not loops[-1].sb:
        hoisted, b = f"const {wide} y = {loads[1](f'b{depth}[0]')};{_CONSTANT_HERE}", "y"
    return {
        "outer": levels,
        "inner": {
            "loop": inner,
            "pad": "  " * (depth + 1),
            "hoisted": hoisted,
            "ivdep": ivdep and inner.written,
            "statement": f"o{depth}[{inner.index}] = {op}({a}, {b});",
        },
    }


# -- the arithmetic of each op, in C ---------------------------------------------------------

# The plain ops' result `r` of x and y in the tensors' type `{t}`, line by line.
_FLOAT_BODIES: dict[str, tuple[str, ...]] = {
    "ADD": ("{t} r = x + y;",),
    "SUB": ("{t} r = x - y;",),
    "MUL": ("{t} r = x * y;",),
    "DIV": ("{t} r = x / y; /* IEEE: a zero divisor gives an infinity or NaN */",),
    "MAXIMUM": ("{t} r = x > y ? x : y; /* TFLite's select: a NaN in x yields y */",),
    "MINIMUM": ("{t} r = x < y ? x : y; /* TFLite's select: a NaN in x yields y */",),
    "SQUARED_DIFFERENCE": ("const {t} d = x - y;", "{t} r = d * d;"),
}
_WRAPS = ("/* TFLite's int32 wraps on overflow; uint32_t arithmetic wraps without undefined "
          "behaviour. */")
_INT_BODIES: dict[str, tuple[str, ...]] = {
    "ADD": (_WRAPS, "{t} r = ({t})((uint32_t)x + (uint32_t)y);"),
    "SUB": (_WRAPS, "{t} r = ({t})((uint32_t)x - (uint32_t)y);"),
    "MUL": (_WRAPS, "{t} r = ({t})((uint32_t)x * (uint32_t)y);"),
    "DIV": (
        "/* C division truncates toward zero as TFLite's does. TFLite refuses a zero divisor,",
        "   which a void kernel cannot report: x / 0 gives 0 here, as in runtime_py.",
        "   INT32_MIN / -1 wraps to INT32_MIN. */",
        "{t} r = y == 0 ? 0 : y == -1 ? ({t})(0u - (uint32_t)x) : x / y;",
    ),
    "MAXIMUM": ("{t} r = x > y ? x : y;",),
    "MINIMUM": ("{t} r = x < y ? x : y;",),
    "SQUARED_DIFFERENCE": (_WRAPS, "const uint32_t d = (uint32_t)x - (uint32_t)y;",
                           "{t} r = ({t})(d * d);"),
}
# How the rescaled int8 inputs x and y (int32 values at a common scale) combine.
_COMBINED: dict[str, str] = {
    "ADD": "x + y",
    "SUB": "x - y",
    "SQUARED_DIFFERENCE": "(x - y) * (x - y)",
}


def _clamp_lines(low: str | None, high: str | None) -> list[str]:
    """Clamping `r` between bounds (None: nothing to clamp at that end), as two selects, a form
    compilers turn into vector min/max."""
    lines = [] if low is None else [f"r = r < {low} ? {low} : r;"]
    return lines + ([] if high is None else [f"r = r > {high} ? {high} : r;"])


def _bound(value: float | int | None, extreme: int | None, fmt) -> str | None:
    """C text of one clamp bound, None where there is nothing to clamp (no activation, or an
    integer type's own extreme, which would also trip -Wtype-limits)."""
    return None if value is None or value == extreme else fmt(value)


def _plain_values(p: PlainParams, ctype: str) -> dict:
    is_float = p.dtype == "float32"
    low, high = (None, None) if is_float else INT_RANGES[p.dtype]
    fmt = c_float if is_float else c_int32
    # float clamps even without an activation: infinities become +-FLT_MAX
    clamp = _clamp_lines(_bound(p.clamp_min, low, fmt), _bound(p.clamp_max, high, fmt))
    body = (_FLOAT_BODIES if is_float else _INT_BODIES)[p.opcode]
    return {"macro": "plain_op", "wide": ctype, "loads": (str, str),
            "body": [line.format(t=ctype) for line in body] + clamp}


def _rescaled_input_table(p: RescaledParams, offset: int, multiplier: int,
                          shift: int) -> str:
    """The rescaled value of every int8 input, -128 first: runtime_py's input stage, exactly."""
    values = np.arange(-128, 128, dtype=np.int64)
    return c_array(multiply_by_quantized_multiplier((values + offset) << p.left_shift,
                                                    multiplier, shift), per_line=8)


def _rescaled_values(p: RescaledParams, prefix: str, ctype: str) -> dict:
    return {
        "macro": "rescaled_op", "wide": WIDE_TYPE, "left_shift": p.left_shift,
        "table_length": INT8_VALUES,
        "tables": [_rescaled_input_table(p, p.input1_offset, p.input1_multiplier,
                                         p.input1_shift),
                   _rescaled_input_table(p, p.input2_offset, p.input2_multiplier,
                                         p.input2_shift)],
        "loads": tuple(_table_load(f"{prefix}_in{n}") for n in (1, 2)),
        "body": [f"{WIDE_TYPE} r = {_COMBINED[p.opcode]};",
                 f"r = arenac_mbqm(r, {p.output_multiplier}, {p.output_shift}) "
                 f"{_plus(p.output_offset)};",
                 *_clamp_lines(str(p.activation_min), str(p.activation_max)),
                 f"return ({ctype})r;"],
    }


def _table_load(table: str) -> Load:
    """An int8 element's rescaled value: the table entry of its value (the table starts at
    -128)."""
    return lambda element: f"{table}[{element} + {INT8_VALUES // 2}]"


def _product_values(p: ScaledProductParams, prefix: str, ctype: str) -> dict:
    return {
        "macro": "product_op", "wide": WIDE_TYPE,
        "in1_offset": _plus(p.input1_offset), "in2_offset": _plus(p.input2_offset),
        "loads": (lambda e: f"{prefix}_in1({e})", lambda e: f"{prefix}_in2({e})"),
        "body": [f"{WIDE_TYPE} r = arenac_mbqm(x * y, {p.output_multiplier}, {p.output_shift}) "
                 f"{_plus(p.output_offset)};",
                 *_clamp_lines(str(p.activation_min), str(p.activation_max)),
                 f"return ({ctype})r;"],
    }


def binary_values(ctx: OpContext) -> dict:
    p = ctx.params
    a, b = ctx.inputs
    out = ctx.outputs[0]
    if isinstance(p, RescaledParams):
        values = _rescaled_values(p, ctx.prefix, out.ctype)
    elif isinstance(p, ScaledProductParams):
        values = _product_values(p, ctx.prefix, out.ctype)
    else:
        values = _plain_values(p, out.ctype)
    loops = broadcast_loops(p.input1_shape, p.input2_shape, p.output_shape)
    comment = (f"{p.opcode} {out.dtype} {list(p.input1_shape)}, {list(p.input2_shape)} -> "
               f"{list(p.output_shape)} '{out.name}'")
    return {
        **values,
        "empty": not loops,
        "nest": broadcast_nest(loops, out.ctype, values["wide"], f"{ctx.prefix}_op",
                               values["loads"]) if loops else None,
        "fn": ctx.fn, "prefix": ctx.prefix, "ctype": out.ctype,
        "a": a.ptr, "b": b.ptr, "out": out.ptr,
        "comment": c_comment(comment),
    }


def emit_binary(ctx: OpContext) -> Kernel:
    values = binary_values(ctx)
    values["op_function"] = render_macro(TEMPLATE, values["macro"], values)
    text = render_macro(TEMPLATE, "binary", values)
    uses_ivdep = values["nest"] is not None and values["nest"]["inner"]["ivdep"]
    return Kernel(text, ("ivdep",) if uses_ivdep else ())


EMITTERS = dict.fromkeys(OPCODES, legacy_text(emit_binary))
