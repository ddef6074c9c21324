"""Constants computed at generation: a DEQUANTIZE of a float16 constant becomes the float32
constant it computes, a TFLM_DECODE the constants it decodes, and int4 filters become int8 ones.

Converters write "float16 quantization" as float16 weights, each widened by a DEQUANTIZE before
the float32 op that reads it. The widening is exact, so the float32 values are LiteRT's bit for
bit. We fold it: the float32 copy lives in flash (twice the float16 bytes) and needs no RAM and
no work per invoke. Keeping the float16 weights in flash instead would put the float32 tensor
in RAM, widened at every invoke (LiteRT widens once, into memory it keeps for good): on a
microcontroller, RAM is the scarcer of the two.

The op stays in the graph at its index with no operands, as a fused PAD does
(toolchain.lower.fusion): its params are its `Fold`, it has no step's work (runtime_py and the C
skip every `Elided` op), and its output is a constant, for which no buffer is planned. Op and
tensor indices stay the file's. A DEQUANTIZE whose output is a graph output is left alone: an
output is written by the invoke.

TFLite Micro's compressed tensors (lookup table, pruning, Huffman: toolchain.ops.decode) are
decoded the same way: TFLite Micro decodes them into its arena before every reader runs, at
every invoke; here the readers' prepares see constant weights as with an uncompressed model
(their per-channel sums, their target layouts), and the flash holds the decoded weights, as
large as the uncompressed model's. A TFLM_DECODE writing a graph output is left to its kernel.

int4 filters (the converter's packed 4-bit weights, two to a byte, the low nibble first) of
CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED become int8 filters of the same values and
quantization, as TFLite's UnpackDenseInt4IntoInt8 makes them before its int8 kernels run: every
prepare and kernel of ours then runs them as int8 ones. The C keeps them packed in flash, as
TFLite Micro does, and a portable kernel unpacks its filter into its scratch in the arena right
before it runs (toolchain.lower.program.int4_unpacks); a target kernel that lays its filter out
for its own loops keeps that int8 layout instead.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from toolchain.errors import ArenacError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops import REGISTRY
from toolchain.ops.decode.prepare import decode_pairs
from toolchain.ops.spec import Binding, Signature


class Elided:
    """The params of an op with no work of its own left: what it computed was folded or fused
    away."""


@dataclass(frozen=True)
class Fold(Elided):
    """DEQUANTIZE `op` of the float16 constant `source`, whose output `tensor` is now the
    float32 constant it computes."""

    op: int
    tensor: int
    source: int


@dataclass(frozen=True)
class DecodeFold(Elided):
    """TFLM_DECODE `op`, whose outputs `tensors` are now the constants it decodes from the
    encoded `sources`, compressed as `kinds` say ("lookup table", ...)."""

    op: int
    tensors: tuple[int, ...]
    sources: tuple[int, ...]
    kinds: tuple[str, ...]


FOLDED = Signature(inputs=(frozenset({"float16"}),), outputs=(frozenset({"float32"}),),
                   form="float16 -> float32 (folded at generation)")
# Any of the op's own signatures: what `check` compares it with is TFLite Micro, as for its
# kernel.
DECODED = REGISTRY["TFLM_DECODE"].kernels[0]


FILTERED = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"})


def int4_filter(graph: Graph, op: Operator) -> Tensor | None:
    """The op's constant int4 filter, if it has one."""
    if op.opcode not in FILTERED or len(op.inputs) < 2 or op.inputs[1] < 0:
        return None
    tensor = graph.tensors[op.inputs[1]]
    return tensor if tensor.dtype == "int4" and tensor.is_constant else None


def unpacked_int4(packed: np.ndarray, count: int) -> np.ndarray:
    """`count` int4 values, two to a byte, the low nibble first, as int8."""
    data = np.asarray(packed, np.uint8).view(np.int8)
    low = (data << 4).astype(np.int8) >> 4  # sign-extended nibbles
    high = data >> 4
    return np.stack([low, high], axis=-1).reshape(-1)[:count]


def fold_constants(graph: Graph) -> tuple[Graph, tuple[Fold | DecodeFold, ...]]:
    """The graph with every foldable DEQUANTIZE and TFLM_DECODE folded and every int4 filter
    unpacked, and the folds (the same graph when there is nothing to do)."""
    tensors, operators = list(graph.tensors), list(graph.operators)
    unpacked = False
    for op in graph.operators:
        filter_ = int4_filter(graph, op)
        if filter_ is not None:
            values = unpacked_int4(filter_.data, filter_.num_elements).reshape(filter_.shape)
            values.flags.writeable = False
            tensors[filter_.index] = replace(filter_, dtype="int8", data=values)
            unpacked = True
    folds: list[Fold | DecodeFold] = []
    for op in graph.operators:
        if op.opcode != "DEQUANTIZE" or len(op.inputs) != 1 or len(op.outputs) != 1:
            continue
        x, y = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
        if (x.dtype != "float16" or not x.is_constant or y.dtype != "float32"
                or y.shape != x.shape or y.index in graph.outputs or y.is_variable):
            continue
        widened = np.asarray(x.data, np.dtype("<f2")).astype(np.dtype("<f4")).reshape(y.shape)
        widened.flags.writeable = False
        tensors[y.index] = replace(y, data=widened)
        operators[op.index] = replace(op, inputs=(), outputs=())
        folds.append(Fold(op.index, y.index, x.index))
    for op in graph.operators:
        if op.kind != "TFLM_DECODE" or any(t in graph.outputs or graph.tensors[t].is_variable
                                           for t in op.outputs):
            continue
        try:
            pairs = decode_pairs(graph, op)
        except ArenacError:
            continue  # its binding refuses it, with the reason
        for t, (values, _) in zip(op.outputs, pairs, strict=True):
            tensors[t] = replace(graph.tensors[t], data=values)
        operators[op.index] = replace(op, inputs=(), outputs=())
        folds.append(DecodeFold(op.index, op.outputs, op.inputs[::2],
                                tuple(kind for _, kind in pairs)))
    if not folds and not unpacked:
        return graph, ()
    return replace(graph, tensors=tuple(tensors), operators=tuple(operators)), tuple(folds)


def folded_binding(fold: Fold | DecodeFold) -> Binding:
    if isinstance(fold, DecodeFold):
        return Binding(fold.op, "TFLM_DECODE", DECODED, fold)
    return Binding(fold.op, "DEQUANTIZE", FOLDED, fold)
