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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.front.schema import DTYPE_NAMES
from toolchain.ir import INT32_MAX, INT32_MIN, Graph, Operator, Tensor
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
from toolchain.ops.spec import MemoryRequest, required_input
from toolchain.ops.striping import Reduction, RowMap, Striping

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
# A float FULLY_CONNECTED sums its products in this many partial sums (element d in sum d mod
# FLOAT_LANES, over the largest multiple of it), adds them as a balanced tree and then the
# rest in order: a float reduction only vectorizes that way, and the C and runtime_py sum alike.
FLOAT_LANES = 8


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
    reduction: Reduction | None = None  # a band of the input, ending a striped segment


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


# -- a striped segment's last op, adding its input up band by band (toolchain.ops.striping) -----

# Its one output row reads every input row: more rows than any input has (a RowMap clips it).
EVERY_ROW = 1 << 30
SUM_BYTES = 4  # a unit's int32 sum, and the depth added so far


def adds_up(p) -> bool:
    """An int8 or uint8 layer of one batch row, whose int32 sums (TFLite's, which wrap) may
    take its input a band at a time."""
    return (isinstance(p, FullyConnectedQuantizedParams) and p.accumulator == "int32"
            and p.batches == 1)


def fc_rows(p) -> RowMap | None:
    return RowMap(EVERY_ROW, 1, 1, 0, -1) if adds_up(p) else None


def fc_band(p: FullyConnectedQuantizedParams, out_lo: int, out_hi: int, in_lo: int,
            in_hi: int) -> FullyConnectedQuantizedParams:
    """Input rows [in_lo, in_hi) added to each unit's sum, the output written when the band
    has it."""
    return replace(p, reduction=Reduction(in_lo == 0, out_hi > out_lo, in_hi - in_lo))


def fc_accumulates(p, shape: tuple[int, ...]) -> int:
    """Per unit its sum of products, then the depth added so far (the next band's filter
    columns)."""
    return SUM_BYTES * (p.units + 1) if adds_up(p) and shape[0] == 1 else 0


FC_STRIPING = Striping(fc_rows, fc_band, lambda p: (p.reduction,), accumulates=fc_accumulates)


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
            activation_min=INT32_MIN, activation_max=INT32_MAX)
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
