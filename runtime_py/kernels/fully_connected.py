"""numpy kernels for the fully connected family: FULLY_CONNECTED and BATCH_MATMUL.

Integer sums of int8 products are computed as float64 matrix products: every partial sum is an
integer far below 2^53, so they are exact (and BLAS-fast), then wrapped to int32 as TFLite's
int32 accumulators would.
"""

from __future__ import annotations

import numpy as np

from toolchain.fixedpoint import INT32_MIN, multiply_by_quantized_multiplier, wrap_int32
from toolchain.ops.fully_connected import (
    BatchMatMulFloatParams,
    BatchMatMulInt8Params,
    FullyConnectedFloatParams,
    FullyConnectedHybridParams,
    FullyConnectedQuantizedParams,
)


def exact_int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b for small integer operands (offset int8 values), as int64, exactly."""
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's round() on doubles, exactly: x - trunc(x) is exact, so no 0.49999... misrounding."""
    whole = np.trunc(x)
    return whole + np.where(np.abs(x - whole) >= 0.5, np.sign(x), 0.0)


def double_to_int32(x: np.ndarray) -> np.ndarray:
    """static_cast<int32_t> of a rounded double as x86 executes it: out of range gives INT32_MIN."""
    in_range = np.abs(x) < 2.0**31
    return np.where(in_range, np.where(in_range, x, 0.0).astype(np.int64), INT32_MIN)


# -- FULLY_CONNECTED -------------------------------------------------------------------------


def fully_connected_float(p: FullyConnectedFloatParams, inputs, outputs) -> None:
    x, weights, bias = _fc_operands(p, inputs)
    with np.errstate(invalid="ignore", over="ignore"):  # IEEE infinities and NaN, as in C
        total = np.matmul(x, weights.T)
        if bias is not None:
            total = total + bias
    outputs[0][...] = np.clip(total, p.activation_min, p.activation_max).reshape(outputs[0].shape)


def fully_connected_quantized(p: FullyConnectedQuantizedParams, inputs, outputs) -> None:
    x, weights, bias = _fc_operands(p, inputs)
    acc = exact_int_matmul(x.astype(np.int64) + p.input_offset,
                           (weights.astype(np.int64) + p.filter_offset).T)
    if bias is not None:
        acc = acc + bias.astype(np.int64)
    if p.dtype != "int16":  # TFLite's int32 accumulator wraps; int16's is int64
        acc = wrap_int32(acc)
    # round(double(acc) * scale), scale per tensor or per unit (broadcast over the last axis)
    scaled = double_to_int32(round_half_away(acc * np.asarray(p.requant_scales, np.float64)))
    result = np.clip(wrap_int32(scaled + p.output_offset), p.activation_min, p.activation_max)
    outputs[0][...] = result.astype(p.dtype).reshape(outputs[0].shape)


def _fc_operands(p, inputs):
    """The input as (batches, depth) rows, as TFLite flattens it; weights (units, depth)."""
    x, weights = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    return x.reshape(p.batches, p.depth), weights, bias


# -- BATCH_MATMUL ----------------------------------------------------------------------------


def _adjoint_operands(p, inputs) -> tuple[np.ndarray, np.ndarray]:
    lhs, rhs = inputs[0], inputs[1]
    return (np.swapaxes(lhs, -1, -2) if p.adj_x else lhs,
            np.swapaxes(rhs, -1, -2) if p.adj_y else rhs)


def batch_matmul_float(p: BatchMatMulFloatParams, inputs, outputs) -> None:
    lhs, rhs = _adjoint_operands(p, inputs)
    outputs[0][...] = np.matmul(lhs, rhs)


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


f32 = np.float32


def _round_as_tflite_x86(p: np.ndarray) -> np.ndarray:
    """The x86 build's rounding of scaled float32 values: the first 8 * floor(n / 8) as
    trunc(p +- 0.5f) with the addition in float32, the rest half away from zero."""
    head = (p.size // 8) * 8
    half = np.where(p[:head] < 0, f32(-0.5), f32(0.5)).astype(f32)
    rounded = np.empty(p.size, np.int64)
    rounded[:head] = np.trunc((p[:head] + half).astype(f32))
    rounded[head:] = np.sign(p[head:]) * np.floor(np.abs(p[head:].astype(np.float64)) + 0.5)
    return rounded


def _symmetric_row(row: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    extent = f32(max(abs(row.min()), abs(row.max())))
    if extent == 0:
        return np.zeros(row.size, np.int64), f32(1.0), 0
    scale, inverse = f32(extent / f32(127)), f32(f32(127) / extent)
    return np.clip(_round_as_tflite_x86((row * inverse).astype(f32)), -127, 127), scale, 0


def _asymmetric_row(row: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    low, high = f32(min(f32(0), row.min())), f32(max(f32(0), row.max()))
    if low == high:
        return np.zeros(row.size, np.int64), f32(1.0), 0
    step = float(f32(high - low)) / 255.0  # the difference in float, the division in double
    from_low, from_high = -128.0 - float(low) / step, 127.0 - float(high) / step
    z = from_low if 128.0 + abs(float(low) / step) < 127.0 + abs(float(high) / step) else from_high
    zero_point = -128 if z <= -128 else 127 if z >= 127 else int(
        np.sign(z) * np.floor(abs(z) + 0.5))
    scale = f32(step)
    inverse = f32(1.0 / float(scale))
    rounded = _round_as_tflite_x86((row * inverse).astype(f32))
    return np.clip(zero_point + rounded, -128, 127), scale, zero_point


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
    clamped = np.clip(out, f32(p.activation_min), f32(p.activation_max))
    outputs[0][...] = clamped.reshape(outputs[0].shape)


# Kernels by the params type prepare returned (one type per dtype path).
_BY_PARAMS = {
    FullyConnectedFloatParams: fully_connected_float,
    FullyConnectedQuantizedParams: fully_connected_quantized,
    FullyConnectedHybridParams: fully_connected_hybrid,
    BatchMatMulFloatParams: batch_matmul_float,
    BatchMatMulInt8Params: batch_matmul_int8,
}


def _dispatch(params, inputs, outputs) -> None:
    _BY_PARAMS[type(params)](params, inputs, outputs)


KERNELS: dict = {"FULLY_CONNECTED": _dispatch, "BATCH_MATMUL": _dispatch}
