"""The generated C on an emulated Cortex-M: the QEMU machine of the plan's target
(toolchain.targets; mps2-an386's Cortex-M4 for portable C), I/O through semihosting.

The firmware (toolchain.lab.firmware.build_mcu: the model's C, a startup file, a linker script and
an MCU harness, built with arm-none-eabi-gcc -Os and newlib-nano) reads every input set from
one host file and appends the outputs to another, through ARM semihosting; QEMU runs with the
semihosting target `native` in a fresh directory holding that input file, and exits with the
status the firmware passes to SYS_EXIT_EXTENDED. All input sets run in one QEMU process.

    with QemuBackend(model_plan) as backend:
        outputs = backend.invoke_many(input_sets)   # same interface as CBackend
        backend.stack_peak                          # measured stack high-water mark, bytes
        backend.footprint()                         # toolchain.lab.footprint.measure of this build
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from toolchain.c.generate import traced_tensors
from toolchain.errors import RuntimeBackendError
from toolchain.lab.c_backend import (
    input_set_bytes,
    split_outputs,
    tensor_values,
    waited_outputs,
)
from toolchain.lab.firmware import (
    INPUT_FILE,
    OUTPUT_FILE,
    TOOL_PREFIX,
    TOOLS,
    board_of,
    build_mcu,
    firmware_failure,
    mcu_sources,
    mcu_target,
    tool,
)
from toolchain.lab.footprint import measure
from toolchain.lower.plan import ModelPlan
from toolchain.progress import step

QEMU = "qemu-system-arm"
QEMU_TIMEOUT = 600.0  # seconds for one QEMU process (all input sets)
# The board's first UART on a new pseudo-terminal, whose path QEMU prints ("char device
# redirected to /dev/pts/N"): a self-test firmware's serial line, as a board's USB port.
SERIAL_PTY = ("-serial", "pty")


def qemu(source: str | None = None) -> str:
    path = shutil.which(QEMU)
    if path is None:
        raise RuntimeBackendError(
            f"{QEMU} is not on PATH (Debian: apt-get install qemu-system-arm)", source
        )
    return path


def missing() -> list[str]:
    """The programs this backend and toolchain.lab.firmware need that are not on PATH."""
    needed = [TOOL_PREFIX + t for t in TOOLS] + [QEMU]
    return [program for program in needed if shutil.which(program) is None]


def available() -> bool:
    """True when the cross toolchain (gcc, size, nm, objdump) and qemu-system-arm are installed."""
    return not missing()


def qemu_command(elf: str, machine: str = "mps2-an386", extra: Sequence[str] = ()) -> list[str]:
    """QEMU without display, network or monitor; semihosting reads and writes host files."""
    return [qemu(), *qemu_arguments(machine, extra), "-kernel", elf]


def qemu_arguments(machine: str, extra: Sequence[str] = ()) -> list[str]:
    """qemu_command's arguments but the firmware's (a generated project's Makefile runs them)."""
    return ["-M", machine, *extra, "-nographic", "-monitor", "none", "-nic", "none",
            "-semihosting-config", "enable=on,target=native"]


class QemuBackend:
    """Build the firmware for a plan and run it under QEMU; `invoke` matches runtime_py's.

    The build folder is removed by `close` (or leaving the `with` block), and by the
    constructor itself when the build fails.
    """

    name = "qemu"

    def __init__(self, model_plan: ModelPlan, name: str = "model", timeout: float = QEMU_TIMEOUT,
                 trace: bool = False):
        self.source = model_plan.model.source
        tool("gcc", self.source)  # a clear error before any work when a program is missing
        qemu(self.source)
        self.model_plan = model_plan
        self.machine = board_of(mcu_target(model_plan), self.source).machine
        self.graph = model_plan.graph
        self.timeout = timeout
        self.stack_peak: int | None = None  # bytes, from the last run
        self.seconds: float | None = None  # wall-clock time of the last QEMU run
        # with `trace`, every set's output begins with these tensors' bytes
        self.traced = [t for _, t in traced_tensors(model_plan)] if trace else []
        self.tensors: list[dict[int, np.ndarray]] = []  # per set of the last run, with trace
        self.waits = model_plan.program.stops_early  # each set's outputs led by a byte
        if self.waits and trace:
            raise RuntimeBackendError("per-layer tracing of a model whose invoke may end early "
                                      "(CIRCULAR_BUFFER) is not supported", self.source)
        self.directory = tempfile.mkdtemp(prefix="arenac-qemu-")
        try:
            files = mcu_sources(model_plan, name, trace=True) if trace else None
            with step(f"building for {self.machine}"):
                self.build = build_mcu(model_plan, self.directory, name, files=files)
        except BaseException:
            self.close()
            raise

    def invoke_many(self, input_sets: Sequence[Sequence[np.ndarray]],
                    sequence: int | None = None) -> list[list[np.ndarray]]:
        """Run every input set in one QEMU process, in order; outputs per set. The model's
        state carries from set to set; with `sequence`, it is reset before sets `sequence`,
        2 * `sequence`, ..."""
        chunks = [struct.pack("<II", len(input_sets), sequence or 0)]
        chunks += [input_set_bytes(self.graph, values, self.source) for values in input_sets]
        run_dir = tempfile.mkdtemp(prefix="run-", dir=self.directory)
        try:
            with open(os.path.join(run_dir, INPUT_FILE), "wb") as f:
                f.write(b"".join(chunks))
            with step(f"QEMU {self.machine}"):
                raw = self._run(run_dir)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        return self._split(raw, len(input_sets))

    def _run(self, run_dir: str) -> bytes:
        start = time.perf_counter()
        try:
            result = subprocess.run(
                qemu_command(self.build.elf, self.machine),
                cwd=run_dir,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=self.timeout,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeBackendError(
                f"{QEMU} did not finish within {self.timeout:g} s", self.source
            ) from None
        self.seconds = time.perf_counter() - start
        if result.returncode != 0:
            raise firmware_failure(result, f"firmware under {QEMU}", self.source)
        path = os.path.join(run_dir, OUTPUT_FILE)
        if not os.path.exists(path):
            raise RuntimeBackendError(f"firmware under {QEMU} wrote no {OUTPUT_FILE}", self.source)
        with open(path, "rb") as f:
            return f.read()

    def _split(self, raw: bytes, sets: int) -> list[list[np.ndarray]]:
        if self.waits:  # a byte before each set's outputs (no tracing: CBackend refuses it)
            (self.stack_peak,) = struct.unpack_from("<I", raw, max(len(raw) - 4, 0))
            return waited_outputs(raw[:-4], self.graph, sets, self.source)
        traced = sum(self.graph.tensors[t].nbytes for t in self.traced)
        outputs = sum(self.graph.tensors[t].nbytes for t in self.graph.outputs)
        expected = sets * (traced + outputs) + 4
        if len(raw) != expected:
            raise RuntimeBackendError(
                f"firmware under {QEMU} wrote {len(raw)} bytes, expected {expected}", self.source
            )
        (self.stack_peak,) = struct.unpack_from("<I", raw, len(raw) - 4)
        if not self.traced:
            return split_outputs(raw, self.graph, sets)
        self.tensors, result = [], []
        for k in range(sets):
            chunk = raw[k * (traced + outputs):(k + 1) * (traced + outputs)]
            self.tensors.append(dict(zip(self.traced,
                                         tensor_values(chunk, self.graph, self.traced),
                                         strict=True)))
            result += split_outputs(chunk[traced:], self.graph, 1)
        return result

    def trace(self, inputs: Sequence[np.ndarray]) -> dict[int, np.ndarray]:
        """Every traced tensor's value in one invoke from the initial state (trace=True)."""
        self.invoke_many([inputs])
        return self.tensors[0]

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.invoke_many([inputs])[0]

    def footprint(self) -> dict[str, Any]:
        """The footprint (toolchain.lab.footprint.measure) of this build, and its stack once run."""
        figures = measure(self.build, self.model_plan)
        if self.stack_peak is not None:
            figures["stack_measured"] = self.stack_peak
        return figures

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> QemuBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
