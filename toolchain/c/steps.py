"""The kernels of a plan's steps, emitted in the order C needs: every op's kernel, a striped
segment's kernels and the function running its stripes, and a subgraph's kernels before the
CALL_ONCE, IF or WHILE that runs them; and the line that runs each step."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from toolchain.c.addressing import Addresses
from toolchain.c.control import c_control, callee
from toolchain.c.stripes import emit_segment
from toolchain.errors import ArenacError, UnsupportedOpError
from toolchain.lower.folding import DecodeFold, Fold
from toolchain.lower.fusion import PadFusion
from toolchain.lower.plan import ModelPlan
from toolchain.lower.program import Program
from toolchain.lower.steps import (
    CallOnce,
    RunIf,
    RunOp,
    RunSegment,
    RunWhile,
    Step,
    blocks_by_subgraph,
)
from toolchain.ops import REGISTRY
from toolchain.ops.emit import CDefinition, Kernel, OpContext
from toolchain.text import c_text


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


def folded_kernel(program: Program, fold: Fold | DecodeFold) -> Kernel:
    """A DEQUANTIZE or TFLM_DECODE folded at generation has no code: its outputs are
    constants."""
    tensors = program.graph.tensors
    if isinstance(fold, DecodeFold):
        decoded = ", ".join(f"'{c_text(tensors[t].name)}' from '{c_text(tensors[s].name)}' ({kind})"
                            for t, s, kind in zip(fold.tensors, fold.sources, fold.kinds,
                                                  strict=True))
        return Kernel("", note=f"folded: decoded at generation, {decoded}")
    return Kernel("", note=f"folded: '{c_text(tensors[fold.tensor].name)}' is the float32 "
                           f"constant it computes from float16 "
                           f"'{c_text(tensors[fold.source].name)}'")


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
    # op -> the bytes of its kernels' own tables of weights (CDefinition.is_kernel_weights)
    kernel_weights: dict[int, int] = field(default_factory=dict)
    order: tuple[int, ...] = field(init=False)  # the op of each step
    blocks: dict[int, tuple[Step, ...]] = field(init=False)  # subgraph -> its steps
    fns: dict[int, str] = field(init=False)  # op -> its kernel's function

    def __post_init__(self) -> None:
        mp, name = self.mp, self.at.name
        self.order = mp.lifetimes.order
        self.blocks = blocks_by_subgraph(mp.steps, mp.graph_index)
        self.fns = {op: kernel_function(name, mp, op) for op in self.order}

    def emit(self, context: OpContext) -> Kernel:
        """One op's kernel from its emitter, whose refusal names the op and the file."""
        program = self.mp.program
        op = context.op.index
        binding = program.bindings[op]
        emitter = binding.variant if binding.variant is not None else REGISTRY[context.op.kind]
        try:
            if isinstance(binding.params, PadFusion):
                return fused_kernel(program, binding.params)
            if isinstance(binding.params, Fold | DecodeFold):
                return folded_kernel(program, binding.params)
            return emitter.emit(context)
        except ArenacError as e:
            raise type(e)(f"{program.op_label(op)} {context.op.opcode}: {e.message}",
                          self.mp.model.source) from None

    def count_kernel_weights(self, op: int, definitions: Iterable[CDefinition]) -> None:
        """Adds the tables of weights among an op's kernel's new definitions to its count."""
        found = sum(d.flash_bytes for d in definitions if d.is_kernel_weights)
        self.kernel_weights[op] = self.kernel_weights.get(op, 0) + found

    def includes(self) -> set[str]:
        """The system headers the kernels emitted so far declare (Kernel.includes)."""
        return {header for k in self.kernel_of.values() for header in k.includes}

    def call(self, step: Step) -> tuple[str, ...]:
        """The lines that run a step: a call, or for an op with no code a comment saying why;
        a striped segment's one call, then a comment for each of its other steps."""
        name, mp = self.at.name, self.mp
        if isinstance(step, RunSegment):
            seg = step.segment
            return (f"{name}_stripes{seg.first}(); /* steps {seg.first}-{seg.last} striped */",
                    *(f"/* step {k}: {mp.step_label(k)}: runs in the stripes of step "
                      f"{seg.first} */" for k in range(seg.first + 1, seg.last + 1)))
        what = f"step {step.step}: {mp.step_label(step.step)}"
        kernel = self.kernel_of[step.op]
        if not kernel.text:
            return (f"/* {what}: {kernel.note} */",)
        if step.op in mp.program.int4_unpacks:
            tensor, _ = mp.program.int4_unpacks[step.op]
            count = mp.graph.tensors[tensor].num_elements
            return (f"arenac_unpack_int4((int8_t *){self.at.scratch_of[step.op][-1]}, "
                    f"{self.at.constant_name(tensor)}_int4, {count}u); "
                    f"{self.fns[step.op]}(); /* {what}, its int4 filter unpacked first */",)
        if kernel.stops:
            if mp.program.op_origin(step.op)[0] != mp.program.graph_index:
                raise UnsupportedOpError(f"{mp.program.op_label(step.op)}: a kernel that ends "
                                         "the invoke runs in the main graph only",
                                         mp.model.source)
            return (f"if ({self.fns[step.op]}() != 0) return {name.upper()}_WAITING; "
                    f"/* {what} */",)
        return (f"{self.fns[step.op]}(); /* {what} */",)

    def calls(self, subgraph: int) -> tuple[str, ...]:
        """The lines that run a subgraph's steps, whose kernels were emitted."""
        return tuple(line for step in self.blocks.get(subgraph, ()) for line in self.call(step))

    def emit_subgraph(self, subgraph: int) -> None:
        """The kernels of a subgraph's steps, each after those of the subgraphs it runs."""
        for step in self.blocks.get(subgraph, ()):
            if isinstance(step, RunSegment):
                emit_segment(self, step.segment)
            else:
                self.emit_step(step)

    def emit_step(self, step: RunOp | CallOnce | RunIf | RunWhile) -> None:
        """The kernel of an op that runs whole."""
        mp, at = self.mp, self.at
        op = step.op
        operator = mp.graph.operators[op]
        runs = callee(self, step) if isinstance(step, CallOnce) else None
        control = c_control(self, step) if isinstance(step, RunIf | RunWhile) else None
        inputs = tuple(at.c_tensor(t) for t in operator.inputs)
        scratch = at.scratch_of.get(op, ())
        if op in mp.program.int4_unpacks:  # the kernel reads its filter unpacked, in scratch
            packed = inputs[1]
            inputs = (inputs[0], replace(packed, pointer=f"(int8_t *){scratch[-1]}", used=None),
                      *inputs[2:])
            scratch = scratch[:-1]
            self.groups.append("unpack_int4")
        context = OpContext(
            self.fns[op], f"{at.name}_{mp.program.op_symbol(op)}", operator, self.params[op],
            inputs, tuple(at.c_tensor(t) for t in operator.outputs),
            scratch, runs, mp.program.op_label(op), control,
            at.kernel_state(op), mp.program.target)
        kernel = self.emit(context)
        self.kernel_of[op] = kernel
        self.count_kernel_weights(op, kernel.definitions)
        if kernel.text:
            self.texts.append(kernel.code)
        self.groups.extend(kernel.helpers)

