"""`check --backends device`: the self-test firmware of `arenac project --serial` answers over
its board's UART, which QEMU puts on a pseudo-terminal as a board's USB serial port would be;
the same three-way check passes there, and a device that corrupts a frame, stays silent, runs
another model or refuses a frame ends the check with one line and exit status 2."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import zlib

import pytest

from tests.test_project import needs_tools
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import read_model
from toolchain.lab import device


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolchain.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


@contextlib.contextmanager
def firmware_on_pty(project):
    """`make run` of a --serial project: QEMU running the self-test firmware, its UART0 on the
    pseudo-terminal it names; stopped on leaving."""
    built = subprocess.run(["make", "-C", str(project)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr
    qemu = subprocess.Popen(["make", "-s", "-C", str(project), "run"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        port = None
        for line in qemu.stdout:
            found = re.search(r"char device redirected to (\S+)", line)
            if found:
                port = found[1]
                break
        assert port, "QEMU named no pseudo-terminal"
        yield port
    finally:
        os.killpg(qemu.pid, signal.SIGTERM)
        qemu.wait(timeout=30)


def serial_project(tmp_path, model, board: str) -> str:
    project = tmp_path / f"fw-{board}"
    made = cli("project", str(model), "-o", str(project), "--board", board, "--serial")
    assert made.returncode == 0, made.stderr
    return project


EXAMPLE_CASES = [("tiny_cnn_int8", "mps2-an386"), ("residual_cnn_float32", "mps2-an505"),
                 ("streaming_kws_int8", "mps3-an547")]


@needs_tools
@pytest.mark.parametrize("example, board", EXAMPLE_CASES)
def test_check_passes_on_the_device(example, board, tmp_path):
    """Random sets (a sequence of them, with resets between, for the streaming model) through
    the firmware, compared with the oracle and runtime_py."""
    from toolchain.lab.project import board_target

    model = tmp_path / f"{example}.tflite"
    model.write_bytes(EXAMPLES[example]())
    with firmware_on_pty(serial_project(tmp_path, model, board)) as port:
        result = cli("check", str(model), "--target", board_target(board).name, "--backends",
                     "runtime_py,device", "--device", port, "--device-timeout", "60")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "device:" in result.stdout and "all backends agree" in result.stdout
    assert re.search(r"device \S+: each invoke [\d,]+ to [\d,]+ ticks", result.stdout)


def largest_mlperf_input_model() -> bytes:
    """A small int8 model with vww_96_int8's input (96x96x3, 27,648 bytes, the largest of the
    MLPerf Tiny models) and a 6,912-byte output: the serial protocol's frames at that size."""
    b = ModelBuilder("int8", 0)
    x = b.input("input", (1, 96, 96, 3), "int8", 1.0 / 128.0, 0)
    x = b.depthwise_conv_2d(x, 3, activation="RELU")
    b.output(b.average_pool_2d(x, 2))
    return b.build()


@needs_tools
def test_check_passes_on_the_device_at_the_largest_mlperf_input(tmp_path):
    """One input through the firmware at the largest MLPerf input: the frames' size is what is
    new here. The MLPerf models' own kernels are checked on three inputs under QEMU
    (test_targets), so the model is one that plans and builds in a second."""
    model = tmp_path / "large_input.tflite"
    model.write_bytes(largest_mlperf_input_model())
    with firmware_on_pty(serial_project(tmp_path, model, "mps2-an386")) as port:
        result = cli("check", str(model), "--target", "cortex-m4", "--backends",
                     "runtime_py,device", "--device", port, "--device-timeout", "120",
                     "--inputs", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "device:" in result.stdout and "all backends agree" in result.stdout


class FakeDevice:
    """A device on a pseudo-terminal that answers as the firmware would for `model`, but for
    what `fault` changes: "silent" (reads, never answers), "crc" (the first invoke's answer
    with a wrong CRC), "model" (another model's SHA-256), "refuses" (an ERROR frame)."""

    def __init__(self, model, fault: str):
        m = read_model(str(model))
        self.graph = m.main
        self.sha256 = bytes.fromhex(m.sha256)
        self.fault = fault
        self.master, slave = os.openpty()
        self.port = os.ttyname(slave)
        self.slave = slave
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def read(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = os.read(self.master, count - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def answer(self, kind: bytes, payload: bytes, corrupt: bool = False) -> None:
        data = bytearray(device.frame(kind, payload))
        if corrupt:
            data[-1] ^= 0xFF
        os.write(self.master, bytes(data))

    def serve(self) -> None:
        nbytes = [sum(self.graph.tensors[t].nbytes for t in ts)
                  for ts in (self.graph.inputs, self.graph.outputs)]
        with contextlib.suppress(OSError, EOFError):
            while True:
                window = b""
                while window != device.SYNC:
                    window = (window + self.read(1))[-2:]
                kind, (length,) = self.read(1), struct.unpack("<I", self.read(4))
                self.read(length + 4)
                if self.fault == "silent":
                    continue
                if self.fault == "refuses":
                    self.answer(device.ERROR, struct.pack("<I", device.ERROR_CRC))
                elif kind == device.HELLO:
                    sha = bytes(32) if self.fault == "model" else self.sha256
                    self.answer(device.HELLO, struct.pack(device.HELLO_FORMAT, device.VERSION,
                                                          *nbytes, 1000, sha))
                elif kind == device.RESET:
                    self.answer(device.RESET, b"")
                else:
                    self.answer(device.OUTPUTS, bytes(8 + nbytes[1]),
                                corrupt=self.fault == "crc")

    def close(self) -> None:
        os.close(self.master)
        os.close(self.slave)


@pytest.mark.parametrize("fault, says", [
    ("silent", "did not answer within 1 s"),
    ("crc", "a corrupted frame from the device"),
    ("model", "the device runs another model"),
    ("refuses", "the device refused a frame: its CRC did not match"),
])
def test_a_faulty_device_ends_the_check_with_one_line(fault, says, tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    fake = FakeDevice(model, fault)
    try:
        result = cli("check", str(model), "--backends", "runtime_py,device", "--device",
                     fake.port, "--device-timeout", "1", timeout=120)
    finally:
        fake.close()
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and fake.port in lines[0] and says in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_frames_carry_zlibs_crc():
    framed = device.frame(device.INVOKE, b"\x01\x02\x03")
    assert framed[:2] == device.SYNC and framed[2:3] == device.INVOKE
    assert struct.unpack("<I", framed[3:7])[0] == 3 and framed[7:10] == b"\x01\x02\x03"
    assert struct.unpack("<I", framed[10:])[0] == zlib.crc32(framed[2:10])


@pytest.mark.parametrize("args, says", [
    (["--backends", "runtime_py,device"], "the device backend and --device go together"),
    (["--device", "/dev/null"], "the device backend and --device go together"),
    (["--backends", "runtime_py,device", "--device", "/nonexistent/tty"],
     "cannot open the serial port"),
])
def test_device_options_are_checked(args, says, tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    result = cli("check", str(model), *args, timeout=120)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
