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
from toolchain.numerics.quant import (
    INT_RANGES,
    quantize_multiplier,
    require_int16_zero_points,
    scale_of,
    zero_point_of,
)
from toolchain.ops import overlaps
from toolchain.ops.emit import (
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
from toolchain.ops.spec import OpSpec, kernels, required_input


@dataclass(frozen=True)
class AffineQuantizeParams:
    """float32 -> integer: clamp(int32(round(x / scale)) + zero_point), the division in float32,
    the rounding half away from zero, then C's conversion to int32 (TFLite's AffineQuantize)."""

    scale: float  # a float32 value
    zero_point: int
    output_min: int
    output_max: int


@dataclass(frozen=True)
class PerChannelQuantizeParams:
    """float32 -> integer with one scale and zero point per index of `channel_axis`, each
    element computed as AffineQuantizeParams describes (TFLite's PerChannelQuantize)."""

    scales: tuple[float, ...]  # float32 values
    zero_points: tuple[int, ...]
    channel_axis: int
    output_min: int
    output_max: int


@dataclass(frozen=True)
class RequantizeParams:
    """integer -> integer: clamp((q - in_zp) * multiplier * 2^(shift-31) + out_zp), the
    subtraction and the addition in int32 (wrapping around as TFLite's do in practice).

    `wraps` says whether either can leave int32 for some input: an int32 input minus its zero
    point, or a product near the ends of int32 plus the output's zero point. Only then does
    the C spell the wrap-around out.
    """

    input_zero_point: int
    multiplier: int
    shift: int
    output_zero_point: int
    output_min: int
    output_max: int
    wraps: bool = False


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


# What QUANTIZE runs: input dtype -> output dtypes (TFLite quantize.cc Prepare and Eval).
# LiteRT refuses the rest in Prepare: no float32 or int32 output from float32, int8 or uint8,
# no uint8 output from int16 or int32, and nothing from int32 but int8 and int16.
_QUANTIZE_OUTPUTS: dict[str, frozenset[str]] = {
    "float32": frozenset({"int8", "uint8", "int16"}),
    "int8": frozenset({"int8", "uint8", "int16"}),
    "uint8": frozenset({"int8", "uint8", "int16"}),
    "int16": frozenset({"int8", "int16", "int32"}),
    "int32": frozenset({"int8", "int16"}),
}
_DEQUANTIZE_INPUTS = frozenset({"int8", "uint8", "int16"})
_CAST_DTYPES = frozenset({"float32", "int64", "int32", "int16", "int8", "uint8", "bool"})
# uint32 converts to and from int32 only (TFLite Micro's audio front end casts its energies so
# for STRIDED_SLICE and CONCATENATION, which have no uint32 kernels): modular, as in C.
_CAST_UINT32 = frozenset({("uint32", "int32"), ("int32", "uint32")})


def _io(graph: Graph, op: Operator) -> tuple[Tensor, Tensor]:
    source, target = required_input(graph, op, 0, "input"), graph.tensors[op.outputs[0]]
    if source.shape != target.shape:
        raise UnsupportedOpError(f"output shape {target.shape} differs from input {source.shape}")
    return source, target


def _per_tensor(t: Tensor) -> None:
    if t.quantization is None or t.quantization.per_channel:
        raise UnsupportedOpError(f"{t.dtype} tensor {t.name!r} needs per-tensor quantization")


def _per_channel_quantize(target: Tensor) -> PerChannelQuantizeParams:
    q = target.quantization
    axis = q.quantized_dimension
    if not 0 <= axis < len(target.shape) or target.shape[axis] != len(q.scale):
        raise UnsupportedOpError(f"{len(q.scale)} scales along axis {axis} of {target.shape}")
    return PerChannelQuantizeParams(tuple(q.scale), tuple(q.zero_point), axis,
                                    *INT_RANGES[target.dtype])


def _requantize_wraps(source: Tensor, multiplier: int, shift: int, output_zero_point: int
                      ) -> bool:
    """Whether (q - in_zp) or MultiplyByQuantizedMultiplier(...) + out_zp can leave int32."""
    low, high = INT_RANGES[source.dtype]
    zero_point = zero_point_of(source)
    reach = max(abs(low - zero_point), abs(high - zero_point))  # of q - in_zp
    if reach >= 2**31:
        return True
    scaled = reach << max(shift, 0)
    if scaled >= 2**31:
        return True  # the left shift wraps: any int32 may come out
    # SRDHM and the rounding right shift add at most one to the exact |scaled * M / 2^31|.
    product = -(-scaled * multiplier // 2**31) + 1
    return (product >> max(-shift, 0)) + 1 + abs(output_zero_point) >= 2**31


def prepare_quantize(graph: Graph, op: Operator
                     ) -> AffineQuantizeParams | PerChannelQuantizeParams | RequantizeParams:
    source, target = _io(graph, op)
    if target.dtype not in _QUANTIZE_OUTPUTS.get(source.dtype, frozenset()):
        raise UnsupportedOpError(f"QUANTIZE from {source.dtype} to {target.dtype}")
    if target.quantization is None:
        raise UnsupportedOpError(f"output {target.name!r} has no quantization")
    if source.dtype == target.dtype == "int16":
        # The one pair TFLite's Prepare holds to the 16x8 scheme: int16 on a side whose other
        # side is another type may have any zero point (a softmax's int16 output has -32768).
        require_int16_zero_points(source, target)
    output_min, output_max = INT_RANGES[target.dtype]
    if source.dtype == "float32":
        if target.quantization.per_channel:
            return _per_channel_quantize(target)
        return AffineQuantizeParams(scale_of(target), zero_point_of(target), output_min, output_max)
    # TFLite requantizes with the tensors' single scales; a per-channel tensor has none there.
    _per_tensor(source)
    _per_tensor(target)
    # Python floats are doubles: the float32 scales divide in double, as TFLite's Prepare does.
    multiplier, shift = quantize_multiplier(scale_of(source) / scale_of(target))
    output_zero_point = zero_point_of(target)
    return RequantizeParams(
        zero_point_of(source), multiplier, shift, output_zero_point, output_min, output_max,
        _requantize_wraps(source, multiplier, shift, output_zero_point),
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
    if (source.dtype not in _CAST_DTYPES or target.dtype not in _CAST_DTYPES) \
            and (source.dtype, target.dtype) not in _CAST_UINT32:
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
    values = _affine_quantize(p, v) if isinstance(p, AffineQuantizeParams) else _requantize(p, v)
    return Kernel(_render("elementwise", {**v, **values}))


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
    }))


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
    OpSpec("CAST", (*kernels("S -> T", S=_CAST_DTYPES, T=_CAST_DTYPES),
                    *kernels(*(f"{s} -> {t}" for s, t in sorted(_CAST_UINT32)))),
           prepare_cast, emit_cast, overlaps=overlaps.elementwise(0)),
)
