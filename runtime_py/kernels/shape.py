"""numpy kernels for the shape family: copies of stored values, laid out as the params say
(uint8 CONCATENATION also rescales inputs quantized unlike its output).

Every index was resolved and checked in toolchain.ops.shape.prepare, so each kernel is one numpy
expression whose whole result exists before an output is written (numpy also buffers an
assignment from a view that overlaps its target, as a reshape's view of its input would).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from toolchain.ops.shape.prepare import (
    AxisParams,
    BlockParams,
    ConcatenationParams,
    GatherParams,
    MirrorPadParams,
    PadParams,
    Rescale,
    ReshapeParams,
    SliceParams,
    SplitParams,
    TransposeParams,
)

Arrays = list[np.ndarray]


def _write(outputs: Arrays, results: Sequence[np.ndarray]) -> None:
    for out, result in zip(outputs, results, strict=True):
        out[...] = result


def reshape(params: ReshapeParams, inputs: Arrays, outputs: Arrays) -> None:
    outputs[0][...] = inputs[0].reshape(params.shape)


def pad(params: PadParams, inputs: Arrays, outputs: Arrays) -> None:
    outputs[0][...] = np.pad(inputs[0], params.paddings, constant_values=params.value)


def _rescaled(rescale: Rescale | None, x: np.ndarray) -> np.ndarray:
    """TFLite's ConcatenationWithScaling of one uint8 input, in float32 (float64 holds each
    float32 value + 0.5 exactly, so the rounding half away from zero rounds once)."""
    if rescale is None:
        return x
    value = (x.astype(np.float32) * np.float32(rescale.scale) + np.float32(rescale.bias))
    wide = value.astype(np.float64)
    rounded = np.copysign(np.floor(np.abs(wide) + 0.5), wide).astype(np.int64)
    return np.clip(rounded + rescale.zero_point, 0, 255)


def concatenation(params: ConcatenationParams, inputs: Arrays, outputs: Arrays) -> None:
    parts = [_rescaled(r, x) for r, x in zip(params.rescales, inputs, strict=True)]
    outputs[0][...] = np.concatenate(parts, axis=params.axis).astype(outputs[0].dtype)


def pack(params: AxisParams, inputs: Arrays, outputs: Arrays) -> None:
    outputs[0][...] = np.stack(inputs, axis=params.axis)


def unpack(params: AxisParams, inputs: Arrays, outputs: Arrays) -> None:
    _write(outputs, np.moveaxis(inputs[0], params.axis, 0).copy())


def _split_along(params: SplitParams, x: np.ndarray, outputs: Arrays) -> None:
    boundaries = np.cumsum(params.sizes)[:-1]
    _write(outputs, [part.copy() for part in np.split(x, boundaries, axis=params.axis)])


def split(params: SplitParams, inputs: Arrays, outputs: Arrays) -> None:
    """SPLIT's value is its second input (the first is the axis)."""
    _split_along(params, inputs[1], outputs)


def split_v(params: SplitParams, inputs: Arrays, outputs: Arrays) -> None:
    _split_along(params, inputs[0], outputs)


def transpose(params: TransposeParams, inputs: Arrays, outputs: Arrays) -> None:
    """Also DEPTH_TO_SPACE and SPACE_TO_DEPTH, and SPACE_TO_BATCH_ND and BATCH_TO_SPACE_ND
    without paddings or crops: the transpose of a view of the input."""
    x = inputs[0] if params.view is None else inputs[0].reshape(params.view)
    outputs[0][...] = np.transpose(x, params.perm).reshape(outputs[0].shape)


def space_to_batch(params: TransposeParams | BlockParams, inputs: Arrays,
                   outputs: Arrays) -> None:
    """The input padded (each padded byte `pad_byte`), then its blocks moved into the batch."""
    if isinstance(params, TransposeParams):
        return transpose(params, inputs, outputs)
    x = inputs[0]
    (top, bottom), (left, right) = params.edges
    fill = np.frombuffer(bytes([params.pad_byte]) * x.dtype.itemsize, x.dtype)[0]
    padded = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=fill)
    n, h, w, c = padded.shape
    bh, bw = params.block
    blocks = padded.reshape(n, h // bh, bh, w // bw, bw, c).transpose(2, 4, 0, 1, 3, 5)
    outputs[0][...] = blocks.reshape(outputs[0].shape)
    return None


def batch_to_space(params: TransposeParams | BlockParams, inputs: Arrays,
                   outputs: Arrays) -> None:
    """The batch's blocks moved back into space, then the crops taken off."""
    if isinstance(params, TransposeParams):
        return transpose(params, inputs, outputs)
    n, h, w, c = params.shape
    bh, bw = params.block
    (top, bottom), (left, right) = params.edges
    whole = (inputs[0].reshape(bh, bw, n // (bh * bw), h, w, c).transpose(2, 3, 0, 4, 1, 5)
             .reshape(n // (bh * bw), h * bh, w * bw, c))
    outputs[0][...] = whole[:, top:h * bh - bottom, left:w * bw - right]
    return None


def strided_slice(params: SliceParams, inputs: Arrays, outputs: Arrays) -> None:
    """Pick begin + k * stride along every axis (negative strides walk backwards, a stride of
    0 repeats one element)."""
    x = inputs[0].reshape(params.input_shape)
    picks = [begin + np.arange(count) * stride
             for begin, stride, count in zip(params.begin, params.strides, params.counts,
                                             strict=True)]
    outputs[0][...] = x[np.ix_(*picks)].reshape(outputs[0].shape)


def mirror_pad(params: MirrorPadParams, inputs: Arrays, outputs: Arrays) -> None:
    picks = [[params.source(axis, i) for i in range(extent)]
             for axis, extent in enumerate(outputs[0].shape)]
    outputs[0][...] = inputs[0][np.ix_(*picks)]


def gather(params: GatherParams, inputs: Arrays, outputs: Arrays) -> None:
    blocks = inputs[0].reshape(params.batch, params.outer, params.axis_size, params.inner)
    picked = np.take_along_axis(blocks, params.indices[:, None, :, None], axis=2)
    outputs[0][...] = picked.reshape(outputs[0].shape)


KERNELS = {
    "RESHAPE": reshape,
    "SQUEEZE": reshape,
    "EXPAND_DIMS": reshape,
    "PAD": pad,
    "PADV2": pad,
    "MIRROR_PAD": mirror_pad,
    "CONCATENATION": concatenation,
    "PACK": pack,
    "UNPACK": unpack,
    "SPLIT": split,
    "SPLIT_V": split_v,
    "TRANSPOSE": transpose,
    "DEPTH_TO_SPACE": transpose,
    "SPACE_TO_DEPTH": transpose,
    "SPACE_TO_BATCH_ND": space_to_batch,
    "BATCH_TO_SPACE_ND": batch_to_space,
    "REVERSE_V2": strided_slice,
    "BROADCAST_TO": strided_slice,
    "SLICE": strided_slice,
    "STRIDED_SLICE": strided_slice,
    "GATHER": gather,
}
