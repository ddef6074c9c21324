"""Writing output files whole or not at all: a failed run leaves no partial output behind."""

from __future__ import annotations

import os
import shutil
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
        return 0o666 & ~_umask()


def write_files_atomic(directory: str, files: dict[str, str]) -> list[str]:
    """Write a set of files (name -> text) into `directory`, all of them or none: a failure
    leaves neither a partial set nor a half-made directory behind. Other files already in
    `directory` stay; a generated file replaces one of the same name. Returns the paths."""
    paths = [os.path.join(directory, name) for name in files]
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            raise ArenacError("cannot write (a directory of that name is in the way)", path)
    try:
        if os.path.isdir(directory):
            _replace_into(directory, files)
        else:
            _create_with(directory, files)
    except OSError as e:
        raise ArenacError(f"cannot write ({e.strerror})", directory) from None
    return paths


def _create_with(directory: str, files: dict[str, str]) -> None:
    """A new directory (and any missing parents) appears in one rename: everything is built
    in a staging folder beside the first missing ancestor, then renamed to it."""
    top = os.path.abspath(directory)
    while not os.path.isdir(os.path.dirname(top)):
        top = os.path.dirname(top)
    staging = tempfile.mkdtemp(dir=os.path.dirname(top), prefix=".arenac-")
    try:
        inner = os.path.join(staging, os.path.relpath(os.path.abspath(directory), top))
        os.makedirs(inner, exist_ok=True)
        _write_all(inner, files, {})
        os.chmod(staging, 0o777 & ~_umask())
        os.rename(staging, top)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _replace_into(directory: str, files: dict[str, str]) -> None:
    """Into an existing directory: the new files are written in a staging folder inside it
    (so renames stay on one file system), then renamed over their targets; if one rename
    fails, the files already moved are taken back and the previous ones restored."""
    staging = tempfile.mkdtemp(dir=directory, prefix=".arenac-")
    previous = os.path.join(staging, ".previous")
    moved: list[str] = []
    unrestored = False  # then the staging folder stays: it holds what could not be put back
    try:
        os.mkdir(previous)
        _write_all(staging, files, {n: os.path.join(directory, n) for n in files})
        for name in files:
            target = os.path.join(directory, name)
            if os.path.lexists(target):
                os.replace(target, os.path.join(previous, name))
            moved.append(name)
            os.replace(os.path.join(staging, name), target)
    except BaseException:
        unrestored = not _restore(directory, previous, moved)
        raise
    finally:
        if not unrestored:
            shutil.rmtree(staging, ignore_errors=True)


def _restore(directory: str, previous: str, moved: list[str]) -> bool:
    """Undo the renames of `moved`, last first; False if some previous file stayed behind."""
    complete = True
    for name in reversed(moved):
        target, old = os.path.join(directory, name), os.path.join(previous, name)
        try:
            if os.path.lexists(old):
                os.replace(old, target)
            elif os.path.lexists(target):
                os.unlink(target)
        except OSError:
            complete = False
    return complete


def _write_all(folder: str, files: dict[str, str], targets: dict[str, str]) -> None:
    """Each file in `folder`, with the permissions of the file it will replace, if any."""
    for name, text in files.items():
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(text.encode())
        if name in targets:
            os.chmod(path, _mode_for(targets[name]))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
