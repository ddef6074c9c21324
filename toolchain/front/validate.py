"""Model-level semantic checks, run once by the reader on every model it returns.

The reader proves the file is a well-formed flatbuffer; these checks prove the graph it
describes means something every backend can execute without faulting: quantization parameters
that are numbers in range, graph inputs and outputs that exist at run time, and sizes that
neither exhaust the host nor overflow the 32-bit index arithmetic of the generated C. Checks
that depend on one operator's semantics live in that op family's prepare (toolchain/ops).
"""

from __future__ import annotations

import math

from toolchain.errors import ModelError
from toolchain.ir import DTYPE_BITS, INT32_MAX, Graph, Model, Operator, Tensor

# The default cap on any single tensor and on a graph's activations and state together:
# far above any microcontroller's RAM, far below what would exhaust the host running arenac.
DEFAULT_MAX_BYTES = 512 << 20
# The deepest chain of CALL_ONCE, IF and WHILE calls a model may nest: far beyond any real
# model, and shallow enough that every walk over the calls stays within Python's stack.
MAX_NESTING = 64
# The most iterations runtime_py lets one WHILE run in one invoke (`run`/`check
# --max-iterations`): a loop whose condition never turns false is refused instead of running
# forever. Ten thousand runs of a tiny body take under a second (a million took over a
# minute), and are far more than a model's loops over frames or time steps need.
DEFAULT_MAX_ITERATIONS = 10_000
# Element types a graph input or output may have: plain numbers with a numpy and a C type.
IO_DTYPES = frozenset({"float32", "float64", "float16", "int8", "uint8", "int16", "uint16",
                       "int32", "uint32", "int64", "uint64", "bool"})


def integer_range(dtype: str) -> tuple[int, int] | None:
    """(lowest, highest) value of an integer dtype (int4, uint8, int32, ...), None otherwise."""
    if not dtype.startswith(("int", "uint")):
        return None
    bits = DTYPE_BITS[dtype]
    if dtype.startswith("u"):
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def validate_model(model: Model, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Raise one ModelError naming the file and the first tensor or op that is invalid."""
    entries = {0} | {s.subgraph for s in model.signature_defs}
    for graph in model.graphs:
        _GraphChecks(graph, model.source, max_bytes, graph.index in entries).run()
    check_calls(model)
    check_nested_total(model, max_bytes)


# The options naming the subgraphs an operator runs, in the order it names them.
SUBGRAPH_OPTIONS: dict[str, tuple[str, ...]] = {
    "CALL_ONCE": ("init_subgraph_index",),
    "IF": ("then_subgraph_index", "else_subgraph_index"),
    "WHILE": ("cond_subgraph_index", "body_subgraph_index"),
}


def called_subgraphs(op: Operator) -> tuple:
    """The subgraphs an operator runs (CALL_ONCE's initialization subgraph, IF's branches,
    WHILE's condition and body), as its options give them; () for any other op."""
    return tuple(op.options.get(key) for key in SUBGRAPH_OPTIONS.get(op.opcode, ()))


def check_calls(model: Model) -> None:
    """Every operator that runs subgraphs names subgraphs TFLite can run with its operands:
    other subgraphs of the file, whose inputs and outputs match the operator's in number, type
    and shape (CALL_ONCE's have none), and no chain of calls leads back to its caller."""
    graphs = model.graphs
    calls: dict[int, list[int]] = {}
    checks = []
    for graph in graphs:
        where = f"subgraph {graph.index} op" if graph.index else "op"
        for op in graph.operators:
            if op.opcode not in SUBGRAPH_OPTIONS:
                continue
            what = f"{where} {op.index} {op.opcode}"
            for key, target in zip(SUBGRAPH_OPTIONS[op.opcode], called_subgraphs(op), strict=True):
                if not isinstance(target, int):
                    raise ModelError(f"{what}: its options lack {key}", model.source)
                if not 0 <= target < len(graphs):
                    raise ModelError(
                        f"{what} calls subgraph {target}, but the model has {len(graphs)} "
                        "subgraphs",
                        model.source,
                    )
                if target == graph.index:
                    raise ModelError(f"{what} calls its own subgraph {target}", model.source)
                calls.setdefault(graph.index, []).append(target)
            checks.append((graph, op, what))
    cycle = _cycle(calls)
    if cycle:
        path = " -> ".join(f"subgraph {g}" for g in cycle)
        kinds = sorted({op.opcode for g in cycle[:-1] for op in graphs[g].operators
                        if op.opcode in SUBGRAPH_OPTIONS})
        raise ModelError(f"{'/'.join(kinds)} calls form a cycle: {path}", model.source)
    for graph, op, what in checks:
        _OPERAND_CHECKS[op.opcode](graph, op, graphs, what, model.source)
    _check_depth(calls, model.source)


def _check_depth(calls: dict[int, list[int]], source: str) -> None:
    """No chain of calls nests deeper than MAX_NESTING (the calls form no cycle)."""
    depth: dict[int, int] = {}
    for start in sorted(calls):
        stack = [start]
        while stack:
            g = stack[-1]
            pending = [t for t in calls.get(g, ()) if t not in depth]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            depth[g] = max((1 + depth[t] for t in calls.get(g, ())), default=0)
            if depth[g] > MAX_NESTING:
                raise ModelError(f"subgraph {g} starts a chain of {depth[g]} nested "
                                 f"CALL_ONCE/IF/WHILE calls, deeper than the limit of "
                                 f"{MAX_NESTING}", source)


def reachable_subgraphs(model: Model, start: int) -> list[int]:
    """`start` and every subgraph its operators run, directly or through others."""
    seen, stack = [start], [start]
    while stack:
        for op in model.graphs[stack.pop()].operators:
            for target in called_subgraphs(op):
                if target not in seen:
                    seen.append(target)
                    stack.append(target)
    return seen


def check_nested_total(model: Model, max_bytes: int) -> None:
    """An entry graph is planned with every subgraph it runs (their tensors share its arena
    and state block), so their non-constant tensors together stay within `max_bytes`."""
    entries = sorted({0} | {s.subgraph for s in model.signature_defs})
    for entry in (e for e in entries if 0 <= e < len(model.graphs)):
        subgraphs = reachable_subgraphs(model, entry)
        total = sum(t.nbytes for g in subgraphs for t in model.graphs[g].tensors
                    if not t.is_constant)
        if total > max_bytes:
            where = f"subgraph {entry}" if entry else "the main graph"
            raise ModelError(f"{where} and the {len(subgraphs) - 1} subgraphs it runs have "
                             f"activations and state totalling {total} bytes, over the limit "
                             f"of {max_bytes} (--max-bytes)", model.source)


def _check_call_once(graph: Graph, op: Operator, graphs, what: str, source: str) -> None:
    if op.inputs or op.outputs:
        raise ModelError(f"{what} has inputs or outputs; it takes none", source)
    (target,) = called_subgraphs(op)
    if graphs[target].inputs or graphs[target].outputs:
        raise ModelError(
            f"{what} calls subgraph {target}, which has inputs or outputs; an "
            "initialization subgraph has neither",
            source,
        )


def _check_if(graph: Graph, op: Operator, graphs, what: str, source: str) -> None:
    """The condition is one bool (LiteRT takes no other type); the other inputs are each
    branch's inputs, its outputs each branch's outputs."""
    if not op.inputs or op.inputs[0] < 0:
        raise ModelError(f"{what} has no condition (input 0)", source)
    cond = graph.tensors[op.inputs[0]]
    if cond.dtype != "bool" or cond.num_elements != 1:
        raise ModelError(f"{what}: its condition {_name(cond)} is {cond.dtype}"
                         f"{list(cond.shape)}, not one bool", source)
    for role, target in zip(("then", "else"), called_subgraphs(op), strict=True):
        branch = graphs[target]
        _match(graph, op.inputs[1:], "input", branch, branch.inputs, "input",
               f"{what}: {role} subgraph {target}", source, first=1)
        _match(graph, op.outputs, "output", branch, branch.outputs, "output",
               f"{what}: {role} subgraph {target}", source)


def _check_while(graph: Graph, op: Operator, graphs, what: str, source: str) -> None:
    """Loop values: the operator's inputs, the condition's and the body's inputs, the body's
    outputs and the operator's outputs agree in number and type (as LiteRT requires) and,
    but for a body that changes a shape (refused by toolchain.lower.program), in shape."""
    cond_index, body_index = called_subgraphs(op)
    if cond_index == body_index:
        raise ModelError(f"{what}: its condition and body are the same subgraph "
                         f"{cond_index}", source)
    if len(op.outputs) != len(op.inputs):
        raise ModelError(f"{what} has {len(op.inputs)} inputs but {len(op.outputs)} outputs; "
                         "each loop value is both", source)
    cond, body = graphs[cond_index], graphs[body_index]
    _match(graph, op.inputs, "input", cond, cond.inputs, "input",
           f"{what}: condition subgraph {cond_index}", source)
    if len(cond.outputs) != 1:
        raise ModelError(f"{what}: condition subgraph {cond_index} has {len(cond.outputs)} "
                         "outputs, not one", source)
    result = cond.tensors[cond.outputs[0]]
    if result.dtype != "bool" or result.num_elements != 1 or len(result.shape) > 1:
        raise ModelError(f"{what}: condition subgraph {cond_index} outputs {_name(result)} "
                         f"{result.dtype}{list(result.shape)}, not one bool", source)
    _match(graph, op.inputs, "input", body, body.inputs, "input",
           f"{what}: body subgraph {body_index}", source)
    _match(body, body.inputs, "input", body, body.outputs, "output",
           f"{what}: body subgraph {body_index}", source, shapes=False)
    changes = any(not same_shape(body.tensors[i], body.tensors[o])
                  for i, o in zip(body.inputs, body.outputs, strict=True))
    _match(graph, op.inputs, "input", graph, op.outputs, "output", what, source,
           shapes=not changes)


_OPERAND_CHECKS = {"CALL_ONCE": _check_call_once, "IF": _check_if, "WHILE": _check_while}


def _match(graph: Graph, operands, kind: str, sub: Graph, ends, end_kind: str, what: str,
           source: str, first: int = 0, shapes: bool = True) -> None:
    """Tensors `operands` of `graph` (its `kind`s, numbered from `first`) and `ends` of `sub`
    (its `end_kind`s) agree in number, type and, with `shapes`, shape."""
    if len(operands) != len(ends):
        raise ModelError(f"{what} has {len(ends)} {end_kind}s for the op's {len(operands)} "
                         f"{kind}s" + (" after the condition" if first else ""), source)
    for k, (a, b) in enumerate(zip(operands, ends, strict=True)):
        if a < 0 or b < 0:
            raise ModelError(f"{what}: {kind} {k + first} or {end_kind} {k} is absent", source)
        x, y = graph.tensors[a], sub.tensors[b]
        if x.dtype != y.dtype or (shapes and not same_shape(x, y)):
            raise ModelError(
                f"{what}: {end_kind} {k} {_name(y)} is {y.dtype}{list(y.shape)}, but "
                f"{kind} {k + first} {_name(x)} is {x.dtype}{list(x.shape)}", source)


def same_shape(a: Tensor, b: Tensor) -> bool:
    """Equal shapes; a scalar and a [1] count as one (LiteRT runs them as the same)."""
    return a.shape == b.shape or (a.num_elements == b.num_elements == 1
                                  and len(a.shape) <= 1 and len(b.shape) <= 1)


def _cycle(edges: dict[int, list[int]]) -> list[int]:
    """A cycle of the directed graph `edges` as a path that ends where it starts, or []."""
    state: dict[int, int] = {}  # 1 while on the path, 2 once finished
    for start in sorted(edges):
        if start in state:
            continue
        path, stack = [start], [iter(edges.get(start, ()))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(edges.get(nxt, ())))
    return []


class _GraphChecks:
    def __init__(self, graph: Graph, source: str, max_bytes: int, entry: bool = True):
        self.graph = graph
        self.source = source
        self.max_bytes = max_bytes
        # a caller fills an entry point's inputs; a subgraph that an operator runs (IF's
        # branches, WHILE's body) may also pass resource handles in and out
        self.entry = entry
        self.where = f"subgraph {graph.index}: " if graph.index else ""

    def fail(self, message: str) -> ModelError:
        return ModelError(self.where + message, self.source)

    def run(self) -> None:
        for tensor in self.graph.tensors:
            self.check_size(tensor)
            self.check_quantization(tensor)
            self.check_variable(tensor)
        self.check_total_size()
        self.check_inputs_and_outputs()

    # --- sizes ---------------------------------------------------------------------------
    def check_size(self, t: Tensor) -> None:
        """Sizes are checked here, before any backend allocates a byte for the tensor.

        Generated loops index with int32 and compute strides as products of dimensions, so
        the product of every dimension (a 0 counting as 1, since strides still multiply the
        others) must fit in int32.
        """
        if math.prod(max(d, 1) for d in t.shape) > INT32_MAX:
            raise self.fail(
                f"{_name(t)} has shape {list(t.shape)}: more than 2^31 - 1 elements, "
                "beyond 32-bit index arithmetic"
            )
        if t.nbytes > self.max_bytes:
            raise self.fail(
                f"{_name(t)} of shape {list(t.shape)} ({t.dtype}) needs {t.nbytes} bytes, "
                f"over the limit of {self.max_bytes}"
            )

    def check_variable(self, t: Tensor) -> None:
        """A variable (an LSTM's or SVDF's state, a resource variable's value) is numbers the
        state block holds and a reset refills: a handle, a string or a packed type is none."""
        if t.is_variable and t.dtype not in IO_DTYPES:
            raise self.fail(f"{_name(t)} is a variable of type {t.dtype}: state holds plain "
                            "numbers")

    def check_total_size(self) -> None:
        """Every non-constant tensor at once bounds the arena and the state from above."""
        total = sum(t.nbytes for t in self.graph.tensors if not t.is_constant)
        if total > self.max_bytes:
            raise self.fail(
                f"activations and state total {total} bytes, over the limit of {self.max_bytes}"
            )

    # --- quantization --------------------------------------------------------------------
    def check_quantization(self, t: Tensor) -> None:
        q = t.quantization
        if q is None:
            return
        if not all(math.isfinite(s) for s in q.scale):
            raise self.fail(f"{_name(t)} has a non-finite quantization scale {_first_bad(q.scale)}")
        limits = integer_range(t.dtype)
        if limits is None:
            return  # the quantization of a float tensor takes part in no arithmetic
        if not all(s > 0 for s in q.scale):
            bad = next(s for s in q.scale if not s > 0)
            raise self.fail(f"{_name(t)} ({t.dtype}) has quantization scale {bad} (must be > 0)")
        low, high = limits
        for z in q.zero_point:
            if not low <= z <= high:
                raise self.fail(
                    f"{_name(t)} ({t.dtype}) has zero point {z}, outside [{low}, {high}]"
                )
        if q.per_channel:
            self.check_channels(t)

    def check_channels(self, t: Tensor) -> None:
        """One scale per index of the quantized dimension.

        A 1-D tensor may name a dimension beyond its rank: converters write the filter's
        channel axis (3 for depthwise) into the bias's quantization, and TFLite Micro reads the
        scales per element (the shared person_detect model does this).
        """
        q, rank = t.quantization, len(t.shape)
        dimension = q.quantized_dimension
        if rank == 1 and dimension >= 1:
            dimension = 0
        if not 0 <= dimension < rank:
            raise self.fail(
                f"{_name(t)} is quantized per channel along dimension "
                f"{q.quantized_dimension}, but has rank {rank}"
            )
        if t.shape[dimension] != len(q.scale):
            raise self.fail(
                f"{_name(t)} has {len(q.scale)} scales for the {t.shape[dimension]} channels "
                f"of dimension {q.quantized_dimension} of shape {list(t.shape)}"
            )

    # --- graph inputs and outputs --------------------------------------------------------
    def check_inputs_and_outputs(self) -> None:
        graph, tensors = self.graph, self.graph.tensors
        for i, t in enumerate(graph.inputs):
            if tensors[t].is_constant:
                raise self.fail(f"graph input {i} is {_name(tensors[t])}, a constant")
            if tensors[t].is_variable:
                raise self.fail(f"graph input {i} is {_name(tensors[t])}, a variable")
        for kind, indices in (("input", graph.inputs), ("output", graph.outputs)):
            for i, t in enumerate(indices):
                if tensors[t].dtype not in IO_DTYPES and (self.entry or not tensors[t].is_handle):
                    raise self.fail(
                        f"graph {kind} {i} is {_name(tensors[t])} of type {tensors[t].dtype}, "
                        "which no caller can fill or read as plain numbers"
                    )
        written = set()
        for op in graph.operators:
            for t in op.outputs:
                if tensors[t].is_constant:
                    raise self.fail(
                        f"op {op.index} {op.opcode} writes {_name(tensors[t])}, a constant"
                    )
                written.add(t)
        available = written | set(graph.inputs)
        for i, t in enumerate(graph.outputs):
            tensor = tensors[t]
            if t not in available and not tensor.is_constant and not tensor.is_variable:
                raise self.fail(
                    f"graph output {i} is {_name(tensor)}, which no op writes and which is "
                    "neither a graph input nor a constant"
                )


def _name(t: Tensor) -> str:
    return f"tensor {t.index} ({t.name!r})"


def _first_bad(scales: tuple[float, ...]) -> float:
    return next(s for s in scales if not math.isfinite(s))
