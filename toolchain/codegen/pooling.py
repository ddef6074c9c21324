"""C emitters for AVERAGE_POOL_2D and MAX_POOL_2D (NHWC), from the same params as runtime_py."""

from __future__ import annotations

from toolchain.codegen.context import OpContext, c_float, family_macro
from toolchain.ops.pooling import Pool2DParams

_LOWEST = {"int8": "-128", "float32": "-INFINITY"}


def pool_values(ctx: OpContext, kind: str) -> dict:
    p: Pool2DParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    batch, height, width, channels = x.shape
    is_float = x.dtype == "float32"
    return {
        "fn": ctx.fn,
        "kind": kind,
        "is_float": is_float,
        "ctype": x.ctype,
        "acc_type": "float" if is_float else "int32_t",
        "x": x.ptr,
        "out": out.ptr,
        "batch": batch,
        "height": height,
        "width": width,
        "channels": channels,
        "out_h": p.output_height,
        "out_w": p.output_width,
        "filter_h": p.filter_height,
        "filter_w": p.filter_width,
        "stride_h": p.stride_height,
        "stride_w": p.stride_width,
        "pad_top": p.pad_top,
        "pad_left": p.pad_left,
        "init": "0" if kind == "average" else _LOWEST[x.dtype],
        "act_min": c_float(p.activation_min) if is_float else int(p.activation_min),
        "act_max": c_float(p.activation_max) if is_float else int(p.activation_max),
        "comment": f"{ctx.op.opcode} '{out.name}'",
    }


def emit_average(ctx: OpContext) -> str:
    return family_macro("c/pooling.c.j2", "pool")(pool_values(ctx, "average"))


def emit_max(ctx: OpContext) -> str:
    return family_macro("c/pooling.c.j2", "pool")(pool_values(ctx, "max"))


EMITTERS = {"AVERAGE_POOL_2D": emit_average, "MAX_POOL_2D": emit_max}
