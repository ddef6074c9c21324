"""The execution steps of a plan, as data: what runs, in what order, in which block.

A plan's order lists every op once, the steps of the subgraphs a CALL_ONCE, IF or WHILE runs
right after its own step, and a striped segment's ops one after the other. The backends do not
read that order themselves: they visit the tree `execution_steps` builds from it once, so a new
kind of step (or a new way of running one) is taught here, not to each backend:

- RunOp: one op's kernel (a fused PAD's step runs nothing: the op that reads it pads);
- RunSegment: the ops of a striped segment, stripe by stripe (toolchain.lower.tiling);
- CallOnce: the op, then its subgraph's steps on the first invoke after a reset only, recorded
  by a flag byte of the state block;
- RunIf: the chosen branch's steps, then its copies out; the other branch is passed over;
- RunWhile: the entry copies, then the condition's steps and, while it holds, the body's
  steps and its copies back into the loop values.

Every step carries its position in the order (`step`), by which a backend finds what the plan
says of it (the buffers it claims and releases).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from toolchain.lower.program import Control, Program
from toolchain.lower.tiling import Segment, Tiling


@dataclass(frozen=True)
class RunOp:
    step: int
    op: int


@dataclass(frozen=True)
class RunSegment:
    segment: Segment

    @property
    def step(self) -> int:
        return self.segment.first


@dataclass(frozen=True)
class CallOnce:
    step: int
    op: int
    subgraph: int
    flag: int  # the offset of its flag byte in the state block
    body: tuple[Step, ...]


@dataclass(frozen=True)
class RunIf:
    step: int
    op: int
    control: Control
    then: tuple[Step, ...]
    otherwise: tuple[Step, ...]

    @property
    def branches(self) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
        return self.then, self.otherwise


@dataclass(frozen=True)
class RunWhile:
    step: int
    op: int
    control: Control
    test: tuple[Step, ...]
    body: tuple[Step, ...]


Step = RunOp | RunSegment | CallOnce | RunIf | RunWhile


def execution_steps(program: Program, order: Sequence[int], tiling: Tiling,
                    flag_of: Callable[[int], int]) -> tuple[Step, ...]:
    """The steps of `order` as a tree; `flag_of(subgraph)` is the state-block offset of the
    flag recording that CALL_ONCE ran that subgraph."""
    spans: Mapping[int, tuple[range, ...]] = program.spans(order)
    segments = {s.first: s for s in tiling.segments}

    def block(steps: range) -> tuple[Step, ...]:
        made: list[Step] = []
        step = steps.start
        while step < steps.stop:
            if step in segments:
                made.append(RunSegment(segments[step]))
                step = segments[step].last + 1
                continue
            op, blocks = order[step], spans.get(step, ())
            inner = tuple(block(b) for b in blocks)
            if op in program.controls:
                control = program.controls[op]
                kind = RunIf if control.opcode == "IF" else RunWhile
                made.append(kind(step, op, control, *inner))
            elif op in program.calls:
                subgraph = program.calls[op]
                made.append(CallOnce(step, op, subgraph, flag_of(subgraph), inner[0]))
            else:
                made.append(RunOp(step, op))
            step = blocks[-1].stop if blocks else step + 1
        return tuple(made)

    return block(range(len(order)))


def own_steps(block: Sequence[Step]) -> list[int]:
    """The positions in the order of a block's own steps (a segment's each), without those of
    the blocks inside them."""
    found: list[int] = []
    for s in block:
        if isinstance(s, RunSegment):
            found.extend(range(s.segment.first, s.segment.last + 1))
        else:
            found.append(s.step)
    return found


def blocks_by_subgraph(steps: tuple[Step, ...], main: int) -> dict[int, tuple[Step, ...]]:
    """Each subgraph's block of steps (subgraph `main` is `steps` itself): a program lays
    every subgraph it runs out once, so each has one block."""
    found = {main: steps}
    for s in steps:
        inner: tuple[tuple[int, tuple[Step, ...]], ...] = ()
        if isinstance(s, CallOnce):
            inner = ((s.subgraph, s.body),)
        elif isinstance(s, RunIf | RunWhile):
            blocks = s.branches if isinstance(s, RunIf) else (s.test, s.body)
            inner = tuple((b.subgraph, steps_of) for b, steps_of in
                          zip(s.control.blocks, blocks, strict=True))
        for subgraph, block in inner:
            found.update(blocks_by_subgraph(block, subgraph))
    return found
