"""Params for the shape and data-movement family: ops that move stored values.

An int8 element is copied as its stored integer even where the output's quantization differs
(TFLite's reference kernels do the same). TFLite refuses a quantization mismatch only for
CONCATENATION (int8), PACK, UNPACK and EXPAND_DIMS; prepare refuses the same models. The one
op that changes values is uint8 CONCATENATION, which rescales an input quantized unlike the
output in float32, as TFLite does. Everything TFLite derives from constant index tensors
(slice bounds, split sizes, gather indices, pad values) is resolved here once, so a backend
only copies.

C emission.

C emitters for the shape family (RESHAPE, SQUEEZE, EXPAND_DIMS, PAD, PADV2, CONCATENATION,
PACK, UNPACK, SPLIT, SPLIT_V, TRANSPOSE, SLICE, STRIDED_SLICE, GATHER), from the same params as
runtime_py.

These ops move stored values, so Python reduces each one to a few loops with constant counts
and strides around block copies: a memcpy of a contiguous run, or one element (a uint8
CONCATENATION rescales its unlike-quantized inputs element by element through a helper). Size-1
dimensions vanish, adjacent dimensions that every copy walks alike merge, and the innermost
contiguous stretch becomes the memcpy length, so e.g. a slice that keeps whole rows is one
loop of memcpys. Every kernel writes its output(s) in order (a large TRANSPOSE tile by tile);
PAD, SPLIT, SPLIT_V and UNPACK also read their input in order.

RESHAPE, SQUEEZE and EXPAND_DIMS keep the bytes: one memmove, skipped when the output lies over
the input. The other ops copy with memcpy, so their outputs must not overlap their inputs.
Constant operands prepare already resolved (shapes, paddings, perms, slice bounds, axes,
indices) are not read at run time, so the generator does not emit them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.numerics.quant import require_int16_zero_points, zero_point_of
from toolchain.ops import overlaps
from toolchain.ops.emit import (
    ConstantLoop,
    CTensor,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_int32,
    c_length,
    c_sum,
    render_macro,
)
from toolchain.ops.spec import OpSpec, kernels, required_input

# Element types each op moves: TFLite's kernels copy them by size; UNPACK has no 64-bit kernel.
MOVED_DTYPES = frozenset({"int8", "uint8", "int16", "int32", "int64", "float32"})
# The ops that only rename their input's bytes take bool too (TFLite's converter reshapes the
# bool conditions it passes to IF).
ALIASED_DTYPES = MOVED_DTYPES | {"bool"}
INDEX_DTYPES = ("int32", "int64")
QUANTIZED_INTEGERS = ("int8", "uint8", "int16")
# Rank limits of TFLite's kernels.
MAX_PAD_RANK = 5
MAX_TRANSPOSE_RANK = 8
MAX_SQUEEZE_RANK = 8
MAX_STRIDED_SLICE_INDICES = 31


@dataclass(frozen=True)
class ReshapeParams:
    """RESHAPE, SQUEEZE, EXPAND_DIMS: the same bytes under a new shape."""

    shape: tuple[int, ...]


@dataclass(frozen=True)
class PadParams:
    """PAD, PADV2: (before, after) per axis, and the element written into the border.

    `value` is in the tensor's stored representation: for quantized int8 it is the
    quantized integer (the output zero point for PAD).
    """

    paddings: tuple[tuple[int, int], ...]
    value: int | float


@dataclass(frozen=True)
class AxisParams:
    """CONCATENATION, PACK, UNPACK: the (non-negative) axis they join along or split off."""

    axis: int


@dataclass(frozen=True)
class Rescale:
    """How uint8 CONCATENATION moves an input quantized unlike the output (TFLite's
    ConcatenationWithScaling), in float32: clamp(int32(round(q * scale + bias)) + zero_point,
    0, 255), the product and the sum each rounded to float32, halves rounded away from zero.

    scale = in_scale * (1 / out_scale) and bias = -in_zero_point * scale, both float32."""

    scale: float  # float32 values
    bias: float
    zero_point: int


@dataclass(frozen=True)
class ConcatenationParams:
    """CONCATENATION along `axis`; per input, the Rescale TFLite applies, or None where it
    copies the stored values."""

    axis: int
    rescales: tuple[Rescale | None, ...]


@dataclass(frozen=True)
class SplitParams:
    """SPLIT, SPLIT_V: the axis and each output's extent along it."""

    axis: int
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class TransposeParams:
    """TRANSPOSE: output axis i is input axis perm[i]."""

    perm: tuple[int, ...]


@dataclass(frozen=True)
class SliceParams:
    """SLICE, STRIDED_SLICE: element k along axis i is input index begin[i] + k * strides[i],
    for k < counts[i].

    `input_shape` is the input with any new axes (of size 1) inserted; the output is the
    selected block, reshaped to drop shrunk axes.
    """

    input_shape: tuple[int, ...]
    begin: tuple[int, ...]
    strides: tuple[int, ...]
    counts: tuple[int, ...]


@dataclass(frozen=True)
class GatherParams:
    """GATHER over the input viewed as [batch, outer, axis_size, inner].

    `indices` is [batch, indices per batch], already checked to lie in [0, axis_size).
    """

    batch: int
    outer: int
    axis_size: int
    inner: int
    indices: np.ndarray


# --- shared checks ------------------------------------------------------------------------


def _constant(graph: Graph, op: Operator, position: int, what: str,
              dtypes: Sequence[str] = INDEX_DTYPES) -> np.ndarray:
    """The data of a constant input (indices, sizes, pad values) of one of `dtypes`."""
    t = required_input(graph, op, position, what)
    if t.data is None:
        raise UnsupportedOpError(f"{what} must be a constant tensor")
    if t.dtype not in dtypes:
        raise UnsupportedOpError(f"{what} of type {t.dtype} (expected {'/'.join(dtypes)})")
    return t.data


def _outputs(graph: Graph, op: Operator, dtype: str, count: int | None = None) -> list[Tensor]:
    outs = [graph.tensors[i] for i in op.outputs]
    if count is not None and len(outs) != count:
        raise UnsupportedOpError(f"{len(outs)} outputs, expected {count}")
    for out in outs:
        if out.dtype != dtype:
            raise UnsupportedOpError(f"output type {out.dtype} differs from input type {dtype}")
    return outs


def _moved(t: Tensor, dtypes: frozenset[str] = MOVED_DTYPES) -> Tensor:
    if t.dtype not in dtypes:
        raise UnsupportedOpError(f"values of type {t.dtype}")
    return t


def _expect_shape(out: Tensor, shape: Sequence[int]) -> None:
    if tuple(out.shape) != tuple(shape):
        raise UnsupportedOpError(
            f"output {out.name!r} has shape {list(out.shape)}, TFLite computes {list(shape)}")


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise UnsupportedOpError(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def _scalar(values: np.ndarray, what: str) -> int:
    if values.size != 1:
        raise UnsupportedOpError(f"{what} must hold one value, not {values.size}")
    return int(values.reshape(-1)[0])


def _tflite_quantization(t: Tensor) -> tuple[float, int]:
    """(scale, zero_point) as TFLite's per-tensor params hold them: (0, 0) when unquantized."""
    q = t.quantization
    return (q.scale[0], q.zero_point[0]) if q else (0.0, 0)


def _require_same_quantization(inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> None:
    """The check TFLite makes where it cannot rescale: every tensor quantized like the first."""
    expected = _tflite_quantization(inputs[0])
    for t in (*inputs, *outputs):
        if _tflite_quantization(t) != expected:
            raise UnsupportedOpError(
                f"{t.name!r} is quantized {_tflite_quantization(t)}, {inputs[0].name!r} "
                f"{expected}: TFLite does not requantize here")


# --- RESHAPE, SQUEEZE, EXPAND_DIMS --------------------------------------------------------


def _resolve_reshape(requested: Sequence[int], count: int) -> tuple[int, ...]:
    """TFLite's ResolveOutputShape: at most one -1, inferred from the element count."""
    requested = [int(d) for d in requested]
    known = int(np.prod([d for d in requested if d != -1], dtype=np.int64))
    if requested.count(-1) > 1 or any(d < -1 for d in requested) or -1 in requested and not known:
        raise UnsupportedOpError(f"invalid new shape {requested}")
    shape = tuple(count // known if d == -1 else d for d in requested)
    if int(np.prod(shape, dtype=np.int64)) != count:
        raise UnsupportedOpError(f"cannot reshape {count} elements to {requested}")
    return shape


def prepare_reshape(graph: Graph, op: Operator) -> ReshapeParams:
    """New shape from a 1-D int32 shape tensor if there is one, else the options' new_shape.

    A shape tensor computed at run time is taken to agree with the output's static shape.
    """
    x = _moved(required_input(graph, op, 0, "input"), ALIASED_DTYPES)
    (out,) = _outputs(graph, op, x.dtype, 1)
    shape_index = op.inputs[1] if len(op.inputs) > 1 else -1
    shape_tensor = graph.tensors[shape_index] if shape_index >= 0 else None
    if shape_tensor is not None and len(shape_tensor.shape) == 1 and shape_tensor.dtype == "int32":
        requested = out.shape if shape_tensor.data is None else tuple(shape_tensor.data)
    else:
        requested = tuple(op.options.get("new_shape") or ())
        if requested == (0,):  # legacy files write [0] for a scalar
            requested = ()
    shape = _resolve_reshape(requested, x.num_elements)
    _expect_shape(out, shape)
    return ReshapeParams(shape)


def prepare_squeeze(graph: Graph, op: Operator) -> ReshapeParams:
    """Drop the listed size-1 axes, or every size-1 axis when none are listed."""
    x = _moved(required_input(graph, op, 0, "input"), ALIASED_DTYPES)
    (out,) = _outputs(graph, op, x.dtype, 1)
    rank = len(x.shape)
    if rank > MAX_SQUEEZE_RANK:
        raise UnsupportedOpError(f"rank {rank} (TFLite squeezes up to {MAX_SQUEEZE_RANK})")
    listed = op.options.get("squeeze_dims") or ()
    squeezed = {_axis(int(d), rank) for d in listed} or {i for i, d in enumerate(x.shape) if d == 1}
    if any(x.shape[i] != 1 for i in squeezed):
        raise UnsupportedOpError(f"cannot squeeze axes {sorted(squeezed)} of {list(x.shape)}")
    shape = tuple(d for i, d in enumerate(x.shape) if i not in squeezed)
    _expect_shape(out, shape)
    return ReshapeParams(shape)


def prepare_expand_dims(graph: Graph, op: Operator) -> ReshapeParams:
    """Insert a size-1 axis; TFLite requires the output quantized exactly as the input."""
    x = _moved(required_input(graph, op, 0, "input"), ALIASED_DTYPES)
    (out,) = _outputs(graph, op, x.dtype, 1)
    _require_same_quantization([x], [out])
    require_int16_zero_points(x)
    rank = len(x.shape)
    axis = _scalar(_constant(graph, op, 1, "axis"), "axis")
    if not -rank - 1 <= axis <= rank:
        raise UnsupportedOpError(f"axis {axis} out of range for rank {rank}")
    axis %= rank + 1
    shape = (*x.shape[:axis], 1, *x.shape[axis:])
    _expect_shape(out, shape)
    return ReshapeParams(shape)


# --- PAD, PADV2 ---------------------------------------------------------------------------


def _pad_value(graph: Graph, op: Operator, x: Tensor, out: Tensor) -> int | float:
    """TFLite's pad element: PADV2's constant if given, else 0 (the output zero point when
    quantized). A quantized constant must be quantized exactly as the output."""
    given = len(op.inputs) > 2 and op.inputs[2] >= 0
    quantized = x.dtype in QUANTIZED_INTEGERS and x.quantization is not None
    if not given:
        return zero_point_of(out) if quantized else 0.0 if x.dtype == "float32" else 0
    constant = graph.tensors[op.inputs[2]]
    values = _constant(graph, op, 2, "constant_values", (x.dtype,))
    if quantized and _tflite_quantization(constant) != _tflite_quantization(out):
        raise UnsupportedOpError(
            "constant_values quantized differently from the output (TFLite refuses)")
    if values.size != 1:
        raise UnsupportedOpError(f"constant_values must hold one value, not {values.size}")
    return values.reshape(-1)[0].item()


def prepare_pad(graph: Graph, op: Operator) -> PadParams:
    x = _moved(required_input(graph, op, 0, "input"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    rank = len(x.shape)
    if rank > MAX_PAD_RANK:
        raise UnsupportedOpError(f"rank {rank} (TFLite pads up to {MAX_PAD_RANK})")
    paddings = _constant(graph, op, 1, "paddings")
    if paddings.shape != (rank, 2) or (paddings < 0).any():
        raise UnsupportedOpError(f"paddings must be non-negative [{rank}, 2], got "
                                 f"{paddings.tolist()}")
    pairs = tuple((int(before), int(after)) for before, after in paddings)
    _expect_shape(out, tuple(d + before + after for d, (before, after) in zip(x.shape, pairs)))
    return PadParams(pairs, _pad_value(graph, op, x, out))


# --- CONCATENATION, PACK, UNPACK ----------------------------------------------------------


def _values(graph: Graph, op: Operator) -> list[Tensor]:
    """All inputs of a variadic op: present, movable and of the first one's type and rank."""
    if not op.inputs or min(op.inputs) < 0:
        raise UnsupportedOpError("missing input")
    values = [_moved(graph.tensors[i]) for i in op.inputs]
    for t in values[1:]:
        if t.dtype != values[0].dtype or len(t.shape) != len(values[0].shape):
            raise UnsupportedOpError("inputs differ in type or rank")
    return values


# Largest |round(q * scale + bias)| a uint8 rescale may reach: the C converts it to int32 and
# adds the output's zero point (at most 255) without leaving int32.
MAX_RESCALED = 2**31 - 256


def _rescale(t: Tensor, out: Tensor) -> Rescale | None:
    """TFLite's ConcatenationWithScaling for one uint8 input: a copy when its (zero point,
    scale) equal the output's, else the float32 rescale."""
    (in_scale, in_zero_point), (out_scale, out_zero_point) = (_tflite_quantization(t),
                                                              _tflite_quantization(out))
    if (in_scale, in_zero_point) == (out_scale, out_zero_point):
        return None
    if not in_scale or not out_scale:
        raise UnsupportedOpError(f"{t.name!r} is quantized {(in_scale, in_zero_point)}, the "
                                 f"output {(out_scale, out_zero_point)}: TFLite rescales "
                                 "between them with a scale of 0 or infinity")
    scale = np.float32(in_scale) * (np.float32(1) / np.float32(out_scale))
    bias = np.float32(-in_zero_point) * scale
    # q * scale + bias grows with q: its ends lie at q = 0 and q = 255.
    ends = [abs(float(np.float32(np.float32(q) * scale) + bias)) for q in (0, 255)]
    if max(ends) + 0.5 >= MAX_RESCALED:
        raise UnsupportedOpError(f"{t.name!r} rescaled by {float(scale):.6g} leaves int32, "
                                 "where TFLite's conversion is undefined")
    return Rescale(float(scale), float(bias), out_zero_point)


def prepare_concatenation(graph: Graph, op: Operator) -> ConcatenationParams:
    """TFLite runs no fused activation here, and its int8 kernel does not requantize (its
    Prepare requires every input quantized as the output). Its uint8 kernel rescales each
    input quantized unlike the output, in float32; int16 and the rest copy stored values."""
    values = _values(graph, op)
    first = values[0]
    (out,) = _outputs(graph, op, first.dtype, 1)
    activation = op.options.get("fused_activation_function", "NONE")
    if activation != "NONE":
        raise UnsupportedOpError(f"fused activation {activation} (TFLite's kernel has none)")
    if first.dtype == "int8":
        _require_same_quantization(values, [out])
    require_int16_zero_points(*values, out)
    axis = _axis(int(op.options.get("axis", 0)), len(first.shape))
    others = [(t.shape[:axis], t.shape[axis + 1:]) for t in values]
    if any(o != others[0] for o in others):
        raise UnsupportedOpError(f"input shapes differ off axis {axis}")
    total = sum(t.shape[axis] for t in values)
    _expect_shape(out, (*first.shape[:axis], total, *first.shape[axis + 1:]))
    rescales = tuple(_rescale(t, out) if first.dtype == "uint8" else None for t in values)
    return ConcatenationParams(axis, rescales)


def prepare_pack(graph: Graph, op: Operator) -> AxisParams:
    values = _values(graph, op)
    first = values[0]
    (out,) = _outputs(graph, op, first.dtype, 1)
    if int(op.options.get("values_count", 0)) != len(values):
        raise UnsupportedOpError("values_count differs from the number of inputs")
    if any(t.shape != first.shape for t in values):
        raise UnsupportedOpError("inputs differ in shape")
    _require_same_quantization(values, [out])
    axis = _axis(int(op.options.get("axis", 0)), len(first.shape) + 1)
    _expect_shape(out, (*first.shape[:axis], len(values), *first.shape[axis:]))
    return AxisParams(axis)


def prepare_unpack(graph: Graph, op: Operator) -> AxisParams:
    x = _moved(required_input(graph, op, 0, "input"), MOVED_DTYPES - {"int64"})
    axis = _axis(int(op.options.get("axis", 0)), len(x.shape))
    count = x.shape[axis]
    if int(op.options.get("num", 0)) != count or x.num_elements == 0:
        raise UnsupportedOpError(f"num must equal the axis size {count} of a non-empty input")
    outs = _outputs(graph, op, x.dtype, count)
    _require_same_quantization([x], outs)
    for out in outs:
        _expect_shape(out, x.shape[:axis] + x.shape[axis + 1:])
    return AxisParams(axis)


# --- SPLIT, SPLIT_V -----------------------------------------------------------------------


def _split(graph: Graph, op: Operator, x: Tensor, axis: int, sizes: list[int]) -> SplitParams:
    outs = _outputs(graph, op, x.dtype, int(op.options.get("num_splits", 0)))
    if len(sizes) != len(outs):
        raise UnsupportedOpError(f"{len(sizes)} split sizes for {len(outs)} outputs")
    for out, size in zip(outs, sizes):
        _expect_shape(out, (*x.shape[:axis], size, *x.shape[axis + 1:]))
    return SplitParams(axis, tuple(sizes))


def prepare_split(graph: Graph, op: Operator) -> SplitParams:
    """Inputs (axis, value): equal parts; the registry keys SPLIT by the int32 axis tensor."""
    x = _moved(required_input(graph, op, 1, "value"))
    axis = _axis(_scalar(_constant(graph, op, 0, "axis", ("int32",)), "axis"), len(x.shape))
    parts = int(op.options.get("num_splits", 0))
    if parts <= 0 or x.shape[axis] % parts:
        raise UnsupportedOpError(f"cannot split {x.shape[axis]} evenly into {parts}")
    return _split(graph, op, x, axis, [x.shape[axis] // parts] * parts)


def prepare_split_v(graph: Graph, op: Operator) -> SplitParams:
    """Inputs (value, size_splits, axis); one size may be -1: whatever the others leave."""
    x = _moved(required_input(graph, op, 0, "value"))
    axis = _axis(_scalar(_constant(graph, op, 2, "axis", ("int32",)), "axis"), len(x.shape))
    sizes = [int(s) for s in _constant(graph, op, 1, "size_splits").reshape(-1)]
    known = sum(s for s in sizes if s != -1)
    if sizes.count(-1) > 1 or any(s < -1 for s in sizes) or known > x.shape[axis]:
        raise UnsupportedOpError(f"invalid size_splits {sizes} for extent {x.shape[axis]}")
    sizes = [x.shape[axis] - known if s == -1 else s for s in sizes]
    if sum(sizes) != x.shape[axis]:
        raise UnsupportedOpError(f"size_splits {sizes} do not sum to {x.shape[axis]}")
    return _split(graph, op, x, axis, sizes)


# --- TRANSPOSE ----------------------------------------------------------------------------


def prepare_transpose(graph: Graph, op: Operator) -> TransposeParams:
    x = _moved(required_input(graph, op, 0, "input"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    rank = len(x.shape)
    if rank > MAX_TRANSPOSE_RANK:
        raise UnsupportedOpError(f"rank {rank} (TFLite transposes up to {MAX_TRANSPOSE_RANK})")
    perm = _constant(graph, op, 1, "perm", ("int32",)).reshape(-1)
    if len(perm) != rank or any(not -rank <= p < rank for p in perm):
        raise UnsupportedOpError(f"perm {perm.tolist()} for rank {rank}")
    perm = tuple(int(p) % rank for p in perm)
    if sorted(perm) != list(range(rank)):
        raise UnsupportedOpError(f"perm {list(perm)} is not a permutation")
    _expect_shape(out, tuple(x.shape[p] for p in perm))
    return TransposeParams(perm)


# --- SLICE, STRIDED_SLICE -----------------------------------------------------------------


def _steps(extent: int, stride: int) -> int:
    """How many strides fit in a signed extent: TFLite's output size along an axis."""
    if extent == 0 or (extent < 0) != (stride < 0):
        return 0
    return (abs(extent) - 1) // abs(stride) + 1


def prepare_slice(graph: Graph, op: Operator) -> SliceParams:
    """begin and size per axis; size -1 runs to the end of the axis."""
    x = _moved(required_input(graph, op, 0, "input"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    begin = [int(b) for b in _constant(graph, op, 1, "begin").reshape(-1)]
    size = [int(s) for s in _constant(graph, op, 2, "size").reshape(-1)]
    if len(begin) != len(x.shape) or len(size) != len(x.shape):
        raise UnsupportedOpError(f"begin {begin} and size {size} for rank {len(x.shape)}")
    counts = [d - b if s == -1 else s for d, b, s in zip(x.shape, begin, size)]
    if any(b < 0 or c < 0 or b + c > d for d, b, c in zip(x.shape, begin, counts)):
        raise UnsupportedOpError(f"begin {begin} and size {size} outside {list(x.shape)}")
    _expect_shape(out, counts)
    return SliceParams(x.shape, tuple(begin), (1,) * len(begin), tuple(counts))


@dataclass(frozen=True)
class _AxisSpec:
    """One axis of a strided slice after ellipsis and new axes are expanded; by default the
    whole axis."""

    size: int
    begin: int = 0
    end: int = 0
    stride: int = 1
    begin_masked: bool = True
    end_masked: bool = True
    shrink: bool = False


def _bit(mask: int, i: int) -> bool:
    return bool(mask >> i & 1)


def _expand_strided_slice(shape: tuple[int, ...], begin: list[int], end: list[int],
                          strides: list[int], options: dict) -> list[_AxisSpec]:
    """TFLite's BuildStridedSliceParams: one spec per axis of the input with new axes added.

    The ellipsis stands for as many full axes as the spec leaves out; a new axis is a size-1
    input axis taken whole; axes past the spec are taken whole.
    """
    ellipsis_mask = int(options.get("ellipsis_mask", 0))
    new_axis_mask = int(options.get("new_axis_mask", 0))
    count, rank = len(begin), len(shape)
    added = sum(1 for i in range(count) if _bit(new_axis_mask, i) and not _bit(ellipsis_mask, i))
    dims = rank + added
    ellipsis: list[int] = []
    new_axes: set[int] = set()
    i = 0
    while i < dims:
        if _bit(ellipsis_mask, i):
            stop = max(i + 1, min(i + 1 + added + rank - count, dims))
            ellipsis = list(range(i, stop))
            i = stop
            continue
        if _bit(new_axis_mask, i - max(len(ellipsis) - 1, 0)):
            new_axes.add(i)
        i += 1
    expanded = max(len(ellipsis) - 1, 0)
    specs, inserted = [], 0
    for i in range(dims):
        if i - inserted >= rank and i not in new_axes:
            raise UnsupportedOpError("strided slice spec has more axes than the input")
        if i in new_axes:
            specs.append(_AxisSpec(1))
            inserted += 1
        elif i in ellipsis or i >= count + expanded:
            specs.append(_AxisSpec(shape[i - inserted]))
        else:
            j = i - (expanded if ellipsis and i > ellipsis[0] else 0)
            specs.append(_AxisSpec(
                shape[i - inserted], begin[j], end[j], strides[j],
                _bit(options.get("begin_mask", 0), j), _bit(options.get("end_mask", 0), j),
                _bit(options.get("shrink_axis_mask", 0), j)))
    return specs


def _clamp(index: int, size: int, stride: int) -> int:
    """Negative indices count from the end; then clamp to [0, size] going forward or
    [-1, size - 1] going backward (TFLite's StartForAxis/EndForAxis)."""
    if index < 0:
        index += size
    return min(max(index, 0), size) if stride > 0 else min(max(index, -1), size - 1)


def _resolve_axis(spec: _AxisSpec, offset: bool) -> tuple[int, int]:
    """(first index, loop count) of one axis, as TFLite's reference kernel iterates it."""
    start = _clamp(spec.begin, spec.size, spec.stride)
    if spec.begin_masked:
        start = 0 if spec.stride > 0 else spec.size - 1
    if spec.shrink:
        stop = start if start >= spec.size else start + 1
    else:
        stop = _clamp(spec.end + start if offset else spec.end, spec.size, spec.stride)
        if spec.end_masked:
            stop = spec.size if spec.stride > 0 else -1
    return start, _steps(stop - start, spec.stride)


def _tflite_output_size(spec: _AxisSpec, offset: bool, count: int) -> int:
    """The extent TFLite gives the output along an axis (1 for a shrunk one): the loop's own
    count, except that with `offset` it takes the raw end, unclamped."""
    if spec.shrink:
        return 1
    return _steps(spec.end, spec.stride) if offset else count


def prepare_strided_slice(graph: Graph, op: Operator) -> SliceParams:
    """begin/end/strides with begin, end, ellipsis, new-axis and shrink masks and the offset
    option (end is a size added to begin), resolved exactly as TFLite's reference kernel.

    Variants where TFLite's output shape disagrees with what its loop writes (a shrunk axis
    out of range, an offset size running past the axis) are refused.
    """
    x = _moved(required_input(graph, op, 0, "input"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    vectors = [_constant(graph, op, i, what, ("int32",))
               for i, what in ((1, "begin"), (2, "end"), (3, "strides"))]
    if any(v.ndim != 1 for v in vectors):
        raise UnsupportedOpError("begin, end and strides must be 1-D")
    begin, end, strides = ([int(v) for v in vector] for vector in vectors)
    if not len(begin) == len(end) == len(strides) <= MAX_STRIDED_SLICE_INDICES:
        raise UnsupportedOpError("begin, end and strides differ in length or exceed 31")
    if 0 in strides:
        raise UnsupportedOpError("stride 0")
    options = dict(op.options)
    if bin(int(options.get("ellipsis_mask", 0))).count("1") > 1:
        raise UnsupportedOpError("more than one ellipsis")
    offset = bool(options.get("offset", False))
    if offset and (len(begin) != len(x.shape) or options.get("ellipsis_mask")
                   or options.get("new_axis_mask")):
        raise UnsupportedOpError("offset needs one index per input axis and no ellipsis or "
                                 "new axes")
    specs = _expand_strided_slice(x.shape, begin, end, strides, options)
    resolved = [_resolve_axis(spec, offset) for spec in specs]
    for i, (spec, (_, count)) in enumerate(zip(specs, resolved)):
        tflite_count = _tflite_output_size(spec, offset, count)
        if count != tflite_count:
            raise UnsupportedOpError(f"axis {i}: TFLite sizes the output {tflite_count} but "
                                     f"its loop writes {count} elements")
    _expect_shape(out, [count for spec, (_, count) in zip(specs, resolved) if not spec.shrink])
    return SliceParams(tuple(spec.size for spec in specs), tuple(s for s, _ in resolved),
                       tuple(spec.stride for spec in specs), tuple(c for _, c in resolved))


# --- GATHER -------------------------------------------------------------------------------


def prepare_gather(graph: Graph, op: Operator) -> GatherParams:
    """Constant indices only: TFLite fails at run time on an index out of range, so every
    index is checked here instead."""
    x = _moved(required_input(graph, op, 0, "params"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    indices = _constant(graph, op, 1, "indices", ("int16", "int32", "int64")).astype(np.int64)
    rank, index_rank = len(x.shape), indices.ndim
    axis = _axis(int(op.options.get("axis", 0)), rank)
    batch_dims = int(op.options.get("batch_dims", 0))
    if batch_dims < 0:
        batch_dims += index_rank
    batch_shape = x.shape[:batch_dims]
    if not 0 <= batch_dims <= min(axis, index_rank) or batch_shape != indices.shape[:batch_dims]:
        raise UnsupportedOpError(f"batch_dims {batch_dims} for axis {axis} and indices "
                                 f"{list(indices.shape)}")
    if indices.size and (indices.min() < 0 or indices.max() >= x.shape[axis]):
        raise UnsupportedOpError(f"indices outside [0, {x.shape[axis]})")
    _expect_shape(out, (*x.shape[:axis], *indices.shape[batch_dims:], *x.shape[axis + 1:]))
    batch = int(np.prod(batch_shape, dtype=np.int64))
    per_batch = indices.reshape(batch, -1)
    per_batch.flags.writeable = False
    return GatherParams(
        batch=batch,
        outer=int(np.prod(x.shape[batch_dims:axis], dtype=np.int64)),
        axis_size=x.shape[axis],
        inner=int(np.prod(x.shape[axis + 1:], dtype=np.int64)),
        indices=per_batch,
    )




TEMPLATE = "c/shape.c.j2"
OFFSET_TYPE = "int32_t"  # GATHER's table of input offsets (the reader bounds tensors below 2^31)


def _at(pointer: str, index: str) -> str:
    """Address of element `index` of `pointer`."""
    return pointer if index == "0" else f"&{pointer}[{index}]"


def _row_major(shape: Sequence[int]) -> list[int]:
    """Element strides of a contiguous tensor of `shape`."""
    return [math.prod(shape[i + 1:]) for i in range(len(shape))]


def _element_bytes(t: CTensor) -> int:
    return np.dtype(t.dtype).itemsize


def _literal(value: int | float, dtype: str) -> str:
    """A C constant of `dtype` holding `value`."""
    if dtype == "float32":
        if math.isnan(value):
            return "-NAN" if math.copysign(1.0, value) < 0 else "NAN"
        return c_float(value)
    if dtype == "int64" and int(value) == -(2**63):
        return "INT64_MIN"
    return c_int32(value) if dtype == "int32" else str(int(value))


# --- operands -----------------------------------------------------------------------------


def _data_positions(ctx: OpContext) -> list[int]:
    """Positions of the inputs whose values the op moves; the others are resolved constants."""
    if ctx.op.opcode in ("CONCATENATION", "PACK"):
        return list(range(len(ctx.inputs)))
    return [1] if ctx.op.opcode == "SPLIT" else [0]


def _in_name(ctx: OpContext, k: int) -> str:
    """C name of the k-th data input: x, or x0, x1, ... when there are several."""
    return "x" if len(_data_positions(ctx)) == 1 else f"x{k}"


def _out_name(ctx: OpContext, k: int) -> str:
    return "o" if len(ctx.outputs) == 1 else f"o{k}"


def _render(macro: str, values: dict) -> Kernel:
    return Kernel(render_macro(TEMPLATE, macro, values))


def _base(ctx: OpContext) -> dict:
    outs = ", ".join(f"'{t.name}'{list(t.shape)}" for t in ctx.outputs)
    return {
        "fn": ctx.fn,
        "comment": c_comment(f"{ctx.op.opcode} {ctx.outputs[0].dtype} -> {outs}"),
    }


# --- RESHAPE, SQUEEZE, EXPAND_DIMS --------------------------------------------------------


def emit_reshape(ctx: OpContext) -> Kernel:
    x, out = ctx.inputs[0], ctx.outputs[0]
    values = _base(ctx)
    nbytes = x.size * _element_bytes(x)
    values.update(ctype=x.ctype, x=x.ptr, out=out.ptr, nbytes=nbytes, moves=nbytes > 0)
    return _render("reshape", values)


# --- loop nests of block copies -----------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """Copy `run` contiguous elements from `src` to `dst` (C names) at every point of a loop
    nest; each loop advances dst and src by its stride here, in elements. `src_table`, if set,
    is a C expression (a table look-up) added to the source offset."""

    dst: str
    src: str
    run: int
    dst_strides: tuple[int, ...]
    src_strides: tuple[int, ...]
    dst_offset: int = 0
    src_offset: int = 0
    src_table: str = ""


def simplify(counts: Sequence[int], moves: Sequence[Move]) -> tuple[list[int], list[Move]]:
    """The fewest loops doing the same copies: size-1 loops vanish, a loop whose strides are its
    inner neighbour's times that one's count merges with it, and an innermost loop that steps
    every move by its run lengthens the runs. No loops and no moves if nothing is copied."""
    moves = [m for m in moves if m.run]
    if not moves or 0 in counts:
        return [], []
    loops: list[tuple[int, list[tuple[int, int]]]] = []  # (count, (dst, src) stride per move)
    for i, count in enumerate(counts):
        if count == 1:
            continue
        strides = [(m.dst_strides[i], m.src_strides[i]) for m in moves]
        if loops and loops[-1][1] == [(d * count, s * count) for d, s in strides]:
            loops[-1] = (loops[-1][0] * count, strides)
        else:
            loops.append((count, strides))
    runs = [m.run for m in moves]
    while loops and all(stride == (r, r) for stride, r in zip(loops[-1][1], runs)):
        count, _ = loops.pop()
        runs = [r * count for r in runs]
    return [c for c, _ in loops], [
        Move(m.dst, m.src, run, tuple(s[k][0] for _, s in loops),
             tuple(s[k][1] for _, s in loops), m.dst_offset, m.src_offset, m.src_table)
        for k, (m, run) in enumerate(zip(moves, runs))
    ]


def _loops(counts: Sequence[int]) -> list[dict]:
    """Plain loops: variable i<k> runs over [0, counts[k])."""
    return [{"var": f"i{k}", "start": "0", "end": str(c), "step": f"++i{k}"}
            for k, c in enumerate(counts)]


def _nest(ctx: OpContext, counts: Sequence[int], moves: Sequence[Move],
          tables: Sequence[dict] = (), loops: Sequence[dict] | None = None) -> Kernel:
    """Render a loop nest over `counts` doing every move at each point, in order. The moves
    index with i<k> for loop k; `loops` may lay those loops out differently (tiled)."""
    loop_vars = [f"i{k}" for k in range(len(counts))]
    loops = list(_loops(counts) if loops is None else loops) if moves else []
    element_bytes = _element_bytes(ctx.outputs[0])
    rows = []
    for m in moves:
        dst = c_sum(list(zip(loop_vars, m.dst_strides)), m.dst_offset)
        src = c_sum(list(zip(loop_vars, m.src_strides)), m.src_offset)
        if m.src_table:
            src = m.src_table if src == "0" else f"{m.src_table} + {src}"
        rows.append({
            "dst": f"{m.dst}[{dst}]",
            "src": f"{m.src}[{src}]",
            "dst_at": _at(m.dst, dst),
            "src_at": _at(m.src, src),
            "bytes": m.run * element_bytes,
            "run": m.run > 1,  # a memcpy of the run, else one element's assignment
        })
    used = {m.dst for m in moves} | {m.src for m in moves}
    data = [ctx.inputs[p] for p in _data_positions(ctx)]
    pointers = [
        {"decl": f"const {t.ctype} *{_in_name(ctx, k)}", "expr": t.ptr}
        for k, t in enumerate(data) if _in_name(ctx, k) in used
    ] + [
        {"decl": f"{t.ctype} *{_out_name(ctx, k)}", "expr": t.ptr}
        for k, t in enumerate(ctx.outputs) if _out_name(ctx, k) in used
    ]
    values = _base(ctx)
    values.update(
        tables=list(tables) if moves else [],
        pointers=pointers,
        loop_vars=sorted(loop["var"] for loop in loops),
        loops=[{**loop, "indent": "  " * k} for k, loop in enumerate(loops)],
        indent="  " * len(loops),
        moves=rows,
    )
    return _render("copy", values)


# Least size in bytes, per element size, from which a transpose is tiled. Measured on a desktop
# host: below these the straight loop is as fast; above, tiles run 1.5-3x faster.
TILE_MIN_BYTES = {1: 256 * 1024, 2: 64 * 1024}
TILE_MIN_BYTES_WIDE = 16 * 1024
TILES = (16, 8)


def _tiled(counts: Sequence[int], move: Move, nbytes: int, element_bytes: int) -> list | None:
    """Loops of a transpose in square tiles: the innermost loop (contiguous in the output) and
    the loop contiguous in the input go in TILE x TILE blocks, so that both sides of a tile
    stay in cache. None when the input side is already contiguous, the tensor is small or no
    tile divides both counts."""
    inner = len(counts) - 1
    a = next((k for k, s in enumerate(move.src_strides) if s == 1), None)
    least = TILE_MIN_BYTES.get(element_bytes, TILE_MIN_BYTES_WIDE)
    if a is None or a == inner or move.run != 1 or nbytes < least:
        return None
    tile = next((t for t in TILES if counts[a] % t == 0 and counts[inner] % t == 0), None)
    if tile is None:
        return None
    plain = _loops(counts)
    split = [k for k in (a, inner) if counts[k] > tile]  # a count of one tile needs no split
    tiles = [{"var": f"t{k}", "start": "0", "end": str(counts[k]), "step": f"t{k} += {tile}"}
             for k in split]
    within = [{"var": f"i{k}", "start": f"t{k}", "end": f"t{k} + {tile}", "step": f"++i{k}"}
              if k in split else plain[k] for k in (a, inner)]
    return [loop for k, loop in enumerate(plain) if k not in (a, inner)] + tiles + within


# --- TRANSPOSE, SLICE, STRIDED_SLICE ------------------------------------------------------


def emit_transpose(ctx: OpContext) -> Kernel:
    """Walk the output in order (in tiles if large); output axis i steps the input along axis
    perm[i]."""
    p: TransposeParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    x_strides = _row_major(x.shape)
    move = Move("o", "x", 1, tuple(_row_major(out.shape)), tuple(x_strides[a] for a in p.perm))
    counts, moves = simplify(out.shape, [move])
    nbytes = out.size * _element_bytes(out)
    loops = _tiled(counts, moves[0], nbytes, _element_bytes(out)) if moves else None
    return _nest(ctx, counts, moves, loops=loops)


def emit_slice(ctx: OpContext) -> Kernel:
    """SLICE and STRIDED_SLICE: walk the output in order; element k along axis i is input index
    begin[i] + k * strides[i]. New axes have size 1 and shrunk axes count 1, so neither
    adds a loop."""
    p: SliceParams = ctx.params
    x_strides = _row_major(p.input_shape)
    move = Move("o", "x", 1, tuple(_row_major(p.counts)),
                tuple(s * step for s, step in zip(x_strides, p.strides)),
                src_offset=sum(b * s for b, s in zip(p.begin, x_strides)))
    return _nest(ctx, *simplify(p.counts, [move]))


# --- CONCATENATION, PACK, SPLIT, SPLIT_V, UNPACK ------------------------------------------


def _join(ctx: OpContext, shape: Sequence[int], axis: int, extents: Sequence[int],
          split: bool) -> Kernel:
    """The whole tensor of `shape` seen as [outer, row], each part as [outer, extent * inner]:
    one loop over outer copies each part's block into the row in turn (concatenation) or out
    of it in turn (split)."""
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    row = sum(extents) * inner
    moves, offset = [], 0
    for k, extent in enumerate(extents):
        block = extent * inner
        if split:
            moves.append(Move(_out_name(ctx, k), "x", block, (block,), (row,), 0, offset))
        else:
            moves.append(Move("o", _in_name(ctx, k), block, (row,), (block,), offset, 0))
        offset += block
    return _nest(ctx, *simplify([outer], moves))


def emit_concatenation(ctx: OpContext) -> Kernel:
    p: ConcatenationParams = ctx.params
    extents = [t.shape[p.axis] for t in ctx.inputs]
    if any(p.rescales):
        return _concatenation_rescaled(ctx, p, extents)
    return _join(ctx, ctx.outputs[0].shape, p.axis, extents, False)


# TFLite's float32 arithmetic, which the helper repeats statement by statement.
_RESCALE_NOTE = (
    "TFLite's ConcatenationWithScaling: round(q * scale + bias) in float32, halves away from "
    "zero, plus the output zero point, clamped to uint8. The product and the sum are separate "
    "statements, so no compiler fuses them; the value lies within int32 (checked when "
    "generating), where value - t is exact.")


def _concatenation_rescaled(ctx: OpContext, p: ConcatenationParams,
                            extents: Sequence[int]) -> Kernel:
    """uint8 with some inputs rescaled: one loop over the outer dimensions; in it each input's
    block is copied, or rescaled element by element through the op's helper."""
    out = ctx.outputs[0]
    outer = math.prod(out.shape[:p.axis])
    inner = math.prod(out.shape[p.axis + 1:])
    row = sum(extents) * inner
    each_outer = ConstantLoop("i0", outer)
    helper = f"{ctx.prefix}_rescale"
    zero_point = next(r.zero_point for r in p.rescales if r)
    parts, pointers, offset = [], [], 0
    for k, (t, extent, rescale) in enumerate(zip(ctx.inputs, extents, p.rescales)):
        block = extent * inner
        if block and out.size:
            name = _in_name(ctx, k)
            pointers.append(f"const uint8_t *{name} = {t.ptr};")
            dst = c_sum([(each_outer, row)], offset)
            src = c_sum([(each_outer, block)])
            if rescale is None:
                parts.append({"copies": True, "dst_at": _at("o", dst), "src_at": _at(name, src),
                              "bytes": block})
            else:
                each = ConstantLoop("k", block)
                at = c_sum([(each_outer, row), (each, 1)], offset)
                from_at = c_sum([(each_outer, block), (each, 1)])
                parts.append({"copies": False, "each": each, "dst": f"o[{at}]",
                              "value": f"{helper}({name}[{from_at}], {c_float(rescale.scale)}, "
                                       f"{c_float(rescale.bias)})"})
        offset += block
    values = _base(ctx)
    values.update(
        helper=helper, note=c_comment(_RESCALE_NOTE), empty=not parts,
        plus_zero_point=f" + {zero_point}" if zero_point else "",
        out=out.ptr, pointers=pointers, outer=each_outer, parts=parts,
        counters=", ".join([*(["i0"] if each_outer.written else []),
                            *(["k"] if any(not q["copies"] and q["each"].written
                                           for q in parts) else [])]),
    )
    return _render("concatenation_rescaled", values)


def emit_pack(ctx: OpContext) -> Kernel:
    """PACK concatenates size-1 slabs along the new axis."""
    p: AxisParams = ctx.params
    return _join(ctx, ctx.outputs[0].shape, p.axis, [1] * len(ctx.inputs), False)


def emit_split(ctx: OpContext) -> Kernel:
    """SPLIT and SPLIT_V."""
    p: SplitParams = ctx.params
    return _join(ctx, ctx.inputs[_data_positions(ctx)[0]].shape, p.axis, p.sizes, True)


def emit_unpack(ctx: OpContext) -> Kernel:
    """UNPACK splits into size-1 slabs that drop the axis."""
    p: AxisParams = ctx.params
    x = ctx.inputs[0]
    return _join(ctx, x.shape, p.axis, [1] * x.shape[p.axis], True)


# --- GATHER -------------------------------------------------------------------------------


def emit_gather(ctx: OpContext) -> Kernel:
    """Walk the output [batch, outer, index, inner] in order; a constant table holds, per
    (batch, index), the input offset of the picked block of `inner` elements."""
    p: GatherParams = ctx.params
    batch, count = p.indices.shape
    if 0 in (p.outer, p.inner, batch, count):
        return _nest(ctx, [], [])
    table = f"{ctx.prefix}_src"
    offsets = [(b * p.outer * p.axis_size + int(i)) * p.inner
               for b in range(batch) for i in p.indices[b]]
    # (name, count, output stride, input stride besides the table's offset), size 1 dropped
    loops = [loop for loop in (
        ("b", batch, p.outer * count * p.inner, 0),
        ("o", p.outer, count * p.inner, p.axis_size * p.inner),
        ("j", count, p.inner, 0),
    ) if loop[1] != 1]
    var = {loop[0]: f"i{k}" for k, loop in enumerate(loops)}
    look_up = c_sum([(var[n], s) for n, s in (("b", count), ("j", 1)) if n in var])
    move = Move("o", "x", p.inner, tuple(loop[2] for loop in loops),
                tuple(loop[3] for loop in loops), src_table=f"{table}[{look_up}]")
    tables = [{"name": table, "ctype": OFFSET_TYPE, "length": c_length(len(offsets)),
               "init": c_array(offsets)}]
    return _nest(ctx, [loop[1] for loop in loops], [move], tables)


# --- PAD, PADV2 ---------------------------------------------------------------------------


def pad_dims(shape: Sequence[int], paddings: Sequence[tuple[int, int]]) -> list[tuple[int, ...]]:
    """(extent, before, after) per dimension, fewest dimensions: an unpadded size-1 dimension
    vanishes and an unpadded dimension merges into its outer neighbour."""
    dims: list[tuple[int, ...]] = []
    for extent, (before, after) in zip(shape, paddings):
        if before or after or not dims:
            if extent != 1 or before or after:
                dims.append((extent, before, after))
        else:
            dims[-1] = tuple(d * extent for d in dims[-1])
    return dims or [(1, 0, 0)]


def emit_pad(ctx: OpContext) -> Kernel:
    """Write the output in order: each level fills its border block before, then its interior
    (a loop over the next level, or at the innermost level one copy of an input row), then
    its border block after."""
    p: PadParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    values = _base(ctx)
    values.update(ctype=out.ctype, out=out.ptr, x=x.ptr, value=_literal(p.value, out.dtype),
                  levels=[], loop_vars=[], row=None, uses_k=False)
    if out.size == 0:
        return _render("pad", values)
    dims = [(0, out.size, 0)] if x.size == 0 else pad_dims(x.shape, p.paddings)
    out_strides = _row_major([sum(d) for d in dims])
    x_strides = _row_major([d[0] for d in dims])

    def fill(terms: list[tuple[str, int]], start: int, count: int) -> dict:
        if count > 1:
            values["uses_k"] = True
        return {"count": count, "repeated": count > 1,
                "dst": f"o[{c_sum([*terms, ('k', int(count > 1))], start)}]"}

    terms: list[tuple[str, int]] = []  # the current block's output offset: sum of these...
    start = 0  # ... plus this
    src_terms: list[tuple[str, int]] = []
    indent = ""
    for level, ((extent, before, after), so, sx) in enumerate(zip(dims, out_strides, x_strides)):
        borders = {
            "before": fill(terms, start, before * so) if before else None,
            "after": fill(terms, start + (before + extent) * so, after * so) if after else None,
        }
        if level == len(dims) - 1:  # so == sx == 1
            dst, src = c_sum(terms, start + before), c_sum(src_terms)
            values["row"] = {**borders, "count": extent, "bytes": extent * _element_bytes(out),
                             "copies": extent > 1, "single": extent == 1,
                             "dst": f"o[{dst}]", "src": f"x[{src}]",
                             "dst_at": _at("o", dst), "src_at": _at("x", src)}
        else:  # a loop over the interior, none if it is one block
            var = f"i{len(terms)}" if extent > 1 else ""
            values["levels"].append({**borders, "var": var, "count": extent, "indent": indent})
            start += before * so
            if var:
                terms, src_terms = [*terms, (var, so)], [*src_terms, (var, sx)]
                indent += "  "
    values["indent"] = indent
    values["loop_vars"] = [name for name, _ in terms]
    return _render("pad", values)


# Index inputs (shapes, paddings, begins, axes, ...) are int32 or int64, as TFLite allows.
_MOVED = {"T": MOVED_DTYPES}
_ALIASED = {"T": ALIASED_DTYPES}

SPECS: tuple[OpSpec, ...] = (
    OpSpec("RESHAPE", kernels("T, I? -> T", **_ALIASED, I=INDEX_DTYPES), prepare_reshape,
           emit_reshape, overlaps=overlaps.alias),
    OpSpec("SQUEEZE", kernels("T -> T", **_ALIASED), prepare_squeeze, emit_reshape,
           overlaps=overlaps.alias),
    OpSpec("EXPAND_DIMS", kernels("T, I -> T", **_ALIASED, I=INDEX_DTYPES), prepare_expand_dims,
           emit_reshape, overlaps=overlaps.alias),
    OpSpec("PAD", kernels("T, I -> T", **_MOVED, I=INDEX_DTYPES), prepare_pad, emit_pad),
    OpSpec("PADV2", kernels("T, I, T? -> T", **_MOVED, I=INDEX_DTYPES), prepare_pad, emit_pad),
    OpSpec("CONCATENATION", kernels("T... -> T", **_MOVED), prepare_concatenation,
           emit_concatenation),
    OpSpec("PACK", kernels("T... -> T", **_MOVED), prepare_pack, emit_pack),
    OpSpec("UNPACK", kernels("T -> T...", T=MOVED_DTYPES - {"int64"}), prepare_unpack,
           emit_unpack),
    OpSpec("SPLIT", kernels("int32, T -> T...", **_MOVED), prepare_split, emit_split),
    OpSpec("SPLIT_V", kernels("T, I, int32 -> T...", **_MOVED, I=INDEX_DTYPES), prepare_split_v,
           emit_split),
    OpSpec("TRANSPOSE", kernels("T, I -> T", **_MOVED, I=INDEX_DTYPES), prepare_transpose,
           emit_transpose),
    OpSpec("SLICE", kernels("T, I, I -> T", **_MOVED, I=INDEX_DTYPES), prepare_slice, emit_slice),
    OpSpec("STRIDED_SLICE", kernels("T, I, I, I -> T", **_MOVED, I=INDEX_DTYPES),
           prepare_strided_slice, emit_slice),
    OpSpec("GATHER", kernels("T, I -> T", **_MOVED, I=("int16", *INDEX_DTYPES)), prepare_gather,
           emit_gather),
)
