"""MiniMalloc's CSV form of the allocation problem, so an exact solver can check our planners.

MiniMalloc writes lives as half-open `[lower, upper)`, ours are inclusive `[first, last]`, so
`lower = first` and `upper = last + 1`. Columns are found by name, as MiniMalloc does.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

import numpy as np

from toolchain.errors import ArenacError, PlanError
from toolchain.files import read_bounded
from toolchain.planners.base import Buffer

PathOrFile = str | os.PathLike[str] | TextIO

PROBLEM_COLUMNS = ("id", "lower", "upper", "size")
# Every number in these files is a plain decimal below this: 4 GiB is past any arena a
# microcontroller has, and such offsets and sizes stay exact in every integer type we emit.
NUMBER_LIMIT = 2**32
# ASCII digits and nothing else: int() would also take 1_6, +5, 1 000 in other scripts' digits.
_PLAIN_NUMBER = re.compile(r"-?[0-9]+")
# Fields of ASCII digits, spaces or tabs around them, joined by commas: nothing else.
_PLAIN_FIELDS = re.compile(r"(?:[ \t]*[0-9]+[ \t]*(?:,|$))*", re.ASCII)
# Missing ids an error lists before it only counts the rest.
_MISSING_SHOWN = 10


def dump_buffers(buffers: Sequence[Buffer], path_or_file: PathOrFile) -> None:
    with _opened(path_or_file, "w") as (_, file):
        writer = csv.writer(file, lineterminator="\n")
        writer.writerow(PROBLEM_COLUMNS)
        writer.writerows((b.id, b.first, b.last + 1, b.size) for b in buffers)


def dump_solution(
    buffers: Sequence[Buffer], offsets: Sequence[int], path_or_file: PathOrFile
) -> None:
    """MiniMalloc's solution form: the problem's columns and each buffer's offset."""
    with _opened(path_or_file, "w") as (_, file):
        writer = csv.writer(file, lineterminator="\n")
        writer.writerow((*PROBLEM_COLUMNS, "offset"))
        writer.writerows(
            (b.id, b.first, b.last + 1, b.size, o) for b, o in zip(buffers, offsets, strict=True)
        )


def load_buffers(path_or_file: PathOrFile) -> list[Buffer]:
    """Reads an `id,lower,upper,size` problem (a solution's `offset` column is ignored)."""
    source, header, lines = _read_lines(path_or_file, PROBLEM_COLUMNS, ("offset",))
    values = _plain_values(lines, len(header))
    if values is not None:  # every field a plain number: checked as whole columns
        ids, lower, upper, size = (values[:, header.index(c)] for c in PROBLEM_COLUMNS)
        if len(np.unique(ids)) == len(ids) and bool((upper > lower).all()):
            return [Buffer(*row) for row in zip(ids.tolist(), size.tolist(), lower.tolist(),
                                                (upper - 1).tolist(), strict=True)]
    rows = _numbers(source, header, lines)  # names the first bad field or row
    buffers: list[Buffer] = []
    seen: set[int] = set()
    for line, row in rows:
        if row["id"] in seen:
            raise PlanError(f"line {line}: buffer id {row['id']} appears twice", source)
        seen.add(row["id"])
        if row["upper"] <= row["lower"]:
            raise PlanError(
                f"line {line}: upper ({row['upper']}) must exceed lower ({row['lower']})", source
            )
        buffers.append(Buffer(row["id"], row["size"], row["lower"], row["upper"] - 1))
    return buffers


def load_offsets(path_or_file: PathOrFile, buffers: Sequence[Buffer]) -> dict[int, int]:
    """Reads a solution, `id,lower,upper,size,offset` (MiniMalloc's output) or `id,offset`, for
    exactly `buffers`; returns offset by buffer id.

    When the problem columns are present they must describe the same buffers, except that a
    size may be larger: a solution for padded sizes is also one for the real sizes.
    """
    source, rows = _read_table(
        path_or_file, required=("id", "offset"), optional=("lower", "upper", "size")
    )
    by_id = {b.id: b for b in buffers}
    offsets: dict[int, int] = {}
    for line, row in rows:
        buffer = by_id.get(row["id"])
        if buffer is None:
            raise PlanError(f"line {line}: no buffer with id {row['id']} in the problem", source)
        if buffer.id in offsets:
            raise PlanError(f"line {line}: buffer id {buffer.id} appears twice", source)
        mismatch = (
            row.get("lower", buffer.first) != buffer.first
            or row.get("upper", buffer.last + 1) != buffer.last + 1
            or row.get("size", buffer.size) < buffer.size
        )
        if mismatch:
            raise PlanError(
                f"line {line}: buffer {buffer.id} is lower={row.get('lower')} "
                f"upper={row.get('upper')} size={row.get('size')} in the solution but "
                f"lower={buffer.first} upper={buffer.last + 1} size={buffer.size} in the problem",
                source,
            )
        offsets[buffer.id] = row["offset"]
    missing = [b.id for b in buffers if b.id not in offsets]
    if missing:
        shown = ", ".join(map(str, missing[:_MISSING_SHOWN]))
        more = len(missing) - _MISSING_SHOWN
        rest = f" and {more} more" if more > 0 else ""
        raise PlanError(f"no offset for buffer id {shown}{rest}", source)
    return offsets


def _read_table(
    path_or_file: PathOrFile, required: Sequence[str], optional: Sequence[str]
) -> tuple[str, list[tuple[int, dict[str, int]]]]:
    """Returns the source's name and each data row as (line number, integer by column name)."""
    source, header, lines = _read_lines(path_or_file, required, optional)
    return source, _numbers(source, header, lines)


def _read_lines(
    path_or_file: PathOrFile, required: Sequence[str], optional: Sequence[str]
) -> tuple[str, list[str], list[tuple[int, list[str]]]]:
    """The source's name, its checked header, and each data row's (line number, fields)."""
    with _opened(path_or_file, "r") as (source, file):
        reader = csv.reader(file)
        try:
            lines = [(reader.line_num, fields) for fields in reader if fields]
        except (csv.Error, UnicodeDecodeError) as error:
            raise PlanError(f"not a readable CSV file: {error}", source) from None
    if not lines:
        raise PlanError(f"empty file; expected a header {','.join(required)}", source)
    header = [name.strip() for name in lines[0][1]]
    if len(set(header)) != len(header):
        raise PlanError(f"line 1: duplicate column in header {','.join(header)}", source)
    unknown = [name for name in header if name not in (*required, *optional)]
    missing = [name for name in required if name not in header]
    if unknown or missing:
        raise PlanError(
            f"line 1: header {','.join(header)} must have columns {','.join(required)}"
            + (f" and may have {','.join(optional)}" if optional else ""),
            source,
        )
    return source, header, lines[1:]


def _numbers(source: str, header: list[str], lines: list[tuple[int, list[str]]]
             ) -> list[tuple[int, dict[str, int]]]:
    """Each row as (line number, integer by column name), the first bad field named."""
    rows = []
    for n, fields in lines:
        if len(fields) != len(header):
            raise PlanError(
                f"line {n}: {len(fields)} fields, but the header has {len(header)}", source
            )
        row = {name: _number(text, name, n, source) for name, text in zip(header, fields,
                                                                          strict=True)}
        rows.append((n, row))
    return rows


def _plain_values(lines: list[tuple[int, list[str]]], columns: int) -> np.ndarray | None:
    """Every field at once, as a rows x columns array, when each row has `columns` fields of
    ASCII digits (spaces and tabs around them) below NUMBER_LIMIT: the files solvers write;
    None otherwise."""
    if any(len(fields) != columns for _, fields in lines):
        return None
    rows = [row for _, row in lines]
    if not _PLAIN_FIELDS.fullmatch(",".join(",".join(row) for row in rows)):
        return None
    try:
        values = np.array(rows, np.int64).reshape(-1, columns)
    except (ValueError, OverflowError):
        return None
    return None if values.size and int(values.max()) >= NUMBER_LIMIT else values


def _number(text: str, column: str, line: int, source: str) -> int:
    """A field as a plain decimal in [0, NUMBER_LIMIT); spaces around it are allowed."""
    plain = text.strip(" \t")
    if not _PLAIN_NUMBER.fullmatch(plain):
        raise PlanError(f"line {line}: {column} {_shown(text)!r} is not a whole number", source)
    digits = plain.lstrip("-").lstrip("0")
    if plain.startswith("-") and digits:
        raise PlanError(
            f"line {line}: {column} must not be negative, got {_shown(plain)}", source
        )
    # Counting digits first: int() refuses strings of thousands of them with a ValueError.
    if len(digits) > len(str(NUMBER_LIMIT)) or int(plain) >= NUMBER_LIMIT:
        raise PlanError(
            f"line {line}: {column} {_shown(plain)} is too large; the most allowed is 2^32 - 1",
            source,
        )
    return int(plain)


def _shown(text: str) -> str:
    """`text` cut short for a one-line message."""
    return text if len(text) <= 24 else text[:20] + "..."


@contextmanager
def _opened(path_or_file: PathOrFile, mode: str) -> Iterator[tuple[str, TextIO]]:
    """Yields (name for messages, text file); only files opened here are closed here."""
    if not isinstance(path_or_file, (str, os.PathLike)):
        yield getattr(path_or_file, "name", "<csv>"), path_or_file
        return
    source = os.fspath(path_or_file)
    if mode.startswith("r"):  # a regular file within the bound, never a device or a FIFO
        try:
            text = read_bounded(source).decode("utf-8")
        except ArenacError as error:
            raise PlanError(f"cannot open: {error.message}", source) from None
        except UnicodeDecodeError:
            raise PlanError("cannot open: not UTF-8 text", source) from None
        yield source, io.StringIO(text, newline="")
        return
    try:
        file = open(path_or_file, mode, newline="", encoding="utf-8")
    except OSError as error:
        raise PlanError(f"cannot open: {error.strerror}", source) from None
    with file:
        yield source, file
