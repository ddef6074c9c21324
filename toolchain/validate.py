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
from toolchain.ir import DTYPE_BITS, Graph, Model, Operator, Tensor

# The default cap on any single tensor and on a graph's activations and state together:
# far above any microcontroller's RAM, far below what would exhaust the host running arenac.
DEFAULT_MAX_BYTES = 512 << 20
INT32_MAX = 2**31 - 1
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


def called_subgraph(op: Operator) -> int | None:
    """The subgraph a CALL_ONCE runs (its init_subgraph_index), None for any other op."""
    if op.opcode != "CALL_ONCE":
        return None
    return op.options.get("init_subgraph_index")


def check_calls(model: Model) -> None:
    """Every CALL_ONCE names an initialization subgraph TFLite can run: another subgraph of
    the file, without inputs or outputs, and no chain of calls leads back to its caller."""
    graphs = model.graphs
    calls: dict[int, list[int]] = {}
    for graph in graphs:
        where = f"subgraph {graph.index} op" if graph.index else "op"
        for op in graph.operators:
            if op.opcode != "CALL_ONCE":
                continue
            what = f"{where} {op.index} CALL_ONCE"
            target = called_subgraph(op)
            if op.inputs or op.outputs:
                raise ModelError(f"{what} has inputs or outputs; it takes none", model.source)
            if not isinstance(target, int):
                raise ModelError(f"{what}: its options lack init_subgraph_index", model.source)
            if not 0 <= target < len(graphs):
                raise ModelError(
                    f"{what} calls subgraph {target}, but the model has {len(graphs)} subgraphs",
                    model.source,
                )
            if target == graph.index:
                raise ModelError(f"{what} calls its own subgraph {target}", model.source)
            init = graphs[target]
            if init.inputs or init.outputs:
                raise ModelError(
                    f"{what} calls subgraph {target}, which has inputs or outputs; an "
                    "initialization subgraph has neither",
                    model.source,
                )
            calls.setdefault(graph.index, []).append(target)
    cycle = _cycle(calls)
    if cycle:
        path = " -> ".join(f"subgraph {g}" for g in cycle)
        raise ModelError(f"CALL_ONCE calls form a cycle: {path}", model.source)


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

    def check_total_size(self) -> None:
        """Every non-constant tensor at once bounds the arena and the state from above."""
        total = sum(t.nbytes for t in self.graph.tensors if not _is_constant(t))
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
            if _is_constant(tensors[t]):
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
                if _is_constant(tensors[t]):
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


def _is_constant(t: Tensor) -> bool:
    """Constant data in flash; a variable's initial value is state, not a constant."""
    return t.is_constant and not t.is_variable


def _name(t: Tensor) -> str:
    return f"tensor {t.index} ({t.name!r})"


def _first_bad(scales: tuple[float, ...]) -> float:
    return next(s for s in scales if not math.isfinite(s))
