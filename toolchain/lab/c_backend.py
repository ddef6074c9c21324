"""The compiled C backend: generated files built with the system `cc` and run on raw bytes.

The host harness reads input sets from stdin and writes outputs to stdout, so one process
serves every input set of a check; the model's state carries from one set to the next, and the
harness resets it every `sequence` sets when asked. One harness serves every model
(templates/c/host_harness.c.j2), compiled once per process and flag set; a model's build
compiles its own C with a short glue file that tells the harness its sizes, which saves about
two fifths of a small model's build. `compile_files` builds the NAME_main.c that `gen` writes
for firmware engineers instead.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

import numpy as np

from toolchain.c.generate import generate, stream_values, traced_tensors
from toolchain.errors import RuntimeBackendError
from toolchain.ir import Graph
from toolchain.lower.plan import ModelPlan
from toolchain.ops.emit import WAITING_STATUS
from toolchain.progress import step
from toolchain.render import render
from toolchain.text import c_identifier

STRICT_FLAGS = ("-std=c99", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-Werror")
# float-cast-overflow is not part of `undefined`: a float out of an integer's range cast to it.
# Unoptimized: every access stays instrumented, nothing is folded away before it is checked, and
# GCC builds it 5-6x faster than at -O2 (vww_96_int8: 1.6 s against 9.1 s); the -O2 build is
# the plain one. -g1 keeps the line tables a report names lines with, and builds a tenth
# faster than -g.
SANITIZE_FLAGS = ("-O0", "-fsanitize=address,undefined,float-cast-overflow",
                  "-fno-sanitize-recover=all", "-g1")
COMPILE_TIMEOUT = 600.0  # seconds
RUN_TIMEOUT = 600.0  # seconds for one run of the compiled model (every input set)


def compiler(source: str | None = None) -> list[str]:
    """$CC as a command (it may carry a launcher or flags: "ccache cc"), default `cc`."""
    command = shlex.split(os.environ.get("CC", "cc")) or ["cc"]
    if shutil.which(command[0]) is None:
        raise RuntimeBackendError(f"no C compiler: {command[0]!r} is not on PATH", source)
    return command


def write_files(files: dict[str, str], directory: str) -> None:
    for name, text in files.items():
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)


def compile_files(
    directory: str, name: str, extra_flags: Sequence[str] = (), source: str | None = None
) -> str:
    """Build NAME.c with its harness NAME_main.c; returns the executable's path.

    One translation unit, NAME.c and then NAME_main.c (NAME_unity.c includes both in that
    order, so NAME.c still compiles on its own includes): one compiler process instead of two.
    The files also build separately, as a firmware builds them: the Make and CMake fragments'
    tests and the Cortex-M builds do.

    `source` names the model the C was generated from, for the error a failure raises.
    """
    return _build(directory, name, (f"{name}.c", f"{name}_main.c"), (), extra_flags, source)


def _build(directory: str, name: str, sources: Sequence[str], objects: Sequence[str],
           extra_flags: Sequence[str], source: str | None) -> str:
    """Link `sources` (compiled as one translation unit, NAME_unity.c, in their order) with
    `objects` into the executable NAME."""
    binary = os.path.join(directory, name)
    with open(os.path.join(directory, f"{name}_unity.c"), "w") as f:
        f.write("".join(f'#include "{file}"\n' for file in sources))
    command = compiler(source)
    _compile([*command, *STRICT_FLAGS, "-pipe", *extra_flags, *linker(command, extra_flags),
              f"{name}_unity.c", *objects, "-lm", "-o", binary], directory, source)
    return binary


def linker(command: Sequence[str], flags: Sequence[str]) -> tuple[str, ...]:
    """Gold, when it is installed, the compiler is GCC or Clang and no linker is chosen already:
    GNU ld takes about 2.5x as long to link against the sanitizer runtimes (44 ms against 18 ms
    for a small model, most of a sanitized build) and a quarter longer without them."""
    launched = command[1:] if command[0] == "ccache" and len(command) > 1 else command
    compiler_name = os.path.basename(launched[0])
    known = compiler_name == "cc" or compiler_name.startswith(("gcc", "clang"))
    chosen = any(flag.startswith("-fuse-ld=") for flag in flags)
    return ("-fuse-ld=gold",) if known and not chosen and shutil.which("ld.gold") else ()


def _compile(command: list[str], directory: str, source: str | None) -> None:
    try:
        result = subprocess.run(
            command, cwd=directory, capture_output=True, text=True, timeout=COMPILE_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        raise RuntimeBackendError(
            f"the C compiler did not finish within {COMPILE_TIMEOUT:g} s", source
        ) from None
    if result.returncode != 0:
        raise RuntimeBackendError(
            f"generated C does not compile: {first_error(result.stderr)}", source
        )


# The host harness's object file per compiler command and flags, built at first use in a
# folder removed when the process exits.
_HARNESS_OBJECTS: dict[tuple[str, ...], str] = {}


def host_harness(extra_flags: Sequence[str], source: str | None = None) -> str:
    """The path of the host harness compiled with `extra_flags` (after arenac's own)."""
    command = (*compiler(source), *STRICT_FLAGS, "-pipe", *extra_flags)
    if command not in _HARNESS_OBJECTS:
        directory = tempfile.mkdtemp(prefix="arenac-harness-")
        atexit.register(shutil.rmtree, directory, True)
        write_files({"host_harness.c": render("c/host_harness.c.j2")}, directory)
        _compile([*command, "-c", "host_harness.c", "-o", "host_harness.o"], directory, source)
        _HARNESS_OBJECTS[command] = os.path.join(directory, "host_harness.o")
    return _HARNESS_OBJECTS[command]


def host_glue(mp: ModelPlan, name: str, trace: bool, waits: bool = False) -> str:
    """NAME_glue.c: the model's counts, sizes and functions under the names the host harness
    calls (and the rows of its streamed inputs); `waits`: its invoke may end early
    (OpSpec.stops)."""
    graph = mp.graph
    return render("c/host_glue.c.j2", name=name, trace=trace, **stream_values(mp, name),
                  waiting=WAITING_STATUS if waits else -1,
                  input_bytes=[graph.tensors[t].nbytes for t in graph.inputs],
                  output_bytes=[graph.tensors[t].nbytes for t in graph.outputs])


def first_error(stderr: str, otherwise: str = "unknown compiler failure") -> str:
    """The first line that says "error" (a compiler's, ASan's, UBSan's), else the first line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()] or lines
    return errors[0] if errors else otherwise


def split_outputs(raw: bytes, graph: Graph, sets: int) -> list[list[np.ndarray]]:
    """Raw output bytes, set after set and output after output, as arrays per set."""
    size = sum(graph.tensors[t].nbytes for t in graph.outputs)
    return [tensor_values(raw[k * size:(k + 1) * size], graph, graph.outputs)
            for k in range(sets)]


def waited_outputs(raw: bytes, graph: Graph, sets: int,
                   source: str | None) -> list[list[np.ndarray]]:
    """Raw output bytes of a model whose invoke may end early, each set's led by a byte that
    says whether it ran to the end: its outputs, or [] for one that ended early (as runtime_py
    gives)."""
    size = 1 + sum(graph.tensors[t].nbytes for t in graph.outputs)
    if len(raw) != sets * size:
        raise RuntimeBackendError(f"compiled model wrote {len(raw)} bytes, expected "
                                  f"{sets * size}", source)
    return [tensor_values(raw[k * size + 1:(k + 1) * size], graph, graph.outputs)
            if raw[k * size] else [] for k in range(sets)]


def input_set_bytes(graph: Graph, values: Sequence[np.ndarray], source: str | None) -> bytes:
    """One input set as a firmware reads it: each input's raw bytes in the model's order,
    checked against the model's inputs (their count, and each one's bytes)."""
    inputs = [graph.tensors[t] for t in graph.inputs]
    if len(values) != len(inputs):
        raise RuntimeBackendError(f"expected {len(inputs)} inputs, got {len(values)}", source)
    chunks = []
    for i, (t, v) in enumerate(zip(inputs, values, strict=True)):
        data = np.ascontiguousarray(v, dtype=np.dtype(t.dtype)).tobytes()
        if len(data) != t.nbytes:
            raise RuntimeBackendError(f"input {i}: expected {t.nbytes} bytes, got {len(data)}",
                                      source)
        chunks.append(data)
    return b"".join(chunks)


def tensor_values(raw: bytes, graph: Graph, tensors: Sequence[int]) -> list[np.ndarray]:
    """The raw bytes of `tensors`, one after the other, as arrays."""
    values, position = [], 0
    for t in (graph.tensors[t] for t in tensors):
        values.append(np.frombuffer(raw, np.dtype(t.dtype), t.num_elements, position)
                      .reshape(t.shape).copy())
        position += t.nbytes
    return values


class CBackend:
    """Generate, compile and run the C for a plan; `invoke` matches runtime_py's signature.
    `flags` go to the compiler after arenac's own (-O3 there overrides -O2).

    The build folder is removed by `close` (or leaving the `with` block), and by the
    constructor itself when generating or compiling fails.
    """

    name = "c"

    def __init__(self, model_plan: ModelPlan, sanitize: bool = False, name: str = "model",
                 trace: bool = False, flags: Sequence[str] = ()):
        self.graph = model_plan.graph
        self.source = model_plan.model.source
        # with `trace`, every set's output begins with these tensors' bytes
        self.traced = [t for _, t in traced_tensors(model_plan)] if trace else []
        self.tensors: list[dict[int, np.ndarray]] = []  # per set of the last run, with trace
        self.directory = tempfile.mkdtemp(prefix="arenac-c-")
        try:
            name = c_identifier(name)
            files = generate(model_plan, name, trace=trace)
            del files[f"{name}_main.c"]  # the host harness serves instead
            self.waits = model_plan.program.stops_early
            if self.waits and trace:
                raise RuntimeBackendError("per-layer tracing of a model whose invoke may end "
                                          "early (CIRCULAR_BUFFER) is not supported", self.source)
            files[f"{name}_glue.c"] = host_glue(model_plan, name, trace, self.waits)
            write_files(files, self.directory)
            all_flags = (*(SANITIZE_FLAGS if sanitize else ()), *flags)
            with step("compiling the C"):
                self.binary = _build(self.directory, name, (f"{name}.c", f"{name}_glue.c"),
                                     (host_harness(all_flags, self.source),), all_flags,
                                     self.source)
        except BaseException:
            self.close()
            raise

    def invoke_many(self, input_sets: Sequence[Sequence[np.ndarray]],
                    sequence: int | None = None) -> list[list[np.ndarray]]:
        """Run every input set in one process, in order; outputs per set. The model's state
        carries from set to set; with `sequence`, it is reset before sets `sequence`,
        2 * `sequence`, ... (the process starts from the initial state)."""
        stdin = b"".join(np.ascontiguousarray(v).tobytes() for values in input_sets for v in values)
        try:
            with step("running the C"):
                result = subprocess.run(
                    [self.binary, "1", str(sequence or 0)], input=stdin, capture_output=True,
                    timeout=RUN_TIMEOUT,
                )
        except subprocess.TimeoutExpired:
            raise RuntimeBackendError(
                f"compiled model did not finish within {RUN_TIMEOUT:g} s", self.source
            ) from None
        if result.returncode != 0:
            status = (
                f"signal {-result.returncode}" if result.returncode < 0
                else f"exit {result.returncode}"
            )
            said = first_error(result.stderr.decode(errors="replace"), "no message")
            raise RuntimeBackendError(f"compiled model failed ({status}): {said}", self.source)
        traced = sum(self.graph.tensors[t].nbytes for t in self.traced)
        outputs = sum(self.graph.tensors[t].nbytes for t in self.graph.outputs)
        if self.waits:
            return waited_outputs(result.stdout, self.graph, len(input_sets), self.source)
        expected = len(input_sets) * (traced + outputs)
        if len(result.stdout) != expected:
            raise RuntimeBackendError(
                f"compiled model wrote {len(result.stdout)} bytes, expected {expected}",
                self.source,
            )
        if not self.traced:
            return split_outputs(result.stdout, self.graph, len(input_sets))
        self.tensors, sets = [], []
        for k in range(len(input_sets)):
            raw = result.stdout[k * (traced + outputs):(k + 1) * (traced + outputs)]
            self.tensors.append(dict(zip(self.traced, tensor_values(raw, self.graph,
                                                                    self.traced), strict=True)))
            sets += split_outputs(raw[traced:], self.graph, 1)
        return sets

    def trace(self, inputs: Sequence[np.ndarray]) -> dict[int, np.ndarray]:
        """Every traced tensor's value in one invoke from the initial state (trace=True)."""
        self.invoke_many([inputs])
        return self.tensors[0]

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One invoke from the initial state."""
        return self.invoke_many([inputs])[0]

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> CBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
