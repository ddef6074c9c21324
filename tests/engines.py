"""Every engine `make bench` times on the host, timed the same way.

Each engine is one call that runs one inference on inputs set once beforehand, in this process:
the generated C loaded as a shared library (external I/O, so an invoke never overwrites its
inputs), LiteRT with its default kernels (XNNPACK) and with the reference ones, TFLite Micro's
interpreter, and runtime_py. No copies in or out are timed. `interleaved` runs them in rounds,
each engine once per round for about the same wall time, on one clock (perf_counter), and
reports per engine the median over the rounds with the fastest and slowest round, so load that
comes and goes is shared out instead of falling on whichever engine ran at the time.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from runtime_py.interpreter import ArenaInterpreter
from toolchain.c.generate import generate
from toolchain.lab.c_backend import STRICT_FLAGS, compiler, write_files
from toolchain.lower.plan import ModelPlan

Engine = Callable[[], object]
ROUNDS = 7
ROUND_SECONDS = 0.05  # wall time each engine gets per round
# The flags of `make bench`'s second C column: whatever this host's vector units can do.
NATIVE_FLAGS = ("-O3", "-march=native")


@dataclass(frozen=True)
class Timing:
    """Milliseconds per inference: the median round, and the fastest and slowest."""

    median: float
    low: float
    high: float

    def text(self) -> str:
        return f"{self.median:.4f} ({self.low:.4f}-{self.high:.4f})"


def interleaved(engines: dict[str, Engine], rounds: int = ROUNDS) -> dict[str, Timing]:
    """Times each engine in `rounds` interleaved rounds after a warm-up that also sets how
    many calls make a round of about ROUND_SECONDS for it."""
    calls = {}
    for name, run in engines.items():
        run()  # the first call may allocate or page in
        count, start = 0, time.perf_counter()
        while count < 3 or time.perf_counter() - start < ROUND_SECONDS / 5:
            run()
            count += 1
        per_call = (time.perf_counter() - start) / count
        calls[name] = max(1, round(ROUND_SECONDS / per_call))
    samples: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(rounds):
        for name, run in engines.items():
            n = calls[name]
            start = time.perf_counter()
            for _ in range(n):
                run()
            samples[name].append((time.perf_counter() - start) / n * 1000.0)
    return {name: Timing(statistics.median(s), min(s), max(s)) for name, s in samples.items()}


class CLibrary:
    """The generated C of a plan made with external I/O, built as a shared library and loaded
    with ctypes;
    `invoke` is its NAME_invoke on inputs filled once. A context manager: the build folder
    goes when it closes."""

    def __init__(self, mp: ModelPlan, inputs: Sequence[np.ndarray], flags: Sequence[str] = ()):
        self.directory = tempfile.mkdtemp(prefix="arenac-bench-")
        write_files(generate(mp, "model", external_io=True), self.directory)
        library = os.path.join(self.directory, "model.so")
        subprocess.run(
            [*compiler(), *STRICT_FLAGS, *flags, "-shared", "-fPIC", "model.c", "-lm",
             "-o", library],
            cwd=self.directory, check=True, capture_output=True,
        )
        self.library = ctypes.CDLL(library)
        graph = mp.graph
        self.inputs = [np.ascontiguousarray(v) for v in inputs]
        self.outputs = [np.zeros(graph.tensors[t].shape, graph.tensors[t].dtype)
                        for t in graph.outputs]
        self.input_pointers = (ctypes.c_void_p * len(self.inputs))(
            *(a.ctypes.data for a in self.inputs))
        self.output_pointers = (ctypes.c_void_p * len(self.outputs))(
            *(a.ctypes.data for a in self.outputs))
        self.library.model_invoke.restype = ctypes.c_int
        self.library.model_invoke.argtypes = [ctypes.c_void_p, ctypes.c_void_p]

    def invoke(self) -> int:
        return self.library.model_invoke(self.input_pointers, self.output_pointers)

    def check(self, expected: Sequence[np.ndarray], what: str) -> None:
        """Raise unless the last invoke's outputs agree with `expected` (runtime_py's) as
        `arenac check` judges them (integers bit for bit, floats within its tolerance): a
        timing of wrong code is no timing."""
        from toolchain.lab.check import difference

        for k, (got, want) in enumerate(zip(self.outputs, expected, strict=True)):
            if difference(np.asarray(want), got).mismatches:
                raise AssertionError(f"{what}: output {k} differs from runtime_py's")

    def __enter__(self) -> CLibrary:
        return self

    def __exit__(self, *_: object) -> None:
        import shutil

        shutil.rmtree(self.directory, ignore_errors=True)


def litert(model_bytes: bytes, inputs: Sequence[np.ndarray], reference: bool) -> Engine:
    """LiteRT's interpreter with its inputs set once: its default kernels (XNNPACK for what it
    delegates) or the reference ones."""
    from ai_edge_litert import interpreter as lite

    resolver = lite.OpResolverType.BUILTIN_REF if reference else lite.OpResolverType.AUTO
    engine = lite.Interpreter(model_content=model_bytes, experimental_op_resolver_type=resolver)
    engine.allocate_tensors()
    for detail, value in zip(engine.get_input_details(), inputs, strict=True):
        engine.set_tensor(detail["index"], value)
    return _holding(engine.invoke, model_bytes)


def tflm(model_bytes: bytes, inputs: Sequence[np.ndarray]) -> Engine:
    """TFLite Micro's interpreter (the tflite-micro package) with its inputs set once."""
    from tflite_micro.python.tflite_micro import runtime

    engine = runtime.Interpreter.from_bytes(model_bytes, arena_size=4 << 20)
    for i, value in enumerate(inputs):
        engine.set_input(value, i)
    return _holding(engine.invoke, model_bytes)


def runtime_py(mp: ModelPlan, inputs: Sequence[np.ndarray]) -> Engine:
    """runtime_py: its invoke takes the inputs (it runs in a poisoned arena it fills itself)."""
    interpreter = ArenaInterpreter(mp)
    return lambda: interpreter.invoke(inputs)


def _holding(invoke: Engine, model_bytes: bytes) -> Engine:
    """`invoke`, keeping the model's bytes alive until the interpreter behind it is gone: an
    interpreter reads the buffer it was made from, up to its destructor."""
    held = (invoke, model_bytes)  # released in this order: the interpreter first
    return lambda: held[0]()
