"""The C built with ASan and UBSan (float-to-int overflow included) on edge inputs: NaN, +-inf,
denormals and +-max of each input's dtype, for every example model, every shared model and the
hybrid models the op tests build. It must run without a sanitizer report (CBackend raises on
one) and give runtime_py's outputs; `check --sanitize` is the same comparison from the CLI.

runtime_py sums float32 convolutions in float64 (runtime_py/kernels/conv.py), so where values
near FLT_MAX meet (from infinite, FLT_MAX or NaN inputs, which some ops turn into large finite
values) the C's float32 loop overflows where runtime_py's sum does not: for float-input models
only the denormal sets are compared; the others are run, and must be sanitizer-clean."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import SHARED_MODEL_FILES
from tests.ops.test_bidirectional_lstm import HYBRID_CASES as BIDI_HYBRID
from tests.ops.test_bidirectional_lstm import bidi_model
from tests.ops.test_conv_hybrid import conv_model, depthwise_model
from tests.ops.test_fully_connected import hybrid_batch_matmul_model, hybrid_fully_connected_model
from tests.ops.test_lstm import HYBRID_CASES as LSTM_HYBRID
from tests.ops.test_lstm import lstm_model
from tests.ops.test_svdf import float_svdf_model
from toolchain.cli import main
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model, read_model
from toolchain.lab.c_backend import CBackend, linker
from toolchain.lab.check import check_plan, compare_edges, difference, edge_inputs
from toolchain.lower.plan import plan_model

HYBRID = {
    "fully connected": lambda: hybrid_fully_connected_model((2, 10), 3),
    "fully connected, asymmetric": lambda: hybrid_fully_connected_model((2, 10), 3,
                                                                        asymmetric=True),
    "conv": lambda: conv_model((1, 5, 5, 3), 4),
    "depthwise": lambda: depthwise_model((1, 5, 5, 3)),
    "batch matmul, asymmetric": lambda: hybrid_batch_matmul_model((1, 3, 8), (8, 4),
                                                                  asymmetric=True),
    "svdf": lambda: float_svdf_model(hybrid=True),
    "svdf, asymmetric": lambda: float_svdf_model(hybrid=True, asymmetric=True),
    **{f"lstm, {name}": (lambda cfg=cfg: lstm_model(cfg).data)
       for name, cfg in list(LSTM_HYBRID.items())[:2]},
    **{f"bidirectional lstm, {name}": (lambda cfg=cfg: bidi_model(cfg).data)
       for name, cfg in list(BIDI_HYBRID.items())[:2]},
}


def compared(what: str) -> bool:
    """A float-input model's set that runtime_py's float64 sums can match: denormals."""
    return all(v in ("True", "False") or 0 < abs(float(v)) < 1e-37 for v in what.split(", "))


def assert_sanitized_edges_agree(mp, float_inputs_overflow_apart: bool,
                                 model_bytes: bytes | None = None) -> None:
    """With `model_bytes`, the same sanitized build also meets the oracle on 2 random sets."""
    graph = mp.graph
    floats = any(graph.tensors[t].dtype.startswith("float") for t in graph.inputs)
    with CBackend(mp, sanitize=True) as c:
        differences = compare_edges(mp, c.invoke_many)
        if model_bytes is not None:
            assert check_plan(mp, model_bytes, inputs=2, extra=[("c", c.invoke_many)]).ok
    if floats and float_inputs_overflow_apart:
        differences = [d for d in differences if compared(d.split(": output")[0][7:])]
    assert differences == []


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_is_sanitizer_clean_on_edge_inputs(name):
    mp = plan_model(parse_model(EXAMPLES[name](), f"{name}.tflite"))
    assert_sanitized_edges_agree(mp, True)


@pytest.mark.parametrize("name", sorted(HYBRID))
def test_every_hybrid_model_is_sanitizer_clean_and_exact_on_edge_inputs(name):
    """Hybrid kernels quantize their float input first: NaN, infinities and denormals are
    defined there (toolchain/ops/hybrid.py), so every set is compared."""
    mp = plan_model(parse_model(HYBRID[name](), "hybrid.tflite"))
    assert_sanitized_edges_agree(mp, False)


@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_every_shared_model_is_sanitizer_clean_on_edge_and_random_inputs(path):
    assert_sanitized_edges_agree(plan_model(read_model(path)), True, path.read_bytes())


def test_edge_inputs_cover_each_dtype_and_keep_shape_inputs():
    mp = plan_model(parse_model(EXAMPLES["tiny_cnn_float32"](), "m.tflite"))
    sets = edge_inputs(mp.graph)
    firsts = [values[0].flat[0] for _, values in sets]
    assert len(sets) == 7 and np.isnan(firsts[0]) and firsts[1:3] == [np.inf, -np.inf]
    assert 0 < firsts[3] < np.finfo(np.float32).tiny and firsts[5] == np.finfo(np.float32).max


def test_equal_infinities_are_no_difference():
    inf = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32)
    assert difference(inf, inf.copy()).mismatches == 0
    assert difference(inf, np.array([np.inf, np.inf, np.nan, 1.0], np.float32)).mismatches == 1


def test_check_sanitize_prints_the_edge_verdict(capsys, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    assert main(["check", str(path), "--sanitize", "--inputs", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "runtime_py and the C built with ASan and UBSan agree on all 2 sets" in out
    assert main(["check", str(path), "--sanitize", "--backends", "runtime_py"]) == 2


def test_a_model_without_inputs_has_no_edge_sets():
    """The fuzzer's finding: a graph whose inputs were all cut away asks for no edge sets,
    where it used to fail (max() of nothing)."""
    from dataclasses import replace

    from toolchain.front.examples import EXAMPLES
    from toolchain.front.reader import parse_model
    from toolchain.lab.check import edge_inputs

    graph = parse_model(EXAMPLES["tiny_cnn_int8"](), "m").main
    assert edge_inputs(replace(graph, inputs=())) == []
    assert edge_inputs(graph)


def test_host_builds_link_with_gold_only_where_it_is_known_to_work(monkeypatch):
    """Gold is asked of GCC and Clang (behind a launcher too) when it is installed, never of
    another compiler or over a linker the flags already choose."""
    monkeypatch.setattr("shutil.which", lambda program: f"/usr/bin/{program}")
    assert linker(["cc"], ["-fsanitize=address"]) == ("-fuse-ld=gold",)
    assert linker(["ccache", "gcc-12", "-m32"], []) == ("-fuse-ld=gold",)
    assert linker(["ccache", "tcc", "-m32"], []) == ()
    assert linker(["clang", "-m32"], []) == ("-fuse-ld=gold",)
    assert linker(["tcc"], []) == ()
    assert linker(["cc"], ["-fuse-ld=bfd"]) == ()
    monkeypatch.setattr("shutil.which", lambda program: None)
    assert linker(["cc"], ["-fsanitize=address"]) == ()
