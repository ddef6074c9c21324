"""DEPTHWISE_CONV_2D (int8, depth multiplier 1) for the Arm DSP extension without scratch: what
the depthwise kernels (arm_dsp.py) give their widened rows up for in a plan held to an arena.

A tap's input at one pixel is `channels` contiguous int8 values, four channels a word. The
kernel reads each word straight from the input and widens it in registers: __sxtb16 gives
channels 0 and 2 as an int16 pair, its rotated form channels 1 and 3. Each lane meets its
channel's weight in one __smlabb or __smlatt (the products are of different channels, so no
__smlad adds them), the filter packed at generation time as the same pairs: per group of four
channels and tap, the words (w0, w2) and (w1, w3).

A row of padding is read from a constant row of the input zero point (whose product with the
input offset added is 0, as the reference's skipped taps). A window over the left or right
padding skips the taps there, its sums started from what those taps add with the zero point
(`padded_sums`), so that every sum is the one the reference computes.
"""

from __future__ import annotations

import numpy as np

from toolchain.ir import Graph, Operator
from toolchain.numerics.fixedpoint import wrap_int32
from toolchain.ops import overlaps
from toolchain.ops.arm_dsp_common import (
    DSP_TARGETS,
    TEMPLATE,
    WORD,
    block_stores,
    kernel_definitions,
    output_helpers,
    output_values,
    parted,
    runs_attribute,
    runs_helpers,
    sum_of,
)
from toolchain.ops.conv.arm_dsp import Depthwise, accepts_depthwise, conv_output, depthwise_of
from toolchain.ops.conv.arm_dsp_direct import edge_call, padded_sums, padding_row
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_function_head,
    c_length,
    c_offset,
    c_sum,
    definition,
    render_macro,
    written_vars,
)
from toolchain.ops.spec import TargetKernel, kernels

MAX_TAPS = 25  # taps of a window written out: a 5x5 filter


def accepts_direct_depthwise(graph: Graph, op: Operator, p) -> str | None:
    """The depthwise convolutions the depthwise kernels run, of two or more whole words of
    channels and of more than one filter row, at most MAX_TAPS taps."""
    refused = accepts_depthwise(graph, op, p)
    if refused:
        return refused
    d = depthwise_of(p)
    if d.channels % 4 or d.channels < 8:
        return "channels that are not two or more whole words (a loop over them)"
    if d.kh < 2:
        return "a filter of one row (the loops over its rows would run once)"
    if d.kh * d.kw > MAX_TAPS:
        return "a filter of more taps than the direct kernel writes out"
    return None


def inside(d: Depthwise) -> tuple[int, int]:
    """The output columns [first, end) whose windows lie in the input row."""
    sw, pl = d.stride[1], d.padding[1]
    columns = [ox for ox in range(d.out_w) if 0 <= ox * sw - pl and ox * sw - pl + d.kw <= d.width]
    return (columns[0], columns[-1] + 1) if columns else (0, 0)


def edge_columns(d: Depthwise) -> list[int]:
    """The output columns left and right of `inside`, in that order."""
    first, end = inside(d)
    if end <= first:
        return list(range(d.out_w))
    return [*range(first), *range(end, d.out_w)]


def packed(d: Depthwise) -> np.ndarray:
    """Per group of four channels, for each tap, the int16 pairs (w0, w2) and (w1, w3) as
    int32 words, the lower half first."""
    w = d.weights.reshape(d.channels // 4, 4, d.kh * d.kw).transpose(0, 2, 1) & 0xFFFF
    return wrap_int32(np.stack([w[..., 0] | (w[..., 2] << 16), w[..., 1] | (w[..., 3] << 16)],
                               axis=-1)).reshape(-1)


def _tap(d: Depthwise, ky: int | str, kx: int | str, tap: int | str) -> list[str]:
    """One tap of a group of four channels from channel c: its input word in the window's row
    ky (rK inside, in[ky] + start at an edge), its weights, the four products."""
    at = f"r{ky}" if isinstance(ky, int) else "in[ky] + start"
    offset = (f" + {kx * d.channels}" if kx else "") if isinstance(kx, int) else \
        f" + {kx} * {d.channels}"
    a, b = ((f"w[{2 * tap}]", f"w[{2 * tap + 1}]") if isinstance(tap, int) else
            (f"w[2 * {tap}]", f"w[2 * {tap} + 1]"))
    # the weight words apart in the run of loads: GCC would pair adjacent ones into an LDRD
    return ["{", f"  const int32_t a = {a};",
            f"  const int32_t v = arenac_load32({at}{offset} + c);",
            f"  const int32_t b = {b};",
            "  const int16x2_t even = __sxtb16(v), odd = arenac_sxtb16_ror8(v);",
            "  acc0 = __smlabb(even, a, acc0);", "  acc2 = __smlatt(even, a, acc2);",
            "  acc1 = __smlabb(odd, b, acc1);", "  acc3 = __smlatt(odd, b, acc3);", "}"]


def _group(prefix: str, d: Depthwise, tables: list[dict], output: list[str], edge: bool
           ) -> list[str]:
    """One pixel's group of four channels from channel c (its outputs at o): the sums, the
    taps, the stores. A pixel inside reads its rows at rK; an edge reads the taps from first
    to end of each row, its sums started from `padded`."""
    taps = d.kh * d.kw
    padded = [f" + padded[c + {q}]" if q else " + padded[c]" for q in range(4)] if edge \
        else [""] * 4
    lines = [f"const int32_t *w = {prefix}_filter + c / 4 * {2 * taps};",
             *(f"int32_t acc{q} = {sum_of(prefix, tables, c_sum([('c', 1)], q))}{padded[q]};"
               for q in range(4))]
    if edge:
        lines += [f"for (ky = 0; ky < {d.kh}; ++ky) {{",
                  "  for (kx = first; kx < end; ++kx) {",
                  *(f"    {line}" for line in _tap(d, "ky", "kx", f"(ky * {d.kw} + kx)")),
                  "  }", "}"]
    else:
        for ky in range(d.kh):
            for kx in range(d.kw):
                lines += _tap(d, ky, kx, ky * d.kw + kx)
    lines += block_stores(prefix, output, [(f"o[{c_sum([('c', 1)], q)}]", f"acc{q}",
                                            c_sum([('c', 1)], q)) for q in range(4)])
    return lines


def emit_direct_depthwise(ctx: OpContext) -> Kernel:
    p = ctx.params
    d = depthwise_of(p)
    prefix = ctx.prefix
    m = d.matmul()
    what = f"DEPTHWISE_CONV_2D '{ctx.outputs[0].name}' {d.kh}x{d.kw}"
    tables, output, output_comment, stage_calls = output_values(
        prefix, conv_output(m, p.output),
        (m.sums(), f"{what}: per channel, bias + input offset * the filter's sum (int32, "
                   "wrapped)"))
    parts = parted(output, ctx.target)  # the stages its stores part, if any
    filt = packed(d)
    zero_point = -d.input_offset
    row_values = d.width * d.channels
    own = [{"name": f"{prefix}_filter", "ctype": "int32_t", "align": "",
            "length": c_length(filt.size), "data": c_array(filt, 8),
            "comment": c_comment(
                f"{what}: per group of four channels, for each tap, the int16 pairs of "
                "weights (w0, w2) and (w1, w3), the lower half first")}]
    padding = padding_row(prefix, d, what, row_values, zero_point)
    own += padding
    edges = edge_columns(d)
    if edges:
        taps = d.weights.reshape(d.channels, d.kh, d.kw).sum(axis=1)  # [channels, kw]
        padded = padded_sums(d, taps, edges, -d.input_offset)
        own.append({"name": f"{prefix}_padded", "ctype": "int32_t", "align": "",
                    "length": c_length(padded.size), "data": c_array(padded, 8),
                    "comment": c_comment(
                        f"{what}: per edge column (left, then right) and channel, the input "
                        "zero point times the filter's taps over the padding columns, which "
                        "the edge skips")})
    tables = [*own, *tables]
    sh, sw = d.stride
    pt, pl = d.padding
    first, end = inside(d)
    batches, out_rows = ConstantLoop("b", d.batches), ConstantLoop("oy", d.out_h)
    row_out = d.out_w * d.channels
    columns = ConstantLoop("ox", end, first)
    left = ConstantLoop("ox", first if end > first else d.out_w)
    right = ConstantLoop("ox", d.out_w, end if end > first else d.out_w)

    values = {
        "parted": bool(parts),
        "fn": ctx.fn, "prefix": prefix, "tables": tables, "d": d,
        "output_comment": c_comment(f"Output channel c from its sum: {output_comment}"),
        "output": output, "x": ctx.inputs[0].ptr, "out": ctx.outputs[0].ptr,
        "comment": c_comment(
            f"{what} for the Arm DSP extension, output row by output row, without scratch: "
            "each tap's four channels read from the input as a word and widened in "
            "registers, each lane's product added by __smlabb or __smlatt"),
        "edge_comment": c_comment(
            f"{what}: the output pixel at o of the window from input column ix of the rows "
            "in[] that reaches past them: the taps over the padding skipped, its sums "
            "started from `padded`, what they add"),
        "edge_head": c_function_head(
            f"{runs_attribute(ctx.target)} static void {prefix}_edge",
            ["const int8_t *const *in", "int8_t *o", "int ix", "const int32_t *padded"]),
        "padding": padding[0]["name"] if padding else None,
        "iy": c_sum([(out_rows, sh), ("ky", 1)], -pt), "row_values": row_values,
        "columns": columns, "start": c_sum([(columns, sw * d.channels)], -pl * d.channels),
        "o": c_offset("orow", [(columns, d.channels)]),
        "rows": "const int8_t " + ", ".join(f"*r{ky} = in[{ky}] + start"
                                            for ky in range(d.kh)) + ";",
        "group": _group(prefix, d, tables, parts, False),
        "edge_group": _group(prefix, d, tables, parts, True),
        "left": [{"loop": left, "call": edge_call(prefix, left, 0, d.channels, sw, pl, True)}]
        if left.runs else [],
        "right": [{"loop": right, "call": edge_call(prefix, right, left.trips, d.channels, sw,
                                                    pl, True)}] if right.runs else [],
        "batches": batches, "out_rows": out_rows,
        "orow": c_offset("out", [(batches, d.out_h * row_out), (out_rows, row_out)]),
        "xb": c_offset("x", [(batches, d.height * row_values)]),
        "counters": written_vars([batches, out_rows, left, columns, right]),
        "attribute": runs_attribute(ctx.target),
        "helpers": tuple(sorted({"arm_dsp", "arm_dsp_ror8", *runs_helpers(ctx.target)}
                                | output_helpers(tables, output) | stage_calls)),
    }
    functions = [definition(f"{prefix}_edge", render_macro(TEMPLATE, "depthwise_direct_edge",
                                                           values), gap=True)] if edges else []
    return Kernel(render_macro(TEMPLATE, "depthwise_direct", values), values["helpers"],
                  includes=("arm_acle.h",), definitions=kernel_definitions(values, *functions))


# After the depthwise kernels (toolchain/ops/conv/__init__.py), whose form without scratch it
# is. It reads input rows as the portable depthwise convolution does, row by row of the output.
TARGET_KERNELS: tuple[TargetKernel, ...] = (
    TargetKernel("DEPTHWISE_CONV_2D", "dsp-depthwise-direct",
                 kernels("int8, int8, int32? -> int8", targets=DSP_TARGETS),
                 accepts_direct_depthwise, emit_direct_depthwise, overlaps=overlaps.convolution,
                 scratch_alignment=WORD, narrows=("dsp-depthwise", "dsp-depthwise-narrow")),
)
