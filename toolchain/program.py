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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from toolchain.errors import PlanError
from toolchain.ir import Graph, Model, Operator
from toolchain.lifetimes import ScratchRequest
from toolchain.ops import Refusal, bind_graph, refusal_error
from toolchain.ops.spec import Binding
from toolchain.targets import GENERIC, get_target
from toolchain.validate import called_subgraph


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


@dataclass(frozen=True, eq=False)
class SubgraphLayout:
    """The subgraphs a program runs laid into one graph: subgraph `g`'s tensor i is tensor
    `tensor_base[g] + i` of `graph`, its op j op `op_base[g] + j`. `calls` maps each CALL_ONCE
    (by op of `graph`) to the subgraph it runs; a CALL_ONCE of a subgraph that an earlier one
    runs already is absent (it never has anything left to do)."""

    graph: Graph
    subgraphs: tuple[int, ...]  # the main graph first, then the called ones in call order
    op_base: Mapping[int, int]
    tensor_base: Mapping[int, int]
    op_origin: tuple[tuple[int, int], ...]
    tensor_origin: tuple[tuple[int, int], ...]
    calls: Mapping[int, int]


@dataclass(frozen=True, eq=False)
class Program:
    """One graph of a model with each operator's binding (None where no kernel binds it, with
    the reason among `refusals`). A plan can be made for a graph with refused operators, so
    that `plan` shows a model it cannot run; the backends ask `params()`, which refuses.

    `layout` is None when the graph calls no subgraph; then `graph` is the model's own.
    `resources` are the resource variables its ops use, `handles` maps each handle tensor to
    its variable (a position in `resources`).
    `target` (toolchain.targets) is what the kernels were bound for; with `portable`, its
    portable kernels only (the baseline its own kernels are measured against)."""

    model: Model
    graph_index: int
    bindings: tuple[Binding | None, ...]
    refusals: tuple[Refusal, ...]
    layout: SubgraphLayout | None = None
    resources: tuple[ResourceVariable, ...] = ()
    handles: Mapping[int, int] = field(default_factory=dict)
    target: str = GENERIC
    portable: bool = False

    @property
    def graph(self) -> Graph:
        return self.layout.graph if self.layout else self.model.graphs[self.graph_index]

    @property
    def calls(self) -> Mapping[int, int]:
        """CALL_ONCE op -> the subgraph it runs (empty when the graph calls none)."""
        return self.layout.calls if self.layout else {}

    @property
    def subgraphs(self) -> tuple[int, ...]:
        return self.layout.subgraphs if self.layout else (self.graph_index,)

    def params(self) -> list[Any]:
        """Every operator's params, or one error naming every operator no kernel binds."""
        if self.refusals:
            raise refusal_error(self.refusals, self.model.source)
        return [b.params for b in self.bindings]

    def scratch(self) -> tuple[ScratchRequest, ...]:
        """Every kernel's scratch, as buffers living during their op's step."""
        return tuple(
            ScratchRequest(b.op, request.size, request.purpose)
            for b in self.bindings
            if b is not None
            for request in b.scratch
        )

    # --- where ops and tensors come from ----------------------------------------------------
    def op_origin(self, op: int) -> tuple[int, int]:
        """(subgraph, op index there) of an op of `graph`."""
        return self.layout.op_origin[op] if self.layout else (self.graph_index, op)

    def tensor_origin(self, tensor: int) -> tuple[int, int]:
        """(subgraph, tensor index there) of a tensor of `graph`."""
        return self.layout.tensor_origin[tensor] if self.layout else (self.graph_index, tensor)

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
        of that subgraph): the main graph's, with each call followed by its subgraph's steps."""
        calls = self.calls
        steps: list[int] = []

        def walk(graph: int) -> None:
            base = self.ops_of(graph).start
            for local in orders[graph]:
                op = base + local
                steps.append(op)
                if op in calls:
                    walk(calls[op])

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

    def call_spans(self, order: Sequence[int]) -> dict[int, int]:
        """Step of each CALL_ONCE that runs a subgraph -> the step after that subgraph's last
        (nested calls included). Raises PlanError unless every call is followed by exactly the
        steps of its subgraph."""
        if not self.calls:
            return {}
        order = tuple(order)
        if self.flatten(self.local_orders(order)) != order:
            raise PlanError(
                "the execution order does not run each called subgraph's steps right after the "
                "CALL_ONCE that runs them",
                self.model.source,
            )
        sizes: dict[int, int] = {}

        def size(graph: int) -> int:
            if graph not in sizes:
                sizes[graph] = sum(1 + (size(self.calls[op]) if op in self.calls else 0)
                                   for op in self.ops_of(graph))
            return sizes[graph]

        return {step: step + 1 + size(self.calls[op])
                for step, op in enumerate(order) if op in self.calls}


def lower(model: Model, graph_index: int = 0, target: str = GENERIC,
          portable: bool = False) -> Program:
    """Bind every operator of one graph and of the subgraphs it calls for `target` (with
    `portable`, to its portable kernels only); an op the model cannot mean fails here, before
    any planning (a variant no kernel runs is kept as a refusal)."""
    get_target(target, model.source)  # an unknown name is one clear error
    layout = lay_out(model, graph_index)
    if layout is None:
        graph, label = model.graphs[graph_index], None
    else:
        graph = layout.graph

        def label(op: Operator) -> str:
            origin, index = layout.op_origin[op.index]
            return f"op {index}" if origin == graph_index else f"subgraph {origin} op {index}"

    bindings, refusals = bind_graph(graph, GENERIC if portable else target, label)
    if any(r.invalid for r in refusals):
        raise refusal_error(refusals, model.source)
    program = Program(model, graph_index, bindings, refusals, layout, target=target,
                      portable=portable)
    resources, handles, problems = resource_variables(program)
    return replace(program, refusals=(*refusals, *problems), resources=resources,
                   handles=handles)


def lay_out(model: Model, graph_index: int) -> SubgraphLayout | None:
    """The graph and the subgraphs it calls laid into one, or None when it calls none.

    The reader validated every call (toolchain.validate.check_calls); a subgraph is laid out
    once, at the first call that reaches it."""
    graphs = model.graphs
    order = [graph_index]
    callers: list[tuple[int, int, int]] = []  # (caller subgraph, its op, the subgraph called)

    def visit(g: int) -> None:
        for op in graphs[g].operators:
            target = called_subgraph(op)
            if isinstance(target, int) and 0 <= target < len(graphs) and target not in order:
                order.append(target)
                callers.append((g, op.index, target))
                visit(target)

    visit(graph_index)
    if len(order) == 1:
        return None
    op_base, tensor_base = {}, {}
    ops, tensors = 0, 0
    for g in order:
        op_base[g], tensor_base[g] = ops, tensors
        ops += len(graphs[g].operators)
        tensors += len(graphs[g].tensors)
    merged_tensors, merged_ops = [], []
    tensor_origin, op_origin = [], []
    def moved(refs: tuple[int, ...], base: int) -> tuple[int, ...]:
        return tuple(r + base if r >= 0 else r for r in refs)

    for g in order:
        base = tensor_base[g]
        for t in graphs[g].tensors:
            merged_tensors.append(replace(t, index=base + t.index))
            tensor_origin.append((g, t.index))
        for op in graphs[g].operators:
            merged_ops.append(replace(op, index=op_base[g] + op.index,
                                      inputs=moved(op.inputs, base),
                                      outputs=moved(op.outputs, base),
                                      intermediates=moved(op.intermediates, base)))
            op_origin.append((g, op.index))
    main = graphs[graph_index]
    graph = Graph(graph_index, main.name, tuple(merged_tensors), tuple(merged_ops), main.inputs,
                  main.outputs)
    calls = {op_base[g] + op: target for g, op, target in callers}
    return SubgraphLayout(graph, tuple(order), op_base, tensor_base, tuple(op_origin),
                          tuple(tensor_origin), calls)


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
