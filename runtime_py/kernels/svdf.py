"""numpy kernels for SVDF (toolchain/ops/svdf/ describes the arithmetic each follows).

The state is the op's fifth input, a view into the interpreter's state block: the kernel shifts
and writes it in place, so it carries over to the next invoke. Integer sums are exact in int64
and wrapped to int32 where TFLite's int32 sums would wrap; float sums are float32 additions in
TFLite's x86 lane order.
"""

from __future__ import annotations

import numpy as np

from runtime_py.hybrid import quantize_asymmetric, quantize_symmetric
from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier, wrap_int32
from toolchain.numerics.quant import INT_RANGES
from toolchain.ops.svdf.prepare import LANES, SvdfFloatParams, SvdfHybridParams, SvdfIntegerParams


def _slide(state: np.ndarray) -> np.ndarray:
    """Every element one place toward the start (TFLite shifts the whole buffer); the state as
    (batches, filters, memory) for the caller to write each row's newest slot."""
    flat = state.reshape(-1)
    flat[:-1] = flat[1:].copy()
    return flat


def _wrap(values: np.ndarray, dtype: str) -> np.ndarray:
    """A narrowing cast as C performs it on two's complement machines: modulo the type."""
    low, high = INT_RANGES[dtype]
    return (values - low) % (high - low + 1) + low


def svdf_integer(p: SvdfIntegerParams, inputs, outputs) -> None:
    s = p.shape
    x, weights_feature, weights_time, bias, state = inputs
    flat = _slide(state)
    rows = flat.reshape(s.batches, s.filters, s.memory)
    xs = x.astype(np.int64) - p.input_zero_point
    dot = wrap_int32(xs @ weights_feature.astype(np.int64).T)  # (batches, filters)
    new = multiply_by_quantized_multiplier(dot, p.feature_multiplier, p.feature_shift)
    new = np.clip(new, *INT_RANGES[p.state_dtype]) + p.state_zero_point
    rows[:, :, -1] = _wrap(new, p.state_dtype)
    memory = rows.astype(np.int64) - p.state_zero_point
    time = wrap_int32(np.einsum("bfm,fm->bf", memory, weights_time.astype(np.int64)))
    acc = time.reshape(s.batches, s.units, s.rank).sum(axis=2)
    if bias is not None:
        acc = acc + bias.astype(np.int64)
    scaled = multiply_by_quantized_multiplier(wrap_int32(acc), p.output_multiplier,
                                              p.output_shift)
    result = np.clip(wrap_int32(scaled + p.output_zero_point), -128, 127)
    outputs[0][...] = result.astype(np.int8)


def lane_sum(terms: np.ndarray) -> np.ndarray:
    """float32 sums over the last axis: LANES lane sums over the first n - n % LANES terms
    (lane j takes terms j, j + LANES, ...), the lanes added in order, then the rest one by
    one."""
    n = terms.shape[-1]
    head = n - n % LANES
    lanes = np.zeros((*terms.shape[:-1], LANES), np.float32)
    for start in range(0, head, LANES):
        lanes = lanes + terms[..., start:start + LANES]
    total = lanes[..., 0]
    for j in range(1, LANES):
        total = total + lanes[..., j]
    for i in range(head, n):
        total = total + terms[..., i]
    return total


def _activation(values: np.ndarray, activation: str) -> np.ndarray:
    """std::max(low, std::min(values, high)), element by element (a NaN gives `low`)."""
    bounds = {"RELU": (0.0, None), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0)}
    low, high = bounds.get(activation, (None, None))
    if high is not None:
        values = np.where(np.float32(high) < values, np.float32(high), values)
    if low is not None:
        values = np.where(np.float32(low) < values, values, np.float32(low))
    return values.astype(np.float32)


def _hybrid_features(p: SvdfHybridParams, x: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """EvalHybridSVDF's feature sums: each row quantized, int32 sums rescaled by row scale *
    weights_feature scale, less zero point * row sum when asymmetric."""
    quantize = quantize_asymmetric if p.asymmetric else quantize_symmetric
    sums = np.empty((p.shape.batches, p.shape.filters), np.float32)
    for b in range(p.shape.batches):
        q, scale, zero_point = quantize(x[b].astype(np.float32))
        acc = weights.astype(np.int64) @ q
        if p.asymmetric:
            acc = acc - zero_point * np.asarray(p.row_sums, np.int64)
        sums[b] = wrap_int32(acc).astype(np.float32) * np.float32(scale * np.float32(
            p.feature_scale))
    return sums


def svdf_float(p: SvdfFloatParams, inputs, outputs) -> None:
    """The float kernel, or the hybrid one (SvdfHybridParams: int8 weights)."""
    s = p.shape
    x, weights_feature, weights_time, bias, state = inputs
    if isinstance(p, SvdfHybridParams):
        weights_time = np.asarray(p.time_weights, np.float32).reshape(s.filters, s.memory)
    with np.errstate(all="ignore"):  # IEEE infinities and NaN, as in C
        flat = _slide(state)
        rows = flat.reshape(s.batches, s.filters, s.memory)
        rows[:, :, -1] = (_hybrid_features(p, x, weights_feature)
                          if isinstance(p, SvdfHybridParams)
                          else lane_sum(weights_feature[None, :, :] * x[:, None, :]))
        time = lane_sum(rows * weights_time[None, :, :])  # (batches, filters)
        total = lane_sum(time.reshape(s.batches, s.units, s.rank))
        if bias is not None:
            total = total + bias
        outputs[0][...] = _activation(total, p.activation)


def svdf(p, inputs, outputs) -> None:
    if isinstance(p, SvdfFloatParams):
        svdf_float(p, inputs, outputs)
    else:
        svdf_integer(p, inputs, outputs)


KERNELS = {"SVDF": svdf}
