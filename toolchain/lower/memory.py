"""A device's memory as the user describes it: pools (`--pool NAME:SIZE[:SECTION]`, fastest
first) and pins (`--pin TENSOR=POOL`), or the same in a small TOML or JSON file:

    [[pools]]                      {"pools": [{"name": "dtcm", "size": "64K",
    name = "dtcm"                              "section": ".dtcm"},
    size = "64K"                             {"name": "sram", "size": 262144}],
    section = ".dtcm"               "pins": {"state": "dtcm"}}
    [[pools]]
    name = "sram"
    size = 262144
    [pins]
    state = "dtcm"

A file may also describe a part for `arenac project` (then it may have no pools): its core's
target and where its flash and its main RAM lie,

    [part]
    name = "my-board"
    target = "cortex-m4"
    flash = { origin = 0x08000000, size = "1M" }
    ram = { origin = 0x20000000, size = "128K" }
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from toolchain.errors import ArenacError
from toolchain.files import read_bounded
from toolchain.planners import Pool
from toolchain.targets import Part, Region

MEMORY_FILE_LIMIT = 1 << 20  # a few pools and pins: a larger file is not a description
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20}
SIZE = re.compile(r"(\d+)([KM]?)(?:i?B)?", re.I)
POOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
SECTION = re.compile(r"[.A-Za-z_][.A-Za-z0-9_$]{0,63}")
PART_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


@dataclass(frozen=True)
class Memory:
    """Pools fastest first, and pins: tensor index or name (or "state") -> pool name."""

    pools: tuple[Pool, ...] = ()
    pins: tuple[tuple[str, str], ...] = ()
    part: Part | None = None  # the board a firmware project is written for


def size_bytes(text: str | int) -> int:
    """"64K", "8M", "4096" or a number -> bytes (K = 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = SIZE.fullmatch(str(text).strip())
        if not match:
            raise ValueError(f"size {text!r} is not a whole number of bytes, K or M")
        value = int(match[1]) * UNITS[match[2].upper()]
    if not 0 < value < 2**32:
        raise ValueError(f"size {text!r} must be from 1 byte to 4 GiB")
    return value


def pool(name: str, size: str | int, section: str | None = None) -> Pool:
    """A checked pool: its name becomes part of C identifiers, its section a string literal."""
    if not POOL_NAME.fullmatch(name):
        raise ValueError(f"pool name {name!r} must be a letter then letters, digits or _")
    if section is not None and not (isinstance(section, str) and SECTION.fullmatch(section)):
        raise ValueError(f"section {section!r} must be a linker section name such as .dtcm")
    return Pool(name, size_bytes(size), section)


def parse_pool(text: str) -> Pool:
    """NAME:SIZE[:SECTION]."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"expected NAME:SIZE[:SECTION], got {text!r}")
    return pool(*parts)


def parse_pin(text: str) -> tuple[str, str]:
    """TENSOR=POOL, the tensor by index or name (or `state`)."""
    key, sep, name = text.rpartition("=")
    if not sep or not key or not name:
        raise ValueError(f"expected TENSOR=POOL, got {text!r}")
    return key, name


def part_of(entry: object) -> Part:
    """A checked [part]: a name, a Cortex-M target, and flash and RAM regions that fit in the
    32-bit address space without meeting."""
    from toolchain.targets import TARGETS

    if not isinstance(entry, dict) or set(entry) != {"name", "target", "flash", "ram"}:
        raise ValueError("a [part] has a name, a target, a flash and a ram, no more")
    name, target = entry["name"], entry["target"]
    if not isinstance(name, str) or not PART_NAME.fullmatch(name):
        raise ValueError(f"part name {name!r} must be letters, digits, - and _")
    if target not in TARGETS or TARGETS[target].board is None:
        raise ValueError(f"part target {target!r} must be a Cortex-M target: "
                         f"{', '.join(t for t in TARGETS if TARGETS[t].board)}")
    regions = [region(what, entry[what]) for what in ("flash", "ram")]
    flash, ram = regions
    if flash.origin < ram.origin + ram.length and ram.origin < flash.origin + flash.length:
        raise ValueError("the part's flash and ram overlap")
    return Part(name, target, flash, ram)


def region(what: str, entry: object) -> Region:
    if not isinstance(entry, dict) or set(entry) != {"origin", "size"}:
        raise ValueError(f"the part's {what} is {{ origin = ADDRESS, size = SIZE }}")
    origin, size = entry["origin"], size_bytes(entry["size"])
    if isinstance(origin, bool) or not isinstance(origin, int) or origin % 4 \
            or not 0 <= origin < 2**32 - size:
        raise ValueError(f"the part's {what} origin {origin!r} must be a word-aligned address "
                         "with its size below 4 GiB")
    return Region(what, origin, size)


def toml(text: str, path: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise ArenacError("reading TOML needs Python 3.11 or later; write the description as "
                          "JSON (a .json file)", path) from None
    return tomllib.loads(text)


def load_memory(path: str) -> Memory:
    """A memory description: TOML, or JSON when the file name ends in .json."""
    raw = read_bounded(path, MEMORY_FILE_LIMIT)
    try:
        data = json.loads(raw) if path.lower().endswith(".json") else toml(raw.decode(), path)
    except (ValueError, UnicodeDecodeError) as e:
        raise ArenacError(f"not a readable memory description ({str(e).splitlines()[0]})",
                          path) from None
    except RecursionError:
        raise ArenacError("not a readable memory description (nested too deeply)",
                          path) from None
    try:
        if not isinstance(data, dict) or not isinstance(data.get("pools", []), list) \
                or "pools" not in data and "part" not in data:
            raise ValueError("expected a list of pools under 'pools', or a [part]")
        if set(data) - {"pools", "pins", "part"}:
            raise ValueError("a description has pools, pins and a part, no more")
        pools = []
        for entry in data.get("pools", []):
            if not isinstance(entry, dict) or set(entry) - {"name", "size", "section"}:
                raise ValueError("each pool has a name, a size and maybe a section, no more")
            pools.append(pool(str(entry.get("name", "")), entry.get("size", ""),
                              entry.get("section")))
        pins = data.get("pins", {})
        if not isinstance(pins, dict):
            raise ValueError("'pins' maps tensors (or state) to pool names")
        return Memory(tuple(pools), tuple((str(k), str(v)) for k, v in pins.items()),
                      part_of(data["part"]) if "part" in data else None)
    except ValueError as e:
        raise ArenacError(str(e), path) from None
