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
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from toolchain.errors import ArenacError
from toolchain.files import read_bounded
from toolchain.planners import Pool

MEMORY_FILE_LIMIT = 1 << 20  # a few pools and pins: a larger file is not a description
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20}
SIZE = re.compile(r"(\d+)([KM]?)(?:i?B)?", re.I)
POOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
SECTION = re.compile(r"[.A-Za-z_][.A-Za-z0-9_$]{0,63}")


@dataclass(frozen=True)
class Memory:
    """Pools fastest first, and pins: tensor index or name (or "state") -> pool name."""

    pools: tuple[Pool, ...] = ()
    pins: tuple[tuple[str, str], ...] = ()


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
        if not isinstance(data, dict) or not isinstance(data.get("pools"), list):
            raise ValueError("expected a list of pools under 'pools'")
        pools = []
        for entry in data["pools"]:
            if not isinstance(entry, dict) or set(entry) - {"name", "size", "section"}:
                raise ValueError("each pool has a name, a size and maybe a section, no more")
            pools.append(pool(str(entry.get("name", "")), entry.get("size", ""),
                              entry.get("section")))
        pins = data.get("pins", {})
        if not isinstance(pins, dict):
            raise ValueError("'pins' maps tensors (or state) to pool names")
        return Memory(tuple(pools), tuple((str(k), str(v)) for k, v in pins.items()))
    except ValueError as e:
        raise ArenacError(str(e), path) from None
