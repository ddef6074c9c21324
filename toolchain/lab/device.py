"""`check --backends device`: the model run on a board over a serial line, by the self-test
firmware `arenac project --serial` writes (templates/project/serial_main.c.j2).

The protocol is frames either way: SYNC, a kind byte, the payload's length (uint32), the
payload, and the CRC-32 of the kind, length and payload (zlib's crc32; integers
little-endian). The host asks, the firmware answers:

    HELLO  ->  HELLO: protocol version, input bytes, output bytes, counter ticks per second
                      (uint32 each), the SHA-256 of the model file it runs (32 bytes)
    INVOKE + every input's bytes  ->  OUTPUTS: status, ticks (uint32 each), every output's bytes
    RESET  ->  RESET: the model's state is back to its start

and answers a frame it cannot take with ERROR and a code (ERRORS). Every read has a deadline:
a silent or slow device, a corrupted frame, a frame of the wrong kind or length, or a device
that runs another model ends the check with one line naming the port.

    with DeviceBackend(model_plan, "/dev/ttyACM0") as device:
        outputs = device.invoke_many(input_sets)   # same interface as QemuBackend
        device.ticks                               # each invoke's counter ticks
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Sequence

import numpy as np

from toolchain.errors import RuntimeBackendError
from toolchain.lab.c_backend import input_set_bytes, tensor_values
from toolchain.lower.plan import ModelPlan
from toolchain.ops.emit import WAITING_STATUS

SYNC = b"\xa5\x5a"
VERSION = 1
HELLO, INVOKE, OUTPUTS, RESET, ERROR = b"H", b"I", b"O", b"R", b"E"
ERROR_CRC, ERROR_LENGTH, ERROR_KIND = 1, 2, 3
ERRORS = {ERROR_CRC: "its CRC did not match", ERROR_LENGTH: "its length was not the expected one",
          ERROR_KIND: "its kind is unknown"}
CRC_POLYNOMIAL = 0xEDB88320  # zlib's crc32, reflected
HELLO_FORMAT = "<4I32s"
DEFAULT_BAUD = 115200
DEFAULT_TIMEOUT = 30.0  # seconds a frame may take to arrive, whole


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One frame of `kind` around `payload`."""
    header = kind + struct.pack("<I", len(payload))
    return SYNC + header + payload + struct.pack("<I", zlib.crc32(header + payload))


class DeviceBackend:
    """A board running the self-test firmware of `model_plan`'s model on `port`; `invoke`
    matches runtime_py's. `link` stands in for the serial port (tests)."""

    name = "device"

    def __init__(self, model_plan: ModelPlan, port: str, baud: int = DEFAULT_BAUD,
                 timeout: float = DEFAULT_TIMEOUT, link=None):
        self.graph = model_plan.graph
        self.port = port
        self.timeout = timeout
        self.waits = model_plan.program.stops_early
        self.input_bytes = sum(self.graph.tensors[t].nbytes for t in self.graph.inputs)
        self.output_bytes = sum(self.graph.tensors[t].nbytes for t in self.graph.outputs)
        self.ticks: list[int] = []  # each invoke's, of the last invoke_many
        self.counter_hz = 0
        self.link = link if link is not None else open_port(port, baud)
        try:
            self.link.reset_input_buffer()
            self._hello(model_plan.model.sha256)
        except BaseException:
            self.close()
            raise

    def _fail(self, what: str) -> RuntimeBackendError:
        return RuntimeBackendError(what, self.port)

    def _hello(self, sha256: str) -> None:
        reply = self._ask(HELLO, b"", HELLO, struct.calcsize(HELLO_FORMAT))
        version, inputs, outputs, self.counter_hz, digest = struct.unpack(HELLO_FORMAT, reply)
        if version != VERSION:
            raise self._fail(f"the device speaks protocol {version}, arenac {VERSION}: write "
                             "its firmware again with this arenac (arenac project --serial)")
        if digest.hex() != sha256 or (inputs, outputs) != (self.input_bytes, self.output_bytes):
            raise self._fail(f"the device runs another model (SHA-256 {digest.hex()[:16]}..., "
                             f"{inputs} input and {outputs} output bytes), not this one "
                             f"({sha256[:16]}..., {self.input_bytes} and {self.output_bytes})")

    def _ask(self, kind: bytes, payload: bytes, answer: bytes, length: int) -> bytes:
        """Send a frame and return the payload of the answer, which must be `answer` of
        `length` bytes."""
        self.link.write(frame(kind, payload))
        self.link.flush()
        got_kind, reply = self._read_frame({answer: length, ERROR: 4})
        if got_kind == ERROR:
            (code,) = struct.unpack("<I", reply)
            raise self._fail(f"the device refused a frame: {ERRORS.get(code, f'error {code}')}")
        return reply

    def _read_frame(self, lengths: dict[bytes, int]) -> tuple[bytes, bytes]:
        """The next frame's kind and payload, one of `lengths` (kind -> payload bytes), within
        the timeout; bytes before its SYNC (a board's boot text) are skipped."""
        deadline = time.monotonic() + self.timeout
        window = b""
        while window != SYNC:
            window = (window + self._read(1, deadline))[-len(SYNC):]
        header = self._read(5, deadline)
        kind, (length,) = header[:1], struct.unpack("<I", header[1:])
        if lengths.get(kind) != length:
            raise self._fail(f"a frame from the device of kind {kind!r} and {length} bytes; "
                             "expected " + " or ".join(f"{k!r} of {n} bytes"
                                                       for k, n in lengths.items()))
        payload = self._read(length, deadline)
        (crc,) = struct.unpack("<I", self._read(4, deadline))
        if crc != zlib.crc32(header + payload):
            raise self._fail("a corrupted frame from the device: its CRC does not match")
        return kind, payload

    def _read(self, count: int, deadline: float) -> bytes:
        data = b""
        while len(data) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"the device did not answer within {self.timeout:g} s (is the "
                                 "self-test firmware of `arenac project --serial` running "
                                 "there?)")
            self.link.timeout = left
            data += self.link.read(count - len(data))
        return data

    def reset(self) -> None:
        self._ask(RESET, b"", RESET, 0)

    def invoke_many(self, input_sets: Sequence[Sequence[np.ndarray]],
                    sequence: int | None = None) -> list[list[np.ndarray]]:
        """Run every input set in order from the model's initial state; outputs per set. With
        `sequence`, the state is reset before sets `sequence`, 2 * `sequence`, ..."""
        results, self.ticks = [], []
        self.reset()
        for k, values in enumerate(input_sets):
            if sequence and k and k % sequence == 0:
                self.reset()
            payload = input_set_bytes(self.graph, values, self.port)
            reply = self._ask(INVOKE, payload, OUTPUTS, 8 + self.output_bytes)
            status, ticks = struct.unpack_from("<II", reply)
            if self.waits and status == WAITING_STATUS:
                results.append([])
                continue
            if status != 0:
                raise self._fail(f"the model's invoke failed on the device: status {status}")
            self.ticks.append(ticks)
            results.append(tensor_values(reply[8:], self.graph, self.graph.outputs))
        return results

    def invoke(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.invoke_many([inputs])[0]

    def close(self) -> None:
        self.link.close()

    def __enter__(self) -> DeviceBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_port(port: str, baud: int):
    """The serial port, raw, 8N1 at `baud`; an error names it."""
    import serial

    try:
        return serial.Serial(port, baud, timeout=0)
    except (serial.SerialException, ValueError, OSError) as e:
        raise RuntimeBackendError(f"cannot open the serial port: {e}", port) from None
