"""C emitters for the comparison and logical ops and SELECT / SELECT_V2, from the same params as
runtime_py (prepare.py); templates/c/comparisons.c.j2 lays them out.

The broadcast reuses the elementwise family's collapsed loop nest; each input's C type is its
own and the output's is the bool's uint8_t.
"""

from __future__ import annotations

from toolchain.numerics.quant import INT_RANGES
from toolchain.ops.comparisons.prepare import C_OPERATORS, RescaledComparisonParams
from toolchain.ops.elementwise.emit import (
    BYTE_VALUES,
    WIDE_TYPE,
    _table_load,
    broadcast_loops,
    broadcast_nest,
    collapsed_loops,
    rescaled_inputs,
)
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_offset,
    render_macro,
    signed,
)

TEMPLATE = "c/comparisons.c.j2"


def _inputs(p: RescaledComparisonParams) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return ((p.input1_offset, p.input1_multiplier, p.input1_shift),
            (p.input2_offset, p.input2_multiplier, p.input2_shift))


def _rescaled_values(p: RescaledComparisonParams, prefix: str) -> dict:
    """int8 and uint8: a table of 256 scaled values per input; int16: each input scaled as it
    is read (|x + offset| < 2^16, so shifted 8 bits it fits in int32)."""
    if p.dtype == "int16":
        return {"macro": "rescaled_computed_op", "wide": WIDE_TYPE,
                "scale_up": 1 << p.left_shift,
                "inputs": [{"value": f"(x {signed(o)})" if o else "x", "multiplier": m, "shift": s}
                           for o, m, s in _inputs(p)],
                "loads": (lambda e: f"{prefix}_in1({e})", lambda e: f"{prefix}_in2({e})")}
    return {"macro": "rescaled_op", "wide": WIDE_TYPE, "left_shift": p.left_shift,
            "table_length": BYTE_VALUES,
            "tables": [c_array(rescaled_inputs(p, *scaling), per_line=8)
                       for scaling in _inputs(p)],
            "loads": tuple(_table_load(f"{prefix}_in{n}", -INT_RANGES[p.dtype][0])
                           for n in (1, 2))}


def emit_binary(ctx: OpContext) -> Kernel:
    p = ctx.params
    a, b = ctx.inputs
    out = ctx.outputs[0]
    if isinstance(p, RescaledComparisonParams):
        values = _rescaled_values(p, ctx.prefix)
    else:
        values = {"macro": "plain_op", "wide": a.ctype, "loads": (str, str)}
    loops = broadcast_loops(p.input1_shape, p.input2_shape, p.output_shape)
    comment = (f"{p.opcode} {a.dtype} {list(p.input1_shape)}, {list(p.input2_shape)} -> "
               f"{list(p.output_shape)} '{out.name}'")
    values.update({
        "empty": not loops,
        "nest": broadcast_nest(loops, out.ctype, values["wide"], f"{ctx.prefix}_op",
                               values["loads"], in_ctype=a.ctype) if loops else None,
        "fn": ctx.fn, "prefix": ctx.prefix, "ctype": out.ctype, "in_ctype": a.ctype,
        "operator": C_OPERATORS[p.opcode], "a": a.ptr, "b": b.ptr, "out": out.ptr,
        "comment": c_comment(comment),
    })
    values["op_function"] = render_macro(TEMPLATE, values["macro"], values)
    text = render_macro(TEMPLATE, "binary", values)
    uses_ivdep = values["nest"] is not None and values["nest"]["inner"]["ivdep"]
    # its inputs rescaled by arenac_mbqm, when there is an element to compare
    computed = values["macro"] == "rescaled_computed_op" and not values["empty"]
    return Kernel(text, (*(("mbqm",) if computed else ()), *(("ivdep",) if uses_ivdep else ())))


def emit_not(ctx: OpContext) -> Kernel:
    x, out = ctx.inputs[0], ctx.outputs[0]
    text = render_macro(TEMPLATE, "logical_not", {
        "fn": ctx.fn, "x": x.ptr, "out": out.ptr, "loop": ConstantLoop("i", out.size),
        "comment": c_comment(f"LOGICAL_NOT bool {list(out.shape)} '{out.name}'")})
    return Kernel(text)


def _element(pointer: str, stride: int, index: str) -> str:
    return f"{pointer}[{index if stride else 0}]"


def select_nest(loops: list[tuple[int, tuple[int, ...], int]], ctype: str) -> dict:
    """The loop nest of SELECT: pointers c<k>, a<k>, b<k>, o<k> derived level by level as in
    the elementwise nest; the innermost loop stores `c ? a : b`, reading index 0 of an operand
    it does not walk."""
    types = ("const uint8_t", f"const {ctype}", f"const {ctype}", ctype)
    levels = []
    for k, (n, strides, stride_out) in enumerate(loops[:-1]):
        i = ConstantLoop(f"i{k}", n)
        levels.append({"header": i.header, "pad": "  " * (k + 1), "pointers": [
            f"{t} *{name}{k + 1} = {c_offset(f'{name}{k}', [(i, stride)])};"
            for t, name, stride in zip(types, "cabo", (*strides, stride_out), strict=True)]})
    depth = len(loops) - 1
    n, (sc, sa, sb), _ = loops[-1]
    inner = ConstantLoop("i", n)
    c, a, b = (_element(f"{name}{depth}", stride, inner.index)
               for name, stride in zip("cab", (sc, sa, sb), strict=True))
    return {"outer": levels, "inner": {
        "loop": inner, "pad": "  " * (depth + 1), "hoisted": None, "ivdep": inner.written,
        "unroll": False,
        "statement": f"o{depth}[{inner.index}] = {c} ? {a} : {b};"}}


def emit_select(ctx: OpContext) -> Kernel:
    p = ctx.params
    cond, x, y = ctx.inputs
    out = ctx.outputs[0]
    loops = collapsed_loops((p.condition_shape, p.x_shape, p.y_shape), p.output_shape)
    nest = select_nest(loops, out.ctype) if loops else None
    comment = (f"{p.opcode} {out.dtype} {list(p.condition_shape)} ? {list(p.x_shape)} : "
               f"{list(p.y_shape)} -> {list(p.output_shape)} '{out.name}'")
    text = render_macro(TEMPLATE, "select", {
        "fn": ctx.fn, "ctype": out.ctype, "c": cond.ptr, "a": x.ptr, "b": y.ptr,
        "out": out.ptr, "nest": nest, "comment": c_comment(comment)})
    return Kernel(text, ("ivdep",) if nest is not None and nest["inner"]["ivdep"] else ())
