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
from pathlib import Path


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
