"""The planners' C, built once with the system `cc` into the user's cache and loaded with
ctypes: the canonical search (canonical.c), the greedy loop (greedy.c) and the canonical dive
(skyline.c). Without a compiler, or with ARENAC_PURE_PYTHON set, each planner runs its Python
path instead (the dive has none: the exact planner then starts from the other heuristics)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from toolchain.planners.base import Buffer

I64 = ctypes.POINTER(ctypes.c_int64)


def build(source: Path) -> ctypes.CDLL | None:
    """`source` built once with the system `cc` into the user's cache, and loaded; None
    without a compiler, with ARENAC_PURE_PYTHON set, or when the build fails."""
    if os.environ.get("ARENAC_PURE_PYTHON"):
        return None
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        return None
    text = source.read_bytes()
    cache_dir = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "arenac"
    library = cache_dir / f"{source.stem}-{hashlib.sha256(text).hexdigest()[:16]}.so"
    try:
        if not library.exists():
            cache_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache_dir) as workdir:
                built = Path(workdir) / library.name
                command = [compiler, "-O2", "-std=c99", "-shared", "-fPIC", str(source)]
                subprocess.run(
                    [*command, "-o", str(built)],
                    check=True,
                    capture_output=True,
                )
                os.replace(built, library)  # atomic: a concurrent build only wins the race
        return ctypes.CDLL(str(library))
    except (OSError, subprocess.CalledProcessError):
        return None


def entry_point(source: Path, name: str, argtypes: list[object]) -> ctypes.CDLL | None:
    """`build(source)` with its function `name` declared: int64 result, `argtypes` arguments
    (ctypes converts each)."""
    core = build(source)
    if core is not None:
        function = getattr(core, name)
        function.restype = ctypes.c_int64
        function.argtypes = argtypes
    return core


def pointer(array: np.ndarray) -> object:
    """An int64 array as the C loops take it."""
    return array.ctypes.data_as(I64)


def ranked_lives(buffers: Sequence[Buffer]) -> tuple[np.ndarray, np.ndarray]:
    """Firsts and lasts as ranks among every first and last: lives meet exactly when they did,
    and a loop's view of time spans as many ranks as there are buffers, not the ops between the
    earliest and the latest (two buffers 2e9 ops apart took gigabytes)."""
    ends = np.array([(b.first, b.last) for b in buffers], dtype=np.int64).reshape(-1, 2)
    times = np.unique(ends)
    ranks = np.searchsorted(times, ends)
    return ranks[:, 0].copy(), ranks[:, 1].copy()
