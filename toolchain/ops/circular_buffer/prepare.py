"""CIRCULAR_BUFFER, TFLite Micro's streaming buffer (its custom op): every invoke shifts the
frames of its output one slot towards the start, dropping the oldest, and writes the input
frame into the last slot; then, unless `period` invokes have passed since it last let the model
run, it ends the invoke there (TFLite Micro's kTfLiteAbort): the ops after it wait for a later
invoke, and the model's outputs are left as they were.

Its output keeps the frames from one invoke to the next, so it must be a variable tensor (its
zero point after a reset, as TFLite Micro refills one). The period is the `cycles_max` option;
without one, TFLite Micro's Prepare guesses it from the output's shape for the two streaming
models it was written for: 1 for 5, 13 or 25 slots, else 2, and 1 again for the fifth buffer
of 2 x 96 frames it guesses for in a process, counted here in the model's order (as a fresh
process running this model counts them).
"""

from __future__ import annotations

from dataclasses import dataclass

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import Graph, Operator
from toolchain.ops.spec import StateRequest

OP = "CIRCULAR_BUFFER"
# Slot counts for which TFLite Micro's Prepare guesses a period of 1, and the frame shape whose
# fifth guess (in one process) gets 1 too.
PERIOD_ONE_SLOTS = (5, 13, 25)
FIFTH_GUESS_FRAME = (2, 96)


@dataclass(frozen=True)
class CircularBufferParams:
    """`slots` frames of `frame_bytes` int8 values in the output; the model runs past the op
    once every `period` invokes (`guessed`: the period is TFLite Micro's guess, no option)."""

    slots: int
    frame_bytes: int
    period: int
    guessed: bool


def prepare_circular_buffer(graph: Graph, op: Operator) -> CircularBufferParams:
    x, out = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    if len(x.shape) != 4 or len(out.shape) != 4:
        raise UnsupportedOpError(f"input {list(x.shape)} and output {list(out.shape)} must be "
                                 "4-D, [1, 1, h, w] and [1, slots, h, w]")
    if (x.shape[0], x.shape[1], x.shape[2], x.shape[3]) != (out.shape[0], 1, *out.shape[2:]):
        raise ModelError(f"input {list(x.shape)} is not one frame of output {list(out.shape)} "
                         "(TFLite Micro requires [b, 1, h, w] into [b, slots, h, w])")
    if not out.is_variable:
        raise UnsupportedOpError(f"output {out.name!r} is not a variable tensor: it keeps the "
                                 "frames between invokes (TFLite Micro keeps them there too)")
    if graph.index != 0:
        raise UnsupportedOpError("in a called subgraph: it ends the invoke of the main graph")
    period, guessed = _period(graph, op)
    return CircularBufferParams(out.shape[1], out.shape[2] * out.shape[3], period, guessed)


def _period(graph: Graph, op: Operator) -> tuple[int, bool]:
    options = op.options
    if options:
        first = sorted(options)[0]
        if first != "cycles_max" or not isinstance(options[first], int) or isinstance(
                options[first], bool):
            raise UnsupportedOpError("TFLite Micro reads the first option as an integer "
                                     f"cycles_max; this one is {first!r}")
        if options[first] > 0:
            return options[first], False
    guesses = 0
    for other in graph.operators[:op.index + 1]:
        if other.kind == OP and not _has_period(other):
            out = graph.tensors[other.outputs[0]].shape
            guesses += 1
            if out[1] in PERIOD_ONE_SLOTS or (guesses == 5 and tuple(out[2:]) == FIFTH_GUESS_FRAME):
                guesses = 0
                if other.index == op.index:
                    return 1, True
    return 2, True


def _has_period(op: Operator) -> bool:
    value = op.options.get("cycles_max") if op.options else None
    return isinstance(value, int) and value > 0


def state_of(p: CircularBufferParams) -> tuple[StateRequest, ...]:
    return (StateRequest("int32", (1,), "invokes since the model last ran past the buffer"),)
