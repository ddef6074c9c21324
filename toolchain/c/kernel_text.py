"""What the generator learns by reading kernels' C text back, where the kernels do not declare it:
the file-scope definitions a stripe's kernel shares with the op's other stripes and the <math.h>
constants they name. Everything else the generator knows from the data kernels return
(toolchain.ops.emit.Kernel: their helper groups, the fixed-point ones included, and headers)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from toolchain.ops.emit import needs_math_h

# The first name a top-level definition gives: `static const int8_t NAME[4] = ...`,
# `static void NAME(void) {`.
DEFINED_NAME = re.compile(r"\b(\w+)\s*[\[(]")
TOP_LEVEL_STARTS = ("static", "ARENAC_", "/*", "#")
MACROS = re.compile(r"\bARENAC_\w+(?:\([^)]*\))?\s*")  # ARENAC_ALIGN(4), ARENAC_DSP_KERNEL


def c_words(texts: Iterable[str]) -> set[str]:
    """Every identifier-like word of some C text."""
    return set(re.findall(r"\b\w+\b", "\n".join(texts)))


def names_math_constant(texts: Iterable[str]) -> bool:
    """Whether kernels' text names NAN or INFINITY, which only <math.h> defines: a kernel folds
    such a float into its text without saying so."""
    return needs_math_h(c_words(texts))


def definition(lines: list[str]) -> str | None:
    """The line of an item that starts what it defines (its comment and blank lines aside)."""
    return next((x for x in lines if x.startswith(("static", "ARENAC_"))), None)


def top_level_items(text: str) -> list[tuple[str | None, str]]:
    """A kernel's text as its top-level items, each with the comment above it, and the name it
    defines (None for one that defines nothing, such as a lone comment)."""
    items: list[list[str]] = []
    for line in text.splitlines(keepends=True):
        below_its_comment = (items and items[-1][0].startswith("/*")
                             and definition(items[-1]) is None and not line.startswith("/*"))
        if not items or line.startswith(TOP_LEVEL_STARTS) and not below_its_comment:
            items.append([line])
        else:
            items[-1].append(line)
    named = []
    for lines in items:
        head = definition(lines)
        found = DEFINED_NAME.search(MACROS.sub("", head).split("=")[0]) if head else None
        named.append((found.group(1) if found else None, "".join(lines)))
    return named


def shared_definitions(text: str, defined: dict[str, str]) -> str | None:
    """A kernel's text without what an earlier kernel defined alike (recording its own), or
    None when it defines a name an earlier one defined otherwise."""
    items = top_level_items(text)
    if any(n is not None and defined.get(n, d) != d for n, d in items):
        return None
    kept = []
    for n, d in items:
        if n is None or n not in defined:
            kept.append(d)
        if n is not None:
            defined[n] = d
    return "".join(kept)


def alike_renamed(text: str, prefix: str, earlier: str, defined: Mapping[str, str]) -> str:
    """A kernel emitted under `prefix` because one of its names clashed with the kernel under
    `earlier`: each of its definitions equal to the earlier one's, but for the name, dropped
    and its uses renamed to that one, so only what differs is defined twice."""
    items = top_level_items(text)
    renames = {}
    for n, d in items:
        if n is None or not n.startswith(f"{prefix}_"):
            continue
        before = f"{earlier}{n[len(prefix):]}"
        if defined.get(before) == re.sub(rf"\b{re.escape(n)}\b", before, d):
            renames[n] = before
    if not renames:
        return text
    kept = "".join(d for n, d in items if n not in renames)
    return re.sub(rf"\b({'|'.join(map(re.escape, renames))})\b", lambda m: renames[m[1]], kept)
