"""C emitters for CONV_2D, DEPTHWISE_CONV_2D and TRANSPOSE_CONV (NHWC), from the same params as
runtime_py (toolchain/ops/conv.py); templates/c/conv.c.j2 lays the loops out.

Every kernel works one output pixel at a time: it sums the pixel's output channels into a small
stack array of accumulators, then turns the array into outputs in one pass (requantization for
int8, bias and clamp for float32), a pass GCC vectorizes. Stack: at most MAX_STACK_BYTES for
the accumulators plus as much for CONV_2D's column.

- CONV_2D gathers the pixel's receptive field once into a stack column (int16 `input +
  input_offset` for int8, so padding is simply 0; float for float32), then takes one dot product
  per output channel with its filter row, which OHWI stores contiguously in the column's
  (ky, kx, c) order; four output channels share each column load. When the depth is not a
  multiple of VECTOR_STEP, the dot products read an int16 copy of the filter with rows padded
  to a multiple of WIDE_STEP (so they vectorize; the copy's flash cost is in a comment). A 1x1
  convolution never pads: its column is the pixel's channels. A receptive field too large for
  the stack falls back to direct loops over the window.
- DEPTHWISE_CONV_2D adds tap after tap into the accumulators, channels innermost and contiguous
  in both the input and the [1, kh, kw, oc] filter. Taps outside the image are skipped (they
  add real zero); pixels whose window lies inside the image take one unrolled pass, and with
  fewer than 16 int8 channels (stride 1) several such pixels share one vector.
- TRANSPOSE_CONV gathers instead of scattering (no int32 scratch plane): each output pixel sums
  the input pixels whose kh x kw patch covers it.

int8 requantization is TFLite's MultiplyByQuantizedMultiplier recast in unsigned arithmetic with
shifts by constants only, which SSE2 vectorizes (see requantize_constants); it is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolchain.codegen.context import OpContext, c_array, c_float, c_length, family_macro
from toolchain.errors import UnsupportedOpError
from toolchain.ops.conv import ConvParams, DepthwiseConvParams, FloatClamp, Requantize

TEMPLATE = "c/conv.c.j2"
# Bytes of stack one array of a kernel (the column, the accumulators) may take: the planner does
# not see the stack, so keep it small and bounded.
MAX_STACK_BYTES = 4096
# int8 dot products vectorize when their length is a multiple of this (GCC's -O2 vectorizer
# refuses loops that would need a scalar epilogue; int8 data vectorizes 16 at a time) ...
VECTOR_STEP = 16
# ... and int16 ones when it is a multiple of this.
WIDE_STEP = 8
# float dot products keep this many partial sums: a float reduction only vectorizes that way.
FLOAT_LANES = 8
# Output channels whose dot products share each column load.
OUTPUT_BLOCK = 4
# Depthwise windows of up to this many taps get an unrolled pass for interior pixels.
MAX_UNROLLED_TAPS = 25
INT32_MAX = 2**31 - 1
# |(int8 + input_offset) * int8 filter|, the offset being minus an int8 zero point.
MAX_PRODUCT = 255 * 128


@dataclass(frozen=True)
class RequantizeConstants:
    """Per output channel, the constants of the int8 output stage (see requantize_constants)."""

    left: list[int]  # 2^left_shift, applied to the accumulator first (1 almost always)
    mult: list[int]  # TFLite's quantized multiplier m
    negative: list[int]  # 1 when the rounding shift n >= 1 (it rounds negative halves down)
    scale: list[int]  # 2^(31-n)


def requantize_constants(stage: Requantize) -> RequantizeConstants:
    """TFLite's MultiplyByQuantizedMultiplier(x, m, shift) with n = max(-shift, 0):
    t = SaturatingRoundingDoublingHighMul(x, m), then q = RoundingDivideByPOT(t, n).

    For m >= 0 (QuantizeMultiplier gives 0 or [2^30, 2^31)), t = floor((x * m + 2^30) / 2^31)
    (runtime_py.kernels.conv.requantize), so |t| <= m < 2^31, and for n >= 1
    q = floor((t + 2^(n-1) - [t < 0]) / 2^n). In unsigned arithmetic with shifts by constants
    only (so SSE2 vectorizes it: two 32 x 32 -> 64-bit multiplies, the rest 32-bit):

      ((x + 2^31) * m + 2^30) >> 31             = t + m, in [0, 2^32); no overflow: < 2^63
      t' = that - m (mod 2^32)                  = t as int32, whose bit 31 is [t < 0]
      v = t' + 2^31 - negative * (t' >> 31)     = t + 2^31 - [t < 0], in [0, 2^32)
      (v * scale + 2^30) >> 31                  = floor((v + 2^(n-1)) / 2^n), scale = 2^(31-n)
                                                = q + 2^(31-n), as 2^n divides 2^31

    so q = that - scale (mod 2^32, read as int32); v * scale + 2^30 < 2^63. For n = 0
    (negative = 0, scale = 2^31) the same steps give floor(v + 1/2) - 2^31 = t = q. m = 0 gives
    t = q = 0 for any n; such channels take n = 1 like most.
    """
    left, mult, negative, scale = [], [], [], []
    for m, s in zip(stage.multipliers.tolist(), stage.shifts.tolist()):
        if not (0 <= m < 2**31 and -31 <= s <= 31):
            raise UnsupportedOpError(f"requantization multiplier {m} with shift {s}")
        n = max(-s, 1 if m == 0 else 0)
        left.append(1 << max(s, 0))
        mult.append(m)
        negative.append(1 if n else 0)
        scale.append(1 << (31 - n))
    return RequantizeConstants(left, mult, negative, scale)


def requantize_values(ctx: OpContext, stage: Requantize, count: int,
                      repeat: bool = False) -> dict:
    """The template's `requantize` macro: a function turning `count` accumulators (output
    channels o0 ...) into int8. Its loop runs a multiple of VECTOR_STEP times so that it
    vectorizes: the accumulator array is padded (and written through a padded `tail` array) and
    per-channel tables are padded with zeros. With `repeat`, the tables repeat the channels
    over all lanes instead (lane i is channel i % count; o0 is then always 0)."""
    k = requantize_constants(stage)
    padded = -(-count // VECTOR_STEP) * VECTOR_STEP
    extra = padded - count
    exprs, tables = {}, []
    for name, values in [("left", k.left), ("mult", k.mult), ("negative", k.negative),
                         ("scale", k.scale)]:
        if len(set(values)) == 1:
            exprs[name] = f"{values[0]}u"
            continue
        exprs[name] = f"{ctx.prefix}_{name}[o0 + o]"
        data = [values[i % count] for i in range(padded)] if repeat else values + [0] * extra
        tables.append({"name": f"{ctx.prefix}_{name}", "length": c_length(len(data)),
                       "data": c_array(data)})
    low, high = stage.clamp
    zero_point = stage.output_zero_point
    return {
        "fn": f"{ctx.prefix}_requantize",
        "count": count,
        "padded": padded,
        "tables": tables,
        "left": None if exprs["left"] == "1u" else exprs["left"],
        "mult": exprs["mult"],
        "negative": exprs["negative"],
        # clamp(q + zp, lo, hi) == clamp(q, lo - zp, hi - zp) + zp, with no int32 overflow
        "clamp_min": low - zero_point,
        "clamp_max": high - zero_point,
        "zero_point": zero_point,
        "scale": exprs["scale"],
    }


def _plus(value: int) -> str:
    """` + v` / ` - v` / `` for adding a constant in C text."""
    return f" + {value}" if value > 0 else f" - {-value}" if value < 0 else ""


def _int_accumulator(products: int) -> str:
    """int32_t when the sum of `products` int8 products cannot overflow (what vectorizes best);
    otherwise uint32_t, which wraps as TFLite's int32 accumulator does in practice."""
    return "int32_t" if products * MAX_PRODUCT <= INT32_MAX else "uint32_t"


def _block(total: int, per_item_bytes: int) -> int:
    """The largest divisor of `total` whose items fit MAX_STACK_BYTES."""
    fit = max(1, MAX_STACK_BYTES // per_item_bytes)
    return max(d for d in range(1, min(total, fit) + 1) if total % d == 0)


def _interior(window, input_shape: tuple[int, ...], output_shape: tuple[int, ...]) -> str | None:
    """The C condition on (oy, ox) for the whole window to lie inside the image, or None when
    no output pixel's does."""
    terms = []
    for var, size, out, k, s, d, pad in zip(("oy", "ox"), input_shape[1:3], output_shape[1:3],
                                            window.filter, window.stride, window.dilation,
                                            window.padding):
        low = -(-pad // s)  # the first output whose window starts inside
        high = min(out, (size - 1 - (k - 1) * d + pad) // s + 1)  # past the last that ends inside
        if low >= high:
            return None
        terms += [f"{var} >= {low}"] if low > 0 else []
        terms += [f"{var} < {high}"] if high < out else []
    return " && ".join(terms) or "1"


def _common(ctx: OpContext, x_index: int, bias_index: int, count: int,
            repeat: bool = False) -> dict:
    """Geometry, pointers and the output stage for `count` accumulators."""
    p = ctx.params
    x, out = ctx.inputs[x_index], ctx.outputs[0]
    bias = ctx.inputs[bias_index] if len(ctx.inputs) > bias_index else None
    batch, height, width, channels = p.input_shape
    _, out_h, out_w, out_channels = p.output_shape
    window = p.window
    is_float = isinstance(p.output, FloatClamp)
    v = {
        "fn": ctx.fn,
        "prefix": ctx.prefix,
        "comment": f"{ctx.op.opcode} '{out.name}'",
        "is_float": is_float,
        "ctype": x.ctype,
        "x": x.ptr,
        "w": ctx.inputs[1].ptr,
        "bias": bias.ptr if bias is not None else None,
        "out": out.ptr,
        "batch": batch,
        "height": height,
        "width": width,
        "channels": channels,
        "out_h": out_h,
        "out_w": out_w,
        "out_channels": out_channels,
        "filter_h": window.filter[0],
        "filter_w": window.filter[1],
        "stride_h": window.stride[0],
        "stride_w": window.stride[1],
        "dilation_h": window.dilation[0],
        "dilation_w": window.dilation[1],
        "pad_top": window.padding[0],
        "pad_left": window.padding[1],
        "input_offset": _plus(p.input_offset),
        "count": count,
    }
    if is_float:
        low, high = p.output.clamp
        v.update(act_min=c_float(low), act_max=c_float(high), rq=None, acc_size=count)
    else:
        rq = requantize_values(ctx, p.output, count, repeat)
        v.update(rq=rq, acc_size=rq["padded"])
    return v


# -- CONV_2D -----------------------------------------------------------------------------------


def conv_values(ctx: OpContext) -> dict:
    p: ConvParams = ctx.params
    _, _, _, channels = p.input_shape
    out_channels = p.output_shape[3]
    kh, kw = p.window.filter
    groups = p.groups
    depth = kh * kw * (channels // groups)
    is_float = isinstance(p.output, FloatClamp)
    # the column path keeps one pixel's accumulators and column on the stack (and sums at most
    # that many int8 products in an int32)
    column = (4 * out_channels <= MAX_STACK_BYTES
              and (4 if is_float else 2) * depth <= MAX_STACK_BYTES
              and depth * MAX_PRODUCT <= INT32_MAX)
    count = out_channels if column else _block(out_channels, 4)
    v = _common(ctx, 0, 2, count)
    group_outputs = out_channels // groups
    v.update(
        column=column,
        groups=groups,
        group_channels=channels // groups,
        group_outputs=group_outputs,
        depth=depth,
        pointwise=kh == kw == 1,
        # interior windows copy whole rows (contiguous without groups or horizontal dilation)
        # when the pixels' channels do not make whole vectors anyway
        row_copy=_interior(p.window, p.input_shape, p.output_shape)
        if groups == 1 and p.window.dilation[1] == 1 and channels % VECTOR_STEP != 0 else None,
        block=OUTPUT_BLOCK,
        blocked_outputs=group_outputs - group_outputs % OUTPUT_BLOCK,
        acc_type="float" if is_float else _int_accumulator(depth),
        lanes=list(range(FLOAT_LANES)),
        depth_main=depth - depth % FLOAT_LANES,
    )
    if v["pointwise"] and (v["pad_top"] or v["pad_left"]):
        raise UnsupportedOpError("a 1x1 convolution with padding")
    wide = not is_float and depth % VECTOR_STEP != 0
    v["col_size"] = -(-depth // WIDE_STEP) * WIDE_STEP if wide else depth
    if wide:
        rows = np.zeros((out_channels, v["col_size"]), np.int16)
        # weights: [group, (ky, kx, c), output in group] -> [output, (ky, kx, c)]
        rows[:, :depth] = p.weights.transpose(0, 2, 1).reshape(out_channels, depth)
        v.update(wide=c_array(rows), wide_bytes=rows.nbytes, wide_length=c_length(rows.size),
                 w_rows=f"{ctx.prefix}_w16",
                 w_type="int16_t")
    else:
        v.update(wide=None, w_rows="w", w_type=v["ctype"])
    return v


def emit_conv_2d(ctx: OpContext) -> str:
    v = conv_values(ctx)
    return family_macro(TEMPLATE, "conv_column" if v["column"] else "conv_direct")(v)


# -- DEPTHWISE_CONV_2D -------------------------------------------------------------------------


def depthwise_values(ctx: OpContext) -> dict:
    p: DepthwiseConvParams = ctx.params
    multiplier = p.depth_multiplier
    channels = p.input_shape[3]
    # input channels per pass: their accumulators (block * multiplier) fit the stack
    block = _block(channels, 4 * multiplier)
    kh, kw = p.window.filter
    taps = kh * kw
    is_float = isinstance(p.output, FloatClamp)
    unrolled = multiplier == 1 and taps <= MAX_UNROLLED_TAPS
    # int8 with fewer channels than a vector: `span` horizontally adjacent interior pixels fill
    # the vector together (stride 1: their channels are contiguous in the input too)
    span = 1
    if (unrolled and not is_float and channels < VECTOR_STEP and VECTOR_STEP % channels == 0
            and p.window.stride[1] == 1 and p.output_shape[2] >= VECTOR_STEP // channels):
        span = VECTOR_STEP // channels
    v = _common(ctx, 0, 2, block * multiplier, repeat=span > 1)

    def tap_terms(filter_stride: int) -> list[str]:
        """The products of an interior pixel's taps, in (ky, kx) order: tap (ky, kx) reads the
        input and the filter at constant offsets from the window's first pixel and from the
        first tap."""
        terms = []
        for ky in range(kh):
            for kx in range(kw):
                at = (ky * v["dilation_h"] * v["width"] + kx * v["dilation_w"]) * channels
                tap = (ky * kw + kx) * filter_stride
                x_term = f"xp[{at} + c]" if at else "xp[c]"
                w_term = f"wp[{tap} + c]" if tap else "wp[c]"
                terms.append(f"{x_term} * {w_term}" if is_float
                             else f"({x_term}{v['input_offset']}) * {w_term}")
        return terms

    if span > 1:
        filt = p.weights[:, :, 0].T  # [tap, channel]
        v.update(span_filter=c_array(np.tile(filt, (1, span)).astype(np.int64)),
                 span_bias=c_array(np.tile(np.asarray(p.bias, np.int64), span)),
                 span_taps=taps, span_terms=tap_terms(VECTOR_STEP),
                 span_length=c_length(taps * VECTOR_STEP),
                 span_flash_bytes=taps * VECTOR_STEP + VECTOR_STEP * 4)
    v.update(
        multiplier=multiplier,
        channel_block=block,
        unrolled=tap_terms(v["out_channels"]) if unrolled else None,
        span=span,
        # int8 sums wrap like TFLite's int32 accumulator (the bias may be anywhere in int32)
        acc_type="float" if v["is_float"] else "uint32_t",
    )
    return v


def emit_depthwise_conv_2d(ctx: OpContext) -> str:
    return family_macro(TEMPLATE, "depthwise")(depthwise_values(ctx))


# -- TRANSPOSE_CONV ----------------------------------------------------------------------------


def transpose_conv_values(ctx: OpContext) -> dict:
    out_channels = ctx.params.output_shape[3]
    v = _common(ctx, 2, 3, _block(out_channels, 4))
    if v["dilation_h"] != 1 or v["dilation_w"] != 1:
        raise UnsupportedOpError("TRANSPOSE_CONV with dilation")
    # an output pixel receives at most ceil(kh / sh) * ceil(kw / sw) input pixels
    reach = -(-v["filter_h"] // v["stride_h"]) * -(-v["filter_w"] // v["stride_w"])
    v.update(
        shape=ctx.inputs[0].ptr,
        acc_type="float" if v["is_float"] else _int_accumulator(reach * v["channels"]),
    )
    return v


def emit_transpose_conv(ctx: OpContext) -> str:
    return family_macro(TEMPLATE, "transpose_conv")(transpose_conv_values(ctx))


EMITTERS = {
    "CONV_2D": emit_conv_2d,
    "DEPTHWISE_CONV_2D": emit_depthwise_conv_2d,
    "TRANSPOSE_CONV": emit_transpose_conv,
}
