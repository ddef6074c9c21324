"""Params for the fully connected family: FULLY_CONNECTED and BATCH_MATMUL.

Follows TFLite's reference kernels (tflite/kernels/fully_connected.cc and batch_matmul.cc). Two
different int8 requantizations live here, because the reference kernels differ:
- FULLY_CONNECTED (per tensor and per channel) rescales its int32 accumulator in double precision,
  round(acc * (input_scale * filter_scale / output_scale)), the scales widened to double one by
  one; it does not use a fixed-point multiplier.
- BATCH_MATMUL uses the fixed-point multiplier (QuantizeMultiplier of float(lhs * rhs scales) /
  output scale) and MultiplyByQuantizedMultiplier: the int32 one for int8, the int64 one (a
  16-bit multiplier, one rounding half up) for int16, whose sums are int64.
- Hybrid BATCH_MATMUL (float32 lhs, int8 constant rhs) quantizes every lhs row as hybrid
  FULLY_CONNECTED does, but its kernel is a plain loop: the zero point correction goes through
  float, and so does every sum.

C emission.

C emitters for FULLY_CONNECTED and BATCH_MATMUL, from the same params as runtime_py.

FULLY_CONNECTED walks the input as (batches, depth) rows and the filter as (units, depth) rows,
so every dot product reads two contiguous rows; outputs are written row by row. Its int8
requantization is TFLite's double-precision one, reproduced operation for operation.
BATCH_MATMUL multiplies one (rows, depth) x (depth, cols) matrix pair per broadcast batch.

Every loop is a ConstantLoop and every index a c_sum of them, so a loop of one trip is written
as its body alone and a loop of none not at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.front.schema import DTYPE_NAMES
from toolchain.ir import Graph, Operator, Tensor
from toolchain.numerics.quant import (
    ACTIVATION_FLOAT_RANGE,
    activation_range_float,
    activation_range_quantized,
    quantize_multiplier,
    require_int16_zero_points,
    scale_of,
    scales_of,
    zero_point_of,
)
from toolchain.ops.conv import BYTE_COLUMN, MAX_STACK_BYTES
from toolchain.ops.emit import (
    ConstantLoop,
    CTensor,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_length,
    c_offset,
    c_pointer,
    c_sum,
    render_macro,
    written_vars,
)
from toolchain.ops.hybrid import quantize_lines
from toolchain.ops.spec import MemoryRequest, OpSpec, kernels, required_input

# TFLite's check that a bias was quantized with input_scale * filter_scale (per-tensor FC only):
# |input_scale * filter_scale - bias_scale| / output_scale must not exceed this.
BIAS_SCALE_TOLERANCE = 0.02
# BATCH_MATMUL operands may have rank 2 to 5 in TFLite.
BATCH_MATMUL_RANKS = range(2, 6)
# TFLite's int64 MultiplyByQuantizedMultiplier shifts right by 15 - exponent, at least 1 bit.
MBQM64_MAX_EXPONENT = 14
INT64_MAX = 2**63 - 1
# Hybrid BATCH_MATMUL sums int8 products in int32, and corrects them by up to depth * 2^14 more
# for the zero point: both stay in int32 up to this depth.
HYBRID_MAX_DEPTH = 65535


@dataclass(frozen=True)
class FullyConnectedHybridParams:
    """float32 input, int8 constant weights (dynamic range): each input row is quantized to
    int8 as it is read, symmetric (scale max|x| / 127) or, with `asymmetric`, over [min(0, x),
    max(0, x)] with a zero point; its int32 dot products, less zero point * `row_sums[u]`, are
    scaled back by the row's scale times the filter's (`filter_scales`: one, or one per unit),
    then the float bias and the fused `activation` as TFLite applies it to a vector
    (`VECTOR_ACTIVATIONS`: NONE leaves infinities, RELU has no upper bound). TFLite's x86
    reference build rounds the first 8 * floor(depth / 8) scaled values as trunc(p +- 0.5f),
    the rest half away from zero."""

    batches: int
    depth: int
    units: int
    asymmetric: bool
    filter_scales: tuple[float, ...]
    row_sums: tuple[int, ...]
    activation: str


# The hybrid kernels' activations, as TFLite's ApplyActivationToVector applies them (not the
# clamp to CalculateActivationRange's finite bounds that its float kernels use): (low, high),
# None for no bound, each bound as std::max / std::min take it, so NaN becomes the low bound.
VECTOR_ACTIVATIONS: dict[str, tuple[float | None, float | None]] = {
    "NONE": (None, None), "RELU": (0.0, None), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0)}


@dataclass(frozen=True)
class FullyConnectedFloatParams:
    """float32: output = clamp(input(batches, depth) @ filter(units, depth)^T + bias)."""

    batches: int
    depth: int
    units: int
    activation_min: float
    activation_max: float


@dataclass(frozen=True)
class FullyConnectedQuantizedParams:
    """int8, legacy uint8 and int16 (`dtype`, int8 weights for int16): acc = sum((filter +
    filter_offset) * (input + input_offset)) + bias in `accumulator` (int32, which wraps; int64
    for int16 unless its options ask for an int32 bias), then round(acc * requant_scales) in
    double, + output_offset, clamped (TFLite's reference kernels requantize all three so).

    `requant_scales` has one entry (per tensor) or one per unit (per channel), as Python floats
    (C doubles). Per-channel weights are symmetric: TFLite ignores their zero point, so
    filter_offset is 0 there.
    """

    dtype: str
    batches: int
    depth: int
    units: int
    input_offset: int
    filter_offset: int
    output_offset: int
    requant_scales: tuple[float, ...]
    activation_min: int
    activation_max: int
    accumulator: str = "int32"


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


@dataclass(frozen=True)
class BatchMatMulInt16Params:
    """int16 -> int16 (an int16 rhs, or an int8 one: 16x8), zero points 0: acc = sum(lhs * rhs)
    in int64, then TFLite's int64 MultiplyByQuantizedMultiplier, (acc * multiplier +
    2^(shift - 1)) >> shift: QuantizeMultiplier's multiplier rounded to 16 bits, shift = 15 - its
    exponent, one rounding (half up); the result truncated to int32 and clamped to int16."""

    adj_x: bool
    adj_y: bool
    multiplier: int
    shift: int


@dataclass(frozen=True)
class BatchMatMulHybridParams:
    """float32 lhs, int8 constant rhs (dynamic range): each of the `lhs_rows` lhs rows of `depth`
    (after adj_x) is quantized to int8 as FullyConnectedHybridParams describes, its scale times
    the filter's when that is per tensor. out(i, j) = 0.0f + scale_i * (float)total with
    total = (int32)((float)sum_k q(i, k) * rhs(k, j) - (float)row_sums[rb][j] * (float)zp_i),
    in float32 as TFLite's reference computes it (the correction too, and it rounds sums beyond
    2^24); scale_i times filter_scales[j] first when per channel. `row_sums` holds the sum of
    each rhs column per rhs batch matrix (asymmetric only)."""

    adj_x: bool
    adj_y: bool
    asymmetric: bool
    rows: int
    depth: int
    cols: int
    lhs_rows: int
    filter_scales: tuple[float, ...]
    row_sums: tuple[int, ...]


# -- FULLY_CONNECTED -------------------------------------------------------------------------


def prepare_fully_connected(
    graph: Graph, op: Operator
) -> FullyConnectedFloatParams | FullyConnectedQuantizedParams:
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
    if x.dtype == "float32" and weights.dtype == "int8":
        return _fully_connected_hybrid(weights, bias, out, activation, shape, options)
    if x.dtype == "float32":
        _require_dtypes("float32", weights=weights, bias=bias, output=out)
        low, high = activation_range_float(activation)
        return FullyConnectedFloatParams(**shape, activation_min=low, activation_max=high)
    if x.dtype in ("int8", "uint8", "int16"):
        return _fully_connected_quantized(x, weights, bias, out, activation, shape, options)
    raise UnsupportedOpError(f"input type {x.dtype}")


def _fully_connected_quantized(x: Tensor, weights: Tensor, bias: Tensor | None, out: Tensor,
                               activation: str, shape: dict, options: dict
                               ) -> FullyConnectedQuantizedParams:
    accumulator = "int32"
    if x.dtype == "int16":
        accumulator = _check_int16(x, weights, bias, out, options)
    else:
        _require_dtypes(x.dtype, weights=weights, output=out)
        _require_dtypes("int32", bias=bias)
    _require_quantized(x, weights, out)
    filter_scales = scales_of(weights)
    per_channel = len(filter_scales) > 1
    if per_channel and x.dtype == "uint8":
        raise UnsupportedOpError("uint8 filter with per-channel scales (TFLite refuses)")
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
    return FullyConnectedQuantizedParams(
        dtype=x.dtype,
        **shape,
        input_offset=-zero_point_of(x),
        filter_offset=filter_offset,
        output_offset=zero_point_of(out),
        requant_scales=requant,
        activation_min=low,
        activation_max=high,
        accumulator=accumulator,
    )


def _fully_connected_hybrid(weights: Tensor, bias: Tensor | None, out: Tensor, activation: str,
                            shape: dict, options: dict) -> FullyConnectedHybridParams:
    _require_dtypes("float32", bias=bias, output=out)
    if weights.data is None or weights.quantization is None:
        raise UnsupportedOpError("hybrid weights must be a quantized constant")
    scales = scales_of(weights)
    if len(scales) not in (1, shape["units"]) or (
            len(scales) > 1 and weights.quantization.quantized_dimension != 0):
        raise UnsupportedOpError(f"{len(scales)} filter scales for {shape['units']} units")
    values = weights.data.astype(np.int64).reshape(shape["units"], shape["depth"])
    if (values == -128).any():  # TFLite's x86 kernel counts -128 times a negative value as +128
        raise UnsupportedOpError("hybrid weights holding -128 (TFLite's x86 kernel miscounts "
                                 "them; converters write [-127, 127])")
    asymmetric = bool(options.get("asymmetric_quantize_inputs", False))
    if activation not in VECTOR_ACTIVATIONS:
        raise UnsupportedOpError(f"hybrid fused activation {activation}")
    return FullyConnectedHybridParams(
        **shape, asymmetric=asymmetric, filter_scales=tuple(float(s) for s in scales),
        row_sums=tuple(int(v) for v in values.sum(axis=1)) if asymmetric else (),
        activation=activation)


def fully_connected_scratch(p) -> tuple[MemoryRequest, ...]:
    """A hybrid kernel quantizes one input row at a time into the arena."""
    if isinstance(p, FullyConnectedHybridParams):
        return (MemoryRequest(p.depth, "an input row quantized to int8"),)
    return ()


def _check_int16(x: Tensor, weights: Tensor, bias: Tensor | None, out: Tensor,
                 options: dict) -> str:
    """16x8: int8 weights, zero points 0, and the accumulator TFLite sums in (its bias type):
    int64 unless the options say quantized_bias_type INT32 (FLOAT32, the default, means int64
    here: TFLite then reads an int32 bias as int64, past its end)."""
    _require_dtypes("int8", weights=weights)
    _require_dtypes("int16", output=out)
    bias_type = DTYPE_NAMES.get(options.get("quantized_bias_type", 0), "unknown")
    if bias_type not in ("float32", "int32", "int64"):
        raise UnsupportedOpError(f"quantized_bias_type {bias_type}")
    accumulator = "int32" if bias_type == "int32" else "int64"
    if bias is not None and bias.dtype != accumulator:
        if bias.dtype == "int32" and bias_type == "float32":
            raise UnsupportedOpError("int32 bias without quantized_bias_type INT32 (TFLite "
                                     "reads it as int64)")
        raise UnsupportedOpError(f"bias of type {bias.dtype} with quantized_bias_type "
                                 f"{bias_type.upper()}")
    _require_quantized(x, out)
    require_int16_zero_points(x, out)
    return accumulator


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
) -> BatchMatMulFloatParams | BatchMatMulInt8Params | BatchMatMulInt16Params \
        | BatchMatMulHybridParams:
    if len(op.inputs) != 2:
        raise UnsupportedOpError(f"{len(op.inputs)} inputs (BATCH_MATMUL takes 2)")
    lhs, rhs = required_input(graph, op, 0, "lhs"), required_input(graph, op, 1, "rhs")
    out = graph.tensors[op.outputs[0]]
    adj_x, adj_y = bool(op.options.get("adj_x", False)), bool(op.options.get("adj_y", False))
    _check_matmul_shapes(lhs.shape, rhs.shape, out.shape, adj_x, adj_y)
    if lhs.dtype == "float32" and rhs.dtype == "int8":
        return _batch_matmul_hybrid(lhs, rhs, out, adj_x, adj_y, op.options)
    if lhs.dtype == "float32":
        _require_dtypes("float32", rhs=rhs, output=out)
        return BatchMatMulFloatParams(adj_x=adj_x, adj_y=adj_y)
    if lhs.dtype == "int16":
        return _batch_matmul_int16(lhs, rhs, out, adj_x, adj_y)
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


def _batch_matmul_int16(lhs: Tensor, rhs: Tensor, out: Tensor, adj_x: bool,
                        adj_y: bool) -> BatchMatMulInt16Params:
    """int16 x int16, or int16 x int8 (16x8): the same int64 kernel."""
    if rhs.dtype not in ("int16", "int8"):
        raise UnsupportedOpError(f"rhs of type {rhs.dtype} (expected int16 or int8)")
    _require_dtypes("int16", output=out)
    _require_quantized(lhs, rhs, out)
    if any(len(scales_of(t)) > 1 for t in (lhs, rhs, out)):
        raise UnsupportedOpError("per-channel quantization")
    require_int16_zero_points(lhs, rhs, out)
    if zero_point_of(rhs):  # TFLite checks the int8 rhs of 16x8 too
        raise UnsupportedOpError(f"int8 rhs {rhs.name!r} of an int16 BATCH_MATMUL needs zero "
                                 "point 0")
    # The scale product in float32, as for int8. The int64 MultiplyByQuantizedMultiplier
    # shifts right by 15 - exponent: it needs an exponent below 15.
    product = float(np.float32(scale_of(lhs)) * np.float32(scale_of(rhs)))
    multiplier, exponent = quantize_multiplier(product / scale_of(out),
                                               max_shift=MBQM64_MAX_EXPONENT)
    reduced = (multiplier + (1 << 15)) >> 16 if multiplier < 0x7FFF0000 else 0x7FFF
    shift = 15 - exponent
    depth = lhs.shape[-2] if adj_x else lhs.shape[-1]
    # |acc| <= depth * 2^15 * 2^15 (2^7 for int8): acc * multiplier + 2^(shift - 1) must stay
    # in int64
    largest = 2**15 * (2**15 if rhs.dtype == "int16" else 2**7)
    if depth * largest * reduced + 2 ** (shift - 1) > INT64_MAX:
        raise UnsupportedOpError(f"depth {depth}: int64 products of the sums could overflow")
    return BatchMatMulInt16Params(adj_x=adj_x, adj_y=adj_y, multiplier=reduced, shift=shift)


def _batch_matmul_hybrid(lhs: Tensor, rhs: Tensor, out: Tensor, adj_x: bool, adj_y: bool,
                         options: dict) -> BatchMatMulHybridParams:
    _require_dtypes("float32", output=out)
    if rhs.data is None or rhs.quantization is None:
        raise UnsupportedOpError("hybrid rhs must be a quantized constant")
    rows = lhs.shape[-1] if adj_x else lhs.shape[-2]
    depth = lhs.shape[-2] if adj_x else lhs.shape[-1]
    cols = rhs.shape[-2] if adj_y else rhs.shape[-1]
    if depth > HYBRID_MAX_DEPTH:
        raise UnsupportedOpError(f"hybrid depth {depth}: int32 sums could overflow (at most "
                                 f"{HYBRID_MAX_DEPTH})")
    scales = scales_of(rhs)
    column_axis = len(rhs.shape) - (2 if adj_y else 1)
    if len(scales) > 1 and (len(scales) != cols
                            or rhs.quantization.quantized_dimension != column_axis):
        raise UnsupportedOpError(f"{len(scales)} rhs scales: per-channel scales must run along "
                                 f"its {cols} columns (dimension {column_axis})")
    asymmetric = bool(options.get("asymmetric_quantize_inputs", False))
    lhs_batch, rhs_batch = _hybrid_kernel_batches(lhs.shape, rhs.shape, adj_x)
    if sum(d > 1 for d in lhs_batch) > 1:
        raise UnsupportedOpError(f"hybrid lhs {lhs.shape}: with two batch dimensions above 1, "
                                 "TFLite's kernel reads other rows' scales")
    if asymmetric and (sum(d > 1 for d in rhs_batch) > 1 or rhs_batch[0] > 1):
        raise UnsupportedOpError(f"hybrid rhs {rhs.shape} with asymmetric inputs: TFLite's "
                                 "kernel reads other matrices' column sums")
    values = rhs.data.astype(np.int64)
    sums = values.sum(axis=-1 if adj_y else -2).reshape(-1)  # per batch matrix, per column
    return BatchMatMulHybridParams(
        adj_x=adj_x, adj_y=adj_y, asymmetric=asymmetric, rows=rows, depth=depth, cols=cols,
        lhs_rows=lhs.num_elements // depth, filter_scales=tuple(float(s) for s in scales),
        row_sums=tuple(int(v) for v in sums) if asymmetric else ())


def _hybrid_kernel_batches(lhs: tuple[int, ...], rhs: tuple[int, ...], adj_x: bool
                           ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The batch dimensions of TFLite's hybrid kernel, padded on the left to 3: without adj_x,
    an rhs batch dimension of 1 just above the matrix folds the lhs one there into its rows."""
    if not adj_x and len(lhs) > 2 and len(rhs) > 2 and rhs[-3] == 1:
        lhs = (*lhs[:-3], lhs[-3] * lhs[-2], lhs[-1])
        rhs = (*rhs[:-3], *rhs[-2:])
    return tuple((1,) * (5 - len(lhs)) + lhs[:-2]), tuple((1,) * (5 - len(rhs)) + rhs[:-2])


def batch_matmul_scratch(p) -> tuple[MemoryRequest, ...]:
    """A hybrid kernel quantizes every lhs row into the arena, with its scale (and zero
    point); with adj_x each row is first gathered from its column."""
    if not isinstance(p, BatchMatMulHybridParams):
        return ()
    requests = [MemoryRequest(p.lhs_rows * p.depth, "the lhs rows quantized to int8"),
                MemoryRequest(4 * p.lhs_rows, "the scale of each lhs row")]
    if p.asymmetric:
        requests.append(MemoryRequest(4 * p.lhs_rows, "the zero point of each lhs row"))
    if p.adj_x:
        requests.append(MemoryRequest(4 * p.depth, "an lhs row gathered from its column"))
    return tuple(requests)


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




TEMPLATE = "c/fully_connected.c.j2"
# Dot products run a main loop whose trip count is a multiple of this (so GCC's -O2 vectorizer,
# which refuses loops needing a scalar epilogue, takes it) and a short scalar tail.
VECTOR_STEP = 16
# float dot products keep this many partial sums: a float reduction only vectorizes this way.
FLOAT_LANES = 8
# int8 FULLY_CONNECTED computes this many units at once (the template spells out four), so that
# each input load serves four filter rows and four sums run in parallel.
UNIT_BLOCK = 4
# BATCH_MATMUL with a row-major rhs accumulates whole output rows in a stack array of at most
# this many bytes; wider outputs fall back to dot products down the rhs columns.
MAX_ROW_ACCUMULATOR_BYTES = 1024
ACCUMULATOR_BYTES = {"float": 4, "int32_t": 4, "uint32_t": 4, "int64_t": 8}
INT32_MAX = 2**31 - 1
# |(int8 + offset) * (int8 + offset)| when both offsets may reach +-128 (zero points in int8);
# int16 inputs have no offset, their int8 filter may.
MAX_OFFSET_PRODUCT = 255 * 255
MAX_OFFSET_PRODUCT_INT16 = 32768 * 255
MAX_RAW_PRODUCT = {"int8": 128 * 128, "uint8": 255 * 255, "int16": 32768 * 128}
# Per-unit scales printed this many to a line.
SCALES_PER_LINE = 4


def _plus(value: int) -> str:
    """` + v` / ` - v` / `` for adding a constant in C text."""
    return f" + {value}" if value > 0 else f" - {-value}" if value < 0 else ""


def _offset(value: int, expr: str) -> str:
    """`(expr + value)`, or just `expr` for a zero offset."""
    return f"({expr}{_plus(value)})" if value else expr


def _accumulator(depth: int, max_product: int) -> str:
    """int32_t when `depth` products cannot overflow it (the common case, and what vectorizes
    best); otherwise uint32_t, which wraps as TFLite's int32 accumulator does in practice."""
    return "int32_t" if depth * max_product <= INT32_MAX else "uint32_t"


def _wrap_int32(values: np.ndarray) -> np.ndarray:
    return ((values.astype(np.int64) + 2**31) & 0xFFFFFFFF) - 2**31


def _c_double(value: float) -> str:
    """A double literal that parses back to exactly `value` (repr is the shortest round trip)."""
    text = repr(float(value))
    return text if ("." in text or "e" in text) else text + ".0"


def _pairwise_sum(terms: list[str]) -> str:
    """C text adding `terms` as a balanced tree: ((a + b) + (c + d))."""
    while len(terms) > 1:
        pairs = [f"({a} + {b})" for a, b in zip(terms[::2], terms[1::2])]
        terms = pairs + terms[len(pairs) * 2:]
    return terms[0][1:-1] if terms[0].startswith("(") else terms[0]


def _constant_data(tensor: CTensor | None) -> np.ndarray | None:
    """The values of a constant tensor, when the codegen context provides them."""
    return None if tensor is None else tensor.data


# -- FULLY_CONNECTED -------------------------------------------------------------------------


def _fc_common(ctx: OpContext) -> dict:
    p = ctx.params
    weights = ctx.inputs[1]
    bias = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    out = ctx.outputs[0]
    batch = ConstantLoop("b", p.batches)
    xb, x_decl = c_pointer("xb", f"const {out.ctype}", "x", [(batch, p.depth)])
    ob, o_decl = c_pointer("ob", out.ctype, "out", [(batch, p.units)])
    return {
        "fn": ctx.fn, "prefix": ctx.prefix, "ctype": out.ctype, "name": out.name,
        "x": ctx.inputs[0].ptr, "w": weights.ptr, "bias": bias.ptr if bias is not None else None,
        "out": out.ptr, "units_length": c_length(p.units),
        "batch": batch, "xb": xb, "ob": ob, "batch_pointers": x_decl + o_decl,
    }


def fc_float_values(ctx: OpContext) -> dict:
    p: FullyConnectedFloatParams = ctx.params
    v = _fc_common(ctx)
    unit = ConstantLoop("u", p.units)
    wr, w_decl = c_pointer("wr", f"const {v['ctype']}", "w", [(unit, p.depth)])
    depth_main = p.depth - p.depth % FLOAT_LANES
    main, lanes = ConstantLoop("d", depth_main, 0, FLOAT_LANES), ConstantLoop("l", FLOAT_LANES)
    tail = ConstantLoop("d", p.depth, depth_main)
    at = c_sum([(main, 1), (lanes, 1)])
    bias = " + bias[u]" if v["bias"] else ""
    comment = (f"{ctx.op.opcode} '{v['name']}': out[b][u] = clamp(dot(x row b, filter row u)"
               f"{bias}), row by row")
    return {
        **v, "comment": c_comment(comment), "unit": unit, "unit_pointers": w_decl,
        "main": main, "tail": tail, "lanes": lanes if main.runs else None,
        "lane_step": f"lane[{lanes.index}] += {v['xb']}[{at}] * {wr}[{at}];",
        "lane_sum": _pairwise_sum([f"lane[{i}]" for i in range(FLOAT_LANES)]),
        "tail_step": f"acc += {v['xb']}[{tail.index}] * {wr}[{tail.index}];",
        "store": f"{v['ob']}[{unit.index}] = arenac_clampf(acc, {c_float(p.activation_min)}, "
                 f"{c_float(p.activation_max)});",
        "counters": written_vars([v["batch"], unit, main, *([lanes] if main.runs else []), tail]),
    }


def fc_quantized_values(ctx: OpContext) -> dict:
    p: FullyConnectedQuantizedParams = ctx.params
    v = _fc_common(ctx)
    weights = _constant_data(ctx.inputs[1])
    folded = weights is not None
    w_ctype = ctx.inputs[1].ctype
    wide = p.accumulator == "int64"  # TFLite's 16x8 accumulator and bias, unless asked int32
    # int8 input + 128 is a byte: the dot products read a stack copy of each input row in
    # arenac_col8, which x86's VNNI multiplies by the int8 filter in place (as CONV_2D's column)
    byte = (folded and p.dtype == "int8" and w_ctype == "int8_t" and not wide
            and 2 * p.depth <= MAX_STACK_BYTES)
    row_terms = None
    if folded:
        # sum((x + io) * (w + fo)) = sum(x * w) + fo * sum(x) + [io * sum(w) + depth * io * fo]:
        # the bracket is a per-unit constant, so the inner loop is a plain int8 dot product
        # (of x + 128 with the copy: its io is then io - 128). (The bias stays in its own
        # array, which the C still reads.)
        w = np.asarray(weights, np.int64).reshape(p.units, p.depth)
        terms = ((p.input_offset - (128 if byte else 0)) * w.sum(axis=1)
                 + p.depth * p.input_offset * p.filter_offset)
        row_terms = c_array(_wrap_int32(terms)) if terms.any() else None
    per_channel = len(p.requant_scales) > 1
    scales = [_c_double(s) for s in p.requant_scales]
    offset_product = MAX_OFFSET_PRODUCT_INT16 if p.dtype == "int16" else MAX_OFFSET_PRODUCT
    acc_type = "int64_t" if wide else _accumulator(
        p.depth, 255 * 128 if byte else MAX_RAW_PRODUCT[p.dtype] if folded else offset_product)
    filter_offset = p.filter_offset if folded else 0
    # an input and a filter element at depth {d} of a row, offset unless folded
    x_term = ("xr[{d}]" if byte else "{row}[{d}]" if folded
              else _offset(p.input_offset, "{row}[{d}]"))
    w_term = "{row}[{d}]" if folded else _offset(p.filter_offset, "{row}[{d}]")
    xterm = " + xterm" if filter_offset else ""
    name, prefix, xb = v["name"], v["prefix"], v["xb"]
    copy_loop = ConstantLoop("d", p.depth if byte else 0)
    copy = {"declaration": f"{BYTE_COLUMN} xr[{p.depth}];",
            "comment": "/* this input row + 128, which the dot products read */",
            "loop": copy_loop,
            "step": f"xr[{copy_loop.index}] = ({BYTE_COLUMN})({xb}[{copy_loop.index}] + 128);",
            } if byte else None

    # units in blocks of UNIT_BLOCK, then one by one; each dot product in a main loop of a
    # multiple of VECTOR_STEP steps and a tail
    units_main = p.units - p.units % UNIT_BLOCK
    depth_main = p.depth - p.depth % VECTOR_STEP
    block = ConstantLoop("u", units_main, 0, UNIT_BLOCK)
    unit_tail = ConstantLoop("u", p.units, units_main)
    main, tail = ConstantLoop("d", depth_main), ConstantLoop("d", p.depth, depth_main)
    row_sum = ConstantLoop("d", p.depth if filter_offset else 0)
    filters = [f"w{k}" for k in range(UNIT_BLOCK)]
    block_pointers = [f"const {w_ctype} *w0 = {c_offset('w', [(block, p.depth)])}"
                      + "".join(f", *w{k} = w{k - 1} + {p.depth}" for k in range(1, UNIT_BLOCK))
                      + ";"]
    tail_row, tail_pointers = c_pointer("wr", f"const {w_ctype}", "w", [(unit_tail, p.depth)])

    def step4(depth: ConstantLoop) -> dict:
        """One step along the depth for the four units of a block: the input element loaded
        once, each product added to its unit's sum."""
        return {"acc_type": acc_type, "x": f"({acc_type}){x_term.format(row=xb, d=depth.index)}",
                "dots": [f"dot{k} += xv * {w_term.format(row=row, d=depth.index)};"
                         for k, row in enumerate(filters)]}

    def step1(depth: ConstantLoop) -> str:
        x, w = (term.format(row=row, d=depth.index) for term, row in
                ((x_term, xb), (w_term, tail_row)))
        return f"dot += ({acc_type}){x} * {w};"

    def store(unit: str, dot: str) -> str:
        sum_value = f"{dot}{xterm}" if wide else f"(uint32_t){dot}{xterm}"
        return f"{v['ob']}[{unit}] = {prefix}_output({sum_value}, {unit});"

    bias = " + bias[u]" if v["bias"] else ""
    row_comment = (f"{ctx.op.opcode} '{name}': per unit, "
                   + ("(input offset - 128)" if byte else "input offset") + " * filter row sum"
                   + (" + depth * input offset * filter offset" if filter_offset else "")
                   + " (int32, wrapped)")
    return {
        **v, "comment": c_comment(f"{ctx.op.opcode} '{name}'"),
        "row_comment": c_comment(row_comment),
        "scale_comment": c_comment(f"{ctx.op.opcode} '{name}': per unit, (double)input_scale * "
                                   "filter_scale[u] / output_scale"),
        "plus_bias": bias,
        "acc_type": acc_type,
        "uses_unit": bool(row_terms or v["bias"] or per_channel),
        "row_terms": row_terms,
        "output_comment": c_comment(
            "Output unit u from its sum of products, "
            + ("in int64_t as TFLite's 16x8 accumulator. " if wide else
               "in uint32_t so that it wraps like TFLite's int32 accumulator. ")
            + "TFLite's reference rescales this op in double: round((double)acc * scale) with "
            "C's round (halves away from zero), then a cast to int32 that gives INT32_MIN out of "
            "range on x86. Without <math.h>: t truncates, and scaled - t is exact."),
        "sum_type": "int64_t" if wide else "uint32_t",
        "w_ctype": w_ctype,
        "bias_type": "int64_t" if wide else "int32_t",
        "acc": ("const int64_t acc = sum" + (" + bias[u];" if v["bias"] else ";")) if wide
        else "const int32_t acc = (int32_t)(sum" + (f" + (uint32_t){prefix}_row[u]" if row_terms
                                                     else "")
        + (" + (uint32_t)bias[u]" if v["bias"] else "") + ");",
        "filter_offset": filter_offset,
        "sums_rows": filter_offset != 0,  # the filter offset times each input row's sum
        "xsum_type": "int64_t" if p.dtype == "int16" else "int32_t",  # int16 rows may not fit
        "xterm_type": "int64_t" if wide else "uint32_t",
        "xterm": (f"(int64_t){filter_offset} * xsum" if wide
                  else f"(uint32_t){filter_offset} * (uint32_t)xsum"),
        "depth_loop": row_sum,
        "scales": ",\n  ".join(", ".join(scales[i:i + SCALES_PER_LINE])
                               for i in range(0, len(scales), SCALES_PER_LINE))
        if per_channel else None,
        "scale": f"{prefix}_scale[u]" if per_channel else scales[0],
        # added in uint32_t: TFLite's int32 sum wraps before the clamp
        "output_offset": f"{_plus(p.output_offset)}u" if p.output_offset else "",
        "act_min": p.activation_min, "act_max": p.activation_max,
        "block": block, "block_pointers": block_pointers,
        "block_main": main, "block_tail": tail,
        "block_main_step": step4(main), "block_tail_step": step4(tail),
        "block_stores": [store(c_sum([(block, 1)], k), f"dot{k}") for k in range(UNIT_BLOCK)],
        "unit_tail": unit_tail, "unit_tail_pointers": tail_pointers,
        "unit_main": main, "unit_rest": tail,
        "unit_main_step": step1(main), "unit_rest_step": step1(tail),
        "unit_tail_store": store(unit_tail.index, "dot"),
        "counters": written_vars([v["batch"], row_sum, copy_loop, block, unit_tail, main,
                                  tail]),
        "row_copy": copy,
    }


def _quantize_row_lines(p, k: ConstantLoop, xb: str) -> list[str]:
    """Lines quantizing row `xb` (p.depth values) into q: its scale in `scale` (and zero point in
    `zp`)."""
    return quantize_lines(p.depth, p.asymmetric, k, xb, "q")


def fc_hybrid_values(ctx: OpContext) -> dict:
    p: FullyConnectedHybridParams = ctx.params
    v = _fc_common(ctx)
    unit, k = ConstantLoop("u", p.units), ConstantLoop("k", p.depth)
    per_channel = len(p.filter_scales) > 1
    tables = []
    if per_channel:
        tables.append({"comment": c_comment(f"FULLY_CONNECTED '{v['name']}': the filter scale "
                                            "per unit"),
                       "ctype": "float", "name": f"{v['prefix']}_filter_scale",
                       "length": c_length(p.units),
                       "data": c_array(np.asarray(p.filter_scales, np.float32))})
    if p.asymmetric:
        tables.append({"comment": c_comment(f"FULLY_CONNECTED '{v['name']}': the sum of each "
                                            "filter row, times a row's zero point"),
                       "ctype": "int32_t", "name": f"{v['prefix']}_row_sum",
                       "length": c_length(p.units), "data": c_array(p.row_sums)})
    quantize = [f"float scale;{' int32_t zp;' if p.asymmetric else ''}",
                *_quantize_row_lines(p, k, v["xb"])]
    if not per_channel:
        quantize.append(f"scale *= {c_float(p.filter_scales[0])}; /* times the filter's */")
    row_scale = f"{v['prefix']}_filter_scale[{unit.index}] * scale" if per_channel else "scale"
    finish = []
    if p.asymmetric:
        finish.append(f"acc = (int32_t)((uint32_t)acc - (uint32_t)zp * "
                      f"(uint32_t){v['prefix']}_row_sum[{unit.index}]);")
    if per_channel:
        finish.append(f"const float unit_scale = {row_scale};")
        row_scale = "unit_scale"
    finish += [f"y = (float)acc * {row_scale};",
               (f"y = bias[{unit.index}] + y;" if v["bias"]
                else "y = 0.0f + y; /* TFLite adds to a zeroed output: -0.0f becomes 0.0f */"),
               *vector_activation_lines(p.activation, "y"),
               f"{v['ob']}[{unit.index}] = y;"]
    comment = (f"FULLY_CONNECTED '{v['name']}' (hybrid: float32 input, int8 weights): each input "
               "row quantized to int8 in the arena as TFLite's x86 reference build does, int32 "
               "dot products, scaled back to float, bias and clamp")
    return {**v, "comment": c_comment(comment), "tables": tables, "scratch": ctx.scratch[0],
            "unit": unit, "depth": k, "row": c_offset("w", [(unit, p.depth)]),
            "quantize": quantize, "finish": finish,
            "counters": written_vars([v["batch"], k, unit]) or "k"}


def vector_activation_lines(activation: str, y: str) -> list[str]:
    """C applying `activation` to float `y` in place as std::min, then std::max, would."""
    low, high = VECTOR_ACTIVATIONS[activation]
    lines = []
    if high is not None:
        lines.append(f"{y} = {c_float(high)} < {y} ? {c_float(high)} : {y};")
    if low is not None:
        lines.append(f"{y} = {c_float(low)} < {y} ? {y} : {c_float(low)};")
    return lines


def emit_fully_connected(ctx: OpContext) -> Kernel:
    if isinstance(ctx.params, FullyConnectedHybridParams):
        return Kernel(render_macro(TEMPLATE, "fully_connected_hybrid", fc_hybrid_values(ctx)))
    if isinstance(ctx.params, FullyConnectedFloatParams):
        return Kernel(render_macro(TEMPLATE, "fully_connected_float", fc_float_values(ctx)))
    v = fc_quantized_values(ctx)
    return Kernel(render_macro(TEMPLATE, "fully_connected_quantized", v),
                  ("byte_column",) if v["row_copy"] else ())


# -- BATCH_MATMUL ----------------------------------------------------------------------------


def _batch_strides(shape: tuple[int, ...], batch: tuple[int, ...]) -> list[int]:
    """Element strides of an operand over the output's batch dimensions (0 where it
    broadcasts), for batch dimensions padded on the left to 3."""
    dims = (1,) * (len(batch) - len(shape[:-2])) + tuple(shape[:-2])
    stride = shape[-2] * shape[-1]
    strides = []
    for size in reversed(dims):
        strides.append(stride if size > 1 else 0)
        stride *= size
    return [0] * (3 - len(dims)) + strides[::-1]


def batch_matmul_values(ctx: OpContext) -> dict:
    p: BatchMatMulFloatParams | BatchMatMulInt8Params | BatchMatMulInt16Params = ctx.params
    lhs, rhs, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    rows, cols = out.shape[-2], out.shape[-1]
    depth = lhs.shape[-2] if p.adj_x else lhs.shape[-1]
    batch = tuple(out.shape[:-2])
    padded = (1,) * (3 - len(batch)) + batch
    # lhs element (i, k) sits at i * lhs_i + k * lhs_k; rhs (k, j) at k * rhs_k + j * rhs_j.
    lhs_i, lhs_k = (1, rows) if p.adj_x else (depth, 1)
    rhs_k, rhs_j = (1, depth) if p.adj_y else (cols, 1)
    is_float = isinstance(p, BatchMatMulFloatParams)
    is_int16 = isinstance(p, BatchMatMulInt16Params)
    batches = [ConstantLoop(f"b{n}", size) for n, size in enumerate(padded)]
    i, j, k = ConstantLoop("i", rows), ConstantLoop("j", cols), ConstantLoop("k", depth)
    lhs_strides, rhs_strides = _batch_strides(lhs.shape, batch), _batch_strides(rhs.shape, batch)
    out_strides = [padded[1] * padded[2] * rows * cols, padded[2] * rows * cols, rows * cols]

    lhs_offset = rhs_offset = ""
    lhs_term, rhs_term = "lhs(i, k)", "rhs(k, j)"
    acc_type = "float"
    requantize = False
    if is_int16:
        acc_type, requantize = "int64_t", True
    elif not is_float:
        max_product = MAX_OFFSET_PRODUCT if p.requantize else MAX_RAW_PRODUCT["int8"]
        acc_type, requantize = _accumulator(depth, max_product), p.requantize
        lhs_offset, rhs_offset = _plus(p.lhs_offset), _plus(p.rhs_offset)
        lhs_term, rhs_term = _offset(p.lhs_offset, lhs_term), _offset(p.rhs_offset, rhs_term)

    # row form: acc[j] += lhs(i, k) * rhs row k, contiguous in j (vectorizes, also for float:
    # each acc[j] still sums its products in k order); else dot products in k.
    row_form = not p.adj_y and cols * ACCUMULATOR_BYTES[acc_type] <= MAX_ROW_ACCUMULATOR_BYTES

    def stored(acc: str) -> str:
        if is_float:
            return f"orow[{j.index}] = {acc};"
        if is_int16:
            scaled = f"({acc} * {p.multiplier} + ((int64_t)1 << {p.shift - 1})) >> {p.shift}"
            return (f"orow[{j.index}] = (int16_t)arenac_clamp((int32_t)(uint32_t)({scaled}), "
                    "-32768, 32767);")
        if requantize:
            # clamp(v + offset, lo, hi) == clamp(v, lo - offset, hi - offset) + offset, without
            # the int32 overflow the left side could hit.
            low, high = p.activation_min - p.output_offset, p.activation_max - p.output_offset
            return (f"orow[{j.index}] = ({out.ctype})(arenac_clamp(arenac_mbqm((int32_t){acc}, "
                    f"{p.output_multiplier}, {p.output_shift}), {low}, {high})"
                    f"{_plus(p.output_offset)});")
        return f"orow[{j.index}] = ({out.ctype}){acc};"

    lhs_at = f"l[{c_sum([(i, lhs_i), (k, lhs_k)])}]"
    comment = (f"{ctx.op.opcode} '{out.name}': for each of {padded[0]}x{padded[1]}x{padded[2]} "
               f"batches, out(i, j) = sum over k of {lhs_term} * {rhs_term}"
               + (", requantized" if requantize else "") + "; written row by row"
               + (". int16: the sum in int64, requantized as TFLite's int64 "
                  "MultiplyByQuantizedMultiplier does, by a 16-bit multiplier and one rounding "
                  "right shift (half up), then truncated to int32" if is_int16 else ""))
    return {
        "fn": ctx.fn, "comment": c_comment(comment),
        "ctype": lhs.ctype, "rhs_type": rhs.ctype, "out_type": out.ctype, "acc_type": acc_type,
        "lhs": lhs.ptr, "rhs": rhs.ptr, "out": out.ptr, "cols": cols,
        "batches": batches, "row": i, "col": j, "depth": k,
        "broadcasts": any(b.written and 0 in (sl, sr)
                          for b, sl, sr in zip(batches, lhs_strides, rhs_strides)),
        "l": c_offset("lhs", list(zip(batches, lhs_strides))),
        "r": c_offset("rhs", list(zip(batches, rhs_strides))),
        "o": c_offset("out", list(zip(batches, out_strides))),
        "orow": c_offset("o", [(i, cols)]),
        "row_form": row_form,
        "lhs_value": f"({acc_type})({lhs_at}{lhs_offset})",
        "rrow": c_offset("r", [(k, rhs_k)]),
        "row_step": f"acc[{j.index}] += a * (rrow[{j.index}]{rhs_offset});",
        "row_store": stored(f"acc[{j.index}]"),
        "dot_step": f"acc += ({acc_type})({lhs_at}{lhs_offset}) * "
                    f"(r[{c_sum([(k, rhs_k), (j, rhs_j)])}]{rhs_offset});",
        "dot_store": stored("acc"),
        "counters": written_vars([*batches, i, j, k]),
    }


def batch_matmul_hybrid_values(ctx: OpContext) -> dict:
    p: BatchMatMulHybridParams = ctx.params
    lhs, rhs, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    prefix, name = ctx.prefix, out.name
    rows, depth, cols = p.rows, p.depth, p.cols
    batch = tuple(out.shape[:-2])
    padded = (1,) * (3 - len(batch)) + batch
    per_channel = len(p.filter_scales) > 1
    k = ConstantLoop("k", depth)

    # Stage 1: every lhs row quantized into the arena, as hybrid FULLY_CONNECTED does. With
    # adj_x a row is a column of the stored matrix: it is gathered first.
    if p.adj_x:
        lhs_batch, row = ConstantLoop("lb", p.lhs_rows // rows), ConstantLoop("i", rows)
        quantize_loops = [lhs_batch, row]
        row_terms = [(lhs_batch, rows), (row, 1)]
        gather = [f"for ({k.header}) column[{k.index}] = "
                  f"lhs[{c_sum([(lhs_batch, rows * depth), (k, rows), (row, 1)])}];"]
        source = ["const float *xr = column;"]
    else:
        row = ConstantLoop("row", p.lhs_rows)
        quantize_loops = [row]
        row_terms = [(row, 1)]
        gather = []
        source = [f"const float *xr = {c_offset('lhs', [(row, depth)])};"]
    r = c_sum(row_terms)
    q_at = c_offset("quantized", [(loop, n * depth) for loop, n in row_terms])
    quantize = [*gather, *source, f"int8_t *q = {q_at};",
                f"float scale;{' int32_t zp;' if p.asymmetric else ''}",
                *_quantize_row_lines(p, k, "xr")]
    if per_channel:
        quantize.append(f"row_scale[{r}] = scale;")
    else:
        quantize.append(f"row_scale[{r}] = scale * {c_float(p.filter_scales[0])}; "
                        "/* times the filter's */")
    if p.asymmetric:
        quantize.append(f"row_zp[{r}] = zp;")

    # Stage 2: int32 sums of each quantized row with the rhs columns, then TFLite's float
    # correction and rescale.
    batches = [ConstantLoop(f"b{n}", size) for n, size in enumerate(padded)]
    i, j = ConstantLoop("i", rows), ConstantLoop("j", cols)
    lhs_strides = _batch_strides(lhs.shape, batch)  # quantized rows: the lhs's layout
    rhs_strides = _batch_strides(rhs.shape, batch)
    out_strides = [padded[1] * padded[2] * rows * cols, padded[2] * rows * cols, rows * cols]
    rhs_k, rhs_j = (1, depth) if p.adj_y else (cols, 1)
    row_form = not p.adj_y and cols * 4 <= MAX_ROW_ACCUMULATOR_BYTES
    # per-row (and per-column) tables advance by one entry where the matrices advance by depth
    lhs_terms, rhs_terms = list(zip(batches, lhs_strides)), list(zip(batches, rhs_strides))
    row_table = [(b, stride // depth) for b, stride in lhs_terms]
    pointers = [f"const int8_t *l = {c_offset('quantized', lhs_terms)};",
                f"const float *s = {c_offset('row_scale', row_table)};"]
    if p.asymmetric:
        sums = c_offset(f"{prefix}_column_sum", [(b, stride // depth) for b, stride in rhs_terms])
        pointers += [f"const int32_t *z = {c_offset('row_zp', row_table)};",
                     f"const int32_t *sums = {sums};"]
    pointers += [f"const int8_t *w = {c_offset('rhs', rhs_terms)};",
                 f"float *o = {c_offset('out', list(zip(batches, out_strides)))};"]

    def finish(acc: str) -> list[str]:
        lines = []
        total = f"(float){acc}"
        if p.asymmetric:
            lines.append(f"const int32_t total = (int32_t)((float){acc} - (float)sums[{j.index}] "
                         f"* (float)z[{i.index}]);")
            total = "(float)total"
        scale = f"s[{i.index}]"
        if per_channel:
            lines.append(f"const float scale = s[{i.index}] * {prefix}_filter_scale[{j.index}];")
            scale = "scale"
        lines.append(f"orow[{j.index}] = 0.0f + {scale} * {total};")
        return lines

    tables = []
    if per_channel:
        tables.append({"comment": c_comment(f"BATCH_MATMUL '{name}': the rhs scale per column"),
                       "ctype": "float", "name": f"{prefix}_filter_scale",
                       "length": c_length(cols),
                       "data": c_array(np.asarray(p.filter_scales, np.float32))})
    if p.asymmetric:
        tables.append({"comment": c_comment(f"BATCH_MATMUL '{name}': the sum of each rhs column "
                                            "per rhs matrix, times a row's zero point"),
                       "ctype": "int32_t", "name": f"{prefix}_column_sum",
                       "length": c_length(len(p.row_sums)), "data": c_array(p.row_sums)})
    scratch = dict(zip(["quantized", "row_scale", *(["row_zp"] if p.asymmetric else [])],
                       ctx.scratch))
    if p.adj_x:
        scratch["column"] = ctx.scratch[-1]
    ctypes = {"quantized": "int8_t", "row_scale": "float", "row_zp": "int32_t",
              "column": "float"}
    comment = (f"BATCH_MATMUL '{name}' (hybrid: float32 lhs, int8 rhs): every lhs row quantized "
               "to int8 in the arena as TFLite's x86 reference build does, int32 sums with the "
               "rhs columns, then as TFLite's reference kernel: "
               + ("the zero point correction in float, truncated back to int32, "
                  if p.asymmetric else "")
               + "the sum in float (which rounds beyond 2^24), times the row's scale"
               + (" times the column's" if per_channel else "")
               + ", added to 0.0f (so -0.0f becomes 0.0f)")
    return {
        "fn": ctx.fn, "comment": c_comment(comment), "tables": tables,
        "lhs": lhs.ptr, "rhs": rhs.ptr, "out": out.ptr,
        "scratch": [{"ctype": ctypes[key], "name": key, "at": at} for key, at in scratch.items()],
        "quantize_loops": quantize_loops, "quantize": quantize,
        "batches": batches, "pointers": pointers, "broadcasts": any(
            b.written and 0 in (sl, sr) for b, sl, sr in zip(batches, lhs_strides, rhs_strides)),
        "row": i, "col": j, "depth": k, "cols": cols,
        "qrow": c_offset("l", [(i, depth)]), "orow": c_offset("o", [(i, cols)]),
        "row_form": row_form,
        "wrow": c_offset("w", [(k, rhs_k)]),
        "row_step": f"acc[{j.index}] += a * wrow[{j.index}];",
        "row_finish": finish(f"acc[{j.index}]"),
        "dot_step": f"acc += qi[{k.index}] * w[{c_sum([(k, rhs_k), (j, rhs_j)])}];",
        "dot_finish": finish("acc"),
        "counters": ", ".join(dict.fromkeys(
            [loop.var for loop in [*quantize_loops, *batches, i, j] if loop.written] + ["k"])),
    }


def emit_batch_matmul(ctx: OpContext) -> Kernel:
    if isinstance(ctx.params, BatchMatMulHybridParams):
        return Kernel(render_macro(TEMPLATE, "batch_matmul_hybrid",
                                   batch_matmul_hybrid_values(ctx)))
    return Kernel(render_macro(TEMPLATE, "batch_matmul", batch_matmul_values(ctx)))


SPECS: tuple[OpSpec, ...] = (
    OpSpec("FULLY_CONNECTED",
           kernels("float32, float32, float32? -> float32", "T, T, int32? -> T",
                   "int16, int8, int32|int64? -> int16", "float32, int8, float32? -> float32",
                   T=("int8", "uint8")),
           prepare_fully_connected, emit_fully_connected, scratch=fully_connected_scratch),
    OpSpec("BATCH_MATMUL",
           kernels("T, T -> T", "int8, int8 -> int32", "float32, int8 -> float32",
                   "int16, int8 -> int16", T=("float32", "int8", "int16")),
           prepare_batch_matmul, emit_batch_matmul, scratch=batch_matmul_scratch),
)
