"""The C of ops that run subgraphs: CALL_ONCE's subgraph, run once after each reset, and the
blocks of IF and WHILE with the copies that carry values into and out of them. Each emits the
kernels of the subgraphs' steps first, as C defines a function before its callers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from toolchain.lower.program import Copy, Program
from toolchain.ops.emit import Callee, CBlock, CControl
from toolchain.text import c_text

if TYPE_CHECKING:
    from toolchain.c.steps import Emission
    from toolchain.lower.steps import CallOnce, RunIf, RunWhile


def c_subgraph(program: Program, graph: int) -> str:
    """A subgraph as comments name it: its index, and its name spelled for a comment."""
    name = program.model.graphs[graph].name
    return f"{graph} '{c_text(name)}'" if name else str(graph)


def callee(em: Emission, step: CallOnce) -> Callee:
    """The subgraph a CALL_ONCE runs, its kernels emitted, and the state byte that records it
    ran."""
    program = em.mp.program
    em.emit_subgraph(step.subgraph)
    return Callee(c_subgraph(program, step.subgraph), em.calls(step.subgraph),
                  f"{em.at.name}_state[{step.flag}]")


def c_control(em: Emission, step: RunIf | RunWhile) -> CControl:
    """An IF's or WHILE's blocks as C, the kernels of their steps emitted first."""
    program = em.mp.program
    control = step.control
    blocks = []
    for block in control.blocks:
        em.emit_subgraph(block.subgraph)
        blocks.append(CBlock(c_subgraph(program, block.subgraph),
                             (*em.calls(block.subgraph), *copy_lines(em, block.copies))))
    return CControl(em.at.c_tensor(control.condition), tuple(blocks),
                    copy_lines(em, control.entry, "starts as"))


def copy_lines(em: Emission, moves: Iterable[Copy], verb: str = "<-") -> tuple[str, ...]:
    """The statements of IF's and WHILE's copies, each after a comment saying what."""
    program, tensors = em.mp.program, em.mp.graph.tensors
    lines = []
    for move in moves:
        dst, src = tensors[move.dst], tensors[move.src]
        if dst.nbytes:
            lines.append(f"/* {program.tensor_label(move.dst)} '{c_text(dst.name)}' {verb} "
                         f"{program.tensor_label(move.src)} '{c_text(src.name)}' */")
            lines.append(f"memcpy({em.at.byte_pointer(move.dst)}, "
                         f"{em.at.byte_pointer(move.src)}, {dst.nbytes});")
    return tuple(lines)
