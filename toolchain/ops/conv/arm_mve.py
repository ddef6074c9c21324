"""The convolutions' kernels for Helium (cortex-m55), from the params of the portable ones and
the DSP kernels' acceptance, sums and output stage (arm_dsp.py): a 1x1 CONV_2D as the pointwise
matrix multiply of toolchain/ops/arm_mve_common.py, any other filter through im2col, and
DEPTHWISE_CONV_2D four channels a vector.

The pointwise kernel reads a pixel's inputs while it writes its outputs, pixel after pixel:
`pointwise_overlaps` declares what that order makes safe.
"""

from __future__ import annotations

import numpy as np

from toolchain.ir import Graph, Operator
from toolchain.numerics.fixedpoint import wrap_int32
from toolchain.ops import overlaps
from toolchain.ops.arm_dsp_common import kernel_definitions, output_helpers, output_values
from toolchain.ops.arm_mve_common import MVE_TARGETS, TEMPLATE, mve_values
from toolchain.ops.conv.arm_dsp import (
    accepts_conv,
    accepts_depthwise,
    accepts_im2col,
    conv_matmul,
    conv_output,
    depthwise_of,
    im2col_of,
    window_values,
)
from toolchain.ops.conv.prepare import ConvParams
from toolchain.ops.emit import (
    ConstantLoop,
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
from toolchain.ops.overlaps import OverlapRule
from toolchain.ops.spec import MemoryRequest, TargetKernel, kernels


def pointwise_overlaps(graph: Graph, op: Operator, p: ConvParams) -> list[OverlapRule]:
    """The output may start `shift` bytes below the input: while it writes the outputs of a
    pixel (those of every pixel before it written already) the kernel still reads that pixel's
    inputs, and later those of the pixels after it (int8: bytes are elements)."""
    m = conv_matmul(p)
    pixels = m.batches * m.rows * m.pixels
    shift = max((i + 1) * m.channels - m.input_at(i) for i in range(pixels))
    return [OverlapRule(0, 0, max(shift, 0), kind="windowed")]


def emit_conv(ctx: OpContext) -> Kernel:
    p: ConvParams = ctx.params
    m = conv_matmul(p)
    values = mve_values(ctx, m, conv_output(m, p.output), f"CONV_2D '{ctx.outputs[0].name}' 1x1")
    return Kernel(render_macro(TEMPLATE, "pointwise", values), values["helpers"],
                  includes=("arm_mve.h", "arm_acle.h"),
                  definitions=kernel_definitions(values))


def im2col_scratch(p) -> tuple[MemoryRequest, ...]:
    return (MemoryRequest(im2col_of(p).matmul.depth, "the window of one pixel as int8"),)


def emit_im2col(ctx: OpContext) -> Kernel:
    """Any other filter and stride: each pixel's window copied into the scratch (arm_dsp's
    window functions: the padding the input zero point), then the pointwise dot products."""
    p = ctx.params
    d = im2col_of(p)
    m = d.matmul
    opcode = "CONV_2D" if isinstance(p, ConvParams) else "DEPTHWISE_CONV_2D of one channel"
    what = f"{opcode} '{ctx.outputs[0].name}' {d.kh}x{d.kw}"
    values = mve_values(ctx, m, conv_output(m, p.output), what)
    batches, rows, pixels = (ConstantLoop("b", d.batches), ConstantLoop("r", d.out_h),
                             ConstantLoop("p", d.out_w))
    row_out = d.out_w * m.channels
    image = d.height * d.width * d.depth
    values.update({
        "batches": batches, "rows": rows, "pixels": pixels,
        "out_at": c_offset("out", [(batches, d.out_h * row_out), (rows, row_out),
                                   (pixels, m.channels)]),
        "pixel_head": ["const int8_t *xp = window;",
                       f"{ctx.prefix}_window(window, {c_offset('x', [(batches, image)])}, "
                       f"{c_sum([(rows, d.stride[0])], -d.padding[0])}, "
                       f"{c_sum([(pixels, d.stride[1])], -d.padding[1])});"],
        "patch": window_values(ctx.prefix, d, (), True), "windows": ctx.scratch[0],
        "counters": written_vars([batches, rows, pixels, values["pairs"], values["odd"],
                                  values["steps"]]),
        "comment": c_comment(
            f"{what} for Helium, output row by output row and pixel by pixel: the pixel's "
            f"window of {m.depth} values copied into the arena (the padding the input zero "
            "point), then its dot products with the filter rows two output channels at a time, "
            "each vmladavaq_s8 adding sixteen products"),
    })
    return Kernel(render_macro(TEMPLATE, "pointwise", values), values["helpers"],
                  includes=("arm_mve.h", "arm_acle.h"),
                  definitions=kernel_definitions(values))


def emit_depthwise(ctx: OpContext) -> Kernel:
    """DEPTHWISE_CONV_2D (depth multiplier 1): per output pixel, four channels a vector of
    int32 lanes; each tap inside the image adds (input + offset) * weight lane by lane
    (vmulq_s32, vaddq_s32), the taps in the padding nothing, as the reference's."""
    p = ctx.params
    d = depthwise_of(p)
    m = d.matmul()
    prefix = ctx.prefix
    vectors = -(-d.channels // 4)
    padded = vectors * 4
    taps = np.zeros((d.kh * d.kw, padded), np.int64)
    taps[:, :d.channels] = d.weights.T
    bias = np.zeros(padded, np.int64)
    bias[:d.channels] = d.bias
    bias = wrap_int32(bias)
    tables, output, output_comment, stage_calls = output_values(prefix, conv_output(m, p.output))
    what = f"DEPTHWISE_CONV_2D '{ctx.outputs[0].name}' {d.kh}x{d.kw}"
    tables = [
        {"name": f"{prefix}_filter", "ctype": "int32_t", "align": "ARENAC_ALIGN(16) ",
         "length": c_length(taps.size), "data": c_array(taps.ravel()),
         "comment": c_comment(f"{what}: per tap (ky, kx), the weights of the {d.channels} "
                              f"channels as int32, padded with zeros to {padded}")},
        {"name": f"{prefix}_bias", "ctype": "int32_t", "align": "ARENAC_ALIGN(16) ",
         "length": c_length(padded), "data": c_array(bias),
         "comment": c_comment(f"{what}: the bias per channel, padded with zeros to {padded}")},
        *tables,
    ]
    tail = d.channels % 4
    lanes = [f"if (c + {j} < {d.channels}) " if tail and j else "" for j in range(4)]
    values = {
        "fn": ctx.fn, "prefix": prefix, "tables": tables, "d": d, "padded": padded,
        "output_comment": c_comment(f"Output channel c from its sum: {output_comment}"),
        "output": output, "x": ctx.inputs[0].ptr, "out": ctx.outputs[0].ptr,
        "offset": m.input_offset, "tail": tail, "lanes": lanes,
        "image": d.height * d.width * d.channels,
        "comment": c_comment(
            f"{what} for Helium, output pixel by output pixel, four channels a vector: each "
            "tap inside the image adds (input + offset) * weight in int32 lanes (vmulq_s32, "
            "vaddq_s32), a tap in the padding nothing"),
        "helpers": tuple(sorted(output_helpers(tables, output) | stage_calls)),
    }
    return Kernel(render_macro(TEMPLATE, "depthwise", values), values["helpers"],
                  includes=("arm_mve.h", "arm_acle.h"),
                  definitions=kernel_definitions(values))


_INT8 = kernels("int8, int8, int32? -> int8", targets=MVE_TARGETS)

TARGET_KERNELS: tuple[TargetKernel, ...] = (
    TargetKernel("CONV_2D", "mve-1x1", _INT8, accepts_conv, emit_conv,
                 overlaps=pointwise_overlaps),
    TargetKernel("CONV_2D", "mve-im2col", _INT8, accepts_im2col, emit_im2col,
                 scratch=im2col_scratch, overlaps=overlaps.convolution),
    TargetKernel("DEPTHWISE_CONV_2D", "mve-im2col", _INT8, accepts_im2col, emit_im2col,
                 scratch=im2col_scratch, overlaps=overlaps.convolution),
    TargetKernel("DEPTHWISE_CONV_2D", "mve-depthwise", _INT8, accepts_depthwise,
                 emit_depthwise, overlaps=overlaps.convolution),
)
