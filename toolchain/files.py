"""The user's files: read within a bound (a device or a pipe that never ends, or a header that
declares more than the file holds, is refused before anything large is allocated), and output
files written whole or not at all (a failed run leaves no partial output behind)."""

from __future__ import annotations

import io
import math
import os
import shutil
import stat
import tempfile
import zipfile

import numpy as np

from toolchain.errors import ArenacError

USER_FILE_LIMIT = 512 << 20  # a data file, a CSV problem: as the models' default --max-bytes


def read_bounded(path: str, limit: int = USER_FILE_LIMIT) -> bytes:
    """A regular file's bytes, at most `limit` of them; anything else is one ArenacError.
    Devices, FIFOs and sockets are refused before they are opened (opening a FIFO blocks)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise ArenacError("no such file", path) from None
    except OSError as e:
        raise ArenacError(f"cannot read ({e.strerror})", path) from None
    if stat.S_ISDIR(info.st_mode):
        raise ArenacError("is a directory, not a file", path)
    if not stat.S_ISREG(info.st_mode):
        raise ArenacError("not a regular file (a device, a pipe or a socket)", path)
    too_large = ArenacError(f"file is larger than the limit of {limit} bytes", path)
    if info.st_size > limit:
        raise too_large
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ArenacError(f"cannot read ({e.strerror})", path) from None
    if len(data) > limit:  # it grew since the stat
        raise too_large
    return data


def load_arrays(path: str, limit: int = USER_FILE_LIMIT) -> np.ndarray | dict[str, np.ndarray]:
    """An .npy file's array, or an .npz archive's arrays by name. Every array's header is held
    against the bytes that follow it before numpy allocates what the header declares."""
    data = read_bounded(path, limit)
    if not (path.lower().endswith(".npz") or zipfile.is_zipfile(io.BytesIO(data))):
        return _npy_array(data, path)
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
            if sum(m.file_size for m in members) > limit:
                raise ArenacError(f"archive unpacks to more than the limit of {limit} bytes",
                                  path)
            return {m.filename.removesuffix(".npy"): _npy_array(archive.read(m),
                                                                f"{path}[{m.filename}]")
                    for m in members}
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
        raise ArenacError(f"not a readable .npz archive ({_first_line(e)})", path) from None


def _npy_array(data: bytes, where: str) -> np.ndarray:
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read_header(stream)
    except Exception as e:  # numpy's header parser fails in many ways on corrupt bytes
        # (ValueError, EOFError, SyntaxError, tokenize's TokenError, UnicodeDecodeError...)
        raise ArenacError(f"not a readable .npy array ({_first_line(e)})", where) from None
    if dtype.hasobject:
        raise ArenacError("holds Python objects (pickles), not numbers", where)
    declared = math.prod(shape) * dtype.itemsize
    held = len(data) - stream.tell()
    if declared != held:
        raise ArenacError(f"header declares {list(shape)} of {dtype} ({declared} bytes), but "
                          f"{held} bytes follow it", where)
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as e:  # as above: a header that parsed can still describe nonsense
        raise ArenacError(f"not a readable .npy array ({_first_line(e)})", where) from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


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
