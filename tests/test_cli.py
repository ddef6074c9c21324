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
    # outputs over their dying inputs (and striped segments) may go below the classic bound
    assert data["overlap_bound_bytes"] <= data["arena_bytes"] <= data["naive_bytes"]
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


def sign_model() -> bytes:
    """A convolution followed by SIGN, which no kernel here runs."""
    from toolchain.front.builder import ModelBuilder

    b = ModelBuilder("float32", 0)
    x = b.input("x", (1, 8, 8, 3), "float32")
    y = b.conv_2d(x, 4, 3)
    root = b.tensor("root", b.shape(y), "float32")
    b.op("SIGN", [y], [root])
    b.output(root)
    return b.build()


def test_plan_says_which_ops_lack_a_kernel_and_so_their_scratch(capsys, tmp_path):
    path = tmp_path / "sign.tflite"
    path.write_bytes(sign_model())
    status, out, _ = run(capsys, "plan", str(path))
    assert status == 0
    assert "unsupported  1 ops (SIGN) have no kernel here: the arena below lacks their scratch," \
        in out
    status, out, _ = run(capsys, "plan", str(path), "--json")
    assert [(r["op"], r["opcode"]) for r in json.loads(out)["unsupported_ops"]] == [(1, "SIGN")]
    status, _, err = run(capsys, "gen", str(path), "-o", str(tmp_path / "out"))
    assert status == 2 and "SIGN" in err


def test_plan_of_a_supported_model_lists_no_unsupported_ops(capsys, example_path):
    status, out, _ = run(capsys, "plan", str(example_path("tiny_cnn_int8")), "--json")
    assert status == 0 and json.loads(out)["unsupported_ops"] == []


def test_every_plan_line_fits_100_columns_on_a_big_model(capsys, tmp_path):
    """Buffer numbers of three digits label the map's rows here: its columns narrow to keep
    each row within 100 (96 columns made 102)."""
    from tests.wide import wide_model

    path = tmp_path / "wide.tflite"
    path.write_bytes(wide_model(300))
    status, out, _ = run(capsys, "plan", str(path), "--planner", "freelist")
    assert status == 0
    rows = [line for line in out.splitlines() if "|" in line]
    assert rows and max(len(line) for line in out.splitlines()) <= 100
    assert any(len(line) == 100 for line in rows)  # the map takes the width it may
