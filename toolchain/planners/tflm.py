"""TFLite Micro's own GreedyMemoryPlanner, tie for tie, so its arena can be shown beside ours.

TFLM pads every buffer to 16 bytes, takes them largest first and puts each at the lowest offset
clear of every placed buffer whose life meets its own, as `GreedyPlanner` does. Two things make
its plan differ from ours: buffers of equal size go in reverse adding order (it fills its sort
array from the back and then sorts it stably), and it knows nothing of declared overlaps. Fed
the buffers in TFLM's adding order (tensors by index, then scratch), with lives in the file's
operator order, it gives TFLM's head to the byte.
"""

from __future__ import annotations

from toolchain.planners.base import Buffer, Overlap
from toolchain.planners.greedy import GreedyPlanner


class TFLMPlanner(GreedyPlanner):
    """Greedy by size, ties by the last added first; overlaps are ignored (allowed sharing is
    never required), so no buffer shares a byte with another alive beside it."""

    name = "tflm"

    def _place(self, buffers: list[Buffer], overlaps: list[Overlap]) -> list[int]:
        return super()._place(buffers, [])

    def _order(self, buffers: list[Buffer], sizes: list[int]) -> list[int]:
        return sorted(range(len(buffers)), key=lambda i: (-sizes[i], -i))
