"""The README's promises that code can check: the support matrix is the one list's."""

from __future__ import annotations

from pathlib import Path

from toolchain.support import BEGIN, END, support_matrix_markdown

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_support_matrix_is_generated_from_the_one_list():
    text = README.read_text()
    block = text[text.index(BEGIN):text.index(END) + len(END)]
    assert block == support_matrix_markdown(), "run: python -m toolchain.support"


def test_readme_shows_the_two_setup_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text
