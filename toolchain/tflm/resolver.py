"""The operators TensorFlow Lite Micro's op resolver registers (resolver.txt, with its source):
what the support matrix and `arenac inspect --ops` set beside the registry, and a test holds
the registry to."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files


@dataclass(frozen=True)
class ResolverEntry:
    """One Add method of MicroMutableOpResolver and the operator it registers."""

    method: str
    operator: str  # the builtin's name, or the custom op's code
    custom: bool


@cache
def tflm_operators() -> tuple[ResolverEntry, ...]:
    text = files("toolchain.tflm").joinpath("resolver.txt").read_text(encoding="utf-8")
    entries = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            method, operator, kind = line.split()
            entries.append(ResolverEntry(method, operator, kind == "custom"))
    return tuple(entries)
