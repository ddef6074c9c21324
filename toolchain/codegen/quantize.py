"""C emitters for QUANTIZE, DEQUANTIZE and CAST, from the same params as runtime_py.

All three are element-wise: each C loop reads element i, then writes element i, in increasing
i, and nothing else, so the output may share memory with the input as toolchain.ops.overlaps
declares (at or below it, lower by the growth when output elements are wider). The statements
converting one element are C text from here; the template lays out the loop around them.
"""

from __future__ import annotations

import math

from toolchain.codegen.context import (
    ConstantLoop,
    CTensor,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_int32,
    c_length,
    c_sum,
    legacy_text,
    render_macro,
    written_vars,
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


def _common(ctx: OpContext) -> dict:
    x, out = ctx.inputs[0], ctx.outputs[0]
    each = ConstantLoop("i", out.size)
    return {
        "fn": ctx.fn,
        "prefix": ctx.prefix,
        "in_type": x.ctype,
        "out_type": out.ctype,
        "x": x.ptr,
        "out": out.ptr,
        "empty": out.size == 0,
        "each": each,
        "i": each.index,
        "counters": written_vars([each]),
        "note": None,
        "comment": c_comment(f"{ctx.op.opcode} {x.dtype} -> {out.dtype} {list(out.shape)} "
                             f"'{out.name}'"),
    }


def _affine_quantize(p: AffineQuantizeParams, v: dict) -> dict:
    """round(x / scale) in float32, then C's conversion to int32 as x86 performs it, the zero
    point added with int32 wrap-around (TFLite), clamped."""
    zero_point = ("" if p.zero_point == 0 else f" + (uint32_t){p.zero_point}"
                  if p.zero_point < 0 else f" + {p.zero_point}u")
    i, out_type = v["i"], v["out_type"]
    wrapped = f"(int32_t)(q{zero_point})" if zero_point else "(int32_t)q"
    note = ("round(x / scale) in float32, halves away from zero, then C's conversion to int32 as "
            "x86 performs it (out of range and NaN give INT32_MIN, tested for here: the "
            "conversion would be undefined in C), plus the zero point with int32 wrap-around, "
            "clamped.")
    return {"note": c_comment(note, "  "), "body": [
        f"const float r = roundf(x[{i}] / {c_float(p.scale)});",
        "const uint32_t q = r >= -2147483648.0f && r < 2147483648.0f ? (uint32_t)(int32_t)r "
        ": 0x80000000u;",
        f"out[{i}] = ({out_type})arenac_clamp({wrapped}, {c_int32(p.output_min)}, "
        f"{c_int32(p.output_max)});",
    ]}


def _requantize(p: RequantizeParams, v: dict) -> dict:
    i, out_type = v["i"], v["out_type"]
    return {"note": c_comment("Integer to integer: (x - input zero point) rescaled in fixed "
                              "point, plus the output's.", "  "), "body": [
        f"const int32_t q = arenac_mbqm((int32_t)x[{i}]{_add(-p.input_zero_point)}, "
        f"{p.multiplier}, {p.shift}){_add(p.output_zero_point)};",
        f"out[{i}] = ({out_type})arenac_clamp(q, {c_int32(p.output_min)}, "
        f"{c_int32(p.output_max)});",
    ]}


def emit_quantize(ctx: OpContext) -> Kernel:
    v = _common(ctx)
    p = ctx.params
    values = _affine_quantize(p, v) if isinstance(p, AffineQuantizeParams) else _requantize(p, v)
    return Kernel(_render("elementwise", {**v, **values}))


def _dequantized(index: str, minus_zero_point: str, scale: str) -> str:
    """scale * (q - zero_point) as the float32 rounding of the exact product."""
    return f"(float)((int32_t)x[{index}]{minus_zero_point}) * {scale}"


# TFLite's arithmetic, which the float32 product reproduces.
_DEQUANTIZE_NOTE = (
    "TFLite computes float32(double(scale) * (q - zero_point)); q - zero_point is exact in "
    "float32 (zero points lie within the dtype), so float32's product is already that rounded "
    "value.")


def _dequantize_layout(p: DequantizeParams, x: CTensor) -> tuple[int, int, int]:
    """(outer, channels, inner): the channel axis with what lies before and after it."""
    shape = x.shape
    return (math.prod(shape[: p.channel_axis]), shape[p.channel_axis],
            math.prod(shape[p.channel_axis + 1:]))


def emit_dequantize(ctx: OpContext) -> Kernel:
    p: DequantizeParams = ctx.params
    v = _common(ctx)
    if p.channel_axis is None:
        value = _dequantized(v["i"], _add(-p.zero_points[0]), c_float(p.scales[0]))
        return Kernel(_render("elementwise", {**v, "note": c_comment(_DEQUANTIZE_NOTE, "  "),
                                              "body": [f"out[{v['i']}] = {value};"]}))
    outer, channels, inner = _dequantize_layout(p, ctx.inputs[0])
    o, c, j = ConstantLoop("o", outer), ConstantLoop("c", channels), ConstantLoop("j", inner)
    i = c_sum([(o, channels * inner), (c, inner), (j, 1)])
    return Kernel(_render("dequantize_per_channel", {
        **v, "note": c_comment(_DEQUANTIZE_NOTE), "outer": o, "channel": c, "inner": j,
        "counters": written_vars([o, c, j]), "channels_length": c_length(channels),
        "scales": c_array(p.scales), "zero_points": c_array(p.zero_points),
        "body": [f"out[{i}] = {_dequantized(i, ' - zero_point', 'scale')};"],
    }))


def _cast_body(p: CastParams, ctx: OpContext, v: dict) -> dict:
    i, out_type = v["i"], v["out_type"]
    if p.method == "nonzero":
        return {"body": [f"out[{i}] = ({out_type})(x[{i}] != 0);"]}
    if p.method == "saturate":
        low, high, low_value, high_value = _LIMITS[ctx.outputs[0].dtype]
        # Both bounds are exact float32 values: a power of two, or zero.
        low_float, above_float = c_float(low_value), c_float(high_value + 1)
        return {"note": c_comment("Toward zero, saturating, NaN to the highest value (TFLite); "
                                  "the bounds are exact floats, so the conversion is only done "
                                  "when it is defined.", "  "), "body": [
            f"const float t = truncf(x[{i}]);",
            f"out[{i}] = t < {low_float} ? {low} : (t < {above_float} ? ({out_type})t : {high});",
        ]}
    return {"note": c_comment("C's conversion: exact, rounded to nearest, or (narrowing "
                              "integers) modular.", "  "),
            "body": [f"out[{i}] = ({out_type})x[{i}];"]}


def emit_cast(ctx: OpContext) -> Kernel:
    v = _common(ctx)
    return Kernel(_render("elementwise", {**v, **_cast_body(ctx.params, ctx, v)}))


def _render(macro: str, values: dict) -> str:
    return render_macro(TEMPLATE, macro, values)


EMITTERS = {"QUANTIZE": legacy_text(emit_quantize), "DEQUANTIZE": legacy_text(emit_dequantize),
            "CAST": legacy_text(emit_cast)}
