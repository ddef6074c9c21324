"""Params for QUANTIZE, DEQUANTIZE and CAST: conversions between dtypes and quantizations.

Each follows the TFLite reference kernel's Prepare: which conversions exist, and the constants
(float32 scale, requantization multiplier) the element-wise arithmetic uses.
"""

from __future__ import annotations

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
from toolchain.ops.spec import required_input


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
QUANTIZE_OUTPUTS: dict[str, frozenset[str]] = {
    "float32": frozenset({"int8", "uint8", "int16"}),
    "int8": frozenset({"int8", "uint8", "int16"}),
    "uint8": frozenset({"int8", "uint8", "int16"}),
    "int16": frozenset({"int8", "int16", "int32"}),
    "int32": frozenset({"int8", "int16"}),
}
DEQUANTIZE_INPUTS = frozenset({"int8", "uint8", "int16"})
CAST_DTYPES = frozenset({"float32", "int64", "int32", "int16", "int8", "uint8", "bool"})
# uint32 converts to and from int32 only (TFLite Micro's audio front end casts its energies so
# for STRIDED_SLICE and CONCATENATION, which have no uint32 kernels): modular, as in C.
CAST_UINT32 = frozenset({("uint32", "int32"), ("int32", "uint32")})


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
    if target.dtype not in QUANTIZE_OUTPUTS.get(source.dtype, frozenset()):
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
    if source.dtype not in DEQUANTIZE_INPUTS or target.dtype != "float32":
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
    if (source.dtype not in CAST_DTYPES or target.dtype not in CAST_DTYPES) \
            and (source.dtype, target.dtype) not in CAST_UINT32:
        raise UnsupportedOpError(f"CAST from {source.dtype} to {target.dtype}")
    return CastParams(_cast_method(source.dtype, target.dtype))
