"""Text from a model file inside generated files: names, descriptions and paths are hostile input.

A tensor name is whatever bytes the file's author chose. Pasted into a C comment, `*/` ends the
comment and what follows compiles; a newline, a stray `/*`, a `??/` trigraph or a bidirectional
control breaks a -Werror build or hides code from a reviewer. So model text reaches C only through
`c_text`, and the SVG memory map only through `display_text`; identifiers are never taken from
model text, only from `c_identifier`, which builds a fresh one.
"""

from __future__ import annotations

import re

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
