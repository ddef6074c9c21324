"""The padding a windowed op applies before its own: that of a PAD fused into it.

toolchain.lower.fusion rewrites PAD -> CONV_2D (DEPTHWISE_CONV_2D, MAX_POOL_2D) into the windowed op
alone, reading the PAD's input with the PAD's (top, bottom) and (left, right) in its options
under FUSED_PADDING. The op's prepare and its overlap rule then slide its window over the
input as if it were padded: its own SAME padding is computed for the padded size and added
after the fused one, as TFLite applies it to the PAD's output.
"""

from __future__ import annotations

from toolchain.ir import Operator

FUSED_PADDING = "fused_padding"
NO_PADDING = ((0, 0), (0, 0))


def fused_padding(op: Operator) -> tuple[tuple[int, int], tuple[int, int]]:
    """((top, bottom), (left, right)) a fused PAD adds around the op's input."""
    return op.options.get(FUSED_PADDING, NO_PADDING)
