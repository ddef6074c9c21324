"""Params for the fully connected family: FULLY_CONNECTED and BATCH_MATMUL.

Follows TFLite's reference kernels (tflite/kernels/fully_connected.cc and batch_matmul.cc). Two
different int8 requantizations live here, because the reference kernels differ:
- FULLY_CONNECTED (per tensor and per channel) rescales its int32 accumulator in double precision,
  round(acc * (input_scale * filter_scale / output_scale)), the scales widened to double one by
  one; it does not use a fixed-point multiplier.
- BATCH_MATMUL uses the fixed-point multiplier (QuantizeMultiplier of float(lhs * rhs scales) /
  output scale) and MultiplyByQuantizedMultiplier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops.spec import OpSpec, required_input
from toolchain.quant import (
    ACTIVATION_FLOAT_RANGE,
    activation_range_float,
    activation_range_quantized,
    quantize_multiplier,
    scale_of,
    scales_of,
    zero_point_of,
)

# TFLite's check that a bias was quantized with input_scale * filter_scale (per-tensor FC only):
# |input_scale * filter_scale - bias_scale| / output_scale must not exceed this.
BIAS_SCALE_TOLERANCE = 0.02
# BATCH_MATMUL operands may have rank 2 to 5 in TFLite.
BATCH_MATMUL_RANKS = range(2, 6)


@dataclass(frozen=True)
class FullyConnectedFloatParams:
    """float32: output = clamp(input(batches, depth) @ filter(units, depth)^T + bias)."""

    batches: int
    depth: int
    units: int
    activation_min: float
    activation_max: float


@dataclass(frozen=True)
class FullyConnectedInt8Params:
    """int8: acc = sum((filter + filter_offset) * (input + input_offset)) + bias in int32, then
    round(acc * requant_scales) in double, + output_offset, clamped.

    `requant_scales` has one entry (per tensor) or one per unit (per channel), as Python floats
    (C doubles). Per-channel weights are symmetric: TFLite ignores their zero point, so
    filter_offset is 0 there.
    """

    batches: int
    depth: int
    units: int
    input_offset: int
    filter_offset: int
    output_offset: int
    requant_scales: tuple[float, ...]
    activation_min: int
    activation_max: int


@dataclass(frozen=True)
class BatchMatMulFloatParams:
    """float32: output = lhs' @ rhs' with lhs' / rhs' transposed in their last two axes when
    adj_x / adj_y, batch dimensions broadcast."""

    adj_x: bool
    adj_y: bool


@dataclass(frozen=True)
class BatchMatMulInt8Params:
    """int8 -> int8: acc = sum((lhs + lhs_offset) * (rhs + rhs_offset)) in int32, then
    MultiplyByQuantizedMultiplier, + output_offset, clamped to int8.
    int8 -> int32 (`requantize` False): the raw int32 sum of products, zero points ignored, as in
    TFLite."""

    adj_x: bool
    adj_y: bool
    requantize: bool
    lhs_offset: int
    rhs_offset: int
    output_offset: int
    output_multiplier: int
    output_shift: int
    activation_min: int
    activation_max: int


# -- FULLY_CONNECTED -------------------------------------------------------------------------


def prepare_fully_connected(
    graph: Graph, op: Operator
) -> FullyConnectedFloatParams | FullyConnectedInt8Params:
    x, weights = required_input(graph, op, 0, "input"), required_input(graph, op, 1, "weights")
    bias = _optional_input(graph, op, 2)
    out = graph.tensors[op.outputs[0]]
    options = op.options
    if options.get("weights_format", "DEFAULT") != "DEFAULT":
        raise UnsupportedOpError(f"weights format {options['weights_format']}")
    activation = _clamping_activation(options)
    if len(weights.shape) != 2:
        raise UnsupportedOpError(f"filter of rank {len(weights.shape)} (must be 2)")
    units, depth = weights.shape
    if depth == 0 or x.num_elements % depth:
        raise UnsupportedOpError(f"input of {x.num_elements} elements is not rows of {depth}")
    if options.get("keep_num_dims", False) and x.shape[-1] != depth:
        raise UnsupportedOpError(f"keep_num_dims with input {x.shape} and filter depth {depth}")
    batches = x.num_elements // depth
    if out.num_elements != batches * units:
        raise UnsupportedOpError(f"output shape {out.shape} does not hold {batches}x{units}")
    if bias is not None and bias.num_elements != units:
        raise UnsupportedOpError(f"bias of {bias.num_elements} elements for {units} units")
    shape = dict(batches=batches, depth=depth, units=units)
    if x.dtype == "float32":
        if weights.dtype != "float32":
            raise UnsupportedOpError(f"hybrid: float32 input with {weights.dtype} weights")
        _require_dtypes("float32", bias=bias, output=out)
        low, high = activation_range_float(activation)
        return FullyConnectedFloatParams(**shape, activation_min=low, activation_max=high)
    if x.dtype == "int8":
        return _fully_connected_int8(x, weights, bias, out, activation, shape)
    raise UnsupportedOpError(f"input type {x.dtype}")


def _fully_connected_int8(x: Tensor, weights: Tensor, bias: Tensor | None, out: Tensor,
                          activation: str, shape: dict) -> FullyConnectedInt8Params:
    _require_dtypes("int8", weights=weights, output=out)
    _require_dtypes("int32", bias=bias)
    _require_quantized(x, weights, out)
    filter_scales = scales_of(weights)
    per_channel = len(filter_scales) > 1
    if per_channel:
        if weights.quantization.quantized_dimension != 0:
            raise UnsupportedOpError("per-channel filter not quantized along its units (dim 0)")
        if len(filter_scales) != shape["units"]:
            raise UnsupportedOpError("per-channel filter scales do not match the units")
        if any(weights.quantization.zero_point):
            raise UnsupportedOpError("per-channel filter with nonzero zero points")
        filter_offset = 0
    else:
        filter_offset = -zero_point_of(weights)
        _check_bias_scale(x, weights, bias, out)
    # Scales are float32 in the file; TFLite widens each to double before multiplying.
    requant = tuple(scale_of(x) * s / scale_of(out) for s in filter_scales)
    low, high = activation_range_quantized(activation, out)
    return FullyConnectedInt8Params(
        **shape,
        input_offset=-zero_point_of(x),
        filter_offset=filter_offset,
        output_offset=zero_point_of(out),
        requant_scales=requant,
        activation_min=low,
        activation_max=high,
    )


def _check_bias_scale(x: Tensor, weights: Tensor, bias: Tensor | None, out: Tensor) -> None:
    """GetQuantizedConvolutionMultipler's sanity check, which fails TFLite's Prepare."""
    if bias is None:
        return
    bias_scale = bias.quantization.scale[0] if bias.quantization else 0.0
    difference = abs(scale_of(x) * scale_of(weights) - bias_scale)
    if difference / scale_of(out) > BIAS_SCALE_TOLERANCE:
        raise UnsupportedOpError("bias scale is not input scale * filter scale")


# -- BATCH_MATMUL ----------------------------------------------------------------------------


def prepare_batch_matmul(
    graph: Graph, op: Operator
) -> BatchMatMulFloatParams | BatchMatMulInt8Params:
    if len(op.inputs) != 2:
        raise UnsupportedOpError(f"{len(op.inputs)} inputs (BATCH_MATMUL takes 2)")
    lhs, rhs = required_input(graph, op, 0, "lhs"), required_input(graph, op, 1, "rhs")
    out = graph.tensors[op.outputs[0]]
    adj_x, adj_y = bool(op.options.get("adj_x", False)), bool(op.options.get("adj_y", False))
    _check_matmul_shapes(lhs.shape, rhs.shape, out.shape, adj_x, adj_y)
    if lhs.dtype == "float32":
        _require_dtypes("float32", rhs=rhs, output=out)
        return BatchMatMulFloatParams(adj_x=adj_x, adj_y=adj_y)
    if lhs.dtype != "int8":
        raise UnsupportedOpError(f"input type {lhs.dtype}")
    _require_dtypes("int8", rhs=rhs)
    if out.dtype == "int32":
        return BatchMatMulInt8Params(
            adj_x=adj_x, adj_y=adj_y, requantize=False, lhs_offset=0, rhs_offset=0,
            output_offset=0, output_multiplier=0, output_shift=0,
            activation_min=-(2**31), activation_max=2**31 - 1)
    _require_dtypes("int8", output=out)
    _require_quantized(lhs, rhs, out)
    if any(len(scales_of(t)) > 1 for t in (lhs, rhs, out)):
        raise UnsupportedOpError("per-channel quantization")
    # GetQuantizedConvolutionMultipler: the scale product is taken in float32, then widened.
    product = float(np.float32(scale_of(lhs)) * np.float32(scale_of(rhs)))
    multiplier, shift = quantize_multiplier(product / scale_of(out))
    return BatchMatMulInt8Params(
        adj_x=adj_x,
        adj_y=adj_y,
        requantize=True,
        lhs_offset=-zero_point_of(lhs),
        rhs_offset=-zero_point_of(rhs),
        output_offset=zero_point_of(out),
        output_multiplier=multiplier,
        output_shift=shift,
        activation_min=-128,
        activation_max=127,
    )


def _check_matmul_shapes(lhs: tuple[int, ...], rhs: tuple[int, ...], out: tuple[int, ...],
                         adj_x: bool, adj_y: bool) -> None:
    if len(lhs) not in BATCH_MATMUL_RANKS or len(rhs) not in BATCH_MATMUL_RANKS:
        raise UnsupportedOpError(f"operands of rank {len(lhs)} and {len(rhs)} (must be 2 to 5)")
    rows, lhs_depth = (lhs[-1], lhs[-2]) if adj_x else (lhs[-2], lhs[-1])
    rhs_depth, cols = (rhs[-1], rhs[-2]) if adj_y else (rhs[-2], rhs[-1])
    if lhs_depth != rhs_depth:
        raise UnsupportedOpError(f"cannot multiply {lhs} by {rhs} (adj_x={adj_x}, adj_y={adj_y})")
    try:
        batch = np.broadcast_shapes(lhs[:-2], rhs[:-2])
    except ValueError:
        raise UnsupportedOpError(f"batch dimensions of {lhs} and {rhs} do not broadcast") from None
    if tuple(batch) + (rows, cols) != tuple(out):
        raise UnsupportedOpError(f"output shape {out}, expected {tuple(batch) + (rows, cols)}")


# -- shared checks ---------------------------------------------------------------------------


def _optional_input(graph: Graph, op: Operator, position: int) -> Tensor | None:
    index = op.inputs[position] if position < len(op.inputs) else -1
    return graph.tensors[index] if index >= 0 else None


def _clamping_activation(options) -> str:
    """TFLite's FC accepts only clamping activations (outside the hybrid path)."""
    activation = options.get("fused_activation_function", "NONE")
    if activation not in ACTIVATION_FLOAT_RANGE:
        raise UnsupportedOpError(f"fused activation {activation}")
    return activation


def _require_dtypes(dtype: str, **tensors: Tensor | None) -> None:
    for role, tensor in tensors.items():
        if tensor is not None and tensor.dtype != dtype:
            raise UnsupportedOpError(f"{role} of type {tensor.dtype} (expected {dtype})")


def _require_quantized(*tensors: Tensor) -> None:
    for t in tensors:
        if t.quantization is None or not all(math.isfinite(s) and s > 0
                                             for s in t.quantization.scale):
            raise UnsupportedOpError(f"tensor {t.name!r} lacks a positive quantization scale")


SPECS: tuple[OpSpec, ...] = (
    OpSpec("FULLY_CONNECTED", frozenset({"float32", "int8"}), prepare_fully_connected),
    OpSpec("BATCH_MATMUL", frozenset({"float32", "int8"}), prepare_batch_matmul),
)
