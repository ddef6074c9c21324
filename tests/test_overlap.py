"""In-place and overlapping tensors, best-by-default plans, schedules and external offsets."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.conftest import SHARED_MODEL_FILES, needs_shared_models, tflm_head_figures
from toolchain.cli import main
from toolchain.errors import PlanError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model, read_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import check_plan, random_inputs
from toolchain.lower.plan import NO_TECHNIQUES, Techniques, plan_model
from toolchain.planners import verify
from toolchain.views.report import shared_bytes


def conv_chain() -> bytes:
    """3x3 stride-1 SAME convs with equal channels: each output may sit 2 rows below its input."""
    b = ModelBuilder("int8", seed=4)
    x = b.input("x", (1, 12, 12, 8), "int8", scale=0.05, zero_point=3)
    y = b.conv_2d(x, 8, 3, padding="SAME", activation="RELU")
    z = b.conv_2d(y, 8, 3, padding="SAME")
    b.output(b.softmax(b.reshape(b.average_pool_2d(z, 12, 1, "VALID"), (1, 8))))
    return b.build()


def overlapped_pairs(mp):
    return [o for o in mp.plan.overlaps if shared_bytes(mp, o.below, o.above)]


def test_default_plan_overlaps_and_stays_bit_exact_in_c():
    data = conv_chain()
    model = parse_model(data, "chain.tflite")
    plain = plan_model(model, "greedy", techniques=NO_TECHNIQUES)
    mp = plan_model(model)
    assert overlapped_pairs(mp) and mp.arena_bytes < plain.arena_bytes
    with CBackend(mp) as backend:
        report = check_plan(mp, data, inputs=3, extra=[("c", backend.invoke_many)])
    assert report.ok


def test_one_row_more_than_declared_is_refused_by_every_backend():
    """verify, the C generator and runtime_py refuse the plan; runtime_py's own check, run
    without verify, stops it too, though its numpy kernels would give the right values."""
    data = conv_chain()
    mp = plan_model(parse_model(data, "chain.tflite"), "greedy",
                    techniques=Techniques(inplace=False, schedule="model"))
    graph = mp.graph
    conv = graph.operators[1]
    slot = mp.lifetimes.tensor_buffers
    pair = next(o for o in mp.plan.overlaps if o.above == slot[conv.inputs[0]])
    row = 12 * 8  # one input row of 12 pixels x 8 channels
    offsets = list(mp.plan.offsets)
    offsets[pair.below] = offsets[pair.above] - pair.shift + row  # one row too close
    offsets = [o + row for o in offsets]
    broken = replace(mp, plan=replace(mp.plan, offsets=tuple(offsets),
                                      arena_bytes=mp.plan.arena_bytes + 2 * row))
    with pytest.raises(PlanError):
        verify(broken.plan)
    with pytest.raises(PlanError, match="unsafe plan"):
        CBackend(broken)
    with pytest.raises(PlanError, match="share bytes"):
        ArenaInterpreter(broken)
    with pytest.raises(PlanError, match=rf"step 1, op 1 \(CONV_2D\): .* kernel needs the output "
                                        rf"{pair.shift} bytes or more below the input"):
        ArenaInterpreter(broken, verify_plan=False).invoke(random_inputs(graph, 0))


def test_elementwise_output_takes_its_input():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 256), "float32")
    r = b.tensor("r", (1, 256), "float32")
    t = b.tensor("t", (1, 256), "float32")
    b.op("RELU", [x], [r])
    b.op("TANH", [r], [t])
    b.output(t)
    data = b.build()
    mp = plan_model(parse_model(data))
    assert mp.arena_bytes == 1024  # one tensor's worth: each output over its input
    with CBackend(mp) as backend:
        assert check_plan(mp, data, inputs=2, extra=[("c", backend.invoke_many)]).ok
    assert plan_model(parse_model(data), techniques=NO_TECHNIQUES).arena_bytes == 2048


@pytest.mark.parametrize("flags", [["--no-inplace", "--no-overlap"], ["--schedule", "model"]])
def test_switches(capsys, tmp_path, flags):
    path = tmp_path / "chain.tflite"
    path.write_bytes(conv_chain())
    main(["plan", str(path), "--json", *flags])
    data = json.loads(capsys.readouterr().out)
    if "--no-overlap" in flags:
        assert data["overlaps"] == [] and data["arena_bytes"] >= data["lower_bound_bytes"]


def test_external_offsets_round_trip(capsys, tmp_path):
    path = tmp_path / "chain.tflite"
    path.write_bytes(conv_chain())
    csv = tmp_path / "problem.csv"
    main(["plan", str(path), "--json", "--no-inplace", "--no-overlap", "--dump-buffers", str(csv)])
    planned = json.loads(capsys.readouterr().out)
    solution = tmp_path / "solution.csv"
    rows = ["id,offset"] + [f"{i},{b['offset']}" for i, b in enumerate(planned["buffers"])]
    solution.write_text("\n".join(rows) + "\n")
    code = main(["plan", str(path), "--json", "--no-inplace", "--no-overlap",
                 "--load-offsets", str(solution)])
    loaded = json.loads(capsys.readouterr().out)
    assert code == 0 and loaded["planner"] == "external"
    assert loaded["arena_bytes"] == planned["arena_bytes"]
    rows = ["id,offset"] + [f"{i},0" for i in range(len(planned["buffers"]))]
    solution.write_text("\n".join(rows) + "\n")
    code = main(["plan", str(path), "--no-inplace", "--no-overlap", "--load-offsets",
                 str(solution)])
    _, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1


@needs_shared_models
def test_acceptance_figures_on_the_reference_models():
    """Default arena <= TFLM's head everywhere; vww and person_detect <= 40 KiB; simple_add
    <= 32 KiB; the sum <= 0.7x TFLM's; with every technique off `optimal` proves the bound."""
    heads = tflm_head_figures()
    ours = {}
    for path in SHARED_MODEL_FILES:
        model = read_model(path)
        ours[path.stem] = plan_model(model).arena_bytes
        assert ours[path.stem] <= heads[path.stem], path.stem
        classic = plan_model(model, "optimal", techniques=NO_TECHNIQUES)
        assert classic.plan.proven_optimal and classic.arena_bytes == classic.lower_bound_bytes
    assert ours["vww_96_int8"] <= 40960 and ours["person_detect"] <= 40960
    assert ours["simple_add_model"] <= 32768
    assert sum(ours.values()) <= 0.7 * sum(heads[k] for k in ours)

