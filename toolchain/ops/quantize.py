"""Params for QUANTIZE, DEQUANTIZE and CAST: conversions between dtypes and quantizations.

Each follows the TFLite reference kernel's Prepare: which conversions exist, and the constants
(float32 scale, requantization multiplier) the element-wise arithmetic uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolchain.errors import UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops.spec import OpSpec, required_input
from toolchain.quant import INT_RANGES, quantize_multiplier, scale_of, zero_point_of


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
    "int8": frozenset({"int8", "uint8"}),
    "uint8": frozenset({"int8", "uint8"}),
    "int16": frozenset({"int8", "int16"}),
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


def _zero_point_for_int16(t: Tensor) -> None:
    if t.dtype == "int16" and zero_point_of(t) != 0:
        raise UnsupportedOpError(f"int16 tensor {t.name!r} must have zero point 0")


def prepare_quantize(graph: Graph, op: Operator) -> AffineQuantizeParams | RequantizeParams:
    source, target = _io(graph, op)
    if target.dtype not in _QUANTIZE_OUTPUTS.get(source.dtype, frozenset()):
        raise UnsupportedOpError(f"QUANTIZE from {source.dtype} to {target.dtype}")
    _per_tensor(target)
    for t in (source, target):
        _zero_point_for_int16(t)
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
    _zero_point_for_int16(source)
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


SPECS: tuple[OpSpec, ...] = (
    OpSpec("QUANTIZE", frozenset(_QUANTIZE_OUTPUTS), prepare_quantize),
    OpSpec("DEQUANTIZE", _DEQUANTIZE_INPUTS, prepare_dequantize),
    OpSpec("CAST", _CAST_DTYPES, prepare_cast),
)
