"""A graph lowered for planning: every operator bound to its kernel before any byte is placed.

The planner, runtime_py and the C generator all read the same Program, so the memory a kernel
asks for (scratch) is planned with the tensors, the overlaps a planner may use are the ones the
bound kernel's loop order makes safe, and what `inspect` marks unsupported is exactly what the
backends refuse.

A graph that calls further subgraphs (CALL_ONCE's initialization subgraph) is lowered with them
as one graph: the tensors and operators of every subgraph it runs, renumbered after its own
(`SubgraphLayout`), so that one plan, one `verify` and one memory map cover them all. The steps
of a called subgraph follow its caller's step in the execution order (`Program.flatten`): its
tensors live within that call, and its caller's tensors alive across the call stay alive
through it. The resource variables the ops name (`ResourceVariable`) persist in the state
block, as variable tensors do.

IF and WHILE run subgraphs too, each laid out once, its steps after the op's step in the order
the op names them (IF: then, else; WHILE: condition, body), so that both branches of an IF, and
the condition and body of a WHILE, share the memory of one step. A subgraph's inputs are not
copies: its ops read the tensors the op passes in their place (`SubgraphLayout.aliases`): an IF
branch reads the IF's inputs, a WHILE's condition and body read its loop values, which are the
WHILE's outputs. What a subgraph hands back is copied out after its steps (`Control`): a
branch's outputs into the IF's outputs, the body's outputs into the loop values; the WHILE's step
copies its inputs into the loop values first. Those copies are planned: what they read lives
until its block's last step, the loop values across the whole WHILE (`Program.control_lives`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from toolchain.errors import PlanError
from toolchain.front.validate import called_subgraphs, same_shape
from toolchain.ir import Graph, Model, Operator
from toolchain.lower.folding import (
    DecodeFold,
    Fold,
    fold_constants,
    folded_binding,
    int4_filter,
)
from toolchain.lower.fusion import PadFusion, control_tensors
from toolchain.lower.fusion import fuse_padding as fuse
from toolchain.lower.lifetimes import SCRATCH, TFLM_SCRATCH, BufferKey, ScratchRequest
from toolchain.ops import REGISTRY, Refusal, bind, bind_graph, refusal_error
from toolchain.ops.spec import Binding, MemoryRequest
from toolchain.targets import GENERIC, get_target


@dataclass(frozen=True)
class ResourceVariable:
    """A resource variable: TFLite's key (container, shared name), what it holds (fixed by the
    first ASSIGN_VARIABLE the first invocation runs) and the handle tensors that name it."""

    key: tuple[str, str]
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    handles: tuple[int, ...]

    @property
    def name(self) -> str:
        return variable_name(self.key)


def variable_name(key: tuple[str, str]) -> str:
    """How messages and comments name a resource variable: its shared name, after its
    container when it has one."""
    container, shared_name = key
    return f"{container}/{shared_name}" if container else shared_name


@dataclass(frozen=True)
class Copy:
    """A copy of tensor `src` into tensor `dst` (both of `graph`, `dst`'s bytes) that a
    control-flow op makes itself, between the steps of its subgraphs."""

    dst: int
    src: int


@dataclass(frozen=True)
class Block:
    """A subgraph a control-flow op runs, and the copies that carry its results out after its
    steps (into IF's outputs; into WHILE's loop values)."""

    subgraph: int
    copies: tuple[Copy, ...] = ()


@dataclass(frozen=True)
class Control:
    """An IF or WHILE of `graph` with the subgraphs it runs, as `blocks` in step order.

    IF: blocks (then, else); `condition` is its input 0. WHILE: blocks (condition, body);
    `condition` is the condition subgraph's output, `carried` the loop values (its outputs that
    hold numbers), which `entry` fills from its inputs before the first test."""

    op: int
    opcode: str
    condition: int
    blocks: tuple[Block, ...]
    entry: tuple[Copy, ...] = ()
    carried: tuple[int, ...] = ()


@dataclass(frozen=True, eq=False)
class SubgraphLayout:
    """The subgraphs a program runs laid into one graph: subgraph `g`'s tensor i is tensor
    `tensor_base[g] + i` of `graph`, its op j op `op_base[g] + j`. `calls` maps each CALL_ONCE
    (by op of `graph`) to the subgraph it runs; a CALL_ONCE of a subgraph that an earlier one
    runs already is absent (it never has anything left to do). `controls` maps each IF and
    WHILE to what it runs; `aliases` maps each input tensor of a subgraph they run, and each
    resource handle they hand back, to the tensor ops read in its place (already followed
    through nested subgraphs)."""

    graph: Graph
    subgraphs: tuple[int, ...]  # the main graph first, then the called ones in call order
    op_base: Mapping[int, int]
    tensor_base: Mapping[int, int]
    op_origin: tuple[tuple[int, int], ...]
    tensor_origin: tuple[tuple[int, int], ...]
    calls: Mapping[int, int]
    controls: Mapping[int, Control] = field(default_factory=dict)
    aliases: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Program:
    """One graph of a model with each operator's binding (None where no kernel binds it, with
    the reason among `refusals`). A plan can be made for a graph with refused operators, so
    that `plan` shows a model it cannot run; the backends ask `params()`, which refuses.

    `layout` is None when the graph calls no subgraph; then `graph` is the model's own.
    `resources` are the resource variables its ops use, `handles` maps each handle tensor to
    its variable (a position in `resources`).
    `target` (toolchain.targets) is what the kernels were bound for; with `portable`, its
    portable kernels only (the baseline its own kernels are measured against).
    `pad_fusions`: every PAD feeding a windowed op, fused or why not (toolchain.lower.fusion);
    `folds`: the ops folded into constants (toolchain.lower.folding); `rewritten_graph` is the
    graph with the fused and folded ops rewritten, when there are any. `int4_unpacks`: the ops
    whose int4 filter the C keeps packed in flash, op -> (filter tensor, its packed bytes): each
    unpacks it into its last scratch request before it runs (int4_unpacks). `given_up`: the
    target kernels an op was bound to before giving them up, op -> their names in that order
    (a plan within `--max-arena`: toolchain.lower.plan.within_arena); the op now runs the next
    target kernel that takes it, or its portable one."""

    model: Model
    graph_index: int
    bindings: tuple[Binding | None, ...]
    refusals: tuple[Refusal, ...]
    layout: SubgraphLayout | None = None
    resources: tuple[ResourceVariable, ...] = ()
    handles: Mapping[int, int] = field(default_factory=dict)
    target: str = GENERIC
    portable: bool = False
    pad_fusions: tuple[PadFusion, ...] = ()
    folds: tuple[Fold | DecodeFold, ...] = ()
    rewritten_graph: Graph | None = None
    int4_unpacks: Mapping[int, tuple[int, bytes]] = field(default_factory=dict)
    given_up: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def graph(self) -> Graph:
        if self.rewritten_graph is not None:
            return self.rewritten_graph
        return self.layout.graph if self.layout else self.model.graphs[self.graph_index]

    @property
    def fused_pads(self) -> tuple[PadFusion, ...]:
        """The PADs whose padding the windowed op reading them applies (toolchain.lower.fusion)."""
        return tuple(f for f in self.pad_fusions if f.fused)

    @property
    def calls(self) -> Mapping[int, int]:
        """CALL_ONCE op -> the subgraph it runs (empty when the graph calls none)."""
        return self.layout.calls if self.layout else {}

    @property
    def controls(self) -> Mapping[int, Control]:
        """IF and WHILE op -> what it runs (empty when the graph has none)."""
        return self.layout.controls if self.layout else {}

    @property
    def aliases(self) -> Mapping[int, int]:
        """Input tensor of a subgraph that IF or WHILE runs (or a handle it hands back) -> the
        tensor read in its place."""
        return self.layout.aliases if self.layout else {}

    @property
    def subgraphs(self) -> tuple[int, ...]:
        return self.layout.subgraphs if self.layout else (self.graph_index,)

    def runs(self, op: int) -> tuple[int, ...]:
        """The subgraphs whose steps follow op `op`'s, in order."""
        if op in self.calls:
            return (self.calls[op],)
        if op in self.controls:
            return tuple(block.subgraph for block in self.controls[op].blocks)
        return ()

    def params(self) -> list[Any]:
        """Every operator's params, or one error naming every operator no kernel binds."""
        if self.refusals:
            raise refusal_error(self.refusals, self.model.source)
        return [b.params for b in self.bindings]

    def scratch(self) -> tuple[ScratchRequest, ...]:
        """Every kernel's scratch, as buffers living during their op's step."""
        return tuple(
            ScratchRequest(b.op, request.size, request.purpose, BufferKey(SCRATCH, b.op, k))
            for b in self.bindings
            if b is not None
            for k, request in enumerate(b.scratch)
        )

    def tflm_scratch(self) -> tuple[ScratchRequest, ...]:
        """The scratch TFLite Micro's kernels would request, op by op in their order, so that
        `--planner tflm` plans TFLM's own buffers: each of our kernel's requests takes the next
        of its op's TFLM requests that holds it (so it keeps its place among ours, and the
        buffer TFLM's size); ours that none holds follow their op's TFLM requests, and the
        TFLM requests left over are planned without our kernel reading them."""
        requests = []
        for b in (b for b in self.bindings if b is not None):
            slots = [ScratchRequest(b.op, t.size, f"unused here, as TFLite Micro plans it: "
                                    f"{t.purpose}", BufferKey(TFLM_SCRATCH, b.op, k))
                     for k, t in enumerate(b.tflm_scratch)]
            ours, at = list(enumerate(b.scratch)), 0
            while ours:
                at = next((k for k in range(at, len(slots)) if slots[k].size >= ours[0][1].size),
                          None)
                if at is None:
                    break
                mine, request = ours.pop(0)
                slots[at] = ScratchRequest(b.op, slots[at].size, request.purpose,
                                           BufferKey(SCRATCH, b.op, mine))
                at += 1
            requests += slots
            requests += [ScratchRequest(b.op, r.size, r.purpose, BufferKey(SCRATCH, b.op, k))
                         for k, r in ours]
        return tuple(requests)

    # --- where ops and tensors come from ----------------------------------------------------
    def op_origin(self, op: int) -> tuple[int, int]:
        """(subgraph, op index there) of an op of `graph`."""
        return self.layout.op_origin[op] if self.layout else (self.graph_index, op)

    def tensor_origin(self, tensor: int) -> tuple[int, int]:
        """(subgraph, tensor index there) of a tensor of `graph`."""
        return self.layout.tensor_origin[tensor] if self.layout else (self.graph_index, tensor)

    @property
    def stops_early(self) -> bool:
        """Whether some kernel may end an invoke before the last step (OpSpec.stops: a
        CIRCULAR_BUFFER gathering frames); such an invoke gives no outputs."""
        return any(b is not None and REGISTRY[b.opcode].stops for b in self.bindings)

    def op_label(self, op: int) -> str:
        """"op 3", or "subgraph 1 op 0" for an op of a called subgraph."""
        graph, index = self.op_origin(op)
        return f"op {index}" if graph == self.graph_index else f"subgraph {graph} op {index}"

    def tensor_label(self, tensor: int) -> str:
        graph, index = self.tensor_origin(tensor)
        if graph == self.graph_index:
            return f"tensor {index}"
        return f"subgraph {graph} tensor {index}"

    def tensor_symbol(self, tensor: int) -> str:
        """A C identifier suffix for a tensor: `t3`, or `sg1_t0` in a called subgraph."""
        graph, index = self.tensor_origin(tensor)
        return f"t{index}" if graph == self.graph_index else f"sg{graph}_t{index}"

    def op_symbol(self, op: int) -> str:
        """A C identifier suffix for an op: `op3`, or `sg1_op0` in a called subgraph."""
        graph, index = self.op_origin(op)
        return f"op{index}" if graph == self.graph_index else f"sg{graph}_op{index}"

    def subgraph_label(self, graph: int) -> str:
        name = self.model.graphs[graph].name
        return f"{graph} {name!r}" if name else str(graph)

    def ops_of(self, graph: int) -> range:
        """The ops of `graph` that subgraph `graph` contributes, as indices of `graph`."""
        base = self.layout.op_base[graph] if self.layout else 0
        return range(base, base + len(self.model.graphs[graph].operators))

    # --- execution orders -------------------------------------------------------------------
    def flatten(self, orders: Mapping[int, Sequence[int]]) -> tuple[int, ...]:
        """The execution order of the whole program from each subgraph's own order (op indices
        of that subgraph): the main graph's, with each op that runs subgraphs followed by their
        steps."""
        steps: list[int] = []

        def walk(graph: int) -> None:
            base = self.ops_of(graph).start
            for local in orders[graph]:
                op = base + local
                steps.append(op)
                for sub in self.runs(op):
                    walk(sub)

        walk(self.graph_index)
        return tuple(steps)

    def file_order(self) -> tuple[int, ...]:
        """The order TFLite runs the first invocation in: every subgraph in the file's order."""
        return self.flatten({g: range(len(self.model.graphs[g].operators))
                             for g in self.subgraphs})

    def local_orders(self, order: Sequence[int]) -> dict[int, list[int]]:
        """Each subgraph's own order (its op indices) within an order of the whole program."""
        orders: dict[int, list[int]] = {g: [] for g in self.subgraphs}
        for op in order:
            graph, index = self.op_origin(op)
            orders[graph].append(index)
        return orders

    def spans(self, order: Sequence[int]) -> dict[int, tuple[range, ...]]:
        """Step of each op that runs subgraphs -> the steps of each subgraph it runs, in order
        (nested ones included). Raises PlanError unless every such op is followed by exactly
        the steps of its subgraphs."""
        if self.layout is None:
            return {}
        order = tuple(order)
        if self.flatten(self.local_orders(order)) != order:
            raise PlanError(
                "the execution order does not run each called subgraph's steps right after the "
                "CALL_ONCE, IF or WHILE that runs them",
                self.model.source,
            )
        sizes: dict[int, int] = {}

        def size(graph: int) -> int:
            if graph not in sizes:
                sizes[graph] = sum(1 + sum(size(sub) for sub in self.runs(op))
                                   for op in self.ops_of(graph))
            return sizes[graph]

        spans = {}
        for step, op in enumerate(order):
            start, blocks = step + 1, []
            for sub in self.runs(op):
                blocks.append(range(start, start + size(sub)))
                start += size(sub)
            if blocks:
                spans[step] = tuple(blocks)
        return spans

    def control_lives(self, order: Sequence[int]) -> tuple[dict[int, int], frozenset[int]]:
        """What IF and WHILE need of the plan beyond their ops' operands: tensor -> the last
        step it must live to (a block's copies read their sources after its last step, or
        right after the op's step for a block without steps; the loop values live across the
        whole WHILE), and the tensors those copies and tests read, which no op may overwrite
        in place."""
        lives: dict[int, int] = {}
        kept: set[int] = set()

        def need(tensor: int, step: int) -> None:
            lives[tensor] = max(lives.get(tensor, step), step)

        order = tuple(order)
        for step, blocks in self.spans(order).items():
            control = self.controls.get(order[step])
            if control is None:
                continue
            end = blocks[-1].stop - 1  # the last step within the op's span
            ends = []  # where each block's copies run: after its last step
            for block in blocks:
                ends.append(block.stop - 1 if block else (ends[-1] if ends else step))
            if control.opcode == "WHILE":
                need(control.condition, ends[0])
                kept.add(control.condition)
                for t in control.carried:
                    need(t, end)
                    kept.add(t)
            for block, at in zip(control.blocks, ends, strict=True):
                for copy in block.copies:
                    need(copy.src, at)
                    need(copy.dst, end)
                    kept.add(copy.src)
        return lives, frozenset(kept)


def lower(model: Model, graph_index: int = 0, target: str = GENERIC,
          portable: bool = False, fuse_padding: bool = True,
          given_up: Mapping[int, tuple[str, ...]] | None = None) -> Program:
    """Bind every operator of one graph and of the subgraphs it calls for `target` (with
    `portable`, to its portable kernels only; an op of `given_up` to none of the target
    kernels it names); an op the
    model cannot mean fails here, before any planning (a variant no kernel runs is kept as a
    refusal). With `fuse_padding`, a PAD in front of a windowed op becomes that op's padding
    where that is exact (toolchain.lower.fusion)."""
    get_target(target, model.source)  # an unknown name is one clear error
    layout, laid = lay_out(model, graph_index)
    if layout is None:
        graph, label = model.graphs[graph_index], None
    else:
        graph = layout.graph

        def label(op: Operator) -> str:
            origin, index = layout.op_origin[op.index]
            return f"op {index}" if origin == graph_index else f"subgraph {origin} op {index}"

    original = graph
    graph, folds = fold_constants(graph)
    bindings, refusals = bind_graph(graph, GENERIC if portable else target, label,
                                    {f.op: folded_binding(f) for f in folds})
    if any(r.invalid for r in refusals):
        raise refusal_error(refusals, model.source)
    fusions = ()
    if fuse_padding:
        held = control_tensors(layout.controls.values()) if layout else frozenset()
        graph, bindings, fusions = fuse(graph, bindings, GENERIC if portable else target, held)
    laid_refusals = tuple(Refusal(op, f"{label(graph.operators[op]) if label else f'op {op}'} "
                                      f"{graph.operators[op].opcode}: {message}")
                          for op, message in laid)
    bindings, demoted = rebound_without(graph, bindings, target, given_up or {})
    bindings, unpacks = int4_unpacks(original, bindings)
    program = Program(model, graph_index, bindings, (*refusals, *laid_refusals), layout,
                      target=target, portable=portable, pad_fusions=fusions, folds=folds,
                      rewritten_graph=graph if graph is not original else None,
                      int4_unpacks=unpacks, given_up=demoted)
    resources, handles, problems = resource_variables(program)
    return replace(program, refusals=(*program.refusals, *problems), resources=resources,
                   handles=handles)


def rebound_without(graph: Graph, bindings: tuple[Binding | None, ...], target: str,
                    given_up: Mapping[int, tuple[str, ...]]) -> tuple[
                        tuple[Binding | None, ...], dict[int, tuple[str, ...]]]:
    """The bindings with each op of `given_up` bound again (to the op as it stands, its PAD
    fused) to none of the target kernels it names, and the kernels each op that changed
    gave up."""
    bound, changed = list(bindings), {}
    for op, names in sorted(given_up.items()):
        binding = bindings[op] if 0 <= op < len(bindings) else None
        if binding is not None and binding.variant is not None and binding.variant.name in names:
            bound[op] = bind(graph, graph.operators[op], target, frozenset(names))
            changed[op] = names
    return tuple(bound), changed


def int4_unpacks(graph: Graph, bindings: tuple[Binding | None, ...]) -> tuple[
        tuple[Binding | None, ...], dict[int, tuple[int, bytes]]]:
    """The bindings with a scratch request more for every portable kernel whose filter is int4
    in `graph` (the file's: toolchain.lower.folding unpacked it for every prepare): the C keeps
    the filter packed in flash and unpacks it there before the kernel runs, as TFLite Micro
    unpacks into its arena. Such an op runs whole (a stripe's kernel asks for one request
    fewer). A target kernel lays its filter out for its own loops, and keeps that instead."""
    unpacks, bound = {}, list(bindings)
    for op in graph.operators:
        filter_, binding = int4_filter(graph, op), bindings[op.index]
        if filter_ is None or binding is None or binding.variant is not None:
            continue
        request = MemoryRequest(filter_.num_elements, "its int4 filter, unpacked from flash")
        bound[op.index] = replace(binding, scratch=(*binding.scratch, request))
        unpacks[op.index] = (filter_.index, bytes(filter_.data))
    return tuple(bound), unpacks


def lay_out(model: Model, graph_index: int) -> tuple[SubgraphLayout | None,
                                                     list[tuple[int, str]]]:
    """The graph and the subgraphs it runs laid into one (None when it runs none), and what
    no backend runs as planned copies of fixed size, as (op of the laid-out graph, reason).

    The reader validated every call (toolchain.front.validate.check_calls). A subgraph is laid out
    once: at the first CALL_ONCE that reaches it, or for the one IF or WHILE that runs it (a
    subgraph that two of them, or one twice, run is refused: its tensors would need a place
    per caller)."""
    graphs = model.graphs
    order = [graph_index]
    runs: list[tuple[int, int, tuple[int, ...]]] = []  # (caller subgraph, its op, run)
    problems: list[tuple[int, int, str]] = []  # (subgraph, its op, reason)
    controlled: set[int] = set()  # the subgraphs an IF or WHILE runs

    def visit(g: int) -> None:
        for op in graphs[g].operators:
            targets = called_subgraphs(op)
            if not targets or not all(isinstance(t, int) and 0 <= t < len(graphs)
                                      for t in targets):
                continue
            if op.opcode == "CALL_ONCE":
                if targets[0] in controlled:
                    problems.append((g, op.index, f"runs subgraph {targets[0]}, which an IF or "
                                                  "WHILE runs too"))
                elif targets[0] not in order:
                    order.append(targets[0])
                    runs.append((g, op.index, targets))
                    visit(targets[0])
                continue
            shared = next((t for t in targets if t in order or targets.count(t) > 1), None)
            if shared is not None:
                problems.append((g, op.index, f"runs subgraph {shared}, which another operator "
                                              "or branch runs too; each IF and WHILE needs "
                                              "subgraphs of its own"))
                continue
            order.extend(targets)
            controlled.update(targets)
            for t in targets:
                visit(t)
            runs.append((g, op.index, targets))

    visit(graph_index)
    if len(order) == 1:  # what it runs was refused: its ops keep their indices
        return None, [(op, message) for _, op, message in problems]
    op_base, tensor_base = {}, {}
    ops, tensors = 0, 0
    for g in order:
        op_base[g], tensor_base[g] = ops, tensors
        ops += len(graphs[g].operators)
        tensors += len(graphs[g].tensors)
    aliases = _aliases(graphs, runs, tensor_base)

    def moved(refs: tuple[int, ...], base: int, alias: bool = False) -> tuple[int, ...]:
        return tuple(-1 if r < 0 else _follow(aliases, r + base) if alias else r + base
                     for r in refs)

    merged_tensors, merged_ops = [], []
    tensor_origin, op_origin = [], []
    for g in order:
        base = tensor_base[g]
        for t in graphs[g].tensors:
            merged_tensors.append(replace(t, index=base + t.index))
            tensor_origin.append((g, t.index))
        for op in graphs[g].operators:
            merged_ops.append(replace(op, index=op_base[g] + op.index,
                                      inputs=moved(op.inputs, base, alias=True),
                                      outputs=moved(op.outputs, base),
                                      intermediates=moved(op.intermediates, base)))
            op_origin.append((g, op.index))
    main = graphs[graph_index]
    graph = Graph(graph_index, main.name, tuple(merged_tensors), tuple(merged_ops), main.inputs,
                  main.outputs)
    calls = {op_base[g] + op: targets[0] for g, op, targets in runs
             if graphs[g].operators[op].opcode == "CALL_ONCE"}
    controls = {}
    for g, local, targets in runs:
        op = graphs[g].operators[local]
        if op.opcode != "CALL_ONCE":
            results = [moved(graphs[t].outputs, tensor_base[t], alias=True) for t in targets]
            control, problem = _control(graph.operators[op_base[g] + local], graph, targets,
                                        results)
            controls[control.op] = control
            if problem:
                problems.append((g, local, problem))
    resolved = {t: _follow(aliases, t) for t in aliases}
    layout = SubgraphLayout(graph, tuple(order), op_base, tensor_base, tuple(op_origin),
                            tuple(tensor_origin), calls, controls, resolved)
    return layout, [(op_base[g] + op, message) for g, op, message in problems]


def _aliases(graphs, runs, tensor_base) -> dict[int, int]:
    """Tensor of `graph` -> the tensor read in its place: each input of an IF branch is the
    IF's input after the condition; each input of a WHILE's condition and body its loop value
    (the WHILE's output), or for a resource handle the WHILE's input (a handle names the same
    variable in every iteration), as the WHILE's handle outputs do."""
    aliases: dict[int, int] = {}
    for g, local, targets in runs:
        op, base = graphs[g].operators[local], tensor_base[g]
        if op.opcode == "IF":
            for t in targets:
                for k, i in enumerate(graphs[t].inputs):
                    aliases[tensor_base[t] + i] = base + op.inputs[k + 1]
        elif op.opcode == "WHILE":
            for k, (v, o) in enumerate(zip(op.inputs, op.outputs, strict=True)):
                handle = graphs[g].tensors[v].is_handle
                for t in targets:
                    aliases[tensor_base[t] + graphs[t].inputs[k]] = base + (v if handle else o)
                if handle:
                    aliases[base + o] = base + v
    for g, local, targets in runs:  # inner ones first: a branch's results are known
        op, base = graphs[g].operators[local], tensor_base[g]
        if op.opcode != "IF":
            continue
        for j, o in enumerate(op.outputs):
            sources = {_follow(aliases, tensor_base[t] + graphs[t].outputs[j]) for t in targets}
            if graphs[g].tensors[o].is_handle and len(sources) == 1:
                aliases[base + o] = sources.pop()
    return aliases


def _follow(aliases: Mapping[int, int], tensor: int) -> int:
    while tensor in aliases:
        tensor = aliases[tensor]
    return tensor


def _control(op: Operator, graph: Graph, targets: tuple[int, ...],
             results: list[tuple[int, ...]]) -> tuple[Control, str | None]:
    """The Control of an IF or WHILE (`op` of the laid-out `graph`, its inputs already
    followed through aliases) given the tensors each subgraph it runs hands back (`results`),
    and why no backend runs it as planned copies, if so."""
    tensors = graph.tensors
    outputs = op.outputs
    problem = None
    if op.opcode == "IF":
        for j, o in enumerate(outputs):
            sources = {r[j] for r in results}
            if tensors[o].is_handle and len(sources) > 1:
                problem = (f"output {j} is a resource handle that the branches choose between; "
                           "a handle both branches pass through is supported")
        blocks = tuple(Block(t, tuple(Copy(o, r) for o, r in zip(outputs, result, strict=True)
                                      if not tensors[o].is_handle))
                       for t, result in zip(targets, results, strict=True))
        return Control(op.index, op.opcode, op.inputs[0], blocks), problem
    inputs = op.inputs
    (condition,), body = results
    copies = []
    for k, (o, r) in enumerate(zip(outputs, body, strict=True)):
        value, result = tensors[o], tensors[r]
        if value.is_handle:
            if r != inputs[k]:
                problem = (f"its body hands back another resource handle as loop value {k}; "
                           "a handle passed through unchanged is supported")
        elif r in outputs and r != o:
            problem = (f"its body hands back loop value {outputs.index(r)} as loop value {k}; "
                       "values passed through unchanged or computed are supported")
        elif value.nbytes != result.nbytes or not same_shape(value, result):
            problem = (f"its body changes loop value {k} from {value.dtype}{list(value.shape)} "
                       f"to {result.dtype}{list(result.shape)}; arenac plans fixed shapes only")
        elif r != o:
            copies.append(Copy(o, r))
    carried = tuple(o for o in outputs if not tensors[o].is_handle)
    entry = tuple(Copy(o, v) for o, v in zip(outputs, inputs,
                                             strict=True) if not tensors[o].is_handle)
    blocks = (Block(targets[0]), Block(targets[1], tuple(copies)))
    return Control(op.index, op.opcode, condition, blocks, entry, carried), problem


def resource_variables(
    program: Program,
) -> tuple[tuple[ResourceVariable, ...], dict[int, int], tuple[Refusal, ...]]:
    """The resource variables of a program, the variable of each handle, and what TFLite would
    not run as copies of fixed size: a variable read or assigned with another type or size than
    its first assignment gave it, or read before anything assigned it (LiteRT fails there).

    The ops are followed in the order the first invocation runs them (CALL_ONCE's subgraph
    included); every scheduled order keeps the relative order of these ops."""
    graph = program.graph
    keys: dict[int, tuple[str, str]] = {}  # handle tensor -> variable key
    kinds: dict[tuple[str, str], tuple[str, tuple[int, ...], int]] = {}
    handles: dict[tuple[str, str], list[int]] = {}
    problems = []
    for index in program.file_order():
        binding, op = program.bindings[index], graph.operators[index]
        if binding is None:
            continue
        if op.opcode == "VAR_HANDLE":
            keys[op.outputs[0]] = binding.params.key
            handles.setdefault(binding.params.key, []).append(op.outputs[0])
            continue
        if op.opcode not in ("READ_VARIABLE", "ASSIGN_VARIABLE"):
            continue
        where = f"{program.op_label(index)} {op.opcode}"
        key = keys.get(op.inputs[0])
        if key is None:
            problems.append(Refusal(index, f"{where}: runs before the VAR_HANDLE that writes its "
                                           "handle"))
            continue
        value = graph.tensors[op.outputs[0] if op.opcode == "READ_VARIABLE" else op.inputs[1]]
        kind = (value.dtype, value.shape, value.nbytes)
        name = variable_name(key)
        if key not in kinds:
            if op.opcode == "READ_VARIABLE":
                problems.append(Refusal(index, f"{where}: reads variable {name!r} before anything "
                                               "assigns it (TFLite fails there)"))
                continue
            kinds[key] = kind
        elif (kinds[key][0], kinds[key][2]) != (value.dtype, value.nbytes):
            dtype, shape, _ = kinds[key]
            problems.append(Refusal(
                index, f"{where}: variable {name!r} holds {dtype}{list(shape)}, but this op "
                       f"{'reads' if op.opcode == 'READ_VARIABLE' else 'assigns'} "
                       f"{value.dtype}{list(value.shape)}"))
    variables = tuple(ResourceVariable(key, dtype, shape, nbytes, tuple(handles[key]))
                      for key, (dtype, shape, nbytes) in kinds.items())
    of_handle = {t: i for i, v in enumerate(variables) for t in v.handles}
    return variables, of_handle, tuple(problems)
