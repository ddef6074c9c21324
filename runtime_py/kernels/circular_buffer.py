"""numpy kernel of CIRCULAR_BUFFER (toolchain.ops.circular_buffer)."""

from __future__ import annotations

from toolchain.ops.circular_buffer.prepare import CircularBufferParams


class InvokeEnds(Exception):  # noqa: N818 (not an error: the invoke ends early by design)
    """Raised by a kernel that ends the invoke after its own work (TFLite Micro's
    kTfLiteAbort): the ops after it wait for a later invoke."""


def circular_buffer(p: CircularBufferParams, inputs, outputs) -> None:
    frame, invokes = inputs[0], inputs[1]
    frames = outputs[0].reshape(-1)[:p.slots * p.frame_bytes]
    frames[:-p.frame_bytes] = frames[p.frame_bytes:].copy()
    frames[-p.frame_bytes:] = frame.reshape(-1)[:p.frame_bytes]
    invokes[0] += 1
    if invokes[0] < p.period:
        raise InvokeEnds
    invokes[0] = 0


KERNELS = {"CIRCULAR_BUFFER": circular_buffer}
