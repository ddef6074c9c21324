"""Params for RESIZE_NEAREST_NEIGHBOR and RESIZE_BILINEAR on NHWC tensors.

Which input rows and columns each output pixel reads, and with what weights, depends only on
the shapes and options; prepare computes these tables once with TFLite's arithmetic (float32
for the coordinates of float and nearest-neighbor resizing, 10-bit fixed point for int8 and
int16 bilinear), so the kernels only gather and blend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.ir import Graph, Operator
from toolchain.ops.spec import required_input

FIXED_ONE = 1 << 10  # int8 bilinear coordinates and weights are in units of 1/1024


@dataclass(frozen=True)
class NearestParams:
    """Output row i copies input row rows[i]; likewise for columns."""

    rows: tuple[int, ...]
    cols: tuple[int, ...]


@dataclass(frozen=True)
class Interpolation:
    """Along one axis, output i blends input low[i] and high[i] with these weights."""

    low: tuple[int, ...]
    high: tuple[int, ...]
    low_weight: tuple[float, ...] | tuple[int, ...]
    high_weight: tuple[float, ...] | tuple[int, ...]


@dataclass(frozen=True)
class BilinearParams:
    """out = in[top,left]·wt·wl + in[bottom,left]·wb·wl + in[top,right]·wt·wr
    + in[bottom,right]·wb·wr, summed in that order.

    "float32": float32 weights and arithmetic, products associating left to right.
    "float32_rounded": the same on integer values (TFLite's ResizeBilinear<uint8_t>), then
    + 0.5 and truncation to the integer type.
    "fixed10": integer weights in 1/1024 (TFLite's ResizeBilinearInteger, int8 and int16);
    the int64 sum is rounded half away from zero to a multiple of 2^20 and divided by it
    (truncating, as C does).
    """

    method: str
    rows: Interpolation
    cols: Interpolation


def _c_divide(a: int, b: int) -> int:
    """C's integer division (b > 0): toward zero."""
    return -(-a // b) if a < 0 else a // b


def _float_scale(in_size: int, out_size: int, align_corners: bool) -> np.float32:
    if align_corners and out_size > 1:
        return np.float32(in_size - 1) / np.float32(out_size - 1)
    return np.float32(in_size) / np.float32(out_size)


def _nearest_indices(in_size: int, out_size: int, align_corners: bool,
                     half_pixel_centers: bool) -> tuple[int, ...]:
    """TFLite's GetNearestNeighbor: float32 coordinates, rounded (align_corners) or floored."""
    scale = _float_scale(in_size, out_size, align_corners)
    offset = np.float32(0.5 if half_pixel_centers else 0.0)
    indices = []
    for i in range(out_size):
        position = float((np.float32(i) + offset) * scale)
        nearest = math.floor(position + 0.5) if align_corners else math.floor(position)
        nearest = min(nearest, in_size - 1)  # positions are never negative: half-up rounding
        indices.append(max(nearest, 0) if half_pixel_centers else nearest)
    return tuple(indices)


def _float_interpolation(in_size: int, out_size: int, align_corners: bool,
                         half_pixel_centers: bool) -> Interpolation:
    """reference_ops::ResizeBilinear's ComputeInterpolationValues, in float32."""
    scale = _float_scale(in_size, out_size, align_corners)
    low, high, low_weight, high_weight = [], [], [], []
    for i in range(out_size):
        if half_pixel_centers:
            position = (np.float32(i) + np.float32(0.5)) * scale - np.float32(0.5)
        else:
            position = np.float32(i) * scale
        below = max(math.floor(position), 0)
        fraction = position - np.float32(below)  # negative left of the first pixel's centre
        low.append(below)
        high.append(min(math.ceil(position), in_size - 1))
        low_weight.append(float(np.float32(1) - fraction))
        high_weight.append(float(fraction))
    return Interpolation(tuple(low), tuple(high), tuple(low_weight), tuple(high_weight))


def _fixed_interpolation(in_size: int, out_size: int, align_corners: bool,
                         half_pixel_centers: bool) -> Interpolation:
    """The int8 reference's ComputeInterpolationValues: positions in 1/1024, C division."""
    if align_corners and out_size > 1:
        scale = (FIXED_ONE * (in_size - 1) + (out_size - 1) // 2) // (out_size - 1)
    else:
        scale = (FIXED_ONE * in_size + out_size // 2) // out_size
    low, high, low_weight, high_weight = [], [], [], []
    for i in range(out_size):
        position = i * scale
        if half_pixel_centers:
            position += scale // 2 - FIXED_ONE // 2
        below = max(_c_divide(position, FIXED_ONE), 0)
        low.append(below)
        high.append(min(_c_divide(position + FIXED_ONE - 1, FIXED_ONE), in_size - 1))
        low_weight.append(FIXED_ONE - (position - FIXED_ONE * below))
        high_weight.append(position - FIXED_ONE * below)
    return Interpolation(tuple(low), tuple(high), tuple(low_weight), tuple(high_weight))


def _options(graph: Graph, op: Operator) -> tuple[int, int, bool, bool]:
    """Output height and width from the constant size input, checked against the output."""
    source, size = required_input(graph, op, 0, "input"), required_input(graph, op, 1, "size")
    out = graph.tensors[op.outputs[0]]
    if len(source.shape) != 4 or 0 in source.shape:
        raise UnsupportedOpError(f"input must be 4-D (NHWC) and not empty, not {source.shape}")
    if size.data is None or size.dtype != "int32" or size.data.size != 2:
        raise UnsupportedOpError("size must be a constant int32 tensor of 2 values")
    height, width = (int(v) for v in size.data.reshape(-1))
    if height <= 0 or width <= 0:
        raise UnsupportedOpError(f"size must be positive, not {height}x{width}")
    expected = (source.shape[0], height, width, source.shape[3])
    if out.shape != expected or out.dtype != source.dtype:
        raise UnsupportedOpError(f"output {out.dtype}{out.shape}, TFLite computes {expected}")
    align_corners = bool(op.options.get("align_corners", False))
    half_pixel_centers = bool(op.options.get("half_pixel_centers", False))
    return height, width, align_corners, half_pixel_centers


def prepare_nearest(graph: Graph, op: Operator) -> NearestParams:
    height, width, align, half = _options(graph, op)
    _, in_height, in_width, _ = graph.tensors[op.inputs[0]].shape
    return NearestParams(_nearest_indices(in_height, height, align, half),
                         _nearest_indices(in_width, width, align, half))


# TFLite's reference: float32 for float32 and (rounded) uint8, ResizeBilinearInteger's 10-bit
# fixed point for int8 and int16.
BILINEAR_METHODS = {"float32": ("float32", _float_interpolation),
                     "uint8": ("float32_rounded", _float_interpolation),
                     "int8": ("fixed10", _fixed_interpolation),
                     "int16": ("fixed10", _fixed_interpolation)}
# Largest magnitude of a stored value, per integer dtype the fixed-point blend reads.
_MAGNITUDES = {"int8": 2**7, "int16": 2**15}


def blend_reach(params: BilinearParams, dtype: str) -> int:
    """A bound on |sum of q * wy * wx| over the four corners, plus the rounding half."""
    reach = [max((abs(lo) + abs(hi) for lo, hi in zip(t.low_weight, t.high_weight,
                                                      strict=True)), default=0)
             for t in (params.rows, params.cols)]
    return _MAGNITUDES[dtype] * reach[0] * reach[1] + (1 << (FIXED_SHIFT - 1))


def prepare_bilinear(graph: Graph, op: Operator) -> BilinearParams:
    height, width, align, half = _options(graph, op)
    if align and half:
        raise UnsupportedOpError("align_corners and half_pixel_centers together")
    source = graph.tensors[op.inputs[0]]
    method, interpolation = BILINEAR_METHODS[source.dtype]
    _, in_height, in_width, _ = source.shape
    params = BilinearParams(method, interpolation(in_height, height, align, half),
                            interpolation(in_width, width, align, half))
    for axis, table, size in (("row", params.rows, in_height), ("column", params.cols, in_width)):
        if max(table.low, default=0) >= size:
            # The integer path's 10-bit scale can round up so far that the last positions
            # land past the input: TFLite reads memory beyond it.
            raise UnsupportedOpError(f"{height}x{width} from {in_height}x{in_width}: TFLite's "
                                     f"positions read {axis} {max(table.low)}, past the input")
    return params

FIXED_SHIFT = 20  # the integer blend carries two 10-bit weights (runtime_py.kernels.resize)
