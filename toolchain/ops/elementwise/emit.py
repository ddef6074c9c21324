"""C emitters for the elementwise binary ops (ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM,
SQUARED_DIFFERENCE, FLOOR_DIV, FLOOR_MOD) and ADD_N, from the same params as runtime_py.

The broadcast is collapsed here to the fewest loops with constant strides: dimensions of size 1
vanish and adjacent dimensions that both inputs walk (or skip) alike merge, so equal shapes are
one flat loop and, e.g., a per-channel operand is two loops. Each op's arithmetic is C text
from the tables below; the template only lays out the function and the loop nest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier
from toolchain.numerics.quant import INT_RANGES
from toolchain.ops.elementwise.prepare import (
    INT16_MASK_BITS,
    AddNParams,
    PlainParams,
    RescaledInputs,
    RescaledParams,
    ScaledProductParams,
    ShiftedParams,
)
from toolchain.ops.emit import (
    MATH_H,
    CDefinition,
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_int32,
    c_offset,
    definition,
    render_macro,
    signed,
    table_definition,
    written_vars,
)

TEMPLATE = "c/elementwise.c.j2"
# The rescaled int8 inputs and the int8 products are int32 values.
WIDE_TYPE = "int32_t"
BYTE_VALUES = 256  # values of an int8 or uint8 element


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
    return [Loop(n, sa, sb, so) for n, (sa, sb), so in
            collapsed_loops((shape1, shape2), out_shape)]


def collapsed_loops(shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]
                    ) -> list[tuple[int, tuple[int, ...], int]]:
    """The broadcast of any number of inputs as (trips, each input's element stride, 0 where
    it is broadcast, the output's stride) per loop, outermost first: dimensions of size 1
    vanish and adjacent dimensions every input walks (or skips) alike merge."""
    if any(n == 0 for n in out_shape):
        return []
    rank = len(out_shape)
    padded = [(1,) * (rank - len(shape)) + tuple(shape) for shape in shapes]
    merged: list[list] = []  # [size, which inputs walk it]
    for k, n in enumerate(out_shape):
        if n == 1:
            continue
        walks = tuple(shape[k] == n for shape in padded)
        if merged and merged[-1][1] == walks:
            merged[-1][0] *= n
        else:
            merged.append([n, walks])
    if not merged:  # a single element
        merged = [[1, (True,) * len(shapes)]]
    loops = []
    strides, stride_out = [1] * len(shapes), 1
    for n, walks in reversed(merged):
        loops.append((n, tuple(s if w else 0 for s, w in zip(strides, walks,
                                                             strict=True)), stride_out))
        strides = [s * n if w else s for s, w in zip(strides, walks, strict=True)]
        stride_out *= n
    return loops[::-1]


Load = Callable[[str], str]  # an input element's C text -> the value `_op` takes
_CONSTANT_HERE = " /* constant along this loop */"


def broadcast_nest(loops: list[Loop], ctype: str, wide: str, op: str,
                   loads: tuple[Load, Load] = (str, str), ivdep: bool = True,
                   in_ctype: str | None = None, unroll: bool = False) -> dict:
    """The loop nest of `loops` as C text: loop k derives the pointers a<k+1>, b<k+1>, o<k+1>
    from a<k>, b<k>, o<k> (the operands at level 0); the innermost loop stores `op(x, y)` of
    one element of each input, hoisting an input it does not walk into a constant of type
    `wide`. The nest writes output element j right after reading the input elements it needs.
    The inputs are of C type `in_ctype` where it differs from the output's `ctype`. `ivdep`
    lets the compiler vectorize the innermost loop without an overlap check (ARENAC_IVDEP),
    `unroll` asks it to unroll that loop four times (ARENAC_UNROLL4)."""
    in_ctype = in_ctype or ctype
    levels = []
    for k, loop in enumerate(loops[:-1]):
        i = ConstantLoop(f"i{k}", loop.n)
        levels.append({
            "header": i.header,
            "pad": "  " * (k + 1),
            "pointers": [
                f"const {in_ctype} *a{k + 1} = {c_offset(f'a{k}', [(i, loop.sa)])};",
                f"const {in_ctype} *b{k + 1} = {c_offset(f'b{k}', [(i, loop.sb)])};",
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
            "unroll": unroll and inner.written,
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
    # TFLite divides in double, then floors; its FLOOR_MOD is fmod moved onto the divisor's sign
    "FLOOR_DIV": ("{t} r = ({t})floor((double)x / (double)y);",),
    "FLOOR_MOD": ("const {t} m = fmodf(x, y);",
                  "{t} r = m != 0 && (y < 0) != (m < 0) ? m + y : m;"),
}
# the float ops whose arithmetic calls <math.h>
_FLOAT_MATH = frozenset({"FLOOR_DIV", "FLOOR_MOD"})
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
    "FLOOR_DIV": (
        "/* TFLite's floor of the quotient, exact in int32 arithmetic. It refuses a zero divisor:",
        "   x / 0 gives 0 here, as in runtime_py. INT32_MIN / -1 wraps to INT32_MIN. */",
        "const {t} q = y == 0 ? 0 : y == -1 ? ({t})(0u - (uint32_t)x) : x / y;",
        "{t} r = y != 0 && y != -1 && q * y != x && (x < 0) != (y < 0) ? q - 1 : q;",
    ),
    "FLOOR_MOD": (
        "/* The remainder on the divisor's sign, as TFLite's. x mod 0 gives 0 here (TFLite",
        "   refuses it), as does x mod -1 (where INT32_MIN % -1 would be undefined). */",
        "const {t} m = y == 0 || y == -1 ? 0 : x % y;",
        "{t} r = m != 0 && (y < 0) != (m < 0) ? m + y : m;",
    ),
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
    return {"helpers": (), "wide": ctype, "loads": (str, str),
            "body": [*(line.format(t=ctype) for line in body), *clamp, "return r;"]}


def rescaled_inputs(p: RescaledInputs, offset: int, multiplier: int, shift: int) -> np.ndarray:
    """The rescaled value of every input value, the type's lowest first: runtime_py's input
    stage, exactly."""
    low, high = INT_RANGES[p.dtype]
    values = np.arange(low, high + 1, dtype=np.int64)
    return multiply_by_quantized_multiplier((values + offset) << p.left_shift, multiplier, shift)


def _rescaled_input_table(p: RescaledParams, name: str, offset: int, multiplier: int,
                          shift: int) -> dict:
    return {"name": name, "ctype": WIDE_TYPE, "length": BYTE_VALUES,
            "data": c_array(rescaled_inputs(p, offset, multiplier, shift), per_line=8)}


def _rescaled_values(p: RescaledParams, prefix: str, ctype: str) -> dict:
    if p.dtype == "int16":  # no table of 65536 values: each input is rescaled as it is read
        return _rescaled_computed_values(p, prefix, ctype)
    return {
        "helpers": ("mbqm",), "wide": WIDE_TYPE,
        "lead": (f"/* Each int8 input value offset, shifted left {p.left_shift} bits for headroom "
                 "and rescaled to\n   the common scale (MultiplyByQuantizedMultiplier, evaluated "
                 f"offline for all {BYTE_VALUES} values).\n   Their magnitudes stay below 2^27 "
                 "(2^14 when shifted 7), so combining them cannot overflow. */"),
        "input_tables": [
            _rescaled_input_table(p, f"{prefix}_in1", p.input1_offset, p.input1_multiplier,
                                  p.input1_shift),
            _rescaled_input_table(p, f"{prefix}_in2", p.input2_offset, p.input2_multiplier,
                                  p.input2_shift)],
        "loads": tuple(_table_load(f"{prefix}_in{n}", -INT_RANGES[p.dtype][0]) for n in (1, 2)),
        "body": [f"{WIDE_TYPE} r = {_COMBINED[p.opcode]};",
                 f"r = arenac_mbqm(r, {p.output_multiplier}, {p.output_shift}) "
                 f"{signed(p.output_offset)};",
                 *_clamp_lines(str(p.activation_min), str(p.activation_max)),
                 f"return ({ctype})r;"],
    }


def _rescaled_computed_values(p: RescaledParams, prefix: str, ctype: str) -> dict:
    """int16 ADD and SUB (zero points 0): MultiplyByQuantizedMultiplierSmallerThanOneExp of
    each input shifted left, computed per element; |x| <= 2^15, so x * 2^15 fits in int32."""
    return {
        "helpers": ("mbqm",), "wide": WIDE_TYPE,
        "lead": c_comment(f"Each int16 input shifted left {p.left_shift} bits for headroom "
                          "and rescaled to the common scale (TFLite's "
                          "MultiplyByQuantizedMultiplierSmallerThanOneExp)."),
        "input_functions": [
            {"name": f"{prefix}_in{n}",
             "value": f"arenac_mbqm(x * {1 << p.left_shift}, {multiplier}, {shift})"}
            for n, multiplier, shift in ((1, p.input1_multiplier, p.input1_shift),
                                         (2, p.input2_multiplier, p.input2_shift))],
        "loads": (lambda e: f"{prefix}_in1({e})", lambda e: f"{prefix}_in2({e})"),
        "body": [f"{WIDE_TYPE} r = {_COMBINED[p.opcode]};",
                 f"r = arenac_mbqm(r, {p.output_multiplier}, {p.output_shift});",
                 *_clamp_lines(str(p.activation_min), str(p.activation_max)),
                 f"return ({ctype})r;"],
    }


def _shifted_input(prefix: str, n: int, shift: int) -> dict:
    """One input's division by 2^shift on the power-of-two path, as gemmlowp rounds an int16."""
    if shift >= INT16_MASK_BITS:
        return {"name": f"{prefix}_in{n}", "value": "x >= 0 ? 1 : -1", "comment": c_comment(
            f"input{n}'s scale is 2^{shift} times finer than the output's. TFLite divides it "
            f"by 2^{shift} with a 16-bit rounding mask, all ones from {INT16_MASK_BITS} bits on: "
            "every value rounds to 1 (0 included), or to -1 if negative.")}
    return {"name": f"{prefix}_in{n}", "value": f"arenac_rdbpot(x, {shift})", "comment": c_comment(
        f"input{n}'s scale is 2^{shift} times finer than the output's: divided by 2^{shift}, "
        "rounding halves away from zero.")}


def _shifted_values(p: ShiftedParams, prefix: str, ctype: str) -> dict:
    """int16 ADD and SUB on power-of-two scales: at most one input is shifted; the
    activation's range lies within int16, so its clamp also saturates."""
    shifts = (p.input1_shift, p.input2_shift)
    how = ("each int16 input brought to the output's scale by a rounding right shift (where its "
           "scale is finer), then combined." if any(shifts) else
           "both int16 inputs are at the output's scale.")
    return {
        "wide": WIDE_TYPE,
        "helpers": ("rdbpot",) if any(0 < s < INT16_MASK_BITS for s in shifts) else (),
        "lead": c_comment(f"TFLite's path for power-of-two scales: {how}"),
        "input_functions": [_shifted_input(prefix, n, shift)
                            for n, shift in enumerate(shifts, 1) if shift],
        "op_comment": ("/* The result saturates to int16; the activation's range lies within "
                       "it, so one clamp does\n   both. */"),
        "loads": tuple((lambda e, n=n: f"{prefix}_in{n}({e})") if shift else str
                       for n, shift in enumerate(shifts, 1)),
        "body": [f"{WIDE_TYPE} r = {_COMBINED[p.opcode]};",
                 *_clamp_lines(str(p.activation_min), str(p.activation_max)),
                 f"return ({ctype})r;"],
    }


def _table_load(table: str, offset: int) -> Load:
    """An element's rescaled value: the table entry of its value (the table starts at the
    type's lowest value, `offset` entries below zero)."""
    if not offset:
        return lambda element: f"{table}[{element}]"
    return lambda element: f"{table}[{element} {signed(offset)}]"


def _product_values(p: ScaledProductParams, prefix: str, ctype: str) -> dict:
    return {
        "helpers": ("mbqm",), "wide": WIDE_TYPE,
        "lead": ("/* Offset int8 inputs lie in [-255, 255] (int16 ones, zero point 0, in "
                 "[-2^15, 2^15)), so\n   their product fits in int32. */"),
        "input_functions": [
            {"name": f"{prefix}_in{n}", "value": f"x {signed(offset)}" if offset else "x"}
            for n, offset in ((1, p.input1_offset), (2, p.input2_offset))],
        "loads": (lambda e: f"{prefix}_in1({e})", lambda e: f"{prefix}_in2({e})"),
        "body": [f"{WIDE_TYPE} r = arenac_mbqm(x * y, {p.output_multiplier}, {p.output_shift}) "
                 f"{signed(p.output_offset)};",
                 *_clamp_lines(str(p.activation_min), str(p.activation_max)),
                 f"return ({ctype})r;"],
    }


def binary_values(ctx: OpContext, loads: tuple[Load, Load] | None = None, ivdep: bool = True,
                  unroll: bool = False) -> dict:
    """The template's values of a binary op; `loads` read the two inputs' elements in place of
    the op's own (its tables' or functions'), `ivdep` and `unroll` as broadcast_nest's."""
    p = ctx.params
    a, b = ctx.inputs
    out = ctx.outputs[0]
    if isinstance(p, RescaledParams):
        values = _rescaled_values(p, ctx.prefix, out.ctype)
    elif isinstance(p, ShiftedParams):
        values = _shifted_values(p, ctx.prefix, out.ctype)
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
                               loads or values["loads"], ivdep,
                               unroll=unroll) if loops else None,
        "fn": ctx.fn, "prefix": ctx.prefix, "ctype": out.ctype,
        "a": a.ptr, "b": b.ptr, "out": out.ptr,
        "comment": c_comment(comment),
    }


def emit_binary(ctx: OpContext) -> Kernel:
    values = binary_values(ctx)
    uses_ivdep = values["nest"] is not None and values["nest"]["inner"]["ivdep"]
    calls = () if values["empty"] else values["helpers"]  # no element, no op function
    p = ctx.params
    math = isinstance(p, PlainParams) and p.dtype == "float32" and p.opcode in _FLOAT_MATH
    return Kernel(render_macro(TEMPLATE, "binary", values),
                  (*calls, *(("ivdep",) if uses_ivdep else ())),
                  definitions=op_definitions(values), includes=(MATH_H,) if math else ())


def op_definitions(v: dict) -> tuple[CDefinition, ...]:
    """What an elementwise kernel's loop calls: its inputs' `_in<n>` tables or functions and
    `_op`, under the comment that leads them (none for an empty output, which calls
    nothing)."""
    if v["empty"]:
        return ()
    found = [table_definition(t, gap=True) for t in v.get("input_tables", ())]
    found += [definition(f["name"], render_macro(TEMPLATE, "input_function",
                                                 {"comment": "", "wide": v["wide"], **f}), True)
              for f in v.get("input_functions", ())]
    found.append(definition(f"{v['prefix']}_op", render_macro(
        TEMPLATE, "op_function", {"op_comment": "", **v}), gap=True))
    if v.get("lead"):
        found[0] = CDefinition(found[0].name, f"{v['lead']}\n{found[0].text}")
    return tuple(found)


def emit_add_n(ctx: OpContext) -> Kernel:
    """Element i of the output is element i of the first input plus that of each other in
    turn, written after every input's element i is read: in-place safe for any input."""
    p: AddNParams = ctx.params
    out = ctx.outputs[0]
    each = ConstantLoop("i", p.elements)
    names = ", ".join(f"'{x.name}'" for x in ctx.inputs)
    is_float = p.dtype == "float32"
    comment = (f"ADD_N of {names} into '{out.name}' {out.dtype}{list(out.shape)}: the first "
               "input plus each other in turn, as LiteRT sums" + ("." if is_float else
               "; int32 wraps on overflow, which uint32_t arithmetic does without undefined "
               "behaviour."))
    return Kernel(render_macro(TEMPLATE, "add_n", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "ctype": out.ctype,
        "inputs": [x.ptr for x in ctx.inputs],
        "others": range(1, len(ctx.inputs)),
        "out": out.ptr,
        "each": each,
        "counters": written_vars([each]),
        "sum_type": "float" if is_float else "uint32_t",
        "load": "" if is_float else "(uint32_t)",
        "store": "" if is_float else "(int32_t)",
    }))
