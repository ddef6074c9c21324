"""The planner that shares nothing: the baseline every other planner is measured against."""

from __future__ import annotations

from itertools import accumulate

from toolchain.planners.base import Buffer, Overlap, Planner, align_up


class NaivePlanner(Planner):
    """Every buffer gets its own bytes, one after another in id order; arena = `naive_sum`.
    It ignores overlaps: they allow sharing but never require it."""

    name = "naive"

    def _place(self, buffers: list[Buffer], overlaps: list[Overlap]) -> list[int]:
        sizes = [align_up(b.size, self.alignment) for b in buffers]
        return list(accumulate(sizes[:-1], initial=0)) if sizes else []
