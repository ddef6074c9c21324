"""`arenac project`: a firmware project that builds with make and with CMake and runs as it
stands on a QEMU Arm machine: the model's C, the startup code and vector table, a linker script
from the board's memory map, a main.c that runs the model on an embedded test input and prints
its outputs and the ticks the invoke took, a Makefile, a CMakeLists.txt and its toolchain file.
With `serial`, main.c is instead the self-test firmware `check --backends device` talks to over
the board's UART (toolchain.lab.device), and `make run` puts that UART on a pseudo-terminal.

arenac records what it wrote (.arenac-project: each file's SHA-256); writing the project again
replaces only the files nobody edited since, unless `force`.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from toolchain import __version__
from toolchain.c.generate import generate
from toolchain.errors import ArenacError
from toolchain.files import write_files_atomic
from toolchain.lab import device
from toolchain.lab.check import random_inputs
from toolchain.lab.firmware import C_FLAGS, LINK_FLAGS, harness_values, pool_sections, support_files
from toolchain.lab.qemu_backend import QEMU, SERIAL_PTY, qemu_arguments
from toolchain.lower.plan import ModelPlan
from toolchain.ops.emit import c_array
from toolchain.render import render
from toolchain.targets import (
    BOARDS,
    CORESIGHT_UNLOCK,
    DEMCR,
    DWT_CTRL,
    DWT_LAR,
    PARTS,
    TARGETS,
    Board,
    Part,
    Target,
)
from toolchain.text import c_identifier

MANIFEST = ".arenac-project"


def board_target(board: str) -> Target:
    """The target of `board`: a QEMU machine's, or a real part's core."""
    if board in PARTS:
        return TARGETS[PARTS[board].target]
    found = [t for t in TARGETS.values() if t.board is not None and t.board.machine == board]
    if not found:
        raise ArenacError(f"no board {board!r}; the boards are "
                          f"{', '.join(sorted({*BOARDS, *PARTS}))}")
    return found[0]


def project_files(mp: ModelPlan, name: str, inputs: list[np.ndarray], serial: bool = False,
                  part: Part | None = None) -> dict[str, str]:
    """Every file of the project for `mp` (planned for its board's target); with `serial`, the
    self-test firmware (`inputs` unused); for a real `part` (targets.PARTS), its memory map,
    its core's cycle counter, and no QEMU run."""
    name = c_identifier(name)
    target = TARGETS[mp.program.target]
    board = part.as_board() if part else target.board
    if part and serial:
        raise ArenacError(f"--serial drives the QEMU machines' CMSDK UART; {part.name}'s UART is "
                          "not known to arenac yet")
    files = generate(mp, name)
    del files[f"{name}_main.c"]
    files.update(support_files(target, pool_sections(mp), board))
    io = harness_values(mp, name)
    values = {
        "name": name, "version": __version__, "board": board.machine, "cpu": target.name,
        "counter": f"0x{board.counter:08x}u", "counter_hz": f"{board.counter_hz:,}",
        "counter_label": "cycles" if part else "ticks",
        "dwt": None if not part else {
            "ctrl": f"0x{DWT_CTRL:08X}u", "demcr": f"0x{DEMCR:08X}u",
            "lar": f"0x{DWT_LAR:08X}u" if target.name == "cortex-m7" else None,
            "unlock": f"0x{CORESIGHT_UNLOCK:08X}u"},
        "cpu_flags": " ".join(target.flags), "c_flags": " ".join(C_FLAGS),
        "link_flags": " ".join(LINK_FLAGS), "waits": mp.program.stops_early, "serial": serial,
        "qemu": None if part else " ".join([QEMU, *qemu_arguments(board.machine,
                                                                  SERIAL_PTY if serial else ())]),
        "inputs": [{"index": k, "comment": f"{t.name!r} {t.dtype}{list(t.shape)}",
                    "length": max(value.nbytes, 1),
                    "data": c_array(np.ascontiguousarray(value).view(np.uint8).ravel()),
                    "row_bytes": stream["row_bytes"],
                    "source": f"input{k}" if stream["row_bytes"] else "NULL"}
                   for k, (t, value, stream) in enumerate(zip(
                       (mp.graph.tensors[i] for i in mp.graph.inputs), inputs,
                       io["streams"] or [{"row_bytes": 0}] * len(inputs), strict=True))],
        "streams": io["streams"],
        "output_streams": io["output_streams"], "input_at": io["input_at"],
        "output_at": io["output_at"],
        "outputs": [{"dtype": o.dtype, "shape": "[" + "x".join(map(str, o.shape)) + "]",
                     "nbytes": o.nbytes,
                     "at": f"handed{k}" if t in mp.streamed_outputs else f"{name}_output({k})"}
                    for k, (o, t) in enumerate(zip(io["outputs"], mp.graph.outputs,
                                                   strict=True))],
    }
    files["main.c"] = render("project/serial_main.c.j2", **values, **serial_values(mp, board)) \
        if serial else render("project/main.c.j2", **values)
    files["Makefile"] = render("project/Makefile.j2", **values)
    files["CMakeLists.txt"] = render("project/CMakeLists.txt.j2", **values)
    files["arm-none-eabi.cmake"] = render("project/arm-none-eabi.cmake.j2", **values)
    return files


def serial_values(mp: ModelPlan, board: Board) -> dict:
    """What the self-test firmware's main.c says of the protocol and the model, as C text."""
    inputs = [mp.graph.tensors[t].nbytes for t in mp.graph.inputs]
    outputs = [mp.graph.tensors[t].nbytes for t in mp.graph.outputs]
    return {
        "uart": f"0x{board.uart:08x}u", "sync": [f"0x{b:02X}u" for b in device.SYNC],
        "sync_text": " ".join(f"0x{b:02X}" for b in device.SYNC),
        "kinds": {k: f"'{getattr(device, k.upper()).decode()}'"
                  for k in ("hello", "invoke", "outputs", "reset", "error")},
        "errors": [{"code": c, "meaning": m} for c, m in device.ERRORS.items()],
        "error_codes": {"crc": device.ERROR_CRC, "length": device.ERROR_LENGTH,
                        "kind": device.ERROR_KIND},
        "crc_polynomial": f"0x{device.CRC_POLYNOMIAL:08X}u",
        "version_number": device.VERSION, "input_bytes": inputs or [0],
        "output_bytes": outputs or [0], "input_total": sum(inputs),
        "output_total": sum(outputs), "counter_hz_value": board.counter_hz,
        "model_sha256": c_array(np.frombuffer(bytes.fromhex(mp.model.sha256), np.uint8)),
    }


def write_project(directory: str, files: dict[str, str], force: bool = False) -> list[str]:
    """Write the files, refusing (unless `force`) to replace one edited since arenac wrote it;
    the manifest records what was written."""
    manifest_path = os.path.join(directory, MANIFEST)
    try:
        with open(manifest_path) as f:
            written = json.load(f)
    except (OSError, ValueError):
        written = {}
    if not force:
        for file_name, text in sorted(files.items()):
            path = os.path.join(directory, file_name)
            if not os.path.exists(path):
                continue
            with open(path, "rb") as f:
                current = _digest(f.read())
            if current != written.get(file_name) and current != _digest(text.encode()):
                raise ArenacError(f"{file_name} was edited since arenac wrote it (or arenac did "
                                  "not write it): keep it, or give --force to replace it",
                                  directory)
    record = {file_name: _digest(text.encode()) for file_name, text in files.items()}
    return write_files_atomic(directory, {**files, MANIFEST: json.dumps(record, indent=1,
                                                                        sort_keys=True) + "\n"})


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def default_inputs(mp: ModelPlan) -> list[np.ndarray]:
    """check's random input set of seed 0: what `arenac run` is given to compare."""
    return random_inputs(mp.graph, 0)
