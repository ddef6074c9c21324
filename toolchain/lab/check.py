"""`check`: the oracle and runtime_py on the same inputs, output by output.

Quantized outputs must be identical; float outputs may differ by 1e-5 relative to the largest
magnitude of the expected tensor (TFLite's float kernels sum in another order). The oracle
runs in a child process (toolchain.lab.oracle_process): a model that crashes it ends the
check with one error, not arenac.

Inputs come as sequences: every backend runs the invokes of one sequence one after the other,
keeping the model's state (variable tensors, resource variables, whether CALL_ONCE ran), and
is reset between sequences; the oracle starts each sequence in a freshly loaded interpreter,
which is the state a reset must return to. A model with state is checked over sequences of
STATEFUL_SEQUENCE invokes unless told otherwise, so that state kept wrongly, or a reset that
does not restore it, shows as a mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from runtime_py.interpreter import ArenaInterpreter
from toolchain.errors import ArenacError, RuntimeBackendError
from toolchain.front.validate import DEFAULT_MAX_ITERATIONS
from toolchain.ir import Graph, Tensor
from toolchain.lab.oracle import TFLM_MODULE, installed, tflm_missing
from toolchain.lab.oracle_process import (
    ORACLE_TIMEOUT,
    OracleRun,
    Refused,
    run_in_child,
    run_oracle,
    short,
)
from toolchain.lower.plan import ModelPlan
from toolchain.ops import oracle_of, planned_shape_values
from toolchain.ops.spec import TFLM
from toolchain.progress import step

FLOAT_RTOL = 1e-5
# The k of the top-k accuracy `check --labels` reports beside the top-1 (for more classes).
TOP_K = 5
# Invokes per sequence for a model with state, unless told otherwise: enough for state to
# reach an invoke that reads what an earlier one wrote, twice.
STATEFUL_SEQUENCE = 3


def default_sequence(model_plan: ModelPlan) -> int:
    """Invokes per sequence: STATEFUL_SEQUENCE for a model with state, else 1."""
    return STATEFUL_SEQUENCE if model_plan.state_bytes else 1


def random_inputs(graph: Graph, seed: int) -> list[np.ndarray]:
    """Quantized inputs over the dtype's full range; floats from a standard normal; an input
    holding an output's shape, that shape."""
    rng = np.random.default_rng(seed)
    shapes = planned_shape_values(graph)
    return [shapes[t] if t in shapes else random_tensor(graph.tensors[t], rng)
            for t in graph.inputs]


def edge_values(dtype: np.dtype) -> tuple:
    """The values at the edges of a dtype that random inputs never reach: for floats NaN,
    +-inf, +-denormal and +-max, for integers the least and the greatest."""
    if dtype == np.bool_:
        return (False, True)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return (info.min, info.max)
    info = np.finfo(dtype)
    return (np.nan, np.inf, -np.inf, info.smallest_subnormal, -info.smallest_subnormal,
            info.max, -info.max)


def edge_inputs(graph: Graph) -> list[tuple[str, list[np.ndarray]]]:
    """(what, input set): set k fills every input with the k-th edge value of its dtype (an
    input holding an output's shape keeps that shape); no sets for a model without inputs."""
    shapes = planned_shape_values(graph)
    tensors = [graph.tensors[t] for t in graph.inputs]
    values = [edge_values(np.dtype(t.dtype)) for t in tensors]
    sets = []
    for k in range(max((len(v) for v in values), default=0)):  # a model with no inputs: none
        chosen = [v[k % len(v)] for v in values]
        arrays = [shapes[t.index] if t.index in shapes else
                  np.full(t.shape, value, np.dtype(t.dtype)) for t, value in zip(tensors, chosen,
                                                                                 strict=True)]
        sets.append((", ".join(str(value) for value in chosen), arrays))
    return sets


def compare_edges(model_plan: ModelPlan, backend: Backend,
                  max_iterations: int = DEFAULT_MAX_ITERATIONS) -> list[str]:
    """runtime_py and `backend` (the sanitized C) on edge_inputs, each set from the initial
    state; what differs, one line per output, or [] when they agree. The oracle is not asked:
    TFLite's own kernels leave NaN and infinities undefined in their float-to-int casts."""
    graph = model_plan.graph
    sets = edge_inputs(graph)
    runtime = ArenaInterpreter(model_plan, max_iterations=max_iterations)
    wanted = []
    for _, values in sets:
        runtime.reset()
        wanted.append(runtime.invoke(values))
    actual = backend([values for _, values in sets], 1)
    lines = []
    for (what, _), want, got in zip(sets, wanted, actual, strict=True):
        if not want or not got:  # an invoke that ended early gives no outputs
            if bool(want) != bool(got):
                lines.append(f"inputs {what}: the invoke ended early in one only")
            continue
        lines += [f"inputs {what}: output {graph.tensors[t].name!r} differs in {d.mismatches} "
                  "values" for t, e, a in zip(graph.outputs, want, got, strict=True)
                  if (d := difference(e, a)).mismatches]
    return lines


def random_tensor(t: Tensor, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(t.dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, t.shape).astype(np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, t.shape, dtype=dtype)
    return rng.standard_normal(t.shape).astype(dtype)


@dataclass(frozen=True)
class Difference:
    """How one backend's output differs from the oracle's (in units of the last bit for ints)."""

    max_abs_diff: float
    mismatches: int


def difference(expected: np.ndarray, actual: np.ndarray) -> Difference:
    if expected.shape != actual.shape:
        return Difference(float("inf"), int(max(expected.size, actual.size)))
    if expected.dtype.kind in "iub":
        diff = np.abs(expected.astype(np.int64) - actual.astype(np.int64))
        return Difference(float(diff.max(initial=0)), int(np.count_nonzero(diff)))
    e, a = np.atleast_1d(expected.astype(np.float64)), np.atleast_1d(actual.astype(np.float64))
    with np.errstate(invalid="ignore"):
        diff = np.abs(e - a)
    diff[(e == a) | (np.isnan(e) & np.isnan(a))] = 0.0  # equal infinities are no difference
    diff[np.isnan(diff)] = np.inf
    tolerance = FLOAT_RTOL * max(float(np.abs(e[np.isfinite(e)]).max(initial=0.0)), 1e-30)
    return Difference(float(diff.max(initial=0.0)), int(np.count_nonzero(diff > tolerance)))


def float_agreement(pairs) -> tuple[float, float]:
    """(RMSE, cosine similarity) of every compared value of one float output with the oracle's
    (non-finite values left out)."""
    e = np.concatenate([np.asarray(w, np.float64).ravel() for w, _ in pairs])
    a = np.concatenate([np.asarray(g, np.float64).ravel() for _, g in pairs])
    finite = np.isfinite(e) & np.isfinite(a)
    e, a = e[finite], a[finite]
    if not e.size:
        return float("nan"), float("nan")
    rmse = float(np.sqrt(np.mean((e - a) ** 2)))
    norms = float(np.linalg.norm(e) * np.linalg.norm(a))
    return rmse, float(e @ a / norms) if norms else float(np.array_equal(e, a))


def accuracy(graph: Graph, labels: Sequence[int],
             engines: list[tuple[str, list[list[np.ndarray]]]]) -> list[dict]:
    """Top-1 and top-k hits of the first classifier output per engine (the oracle first),
    with the samples where an engine's top-1 class is not the oracle's."""
    position = next((i for i, t in enumerate(graph.outputs)
                     if is_classifier(graph.tensors[t])), None)
    if position is None:
        raise ArenacError("--labels scores a classifier, and no output is one row of scores")
    classes = graph.tensors[graph.outputs[position]].shape[-1]
    k = TOP_K if classes > TOP_K else None
    tops = {name: [np.argsort(-out[position].astype(np.float64).ravel(), kind="stable")
                   if out else None for out in sets] for name, sets in engines}
    oracle = tops[engines[0][0]]
    rows = []
    for name, _ in engines:
        ranked = tops[name]
        rows.append({
            "engine": name,
            "top1": sum(r is not None and int(r[0]) == y for r, y in zip(ranked, labels,
                                                                         strict=True)),
            "topk": None if k is None else sum(r is not None and y in r[:k].tolist()
                                               for r, y in zip(ranked, labels, strict=True)),
            "k": k,
            "samples": len(labels),
            "differs_from_oracle": [i for i, (r, o) in enumerate(zip(ranked, oracle, strict=True))
                                    if r is not None and o is not None and r[0] != o[0]],
        })
    return rows


def is_classifier(t: Tensor) -> bool:
    """An output of scores over classes: one row of more than one value ([N] or [1, ..., N])."""
    return len(t.shape) >= 1 and t.shape[-1] > 1 and all(d == 1 for d in t.shape[:-1])


def same_top1(expected: np.ndarray, actual: np.ndarray) -> bool:
    """Whether both pick the same class (the first of equal highest scores, as argmax does)."""
    return expected.shape == actual.shape and int(np.argmax(expected)) == int(np.argmax(actual))


@dataclass
class OutputReport:
    name: str
    dtype: str
    max_abs_diff: float = 0.0
    mismatches: int = 0
    # [sequence, invoke] where this output first differs (0-based; sequences after the first
    # start after a reset), None while it agrees
    first_mismatch: list[int] | None = None
    # for a classifier's scores: invokes where this backend's top-1 class is the oracle's, and
    # invokes compared; None for any other output
    top1_agree: int | None = None
    invokes: int = 0
    # for a float output: the root mean square of the differences and the cosine similarity
    # of all its compared values with the oracle's; None for any other output
    rmse: float | None = None
    cosine: float | None = None

    def add(self, d: Difference, sequence: int = 0, invoke: int = 0,
            top1: bool | None = None) -> None:
        self.max_abs_diff = max(self.max_abs_diff, d.max_abs_diff)
        self.mismatches += d.mismatches
        self.invokes += 1
        if top1 is not None:
            self.top1_agree = (self.top1_agree or 0) + top1
        if d.mismatches and self.first_mismatch is None:
            self.first_mismatch = [sequence, invoke]


@dataclass
class CheckReport:
    model: str
    planner: str
    arena_bytes: int
    backends: list[str]
    outputs: list[OutputReport] = field(default_factory=list)
    sequences: int = 1
    sequence: int = 1  # invokes per sequence, state kept; a reset between sequences
    state_bytes: int = 0
    data: str | None = None  # where the input sets came from; None for random ones
    ended: int = 0  # invokes the oracle's kernels ended early (a CIRCULAR_BUFFER gathering)
    # with labels: per engine (the oracle first) its top-1 and top-k hits over the samples,
    # and the samples whose top-1 class differs from the oracle's
    accuracy: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.mismatches == 0 for o in self.outputs)

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "ok": self.ok,
            "planner": self.planner,
            "arena_bytes": self.arena_bytes,
            "state_bytes": self.state_bytes,
            "sequences": self.sequences,
            "sequence": self.sequence,
            "data": self.data,
            "ended": self.ended,
            "accuracy": self.accuracy,
            "backends": self.backends,
            "outputs": [vars(o) for o in self.outputs],
        }


# A backend runs a list of input sets in order, keeping the model's state, reset before sets
# `sequence`, 2 * `sequence`, ... (never when 0 or None), and returns the outputs of each set.
Backend = Callable[[list[list[np.ndarray]], int | None], list[list[np.ndarray]]]


def runtime_py_backend(runtime: ArenaInterpreter) -> Backend:
    """runtime_py as a backend: `reset` between sequences."""

    def run(input_sets: list[list[np.ndarray]], sequence: int | None = None
            ) -> list[list[np.ndarray]]:
        outputs = []
        with step("runtime_py", total=len(input_sets), unit="invoke") as bar:
            for i, values in enumerate(input_sets):
                if sequence and i and i % sequence == 0:
                    runtime.reset()
                outputs.append(runtime.invoke(values))
                bar.update()
        return outputs

    return run


def check_plan(
    model_plan: ModelPlan,
    model_bytes: bytes,
    inputs: int = 1,
    seed: int = 0,
    extra: Sequence[tuple[str, Backend]] = (),
    runtime_py: bool = True,
    oracle_timeout: float = ORACLE_TIMEOUT,
    sequence: int | None = None,
    data: tuple[str, list[list[np.ndarray]]] | None = None,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    labels: Sequence[int] | None = None,
) -> CheckReport:
    """Run the oracle, runtime_py and any extra backends on `inputs` random sequences of
    `sequence` invokes each (default_sequence when None): state is kept within a sequence and
    reset between them. Input set k (counting over all sequences) is drawn with seed + k.

    `data` is the user's own input sets instead (where they came from, and the sets), run in
    order; a model with state runs them as one sequence unless `sequence` says otherwise.
    A WHILE that runs its body more than `max_iterations` times in one invoke stops runtime_py
    with an error naming it. `labels`, one class per input set, score the first classifier
    output of the oracle and of every backend (CheckReport.accuracy)."""
    graph = model_plan.graph
    # unsupported ops fail here, before the oracle runs
    runtime = ArenaInterpreter(model_plan, max_iterations=max_iterations)
    if data is None:
        sequence = default_sequence(model_plan) if sequence is None else sequence
        input_sets = [random_inputs(graph, seed + i) for i in range(inputs * sequence)]
    else:
        input_sets = data[1]
        if sequence is None:
            sequence = len(input_sets) if model_plan.state_bytes else 1
        inputs = -(-len(input_sets) // sequence)
    backends: list[tuple[str, Backend]] = list(extra)
    if runtime_py:
        backends.insert(0, ("runtime_py", runtime_py_backend(runtime)))
    # our backends first: one that fails (a loop past max_iterations) says so before the
    # oracle is waited for
    outputs = [run(input_sets, sequence) for _, run in backends]
    with step("oracle"):
        oracle = oracle_run(model_plan, model_bytes, input_sets, (), oracle_timeout, sequence)
    report = CheckReport(
        model_plan.model.source,
        model_plan.plan.planner,
        model_plan.arena_bytes,
        [oracle.name] + [n for n, _ in backends],
        sequences=inputs,
        sequence=sequence,
        state_bytes=model_plan.state_bytes,
        data=None if data is None else data[0],
    )
    report.outputs = [
        OutputReport(f"{name}:{graph.tensors[t].name}", graph.tensors[t].dtype)
        for name, _ in backends
        for t in graph.outputs
    ]
    report.ended = sum(not want for want in oracle.outputs)
    rows = iter(report.outputs)
    classifier = [is_classifier(graph.tensors[t]) for t in graph.outputs]
    if labels is not None:
        report.accuracy = accuracy(graph, labels, [(oracle.name, oracle.outputs)] + [
            (name, out) for (name, _), out in zip(backends, outputs, strict=True)])
    for actual in outputs:
        backend_rows = [next(rows) for _ in graph.outputs]
        ran = [(want, got) for want, got in zip(oracle.outputs, actual, strict=True)
               if want and got]
        for i, (row, t) in enumerate(zip(backend_rows, graph.outputs, strict=True)):
            if graph.tensors[t].dtype.startswith("float") and ran:
                row.rmse, row.cosine = float_agreement([(w[i], g[i]) for w, g in ran])
        for k, (want, got) in enumerate(zip(oracle.outputs, actual, strict=True)):
            if not want or not got:  # an invoke that ended early gives no outputs to compare
                if bool(want) != bool(got):  # ... in one of the two only
                    for row, t in zip(backend_rows, graph.outputs, strict=True):
                        row.add(Difference(float("inf"), graph.tensors[t].num_elements),
                                *divmod(k, sequence))
                continue
            for row, e, a, scores in zip(backend_rows, want, got, classifier, strict=True):
                row.add(difference(e, a), *divmod(k, sequence),
                        top1=same_top1(e, a) if scores else None)
    return report


def oracle_run(
    model_plan: ModelPlan,
    model_bytes: bytes,
    input_sets: list[list[np.ndarray]],
    tensors: Sequence[int],
    timeout: float,
    sequence: int | None = None,
) -> OracleRun:
    """`run_oracle`, or TFLite Micro alone when some kernel reproduces its arithmetic: LiteRT's
    kernel is wrong for that op's operands, so LiteRT can neither answer nor stand in."""
    graph, source = model_plan.graph, model_plan.model.source
    oracle, bound = oracle_of(model_plan.program.bindings)
    if oracle != TFLM:
        return run_oracle(model_bytes, input_sets, len(graph.outputs), source, tensors, timeout,
                          sequence)
    ops = f"op {bound[0].op} {bound[0].opcode} ({bound[0].kernel.form})" + (
        f" and {len(bound) - 1} more" if len(bound) > 1 else "")
    if tensors:
        raise RuntimeBackendError(
            f"per-layer comparison needs LiteRT's interpreter, whose kernel is wrong for {ops}",
            source,
        )
    if not installed(TFLM_MODULE):
        raise RuntimeBackendError(tflm_missing(f"checking {ops}"), source)
    try:
        return run_in_child("tflm", model_bytes, input_sets, len(graph.outputs), source, (),
                            timeout, sequence)
    except Refused as e:
        raise RuntimeBackendError(
            f"the TFLite Micro interpreter, the oracle for {ops}, refuses the model "
            f"({short(str(e))})",
            source,
        ) from None


@dataclass(frozen=True)
class LayerDifference:
    op: int
    opcode: str
    tensor: int  # the op's output that differs most (its first when all agree)
    output: Difference
    inputs: tuple[Difference, ...]


# A tracer runs one input set from the initial state and returns every tensor the main
# graph's ops wrote (toolchain.c.generate.traced_tensors), by tensor index.
Tracer = Callable[[list[np.ndarray]], dict[int, np.ndarray]]


def runtime_py_tracer(model_plan: ModelPlan,
                      max_iterations: int = DEFAULT_MAX_ITERATIONS) -> Tracer:
    """runtime_py as a tracer: what its `observe` hook sees of the main graph's ops."""
    graph, program = model_plan.graph, model_plan.program
    main = set(program.ops_of(program.graph_index))

    def trace(values: list[np.ndarray]) -> dict[int, np.ndarray]:
        seen: dict[int, np.ndarray] = {}

        def record(op_index: int, outputs: list[np.ndarray]) -> None:
            if op_index in main:
                seen.update((t, v) for t, v in zip(graph.operators[op_index].outputs, outputs,
                                                   strict=True)
                            if not graph.tensors[t].is_handle)

        ArenaInterpreter(model_plan, max_iterations=max_iterations).invoke(values,
                                                                           observe=record)
        return seen

    return trace


def check_layers(
    model_plan: ModelPlan,
    model_bytes: bytes,
    seed: int = 0,
    oracle_timeout: float = ORACLE_TIMEOUT,
    tracers: Sequence[tuple[str, Tracer]] | None = None,
    values: list[np.ndarray] | None = None,
) -> dict[str, list[LayerDifference]]:
    """Every op's outputs in each backend (runtime_py alone by default) against the oracle's
    own intermediate tensors, in execution order, on `values` (else random inputs)."""
    graph, program = model_plan.graph, model_plan.program
    if tracers is None:
        tracers = [("runtime_py", runtime_py_tracer(model_plan))]
    values = random_inputs(graph, seed) if values is None else values
    traced = {name: {**dict(zip(graph.inputs, values, strict=True)), **trace(values)}
              for name, trace in tracers}
    wanted = sorted({t for seen in traced.values() for t in seen})
    oracle = oracle_run(model_plan, model_bytes, [values], wanted, oracle_timeout)
    (expected,) = oracle.tensors
    main = set(program.ops_of(program.graph_index))
    report = {}
    for name, seen in traced.items():
        layers = []
        for op_index in model_plan.lifetimes.order:
            op = graph.operators[op_index]
            out = [(difference(expected[t], seen[t]), t) for t in op.outputs if t in seen]
            if op_index not in main or not out:
                continue  # a called subgraph's op, or one that writes no values (VAR_HANDLE)
            ins = tuple(
                difference(expected[t], seen[t]) for t in op.inputs if t >= 0 and t in seen
            )
            worst, tensor = max(out, key=lambda d: (d[0].mismatches, d[0].max_abs_diff))
            layers.append(LayerDifference(op_index, op.opcode, tensor, worst, ins))
        report[name] = layers
    return report
