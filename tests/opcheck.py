"""Shared assertion for operator tests: runtime_py in a planned arena and the generated C,
both against TFLite's reference kernels."""

from __future__ import annotations

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from toolchain.errors import RuntimeBackendError, UnsupportedOpError
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import check_plan, random_inputs
from toolchain.lab.oracle import LiteRTOracle
from toolchain.lower.plan import plan_model
from toolchain.ops import prepare_graph


def assert_matches_oracle(
    model_bytes: bytes, inputs: int = 3, seed: int = 0, planner: str = "greedy", c: bool = True,
    sequence: int | None = None, striped: bool = False, sanitize: bool = False,
) -> None:
    """Bit-exact for integer outputs, 1e-5 relative for float, on `inputs` random input sets
    (each a sequence of `sequence` invokes with the state kept; by default 3 for a model with
    state, else 1).

    The compiled C joins unless `c` is off; with `sanitize` it is built with ASan and UBSan
    (any undefined behaviour aborts), which serves a family's sanitizer run and its comparison
    with the oracle in one build. With `striped`, the plan must run some segment
    stripe by stripe (toolchain.lower.tiling).
    """
    model = parse_model(model_bytes, "<built model>")
    mp = plan_model(model, planner)
    assert mp.tiling.segments or not striped, "no segment is striped"
    extra = []
    if c:
        backend = CBackend(mp, sanitize=sanitize)
        extra.append(("c", backend.invoke_many))
    try:
        report = check_plan(mp, model_bytes, inputs=inputs, seed=seed, extra=extra,
                            sequence=sequence)
    finally:
        if extra:
            backend.close()
    bad = [o for o in report.outputs if o.mismatches]
    assert not bad, "outputs differ from the oracle: " + "; ".join(
        f"{o.name} ({o.dtype}): {o.mismatches} mismatches, max |diff| {o.max_abs_diff}" for o in bad
    )


def three_ways(model_bytes: bytes, inputs: list[np.ndarray], oracle=None) -> np.ndarray:
    """The one output of a one-output model on `inputs`, from the oracle (LiteRT's unless
    given), runtime_py in its planned arena and the C under the sanitizers, checked to be the
    same bytes; returns the oracle's."""
    (expected,) = (oracle or LiteRTOracle(model_bytes)).invoke(inputs)
    mp = plan_model(parse_model(model_bytes, "<built model>"))
    (mine,) = ArenaInterpreter(mp).invoke(inputs)
    with CBackend(mp, sanitize=True) as backend:
        ((c_out,),) = backend.invoke_many([inputs])
    assert expected.tobytes() == mine.tobytes() == c_out.tobytes(), (expected, mine, c_out)
    return expected


def oracle_outputs(model_bytes: bytes, seed: int = 0) -> list[np.ndarray]:
    """TFLite's outputs on the random input set `assert_matches_oracle` uses first."""
    graph = parse_model(model_bytes, "<built model>").main
    return LiteRTOracle(model_bytes).invoke(random_inputs(graph, seed))


def assert_varied(model_bytes: bytes, min_distinct: int = 2) -> None:
    """The oracle's outputs take several values, so a wrong kernel cannot pass by saturating."""
    for output in oracle_outputs(model_bytes):
        assert output.size == 1 or np.unique(output).size >= min_distinct, "(nearly) constant"


def refusal(model: bytes) -> str:
    """Why prepare refuses the model's op (the test fails if it does not)."""
    with pytest.raises(UnsupportedOpError) as error:
        prepare_graph(parse_model(model, "<built model>").main)
    return error.value.message


def fails_everywhere(model_bytes: bytes, inputs: list[np.ndarray], reason: str,
                     oracle_fails: bool = True) -> None:
    """An invoke that fails: in LiteRT (unless `oracle_fails` is False, where LiteRT stops the
    process instead of failing), in runtime_py with `reason`, and in the sanitized C, whose
    invoke returns an error code (the harness then exits 3)."""
    if oracle_fails:
        with pytest.raises(Exception):  # noqa: B017 (LiteRT raises RuntimeError)
            LiteRTOracle(model_bytes).invoke(inputs)
    mp = plan_model(parse_model(model_bytes, "<built model>"))
    with pytest.raises(RuntimeBackendError, match=reason):
        ArenaInterpreter(mp).invoke(inputs)
    with CBackend(mp, sanitize=True) as backend, \
            pytest.raises(RuntimeBackendError, match="exit 3"):
        backend.invoke_many([inputs])
