"""The `arenac` command line: inspect and plan, text and JSON, on built and reference models."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from tests.conftest import SHARED_MODEL_FILES, needs_shared_models, tflm_head_figures
from toolchain.cli import main


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_on_every_command(capsys):
    for command in ["inspect", "plan"]:
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        assert "usage: arenac " + command in capsys.readouterr().out


def test_inspect_text_and_json(capsys, example_path):
    path = example_path("tiny_cnn_int8")
    code, out, _ = run(capsys, "inspect", str(path))
    assert code == 0 and "CONV_2D" in out and "weights" in out
    code, out, _ = run(capsys, "inspect", str(path), "--json")
    data = json.loads(out)
    g = data["graphs"][0]
    assert [o["opcode"] for o in g["operators"]][0] == "CONV_2D"
    assert g["weight_bytes"] == sum(t["bytes"] for t in g["tensors"] if t["kind"] == "constant")


@pytest.mark.parametrize("planner", ["greedy", "freelist", "naive"])
def test_plan_json_fields(capsys, example_path, planner):
    path = example_path("residual_cnn_int8")
    code, out, _ = run(capsys, "plan", str(path), "--planner", planner, "--json", "--align", "32")
    assert code == 0
    data = json.loads(out)
    for key in [
        "model",
        "planner",
        "alignment",
        "arena_bytes",
        "lower_bound_bytes",
        "naive_bytes",
        "buffers",
    ]:
        assert key in data
    assert data["planner"] == planner and data["alignment"] == 32
    assert all(b["offset"] % 32 == 0 for b in data["buffers"])
    assert data["lower_bound_bytes"] <= data["arena_bytes"] <= data["naive_bytes"]
    if planner == "naive":
        assert data["arena_bytes"] == data["naive_bytes"]
    assert set(data["buffers"][0]) >= {"tensor", "name", "bytes", "first_op", "last_op", "offset"}


def test_plan_text_map_svg_and_csv(capsys, example_path, tmp_path):
    path = example_path("residual_cnn_float32")
    svg, csv = tmp_path / "map.svg", tmp_path / "buffers.csv"
    code, out, _ = run(capsys, "plan", str(path), "--svg", str(svg), "--dump-buffers", str(csv))
    assert code == 0
    assert "arena" in out and "lower bound" in out and "memory map" in out
    root = ET.fromstring(svg.read_text())
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    code, out, _ = run(capsys, "plan", str(path), "--json")
    buffers = json.loads(out)["buffers"]
    assert sum(1 for t in titles if "bytes at offset" in t) == len(buffers)
    lines = csv.read_text().splitlines()
    assert lines[0] == "id,lower,upper,size" and len(lines) == len(buffers) + 1


@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_reference_models_plan_within_tflm(capsys, path):
    """Greedy is TFLM's own method: never a larger arena than TFLM's head."""
    results = {}
    for planner in ["greedy", "freelist", "naive"]:
        code, out, _ = run(capsys, "plan", str(path), "--planner", planner, "--json",
                           "--no-inplace", "--no-overlap", "--schedule", "model")
        assert code == 0
        results[planner] = json.loads(out)
    assert results["greedy"]["arena_bytes"] <= tflm_head_figures()[path.stem]
    assert results["naive"]["arena_bytes"] == results["naive"]["naive_bytes"]
    for r in results.values():
        assert r["arena_bytes"] >= r["lower_bound_bytes"]
