"""One planning default everywhere: every command that plans, the footprint and `make mcu`
give the same arena for the same options, and a wrong planner name lists every right one.

The model is one whose best plan is proven optimal well within the time limit (and smaller
than the greedy plan), so the arena it gets does not depend on the machine's speed.
"""

from __future__ import annotations

import json
import shutil

import pytest

from toolchain.cli import main
from toolchain.errors import ArenacError
from toolchain.front.reader import read_model
from toolchain.lab.footprint import main as footprint_main
from toolchain.lower.plan import PLANNER_NAMES, plan_model
from toolchain.planners import PLANNERS

MODEL = "residual_cnn_int8"
needs_arm_gcc = pytest.mark.skipif(
    shutil.which("arm-none-eabi-gcc") is None, reason="arm-none-eabi-gcc is not installed"
)


def reported(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_model_tells_the_planners_apart(example_path):
    model = read_model(example_path(MODEL))
    best, greedy = plan_model(model), plan_model(model, "greedy")
    assert best.plan.proven_optimal and best.arena_bytes < greedy.arena_bytes


def test_plan_gen_check_and_embed_report_one_arena(capsys, example_path, tmp_path):
    path = str(example_path(MODEL))
    arena = reported(capsys, "plan", path)["arena_bytes"]
    assert reported(capsys, "gen", path, "-o", str(tmp_path / "c"))["arena_bytes"] == arena
    checked = reported(capsys, "check", path, "--backends", "runtime_py", "--inputs", "1")
    assert checked["arena_bytes"] == arena
    # embed always plans without in-place, overlaps or a new order: as plan does with those.
    plain = ("--no-inplace", "--no-overlap", "--schedule", "model")
    embedded = reported(capsys, "embed", path, "-o", str(tmp_path / "m.tflite"))["arena_bytes"]
    assert embedded == reported(capsys, "plan", path, *plain)["arena_bytes"]


@needs_arm_gcc
@pytest.mark.parametrize("options", [(), ("--planner", "greedy"), ("--no-overlap",)])
def test_footprint_plans_as_check_does_for_make_mcu(capsys, example_path, options):
    # `make mcu` runs `arenac check --target T` and then the footprint with the same target.
    path = str(example_path(MODEL))
    target = ("--target", "cortex-m4")
    arena = reported(capsys, "check", path, *target, "--backends", "runtime_py", "--inputs", "1",
                     *options)["arena_bytes"]
    assert footprint_main([path, *target, "--json", *options]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["planned_arena"] == row["arena"] == arena


def test_every_planner_is_named_when_one_is_unknown(capsys, example_path):
    path = example_path(MODEL)
    assert set(PLANNER_NAMES) == {"best", *PLANNERS}
    with pytest.raises(ArenacError, match="unknown planner 'fastest'; choose one of "
                       + ", ".join(PLANNER_NAMES) + "$"):
        plan_model(read_model(path), "fastest")
    for run in (main, footprint_main):
        with pytest.raises(SystemExit) as exited:
            run(["plan", str(path), "--planner", "fastest"] if run is main
                else [str(path), "--planner", "fastest"])
        assert exited.value.code == 2
        said = capsys.readouterr().err
        assert all(f"'{name}'" in said for name in PLANNER_NAMES)
