"""The documents' excerpts (README.md and docs/) are what the commands print or write:
each fenced block that starts with `$ arenac ...` is run (in a folder holding the files it
names) and every line it shows must appear in the output, in order; a block after
`<!-- excerpt of FILE from: COMMAND -->` is compared so with the FILE that COMMAND writes.
`...` stands for lines left out; a shown line ending in `...` is the start of the printed one.
The benchmark tables of arenas (`python -m tests.bench plan` and `tiling`) and the Cortex-M4
footprint (`mcu`) are compared column by column, timings left out. Arenas, bounds and counts
are deterministic, so a figure that goes stale fails here."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SHARED_MODELS
from toolchain.front.examples import EXAMPLES

ROOT = Path(__file__).resolve().parents[1]
# The user's manual: the README's quick start and the reference in docs/.
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The example model `make demo` writes, under the name the documents use.
DEMO = ("build/demo_int8.tflite", "residual_cnn_int8")


EXCERPT = re.compile(r"<!-- excerpt of (\S+) from: (arenac .+) -->")


def command_blocks() -> list[tuple[str, str, str | None, list[str]]]:
    """(file:line, command, file written or None for its output, lines shown) of every block
    of the documents that starts with `$ arenac` or follows an excerpt marker."""
    blocks = []
    for document in DOCUMENTS:
        lines, where = document.read_text().splitlines(), document.relative_to(ROOT)
        for k, line in enumerate(lines):
            marker = EXCERPT.fullmatch(line)
            if marker and lines[k + 1].startswith("```"):
                end = lines.index("```", k + 2)
                blocks.append((f"{where}:{k + 3}", marker[2], marker[1], lines[k + 2:end]))
            elif line == "```" and k + 1 < len(lines) and lines[k + 1].startswith("$ arenac "):
                end = lines.index("```", k + 1)
                blocks.append((f"{where}:{k + 2}", lines[k + 1][2:], None, lines[k + 2:end]))
    return blocks


def workspace(folder: Path, command: str) -> None:
    """The files `command` reads, under the names it gives them."""
    demo, example = DEMO
    (folder / demo).parent.mkdir(parents=True, exist_ok=True)
    (folder / demo).write_bytes(EXAMPLES[example]())
    words = shlex.split(command)
    for before, word in pairwise(words):
        if word.endswith(".tflite") and before != "-o" and not (folder / word).exists():
            source = SHARED_MODELS / word
            if not source.exists():
                pytest.skip(f"{source} not found")
            os.symlink(source, folder / word)
    if "frames.npy" in command:  # four input sets of the model's one input, seeded
        from toolchain.front.reader import read_model

        model = read_model(str(folder / shlex.split(command)[2]))
        tensor = model.main.tensors[model.main.inputs[0]]
        info = np.iinfo(tensor.dtype)
        frames = np.random.default_rng(0).integers(info.min, info.max + 1,
                                                   (4, *tensor.shape), dtype=tensor.dtype)
        np.save(folder / "frames.npy", frames)


def shown_in(shown: list[str], printed: list[str]) -> str | None:
    """None when every shown line appears in `printed` in order, else the first that does not."""
    at = 0
    for line in shown:
        if line.strip() == "...":
            continue
        want = line.rstrip()
        prefix = want.endswith("...") and want[:-3]
        while at < len(printed) and not (
            printed[at].rstrip() == want or (prefix and printed[at].startswith(prefix))
        ):
            at += 1
        if at == len(printed):
            return line
        at += 1
    return None


BLOCKS = command_blocks()


def test_the_readme_has_command_excerpts():
    assert len(BLOCKS) >= 8, "the documents' excerpts were not found"


@pytest.mark.parametrize("line, command, file, shown", BLOCKS,
                         ids=[line for line, *_ in BLOCKS])
def test_a_readme_excerpt_is_what_its_command_prints(tmp_path, line, command, file, shown):
    workspace(tmp_path, command)
    done = subprocess.run([sys.executable, "-m", "toolchain.cli", *shlex.split(command)[1:]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    printed = (done.stdout + done.stderr).splitlines()
    if file is not None:
        assert done.returncode == 0, done.stderr
        printed = (tmp_path / file).read_text().splitlines()
    missing = shown_in(shown, printed)
    assert missing is None, (
        f"{line}: `{command}` no longer {'writes' if file else 'prints'}\n"
        f"  {missing}\nit {'wrote' if file else 'printed'}:\n" + "\n".join(printed[:60]))


def test_an_excerpt_check_fails_on_a_changed_figure():
    printed = ["arena        5120 bytes", "naive sum    15136 bytes"]
    assert shown_in(["arena        5120 bytes", "...", "naive sum    15136 bytes"], printed) is None
    assert shown_in(["arena        5121 bytes"], printed) == "arena        5121 bytes"
    assert shown_in(["naive sum    15136 bytes", "arena        5120 bytes"], printed) is not None
    assert re.fullmatch(r"[\w/.-]+\.md:\d+", BLOCKS[0][0])


# -- the benchmark tables' deterministic columns ------------------------------------------------

PLAN_TABLE = "Arena bytes as each technique is added"


def table_rows(heading: str) -> list[list[str]]:
    """The cells of each row of the first fenced block after the paragraph starting `heading`
    in the documents (header and rule left out)."""
    for document in DOCUMENTS:
        lines = document.read_text().splitlines()
        start = next((k for k, line in enumerate(lines) if line.startswith(heading)), None)
        if start is not None:
            begin = lines.index("```", start)
            end = lines.index("```", begin + 1)
            return [line.split() for line in lines[begin + 3:end] if not line.startswith("sum:")]
    raise AssertionError(f"no table after {heading!r} in the documents")


def shared_model(shown: str) -> Path:
    """The shared model a table row names, its name maybe cut in the middle ("hel..._float")."""
    from tests.conftest import SHARED_MODEL_FILES

    head, _, tail = shown.partition("...")
    found = [p for p in SHARED_MODEL_FILES
             if (p.stem == shown) or (tail and p.stem.startswith(head) and p.stem.endswith(tail))]
    assert len(found) == 1, f"{shown!r} names {len(found)} shared models"
    return found[0]


PLAN_ROWS = table_rows(PLAN_TABLE)


@pytest.mark.parametrize("cells", PLAN_ROWS, ids=[cells[0] for cells in PLAN_ROWS])
def test_the_readme_arena_table_is_what_bench_plan_gives(cells):
    """`python -m tests.bench plan`: every column but the planning time."""
    from tests.bench import plan_row
    from tests.conftest import SHARED_MODEL_FILES

    if not SHARED_MODEL_FILES:
        pytest.skip("the shared models are absent")
    row = plan_row(shared_model(cells[0]))
    assert [str(c) for c in row[1:-1]] == cells[1:-1], f"the documented row {cells[0]} is stale"


TILING_ROWS = table_rows("Striped segments (section `tiling`)")


@pytest.mark.parametrize("cells", TILING_ROWS, ids=[cells[0] for cells in TILING_ROWS])
def test_the_readme_striping_table_is_what_bench_tiling_gives(cells):
    """`python -m tests.bench tiling`: the arenas, bounds, stripes and moved bytes, and the
    Cortex-M4 arenas with every kernel keeping its scratch (the instructions column needs a
    QEMU run, which `make bench` makes)."""
    from tests.bench import every_kernel, tiling_row
    from tests.conftest import SHARED_MODEL_FILES
    from toolchain.front.reader import read_model

    if not SHARED_MODEL_FILES:
        pytest.skip("the shared models are absent")
    path = shared_model(cells[0])
    row = tiling_row(path, count=False)
    assert [str(c) for c in row[1:8]] == cells[1:8], f"the documented row {cells[0]} is stale"
    if cells[8] != "-":
        model = read_model(path)
        m4 = [every_kernel(model, "cortex-m4", t).arena_bytes for t in ("off", "auto")]
        assert [str(a) for a in m4] == cells[8:10], f"row {cells[0]}: its Cortex-M4 arenas"


def pipe_rows(heading: str) -> list[list[str]]:
    """The cells of each row of the first Markdown table after the paragraph starting
    `heading` in the documents (header and rule left out), thousands separators dropped."""
    for document in DOCUMENTS:
        lines = document.read_text().splitlines()
        start = next((k for k, line in enumerate(lines) if line.startswith(heading)), None)
        if start is not None:
            begin = next(k for k in range(start, len(lines)) if lines[k].startswith("|"))
            end = next((k for k in range(begin, len(lines)) if not lines[k].startswith("|")),
                       len(lines))
            return [[c.strip().replace(",", "") for c in line.strip("|").split("|")]
                    for line in lines[begin + 2:end]]
    raise AssertionError(f"no table after {heading!r} in the documents")


STREAM_ROWS = pipe_rows("`python -m tests.bench stream` (also in `make bench`):")


@pytest.mark.parametrize("cells", STREAM_ROWS, ids=[cells[0] for cells in STREAM_ROWS])
def test_the_streamed_input_table_is_what_bench_stream_gives(cells):
    """`python -m tests.bench stream`: the input, the arena holding it, streaming it on generic
    and on cortex-m4, the rows its stripe buffer keeps, its column tiles and the MACs they
    compute twice."""
    from tests.bench import stream_row
    from tests.conftest import SHARED_MODEL_FILES

    if not SHARED_MODEL_FILES:
        pytest.skip("the shared models are absent")
    row = stream_row(shared_model(cells[0]))
    assert [str(c) for c in row[1:8]] == cells[1:8], f"the documented row {cells[0]} is stale"


def test_the_streamed_output_table_is_what_bench_stream_gives():
    """`python -m tests.bench stream`'s dense-prediction head, on generic and cortex-m4."""
    from tests.bench import stream_output_rows

    documented = pipe_rows("The shared models are classifiers, whose outputs are a few bytes")
    assert [[str(c) for c in row] for row in stream_output_rows()] == documented


FOOTPRINT_ROWS = table_rows("Measured by `make bench` (bytes; `-Os`, default plan; TFLM total")


@pytest.mark.parametrize("cells", FOOTPRINT_ROWS, ids=[cells[0] for cells in FOOTPRINT_ROWS])
def test_the_readme_footprint_table_is_what_bench_mcu_gives(cells):
    """`python -m tests.bench mcu`: flash, weights, kernel weights, code, RAM, arena, state
    and stack of the Cortex-M4 build (sizes from the linker, stack from -fstack-usage), and
    TFLM's total arena measured in its interpreter."""
    from tests.conftest import SHARED_MODEL_FILES
    from toolchain.front.reader import read_model
    from toolchain.lab.firmware import TOOL_PREFIX
    from toolchain.lab.footprint import footprint
    from toolchain.lab.oracle import TFLMOracle
    from toolchain.lab.qemu_backend import missing
    from toolchain.lower.plan import plan_model

    if not SHARED_MODEL_FILES:
        pytest.skip("the shared models are absent")
    absent = [program for program in missing() if program.startswith(TOOL_PREFIX)]
    if absent:
        pytest.skip(f"not on PATH: {', '.join(absent)}")
    path = shared_model(cells[0])
    model = read_model(path)
    r = footprint(plan_model(model))
    total = TFLMOracle(path.read_bytes(), len(model.main.outputs),
                       arena_size=4 << 20).allocations()["total"]
    got = [r["flash"], r["weights"], r["kernel_weights"], r["code"], r["ram"], r["arena"],
           r["state"], r["stack"], total]
    assert [str(v) for v in got] == cells[1:10], f"the documented row {cells[0]} is stale"


ESTIMATE_ROWS = table_rows("Cycles, estimated (`arenac bench --target TARGET`")
MLPERF_ROWS = {(cells[0], cells[1]): cells
               for cells in table_rows("Beside the best published MLPerf Tiny results")}
M4_ESTIMATE_ROWS = [cells for cells in ESTIMATE_ROWS if cells[2] == "cortex-m4"]


@pytest.mark.parametrize("cells", M4_ESTIMATE_ROWS, ids=[cells[0] for cells in M4_ESTIMATE_ROWS])
def test_the_mlperf_tables_are_what_bench_speed_gives(cells):
    """`python -m tests.bench speed`: the Cortex-M4 instructions and estimated cycles of each
    MLPerf Tiny model, and the estimate beside the published cycles (a QEMU run each; the other
    cores' rows are rerun by `make bench`)."""
    from tests.bench import mlperf_rows
    from tests.conftest import SHARED_MODEL_FILES
    from toolchain.lab.qemu_backend import missing

    if not SHARED_MODEL_FILES:
        pytest.skip("the shared models are absent")
    if missing():
        pytest.skip(f"not on PATH: {', '.join(missing())}")
    estimate, beside = mlperf_rows(shared_model(cells[0]), "cortex-m4")
    assert " ".join(estimate).split() == cells, f"the documented estimate of {cells[0]} is stale"
    assert " ".join(beside).split() == MLPERF_ROWS[cells[0], "cortex-m4"], (
        f"the documented MLPerf row of {cells[0]} is stale")


def test_the_mlperf_published_figures_are_the_benchmarks():
    """Every documented published figure, board and source is the benchmark's data, and every
    estimate row has its row beside the published figure with the same nominal cycles."""
    from tests.bench import MLPERF_BEST

    assert {(cells[0], cells[2]) for cells in ESTIMATE_ROWS} == set(MLPERF_ROWS)
    assert {(target, model) for model, target in MLPERF_ROWS} == set(MLPERF_BEST)
    for cells in ESTIMATE_ROWS:
        beside = MLPERF_ROWS[cells[0], cells[2]]
        best = MLPERF_BEST[cells[2], cells[0]]
        assert beside[2] == cells[5]
        assert beside[4] == f"{best.cycles:,}"
        assert " ".join(beside[5:-1]) == f"{best.board} {best.mhz} MHz {best.source}"
        nominal = int(cells[5].replace(",", ""))
        assert beside[-1] == f"{nominal / best.cycles:.2f}x"


SPEED_M4_ROWS = [cells for cells in table_rows("Instructions per inference on each Cortex-M target")
                 if cells[1] == "cortex-m4"]


@pytest.mark.parametrize("cells", SPEED_M4_ROWS, ids=[cells[0] for cells in SPEED_M4_ROWS])
def test_the_speed_table_cortex_m4_counts_are_what_bench_gives(cells):
    """`python -m tests.bench speed`, the Cortex-M4 rows' own-kernel instructions at their
    fastest (no arena limit): the MLPerf models' stand in the estimate table (checked above
    against a run), the others are run here. The other targets and the portable column are
    rerun by `make bench`."""
    from tests.bench import fastest_plan
    from tests.conftest import SHARED_MODEL_FILES
    from toolchain.lab.bench import bench
    from toolchain.lab.qemu_backend import missing

    estimated = {row[0]: row[3] for row in M4_ESTIMATE_ROWS}
    if cells[0] in estimated:
        assert cells[2] == estimated[cells[0]], f"the two tables disagree on {cells[0]}"
        return
    if not SHARED_MODEL_FILES:
        pytest.skip("the shared models are absent")
    if missing():
        pytest.skip(f"not on PATH: {', '.join(missing())}")
    result = bench(fastest_plan(shared_model(cells[0]), "cortex-m4"))
    assert result.outputs_match
    assert f"{result.instructions:,}" == cells[2], f"the documented row {cells[0]} is stale"
