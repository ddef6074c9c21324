"""What every memory planner shares: plain buffers in, offsets out.

Planners never see TFLite types, so the same code plans tensors from a model, buffers read from a
MiniMalloc CSV, or random buffers in a test.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

from toolchain.errors import PlanError


@dataclass(frozen=True)
class Buffer:
    """`size` bytes needed from op `first` to op `last`, both inclusive (so `first <= last`)."""

    id: int
    size: int
    first: int
    last: int


@dataclass(frozen=True)
class Plan:
    """Where each buffer lives in one arena; `offsets[i]` belongs to `buffers[i]`."""

    planner: str
    alignment: int
    buffers: tuple[Buffer, ...]
    offsets: tuple[int, ...]
    arena_bytes: int

    @classmethod
    def from_offsets(
        cls, planner: str, alignment: int, buffers: Sequence[Buffer], offsets: Sequence[int]
    ) -> Plan:
        """Wraps offsets from anywhere (a planner, a MiniMalloc solution) with the arena needed."""
        return cls(
            planner=planner,
            alignment=alignment,
            buffers=tuple(buffers),
            offsets=tuple(offsets),
            arena_bytes=arena_end(buffers, offsets, alignment),
        )

    @cached_property
    def _offset_by_id(self) -> dict[int, int]:
        return {
            buffer.id: offset for buffer, offset in zip(self.buffers, self.offsets, strict=True)
        }

    def offset_of(self, buffer_id: int) -> int:
        try:
            return self._offset_by_id[buffer_id]
        except KeyError:
            raise PlanError(f"plan has no buffer with id {buffer_id}") from None


def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def arena_end(buffers: Sequence[Buffer], offsets: Sequence[int], alignment: int) -> int:
    """The first byte past every buffer, counting each buffer's padding up to the alignment."""
    return max(
        (offset + align_up(b.size, alignment) for b, offset in zip(buffers, offsets, strict=True)),
        default=0,
    )


def naive_sum(buffers: Sequence[Buffer], alignment: int) -> int:
    """The arena if nothing shared memory: the ceiling any planner must stay under."""
    return sum(align_up(b.size, alignment) for b in buffers)


def lower_bound(buffers: Sequence[Buffer], alignment: int) -> int:
    """The most bytes live at any one op: no planner can use a smaller arena.

    A sweep over life starts and ends; at equal op indices the ends (at `last + 1`) sort before
    the starts because their delta is negative, so a buffer that ends is not counted with one
    that starts at the next op.
    """
    changes = []
    for b in buffers:
        size = align_up(b.size, alignment)
        changes += [(b.first, size), (b.last + 1, -size)]
    changes.sort()
    live = peak = 0
    for _, delta in changes:
        live += delta
        peak = max(peak, live)
    return peak


class Planner(ABC):
    """TFLite Micro's MicroMemoryPlanner interface: add buffers, plan, then ask for the arena
    size and each offset. Subclasses only decide offsets, in `_place`.

    Sizes are padded up to `alignment` before placing, so every offset a planner derives from
    other buffers' ends is aligned too.
    """

    name: ClassVar[str]

    def __init__(self, alignment: int = 16, **options: object) -> None:
        if options:
            raise PlanError(f"planner {self.name!r} has no option {', '.join(sorted(options))}")
        if alignment < 1:
            raise PlanError(f"alignment must be a positive number of bytes, not {alignment}")
        self.alignment = alignment
        self._buffers: list[Buffer] = []
        self._offsets: list[int] | None = None

    def add_buffer(self, size: int, first: int, last: int) -> int:
        """Registers a buffer and returns its id, which is its position in adding order."""
        if size < 0:
            raise PlanError(f"buffer size must not be negative, got {size}")
        if first > last:
            raise PlanError(f"buffer life [{first}, {last}] ends before it starts")
        buffer_id = len(self._buffers)
        self._buffers.append(Buffer(buffer_id, size, first, last))
        self._offsets = None
        return buffer_id

    def plan(self) -> None:
        """Computes the offsets now; asking for a size or an offset would compute them anyway."""
        self._planned_offsets()

    def arena_bytes(self) -> int:
        return arena_end(self._buffers, self._planned_offsets(), self.alignment)

    def offset(self, buffer_id: int) -> int:
        offsets = self._planned_offsets()
        if not 0 <= buffer_id < len(offsets):
            raise PlanError(f"no buffer with id {buffer_id}; {len(offsets)} were added")
        return offsets[buffer_id]

    def result(self) -> Plan:
        return Plan.from_offsets(self.name, self.alignment, self._buffers, self._planned_offsets())

    def _planned_offsets(self) -> list[int]:
        """Plans on first use after any change, as TFLite Micro does, so answers are never stale."""
        if self._offsets is None:
            self._offsets = self._place(list(self._buffers))
        return self._offsets

    @abstractmethod
    def _place(self, buffers: list[Buffer]) -> list[int]:
        """Returns one aligned offset per buffer, in the same order; `buffers[i].id == i`."""
