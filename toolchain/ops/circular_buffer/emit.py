"""The C of CIRCULAR_BUFFER: one memmove of the older frames, one memcpy of the new one, and the
count that says whether the invoke goes on; laid out by templates/c/circular_buffer.c.j2."""

from __future__ import annotations

from toolchain.ops.circular_buffer.prepare import CircularBufferParams
from toolchain.ops.emit import Kernel, OpContext, c_comment, render_macro

TEMPLATE = "c/circular_buffer.c.j2"


def emit_circular_buffer(ctx: OpContext) -> Kernel:
    p: CircularBufferParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    how = "TFLite Micro's guess from its shape" if p.guessed else "its cycles_max option"
    comment = (f"CIRCULAR_BUFFER: frame '{x.name}' ({p.frame_bytes} bytes) shifted into "
               f"'{out.name}' ({p.slots} slots, the oldest dropped); the model runs past it "
               f"once every {p.period} invoke{'s' if p.period > 1 else ''} ({how}): returns 1 "
               "when the invoke ends here.")
    return Kernel(render_macro(TEMPLATE, "circular_buffer", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "frames": out.ptr,
        "frame": x.ptr,
        "counter": ctx.state[0],
        "frame_bytes": p.frame_bytes,
        "older_bytes": (p.slots - 1) * p.frame_bytes,
        "period": p.period,
    }), stops=True)
