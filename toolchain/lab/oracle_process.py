"""The oracle in a child process: a model file is untrusted input to C++ that was not written
for it. TFLite Micro reads the flatbuffer without a verifier and trusts offsets in it, and both
interpreters abort on states they do not expect; run in arenac's process, such a model would
kill arenac with SIGABRT and no message.

`run_oracle` runs each interpreter it tries in a child process, under a time limit and an
address-space limit, and sends it the model and every input set in one round trip. LiteRT's
reference kernels answer unless LiteRT refuses the model (per-channel quantized_dimension 3 on
depthwise filters, as in person_detect); then TFLM stands in. A crash, a timeout or a refusal
by both becomes one RuntimeBackendError naming the model file, and whatever the interpreters
print goes to a log file that only the error's wording reads.

The children are forks of a multiprocessing fork server that has imported numpy and the
interpreters once, so a check pays milliseconds for its child rather than a fresh Python's
imports (the suite runs over a thousand checks). Each child serves one request and exits.

Both directions are byte messages of .npy records (np.save's format; pickles are refused,
so nothing the child sends is executed). The request: a JSON header, the model's bytes, then
each input set's arrays. The answer: a JSON header - {"name": ...} on success, {"refused":
reason} when the interpreter would not load the model, {"failed": reason} when it failed
later - then, per input set, the outputs followed by the intermediate tensors asked for.
"""

from __future__ import annotations

import io
import json
import math
import multiprocessing
import multiprocessing.util
import os
import re
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import reduction
from typing import BinaryIO

import numpy as np

from toolchain.errors import RuntimeBackendError
from toolchain.lab.oracle import (
    TFLM_MODULE,
    LiteRTOracle,
    TFLMOracle,
    installed,
    tflm_missing,
)

ORACLE_TIMEOUT = 120.0  # seconds for one child: loading the model and every input set
MEMORY_BUDGET = 4 << 30  # bytes of address space a child may map, plus MEMORY_PER_BYTE per
MEMORY_PER_BYTE = 8  # byte of the request (model and inputs), beyond what it starts with
REASON_LENGTH = 100  # characters of an interpreter's reason kept in an error line
SUN_PATH_MAX = 104 if sys.platform == "darwin" else 108  # bytes of an AF_UNIX path, NUL included
SOCKET_NAME_LENGTH = len("/pymp-XXXXXXXX/listener-XXXXXXXX")  # what the fork server adds
SHORT_TEMP_FOLDERS = ("/tmp", "/var/tmp", "/usr/tmp")

INTERPRETERS = {"litert-ref": "LiteRT", "tflm": "the TFLite Micro interpreter"}
# imported once by the fork server; a package that is not installed is skipped
PRELOAD = (
    "toolchain.lab.oracle_process",
    # what LiteRTOracle reads a model with to find outputs its kernels leave partly unwritten
    "toolchain.front.reader",
    "toolchain.ops",
    "ai_edge_litert.interpreter",
    "tflite_runtime.interpreter",
    "tflite_micro.python.tflite_micro.runtime",
)


@dataclass(frozen=True)
class OracleRun:
    """What the oracle computed: outputs per input set and the requested tensors per set."""

    name: str
    outputs: list[list[np.ndarray]]
    tensors: list[dict[int, np.ndarray]]


class Refused(Exception):
    """The interpreter would not load the model; another one may stand in."""


def run_oracle(
    model_bytes: bytes,
    input_sets: Sequence[Sequence[np.ndarray]],
    output_count: int,
    source: str | None = None,
    tensors: Sequence[int] = (),
    timeout: float = ORACLE_TIMEOUT,
    sequence: int | None = None,
) -> OracleRun:
    """LiteRT's reference kernels on every input set, or TFLM when LiteRT refuses the model.

    The interpreter keeps the model's state from one set to the next; with `sequence`, a fresh
    interpreter (the state a reset returns to) takes sets `sequence`, 2 * `sequence`, ...
    Intermediate `tensors` need LiteRT: TFLM reuses their memory and cannot return them.
    """
    try:
        return run_in_child("litert-ref", model_bytes, input_sets, output_count, source,
                            tensors, timeout, sequence)
    except Refused as litert:
        if tensors:
            raise RuntimeBackendError(
                f"per-layer comparison needs LiteRT's interpreter, which refuses the model "
                f"({short(str(litert))})",
                source,
            ) from None
        litert_reason = str(litert)
        if not installed(TFLM_MODULE):
            raise RuntimeBackendError(
                tflm_missing(f"LiteRT refuses the model ({short(litert_reason)}); checking it"),
                source,
            ) from None
    try:
        return run_in_child("tflm", model_bytes, input_sets, output_count, source, (), timeout,
                            sequence)
    except Refused as tflm:
        raise RuntimeBackendError(
            f"no oracle accepts the model (LiteRT: {short(litert_reason)}; "
            f"TFLite Micro: {short(str(tflm))})",
            source,
        ) from None


def run_in_child(
    oracle: str,
    model_bytes: bytes,
    input_sets: Sequence[Sequence[np.ndarray]],
    output_count: int,
    source: str | None,
    tensors: Sequence[int],
    timeout: float,
    sequence: int | None = None,
) -> OracleRun:
    """One interpreter in one child process; raises Refused when it will not load the model."""
    arrays = [np.frombuffer(model_bytes, np.uint8)]
    arrays += [np.asarray(v) for values in input_sets for v in values]
    budget = MEMORY_BUDGET + MEMORY_PER_BYTE * sum(a.nbytes for a in arrays)
    request = io.BytesIO()
    write_json(request, {
        "oracle": oracle,
        "output_count": output_count,
        "inputs": [len(values) for values in input_sets],
        "tensors": [int(t) for t in tensors],
        "sequence": int(sequence or 0),
        "memory_budget": budget,
        "cpu_seconds": cpu_budget(timeout),
    })
    for array in arrays:
        write_array(request, array)
    who = INTERPRETERS[oracle]
    context = forkserver()
    # the log has no name from the start: however this process ends (killed included),
    # nothing stays behind; the child gets its descriptor through the pipe
    log = tempfile.TemporaryFile(prefix="arenac-oracle-", suffix=".log")
    ours, theirs = context.Pipe()
    child = context.Process(target=serve, args=(theirs,), daemon=True)
    try:
        deadline = time.monotonic() + timeout
        child.start()
        theirs.close()
        with ours:
            reduction.send_handle(ours, log.fileno(), child.pid)
            answer = exchange(ours, request.getbuffer(), deadline)
        child.join(max(0.0, deadline - time.monotonic()))
        if child.exitcode is None:
            raise RuntimeBackendError(f"{who} timed out after {timeout:g} s", source)
        if child.exitcode or answer is None:
            log.seek(0)
            raise RuntimeBackendError(died(who, child.exitcode, log.read(), budget), source)
    finally:
        if child.is_alive():  # timed out, or this process was interrupted
            child.kill()
            child.join()
        log.close()
    return read_answer(who, io.BytesIO(answer), len(input_sets), output_count, tensors, source)


def forkserver() -> multiprocessing.context.BaseContext:
    """The multiprocessing context whose server process has imported numpy and the
    interpreters once: each child is a fresh fork of it, isolated and quick to start."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    short_socket_folder()
    return context


def short_socket_folder() -> None:
    """Make multiprocessing's folder one whose fork-server socket path fits AF_UNIX.

    The server listens on <temp folder>/pymp-XXXXXXXX/listener-XXXXXXXX; with a long TMPDIR
    (a test's, a build system's) the path passes the kernel's limit and the server cannot
    start. The folder is made once per process, so it is made here, under the system's
    temporary folder when TMPDIR's would be too long (what Python 3.13 does itself).
    """
    base = tempfile.gettempdir()
    if len(base) + SOCKET_NAME_LENGTH < SUN_PATH_MAX:
        return
    short = next((f for f in SHORT_TEMP_FOLDERS if os.path.isdir(f) and os.access(f, os.W_OK)),
                 None)
    if short is None:
        return  # nowhere shorter to go: the server's own error will say why
    saved = tempfile.tempdir
    tempfile.tempdir = short
    try:
        multiprocessing.util.get_temp_dir()
    finally:
        tempfile.tempdir = saved


def exchange(connection, request: memoryview, deadline: float) -> bytes | None:
    """Send the request and wait for the answer; None when the child died or ran out of time
    first (its exit status then says which)."""
    try:
        connection.send_bytes(request)
        if connection.poll(max(0.0, deadline - time.monotonic())):
            return connection.recv_bytes()
    except (EOFError, OSError):
        pass
    return None


def died(who: str, status: int, log: bytes, budget: int) -> str:
    """Why the child ended without a valid answer, from its exit status and its last words."""
    said = log.decode(errors="replace")
    if "bad_alloc" in said or "MemoryError" in said:
        return f"{who} ran out of memory on this model (budget {budget / 2**30:.1f} GiB)"
    if status == -signal.SIGXCPU:
        return f"{who} used up its processor time on this model"
    if status < 0:
        number = -status
        try:
            name = f", {signal.Signals(number).name}"
        except ValueError:
            name = ""
        return f"{who} crashed on this model (signal {number}{name})"
    lines = said.strip().splitlines()
    return f"{who} failed (exit status {status}){': ' + short(lines[-1]) if lines else ''}"


def read_answer(
    who: str,
    stream: BinaryIO,
    sets: int,
    output_count: int,
    tensors: Sequence[int],
    source: str | None,
) -> OracleRun:
    """The child's answer; raises Refused, or RuntimeBackendError when it failed or is cut."""
    try:
        header = read_json(stream)
        if "refused" in header:
            raise Refused(header["refused"])
        if "failed" in header:
            raise RuntimeBackendError(f"{who} failed on this model: {short(header['failed'])}",
                                      source)
        outputs, wanted = [], []
        ended = set(header.get("ended", ()))
        for k in range(sets):
            if k in ended:
                outputs.append([])
                wanted.append({})
                continue
            outputs.append([read_array(stream) for _ in range(output_count)])
            wanted.append({t: read_array(stream) for t in tensors})
        return OracleRun(str(header["name"]), outputs, wanted)
    except (ValueError, EOFError, KeyError, TypeError):
        raise RuntimeBackendError(f"{who} gave an incomplete answer", source) from None


def short(reason: str) -> str:
    """An interpreter's reason cut to its first message and REASON_LENGTH characters.

    LiteRT joins one message per offending tensor without a separator ("... Was 3.Tensor 33
    has ..."), so its first message ends at a full stop followed directly by a capital.
    """
    lines = reason.strip().splitlines() or ["no reason given"]
    first = re.split(r"(?<=\.)(?=[A-Z])", lines[0].strip(), maxsplit=1)[0]
    return first if len(first) <= REASON_LENGTH else first[: REASON_LENGTH - 3] + "..."


# --- the stream format ---------------------------------------------------------------------
def read_json(stream: BinaryIO) -> dict:
    value = json.loads(read_array(stream).tobytes().decode())
    if not isinstance(value, dict):
        raise ValueError("the header is not a JSON object")
    return value


def read_array(stream: BinaryIO) -> np.ndarray:
    return np.lib.format.read_array(stream, allow_pickle=False)


def write_json(stream: BinaryIO, value: dict) -> None:
    write_array(stream, np.frombuffer(json.dumps(value).encode(), np.uint8))


def write_array(stream: BinaryIO, value: np.ndarray) -> None:
    np.lib.format.write_array(stream, np.asarray(value, order="C"), allow_pickle=False)


# --- the child -----------------------------------------------------------------------------
def serve(connection) -> None:
    """The child: the fork server's stdout and stderr are the user's, so the interpreters'
    chatter goes to the log (its descriptor the first message) first; then one request, one
    answer."""
    log = reduction.recv_handle(connection)
    os.dup2(log, 1)
    os.dup2(log, 2)
    header, arrays = answer(io.BytesIO(connection.recv_bytes()))
    reply = io.BytesIO()
    write_json(reply, header)
    for array in arrays:
        write_array(reply, array)
    connection.send_bytes(reply.getbuffer())


def cpu_budget(timeout: float) -> int:
    """The processor seconds a child may use: twice its wall-clock timeout (an interpreter may
    run threads), so that a child whose parent was killed before it could time it out (the
    fork server outlives the parent) is ended by the kernel rather than left spinning."""
    return math.ceil(2 * timeout) + 1


def limit_cpu(seconds: int) -> None:
    """SIGXCPU, which ends the process, once it has used `seconds` of processor time."""
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        soft = seconds if hard == resource.RLIM_INFINITY else min(seconds, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ValueError, OSError):
        pass


def limit_memory(budget: int) -> None:
    """Cap the address space at `budget` beyond what is mapped now, where the OS enforces
    RLIMIT_AS (Linux does, macOS does not)."""
    try:
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        mapped = 0
    try:
        resource.setrlimit(resource.RLIMIT_AS, (mapped + budget, mapped + budget))
    except (ValueError, OSError):
        pass


def answer(stream: BinaryIO) -> tuple[dict, list[np.ndarray]]:
    """The answer's header and the arrays that follow it, for the request on `stream`."""
    request = read_json(stream)
    limit_memory(request["memory_budget"])
    limit_cpu(request["cpu_seconds"])
    model = read_array(stream).tobytes()
    input_sets = [[read_array(stream) for _ in range(n)] for n in request["inputs"]]
    def load():
        if request["oracle"] == "tflm":
            return TFLMOracle(model, request["output_count"])
        return LiteRTOracle(model, preserve_all_tensors=bool(request["tensors"]))

    try:
        oracle = load()
    except MemoryError:
        raise  # not a refusal: the parent reports the memory budget
    except Exception as e:  # LiteRT raises ValueError or RuntimeError, TFLM anything
        return {"refused": first_line(e)}, []
    arrays: list[np.ndarray] = []
    ended = []  # the sets whose invoke a kernel ended early: no outputs
    sequence = request.get("sequence", 0)
    try:
        for i, values in enumerate(input_sets):
            if sequence and i and i % sequence == 0:
                oracle = load()  # a reset: the state of a freshly loaded model
            outputs = oracle.invoke(values)
            if not outputs:
                ended.append(i)
                continue
            arrays += outputs
            arrays += [oracle.tensor(t) for t in request["tensors"]]
    except MemoryError:
        raise
    except Exception as e:
        return {"failed": f"{type(e).__name__}: {first_line(e)}"}, []
    return {"name": oracle.name, "ended": ended}, arrays


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
