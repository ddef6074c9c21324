"""C emitters for QUANTIZE, DEQUANTIZE and CAST, from the same params as runtime_py.

All three are element-wise: each C loop reads element i, then writes element i, in increasing
i, and nothing else, so the output may share memory with the input as toolchain.ops.overlaps
declares (at or below it, lower by the growth when output elements are wider). The statements
converting one element are C text from here; the template lays out the loop around them.
"""

from __future__ import annotations

import math

from toolchain.ir import INT32_MAX, INT32_MIN
from toolchain.ops.emit import (
    MATH_H,
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_int32,
    c_length,
    c_sum,
    render_macro,
    written_vars,
)
from toolchain.ops.quantize.prepare import (
    AffineQuantizeParams,
    CastParams,
    DequantizeParams,
    PerChannelQuantizeParams,
    RequantizeParams,
)

TEMPLATE = "c/quantize.c.j2"

# The integer dtypes a float saturates into: (lowest, highest) as C expressions and values.
_LIMITS: dict[str, tuple[str, str, int, int]] = {
    "int8": ("INT8_MIN", "INT8_MAX", -(2**7), 2**7 - 1),
    "uint8": ("0", "UINT8_MAX", 0, 2**8 - 1),
    "int16": ("INT16_MIN", "INT16_MAX", -(2**15), 2**15 - 1),
    "int32": ("INT32_MIN", "INT32_MAX", INT32_MIN, INT32_MAX),
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


def _add_wrapping(value: int) -> str:
    """` + 10u`, ` - 3u` or nothing: a constant added modulo 2^32 after a uint32_t operand."""
    return f" + {value}u" if value > 0 else f" - {-value}u" if value < 0 else ""


_AFFINE_NOTE = (
    "round(x / scale) in float32, halves away from zero, then C's conversion to int32 as x86 "
    "performs it (out of range and NaN give INT32_MIN, tested for here: the conversion would be "
    "undefined in C), plus the zero point with int32 wrap-around, clamped.")


def _affine_body(i: str, out_type: str, scale: str, zero_point: str, low: int, high: int
                 ) -> list[str]:
    """The statements quantizing x[i]; `zero_point` is the uint32_t addition after q."""
    wrapped = f"(int32_t)(q{zero_point})" if zero_point else "(int32_t)q"
    return [
        f"const float r = roundf(x[{i}] / {scale});",
        "const uint32_t q = r >= -2147483648.0f && r < 2147483648.0f ? (uint32_t)(int32_t)r "
        ": 0x80000000u;",
        f"out[{i}] = ({out_type})arenac_clamp({wrapped}, {c_int32(low)}, {c_int32(high)});",
    ]


def _affine_quantize(p: AffineQuantizeParams, v: dict) -> dict:
    """round(x / scale) in float32, then C's conversion to int32 as x86 performs it, the zero
    point added with int32 wrap-around (TFLite), clamped."""
    return {"note": c_comment(_AFFINE_NOTE, "  "),
            "body": _affine_body(v["i"], v["out_type"], c_float(p.scale),
                                 _add_wrapping(p.zero_point), p.output_min, p.output_max)}


def _requantize(p: RequantizeParams, v: dict) -> dict:
    i, out_type = v["i"], v["out_type"]
    if p.wraps:
        note = ("Integer to integer: (x - input zero point) rescaled in fixed point, plus the "
                "output's; the subtraction and the addition wrap around in int32, as TFLite's "
                "do.")
        difference = (f"(int32_t)((uint32_t)x[{i}]{_add_wrapping(-p.input_zero_point)})"
                      if p.input_zero_point else f"x[{i}]")
        scaled = f"arenac_mbqm({difference}, {p.multiplier}, {p.shift})"
        if p.output_zero_point:
            scaled = f"(int32_t)((uint32_t){scaled}{_add_wrapping(p.output_zero_point)})"
    else:
        note = ("Integer to integer: (x - input zero point) rescaled in fixed point, plus the "
                "output's.")
        scaled = (f"arenac_mbqm((int32_t)x[{i}]{_add(-p.input_zero_point)}, {p.multiplier}, "
                  f"{p.shift}){_add(p.output_zero_point)}")
    return {"note": c_comment(note, "  "), "body": [
        f"const int32_t q = {scaled};",
        f"out[{i}] = ({out_type})arenac_clamp(q, {c_int32(p.output_min)}, "
        f"{c_int32(p.output_max)});",
    ]}


def emit_quantize(ctx: OpContext) -> Kernel:
    v = _common(ctx)
    p = ctx.params
    if isinstance(p, PerChannelQuantizeParams):
        return _emit_per_channel_quantize(ctx, p, v)
    if isinstance(p, AffineQuantizeParams):
        values, helpers = _affine_quantize(p, v), ("clamp",)
    else:
        values, helpers = _requantize(p, v), ("mbqm", "clamp")
    # the affine path rounds with roundf (<math.h>)
    return Kernel(_render("elementwise", {**v, **values}), () if v["empty"] else helpers,
                  includes=(MATH_H,) if isinstance(p, AffineQuantizeParams) else ())


def _channel_loops(shape: tuple[int, ...], axis: int) -> tuple[ConstantLoop, ...]:
    """Loops over what lies before the channel axis, along it, and after it."""
    return (ConstantLoop("o", math.prod(shape[:axis])), ConstantLoop("c", shape[axis]),
            ConstantLoop("j", math.prod(shape[axis + 1:])))


def _emit_per_channel_quantize(ctx: OpContext, p: PerChannelQuantizeParams, v: dict) -> Kernel:
    o, c, j = _channel_loops(ctx.inputs[0].shape, p.channel_axis)
    i = c_sum([(o, c.stop * j.stop), (c, j.stop), (j, 1)])
    return Kernel(_render("per_channel", {
        **v, "note": c_comment(_AFFINE_NOTE), "outer": o, "channel": c, "inner": j,
        "counters": written_vars([o, c, j]), "channels_length": c_length(c.stop),
        "scale_type": "float", "scales": c_array(p.scales), "zero_points": c_array(p.zero_points),
        "body": _affine_body(i, v["out_type"], "scale", " + (uint32_t)zero_point",
                             p.output_min, p.output_max),
    }), () if v["empty"] else ("clamp",), includes=(MATH_H,))


def _dequantized(index: str, minus_zero_point: str, scale: str) -> str:
    """scale * (q - zero_point) as the float32 rounding of the exact product."""
    return f"(float)((int32_t)x[{index}]{minus_zero_point}) * {scale}"


# TFLite's arithmetic, which the float32 product reproduces.
_DEQUANTIZE_NOTE = (
    "TFLite computes float32(double(scale) * (q - zero_point)); q - zero_point is exact in "
    "float32 (zero points lie within the dtype), so float32's product is already that rounded "
    "value.")


def emit_dequantize(ctx: OpContext) -> Kernel:
    p: DequantizeParams = ctx.params
    v = _common(ctx)
    if p.channel_axis is None:
        value = _dequantized(v["i"], _add(-p.zero_points[0]), c_float(p.scales[0]))
        return Kernel(_render("elementwise", {**v, "note": c_comment(_DEQUANTIZE_NOTE, "  "),
                                              "body": [f"out[{v['i']}] = {value};"]}))
    o, c, j = _channel_loops(ctx.inputs[0].shape, p.channel_axis)
    i = c_sum([(o, c.stop * j.stop), (c, j.stop), (j, 1)])
    return Kernel(_render("per_channel", {
        **v, "note": c_comment(_DEQUANTIZE_NOTE), "outer": o, "channel": c, "inner": j,
        "counters": written_vars([o, c, j]), "channels_length": c_length(c.stop),
        "scale_type": "float", "scales": c_array(p.scales), "zero_points": c_array(p.zero_points),
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
    body = _cast_body(ctx.params, ctx, v)
    return Kernel(_render("elementwise", {**v, **body}),
                  includes=(MATH_H,) if ctx.params.method == "saturate" else ())  # truncf


def _render(macro: str, values: dict) -> str:
    return render_macro(TEMPLATE, macro, values)
