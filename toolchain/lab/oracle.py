"""Oracle adapters: the TensorFlow Lite interpreters whose outputs runtime_py must reproduce.

LiteRT with BUILTIN_REF runs TFLite's reference kernels (the optimized default ones round
differently); the TFLM interpreter stands in where LiteRT refuses a model. These classes run
the interpreters in this process, for tests and for TFLM's own arena figures; `check` runs
them in a child process (toolchain.lab.oracle_process), since a model file can crash
them.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import tempfile
from collections.abc import Sequence

import numpy as np

from toolchain.errors import RuntimeBackendError

# What to install for both oracles (pyproject.toml's `check` extra)
INSTALL_ORACLES = "pip install 'arenac[check]'"
TFLM_MODULE = "tflite_micro.python.tflite_micro.runtime"


def installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it (its parents excepted)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def tflm_missing(why: str) -> str:
    """The one line saying TFLite Micro is needed and how to get it."""
    return f"{why} needs TFLite Micro as its oracle, which is not installed: {INSTALL_ORACLES}"


def _litert():
    """LiteRT's interpreter module, or tflite_runtime's where that is what is installed."""
    try:
        from ai_edge_litert import interpreter
    except ImportError:
        try:
            from tflite_runtime import interpreter
        except ImportError:
            raise RuntimeBackendError(
                f"the LiteRT oracle is not installed: {INSTALL_ORACLES}"
            ) from None
    return interpreter


def partial_outputs(model_bytes: bytes) -> set[int]:
    """The main graph's tensors written by ops whose LiteRT kernel leaves entries unwritten
    (OpSpec.partial_outputs); none for a model our reader refuses, which LiteRT may still run."""
    from toolchain.errors import ArenacError
    from toolchain.front.reader import parse_model
    from toolchain.ops import REGISTRY

    # such ops are custom ones, named in the file: most models skip the parse
    if not any(code.encode() in model_bytes for code, spec in REGISTRY.items()
               if spec.partial_outputs):
        return set()
    try:
        graph = parse_model(model_bytes, "<oracle>").main
    except ArenacError:
        return set()
    return {t for op in graph.operators
            if op.kind in REGISTRY and REGISTRY[op.kind].partial_outputs for t in op.outputs}


class LiteRTOracle:
    """TFLite's reference kernels; can keep every intermediate tensor for per-layer checks."""

    def __init__(
        self, model_bytes: bytes, preserve_all_tensors: bool = False, reference: bool = True
    ):
        lite = _litert()
        resolver = lite.OpResolverType.BUILTIN_REF if reference else lite.OpResolverType.AUTO
        self.name = "litert-ref" if reference else "litert"
        self.interpreter = lite.Interpreter(
            model_content=model_bytes,
            experimental_op_resolver_type=resolver,
            experimental_preserve_all_tensors=preserve_all_tensors,
        )
        self.interpreter.allocate_tensors()
        self.inputs = [d["index"] for d in self.interpreter.get_input_details()]
        self.outputs = [d["index"] for d in self.interpreter.get_output_details()]
        self.partial = sorted(partial_outputs(model_bytes) & set(self.outputs))

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        # Zeroed before the inputs are set (an output may share an input's memory), an entry
        # the kernel leaves unwritten reads 0, as ours writes it, not what the memory held.
        for index in self.partial:
            self.interpreter.tensor(index)()[...] = 0
        for index, value in zip(self.inputs, inputs, strict=True):
            self.interpreter.set_tensor(index, value)
        self.interpreter.invoke()
        return [self.interpreter.get_tensor(i).copy() for i in self.outputs]

    def tensor(self, index: int) -> np.ndarray:
        return self.interpreter.get_tensor(index).copy()


# The smallest arena the TFLM interpreter gets when none is asked for: its own default, ten
# times the model's size, is too small for the small models tests build around a stateful
# kernel (an FFT's tables, a filter bank's sums live in the arena's persistent part).
MIN_TFLM_ARENA = 256 * 1024
# What TFLite Micro's invoke returns when a kernel ended it early (kTfLiteAbort).
TFLM_ABORT = 15


class TFLMOracle:
    """The TensorFlow Lite Micro interpreter from the tflite-micro package."""

    name = "tflm"

    def __init__(self, model_bytes: bytes, output_count: int, arena_size: int | None = None):
        self.output_count = output_count
        try:
            from tflite_micro.python.tflite_micro import runtime
        except ImportError:
            raise RuntimeBackendError(
                f"the TFLite Micro interpreter is not installed: {INSTALL_ORACLES}") from None
        if arena_size is None:
            arena_size = max(10 * len(model_bytes), MIN_TFLM_ARENA)
        self.interpreter = runtime.Interpreter.from_bytes(model_bytes, arena_size=arena_size)

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The outputs, or [] for an invoke a kernel ended early (kTfLiteAbort, which the
        interpreter returns rather than raises: a CIRCULAR_BUFFER gathering frames)."""
        for i, value in enumerate(inputs):
            self.interpreter.set_input(value, i)
        if self.interpreter.invoke() == TFLM_ABORT:
            return []
        return [self.interpreter.get_output(i).copy() for i in range(self.output_count)]

    def allocations(self) -> dict[str, int]:
        """TFLM's arena figures: 'total', 'head' (planned activations) and 'tail' in bytes."""
        text = capture_fd(2, self.interpreter.print_allocations)
        return {k: int(v) for k, v in re.findall(r"Arena allocation (\w+) (\d+) bytes", text)}


def capture_fd(fd: int, call) -> str:
    """Text a C++ extension writes to file descriptor `fd` (TFLM logs to stderr) during `call`."""
    libc = ctypes.CDLL(None)
    with tempfile.TemporaryFile(mode="w+") as sink:
        saved = os.dup(fd)
        try:
            os.dup2(sink.fileno(), fd)
            call()
            libc.fflush(None)  # C stdio may buffer what the extension printed
        finally:
            os.dup2(saved, fd)
            os.close(saved)
        sink.seek(0)
        return sink.read()
