"""Params for the shape and data-movement family: ops that move stored values.

An int8 element is copied as its stored integer even where the output's quantization differs
(TFLite's reference kernels do the same). TFLite refuses a quantization mismatch only for
CONCATENATION (int8), PACK, UNPACK and EXPAND_DIMS; prepare refuses the same models. The one
op that changes values is uint8 CONCATENATION, which rescales an input quantized unlike the
output in float32, as TFLite does. Everything TFLite derives from constant index tensors
(slice bounds, split sizes, gather indices, pad values) is resolved here once, so a backend
only copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.numerics.quant import require_int16_zero_points, zero_point_of
from toolchain.ops.spec import required_input, required_options

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
class MirrorPadParams:
    """MIRROR_PAD: (before, after) per axis of `input_shape`; a border mirrors the tensor at its
    edge, the edge element repeated (SYMMETRIC, `offset` 0) or not (REFLECT, `offset` 1)."""

    input_shape: tuple[int, ...]
    paddings: tuple[tuple[int, int], ...]
    offset: int

    def source(self, axis: int, position: int) -> int:
        """The input index along `axis` that output index `position` copies."""
        index = position - self.paddings[axis][0]
        extent = self.input_shape[axis]
        if index < 0:
            return self.offset - 1 - index
        if index >= extent:
            return 2 * extent - 1 - self.offset - index
        return index


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
    """TRANSPOSE: output axis i is input axis perm[i]. DEPTH_TO_SPACE and SPACE_TO_DEPTH are
    transposes of a `view` of their input (its shape split into blocks); None: the input's own
    shape."""

    perm: tuple[int, ...]
    view: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SliceParams:
    """SLICE, STRIDED_SLICE (and REVERSE_V2, BROADCAST_TO): element k along axis i is input
    index begin[i] + k * strides[i], for k < counts[i] (a stride of 0 repeats one element).

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


def _paddings(graph: Graph, op: Operator, x: Tensor, out: Tensor
              ) -> tuple[tuple[int, int], ...]:
    """The constant paddings, (before, after) per axis, checked against the output's shape."""
    rank = len(x.shape)
    paddings = _constant(graph, op, 1, "paddings")
    if paddings.shape != (rank, 2) or (paddings < 0).any():
        raise UnsupportedOpError(f"paddings must be non-negative [{rank}, 2], got "
                                 f"{paddings.tolist()}")
    pairs = tuple((int(before), int(after)) for before, after in paddings)
    _expect_shape(out, tuple(d + before + after for d, (before, after) in zip(x.shape, pairs,
                                                                              strict=True)))
    return pairs


def prepare_pad(graph: Graph, op: Operator) -> PadParams:
    x = _moved(required_input(graph, op, 0, "input"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    if len(x.shape) > MAX_PAD_RANK:
        raise UnsupportedOpError(f"rank {len(x.shape)} (TFLite pads up to {MAX_PAD_RANK})")
    return PadParams(_paddings(graph, op, x, out), _pad_value(graph, op, x, out))


def prepare_mirror_pad(graph: Graph, op: Operator) -> MirrorPadParams:
    """A border may be as wide as the dimension (SYMMETRIC) or one less (REFLECT), as
    TensorFlow's MirrorPad allows: wider, LiteRT's kernel would repeat the far edge instead of
    mirroring again."""
    x = _moved(required_input(graph, op, 0, "input"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    pairs = _paddings(graph, op, x, out)
    mode = str(op.options.get("mode", "REFLECT"))
    offset = 1 if mode == "REFLECT" else 0
    for extent, pair in zip(x.shape, pairs, strict=True):
        if max(pair) > extent - offset:
            raise UnsupportedOpError(f"{mode} padding {max(pair)} of a dimension of {extent} "
                                     f"(at most {extent - offset})")
    return MirrorPadParams(tuple(x.shape), pairs, offset)


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
    for out, size in zip(outs, sizes, strict=True):
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


# DEPTH_TO_SPACE and SPACE_TO_DEPTH, NHWC with block b, as a transpose of a six-axis view:
# output[n, h*b + i, w*b + j, c] = input[n, h, w, (i*b + j)*C' + c] views the input as
# [N, H, W, b, b, C'] and walks it as [N, H, b, W, b, C']; SPACE_TO_DEPTH views it as
# [N, H', b, W', b, C] and walks it as [N, H', W', b, b, C]. Both swap axes 2 and 3.
BLOCK_PERM = (0, 1, 3, 2, 4, 5)


def prepare_depth_to_space(graph: Graph, op: Operator) -> TransposeParams:
    x = _moved(required_input(graph, op, 0, "input"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    block = _block_size(op, x)
    n, h, w, c = x.shape
    if c % (block * block):
        raise ModelError(f"depth {c} is not a multiple of block_size {block} squared")
    depth = c // (block * block)
    _expect_shape(out, (n, h * block, w * block, depth))
    return TransposeParams(BLOCK_PERM, (n, h, w, block, block, depth))


def prepare_space_to_depth(graph: Graph, op: Operator) -> TransposeParams:
    x = _moved(required_input(graph, op, 0, "input"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    block = _block_size(op, x)
    n, h, w, c = x.shape
    if h % block or w % block:
        raise ModelError(f"height {h} and width {w} are not multiples of block_size {block}")
    _expect_shape(out, (n, h // block, w // block, c * block * block))
    return TransposeParams(BLOCK_PERM, (n, h // block, block, w // block, block, c))


def _block_size(op: Operator, x: Tensor) -> int:
    if len(x.shape) != 4:
        raise UnsupportedOpError(f"input of rank {len(x.shape)}: {op.opcode} takes NHWC")
    block = int(required_options(op, "block_size")["block_size"])
    if block < 1:
        raise ModelError(f"block_size {block}")
    return block


# SPACE_TO_BATCH_ND and BATCH_TO_SPACE_ND (NHWC, block [bh, bw]) without padding or crops, as
# transposes of six-axis views: SPACE_TO_BATCH_ND views [B, H*bh, W*bw, C] as
# [B, H, bh, W, bw, C] and walks it as [bh, bw, B, H, W, C]; BATCH_TO_SPACE_ND views
# [bh*bw*B, H, W, C] as [bh, bw, B, H, W, C] and walks it as [B, H, bh, W, bw, C].
SPACE_TO_BATCH_PERM = (2, 4, 0, 1, 3, 5)
BATCH_TO_SPACE_PERM = (2, 3, 0, 4, 1, 5)

Edges = tuple[tuple[int, int], tuple[int, int]]


@dataclass(frozen=True)
class BlockParams:
    """SPACE_TO_BATCH_ND with paddings, BATCH_TO_SPACE_ND with crops (NHWC): the input's
    `shape` [N, H, W, C], the `block` [bh, bw] and the `edges` ((top, bottom), (left, right)):
    rows and columns added around the input before its blocks move, or taken off the result
    after. A padded element is `pad_byte` in every byte (TFLite's memset of the output's zero
    point: 0 but for int8 and uint8)."""

    shape: tuple[int, int, int, int]
    block: tuple[int, int]
    edges: Edges
    pad_byte: int = 0


def _blocks(graph: Graph, op: Operator, x: Tensor, what: str) -> tuple[int, int, Edges]:
    """The block shape and the paddings or crops (input 2) of a rank-4 input."""
    if len(x.shape) != 4:
        raise UnsupportedOpError(f"input of rank {len(x.shape)}: arenac takes NHWC")
    block = [int(b) for b in _constant(graph, op, 1, "block_shape", ("int32",)).reshape(-1)]
    if len(block) != 2 or min(block) < 1:
        raise ModelError(f"block_shape {block} for two spatial dimensions")
    edges = _constant(graph, op, 2, what, ("int32",)).reshape(-1)
    if edges.size != 4:
        raise ModelError(f"{what} of {edges.size} values for two spatial dimensions")
    if (edges < 0).any():
        raise ModelError(f"{what} {edges.reshape(2, 2).tolist()} are negative")
    top, bottom, left, right = (int(e) for e in edges)
    return block[0], block[1], ((top, bottom), (left, right))


def prepare_space_to_batch(graph: Graph, op: Operator) -> TransposeParams | BlockParams:
    x = _moved(required_input(graph, op, 0, "input"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    bh, bw, edges = _blocks(graph, op, x, "paddings")
    n, h, w, c = x.shape
    (top, bottom), (left, right) = edges
    h, w = h + top + bottom, w + left + right  # padded
    if h % bh or w % bw:
        raise ModelError(f"padded height {h} and width {w} are not multiples of the block "
                         f"{bh}x{bw}")
    _expect_shape(out, (bh * bw * n, h // bh, w // bw, c))
    if edges == ((0, 0), (0, 0)):
        return TransposeParams(SPACE_TO_BATCH_PERM, (n, h // bh, bh, w // bw, bw, c))
    q = out.quantization
    zero_point = q.zero_point[0] if q and q.zero_point and x.dtype in ("int8", "uint8") else 0
    return BlockParams(x.shape, (bh, bw), edges, int(zero_point) & 0xFF)


def prepare_batch_to_space(graph: Graph, op: Operator) -> TransposeParams | BlockParams:
    x = _moved(required_input(graph, op, 0, "input"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    bh, bw, edges = _blocks(graph, op, x, "crops")
    n, h, w, c = x.shape
    (top, bottom), (left, right) = edges
    if n % (bh * bw):
        raise ModelError(f"batch {n} is not a multiple of the block {bh}x{bw}")
    if top + bottom >= h * bh or left + right >= w * bw:
        raise ModelError(f"crops {[list(e) for e in edges]} leave nothing of the "
                         f"{h * bh}x{w * bw} result")
    _expect_shape(out, (n // (bh * bw), h * bh - top - bottom, w * bw - left - right, c))
    if edges == ((0, 0), (0, 0)):
        return TransposeParams(BATCH_TO_SPACE_PERM, (bh, bw, n // (bh * bw), h, w, c))
    return BlockParams(x.shape, (bh, bw), edges)


# --- REVERSE_V2 ---------------------------------------------------------------------------


def prepare_reverse(graph: Graph, op: Operator) -> SliceParams:
    """A strided slice of the whole input that walks the given axes backwards (distinct and
    contiguous ones, as TFLite's kernels take them)."""
    x = _moved(required_input(graph, op, 0, "input"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    _expect_shape(out, x.shape)
    rank = len(x.shape)
    axes = [int(a) for a in _constant(graph, op, 1, "axis").reshape(-1)]
    if any(not -rank <= a < rank for a in axes):
        raise UnsupportedOpError(f"axis {axes} for rank {rank}")
    backwards = {a % rank for a in axes}
    if len(backwards) != len(axes) or (axes and max(backwards) - min(backwards) >= len(axes)):
        raise UnsupportedOpError(f"axes {axes}: TFLite reverses distinct contiguous axes only")
    begin = tuple(d - 1 if i in backwards and d else 0 for i, d in enumerate(x.shape))
    strides = tuple(-1 if i in backwards else 1 for i in range(rank))
    return SliceParams(x.shape, begin, strides, x.shape)


# --- BROADCAST_TO -------------------------------------------------------------------------

# TFLite's broadcast_to kernel takes up to this many dimensions.
MAX_BROADCAST_TO_RANK = 8


def prepare_broadcast_to(graph: Graph, op: Operator) -> SliceParams:
    """A slice of stride 0 along every axis the input has as 1 and the output wider (the
    input's shape aligned right, as numpy's and TFLite's broadcasting align it)."""
    x = _moved(required_input(graph, op, 0, "input"))
    (out,) = _outputs(graph, op, x.dtype, 1)
    shape = tuple(int(d) for d in _constant(graph, op, 1, "shape").reshape(-1))
    if len(shape) > MAX_BROADCAST_TO_RANK or len(x.shape) > len(shape):
        raise UnsupportedOpError(f"input {list(x.shape)} to shape {list(shape)} (TFLite "
                                 f"broadcasts to at most {MAX_BROADCAST_TO_RANK} dimensions, "
                                 "none fewer than the input's)")
    aligned = (1,) * (len(shape) - len(x.shape)) + tuple(x.shape)
    if any(a not in (1, d) for a, d in zip(aligned, shape, strict=True)):
        raise ModelError(f"input shape {list(x.shape)} does not broadcast to {list(shape)}")
    _expect_shape(out, shape)
    strides = tuple(0 if a == 1 and d != 1 else 1 for a, d in zip(aligned, shape, strict=True))
    return SliceParams(aligned, (0,) * len(shape), strides, shape)


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
    counts = [d - b if s == -1 else s for d, b, s in zip(x.shape, begin, size, strict=True)]
    if any(b < 0 or c < 0 or b + c > d for d, b, c in zip(x.shape, begin, counts, strict=True)):
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
    for i, (spec, (_, count)) in enumerate(zip(specs, resolved, strict=True)):
        tflite_count = _tflite_output_size(spec, offset, count)
        if count != tflite_count:
            raise UnsupportedOpError(f"axis {i}: TFLite sizes the output {tflite_count} but "
                                     f"its loop writes {count} elements")
    _expect_shape(out, [count for spec, (_, count) in zip(specs, resolved,
                                                          strict=True) if not spec.shrink])
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
