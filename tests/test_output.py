"""What arenac shows and writes tells the truth and reads well: the version, files named by the
model's SHA-256 (the same from any path), progress on a terminal only, tables within 100
columns, map marks that never repeat, axis labels apart, refused names, gen beside other files,
the HTML report."""

from __future__ import annotations

import hashlib
import html.parser
import json
import os
import re
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import tomllib

from tests.conftest import (
    RECURRENT_MODEL_FILES,
    SHARED_MODEL_FILES,
    SHARED_MODELS,
    needs_shared_models,
)
from toolchain import __version__, progress
from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model, read_model
from toolchain.lab.firmware import toolchain_available
from toolchain.lower.plan import BufferRow, plan_model
from toolchain.text import TABLE_WIDTH, middle_cut, table
from toolchain.views.report import MAP_SYMBOLS, memory_map_svg, memory_map_text

ROOT = Path(__file__).resolve().parents[1]


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m toolchain ...` in a child, as a user runs it (stderr a pipe, not a terminal)."""
    return subprocess.run([sys.executable, "-m", "toolchain", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


# --- version and module entry point --------------------------------------------------------

def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"arenac {__version__}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "toolchain.__version__"}


def test_python_dash_m_toolchain_runs_the_cli(tmp_path):
    result = cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"arenac {__version__}"
    path = tmp_path / "m.tflite"
    path.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    result = cli("inspect", str(path), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["graphs"][0]["operators"][0]["opcode"] == "CONV_2D"


# --- generated files name the model by its bytes ------------------------------------------

def test_the_same_model_gives_the_same_files_from_any_path_and_directory(tmp_path):
    data = EXAMPLES["residual_cnn_int8"]()
    first, second = tmp_path / "here", tmp_path / "elsewhere" / "deeper"
    first.mkdir()
    second.mkdir(parents=True)
    (first / "model.tflite").write_bytes(data)
    (second / "renamed copy.tflite").write_bytes(data)
    a = cli("gen", "model.tflite", "-o", "out", "--name", "net", cwd=first)
    b = cli("gen", str(second / "renamed copy.tflite"), "-o", str(tmp_path / "out2"),
            "--name", "net", cwd=tmp_path)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    files = sorted(p.name for p in (first / "out").iterdir())
    assert files == ["net.c", "net.cmake", "net.h", "net.mk", "net_main.c"]
    assert files == sorted(p.name for p in (tmp_path / "out2").iterdir())
    digest = hashlib.sha256(data).hexdigest()
    for name in files:
        text = (first / "out" / name).read_bytes()
        assert text == (tmp_path / "out2" / name).read_bytes(), name
        head = text.decode().split("*/")[0] if name.endswith((".c", ".h")) else text.decode()
        head = "\n".join(head.splitlines()[:3])
        assert f"arenac {__version__}" in head and f"SHA-256 {digest}" in head, name
        assert b"tflite" not in text and str(tmp_path).encode() not in text, name


def test_a_different_model_gives_a_different_digest():
    a = parse_model(EXAMPLES["tiny_cnn_int8"](), "a.tflite")
    b = parse_model(EXAMPLES["tiny_cnn_float32"](), "a.tflite")
    assert a.sha256 == hashlib.sha256(EXAMPLES["tiny_cnn_int8"]()).hexdigest()
    assert a.sha256 != b.sha256


# --- --name and the output folder ----------------------------------------------------------

@pytest.mark.parametrize("name, said", [
    ("main", "main()"),
    ("int", "C keyword"),
    ("while", "C keyword"),
    ("my-model", "C identifier"),
    ("9lives", "C identifier"),
    ("_model", "C identifier"),
    ("caf\u00e9", "C identifier"),
    ("", "C identifier"),
    ("x" * 33, "at most 32"),
])
def test_a_name_that_is_no_fit_identifier_is_refused(tmp_path, name, said):
    path = tmp_path / "m.tflite"
    path.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    result = cli("gen", str(path), "-o", str(tmp_path / "out"), "--name", name)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--name" in lines[0] and said in lines[0], result.stderr
    assert not (tmp_path / "out").exists()


def test_a_model_file_named_main_gets_a_name_that_is_not_main(capsys, tmp_path):
    path = tmp_path / "main.tflite"
    path.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    code, _, _ = run(capsys, "gen", str(path), "-o", str(tmp_path / "out"))
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "m_main.c", "m_main.cmake", "m_main.h", "m_main.mk", "m_main_main.c"]


def test_gen_into_a_folder_with_other_files_writes_only_its_own(capsys, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    out = tmp_path / "firmware"
    (out / "drivers").mkdir(parents=True)
    others = {"main.c": "int main(void) { return 0; }\n", "model.c": "mine\n",
              "net_notes.txt": "notes\n", "drivers/uart.c": "uart\n"}
    for name, text in others.items():
        (out / name).write_text(text)
        os.utime(out / name, (1_000_000_000, 1_000_000_000))
    before = {p: p.stat() for p in out.rglob("*")}
    code, stdout, _ = run(capsys, "gen", str(path), "-o", str(out), "--name", "net")
    assert code == 0
    after = {p.relative_to(out).as_posix() for p in out.rglob("*")}
    assert after == {"drivers", *others, "net.h", "net.c", "net_main.c", "net.cmake", "net.mk"}
    for name, text in others.items():
        assert (out / name).read_text() == text
        assert (out / name).stat().st_mtime == before[out / name].st_mtime
    assert stdout.count(str(out)) == 5  # the C files and the two build fragments


# --- tables ------------------------------------------------------------------------------

def long_named_model() -> bytes:
    """A chain of ops whose tensor names are long and differ only at the end, as converters
    name them."""
    b = ModelBuilder("float32")
    stem = "model/backbone/stage_3/block_17/" + "very_long_scope_name/" * 5
    x = b.input(stem + "input", (1, 8), "float32")
    for i in range(6):
        y = b.tensor(f"{stem}layer_{i}/Relu;{stem}layer_{i}/BiasAdd", (1, 8), "float32")
        b.op("RELU", [x], [y])
        x = y
    b.output(x)
    return b.build()


def test_tables_fit_100_columns_and_json_keeps_every_name(capsys, tmp_path):
    path = tmp_path / "long.tflite"
    path.write_bytes(long_named_model())
    model = read_model(path)
    names = [t.name for t in model.main.tensors]
    for command in ("inspect", "plan"):
        code, out, _ = run(capsys, command, str(path))
        assert code == 0
        lines = out.splitlines()
        if command == "inspect":
            lines = lines[1:]  # the path as given
        assert max(map(len, lines)) <= TABLE_WIDTH, out
        assert any("..." in line for line in lines)
    code, out, _ = run(capsys, "inspect", str(path), "--json")
    assert [t["name"] for t in json.loads(out)["graphs"][0]["tensors"]] == names
    code, out, _ = run(capsys, "plan", str(path), "--json")
    assert {b["name"] for b in json.loads(out)["buffers"]} <= set(names)


@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_real_models_fit_100_columns(capsys, path):
    for args in (["inspect"], ["plan", "--time-limit", "0.5"]):
        code, out, _ = run(capsys, args[0], str(path), *args[1:])
        assert code == 0
        lines = [line for line in out.splitlines() if not line.startswith("model ")]
        assert max(map(len, lines)) <= TABLE_WIDTH, max(lines, key=len)


def test_cut_names_keep_both_ends_and_stay_apart():
    names = [f"prefix/{'x' * 80}/layer_{i}/Relu" for i in range(12)]
    cut = [middle_cut(n, 30) for n in names]
    assert all(len(c) == 30 and c.startswith("prefix") and c.endswith("/Relu") for c in cut)
    assert len(set(cut)) == len(names)
    assert middle_cut("short", 30) == "short"
    text = table(["index", "name"], [[i, n] for i, n in enumerate(names)], width=40)
    assert max(map(len, text.splitlines())) <= 40


def test_numbers_are_never_cut():
    text = table(["n", "name"], [[10**30, "y" * 200]], width=40)
    assert str(10**30) in text


@pytest.mark.parametrize("path", [None, *RECURRENT_MODEL_FILES[:1]],
                         ids=lambda p: "residual_cnn_int8" if p is None else p.stem)
def test_inspect_json_gives_op_inputs_and_outputs_as_tensor_indices(capsys, tmp_path, path):
    if path is None:
        path = tmp_path / "m.tflite"
        path.write_bytes(EXAMPLES["residual_cnn_int8"]())
    model = read_model(path)
    code, out, _ = run(capsys, "inspect", str(path), "--json")
    assert code == 0
    for graph, shown in zip(model.graphs, json.loads(out)["graphs"], strict=True):
        assert [(o["inputs"], o["outputs"]) for o in shown["operators"]] == [
            (list(op.inputs), list(op.outputs)) for op in graph.operators]


# --- the text memory map -----------------------------------------------------------------

def chain_model(ops: int) -> bytes:
    """ops ADDs in a row, each of the previous result and a constant: ops + 1 buffers."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    for i in range(ops):
        c = b.const(f"c{i}", np.full((1, 4), i, np.float32))
        y = b.tensor(f"y{i}", (1, 4), "float32")
        b.op("ADD", [x, c], [y])
        x = y
    b.output(x)
    return b.build()


@pytest.mark.parametrize("ops", [20, len(MAP_SYMBOLS) - 1, len(MAP_SYMBOLS) + 8])
def test_map_marks_never_repeat(ops):
    from toolchain.views.report import plan_text

    mp = plan_model(parse_model(chain_model(ops), "chain.tflite"), "greedy")
    rows = mp.rows()
    text = plan_text(mp)
    lines = text.splitlines()
    marks = [line.split()[0] for line in lines[2 : 2 + len(rows)]]
    assert len(marks) == len(rows) == ops + 1
    assert len(set(marks)) == len(marks)
    grid = [line for line in lines if re.match(r"^ *\d+ \|.*\|$", line)]
    if len(rows) <= len(MAP_SYMBOLS):
        assert set(marks) <= set(MAP_SYMBOLS)
        cells = set("".join(line.split("|")[1] for line in grid)) - {"."}
        assert cells <= set(marks)
    else:  # one numbered row per buffer, live where marked
        assert marks == [str(r.buffer) for r in rows]
        assert [int(line.split("|")[0]) for line in grid] == [r.buffer for r in rows]
        for line, r in zip(grid, rows, strict=True):
            live = [i for i, c in enumerate(line.split("|")[1]) if c == "#"]
            assert live == list(range(r.first_op, r.last_op + 1))


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 9, 10, 11, 31, 66, 95, 96, 97, 150, 999, 12345])
def test_step_labels_sit_under_their_steps_and_never_run_together(steps):
    rows = [BufferRow(0, 0, "a", 100, 0, steps - 1, 0),
            BufferRow(1, 1, "b", 10**9, steps // 2, steps - 1, 100)]
    lines = memory_map_text(rows, 10**9 + 100, steps).splitlines()
    grid = [line for line in lines if "|" in line]
    assert all(re.match(r"^ *\d+ \|[^|]+\|$", line) for line in grid)
    width = len(grid[0].split("|")[1])
    edge = next(i for i, line in enumerate(lines) if line.lstrip().startswith("+-"))
    origin = lines[edge].index("+") + 1  # the column under the map's first cell
    labels = lines[edge + 1]
    found = [(m.start() - origin, int(m.group())) for m in re.finditer(r"\d+", labels)]
    if width >= len("0") + 2 + len(str(steps - 1)):  # room for the first step's label too
        assert found[0] == (0, 0)
    assert found[-1][1] == steps - 1 and found[-1][0] + len(str(steps - 1)) == width
    values = [v for _, v in found]
    assert values == sorted(set(values))
    for (a, va), (b, _) in pairwise(found):
        assert b - (a + len(str(va))) >= 2  # two spaces at least between labels
    for col, value in found[:-1]:  # each under the column holding its step
        assert col * steps // width <= value <= ((col + 1) * steps - 1) // width


# --- the SVG map ---------------------------------------------------------------------------

def test_the_svg_marks_the_step_with_the_most_bytes_in_use():
    mp = plan_model(parse_model(EXAMPLES["residual_cnn_int8"](), "r.tflite"))
    used = [bytearray(mp.arena_bytes) for _ in mp.lifetimes.order]
    for r in mp.rows():
        for step in range(r.first_op, r.last_op + 1):
            used[step][r.offset : r.offset + r.bytes] = b"\x01" * r.bytes
    counts = [sum(u) for u in used]
    peak = counts.index(max(counts))
    svg = memory_map_svg(mp)
    found = re.search(r"peak: step (\d+) (\w+), (\d+) bytes live", svg)
    assert found and (int(found.group(1)), int(found.group(3))) == (peak, max(counts))
    assert found.group(2) == mp.graph.operators[mp.lifetimes.order[peak]].opcode
    assert "offset (bytes)" in svg and "legend" in svg


def test_the_svg_names_the_rectangles_that_can_hold_a_name():
    mp = plan_model(parse_model(EXAMPLES["tiny_cnn_int8"](), "t.tflite"))
    svg = memory_map_svg(mp)
    shown = re.findall(r'<g class="buffer">.*?<text[^>]*>([^<]+)</text>', svg, re.DOTALL)
    names = {r.name for r in mp.rows()}
    assert any(label.split(" ", 1)[-1] in names for label in shown)


# --- progress ------------------------------------------------------------------------------

def as_terminal(monkeypatch) -> None:
    """stderr (capsys's, once the test runs) taken for a terminal, progress shown at once; the
    switch restored after the test."""
    monkeypatch.setattr(progress, "_enabled", False)
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)


def test_progress_shows_on_a_terminal_and_never_on_stdout(monkeypatch, capsys, example_path):
    as_terminal(monkeypatch)
    path = example_path("tiny_cnn_int8")
    code, out, err = run(capsys, "check", str(path), "--inputs", "1")
    assert code == 0
    for stepname in ("planning", "oracle", "runtime_py", "compiling the C", "running the C"):
        assert stepname in err, err
    assert "\r" not in out and "planning" not in out
    code, out_json, err = run(capsys, "check", str(path), "--inputs", "1", "--json")
    assert json.loads(out_json)["ok"] and "oracle" in err


def test_quiet_turns_progress_off(monkeypatch, capsys, example_path):
    as_terminal(monkeypatch)
    code, _, err = run(capsys, "check", str(example_path("tiny_cnn_int8")), "--inputs", "1",
                       "--quiet")
    assert code == 0 and err == ""


def test_no_progress_when_stderr_is_not_a_terminal(tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    result = cli("check", str(path), "--inputs", "1")
    assert result.returncode == 0 and result.stderr == ""


def test_progress_is_off_for_library_callers(capsys):
    with progress.step("anything", total=3) as bar:
        bar.update()
    assert capsys.readouterr().err == ""


# --- the HTML report -----------------------------------------------------------------------

class Page(html.parser.HTMLParser):
    """Tags, attributes and text of a page, and whether its tags balance."""

    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.open: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        assert self.open and self.open[-1] == tag, (tag, self.open[-5:])
        self.open.pop()

    def handle_data(self, data):
        self.text.append(data)


def test_report_is_one_self_contained_page(capsys, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(EXAMPLES["residual_cnn_int8"]())
    out = tmp_path / "report.html"
    code, stdout, _ = run(capsys, "report", str(path), "-o", str(out), "--inputs", "1")
    assert code == 0 and str(out) in stdout
    page = Page()
    page.feed(out.read_text())
    page.close()
    assert page.open == []
    tags = [t for t, _ in page.tags]
    assert "svg" in tags and "script" not in tags
    for _, attrs in page.tags:  # nothing fetched: no src, no link to another file
        assert "src" not in attrs and not attrs.get("href")
    text = " ".join(page.text)
    model = read_model(path)
    plan = json.loads(run(capsys, "plan", str(path), "--json")[1])
    assert model.sha256 in text and f"arenac {__version__}" in text
    assert f"{plan['arena_bytes']} bytes" in text
    for t in model.main.tensors:
        assert t.name in text
    assert "all backends agree" in text
    if toolchain_available():
        assert "Flash per kernel" in text
    else:
        assert "arm-none-eabi-gcc" in text
    layers = json.loads(run(capsys, "plan", str(path), "--layers", "--json")[1])
    html = out.read_text()
    table = html[html.index("<h2>Layers</h2>"):html.index("<h2>Operators</h2>")]
    assert table.count("<tr>") == 1 + len(layers["layers"])
    for row in layers["layers"]:
        assert f"<td>{row['op']}</td>" in table
        assert f'<td class="n">{row["arena_high_water"]}</td>' in table


def test_report_says_what_it_left_out(capsys, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    out = tmp_path / "report.html"
    code, _, _ = run(capsys, "report", str(path), "-o", str(out), "--no-check", "--no-footprint")
    assert code == 0
    text = out.read_text()
    assert text.count("not asked for") == 3  # the summary's check line, and both sections
    assert "all backends agree" not in text


def test_report_into_a_missing_folder_is_one_line(tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    result = cli("report", str(path), "-o", str(tmp_path / "no" / "r.html"), "--no-check",
                 "--no-footprint")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "cannot write" in result.stderr and not (tmp_path / "no").exists()


@pytest.mark.skipif(not (SHARED_MODELS / "person_detect.tflite").exists(),
                    reason="reference models not found")
def test_report_on_person_detect(capsys, tmp_path):
    out = tmp_path / "report.html"
    code, _, _ = run(capsys, "report", str(SHARED_MODELS / "person_detect.tflite"), "-o",
                     str(out), "--no-check", "--no-footprint")
    assert code == 0 and "MobilenetV1/Predictions/Reshape_1" in out.read_text()
