"""Writing output files whole or not at all: a failed run leaves no partial output behind."""

from __future__ import annotations

import os
import tempfile

from toolchain.errors import ArenacError


def write_atomic(path: str, data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename it over `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".arenac-", suffix=".tmp")
    except OSError as e:
        raise ArenacError(f"cannot write ({e.strerror})", path) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException as e:
        os.unlink(tmp)
        if isinstance(e, OSError):
            raise ArenacError(f"cannot write ({e.strerror})", path) from None
        raise


def _mode_for(path: str) -> int:
    """Keep an existing file's permissions; a new file gets what open() would give it."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask
