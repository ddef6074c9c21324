"""Text from a model file inside generated files: names, descriptions and paths are hostile input.

A tensor name is whatever bytes the file's author chose. Pasted into a C comment, `*/` ends the
comment and what follows compiles; a newline, a stray `/*`, a `??/` trigraph or a bidirectional
control breaks a -Werror build or hides code from a reviewer. So model text reaches C only through
`c_text`, and the SVG memory map only through `display_text`; identifiers are never taken from
model text, only from `c_identifier`, which builds a fresh one.

The terminal gets model text through `display_text` too, and tables (`table`) that fit their
columns by cutting long names in the middle.
"""

from __future__ import annotations

import re
from typing import Any

C_TEXT_LIMIT = 64  # characters of spelled text: a name in a comment stays one readable line
ELLIPSIS = "..."
C_IDENTIFIER_LIMIT = 32
FALLBACK_IDENTIFIER = "model"

# Escapes that read as what they stand for; every other character needing one is spelled as
# octal bytes (exactly three digits, so a following digit never joins the escape) or as a
# universal character name.
NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", '"': '\\"', "'": "\\'"}

C_KEYWORDS = frozenset(
    "auto break case char const continue default do double else enum extern float for goto if "
    "inline int long register restrict return short signed sizeof static struct switch typedef "
    "union unsigned void volatile while _Alignas _Alignof _Atomic _Bool _Complex _Generic "
    "_Imaginary _Noreturn _Static_assert _Thread_local alignas alignof bool constexpr false "
    "nullptr static_assert thread_local true typeof typeof_unqual".split()
)
# The C library's headers (C99 to C23, and the common POSIX and newlib ones): a model's NAME.h
# of one of these names would shadow it for every file built with the fragments' include path,
# on a file system that ignores case too.
C_HEADER_NAMES = frozenset(
    "assert complex ctype errno fenv float inttypes iso646 limits locale math setjmp signal "
    "stdalign stdarg stdatomic stdbit stdbool stdckdint stddef stdint stdio stdlib stdnoreturn "
    "string tgmath threads time uchar wchar wctype alloca malloc memory strings unistd".split()
)
# Names a model's files may not take: keywords, and `main`, the host harness's entry point.
RESERVED_NAMES = C_KEYWORDS | {"main"}


def c_text(text: str, limit: int = C_TEXT_LIMIT) -> str:
    """`text` spelled so that it is inert in a C block comment, a line comment or a string
    literal: printable ASCII only, no `*/`, `/*`, `??` or quote, and no backslash except as the
    start of a complete escape ending in a digit or letter (so a line never ends in one). In a
    string literal the escapes mean the original characters (UTF-8). Longer spellings are cut to
    `limit` characters ending in `...`. Generated text around it must not be `*`, `/` or `?`."""
    pieces = [_spell(text, i) for i in range(len(text))]
    if sum(map(len, pieces)) <= limit:
        return "".join(pieces)
    kept, length = [], len(ELLIPSIS)
    for piece in pieces:
        if length + len(piece) > limit:
            break
        kept.append(piece)
        length += len(piece)
    return "".join(kept) + ELLIPSIS


def _spell(text: str, i: int) -> str:
    """Character i of `text`: itself when harmless there, else an escape. A `*` next to a `/`
    is escaped (that breaks both `*/` and `/*`), a `?` after a `?` (every trigraph starts with
    two), and a backslash always: as `\\134`, because `\\\\` would let a line end in one."""
    c = text[i]
    if c in NAMED_ESCAPES:
        return NAMED_ESCAPES[c]
    if c == "\\" or (c == "*" and "/" in text[max(i - 1, 0) : i + 2]):
        return _octal(c.encode())
    if c == "?" and i > 0 and text[i - 1] == "?":
        return "\\?"
    if " " <= c <= "~":
        return c
    code = ord(c)
    if code < 0xA0:  # C0 and C1 controls: no universal character name may spell them
        return _octal(c.encode())
    if 0xD800 <= code <= 0xDFFF:  # a lone surrogate is no character at all
        return "\\ufffd"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _octal(data: bytes) -> str:
    return "".join(f"\\{byte:03o}" for byte in data)


def display_text(text: str) -> str:
    """`text` for a document a person reads (the SVG memory map): characters that XML 1.0
    forbids even escaped (NUL and the other controls) and invisible ones that reorder or hide
    what is shown (bidirectional controls, zero-width characters) spelled as `\\xNN`, `\\uNNNN`;
    the document's own escaping (`<`, `&`, quotes) is the template's job."""
    return "".join(c if c.isprintable() and c != "\\" else _visible_escape(c) for c in text)


def _visible_escape(c: str) -> str:
    code = ord(c)
    if c == "\\":
        return "\\\\"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def c_identifier(text: str) -> str:
    """A C identifier built from `text` (a user's --name, a file's stem): ASCII letters, digits
    and underscores, starting with a letter (a leading underscore is reserved to the
    implementation), not a keyword, `main` nor a C library header's name, at most
    C_IDENTIFIER_LIMIT characters."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", text)[:C_IDENTIFIER_LIMIT]
    if not name:
        return FALLBACK_IDENTIFIER
    if not name[0].isalpha() or name in RESERVED_NAMES or name.lower() in C_HEADER_NAMES:
        name = f"m_{name}"[:C_IDENTIFIER_LIMIT]
    return name


def name_refusal(text: str) -> str | None:
    """Why a user's --name cannot be used as it is, or None: it is taken only when
    `c_identifier` would keep it unchanged, so the files and symbols are the names asked for."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", text):
        return "must be a C identifier: ASCII letters, digits and _, starting with a letter"
    if len(text) > C_IDENTIFIER_LIMIT:
        return f"must be at most {C_IDENTIFIER_LIMIT} characters long"
    if text == "main":
        return "would clash with main(), the entry point of the harness and of firmware (main.c)"
    if text in C_KEYWORDS:
        return "is a C keyword"
    if text.lower() in C_HEADER_NAMES:
        return (f"would make {text}.h shadow the C library's <{text.lower()}.h> on the include "
                "path")
    return None


# --- text tables on a terminal ------------------------------------------------------------
TABLE_WIDTH = 100  # columns a text table may take: long names are cut in the middle
MIN_CUT_WIDTH = 12  # a text column is never cut narrower than this (or its header)


def middle_cut(text: str, width: int) -> str:
    """`text` in at most `width` characters, its middle replaced by an ellipsis: the start and
    the end of a tensor name are what tell it from its neighbours, the end (layer and op) the
    most, so it keeps two thirds."""
    if len(text) <= width:
        return text
    keep = max(width - len(ELLIPSIS), 0)
    end = keep - keep // 3
    return text[: keep // 3] + ELLIPSIS + text[len(text) - end :]


def fitted_widths(widths: list[int], cuttable: list[bool], floors: list[int],
                  total: int) -> list[int]:
    """Column widths within `total` characters (two between columns): the widest cuttable
    column gives up a character at a time, down to its floor."""
    widths = list(widths)
    excess = sum(widths) + 2 * (len(widths) - 1) - total
    while excess > 0:
        open_ = [i for i, w in enumerate(widths) if cuttable[i] and w > floors[i]]
        if not open_:
            break
        widest = max(open_, key=lambda i: widths[i])
        widths[widest] -= 1
        excess -= 1
    return widths


def table(headers: list[str], rows: list[list[Any]], width: int = TABLE_WIDTH) -> str:
    """A plain aligned text table within `width` columns; numbers right-aligned, text cells
    that do not fit cut in the middle (`--json` has them whole). Every cell is shown as
    display_text shows it: a tensor name is the model's text, and an escape sequence or a
    bidirectional control in it must not reach the terminal."""
    numeric = [all(isinstance(r[i], int) for r in rows) and rows for i in range(len(headers))]
    cells = [[display_text(str(c)) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    floors = [max(len(h), MIN_CUT_WIDTH) for h in headers]
    widths = fitted_widths(widths, [not n for n in numeric], floors, width)
    cells = [[middle_cut(c, w) for c, w in zip(r, widths, strict=True)] for r in cells]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric,
                                                                        strict=True)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])
