"""Fused explicit padding: a PAD whose one reader is a windowed op becomes that op's padding,
so the padded tensor never exists in the arena.

Converters write SAME padding that TFLite cannot express (asymmetric, or larger than SAME's)
as a PAD (or PADV2) in front of a CONV_2D, DEPTHWISE_CONV_2D or pooling op with VALID
padding. The padded tensor is the input plus a border, often the largest tensor alive at its
step. Fused, the windowed op reads the PAD's input with the PAD's rows and columns as padding
of its own (toolchain/ops/padding.py), which its kernels already treat as values that add
nothing:

- CONV_2D and DEPTHWISE_CONV_2D sum filter * (input - input zero point) over the taps inside
  the image only (TFLite's reference, and every kernel of ours: the portable C, the Arm DSP
  im2col and depthwise kernels, which fill their padding with the zero point, and the Helium
  ones). A PAD writing the input's zero point (0.0 for float32) adds (zp - zp) * w = 0 per
  padded tap: the sums are the same integers, so the outputs are bit for bit TFLite's. Hybrid
  convolutions (float32 data, int8 filter) are left alone: they quantize the padded image.
- MAX_POOL_2D starts each window at the dtype's lowest value (TFLite's, and ours) and lets an
  element in only when greater: a PAD writing that value or less never changes a maximum.
- AVERAGE_POOL_2D divides by the count of its window's elements inside the image: a PAD's
  elements would be counted unfused and not fused, so it is never fused.

Only a PAD of the height and width of a 4-D tensor, whose output is read by the windowed op
alone (as its data input) and is neither a graph output nor something IF or WHILE copies, and
whose input and output are quantized alike, is fused; and only where every window of the fused
op still covers some pixel of the image (the geometry the kernels were written for).

The rewrite works on the program's graph after binding (toolchain.lower.program.lower): the
windowed op reads the PAD's input and is bound again with the padding in its options, and the
PAD stays in the graph, at its index, as an op with no operands whose params are its
PadFusion: it has no step's work (runtime_py and the C skip it), and no buffer is planned for
its output. Op and tensor indices stay the file's, so every report names them as the file does.
`embed` plans without fusion: TFLite Micro runs the file's PAD, which needs its output.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

import numpy as np

from toolchain.errors import ArenacError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.numerics.quant import zero_point_of
from toolchain.ops import bind
from toolchain.ops.conv.prepare import ConvParams, DepthwiseConvParams
from toolchain.ops.padding import FUSED_PADDING
from toolchain.ops.pooling.prepare import Pool2DParams
from toolchain.ops.shape.prepare import PadParams
from toolchain.ops.spec import Binding

PAD_OPCODES = frozenset({"PAD", "PADV2"})
QUANTIZED = ("int8", "uint8", "int16")

Padding = tuple[tuple[int, int], tuple[int, int]]


@dataclass(frozen=True)
class PadFusion:
    """A PAD (op `pad`) whose output `tensor` the windowed op `op` reads: fused, with its
    ((top, bottom), (left, right)) `padding` applied by `op`, unless `refused` says why not."""

    pad: int
    op: int
    tensor: int
    padding: Padding
    refused: str = ""

    @property
    def fused(self) -> bool:
        return not self.refused


def _real_zero(x: Tensor, value: float, op: Operator, graph: Graph) -> str:
    """A convolution's padding adds nothing: the PAD must write the input's zero point."""
    filt = graph.tensors[op.inputs[1]] if len(op.inputs) > 1 and op.inputs[1] >= 0 else None
    if x.dtype == "float32" and filt is not None and filt.dtype != "float32":
        return "a hybrid convolution quantizes the padded image as a whole"
    zero = zero_point_of(x) if x.dtype in QUANTIZED else 0
    if value != zero or (x.dtype == "float32" and np.signbit(value)):
        return f"it pads with {value}, not the input's zero point {zero}"
    return ""


def _lowest(x: Tensor, value: float, op: Operator, graph: Graph) -> str:
    """A maximum starts at the dtype's lowest value: padding at or below it never wins."""
    dtype = np.dtype(x.dtype)
    lowest = np.finfo(dtype).min if dtype.kind == "f" else np.iinfo(dtype).min
    if not value <= lowest:
        return f"it pads with {value}, which can exceed the input (fused, a window skips it)"
    return ""


def _never(x: Tensor, value: float, op: Operator, graph: Graph) -> str:
    return ("an average divides by its window's elements inside the image, which would then "
            "leave out the PAD's")


# Windowed op -> why a PAD writing `value` in front of it cannot be fused ("" when it can).
PAD_VALUE_RULES = {
    "CONV_2D": _real_zero,
    "DEPTHWISE_CONV_2D": _real_zero,
    "MAX_POOL_2D": _lowest,
    "AVERAGE_POOL_2D": _never,
}


def fuse_padding(graph: Graph, bindings: Sequence[Binding | None], target: str,
                 held: Collection[int] = ()) -> tuple[Graph, tuple[Binding | None, ...],
                                                      tuple[PadFusion, ...]]:
    """The graph and bindings with every fusable PAD fused into the windowed op reading it,
    and every PAD feeding a windowed op (PAD_VALUE_RULES) with what became of it. `held`:
    tensors read beyond the ops' operands (what IF and WHILE copy and test)."""
    readers: dict[int, list[int]] = {}
    for op in graph.operators:
        for t in op.inputs:
            if t >= 0:
                readers.setdefault(t, []).append(op.index)
    operators, bound = list(graph.operators), list(bindings)
    found = []
    for pad in graph.operators:
        binding = bindings[pad.index]
        if pad.opcode not in PAD_OPCODES or binding is None or not pad.outputs:
            continue
        tensor = pad.outputs[0]
        windowed = [r for r in readers.get(tensor, ())
                    if graph.operators[r].opcode in PAD_VALUE_RULES
                    and graph.operators[r].inputs[0] == tensor]
        if not windowed:
            continue
        op = graph.operators[windowed[0]]
        pairs = binding.params.paddings
        fusion = PadFusion(pad.index, op.index, tensor, (pairs[1], pairs[2]) if len(pairs) == 4
                           else ((0, 0), (0, 0)))
        refused = _refusal(graph, pad, binding.params, op, readers[tensor],
                           held, bindings[op.index])
        if not refused:
            fused_op = replace(op, inputs=(pad.inputs[0], *op.inputs[1:]),
                               options={**op.options, FUSED_PADDING: fusion.padding})
            try:
                fused = bind(graph, fused_op, target)
                refused = _uncovered(graph, fused_op, fused.params)
            except ArenacError as e:
                refused = f"fused, the op would refuse it: {e.message}"
        if not refused:
            operators[op.index] = fused_op
            bound[op.index] = fused
            operators[pad.index] = replace(pad, inputs=(), outputs=())
            bound[pad.index] = replace(binding, params=fusion, scratch=(), overlaps=())
        found.append(replace(fusion, refused=refused))
    if not any(f.fused for f in found):
        return graph, tuple(bindings), tuple(found)
    return replace(graph, operators=tuple(operators)), tuple(bound), tuple(found)


def _refusal(graph: Graph, pad: Operator, params: PadParams, op: Operator,
             readers: list[int], held: Collection[int], binding: Binding | None) -> str:
    """Why the PAD cannot be fused into `op` before binding it so, or ""."""
    x, y = graph.tensors[pad.inputs[0]], graph.tensors[pad.outputs[0]]
    if binding is None:
        return "the op has no kernel"
    if len(readers) > 1:
        return f"{len(readers)} operands read its output"
    if y.index in graph.outputs:
        return "its output is a graph output"
    if y.index in held:
        return "an IF or WHILE copies or tests its output"
    if len(params.paddings) != 4 or params.paddings[0] != (0, 0) or params.paddings[3] != (0, 0):
        return "it pads another axis than height and width"
    if x.is_constant or x.is_variable:
        return "its input is not an activation"
    if _quantization(x) != _quantization(y):
        return "its input and output are quantized differently"
    return PAD_VALUE_RULES[op.opcode](x, params.value, op, graph)


def _quantization(t: Tensor) -> tuple:
    q = t.quantization
    return (q.scale, q.zero_point) if q else ()


def _uncovered(graph: Graph, op: Operator, params) -> str:
    """A window that would hold padding only, along some axis, or ""."""
    x = graph.tensors[op.inputs[0]]
    for axis in (0, 1):
        size = x.shape[1 + axis]
        if isinstance(params, ConvParams | DepthwiseConvParams):
            w = params.window
            out = params.output_shape[1 + axis]
            extent = (w.filter[axis] - 1) * w.dilation[axis] + 1
            before, stride = w.padding[axis], w.stride[axis]
        else:
            p: Pool2DParams = params
            out, extent, before, stride = ((p.output_height, p.filter_height, p.pad_top,
                                            p.stride_height),
                                           (p.output_width, p.filter_width, p.pad_left,
                                            p.stride_width))[axis]
        if before >= extent or (out - 1) * stride - before >= size:
            return "some window would cover padding only"
    return ""


def control_tensors(controls) -> frozenset[int]:
    """What IF and WHILE read or write beyond their ops' operands: conditions, loop values and
    the tensors their copies move."""
    held: set[int] = set()
    for c in controls:
        held.update((c.condition, *c.carried))
        for copy in (*c.entry, *(copy for block in c.blocks for copy in block.copies)):
            held.update((copy.src, copy.dst))
    return frozenset(held)
