"""Lifetimes: which tensors need arena space, and during which steps of the execution order.

The rules are those of the method arenac is built on: a tensor's life starts at the step of the
operator that produces it (step 0 for graph inputs) and ends at the step of its last consumer
(the last step for graph outputs); a tensor nobody reads lives only during its producer's step.
Constants stay in flash and variables (recurrent state) persist, so neither is planned here:
they are listed beside the planned buffers. Resource handles (VAR_HANDLE's outputs) hold no bytes:
they name a resource variable, which lives in the state block too.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from toolchain.errors import ModelError
from toolchain.ir import Graph
from toolchain.ops.overlaps import INPLACE_KINDS
from toolchain.ops.spec import Binding
from toolchain.planners import Buffer, Overlap, align_up

# What a planned buffer may hold (BufferKey.kind).
TENSOR = "tensor"
SCRATCH = "scratch"  # a kernel's working memory
STRIPE = "stripe"  # the rows of an intermediate that a striped segment keeps
TFLM_SCRATCH = "tflm scratch"  # what only TFLite Micro's kernel would ask for
SHARED = "shared scratch"  # the kernels' scratch of a striped segment's ops, one op at a time


@dataclass(frozen=True, order=True)
class BufferKey:
    """What a planned buffer holds, by which every backend finds it in the plan: a tensor
    (`index` the tensor), a kernel's scratch (`index` the op, `slot` which of its kernel's
    requests), the stripe rows of an intermediate (`index` the tensor), scratch only TFLite
    Micro's kernel would ask for (`index` the op, `slot` which of TFLM's requests), or the
    scratch a striped segment's ops share (`index` its first op)."""

    kind: str
    index: int
    slot: int = 0

    def __str__(self) -> str:
        if self.kind == TENSOR:
            return f"tensor {self.index}"
        if self.kind == STRIPE:
            return f"the stripe rows of tensor {self.index}"
        return f"{self.kind} {self.slot} of op {self.index}"


@dataclass(frozen=True)
class ScratchRequest:
    """A per-op working buffer; it lives exactly during its op. Its `key` says whose it is: a
    kernel's, the stripe rows of a segment (asked for by the segment's first op), or one only
    TFLite Micro's kernel would ask for, planned to show TFLM's arena (`--planner tflm`) and
    never read by ours. `purpose` is what it is for, in words."""

    op: int
    size: int
    purpose: str
    key: BufferKey

    @property
    def kernel(self) -> bool:
        """Whether one of our kernels reads it."""
        return self.key.kind != TFLM_SCRATCH


@dataclass(frozen=True)
class Lifetimes:
    """The planner's input for one graph, with the map back to what each buffer holds.

    `order[step]` is the operator executed at that step; buffer ids are positions in
    `buffers`; `keys[id]` is what a buffer holds: the tensors first, then the scratch
    requests (`scratch`) in their order, then the buffers shared by the scratch of several ops
    (`shared`). `within` maps a kernel's scratch request held in a shared buffer to that
    buffer's key and its byte offset there (`holder`).
    """

    order: tuple[int, ...]
    buffers: tuple[Buffer, ...]
    keys: tuple[BufferKey, ...]
    scratch: tuple[ScratchRequest, ...]
    variables: tuple[int, ...]
    constants: tuple[int, ...]
    shared: tuple[ScratchRequest, ...] = ()
    within: Mapping[BufferKey, tuple[BufferKey, int]] = field(default_factory=dict)

    @cached_property
    def buffer_of(self) -> dict[BufferKey, int]:
        """The buffer of each key planned as a buffer of its own."""
        return {key: i for i, key in enumerate(self.keys)}

    def holder(self, key: BufferKey) -> tuple[int, int]:
        """The buffer that holds `key`, and the byte offset of its memory in that buffer (0
        unless a shared buffer holds it)."""
        outer, offset = self.within.get(key, (key, 0))
        return self.buffer_of[outer], offset

    @cached_property
    def tensor_buffers(self) -> dict[int, int]:
        """Planned tensor -> the buffer that holds it."""
        return {key.index: i for i, key in enumerate(self.keys) if key.kind == TENSOR}


@dataclass(frozen=True)
class TensorRoles:
    """The order-free half of the lifetimes rules: which tensors the arena holds and which
    operator writes each. `compute_lifetimes` and the scheduler's memory model both start
    from it, so the two cannot disagree on what is planned."""

    planned: tuple[bool, ...]  # per tensor: not constant (flash), variable (state) or a handle
    graph_inputs: frozenset[int]  # planned graph inputs: live from the first step
    graph_outputs: frozenset[int]  # live until the last step
    producer: dict[int, int]  # planned tensor (not a graph input) -> the op that writes it
    # planned tensors nothing writes that only ops without a kernel read: their working memory
    # (an NPU op's scratch in a Vela-compiled model), live from the first reader to the last,
    # as TFLite allocates them, so that the op itself is what a user is told about
    unwritten: frozenset[int] = frozenset()

    @classmethod
    def of(cls, graph: Graph, source: str | None = None,
           kernelless: Collection[int] = ()) -> TensorRoles:
        """Raises ModelError for a tensor two operators write. `kernelless`: the operators no
        kernel runs, whose unwritten inputs are their working memory."""
        tensors = graph.tensors
        planned = tuple(not (t.is_constant or t.is_variable or t.is_handle) for t in tensors)
        graph_inputs = frozenset(t for t in graph.inputs if 0 <= t < len(tensors) and planned[t])
        producer: dict[int, int] = {}
        for op in graph.operators:
            for t in op.outputs:
                if not planned[t]:
                    continue
                if t in graph_inputs or t in producer:
                    raise ModelError(f"tensor {t} ({tensors[t].name!r}) is written twice", source)
                producer[t] = op.index
        readers: dict[int, set[int]] = {}
        for op in graph.operators:
            for t in op.inputs:
                if 0 <= t < len(tensors) and planned[t] and t not in graph_inputs \
                        and t not in producer:
                    readers.setdefault(t, set()).add(op.index)
        unwritten = frozenset(t for t, ops in readers.items() if ops <= set(kernelless))
        return cls(planned, graph_inputs, frozenset(graph.outputs), producer, unwritten)


def model_order(graph: Graph) -> tuple[int, ...]:
    """The operators in the order the file lists them: TFLite's own execution order."""
    return tuple(range(len(graph.operators)))


def check_order(graph: Graph, order: Sequence[int], source: str | None = None,
                roles: TensorRoles | None = None) -> TensorRoles:
    """Raises ModelError unless `order` runs the graph: a permutation of its operators in which
    every planned tensor is written once, before anything reads it. Returns the roles."""
    if sorted(order) != list(range(len(graph.operators))):
        raise ModelError("execution order is not a permutation of the operators", source)
    roles = roles or TensorRoles.of(graph, source)
    step_of = {op: step for step, op in enumerate(order)}
    for op_index in order:
        op = graph.operators[op_index]
        for t in op.inputs:
            if t < 0 or not roles.planned[t] or t in roles.graph_inputs or t in roles.unwritten:
                continue
            writer = roles.producer.get(t)
            if writer is None or step_of[writer] >= step_of[op_index]:
                raise ModelError(
                    f"operator {op_index} ({op.opcode}) reads tensor {t} "
                    f"({graph.tensors[t].name!r}) before anything writes it",
                    source,
                )
    return roles


def compute_lifetimes(
    graph: Graph,
    order: Sequence[int] | None = None,
    scratch: Sequence[ScratchRequest] = (),
    source: str | None = None,
    outside: Collection[int] = (),
    roles: TensorRoles | None = None,
    lives: Mapping[int, int] | None = None,
    merged: Mapping[int, int] | None = None,
    share: Sequence[Sequence[int]] = (),
    alignment: int = 1,
) -> Lifetimes:
    """Buffers (id, size, first, last) for every activation tensor and scratch request.

    `order` is the seam for a chosen schedule: any permutation of the operators in which every
    tensor is written before it is read. `outside` names tensors the caller keeps in buffers of
    its own (inputs and outputs with external I/O): they get no arena space. `roles`, when
    the caller has them already, spare deriving them again. `lives` gives tensors a step they
    live to at least, beyond their readers (what IF and WHILE copy between the steps of their
    subgraphs: toolchain.lower.program.Program.control_lives). `merged` maps steps to the step they
    count at (a striped segment's steps all count at its first: toolchain.lower.tiling).
    `share` groups ops that run one at a time within one step (a striped segment's, in
    order): their kernels' scratch shares one buffer (`shared_scratch`), each op's requests
    from its start, `alignment` apart.
    """
    order = tuple(model_order(graph) if order is None else order)
    roles = check_order(graph, order, source, roles)
    merged = merged or {}
    step_of = {op: merged.get(step, step) for step, op in enumerate(order)}
    last_step = max(len(order) - 1, 0)
    tensors = graph.tensors
    first = {t: 0 for t in roles.graph_inputs}
    first.update((t, step_of[op]) for t, op in roles.producer.items())
    for t in roles.unwritten:
        first[t] = min(step_of[op.index] for op in graph.operators if t in op.inputs)
    last: dict[int, int] = {}
    for step, op_index in enumerate(order):
        for t in graph.operators[op_index].inputs:
            if t >= 0 and roles.planned[t]:
                last[t] = merged.get(step, step)
    for t in roles.graph_outputs:
        if t in first:
            last[t] = last_step
    for t, step in (lives or {}).items():
        if t in first:
            last[t] = max(last.get(t, first[t]), step)
    live = [t for t in range(len(tensors)) if t in first and t not in outside]
    buffers = [
        Buffer(id=i, size=tensors[t].nbytes, first=first[t], last=last.get(t, first[t]))
        for i, t in enumerate(live)
    ]
    keys = [BufferKey(TENSOR, t) for t in live]
    within, shared = shared_scratch(scratch, share, alignment)
    for request in (*(r for r in scratch if r.key not in within), *shared):
        step = step_of[request.op]
        buffers.append(Buffer(id=len(buffers), size=request.size, first=step, last=step))
        keys.append(request.key)
    if len(set(keys)) != len(keys):
        raise ValueError("two scratch requests share a key")  # the caller's bug, not the model's
    return Lifetimes(
        order=order,
        buffers=tuple(buffers),
        keys=tuple(keys),
        scratch=tuple(scratch),
        variables=tuple(t.index for t in tensors if t.is_variable),
        constants=tuple(t.index for t in tensors if t.is_constant),
        shared=shared,
        within=within,
    )


def shared_scratch(scratch: Sequence[ScratchRequest], share: Sequence[Sequence[int]],
                   alignment: int) -> tuple[dict[BufferKey, tuple[BufferKey, int]],
                                            tuple[ScratchRequest, ...]]:
    """One buffer for the kernels' scratch of each group of ops that run one at a time (two
    ops or more with scratch): as large as the most one op asks for, each op's requests laid
    from its start. A striped segment's ops take turns stripe by stripe, and each call of a
    kernel fills the scratch it reads, so none needs another's kept. Returns where each request
    lies (its key -> the shared key and the byte offset) and the shared requests."""
    within: dict[BufferKey, tuple[BufferKey, int]] = {}
    shared = []
    asked: dict[int, list[ScratchRequest]] = {}  # op -> its kernel's requests, in order
    for request in scratch:
        if request.key.kind == SCRATCH:
            asked.setdefault(request.op, []).append(request)
    for ops in share:
        if sum(op in asked for op in ops) < 2:
            continue
        key, size = BufferKey(SHARED, ops[0]), 0
        for op in ops:
            at = 0
            for request in asked.get(op, ()):
                within[request.key] = (key, at)
                size = max(size, at + request.size)
                at += align_up(request.size, alignment)
        users = ", ".join(f"op {op}" for op in ops if op in asked)
        shared.append(ScratchRequest(ops[0], size, f"the scratch of {users}, one at a time",
                                     key))
    return within, tuple(shared)


def overlap_pairs(
    graph: Graph,
    lifetimes: Lifetimes,
    bindings: Sequence[Binding | None],
    inplace: bool = True,
    overlap: bool = True,
    kept: Collection[int] = (),
) -> tuple[Overlap, ...]:
    """Overlaps the planner may use: an op's output over one of its inputs that dies there.

    The rules are those of each op's binding (its kernel's loop order), `inplace` switching on
    aliases and elementwise rewrites, `overlap` windowed ones. Only pairs whose lives touch at
    exactly that op qualify: the input's last step and the
    output's first step are both the op's step. A graph output never dies, even when its last
    reader runs at the last step, so nothing may be placed over it; nor may anything be placed
    over a `kept` tensor (one that IF or WHILE reads after its last reader ran).
    """
    buffer_of = lifetimes.tensor_buffers
    graph_outputs = set(graph.outputs)
    pairs = []
    for step, op_index in enumerate(lifetimes.order):
        op = graph.operators[op_index]
        binding = bindings[op_index]
        rules = binding.overlaps if binding is not None else ()
        for rule in (r for r in rules if (inplace if r.kind in INPLACE_KINDS else overlap)):
            above = buffer_of.get(op.inputs[rule.input])
            below = buffer_of.get(op.outputs[rule.output])
            if above is None or below is None or above == below:
                continue
            if op.inputs[rule.input] in graph_outputs or op.inputs[rule.input] in kept:
                continue
            if lifetimes.buffers[above].last == step and lifetimes.buffers[below].first == step:
                pairs.append(Overlap(below, above, rule.shift, rule.any_offset))
    return tuple(pairs)
