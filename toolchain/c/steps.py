"""The kernels of a plan's steps, emitted in the order C needs: every op's kernel, a striped
segment's kernels and the function running its stripes, and a subgraph's kernels before the
CALL_ONCE, IF or WHILE that runs them; and the line that runs each step."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from toolchain.c.addressing import Addresses
from toolchain.c.control import c_control, callee
from toolchain.c.stripes import emit_segment
from toolchain.errors import ArenacError
from toolchain.lower.fusion import PadFusion
from toolchain.lower.plan import ModelPlan
from toolchain.lower.program import Program
from toolchain.lower.tiling import Segment
from toolchain.ops import REGISTRY
from toolchain.ops.emit import Kernel, OpContext


def kernel_function(name: str, mp: ModelPlan, op: int) -> str:
    """The C function of one op's kernel: NAME_op3_add, NAME_sg1_op0_assign_variable,
    NAME_op2_signal_rfft (a custom op by its code)."""
    operator = mp.graph.operators[op]
    kind = operator.opcode
    if kind == "CUSTOM":  # only registered codes get here: CamelCase letters
        kind = re.sub(r"[^A-Za-z0-9_]", "", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", operator.kind))
    return f"{name}_{mp.program.op_symbol(op)}_{kind.lower()}"


def fused_kernel(program: Program, fusion: PadFusion) -> Kernel:
    """A PAD fused into the op reading it has no code: that op pads as it reads."""
    reader = program.graph.operators[fusion.op]
    return Kernel("", note=f"fused into {program.op_label(fusion.op)} {reader.opcode}, "
                           "which reads its input as padded")


@dataclass
class Emission:
    """What emitting one plan's kernels shares and gathers: the steps of each subgraph and the
    segments they run in, and, as kernels are emitted, their text in file order, the helper
    groups they call and each op's Kernel."""

    mp: ModelPlan
    at: Addresses
    params: list[Any]
    texts: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)  # the helper groups the kernels call
    kernel_of: dict[int, Kernel] = field(default_factory=dict)
    order: tuple[int, ...] = field(init=False)  # the op of each step
    steps_of: dict[int, list[int]] = field(init=False)  # subgraph -> its steps, in order
    fns: dict[int, str] = field(init=False)  # op -> its kernel's function
    segment_of: dict[int, Segment] = field(init=False)  # a striped step -> its segment
    flags: dict[int, str] = field(init=False)  # a subgraph CALL_ONCE runs -> its state byte

    def __post_init__(self) -> None:
        mp, name = self.mp, self.at.name
        self.order = mp.lifetimes.order
        self.steps_of = {}
        for step, op in enumerate(self.order):
            self.steps_of.setdefault(mp.program.op_origin(op)[0], []).append(step)
        self.fns = {op: kernel_function(name, mp, op) for op in self.order}
        self.segment_of = {step: seg for seg in mp.tiling.segments
                           for step in range(seg.first, seg.last + 1)}
        self.flags = {slot.subgraph: f"{name}_state[{slot.offset}]"
                      for slot in mp.state_slots if slot.kind == "call_once"}

    def emit(self, context: OpContext) -> Kernel:
        """One op's kernel from its emitter, whose refusal names the op and the file."""
        program = self.mp.program
        op = context.op.index
        binding = program.bindings[op]
        emitter = binding.variant if binding.variant is not None else REGISTRY[context.op.kind]
        try:
            if isinstance(binding.params, PadFusion):
                return fused_kernel(program, binding.params)
            return emitter.emit(context)
        except ArenacError as e:
            raise type(e)(f"{program.op_label(op)} {context.op.opcode}: {e.message}",
                          self.mp.model.source) from None

    def call(self, step: int) -> str:
        """The line that runs a step: a call, or for an op with no code a comment saying why."""
        name, mp = self.at.name, self.mp
        what = f"step {step}: {mp.step_label(step)}"
        if step in self.segment_of:
            seg = self.segment_of[step]
            if step != seg.first:
                return f"/* {what}: runs in the stripes of step {seg.first} */"
            return f"{name}_stripes{step}(); /* steps {seg.first}-{seg.last} striped */"
        op = self.order[step]
        kernel = self.kernel_of[op]
        if not kernel.text:
            return f"/* {what}: {kernel.note} */"
        return f"{self.fns[op]}(); /* {what} */"

    def calls(self, subgraph: int) -> tuple[str, ...]:
        """The lines that run a subgraph's steps, whose kernels were emitted."""
        return tuple(self.call(step) for step in self.steps_of.get(subgraph, ()))

    def emit_subgraph(self, subgraph: int) -> None:
        """The kernels of a subgraph's steps, each after those of the subgraphs it runs."""
        for step in self.steps_of.get(subgraph, ()):
            if step in self.segment_of:
                if step == self.segment_of[step].first:
                    emit_segment(self, self.segment_of[step])
                continue
            self.emit_step(self.order[step])

    def emit_step(self, op: int) -> None:
        """The kernel of an op that runs whole."""
        mp, at = self.mp, self.at
        operator = mp.graph.operators[op]
        runs = callee(self, op)
        control = c_control(self, op)
        context = OpContext(
            self.fns[op], f"{at.name}_{mp.program.op_symbol(op)}", operator, self.params[op],
            tuple(at.c_tensor(t) for t in operator.inputs),
            tuple(at.c_tensor(t) for t in operator.outputs),
            at.scratch_of.get(op, ()), runs, mp.program.op_label(op), control,
            at.kernel_state(op), mp.program.target)
        kernel = self.emit(context)
        self.kernel_of[op] = kernel
        if kernel.text:
            self.texts.append(kernel.text)
        self.groups.extend(kernel.helpers)
