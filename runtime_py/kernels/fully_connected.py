"""numpy kernels for the fully connected family: FULLY_CONNECTED and BATCH_MATMUL.

Integer sums of int8 products are computed as float64 matrix products: every partial sum is an
integer far below 2^53, so they are exact (and BLAS-fast), then wrapped to int32 as TFLite's
int32 accumulators would.
"""

from __future__ import annotations

import numpy as np

from runtime_py.hybrid import quantize_asymmetric as _asymmetric_row
from runtime_py.hybrid import quantize_symmetric as _symmetric_row
from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier, wrap_int32
from toolchain.numerics.rounding import double_to_int32, round_half_away
from toolchain.ops.fully_connected.prepare import (
    FLOAT_LANES,
    VECTOR_ACTIVATIONS,
    BatchMatMulFloatParams,
    BatchMatMulHybridParams,
    BatchMatMulInt8Params,
    BatchMatMulInt16Params,
    FullyConnectedFloatParams,
    FullyConnectedHybridParams,
    FullyConnectedQuantizedParams,
)


def float32_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b in float32, each product rounded and added in the order of depth, as TFLite's loop
    sums: a BLAS sum's order depends on the CPU it runs on, and with it where infinities meet
    (+inf + -inf is NaN) and how the last bits round."""
    total = np.zeros(np.broadcast_shapes(a.shape[:-1] + (1,), b.shape[:-2] + (1, b.shape[-1])),
                     np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # IEEE infinities and NaN, as in C
        for d in range(a.shape[-1]):
            total += a[..., d:d + 1] * b[..., d:d + 1, :]
    return total


def float32_lane_dot(x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Rows x [B, D] dotted with filter rows [U, D] in float32 as the C sums them (FLOAT_LANES
    partial sums, a balanced tree, then the tail in order), so infinities meet and the last bits
    round alike in both."""
    depth = x.shape[1]
    main = depth - depth % FLOAT_LANES
    lanes = np.zeros((x.shape[0], weights.shape[0], FLOAT_LANES), np.float32)  # [B, U, lanes]
    for k in range(0, main, FLOAT_LANES):
        lanes += x[:, None, k:k + FLOAT_LANES] * weights[None, :, k:k + FLOAT_LANES]
    terms = [lanes[..., lane] for lane in range(FLOAT_LANES)] if main else [lanes[..., 0]]
    while len(terms) > 1:
        pairs = [a + b for a, b in zip(terms[::2], terms[1::2], strict=True)]
        terms = pairs + terms[len(pairs) * 2:]
    total = terms[0]
    for d in range(main, depth):
        total = total + x[:, d, None] * weights[None, :, d]
    return total


def exact_int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for small integer operands (offset int8 values), as int64, exactly."""
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64)


# -- FULLY_CONNECTED -------------------------------------------------------------------------


def fully_connected_float(p: FullyConnectedFloatParams, inputs, outputs) -> None:
    x, weights, bias = _fc_operands(p, inputs)
    with np.errstate(invalid="ignore", over="ignore"):  # IEEE infinities and NaN, as in C
        total = float32_lane_dot(x, weights)
        if bias is not None:
            total = total + bias
    outputs[0][...] = np.clip(total, p.activation_min, p.activation_max).reshape(outputs[0].shape)


def fully_connected_quantized(p: FullyConnectedQuantizedParams, inputs, outputs) -> None:
    if p.reduction is not None:
        fully_connected_band(p, inputs, outputs)
        return
    x, weights, bias = _fc_operands(p, inputs)
    acc = exact_int_matmul(x.astype(np.int64) + p.input_offset,
                           (weights.astype(np.int64) + p.filter_offset).T)
    _requantized(p, acc, bias, outputs[0])


def fully_connected_band(p: FullyConnectedQuantizedParams, inputs, outputs) -> None:
    """A band of the input (p.reduction) added to each unit's int32 sum, which the segment keeps
    in the arena bytes after the operands (`inputs[-1]`) with the depth added so far, where the
    band's filter columns start; the last band writes the output from the sums."""
    x, weights = inputs[0].reshape(1, -1), inputs[1].reshape(p.units, p.depth)
    sums = inputs[-1].view(np.int32)
    if p.reduction.starts:
        sums[...] = 0
    done = int(sums[p.units])
    columns = weights[:, done:done + x.shape[1]].astype(np.int64) + p.filter_offset
    added = exact_int_matmul(x.astype(np.int64) + p.input_offset, columns.T)
    sums[:p.units] = wrap_int32(sums[:p.units].astype(np.int64) + added[0])
    sums[p.units] = done + x.shape[1]
    if p.reduction.finishes:
        bias = inputs[2].reshape(-1) if len(inputs) > 3 else None
        _requantized(p, sums[None, :p.units].astype(np.int64), bias, outputs[0])


def _requantized(p: FullyConnectedQuantizedParams, acc: np.ndarray, bias: np.ndarray | None,
                 out: np.ndarray) -> None:
    """The output from the sums of products: plus the bias, TFLite's double rescale, the
    output offset and the clamp."""
    if bias is not None:
        acc = acc + bias.astype(np.int64)
    if p.accumulator == "int32":  # TFLite's int32 accumulator wraps; int16's is int64 by default
        acc = wrap_int32(acc)
    # round(double(acc) * scale), scale per tensor or per unit (broadcast over the last axis)
    scaled = double_to_int32(round_half_away(acc * np.asarray(p.requant_scales, np.float64)))
    result = np.clip(wrap_int32(scaled + p.output_offset), p.activation_min, p.activation_max)
    out[...] = result.astype(p.dtype).reshape(out.shape)


def _fc_operands(p, inputs):
    """The input as (batches, depth) rows, as TFLite flattens it; weights (units, depth); the
    bias one value per unit whatever its shape ([16, 1] too), as TFLite's reference reads it."""
    x, weights = inputs[0], inputs[1]
    bias = inputs[2].reshape(-1) if len(inputs) > 2 and inputs[2] is not None else None
    return x.reshape(p.batches, p.depth), weights, bias


# -- BATCH_MATMUL ----------------------------------------------------------------------------


def _adjoint_operands(p, inputs) -> tuple[np.ndarray, np.ndarray]:
    lhs, rhs = inputs[0], inputs[1]
    return (np.swapaxes(lhs, -1, -2) if p.adj_x else lhs,
            np.swapaxes(rhs, -1, -2) if p.adj_y else rhs)


def batch_matmul_float(p: BatchMatMulFloatParams, inputs, outputs) -> None:
    lhs, rhs = _adjoint_operands(p, inputs)
    outputs[0][...] = float32_matmul(lhs, rhs)


def batch_matmul_int8(p: BatchMatMulInt8Params, inputs, outputs) -> None:
    lhs, rhs = _adjoint_operands(p, inputs)
    acc = wrap_int32(exact_int_matmul(lhs.astype(np.int64) + p.lhs_offset,
                                       rhs.astype(np.int64) + p.rhs_offset))
    if not p.requantize:
        outputs[0][...] = acc.astype(np.int32)
        return
    scaled = multiply_by_quantized_multiplier(acc, p.output_multiplier, p.output_shift)
    result = np.clip(scaled + p.output_offset, p.activation_min, p.activation_max)
    outputs[0][...] = result.astype(np.int8)


def batch_matmul_int16(p: BatchMatMulInt16Params, inputs, outputs) -> None:
    """int64 sums, TFLite's int64 requantization."""
    lhs, rhs = _adjoint_operands(p, inputs)
    if lhs.shape[-1] * 2**30 < 2**53:  # every partial sum exact in float64
        acc = exact_int_matmul(lhs, rhs)
    else:
        acc = np.matmul(lhs.astype(np.int64), rhs.astype(np.int64))
    scaled = wrap_int32((acc * p.multiplier + (1 << (p.shift - 1))) >> p.shift)
    outputs[0][...] = np.clip(scaled, -32768, 32767).astype(np.int16)


f32 = np.float32


def fully_connected_hybrid(p: FullyConnectedHybridParams, inputs, outputs) -> None:
    """EvalHybridDense: each row quantized, int32 dot products, float rescale, bias, clamp."""
    x, weights, bias = _fc_operands(p, inputs)
    w = weights.astype(np.int64).reshape(p.units, p.depth)
    filter_scales = np.asarray(p.filter_scales, f32)
    out = np.zeros((p.batches, p.units), f32) if bias is None else np.tile(bias.astype(f32),
                                                                           (p.batches, 1))
    quantize = _asymmetric_row if p.asymmetric else _symmetric_row
    for b in range(p.batches):
        q, scale, zero_point = quantize(x[b].astype(f32))
        acc = w @ q
        if zero_point:
            acc = acc - zero_point * np.asarray(p.row_sums, np.int64)
        row_scale = (filter_scales * scale).astype(f32)  # one product per unit, or one
        out[b] = out[b] + (wrap_int32(acc).astype(f32) * row_scale).astype(f32)
    low, high = VECTOR_ACTIVATIONS[p.activation]
    if high is not None:  # std::min(y, high): NaN stays
        out = np.where(f32(high) < out, f32(high), out)
    if low is not None:  # std::max(low, y): NaN becomes low
        out = np.where(f32(low) < out, out, f32(low))
    outputs[0][...] = out.astype(f32).reshape(outputs[0].shape)


def batch_matmul_hybrid(p: BatchMatMulHybridParams, inputs, outputs) -> None:
    """EvalHybrid: every lhs row quantized, int32 sums, the zero point correction and the
    rescale in float32 as TFLite's reference BatchMatMul does them."""
    lhs, rhs = _adjoint_operands(p, inputs)
    rows = lhs.astype(f32).reshape(p.lhs_rows, p.depth)
    quantize = _asymmetric_row if p.asymmetric else _symmetric_row
    q = np.empty((p.lhs_rows, p.depth), np.int64)
    scales = np.empty(p.lhs_rows, f32)
    zero_points = np.zeros(p.lhs_rows, np.int64)
    for r in range(p.lhs_rows):
        q[r], scales[r], zero_points[r] = quantize(rows[r])
    if len(p.filter_scales) == 1:
        scales = (scales * f32(p.filter_scales[0])).astype(f32)
    batch = lhs.shape[:-2]
    total = exact_int_matmul(q.reshape(*batch, p.rows, p.depth), rhs.astype(np.int64))
    if p.asymmetric:
        sums = np.asarray(p.row_sums, f32).reshape(*rhs.shape[:-2], 1, p.cols)
        correction = (sums * zero_points.astype(f32).reshape(*batch, p.rows, 1)).astype(f32)
        total = np.trunc((total.astype(f32) - correction).astype(f32))
    else:
        total = total.astype(f32)  # TFLite's int32 - float correction rounds beyond 2^24
    scale = scales.reshape(*batch, p.rows, 1)
    if len(p.filter_scales) > 1:
        scale = (scale * np.asarray(p.filter_scales, f32)).astype(f32)
    product = (scale * total.astype(f32)).astype(f32)
    outputs[0][...] = (f32(0) + product).astype(f32)


# Kernels by the params type prepare returned (one type per dtype path).
_BY_PARAMS = {
    FullyConnectedFloatParams: fully_connected_float,
    FullyConnectedQuantizedParams: fully_connected_quantized,
    FullyConnectedHybridParams: fully_connected_hybrid,
    BatchMatMulFloatParams: batch_matmul_float,
    BatchMatMulInt8Params: batch_matmul_int8,
    BatchMatMulInt16Params: batch_matmul_int16,
    BatchMatMulHybridParams: batch_matmul_hybrid,
}


def _dispatch(params, inputs, outputs) -> None:
    _BY_PARAMS[type(params)](params, inputs, outputs)


KERNELS: dict = {"FULLY_CONNECTED": _dispatch, "BATCH_MATMUL": _dispatch}
