"""Params for QUANTIZE, DEQUANTIZE and CAST: conversions between dtypes and quantizations.

Each follows the TFLite reference kernel's Prepare: which conversions exist, and the constants
(float32 scale, requantization multiplier) the element-wise arithmetic uses.

C emission.

C emitters for QUANTIZE, DEQUANTIZE and CAST, from the same params as runtime_py.

All three are element-wise: each C loop reads element i, then writes element i, in increasing
i, and nothing else, so the output may share memory with the input as toolchain.ops.overlaps
declares (at or below it, lower by the growth when output elements are wider). The statements
converting one element are C text from here; the template lays out the loop around them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolchain.errors import UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops import overlaps
from toolchain.ops.emit import (
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
    render_macro,
    written_vars,
)
from toolchain.ops.spec import OpSpec, kernels, required_input
from toolchain.quant import (
    INT_RANGES,
    quantize_multiplier,
    require_int16_zero_points,
    scale_of,
    zero_point_of,
)


@dataclass(frozen=True)
class AffineQuantizeParams:
    """float32 -> integer: clamp(int32(round(x / scale)) + zero_point), the division in float32,
    the rounding half away from zero, then C's conversion to int32 (TFLite's AffineQuantize)."""

    scale: float  # a float32 value
    zero_point: int
    output_min: int
    output_max: int


@dataclass(frozen=True)
class RequantizeParams:
    """integer -> integer: clamp((q - in_zp) * multiplier * 2^(shift-31) + out_zp)."""

    input_zero_point: int
    multiplier: int
    shift: int
    output_zero_point: int
    output_min: int
    output_max: int


@dataclass(frozen=True)
class DequantizeParams:
    """integer -> float32: float32(double(scale) * (q - zero_point)), per tensor or channel.

    One scale for the whole tensor when `channel_axis` is None, else one per index of that axis.
    """

    scales: tuple[float, ...]
    zero_points: tuple[int, ...]
    channel_axis: int | None


@dataclass(frozen=True)
class CastParams:
    """Element-wise conversion to the output's dtype as TFLite's CAST does it."""

    method: str  # "nonzero", "saturate" or "convert": see _cast_method


# What QUANTIZE accepts: input dtype -> output dtypes (TFLite quantize.cc Prepare).
_QUANTIZE_OUTPUTS: dict[str, frozenset[str]] = {
    "float32": frozenset({"int8", "uint8", "int16"}),
    "int8": frozenset({"int8", "uint8", "int16"}),
    "uint8": frozenset({"int8", "uint8"}),
    "int16": frozenset({"int8", "int16", "int32"}),
}
_DEQUANTIZE_INPUTS = frozenset({"int8", "uint8", "int16"})
_CAST_DTYPES = frozenset({"float32", "int64", "int32", "int16", "int8", "uint8", "bool"})


def _io(graph: Graph, op: Operator) -> tuple[Tensor, Tensor]:
    source, target = required_input(graph, op, 0, "input"), graph.tensors[op.outputs[0]]
    if source.shape != target.shape:
        raise UnsupportedOpError(f"output shape {target.shape} differs from input {source.shape}")
    return source, target


def _per_tensor(t: Tensor) -> None:
    if t.quantization is None or t.quantization.per_channel:
        raise UnsupportedOpError(f"{t.dtype} tensor {t.name!r} needs per-tensor quantization")


def prepare_quantize(graph: Graph, op: Operator) -> AffineQuantizeParams | RequantizeParams:
    source, target = _io(graph, op)
    if target.dtype not in _QUANTIZE_OUTPUTS.get(source.dtype, frozenset()):
        raise UnsupportedOpError(f"QUANTIZE from {source.dtype} to {target.dtype}")
    _per_tensor(target)
    require_int16_zero_points(source, target)
    output_min, output_max = INT_RANGES[target.dtype]
    if source.dtype == "float32":
        return AffineQuantizeParams(scale_of(target), zero_point_of(target), output_min, output_max)
    _per_tensor(source)
    # Python floats are doubles: the float32 scales divide in double, as TFLite's Prepare does.
    multiplier, shift = quantize_multiplier(scale_of(source) / scale_of(target))
    return RequantizeParams(
        zero_point_of(source), multiplier, shift, zero_point_of(target), output_min, output_max
    )


def prepare_dequantize(graph: Graph, op: Operator) -> DequantizeParams:
    source, target = _io(graph, op)
    if source.dtype not in _DEQUANTIZE_INPUTS or target.dtype != "float32":
        raise UnsupportedOpError(f"DEQUANTIZE from {source.dtype} to {target.dtype}")
    q = source.quantization
    if q is None:
        raise UnsupportedOpError(f"input {source.name!r} has no quantization")
    require_int16_zero_points(source)
    channel_axis = q.quantized_dimension if q.per_channel else None
    if channel_axis is not None and not 0 <= channel_axis < len(source.shape):
        raise UnsupportedOpError(f"scales along axis {channel_axis} of {source.shape}")
    if channel_axis is not None and source.shape[channel_axis] != len(q.scale):
        raise UnsupportedOpError(f"{len(q.scale)} scales for axis {channel_axis} of {source.shape}")
    return DequantizeParams(tuple(q.scale), tuple(q.zero_point), channel_axis)


def _cast_method(source: str, target: str) -> str:
    """How TFLite's CAST converts one element (see runtime_py.kernels.quantize)."""
    if target == "bool":
        return "nonzero"
    if source == "float32" and target != "float32":
        return "saturate"
    return "convert"  # exact, rounded to nearest, or modular for narrowing integers, as in C


def prepare_cast(graph: Graph, op: Operator) -> CastParams:
    source, target = _io(graph, op)
    if source.dtype not in _CAST_DTYPES or target.dtype not in _CAST_DTYPES:
        raise UnsupportedOpError(f"CAST from {source.dtype} to {target.dtype}")
    return CastParams(_cast_method(source.dtype, target.dtype))




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


SPECS: tuple[OpSpec, ...] = (
    OpSpec("QUANTIZE",
           tuple(s for source, targets in _QUANTIZE_OUTPUTS.items()
                 for s in kernels(f"{source} -> T", T=targets)),
           prepare_quantize, emit_quantize, overlaps=overlaps.elementwise(0)),
    OpSpec("DEQUANTIZE", kernels("T -> float32", T=_DEQUANTIZE_INPUTS),
           prepare_dequantize, emit_dequantize, overlaps=overlaps.elementwise(0)),
    OpSpec("CAST", kernels("S -> T", S=_CAST_DTYPES, T=_CAST_DTYPES), prepare_cast, emit_cast,
           overlaps=overlaps.elementwise(0)),
)
