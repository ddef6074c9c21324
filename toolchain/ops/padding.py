"""The padding a windowed op applies before its own: that of a PAD fused into it.

toolchain.lower.fusion rewrites PAD -> CONV_2D (DEPTHWISE_CONV_2D, MAX_POOL_2D) into the windowed op
alone, reading the PAD's input with the PAD's (top, bottom) and (left, right) in its options
under FUSED_PADDING. The op's prepare and its overlap rule then slide its window over the
input as if it were padded: its own SAME padding is computed for the padded size and added
after the fused one, as TFLite applies it to the PAD's output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolchain.ir import Graph, Operator, Tensor

FUSED_PADDING = "fused_padding"
NO_PADDING = ((0, 0), (0, 0))


def fused_padding(op: Operator) -> tuple[tuple[int, int], tuple[int, int]]:
    """((top, bottom), (left, right)) a fused PAD adds around the op's input."""
    return op.options.get(FUSED_PADDING, NO_PADDING)


@dataclass(frozen=True)
class PadRule:
    """What a windowed kernel tells toolchain.lower.fusion about a PAD in front of it.

    `refusal(x, value, op, graph)`: why a PAD writing `value` around `x` would change what the
    op computes once fused ("" when it would not). `axes(params)`: per axis (height, width) of
    the op bound with the PAD fused, (outputs, window extent, padding before, stride), so that
    fusion can refuse a geometry where some window covers padding only.
    """

    refusal: Callable[[Tensor, float, Operator, Graph], str]
    axes: Callable[[Any], tuple[tuple[int, int, int, int], ...]]
