"""The documentation's promises that code can check: the support matrix is the one list's, the
README leads with the set-up, its quick start runs as written, and it links every document."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from toolchain.cli import main
from toolchain.front.examples import EXAMPLES
from toolchain.lab import qemu_backend
from toolchain.views.support import BEGIN, END, support_matrix_markdown

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SUPPORT = ROOT / "docs" / "runtime_py.md"  # where the support matrix stands


def test_the_support_matrix_is_generated_from_the_one_list():
    text = SUPPORT.read_text()
    block = text[text.index(BEGIN):text.index(END) + len(END)]
    assert block == support_matrix_markdown(), "run: python -m toolchain.views.support"


def test_readme_shows_the_two_setup_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text


def test_the_readme_is_a_quick_start_that_links_every_document():
    text = README.read_text()
    assert len(text.splitlines()) < 200, "the reference belongs in docs/"
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in text, f"the README does not link {doc.name}"


def test_every_link_between_the_documents_lands_on_a_heading():
    """A link to `file.md#anchor` (or `#anchor` in the same file) names a heading or an
    explicit anchor that exists: moving a section must carry its links along."""
    import re

    files = [README, *sorted((ROOT / "docs").glob("*.md"))]
    anchors = {}
    for path in files:
        found = set(re.findall(r'<a id="([^"]+)"></a>', path.read_text()))
        for line in path.read_text().splitlines():
            if line.startswith("#"):
                heading = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower())
                found.add(heading.replace(" ", "-"))
        anchors[path.resolve()] = found
    for path in files:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", path.read_text()):
            landing = (path.parent / target).resolve() if target else path.resolve()
            assert landing in anchors, f"{path.name}: link to missing {target}"
            assert anchor in anchors[landing], f"{path.name}: no #{anchor} in {landing.name}"


def quick_start_commands() -> list[str]:
    """The commands of the README's quick start, in order, without their comments."""
    text = README.read_text()
    block = text[text.index("## Quick start"):]
    block = block[block.index("```sh") + len("```sh"):]
    block = block[:block.index("```")]
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_the_quick_start_runs_as_written(tmp_path, monkeypatch, capsys):
    """Every command of the quick start, on a built-in model saved as model.tflite in an empty
    folder, from installing nothing more to a firmware running under QEMU."""
    if qemu_backend.missing() or shutil.which("make") is None:
        pytest.skip("no Cortex-M toolchain, QEMU or make")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.tflite").write_bytes(EXAMPLES["tiny_cnn_int8"]())
    commands = quick_start_commands()
    assert [c.split()[:2] for c in commands][-1] == ["make", "-C"]
    for command in commands:
        words = shlex.split(command)
        if words[0] == "arenac":
            assert main(words[1:]) == 0, (command, capsys.readouterr().err)
        else:
            ran = subprocess.run(words, capture_output=True, text=True, timeout=300)
            assert ran.returncode == 0, (command, ran.stderr)
            assert "output 0" in ran.stderr and "ticks" in ran.stderr
    assert (tmp_path / "plan.svg").exists() and (tmp_path / "fw" / "main.c").exists()
