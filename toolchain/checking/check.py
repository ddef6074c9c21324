"""`check`: the oracle and runtime_py on the same inputs, output by output.

Quantized outputs must be identical; float outputs may differ by 1e-5 relative to the largest
magnitude of the expected tensor (TFLite's float kernels sum in another order). The oracle
runs in a child process (toolchain.checking.oracle_process): a model that crashes it ends the
check with one error, not arenac.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from runtime_py.interpreter import ArenaInterpreter
from toolchain.checking.oracle_process import (
    ORACLE_TIMEOUT,
    OracleRun,
    Refused,
    run_in_child,
    run_oracle,
    short,
)
from toolchain.errors import RuntimeBackendError
from toolchain.ir import Graph, Tensor
from toolchain.ops import oracle_of, planned_shape_values
from toolchain.ops.spec import TFLM
from toolchain.plan import ModelPlan

FLOAT_RTOL = 1e-5


def random_inputs(graph: Graph, seed: int) -> list[np.ndarray]:
    """Quantized inputs over the dtype's full range; floats from a standard normal; an input
    holding an output's shape, that shape."""
    rng = np.random.default_rng(seed)
    shapes = planned_shape_values(graph)
    return [shapes[t] if t in shapes else random_tensor(graph.tensors[t], rng)
            for t in graph.inputs]


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
    diff = np.abs(e - a)
    diff[np.isnan(e) & np.isnan(a)] = 0.0
    diff[np.isnan(diff)] = np.inf
    tolerance = FLOAT_RTOL * max(float(np.abs(e[np.isfinite(e)]).max(initial=0.0)), 1e-30)
    return Difference(float(diff.max(initial=0.0)), int(np.count_nonzero(diff > tolerance)))


@dataclass
class OutputReport:
    name: str
    dtype: str
    max_abs_diff: float = 0.0
    mismatches: int = 0

    def add(self, d: Difference) -> None:
        self.max_abs_diff = max(self.max_abs_diff, d.max_abs_diff)
        self.mismatches += d.mismatches


@dataclass
class CheckReport:
    model: str
    planner: str
    arena_bytes: int
    backends: list[str]
    outputs: list[OutputReport] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.mismatches == 0 for o in self.outputs)

    def as_dict(self) -> dict:
        return {
            "model": self.model,
            "ok": self.ok,
            "planner": self.planner,
            "arena_bytes": self.arena_bytes,
            "backends": self.backends,
            "outputs": [vars(o) for o in self.outputs],
        }


# A backend runs a list of input sets and returns the outputs of each set.
Backend = Callable[[list[list[np.ndarray]]], list[list[np.ndarray]]]


def check_plan(
    model_plan: ModelPlan,
    model_bytes: bytes,
    inputs: int = 1,
    seed: int = 0,
    extra: Sequence[tuple[str, Backend]] = (),
    runtime_py: bool = True,
    oracle_timeout: float = ORACLE_TIMEOUT,
) -> CheckReport:
    """Run the oracle, runtime_py and any extra backends on `inputs` random input sets."""
    graph = model_plan.graph
    runtime = ArenaInterpreter(model_plan)  # unsupported ops fail here, before the oracle runs
    input_sets = [random_inputs(graph, seed + i) for i in range(inputs)]
    oracle = oracle_run(model_plan, model_bytes, input_sets, (), oracle_timeout)
    backends: list[tuple[str, Backend]] = list(extra)
    if runtime_py:
        backends.insert(0, ("runtime_py", lambda sets: [runtime.invoke(v) for v in sets]))
    report = CheckReport(
        model_plan.model.source,
        model_plan.plan.planner,
        model_plan.arena_bytes,
        [oracle.name] + [n for n, _ in backends],
    )
    report.outputs = [
        OutputReport(f"{name}:{graph.tensors[t].name}", graph.tensors[t].dtype)
        for name, _ in backends
        for t in graph.outputs
    ]
    rows = iter(report.outputs)
    for _, run in backends:
        actual = run(input_sets)
        backend_rows = [next(rows) for _ in graph.outputs]
        for want, got in zip(oracle.outputs, actual):
            for row, e, a in zip(backend_rows, want, got):
                row.add(difference(e, a))
    return report


def oracle_run(
    model_plan: ModelPlan,
    model_bytes: bytes,
    input_sets: list[list[np.ndarray]],
    tensors: Sequence[int],
    timeout: float,
) -> OracleRun:
    """`run_oracle`, or TFLite Micro alone when some kernel reproduces its arithmetic: LiteRT's
    kernel is wrong for that op's operands, so LiteRT can neither answer nor stand in."""
    graph, source = model_plan.graph, model_plan.model.source
    oracle, bound = oracle_of(model_plan.program.bindings)
    if oracle != TFLM:
        return run_oracle(model_bytes, input_sets, len(graph.outputs), source, tensors, timeout)
    ops = f"op {bound[0].op} {bound[0].opcode} ({bound[0].kernel.form})" + (
        f" and {len(bound) - 1} more" if len(bound) > 1 else "")
    if tensors:
        raise RuntimeBackendError(
            f"per-layer comparison needs LiteRT's interpreter, whose kernel is wrong for {ops}",
            source,
        )
    try:
        return run_in_child("tflm", model_bytes, input_sets, len(graph.outputs), source, (),
                            timeout)
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
    output: Difference
    inputs: tuple[Difference, ...]


def check_layers(
    model_plan: ModelPlan,
    model_bytes: bytes,
    seed: int = 0,
    oracle_timeout: float = ORACLE_TIMEOUT,
) -> list[LayerDifference]:
    """Every op's output against the oracle's own intermediate tensor, in execution order."""
    graph = model_plan.graph
    runtime = ArenaInterpreter(model_plan)
    values = random_inputs(graph, seed)
    seen: dict[int, np.ndarray] = dict(zip(graph.inputs, values))

    def record(op_index: int, outputs: list[np.ndarray]) -> None:
        seen.update(zip(graph.operators[op_index].outputs, outputs))

    runtime.invoke(values, observe=record)
    oracle = oracle_run(model_plan, model_bytes, [values], sorted(seen), oracle_timeout)
    (expected,) = oracle.tensors
    layers = []
    for op_index in model_plan.lifetimes.order:
        op = graph.operators[op_index]
        out = [difference(expected[t], seen[t]) for t in op.outputs]
        ins = tuple(
            difference(expected[t], seen[t]) for t in op.inputs if t >= 0 and t in seen
        )
        worst = max(out, key=lambda d: (d.mismatches, d.max_abs_diff))
        layers.append(LayerDifference(op_index, op.opcode, worst, ins))
    return layers
