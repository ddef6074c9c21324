"""`make bench`: figures measured side by side in one run, printed as ratios.

Not a test: timings vary from machine to machine, so nothing here asserts; it prints.
Usage: python -m tests.bench [c] [runtime] [MODEL.tflite ...]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from runtime_py.c_backend import CBackend
from runtime_py.check import random_inputs
from runtime_py.interpreter import ArenaInterpreter
from runtime_py.oracle import LiteRTOracle, TFLMOracle
from tests.conftest import SHARED_MODEL_FILES
from toolchain.errors import ArenacError
from toolchain.plan import plan_model
from toolchain.reader import read_model
from toolchain.report import table

REPEATS = 5


def per_inference_ms(run: Callable[[], object], repeats: int = REPEATS) -> float:
    """Median wall time of one call after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000.0


def try_backend(make: Callable[[], object]) -> object | None:
    try:
        return make()
    except (ArenacError, ValueError, RuntimeError):
        return None


def runtime_row(path: Path) -> list[object]:
    model = read_model(path)
    data = path.read_bytes()
    inputs = random_inputs(model.main, seed=0)
    runtime = try_backend(lambda: ArenaInterpreter(plan_model(model, "greedy")))
    ref = try_backend(lambda: LiteRTOracle(data, reference=True))
    fast = try_backend(lambda: LiteRTOracle(data, reference=False))
    tflm = try_backend(lambda: TFLMOracle(data, len(model.main.outputs)))
    ms = {
        name: per_inference_ms(lambda b=backend: b.invoke(inputs)) if backend else None
        for name, backend in [
            ("runtime_py", runtime),
            ("litert-ref", ref),
            ("litert", fast),
            ("tflm", tflm),
        ]
    }
    return [
        path.stem,
        fmt(ms["runtime_py"]),
        fmt(ms["litert-ref"]),
        fmt(ms["litert"]),
        fmt(ms["tflm"]),
        ratio(ms["runtime_py"], ms["litert-ref"]),
        ratio(ms["runtime_py"], ms["litert"]),
    ]


def c_ms_per_inference(backend: CBackend, inputs, repeat: int) -> float:
    """The harness times `repeat` invokes itself, so process start-up is not counted."""
    stdin = b"".join(v.tobytes() for v in inputs)
    result = subprocess.run(
        [backend.binary, str(repeat)], input=stdin, capture_output=True, check=True, timeout=600
    )
    return float(result.stderr.decode().split()[0])


def object_size(backend: CBackend, name: str = "model") -> dict[str, int]:
    """text/data/bss of the generated model's object file, as `size` reports them."""
    directory = backend.directory
    subprocess.run(
        ["cc", "-std=c99", "-O2", "-c", f"{name}.c", "-o", f"{name}.o"], cwd=directory, check=True
    )
    out = (
        subprocess.run(
            ["size", f"{name}.o"], cwd=directory, check=True, capture_output=True, text=True
        )
        .stdout.splitlines()[1]
        .split()
    )
    return {"text": int(out[0]), "data": int(out[1]), "bss": int(out[2])}


def c_row(path: Path) -> list[object]:
    model = read_model(path)
    data = path.read_bytes()
    inputs = random_inputs(model.main, seed=0)
    mp = plan_model(model, "greedy")
    with CBackend(mp) as backend:
        c_ms = c_ms_per_inference(backend, inputs, 3)
        repeat = max(3, min(2000, int(300 / max(c_ms, 0.001))))  # about 0.3 s of C
        c_ms = c_ms_per_inference(backend, inputs, repeat)
        sizes = object_size(backend)
    ms: dict[str, float | None] = {"c": c_ms}
    for name, make in [
        ("tflm", lambda: TFLMOracle(data, len(model.main.outputs))),
        ("litert", lambda: LiteRTOracle(data, reference=False)),
        ("litert-ref", lambda: LiteRTOracle(data, reference=True)),
    ]:
        backend = try_backend(make)
        ms[name] = per_inference_ms(lambda b=backend: b.invoke(inputs)) if backend else None
    return [
        path.stem,
        f"{c_ms:.4f}",
        fmt(ms["tflm"]),
        fmt(ms["litert"]),
        fmt(ms["litert-ref"]),
        ratio(c_ms, ms["tflm"]),
        ratio(c_ms, ms["litert"]),
        sizes["text"],
        sizes["data"],
        sizes["bss"],
        mp.arena_bytes,
    ]


def fmt(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms:.3f}"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}x"


def main(argv: list[str]) -> int:
    sections = [a for a in argv if not a.endswith(".tflite")] or ["c", "runtime"]
    paths = [Path(a) for a in argv if a.endswith(".tflite")] or SHARED_MODEL_FILES
    if not paths:
        print("no models: pass .tflite paths or provide ../shared/models", file=sys.stderr)
        return 2
    if "c" in sections:
        print("generated C (cc -O2, host) per inference (ms) beside TFLM and LiteRT, same run")
        print(
            table(
                [
                    "model",
                    "c",
                    "tflm",
                    "litert",
                    "litert-ref",
                    "c/tflm",
                    "c/litert",
                    "text",
                    "data",
                    "bss",
                    "arena",
                ],
                [c_row(p) for p in paths],
            )
        )
        print()
    if "runtime" in sections:
        print("runtime_py per inference (ms, median of 5) beside TFLite's interpreters, same run")
        print(
            table(
                ["model", "runtime_py", "litert-ref", "litert", "tflm", "py/ref", "py/litert"],
                [runtime_row(p) for p in paths],
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
