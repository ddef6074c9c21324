"""The compiled C backend: generated files built with the system `cc` and run on raw bytes.

The host harness reads input sets from stdin and writes outputs to stdout, so one process
serves every input set of a check.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

import numpy as np

from toolchain.codegen import generate
from toolchain.errors import RuntimeBackendError
from toolchain.ir import Graph
from toolchain.plan import ModelPlan

STRICT_FLAGS = ("-std=c99", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-Werror")
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g")


def compiler() -> str:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise RuntimeBackendError(f"no C compiler: {cc!r} is not on PATH")
    return cc


def write_files(files: dict[str, str], directory: str) -> None:
    for name, text in files.items():
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)


def compile_files(directory: str, name: str, extra_flags: Sequence[str] = ()) -> str:
    """Build NAME.c with its harness NAME_main.c; returns the executable's path."""
    binary = os.path.join(directory, name)
    command = [
        compiler(),
        *STRICT_FLAGS,
        *extra_flags,
        f"{name}.c",
        f"{name}_main.c",
        "-lm",
        "-o",
        binary,
    ]
    result = subprocess.run(command, cwd=directory, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeBackendError(f"generated C does not compile: {first_error(result.stderr)}")
    return binary


def first_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "error" in line] or stderr.splitlines()
    return lines[0].strip() if lines else "unknown compiler failure"


def split_outputs(raw: bytes, graph: Graph, sets: int) -> list[list[np.ndarray]]:
    """Raw output bytes, set after set and output after output, as arrays per set."""
    tensors = [graph.tensors[t] for t in graph.outputs]
    outputs, position = [], 0
    for _ in range(sets):
        values = []
        for t in tensors:
            values.append(np.frombuffer(raw, np.dtype(t.dtype), t.num_elements, position)
                          .reshape(t.shape).copy())
            position += t.nbytes
        outputs.append(values)
    return outputs


class CBackend:
    """Generate, compile and run the C for a plan; `invoke` matches runtime_py's signature."""

    name = "c"

    def __init__(self, model_plan: ModelPlan, sanitize: bool = False, name: str = "model"):
        self.graph = model_plan.graph
        self.directory = tempfile.mkdtemp(prefix="arenac-c-")
        files = generate(model_plan, name)
        write_files(files, self.directory)
        self.binary = compile_files(self.directory, name, SANITIZE_FLAGS if sanitize else ())

    def invoke_many(self, input_sets: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
        """Run every input set in one process; outputs per set."""
        stdin = b"".join(np.ascontiguousarray(v).tobytes() for values in input_sets for v in values)
        result = subprocess.run([self.binary], input=stdin, capture_output=True, timeout=600)
        if result.returncode != 0:
            message = result.stderr.decode(errors="replace").strip().splitlines()
            raise RuntimeBackendError(
                f"compiled model failed (exit {result.returncode}): "
                f"{message[0] if message else 'no message'}"
            )
        expected = len(input_sets) * sum(self.graph.tensors[t].nbytes for t in self.graph.outputs)
        if len(result.stdout) != expected:
            raise RuntimeBackendError(
                f"compiled model wrote {len(result.stdout)} bytes, expected {expected}")
        return split_outputs(result.stdout, self.graph, len(input_sets))

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.invoke_many([inputs])[0]

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> CBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
