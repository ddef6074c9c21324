"""C emitters for QUANTIZE, DEQUANTIZE and CAST, from the same params as runtime_py.

All three are element-wise: each C loop reads element i, then writes element i, in increasing
i, and nothing else, so the output may share memory with the input as toolchain.ops.overlaps
declares (at or below it, lower by the growth when output elements are wider).
"""

from __future__ import annotations

import math

from toolchain.codegen.context import (
    CTensor,
    OpContext,
    c_array,
    c_float,
    c_int32,
    c_length,
    family_macro,
)
from toolchain.ops.quantize import (
    AffineQuantizeParams,
    CastParams,
    DequantizeParams,
    RequantizeParams,
)

TEMPLATE = "c/quantize.c.j2"

# The integer dtypes a float saturates into: (lowest, highest) as C expressions and values.
_LIMITS: dict[str, tuple[str, str, int, int]] = {
    "int8": ("INT8_MIN", "INT8_MAX", -(2**7), 2**7 - 1),
    "uint8": ("0", "UINT8_MAX", 0, 2**8 - 1),
    "int16": ("INT16_MIN", "INT16_MAX", -(2**15), 2**15 - 1),
    "int32": ("INT32_MIN", "INT32_MAX", -(2**31), 2**31 - 1),
    "int64": ("INT64_MIN", "INT64_MAX", -(2**63), 2**63 - 1),
}


def _add(value: int) -> str:
    """` + 10`, ` - 3` or nothing: a constant added after an operand."""
    return f" + {value}" if value > 0 else f" - {-value}" if value < 0 else ""


def _common(ctx: OpContext, kind: str) -> dict:
    x, out = ctx.inputs[0], ctx.outputs[0]
    return {
        "fn": ctx.fn,
        "prefix": ctx.prefix,
        "kind": kind,
        "in_type": x.ctype,
        "out_type": out.ctype,
        "x": x.ptr,
        "out": out.ptr,
        "size": out.size,
        "comment": f"{ctx.op.opcode} {x.dtype} -> {out.dtype} {list(out.shape)} '{out.name}'",
    }


def _quantize_values(ctx: OpContext) -> dict:
    p = ctx.params
    if isinstance(p, AffineQuantizeParams):
        # The zero point is added to the int32 conversion with int32 wrap-around (TFLite).
        return {
            "scale": c_float(p.scale),
            "zero_point": "" if p.zero_point == 0 else f" + (uint32_t){p.zero_point}"
            if p.zero_point < 0 else f" + {p.zero_point}u",
            "out_min": c_int32(p.output_min),
            "out_max": c_int32(p.output_max),
            **_common(ctx, "affine"),
        }
    assert isinstance(p, RequantizeParams)
    return {
        "in_zero_point": _add(-p.input_zero_point),
        "multiplier": p.multiplier,
        "shift": p.shift,
        "out_zero_point": _add(p.output_zero_point),
        "out_min": c_int32(p.output_min),
        "out_max": c_int32(p.output_max),
        **_common(ctx, "requantize"),
    }


def emit_quantize(ctx: OpContext) -> str:
    return family_macro(TEMPLATE, "quantize")(_quantize_values(ctx))


def _dequantize_layout(p: DequantizeParams, x: CTensor) -> tuple[int, int, int]:
    """(outer, channels, inner): the channel axis with what lies before and after it."""
    if p.channel_axis is None:
        return 1, 1, x.size
    shape = x.shape
    return (math.prod(shape[: p.channel_axis]), shape[p.channel_axis],
            math.prod(shape[p.channel_axis + 1:]))


def _dequantize_values(ctx: OpContext) -> dict:
    p: DequantizeParams = ctx.params
    x = ctx.inputs[0]
    outer, channels, inner = _dequantize_layout(p, x)
    values = _common(ctx, "dequantize")
    values.update({
        "per_channel": p.channel_axis is not None,
        "outer": outer,
        "channels": channels,
        "channels_length": c_length(channels),
        "inner": inner,
        "scale": c_float(p.scales[0]),
        "zero_point": _add(-p.zero_points[0]),
        "scales": c_array(p.scales),
        "zero_points": c_array(p.zero_points),
    })
    return values


def emit_dequantize(ctx: OpContext) -> str:
    return family_macro(TEMPLATE, "dequantize")(_dequantize_values(ctx))


def _cast_values(ctx: OpContext) -> dict:
    p: CastParams = ctx.params
    values = _common(ctx, "cast_" + p.method)
    if p.method == "saturate":
        low, high, low_value, high_value = _LIMITS[ctx.outputs[0].dtype]
        values.update({
            "low": low,
            "high": high,
            # Both are exact float32 values: a power of two, or zero.
            "low_float": c_float(low_value),
            "above_float": c_float(high_value + 1),
        })
    return values


def emit_cast(ctx: OpContext) -> str:
    return family_macro(TEMPLATE, "cast")(_cast_values(ctx))


EMITTERS = {"QUANTIZE": emit_quantize, "DEQUANTIZE": emit_dequantize, "CAST": emit_cast}
