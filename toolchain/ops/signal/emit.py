"""C emitters for TFLite Micro's signal ops, from the same params as runtime_py (prepare.py, whose
docstring states each op's arithmetic); templates/c/signal.c.j2 lays them out, one macro per op.
`emitter` builds the emitter of an op whose C is one macro of pointers, params and loops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from toolchain.ops.emit import (
    FFT_SCALARS,
    ConstantLoop,
    Emitter,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_length,
    c_offset,
    c_sum,
    render_macro,
    written_vars,
)
from toolchain.ops.signal.prepare import (
    PCAN_OUTPUT_BITS,
    PCAN_SNR_BITS,
    DelayParams,
    EnergyParams,
    FftStage,
    FramerParams,
    OverlapAddParams,
    RfftParams,
    SpectralSubtractionParams,
    WindowParams,
)

TEMPLATE = "c/signal.c.j2"


def _io(ctx: OpContext) -> dict:
    return {"fn": ctx.fn, "prefix": ctx.prefix, "params": ctx.params,
            "inputs": [t.ptr for t in ctx.inputs], "outputs": [t.ptr for t in ctx.outputs],
            "state": list(ctx.state), "name": ctx.outputs[0].name}


def emitter(macro: str, comment: str, helpers: tuple[str, ...] = (),
          values: Callable[[OpContext], dict] | None = None) -> Emitter:
    """An emitter that lays out `macro` with the op's pointers, params, `values(ctx)` (whose
    "loops" are ConstantLoops by name, declared once in "counters") and `comment`, formatted
    with the output's name and the params."""
    def emit(ctx: OpContext) -> Kernel:
        v = {"loops": {}, **_io(ctx), **(values(ctx) if values else {})}
        v["counters"] = written_vars(list(v["loops"].values()))
        v["comment"] = c_comment(comment.format(name=v["name"], p=ctx.params))
        return Kernel(render_macro(TEMPLATE, macro, v), helpers)
    return emit


def each_element(count: Callable[[Any], int]) -> Callable[[OpContext], dict]:
    """The values of a kernel with one loop `i` over `count(params)` elements."""
    def values(ctx: OpContext) -> dict:
        return {"loops": {"i": ConstantLoop("i", count(ctx.params))}}
    return values


def window_values(ctx: OpContext) -> dict:
    p: WindowParams = ctx.params
    i = ConstantLoop("i", p.size)
    return {"loops": {"i": i},
            "weight_index": i.index if p.window == p.size else f"{i.index} % {p.window}"}


def _stage_call(s: FftStage, p: RfftParams, buffer: str, block: str) -> str:
    at = buffer if block == "0" else f"{buffer} + {block} * {2 * s.radix * s.m}"
    kind = "_inverse" if p.inverse and s.radix == 4 else ""
    name = FFT_SCALARS[p.dtype]["name"]
    return f"arenac_{name}_radix{s.radix}{kind}({at}, tw, {s.stride}, {s.m});"


def _rfft_values(ctx: OpContext) -> dict:
    p: RfftParams = ctx.params
    dtype = np.float32 if p.dtype == "float32" else np.int64
    buffer = "out" if p.inverse else "f"
    return {"t": FFT_SCALARS[p.dtype], "kind": ctx.op.kind,
            "order": c_array(p.order), "order_length": c_length(len(p.order)),
            "twiddles": c_array(np.array(p.twiddles, dtype)),
            "twiddles_length": c_length(len(p.twiddles)),
            "supers": c_array(np.array(p.super_twiddles, dtype)),
            "supers_length": c_length(len(p.super_twiddles)),
            "scratch": ctx.scratch[0], "padded": p.input_length < p.fft_length,
            "blocks_declared": any(s.blocks > 1 for s in p.stages),
            "stages": [{"blocks": s.blocks, "call": _stage_call(s, p, buffer, "0"),
                        "call_in_loop": _stage_call(s, p, buffer, "b")} for s in p.stages]}


def _rfft_helpers(p: RfftParams) -> tuple[str, ...]:
    name = FFT_SCALARS[p.dtype]["name"]
    return (f"signal_{name}", *sorted({
        f"signal_{name}_radix{s.radix}{'_inverse' if p.inverse and s.radix == 4 else ''}"
        for s in p.stages}))


def emit_rfft(ctx: OpContext) -> Kernel:
    p: RfftParams = ctx.params
    radices = " x ".join(str(s.radix) for s in reversed(p.stages))
    name = ctx.outputs[0].name
    if p.inverse:
        comment = (f"SignalIrfft '{name}' ({p.dtype}), as TFLite Micro computes it with "
                   f"kiss_fft: each frame's {p.points + 1} bins folded into {p.points} complex "
                   f"points, then their inverse FFT (stages of radix {radices}, the deepest "
                   f"first) into {p.fft_length} samples"
                   + (f", divided by {p.fft_length}" if p.dtype == "float32" else ""))
    else:
        comment = (f"SignalRfft '{name}' ({p.dtype}), as TFLite Micro computes it with "
                   f"kiss_fft: each frame of {p.input_length}"
                   + (f", zero-padded to {p.fft_length}," if p.input_length < p.fft_length
                      else "")
                   + f" goes through a complex FFT of {p.points} points (stages of radix "
                   f"{radices}, the deepest first), then the split into {p.points + 1} bins")
    v = {**_io(ctx), **_rfft_values(ctx), "comment": c_comment(comment)}
    return Kernel(render_macro(TEMPLATE, "rfft", v), _rfft_helpers(p))


def energy_values(ctx: OpContext) -> dict:
    p: EnergyParams = ctx.params
    return {"loops": {"i": ConstantLoop("i", p.end, p.start)}}


def spectral_values(ctx: OpContext) -> dict:
    p: SpectralSubtractionParams = ctx.params
    i = ConstantLoop("i", p.channels)

    def pick(pair: tuple[int, int]) -> str:
        even, odd = pair
        return f"{even}u" if even == odd else f"({i.index} & 1) ? {odd}u : {even}u"
    return {"loops": {"i": i}, "smoothing": pick(p.smoothing),
            "rest": pick(p.one_minus_smoothing)}


def pcan_values(ctx: OpContext) -> dict:
    return {"loops": {"i": ConstantLoop("i", ctx.params.channels)},
            "shrink_below": 2 << PCAN_SNR_BITS,
            "square_shift": 2 + 2 * PCAN_SNR_BITS - PCAN_OUTPUT_BITS,
            "linear_shift": PCAN_SNR_BITS - PCAN_OUTPUT_BITS,
            "linear_offset": 1 << PCAN_OUTPUT_BITS}


def log_values(ctx: OpContext) -> dict:
    return {"loops": {"i": ConstantLoop("i", ctx.params.channels)},
            "scale": f"{ctx.params.output_scale & 0xFFFFFFFF}u"}


def delay_values(ctx: OpContext) -> dict:
    p: DelayParams = ctx.params
    r, i = ConstantLoop("r", p.rows), ConstantLoop("i", p.frame)
    if p.delay > p.frame:
        keep = [f"memmove(h, h + {p.frame}, {p.delay - p.frame} * sizeof *h);",
                f"memcpy(h + {p.delay - p.frame}, xr, {p.frame} * sizeof *h);"]
    else:
        keep = [f"memcpy(h, xr + {p.frame - p.delay}, {p.delay} * sizeof *h);"]
    sample = (f"h[{i.index}]" if p.delay >= p.frame else
              f"{i.index} < {p.delay} ? h[{i.index}] : xr[{c_sum([(i, 1)], -p.delay)}]")
    return {"loops": {"r": r, "i": i}, "keep": keep, "sample": sample,
            "row_x": c_offset("x", [(r, p.frame)]), "row_out": c_offset("out", [(r, p.frame)]),
            "row_held": c_offset("held", [(r, p.delay)])}


def framer_values(ctx: OpContext) -> dict:
    p: FramerParams = ctx.params
    r, f = ConstantLoop("r", p.rows), ConstantLoop("f", p.frames)
    return {"loops": {"r": r, "f": f}, "row_held": c_offset("held", [(r, p.capacity)]),
            "frame_at": c_sum([(r, p.frames * p.size), (f, p.size)]),
            "step_at": c_sum([(r, p.frames * p.step), (f, p.step)])}


def stacker_values(ctx: OpContext) -> dict:
    return {"loops": {"k": ConstantLoop("k", ctx.params.left)}}


def overlap_add_values(ctx: OpContext) -> dict:
    p: OverlapAddParams = ctx.params
    r, f, i = ConstantLoop("r", p.rows), ConstantLoop("f", p.frames), ConstantLoop("i", p.size)
    at = i.index
    if p.dtype == "float32":
        add = f"acc[{at}] += xf[{at}];"
    else:
        add = (f"acc[{at}] = (int16_t)(sum < INT16_MIN ? INT16_MIN : (sum > INT16_MAX ? "
               "INT16_MAX : sum));")
    return {"loops": {"r": r, "f": f, "i": i}, "ctype": ctx.inputs[0].ctype, "add": add,
            "integer": p.dtype == "int16", "row_sums": c_offset("sums", [(r, p.size)]),
            "frame_at": c_sum([(r, p.frames * p.size), (f, p.size)]),
            "step_at": c_sum([(r, p.frames * p.step), (f, p.step)])}
