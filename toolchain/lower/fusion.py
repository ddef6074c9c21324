"""Fused explicit padding: a PAD whose one reader is a windowed op becomes that op's padding,
so the padded tensor never exists in the arena.

Converters write SAME padding that TFLite cannot express (asymmetric, or larger than SAME's)
as a PAD (or PADV2) in front of a CONV_2D, DEPTHWISE_CONV_2D or pooling op with VALID
padding. The padded tensor is the input plus a border, often the largest tensor alive at its
step. Fused, the windowed op reads the PAD's input with the PAD's rows and columns as padding
of its own (toolchain/ops/padding.py), which its kernels already treat as values that add
nothing. Each windowed kernel states what it requires of a PAD (its OpSpec.pad,
toolchain.ops.padding.PadRule):

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

from toolchain.errors import ArenacError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.lower.folding import Elided
from toolchain.ops import REGISTRY, bind
from toolchain.ops.padding import FUSED_PADDING, PadRule
from toolchain.ops.shape.prepare import PadParams
from toolchain.ops.spec import Binding

PAD_OPCODES = frozenset({"PAD", "PADV2"})

Padding = tuple[tuple[int, int], tuple[int, int]]


@dataclass(frozen=True)
class PadFusion(Elided):
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


def fuse_padding(graph: Graph, bindings: Sequence[Binding | None], target: str,
                 held: Collection[int] = ()) -> tuple[Graph, tuple[Binding | None, ...],
                                                      tuple[PadFusion, ...]]:
    """The graph and bindings with every fusable PAD fused into the windowed op reading it,
    and every PAD feeding a windowed op (one whose kernel has an OpSpec.pad rule) with what
    became of it. `held`:
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
                    if pad_rule(graph.operators[r]) is not None
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
    return pad_rule(op).refusal(x, params.value, op, graph)


def _quantization(t: Tensor) -> tuple:
    q = t.quantization
    return (q.scale, q.zero_point) if q else ()


def pad_rule(op: Operator) -> PadRule | None:
    """What the op's kernel requires of a PAD fused into it, if it takes one."""
    spec = REGISTRY.get(op.kind)
    return None if spec is None else spec.pad


def _uncovered(graph: Graph, op: Operator, params) -> str:
    """A window that would hold padding only, along some axis, or ""."""
    x = graph.tensors[op.inputs[0]]
    for axis, (out, extent, before, stride) in enumerate(pad_rule(op).axes(params)):
        if before >= extent or (out - 1) * stride - before >= x.shape[1 + axis]:
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
