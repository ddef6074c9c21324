"""The documentation's promises that code can check: the support matrix is the one list's, the
README leads with the set-up and links every document."""

from __future__ import annotations

from pathlib import Path

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
