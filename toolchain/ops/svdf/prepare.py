"""Params for SVDF: a fully connected layer factored into a feature and a time filter
over a memory of past activations (a variable tensor, the op's state).

Operands: input [batches, input_size], weights_feature [filters, input_size], weights_time
[filters, memory], an optional bias [units], the state [batches, filters * memory] and the
output [batches, units], where units = filters / rank. Each invoke:

1. the state slides one element toward its start (the whole buffer at once, as TFLite does):
   each (batch, filter) row of `memory` values drops its oldest, and its newest slot is
   written in step 2;
2. feature: each filter's dot product with the input row goes into its newest slot;
3. time: each filter's dot product with its row of the state;
4. each unit sums the time results of its `rank` consecutive filters, adds its bias, and is
   written out (requantized, or through the fused activation in float).

Which interpreter's arithmetic each kernel reproduces:
- int8 with an int16 state and int16 weights_time, what TFLite's converter writes: LiteRT's
  reference kernel. Its multipliers are float32 expressions widened to double, the state's zero
  point is ignored, the fused activation must be RELU and is never applied (the output's clamp
  to int8 is all there is), and the bias may be absent.
- int8 with an int8 state and int8 weights_time (what TFLite Micro's keyword models hold):
  TFLite Micro's kernel, because LiteRT reads both as int16 whatever their type, past the end
  of the buffers, and writes the state so (it corrupts its own heap). TFLite Micro adds the
  state's zero point to each new value, the sum stored by a narrowing cast that wraps, and
  subtracts it again in the time sums; its multipliers are double expressions; it needs a bias
  whose scale is state scale * weights_time scale (within 1e-5); the activation is never
  applied. Checks of these models run TFLite Micro (Signature.oracle).
- float32: LiteRT's reference kernel on x86, whose sums come from its NEON code compiled for
  SSE: four lane sums over the first n - n % 4 products, the lanes added in order, then the rest
  one at a time; the bias is added after the rank sums, then the activation.
- hybrid (float32 input, state and bias, int8 weights): LiteRT's EvalHybridSVDF, the float
  kernel but for the feature sums: each input row quantized to int8 as the hybrid
  FULLY_CONNECTED quantizes it (toolchain/ops/hybrid.py), int32 dot products rescaled by
  row scale * weights_feature scale (less zero point * row sum when asymmetric), and
  weights_time used as float32(w) * scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.numerics.quant import per_tensor_quantization, quantize_multiplier
from toolchain.ops.spec import MemoryRequest, required_input

# TFLite Micro refuses an int8-state SVDF whose bias scale is further than this (absolutely)
# from state scale * weights_time scale.
BIAS_SCALE_TOLERANCE = 1e-5
# The float activations TFLite's SVDF applies through ApplyActivationToVector and arenac
# reproduces (TANH and SIGMOID there are Eigen's vectorized approximations).
FLOAT_ACTIVATIONS = ("NONE", "RELU", "RELU6", "RELU_N1_TO_1")
# Float sums run this many lane accumulators, as TFLite's NEON code (on SSE) does.
LANES = 4


@dataclass(frozen=True)
class SvdfShape:
    batches: int
    input_size: int
    filters: int
    memory: int
    rank: int

    @property
    def units(self) -> int:
        return self.filters // self.rank

    @property
    def state_size(self) -> int:
        return self.batches * self.filters * self.memory


@dataclass(frozen=True)
class SvdfIntegerParams:
    """int8 input and output, int8 weights_feature, weights_time and state of `state_dtype`.

    new = clamp(MBQM(sum((x - input_zero_point) * weights_feature), feature multiplier),
    state type) + state_zero_point, stored into the state type (wrapping); then per unit
    acc = bias + sum over its filters of sum((state - state_zero_point) * weights_time) in
    int32 (wrapping), out = clamp(MBQM(acc, output multiplier) + output_zero_point, int8).
    For the int16 state (LiteRT) state_zero_point is 0.
    """

    shape: SvdfShape
    state_dtype: str
    input_zero_point: int
    state_zero_point: int
    feature_multiplier: int
    feature_shift: int
    output_multiplier: int
    output_shift: int
    output_zero_point: int


@dataclass(frozen=True)
class SvdfFloatParams:
    """float32, sums in TFLite's x86 lane order (see the module's docstring), then
    `activation` as std::max / std::min apply it."""

    shape: SvdfShape
    activation: str


@dataclass(frozen=True)
class SvdfHybridParams(SvdfFloatParams):
    """The float kernel with int8 weights (see the module's docstring): `time_weights` are
    float32(w) * scale, as LiteRT dequantizes them once; `row_sums` are weights_feature's, set
    with `asymmetric` only."""

    asymmetric: bool = False
    feature_scale: float = 0.0
    time_weights: tuple[float, ...] = ()
    row_sums: tuple[int, ...] = ()


def prepare_svdf(graph: Graph, op: Operator) -> SvdfIntegerParams | SvdfFloatParams:
    x = required_input(graph, op, 0, "input")
    weights_feature = required_input(graph, op, 1, "weights_feature")
    weights_time = required_input(graph, op, 2, "weights_time")
    state = required_input(graph, op, 4, "activation state")
    bias = graph.tensors[op.inputs[3]] if op.inputs[3] >= 0 else None
    out = graph.tensors[op.outputs[0]]
    if len(op.inputs) != 5 or len(op.outputs) != 1:
        raise ModelError(f"{len(op.inputs)} inputs and {len(op.outputs)} outputs (TFLite's "
                         "SVDF takes 5 and gives 1)")
    if not state.is_variable:
        raise ModelError("the activation state (input 4) is not a variable tensor")
    rank = int(op.options.get("rank", 0))
    if rank < 1:
        raise ModelError(f"rank {rank} (TFLite's SVDF needs one of at least 1)")
    shape = _shape(x, weights_feature, weights_time, bias, state, out, rank)
    for role, t in (("weights_feature", weights_feature), ("weights_time", weights_time),
                    ("bias", bias)):
        if t is not None and not t.is_constant:
            raise UnsupportedOpError(f"{role} is not a constant")
    activation = op.options.get("fused_activation_function", "NONE")
    if x.dtype == "float32":
        if activation not in FLOAT_ACTIVATIONS:
            raise UnsupportedOpError(f"fused activation {activation} (float SVDF runs "
                                     f"{', '.join(FLOAT_ACTIVATIONS)})")
        if weights_feature.dtype == "int8":
            f32 = np.float32
            asymmetric = bool(op.options.get("asymmetric_quantize_inputs", False))
            features = np.asarray(weights_feature.data, np.int64)
            times = np.asarray(weights_time.data, np.int8).astype(f32) * f32(_scale(weights_time))
            return SvdfHybridParams(
                shape, activation, asymmetric, float(f32(_scale(weights_feature))),
                tuple(float(v) for v in times.ravel()),
                tuple(int(v) for v in features.sum(axis=1)) if asymmetric else ())
        return SvdfFloatParams(shape, activation)
    x_scale, x_zero_point = per_tensor_quantization(x)
    feature_scale = _scale(weights_feature)
    time_scale = _scale(weights_time)
    state_scale, state_zero_point = per_tensor_quantization(state)
    out_scale, out_zero_point = per_tensor_quantization(out)
    if state.dtype == "int16":  # LiteRT's kernel
        if activation != "RELU":
            raise UnsupportedOpError(f"fused activation {activation}: LiteRT's integer SVDF "
                                     "runs only RELU (and never applies it)")
        if state_zero_point:
            raise UnsupportedOpError(f"int16 state with zero point {state_zero_point} (LiteRT "
                                     "ignores it, TFLite Micro applies it)")
        f32 = np.float32
        feature = float(f32(f32(x_scale) * f32(feature_scale)) / f32(state_scale))
        output = float(f32(f32(state_scale) * f32(time_scale)) / f32(out_scale))
    else:  # TFLite Micro's kernel
        if bias is None:
            raise UnsupportedOpError("int8-state SVDF without a bias (TFLite Micro's kernel "
                                     "reads one)")
        bias_scale = bias.quantization.scale[0] if bias.quantization else 0.0
        expected = float(np.float32(state_scale) * np.float32(time_scale))
        if not abs(bias_scale - expected) < BIAS_SCALE_TOLERANCE:
            raise UnsupportedOpError(f"bias scale {bias_scale:.6g} is not state scale * "
                                     f"weights_time scale ({expected:.6g}; TFLite Micro "
                                     "refuses it)")
        feature = x_scale * feature_scale / state_scale
        output = state_scale * time_scale / out_scale
    feature_multiplier, feature_shift = quantize_multiplier(feature)
    output_multiplier, output_shift = quantize_multiplier(output)
    return SvdfIntegerParams(
        shape, state.dtype, x_zero_point, state_zero_point if state.dtype == "int8" else 0,
        feature_multiplier, feature_shift, output_multiplier, output_shift, out_zero_point)


def _shape(x: Tensor, weights_feature: Tensor, weights_time: Tensor, bias: Tensor | None,
           state: Tensor, out: Tensor, rank: int) -> SvdfShape:
    """The dimensions, which TFLite's Prepare checks one against another."""
    for role, t in (("input", x), ("weights_feature", weights_feature),
                    ("weights_time", weights_time), ("activation state", state),
                    ("output", out)):
        if len(t.shape) != 2:
            raise UnsupportedOpError(f"{role} of shape {list(t.shape)} (must be 2-D)")
    (batches, input_size), (filters, depth) = x.shape, weights_feature.shape
    memory = weights_time.shape[1]
    if depth != input_size or weights_time.shape[0] != filters:
        raise UnsupportedOpError(f"weights_feature {list(weights_feature.shape)} and "
                                 f"weights_time {list(weights_time.shape)} do not fit input "
                                 f"{list(x.shape)}")
    if filters % rank:
        raise UnsupportedOpError(f"{filters} filters are not a multiple of rank {rank}")
    shape = SvdfShape(batches, input_size, filters, memory, rank)
    if bias is not None and bias.shape != (shape.units,):
        raise UnsupportedOpError(f"bias of shape {list(bias.shape)} for {shape.units} units")
    if state.shape != (batches, filters * memory):
        raise UnsupportedOpError(f"activation state of shape {list(state.shape)} (must be "
                                 f"[{batches}, {filters * memory}])")
    if out.shape != (batches, shape.units):
        raise UnsupportedOpError(f"output of shape {list(out.shape)} (must be "
                                 f"[{batches}, {shape.units}])")
    if 0 in (batches, input_size, filters, memory):
        raise UnsupportedOpError("an empty dimension")
    return shape


def _scale(t: Tensor) -> float:
    """The per-tensor scale of a weight tensor (TFLite ignores its zero point)."""
    q = t.quantization
    if q is None or len(q.scale) != 1 or not (math.isfinite(q.scale[0]) and q.scale[0] > 0):
        raise UnsupportedOpError(f"{t.dtype} tensor {t.name!r} needs one positive scale")
    return float(q.scale[0])


def svdf_scratch(p: SvdfIntegerParams | SvdfFloatParams) -> tuple[MemoryRequest, ...]:
    """Float units of rank > 1 add their filters' time sums in TFLite's order, from here; a
    hybrid kernel quantizes each input row into the next."""
    requests = []
    if isinstance(p, SvdfFloatParams) and p.shape.rank > 1:
        requests.append(MemoryRequest(4 * p.shape.filters, "the time sums of one batch's filters"))
    if isinstance(p, SvdfHybridParams):
        requests.append(MemoryRequest(p.shape.input_size, "the quantized input row"))
    return tuple(requests)


def svdf_tflm_scratch(p: SvdfIntegerParams | SvdfFloatParams) -> tuple[MemoryRequest, ...]:
    """TFLite Micro's SVDF asks for int32 filter sums and, when integer, int32 unit sums, each
    a row per batch (it runs no hybrid SVDF, so asks for nothing there)."""
    s = p.shape
    if isinstance(p, SvdfHybridParams):
        return ()
    filters = MemoryRequest(4 * s.batches * s.filters, "SVDF filter sums")
    if isinstance(p, SvdfFloatParams):
        return (filters,)
    return (filters, MemoryRequest(4 * s.batches * s.units, "SVDF unit sums"))
