"""runtime_py as a whole: one arena, poisoning, broken plans caught, run/check on the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from runtime_py.interpreter import POISON, ArenaInterpreter
from tests.conftest import SHARED_MODEL_FILES, needs_shared_models
from toolchain.cli import main
from toolchain.errors import PlanError, RuntimeBackendError, UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.check import check_plan
from toolchain.lower.plan import Techniques, plan_model


def pool_chain(dtype: str = "int8") -> bytes:
    """x -> avg pool -> max pool -> add(skip): three ops, one tensor read across the chain."""
    b = ModelBuilder(dtype, seed=2)
    q = {"scale": 0.05, "zero_point": -4} if dtype == "int8" else {}
    x = b.input("x", (1, 12, 12, 8), dtype, **q)
    a = b.average_pool_2d(x, 3, 1, "SAME")
    m = b.max_pool_2d(a, 3, 1, "SAME")
    b.output(b.add(a, m))
    return b.build()


def test_outputs_come_from_the_arena_and_dead_tensors_are_poisoned():
    data = pool_chain()
    mp = plan_model(parse_model(data), "greedy")
    runtime = ArenaInterpreter(mp)
    assert runtime.arena.nbytes == mp.arena_bytes
    x = np.random.default_rng(0).integers(-128, 128, (1, 12, 12, 8), dtype=np.int8)
    out = runtime.invoke([x])[0]
    graph = mp.graph
    offsets = mp.offset_of_tensor()
    output_offset = offsets[graph.outputs[0]]
    assert np.array_equal(
        runtime.arena[output_offset : output_offset + out.nbytes].view(np.int8).reshape(out.shape),
        out,
    )
    input_offset = offsets[graph.inputs[0]]
    dead = runtime.arena[input_offset : input_offset + x.nbytes]
    live_elsewhere = [(offsets[t], graph.tensors[t].nbytes) for t in graph.outputs]
    if not any(o < input_offset + x.nbytes and input_offset < o + n for o, n in live_elsewhere):
        assert np.all(dead == POISON)


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_a_plan_overlapping_two_live_buffers_is_refused_and_caught_while_running(dtype):
    data = pool_chain(dtype)
    mp = plan_model(parse_model(data, "pool.tflite"), "naive",
                    techniques=Techniques(tiling="off"))  # every tensor whole
    assert check_plan(mp, data, inputs=2).ok
    # Move the avg-pool output (alive through the add) onto the max-pool output.
    graph = mp.graph
    slot = mp.lifetimes.tensor_buffers
    avg, mx = graph.operators[0].outputs[0], graph.operators[1].outputs[0]
    offsets = list(mp.plan.offsets)
    offsets[slot[avg]] = offsets[slot[mx]]
    broken = replace(mp, plan=replace(mp.plan, offsets=tuple(offsets)))
    with pytest.raises(PlanError, match="pool.tflite: buffers .* share bytes"):
        check_plan(broken, data, inputs=2)
    x = np.random.default_rng(0).standard_normal((1, 12, 12, 8)).astype(dtype)
    with pytest.raises(PlanError, match=rf"step 1, op 1 \(MAX_POOL_2D\): tensor {mx} .* would "
                                        rf"clobber tensor {avg} .*, which is read until step 2"):
        ArenaInterpreter(broken, verify_plan=False).invoke([x])


def test_unsupported_ops_are_named_all_at_once_before_running():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    y = b.tensor("y", (1, 4), "float32")
    z = b.tensor("z", (1, 4), "float32")
    b.op("SIGN", [x], [y])
    b.op("GELU", [y], [z])
    b.output(z)
    mp = plan_model(parse_model(b.build(), "exp.tflite"))
    with pytest.raises(UnsupportedOpError, match=r"op 0 SIGN.*op 1 GELU"):
        ArenaInterpreter(mp)


def test_input_shape_and_dtype_are_checked():
    runtime = ArenaInterpreter(plan_model(parse_model(pool_chain(), "m.tflite")))
    with pytest.raises(RuntimeBackendError, match=r"must be int8\[1, 12, 12, 8\]"):
        runtime.invoke([np.zeros((1, 12, 12, 8), np.float32)])
    with pytest.raises(RuntimeBackendError, match="takes 1 inputs"):
        runtime.invoke([])


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_run_saves_outputs(capsys, tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(pool_chain())
    x = np.random.default_rng(1).integers(-128, 128, (1, 12, 12, 8), dtype=np.int8)
    np.save(tmp_path / "x.npy", x)
    code, out, _ = run_cli(
        capsys,
        "run",
        str(model),
        "--input",
        str(tmp_path / "x.npy"),
        "--output-dir",
        str(tmp_path / "out"),
    )
    assert code == 0
    saved = np.load(tmp_path / "out" / "output_0.npy")
    expected = ArenaInterpreter(plan_model(parse_model(pool_chain()))).invoke([x])[0]
    assert np.array_equal(saved, expected)


def test_cli_run_rejects_wrong_input(capsys, tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(pool_chain())
    np.save(tmp_path / "x.npy", np.zeros((2, 2), np.int8))
    code, _, err = run_cli(
        capsys,
        "run",
        str(model),
        "--input",
        str(tmp_path / "x.npy"),
        "--output-dir",
        str(tmp_path / "out"),
    )
    assert code == 2 and "must be int8[1, 12, 12, 8]" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out" / "output_0.npy").exists()
    (tmp_path / "bad.npy").write_text("not numpy")
    code, _, err = run_cli(capsys, "run", str(model), "--input", str(tmp_path / "bad.npy"))
    assert code == 2 and "bad.npy" in err


@pytest.mark.parametrize("planner", ["greedy", "freelist", "naive"])
def test_cli_check_json(capsys, tmp_path, planner):
    model = tmp_path / "m.tflite"
    model.write_bytes(pool_chain())
    code, out, _ = run_cli(
        capsys, "check", str(model), "--planner", planner, "--inputs", "2", "--json"
    )
    data = json.loads(out)
    assert code == 0 and data["ok"] and data["planner"] == planner
    assert data["backends"] == ["litert-ref", "runtime_py", "c"]
    assert {o["name"].split(":")[0] for o in data["outputs"]} == {"runtime_py", "c"}
    assert all(o["max_abs_diff"] == 0 and o["mismatches"] == 0 for o in data["outputs"])


def test_cli_check_per_layer(capsys, tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(pool_chain("float32"))
    code, out, _ = run_cli(capsys, "check", str(model), "--per-layer")
    assert code == 0 and "every layer agrees" in out


@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_reference_models_check_with_every_planner(capsys, path):
    """Every shared model agrees with the oracle on 10 inputs with all backends under the
    default planner, and runtime_py, which runs in the planned arena, on one input under every
    other planner: a planner only moves offsets, and a misplaced buffer corrupts the outputs
    of any input (building the C once per planner was most of this test's time)."""
    for planner, options in [("best", ("--inputs", "10")),
                             *[(planner, ("--inputs", "1", "--backends", "runtime_py"))
                               for planner in ("optimal", "greedy", "freelist", "naive")]]:
        code, out, err = run_cli(capsys, "check", str(path), "--planner", planner, *options,
                                 "--json")
        assert code == 0, err or out
        data = json.loads(out)
        assert data["ok"], data
        for o in data["outputs"]:
            if o["dtype"] != "float32":
                assert o["max_abs_diff"] == 0


def test_cli_check_per_layer_says_how_it_checks_a_striped_segment(capsys, tmp_path):
    """The demo model's steps 1-3 run in stripes: ops 1 and 2 have no whole output to compare,
    so the check says op 3's output stands for them, in text and JSON."""
    from toolchain.front.examples import EXAMPLES

    model = tmp_path / "demo.tflite"
    model.write_bytes(EXAMPLES["residual_cnn_int8"]())
    code, out, _ = run_cli(capsys, "check", str(model), "--per-layer")
    assert code == 0, out
    assert ("ops 1, 2 run in stripes: their outputs exist only as stripe rows, so op 3's output "
            "checks them (--tiling off checks each)") in out
    code, out, _ = run_cli(capsys, "check", str(model), "--per-layer", "--json")
    assert json.loads(out)["striped"] == [{"ops": [1, 2], "compared_at": 3}]
    code, out, _ = run_cli(capsys, "check", str(model), "--per-layer", "--tiling", "off",
                           "--json")
    assert json.loads(out)["striped"] == []
