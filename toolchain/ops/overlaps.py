"""Which outputs may share memory with an input that dies at their op, and how far.

Every rule rests on the order in which the C kernels (and any kernel honouring the declaration)
read and write: increasing addresses, each output element (or row) written only after the
input bytes at and above its address that are still needed have been read. The planner turns
each declaration into an Overlap between the two buffers; `verify` checks every shared byte
against it.

Each op's registry entry (its OpSpec) names the rule its kernel's loop order makes safe:

- alias: the output is a copy of the input's bytes (RESHAPE, SQUEEZE, EXPAND_DIMS): the C
  copies with memmove, skipped when both sit at the same offset, so any overlap is safe.
- elementwise: output element i is written after input element i is read, in increasing i.
  The output may start at or below the input; when output elements are wider than input ones
  it must start lower, by the growth over all elements.
- unread: the kernel reads the input (if at all) before it writes any output element (FILL's
  value, ZEROS_LIKE's and SHAPE's input), so any overlap is safe.
- windowed (CONV_2D, DEPTHWISE_CONV_2D, pooling; NHWC, row by row): when output row r is
  written, no input row below the first row of its window is read again, so the output may
  sit below the input by the largest excess of output bytes written over input bytes released.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops.padding import fused_padding


@dataclass(frozen=True)
class OverlapRule:
    """Output `output` may overlap input `input` (positions in the op's lists) when it starts at
    least `shift` bytes below the input's start; `any_offset` lifts the direction too."""

    input: int
    output: int
    shift: int = 0
    any_offset: bool = False
    kind: str = "elementwise"


# What a kernel declares: from the op and its params (a target kernel's rule may follow its
# own loop order, which the params shape), the rules its write order makes safe.
Rule = Callable[[Graph, Operator, Any], list[OverlapRule]]

# Rules `--no-inplace` switches off; the others (windowed) are `--no-overlap`'s.
INPLACE_KINDS = frozenset({"alias", "elementwise"})


def alias(graph: Graph, op: Operator, params: Any) -> list[OverlapRule]:
    return [OverlapRule(0, 0, 0, any_offset=True, kind="alias")]


def unread(position: int) -> Rule:
    """The input at `position` is read, if at all, before the first output element is written:
    the output may lie anywhere over it."""

    def rule(graph: Graph, op: Operator, params: Any) -> list[OverlapRule]:
        return [OverlapRule(position, 0, 0, any_offset=True)]

    return rule


def elementwise_shift(x: Tensor, out: Tensor) -> int:
    """Bytes the output must start below the input so element i never lands on element > i."""
    x_bytes, out_bytes = x.nbytes // max(x.num_elements, 1), out.nbytes // max(out.num_elements, 1)
    return max(0, out.num_elements * (out_bytes - x_bytes))


def elementwise(*positions: int) -> Rule:
    """Inputs at `positions` (no positions: every input, as ADD_N's) of the output's shape may
    be overwritten element by element."""

    def rule(graph: Graph, op: Operator, params: Any) -> list[OverlapRule]:
        out = graph.tensors[op.outputs[0]]
        rules = []
        for i in positions or range(len(op.inputs)):
            if i < len(op.inputs) and op.inputs[i] >= 0:
                x = graph.tensors[op.inputs[i]]
                if x.num_elements == out.num_elements and x.shape == out.shape:
                    rules.append(OverlapRule(i, 0, elementwise_shift(x, out)))
        return rules

    return rule


def rows_of_windowed(graph: Graph, op: Operator, kernel_h: int, stride: int,
                     dilation: int) -> list[OverlapRule]:
    x, out = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    shapes_ok = len(x.shape) == 4 and len(out.shape) == 4 and x.shape[0] == out.shape[0]
    if not shapes_ok or min(x.shape + out.shape) <= 0 or min(kernel_h, stride, dilation) <= 0:
        return []  # nothing a kernel would run: declare nothing
    batch, height, _, _ = x.shape
    out_h = out.shape[1]
    row_in, row_out = x.nbytes // (batch * height), out.nbytes // (batch * out_h)
    (pad_top, pad_bottom), _ = fused_padding(op)  # a fused PAD's rows come first
    if op.options.get("padding") == "SAME":
        effective = (kernel_h - 1) * dilation + 1
        padded = height + pad_top + pad_bottom
        pad_top += max((out_h - 1) * stride + effective - padded, 0) // 2
    # After output row r of image b: (b * out_h + r + 1) rows written, and the input rows above
    # its window's first row released. The excess is linear in b, so its largest value over
    # the batch is at the first or the last image.
    rows = np.arange(out_h, dtype=np.int64)
    first_needed = np.clip(rows * stride - pad_top, 0, height)
    excess = int(((rows + 1) * row_out - first_needed * row_in).max())
    per_image = out_h * row_out - height * row_in
    shift = max(0, excess + max(0, (batch - 1) * per_image))
    return [OverlapRule(0, 0, shift, kind="windowed")]


def convolution(graph: Graph, op: Operator, params: Any) -> list[OverlapRule]:
    if len(op.inputs) < 2 or op.inputs[1] < 0 or len(graph.tensors[op.inputs[1]].shape) != 4:
        return []
    kernel_h = graph.tensors[op.inputs[1]].shape[1]
    return rows_of_windowed(graph, op, kernel_h, op.options.get("stride_h", 1),
                            op.options.get("dilation_h_factor", 1))


def pooling(graph: Graph, op: Operator, params: Any) -> list[OverlapRule]:
    return rows_of_windowed(graph, op, op.options.get("filter_height", 1),
                            op.options.get("stride_h", 1), 1)


def declared_overlaps(graph: Graph, op: Operator, params: Any,
                      rule: Rule | None) -> list[OverlapRule]:
    """What the op's registry `rule` declares, one rule per pair of tensors: a tensor that is
    several inputs (ADD(x, x)) keeps the strictest of its rules, since the kernel is safe only
    where all of them hold."""
    if rule is None or not op.inputs or op.inputs[0] < 0 or not op.outputs:
        return []
    rules = rule(graph, op, params)
    by_pair: dict[tuple[int, int], OverlapRule] = {}
    for rule in rules:
        pair = (op.inputs[rule.input], op.outputs[rule.output])
        by_pair[pair] = stricter(by_pair[pair], rule) if pair in by_pair else rule
    return list(by_pair.values())


def stricter(a: OverlapRule, b: OverlapRule) -> OverlapRule:
    """Of two rules for the same pair of tensors, the one that allows fewer offsets."""
    if a.any_offset != b.any_offset:
        return b if a.any_offset else a
    return a if a.shift >= b.shift else b
