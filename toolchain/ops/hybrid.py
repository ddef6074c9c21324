"""The input quantization of TFLite's dynamic-range (hybrid) kernels, as C lines: float32
values quantized to int8 at every invoke, as the x86 reference build does it (its NEON code
compiled through an SSE emulation, so its rounding is not std::round's).

- Symmetric: scale = max|x| / 127 and 127 / max|x| in float, values in [-127, 127], zero
  point 0; an all-zero input gets scale 1.
- Asymmetric: over [min(0, x), max(0, x)], the difference taken in float, the step and the zero
  point in double (the zero point rounded half away from zero, clamped to [-128, 127]); the
  value is zero point + the rounded scaled value, clamped to int8.
- Rounding of p = x * (1 / scale), in float: the first 8 * floor(n / 8) values as
  trunc(p +- 0.5f), the float addition on its own; the rest half away from zero.

Not in TFLite (undefined there): NaN is left out of min and max and quantized as 0, and the
scaled value saturates at +-SATURATED before it is rounded, so +-inf and the inf that a
denormal extent's 127 / extent is give the extreme int8 values.

runtime_py/hybrid.py computes the same in numpy.
"""

from __future__ import annotations

from toolchain.ops.emit import ConstantLoop

# |x * (1 / scale)| beyond any int8 value plus zero point, where it is saturated before
# rounding. TFLite converts it to int32 unclamped, undefined for NaN and +-inf (an infinite
# input, or a denormal extent whose 127 / extent is inf); here those saturate, NaN as 0.
SATURATED = 512.0


def round_lines(k: str, rounded: str, head: int, count: int | None = None) -> list[str]:
    """`rounded` = the x86 build's rounding of p, value `k` of `count`: below `head`
    trunc(p +- 0.5f), the float addition on its own; from there half away from zero, exactly
    (p - t is exact for |p| < 2^23). Only one way is written when all `count` values take it."""
    block = ["const float h = p < 0.0f ? p - 0.5f : p + 0.5f;", f"{rounded} = (int32_t)h;"]
    tail = ["const int32_t t = (int32_t)p;", "const float f = p - (float)t;",
            f"{rounded} = t + (f >= 0.5f) - (f <= -0.5f);"]
    if count is not None and head >= count:
        return block
    if count is not None and head == 0:
        return tail
    return [f"if ({k} < {head}) {{", *("  " + line for line in block), "} else {",
            *("  " + line for line in tail), "}"]


def quantize_lines(count: int, asymmetric: bool, k: ConstantLoop, src: str,
                   dst: str) -> list[str]:
    """Lines quantizing the `count` floats at `src` (`k` runs over them) into the int8 array
    `dst`: their scale in `scale` (a float the caller declares), and with `asymmetric` their
    zero point in `zp` (an int32_t the caller declares)."""
    head = (count // 8) * 8
    scan = ["float lo = 0.0f, hi = 0.0f, inv;  /* from 0: a NaN never becomes an end */",
            f"for ({k.header}) {{",
            f"  lo = {src}[{k.index}] < lo ? {src}[{k.index}] : lo;",
            f"  hi = {src}[{k.index}] > hi ? {src}[{k.index}] : hi;", "}"]
    each = [f"  const float s = {src}[{k.index}] * inv;",
            f"  const float p = s > {SATURATED!r}f ? {SATURATED!r}f : s < -{SATURATED!r}f ? "
            f"-{SATURATED!r}f : s == s ? s : 0.0f;", "  int32_t r;",
            *("  " + line for line in round_lines(k.index, "r", head, count))]
    if not asymmetric:
        return [*scan, "/* symmetric: scale max|x| / 127, values in [-127, 127] */",
                "if (lo == 0.0f && hi == 0.0f) {", "  scale = 1.0f;",
                f"  for ({k.header}) {dst}[{k.index}] = 0;", "} else {",
                "  const float extent = -lo > hi ? -lo : hi;",
                "  scale = extent / 127.0f;", "  inv = 127.0f / extent;",
                *("  " + line for line in [
                    f"for ({k.header}) {{", *each,
                    f"  {dst}[{k.index}] = (int8_t)(r < -127 ? -127 : r > 127 ? 127 : r);",
                    "}"]),
                "}"]
    return [*scan, "/* asymmetric over [min(0, x), max(0, x)]: the difference in float, the "
            "zero point in double */",
            "if (lo == hi) {", "  scale = 1.0f;", "  zp = 0;",
            f"  for ({k.header}) {dst}[{k.index}] = 0;", "} else {",
            "  const double step = (double)(hi - lo) / 255.0;",
            "  const double z = 128.0 - (double)lo / step < 127.0 + (double)hi / step",
            "                   ? -128.0 - (double)lo / step : 127.0 - (double)hi / step;",
            "  if (z <= -128.0) {", "    zp = -128;",
            "  } else if (z >= 127.0) {", "    zp = 127;",
            "  } else if (z != z) {", "    zp = 0;  /* an infinite end: the scale is too */",
            "  } else {", "    const int32_t t = (int32_t)z;",
            "    const double f = z - (double)t;",
            "    zp = t + (f >= 0.5) - (f <= -0.5);", "  }",
            "  scale = (float)step;", "  inv = (float)(1.0 / (double)scale);",
            *("  " + line for line in [
                f"for ({k.header}) {{", *each, "  r += zp;",
                f"  {dst}[{k.index}] = (int8_t)(r < -128 ? -128 : r > 127 ? 127 : r);", "}"]),
            "}"]
