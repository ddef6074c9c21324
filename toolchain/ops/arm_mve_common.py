"""What the kernels for Helium (MVE, the M-profile vector extension: cortex-m55) share across
op families: the pointwise matrix multiply on 128-bit vectors.

The pointwise matrix multiply of toolchain/ops/arm_dsp_common.py (int8 FULLY_CONNECTED, and
CONV_2D with a 1x1 filter at any stride): each output is its channel's folded sum (bias + input
offset * the filter row's sum) plus the dot product of the pixel's int8 inputs with the filter
row, which `vmladavaq_s8` accumulates sixteen products at a time into one int32 (the tail of a
row under a lane predicate, `vctp8q`, the lanes past it read as 0). Two output channels a step
share each load of the inputs. The filter rows are padded with zeros to a multiple of sixteen at
generation time; the requantization is the DSP kernels', so the sums and the outputs are theirs,
bit for bit. The C uses the ACLE intrinsics of <arm_mve.h>; templates/c/arm_mve.c.j2 lays it
out. The kernels sit in their families' folders (toolchain/ops/{conv,fully_connected}/arm_mve.py).
"""

from __future__ import annotations

import numpy as np

from toolchain.ops.arm_dsp_common import Matmul, output_helpers, output_values, sum_of
from toolchain.ops.emit import (
    ConstantLoop,
    OpContext,
    c_array,
    c_comment,
    c_length,
    c_offset,
    c_sum,
    written_vars,
)

MVE_TARGETS = ("cortex-m55",)
TEMPLATE = "c/arm_mve.c.j2"
LANES = 16  # int8 values a vector holds


def mve_values(ctx: OpContext, m: Matmul, stage, what: str) -> dict:
    prefix = ctx.prefix
    row = -(-m.depth // LANES) * LANES
    padded = np.zeros((m.channels, row), np.int64)
    padded[:, :m.depth] = m.weights
    tables, output, output_comment, stage_calls = output_values(
        prefix, stage, (m.sums(), f"{what}: per output channel, bias + input offset * the "
                                  "filter row's sum (int32, wrapped)"))
    tables = [
        {"name": f"{prefix}_filter", "ctype": "int8_t", "align": "ARENAC_ALIGN(16) ",
         "length": c_length(padded.size), "data": c_array(padded.ravel()),
         "comment": c_comment(f"{what}: the filter ({m.channels} x {m.depth}), each row padded "
                              f"with zeros to {row}")},
        *tables,
    ]
    batches, rows, pixels = (ConstantLoop("b", m.batches), ConstantLoop("r", m.rows),
                             ConstantLoop("p", m.pixels))
    pairs = ConstantLoop("c", m.channels - m.channels % 2, 0, 2)
    odd = ConstantLoop("c", m.channels, m.channels - m.channels % 2)
    full = m.depth // LANES
    steps = ConstantLoop("k", full * LANES, 0, LANES)
    out_at = c_offset("out", [(batches, m.rows * m.pixels * m.channels),
                              (rows, m.pixels * m.channels), (pixels, m.channels)])
    x_at = c_offset("x", [(batches, m.image_in), (rows, m.row_in), (pixels, m.pixel_in)])
    return {
        "fn": ctx.fn, "prefix": prefix, "tables": tables,
        "output_comment": c_comment(f"Output channel c from its sum: {output_comment}"),
        "output": output, "x": ctx.inputs[0].ptr, "out": ctx.outputs[0].ptr,
        "batches": batches, "rows": rows, "pixels": pixels, "pairs": pairs, "odd": odd,
        "steps": steps, "tail": m.depth % LANES, "row": row, "x_at": x_at, "out_at": out_at,
        "tail_at": f" + {full * LANES}" if full else "",
        "counters": written_vars([batches, rows, pixels, pairs, odd, steps]),
        "comment": c_comment(
            f"{what} for Helium: a matrix multiply of {m.batches * m.rows * m.pixels} pixels of "
            f"{m.depth} values by {m.channels} filter rows, pixel by pixel and two output "
            "channels at a time, each vmladavaq_s8 adding sixteen products"),
        "pixel_head": [f"const int8_t *xp = {x_at};"], "patch": None, "windows": None,
        "sum_pair": [sum_of(prefix, tables, pairs.index),
                     sum_of(prefix, tables, c_sum([(pairs, 1)], 1))],
        "sum_odd": sum_of(prefix, tables, odd.index),
        "helpers": tuple(sorted(output_helpers(tables, output) | stage_calls)),
    }
