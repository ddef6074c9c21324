"""Params for the reductions: MEAN, SUM, REDUCE_MAX, REDUCE_MIN, REDUCE_ANY, REDUCE_ALL, ARG_MAX
and ARG_MIN.

TFLite's reference Eval picks one of several arithmetic paths per dtype and per quantization;
prepare makes the same choice once and names it in `method`, with the constants that path uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolchain.errors import UnsupportedOpError
from toolchain.front.schema import DTYPE_NAMES
from toolchain.ir import Graph, Operator, Tensor
from toolchain.numerics.quant import (
    INT_RANGES,
    quantize_multiplier,
    require_int16_zero_points,
    scale_of,
    zero_point_of,
)
from toolchain.ops.spec import required_input

QUANTIZED = frozenset({"int8", "uint8", "int16"})


@dataclass(frozen=True)
class ReduceParams:
    """One reduction over `axes` (the output keeps or drops them; its elements come in the same
    order either way); the quantization fields matter to "requantized_sum" only.

    methods: "sum" (in the input dtype, wrapping for integers), "max", "min",
    "mean" (float32 sum / count), "mean_truncate" (integer sum / count, rounding toward zero),
    "requantized_sum": clamp(MultiplyByQuantizedMultiplier(sum - count * input_zero_point,
    multiplier, shift) + output_zero_point); for MEAN 1/count is folded into multiplier and shift.
    """

    method: str
    axes: tuple[int, ...]  # resolved: non-negative, unique, ascending
    count: int  # input elements reduced into each output element
    input_zero_point: int = 0
    multiplier: int = 0
    shift: int = 0
    output_zero_point: int = 0
    output_min: int = 0
    output_max: int = 0


@dataclass(frozen=True)
class ArgParams:
    """Index of the first extreme along `axis`: an element wins only if strictly better."""

    axis: int
    maximize: bool


def _constant_ints(graph: Graph, op: Operator, position: int, dtypes: frozenset[str]) -> list[int]:
    t = required_input(graph, op, position, "axis")
    if t.data is None or t.dtype not in dtypes:
        raise UnsupportedOpError(f"input {position} must be a constant {'/'.join(sorted(dtypes))}")
    return [int(v) for v in t.data.reshape(-1)]


def _resolve_axes(axes: list[int], rank: int) -> tuple[int, ...]:
    """TFLite's ResolveAxis: negative axes count from the end, duplicates collapse."""
    if any(not -rank <= a < rank for a in axes):
        raise UnsupportedOpError(f"axis {axes} out of range for rank {rank}")
    return tuple(sorted({a % rank for a in axes}))


def _check_output(out: Tensor, shape: tuple[int, ...]) -> None:
    if out.shape != shape:
        raise UnsupportedOpError(f"output shape {out.shape}, TFLite computes {shape}")


def _same_quantization(source: Tensor, out: Tensor) -> bool:
    return scale_of(source) == scale_of(out) and zero_point_of(source) == zero_point_of(out)


def _per_tensor(*tensors: Tensor) -> None:
    for t in tensors:
        if t.quantization is None or t.quantization.per_channel:
            raise UnsupportedOpError(f"{t.dtype} tensor {t.name!r} needs per-tensor quantization")
    require_int16_zero_points(*tensors)


def _requantized(params: ReduceParams, source: Tensor, out: Tensor, mean: bool) -> ReduceParams:
    """TFLite's integer QuantizedMeanOrSum; the float32 scales divide in double (Prepare)."""
    multiplier, shift = quantize_multiplier(scale_of(source) / scale_of(out))
    if mean:
        # Fold 1/count into the multiplier, keeping it below 2^31 and the shift above -32.
        extra = min(params.count.bit_length() - 1, 32, 31 + shift)
        multiplier = (multiplier << extra) // params.count
        shift -= extra
    low, high = INT_RANGES[out.dtype]
    return ReduceParams("requantized_sum", params.axes, params.count, zero_point_of(source),
                        multiplier, shift, zero_point_of(out), low, high)


def _method(opcode: str, source: Tensor, out: Tensor) -> str:
    """The arithmetic TFLite uses for this op, dtype and quantization.

    Quantized MEAN and SUM always requantize, even between equal quantizations. For int8 and
    int16 SUM that is TFLite Micro's reading: LiteRT 2.3.0's reference SUM reads int8 data as
    uint8 and garbles int16, so it cannot be the specification there.
    """
    if source.dtype in QUANTIZED:
        if opcode in ("MEAN", "SUM"):
            return "requantized_sum"
        if not _same_quantization(source, out):
            raise UnsupportedOpError(f"{opcode} needs equal input and output quantization")
    if opcode == "MEAN":
        return "mean" if source.dtype == "float32" else "mean_truncate"
    return {"SUM": "sum", "REDUCE_MAX": "max", "REDUCE_MIN": "min", "REDUCE_ANY": "max",
            "REDUCE_ALL": "min"}[opcode]


def prepare_reduce(graph: Graph, op: Operator) -> ReduceParams:
    source, out = required_input(graph, op, 0, "input"), graph.tensors[op.outputs[0]]
    if out.dtype != source.dtype:
        raise UnsupportedOpError(f"output dtype {out.dtype} differs from input {source.dtype}")
    axes = _resolve_axes(_constant_ints(graph, op, 1, frozenset({"int32"})), len(source.shape))
    if not axes:
        raise UnsupportedOpError("no axes: TFLite copies the input without rescaling it")
    keep_dims = bool(op.options.get("keep_dims", False))
    shape = tuple(
        1 if i in axes else d for i, d in enumerate(source.shape) if keep_dims or i not in axes
    )
    _check_output(out, shape)
    count = math.prod(source.shape[i] for i in axes)
    if count == 0:
        raise UnsupportedOpError(f"{op.opcode} over an empty axis of {list(source.shape)}")
    if source.dtype in QUANTIZED:
        _per_tensor(source, out)
    params = ReduceParams(_method(op.opcode, source, out), axes, count)
    if params.method == "requantized_sum":
        return _requantized(params, source, out, mean=op.opcode == "MEAN")
    return params


def prepare_arg(graph: Graph, op: Operator) -> ArgParams:
    source, out = required_input(graph, op, 0, "input"), graph.tensors[op.outputs[0]]
    axis_values = _constant_ints(graph, op, 1, frozenset({"int32", "int64"}))
    if len(axis_values) != 1:
        raise UnsupportedOpError(f"axis must hold one value, not {len(axis_values)}")
    (axis,) = _resolve_axes(axis_values, len(source.shape))
    if source.shape[axis] == 0:
        raise UnsupportedOpError(f"{op.opcode} over an empty axis of {list(source.shape)}")
    declared = DTYPE_NAMES.get(op.options.get("output_type", -1))
    if out.dtype not in ("int32", "int64") or declared != out.dtype:
        raise UnsupportedOpError(f"output_type {declared} with an output tensor of {out.dtype}")
    _check_output(out, source.shape[:axis] + source.shape[axis + 1:])
    return ArgParams(axis, maximize=op.opcode == "ARG_MAX")
