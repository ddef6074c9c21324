"""The C of a TFLM_DECODE the generator could not fold (an output the graph returns): each
output's decoded values as a constant table, copied into it; laid out by
templates/c/decode.c.j2."""

from __future__ import annotations

from toolchain.ops.decode.prepare import DecodeParams
from toolchain.ops.emit import Kernel, OpContext, c_array, c_comment, render_macro, table_definition

TEMPLATE = "c/decode.c.j2"


def emit_decode(ctx: OpContext) -> Kernel:
    p: DecodeParams = ctx.params
    copies, tables = [], []
    for k, (out, values, kind) in enumerate(zip(ctx.outputs, p.values, p.kinds, strict=True)):
        name = f"{ctx.prefix}_decoded_{k}"
        data = values.astype("uint8") if out.dtype == "bool" else values
        tables.append(table_definition({"name": name, "ctype": out.ctype,
                                        "length": max(values.size, 1),
                                        "data": c_array(data.ravel()),
                                        "comment": c_comment(f"'{out.name}' decoded ({kind})")}))
        copies.append({"out": out.ptr, "table": name, "nbytes": values.nbytes})
    comment = ("TFLM_DECODE, decoded at generation: "
               + ", ".join(f"'{o.name}'" for o in ctx.outputs) + " copied from constants.")
    return Kernel(render_macro(TEMPLATE, "decode", {"fn": ctx.fn, "comment": c_comment(comment),
                                                    "copies": copies}),
                  definitions=tuple(tables))
