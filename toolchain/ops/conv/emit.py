"""C emitters for CONV_2D, DEPTHWISE_CONV_2D and TRANSPOSE_CONV (NHWC), from the same params as
runtime_py (prepare.py); templates/c/conv.c.j2 lays the loops out.

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
  convolution never pads: its column is the pixel's channels. For the host (target generic) the
  integer kernels take the pixels of a row in pairs, each gathered into a column of its own, so
  that each load of a filter row serves two dot products. A receptive field too large for the
  stack falls back to direct loops over the window.
- DEPTHWISE_CONV_2D adds tap after tap into the accumulators, channels innermost and contiguous
  in both the input and the [1, kh, kw, oc] filter. Taps outside the image are skipped (they
  add real zero); pixels whose window lies inside the image take one unrolled pass, and with
  fewer than 16 int8 channels (stride 1) several such pixels share one vector.
- TRANSPOSE_CONV gathers instead of scattering (no int32 or int64 scratch plane): each output
  pixel sums the input pixels whose kh x kw patch covers it.

16x8 (int16 data, int8 filter) sums in int64 and requantizes with TFLite's 64-bit
MultiplyByQuantizedMultiplier (see WideRequantize), through the same loops: the column path's
int16 column and int32 dot products (exact: prepare takes it only for depths whose products
cannot overflow int32), then int64_t accumulators. With quantized_bias_type INT32 in a CONV_2D
or TRANSPOSE_CONV's options, it sums in int32 and requantizes as int8 does.

Hybrid (float32 data, int8 constant filter): each batch image is quantized to int8 into the
op's scratch first, as TFLite's x86 reference build does (toolchain/ops/hybrid.py); the int8
loops then run on it, the asymmetric zero point subtracted as the input offset (so padding is
still 0), and each int32 sum goes back to float32 in TFLite's order of float products (see
HybridRescale). The filter stays int8 in flash.

int8 requantization is TFLite's MultiplyByQuantizedMultiplier recast in unsigned arithmetic with
shifts by constants only, which SSE2 vectorizes (see requantize_constants); it is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolchain.ir import INT32_MAX
from toolchain.ops.conv.prepare import (
    INT16_PRODUCT,
    QUANTIZED,
    ConvParams,
    DepthwiseConvParams,
    FloatClamp,
    HybridRescale,
    Requantize,
    TransposeConvParams,
    WideRequantize,
)
from toolchain.ops.emit import (
    LINE_LIMIT,
    CDefinition,
    ConstantLoop,
    Kernel,
    OpContext,
    RuntimeLoop,
    c_array,
    c_comment,
    c_float,
    c_int64,
    c_length,
    c_sum,
    definition,
    plus,
    render_macro,
    table_definition,
    written_vars,
)
from toolchain.ops.hybrid import quantize_lines
from toolchain.ops.spec import MemoryRequest
from toolchain.targets import GENERIC

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
# Output channels whose dot products share each column load ...
OUTPUT_BLOCK = 4
# ... and for a pair of pixels, whose 2 x PAIR_BLOCK sums must stay in registers.
PAIR_BLOCK = 2
# The column's element type for int8 input + 128 (0 to 255): the helper group byte_column.
BYTE_COLUMN = "arenac_col8"
# Depthwise windows of up to this many taps get an unrolled pass for interior pixels.
MAX_UNROLLED_TAPS = 25
# |(x + input_offset) * filter value|, the offset being minus the zero point: int8 data and
# filter, uint8 data and a uint8 filter minus its zero point, or int16 data and an int8 filter.
MAX_PRODUCT = {"int8": 255 * 128, "uint8": 255 * 255, "int16": INT16_PRODUCT}
# The indentation of the template's lines; each loop or branch written around them adds as much.
INDENT = "  "
# Characters of an index expression written in place of a pointer to a single element.
MAX_INDEX = 40
# Loop counters, in the order kernels declare them.
COUNTERS = ("b", "oy", "ox", "g", "ky", "kx", "c0", "c", "m", "o0", "o", "k")


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
    for m, s in zip(stage.multipliers.tolist(), stage.shifts.tolist(), strict=True):
        n = max(-s, 1 if m == 0 else 0)
        left.append(1 << max(s, 0))
        mult.append(m)
        negative.append(1 if n else 0)
        scale.append(1 << (31 - n))
    return RequantizeConstants(left, mult, negative, scale)


def requantize_values(ctx: OpContext, stage: Requantize, count: int, blocks: int,
                      repeat: bool = False) -> dict:
    """The template's `requantize` macro: a function turning `count` accumulators into int8 or
    uint8, output channels o0, o0 + 1, ... of one of `blocks` blocks (o0 is a parameter only
    when the constants differ between channels and there are several blocks). Its loop runs a
    multiple of VECTOR_STEP times so that it vectorizes: the accumulator array is padded (and
    written through a padded `tail` array) and per-channel tables are padded with zeros. With
    `repeat`, the tables repeat the channels over all lanes instead (lane i is channel i %
    count)."""
    k = requantize_constants(stage)
    padded = -(-count // VECTOR_STEP) * VECTOR_STEP
    constants = {"left": k.left, "mult": k.mult, "negative": k.negative, "scale": k.scale}
    per_channel = [name for name, values in constants.items() if len(set(values)) > 1]
    offset = bool(per_channel) and blocks > 1 and not repeat
    at = "o0 + o" if offset else "o"
    value, tables, loads = {}, [], []
    for name, values in constants.items():
        if name not in per_channel:
            value[name] = f"{values[0]}u"
            continue
        table = f"{ctx.prefix}_{name}"
        data = ([values[i % count] for i in range(padded)] if repeat
                else values + [0] * (padded - count))
        tables.append({"name": table, "length": c_length(len(data)), "data": c_array(data)})
        loads.append(f"const uint32_t {name} = {table}[{at}];")
        value[name] = name
    if repeat:
        lanes = f"{padded} accumulators, lane i of output channel i % {count},"
    else:
        first = "o0" if blocks > 1 else "0"
        padding = f" (lanes {count} to {padded - 1} are padding)" if padded > count else ""
        lanes = f"{padded} accumulators of output channels {first}...{padding}"
    low, high = stage.clamp
    zero_point = stage.output_zero_point
    negative = value["negative"]
    ctype = ctx.outputs[0].ctype
    return {
        "fn": f"{ctx.prefix}_requantize",
        "wide": False,
        "offset": offset,
        "comment": c_comment(
            f"{lanes} -> {stage.dtype}: TFLite's MultiplyByQuantizedMultiplier (rounding "
            "doubling high multiply, rounding right shift) in unsigned steps that shift by "
            "constants only "
            "(derivation: requantize_constants in toolchain/ops/conv/emit.py), then the zero point "
            "and the activation clamp"),
        # acc is the kernel's stack array and dst the output (or a stack tail): never the same
        "params": (f"const uint32_t *restrict acc, {'int o0, ' if offset else ''}"
                   f"{ctype} *restrict dst"),
        "padded": padded,
        "tables": tables,
        "loads": loads,
        "x": "acc[o]" if value["left"] == "1u" else f"acc[o] * {value['left']}",
        "mult": value["mult"],
        "negative": negative,
        "scale": value["scale"],
        # clamp(q + zp, lo, hi) == clamp(q, lo - zp, hi - zp) + zp, with no int32 overflow
        "clamp_min": low - zero_point,
        "clamp_max": high - zero_point,
        "store": f"({ctype})(q{plus(zero_point)})" if zero_point else f"({ctype})q",
    }


def wide_requantize_values(ctx: OpContext, stage: WideRequantize, count: int,
                           blocks: int) -> dict:
    """The template's `requantize_wide` macro: a function turning `count` int64 accumulators
    into int16, output channels o0, o0 + 1, ... of one of `blocks` blocks (o0 is a parameter only
    when the constants differ between channels and there are several blocks): TFLite's 64-bit
    MultiplyByQuantizedMultiplier with the constants of `stage`."""
    constants = {"mult": (stage.multipliers.tolist(), "int16_t"),
                 "shift": (stage.shifts.tolist(), "uint8_t")}
    per_channel = [name for name, (values, _) in constants.items() if len(set(values)) > 1]
    offset = bool(per_channel) and blocks > 1
    o = ConstantLoop("o", count)
    at = c_sum([("o0", 1), (o, 1)]) if offset else o.index
    tables, loads = [], []
    for name in per_channel:
        values, ctype = constants[name]
        table = f"{ctx.prefix}_{name}"
        tables.append({"name": table, "ctype": ctype, "length": c_length(len(values)),
                       "data": c_array(values)})
        loads.append(f"const {'int64_t' if name == 'mult' else 'int'} {name[0]} = {table}[{at}];")
    mult = "m" if "mult" in per_channel else str(constants["mult"][0][0])
    if "shift" in per_channel:
        shift, rounding = "s", "((int64_t)1 << (s - 1))"
    else:
        shift = constants["shift"][0][0]
        rounding = c_int64(1 << (shift - 1))
    low, high = stage.clamp
    first = "o0" if blocks > 1 else "0"
    ctype = ctx.outputs[0].ctype
    return {
        "fn": f"{ctx.prefix}_requantize",
        "wide": True,
        "offset": offset,
        "comment": c_comment(
            f"{count} int64 accumulators of output channels {first}... -> int16: TFLite's 64-bit "
            "MultiplyByQuantizedMultiplier (its multiplier rounded to 16 bits, one rounding "
            "shift that rounds halves up; the accumulators stay within +-2^47, so the product "
            "cannot overflow), cut to 32 bits as TFLite's cast does, then the activation clamp"),
        "params": f"const int64_t *acc, {'int o0, ' if offset else ''}{ctype} *dst",
        "each": o,
        "counter": written_vars([o]),
        "tables": tables,
        "loads": loads,
        "q": f"(int32_t)((acc[{o.index}] * {mult} + {rounding}) >> {shift})",
        "clamp_min": low,
        "clamp_max": high,
        "store": f"dst[{o.index}] = ({ctype})q;",
    }


def _int_accumulator(products: int, dtype: str, wide: bool = False) -> str:
    """int32_t when the sum of `products` products cannot overflow (what vectorizes best);
    otherwise uint32_t, which wraps as TFLite's int32 accumulator does in practice, or for a
    `wide` (int64) accumulator int64_t."""
    if products * MAX_PRODUCT[dtype] <= INT32_MAX:
        return "int32_t"
    return "int64_t" if wide else "uint32_t"


def _kept(v: dict, acc: str, d: str, bias: str) -> str:
    """`acc = d + bias` (bias read at `bias`, or no bias): in uint32_t for the int32 sums, which
    wrap as TFLite's do; in int64_t, where nothing wraps, for the wide ones."""
    if v["wide"]:
        return f"{acc} = (int64_t){d}" + (f" + bias[{bias}];" if v["int_bias"] else ";")
    return f"{acc} = (uint32_t){d}" + (f" + (uint32_t)bias[{bias}];" if v["int_bias"] else ";")


def _added(v: dict, product: str) -> str:
    """A product as an int accumulator adds it: cast to uint32_t (which wraps) unless wide."""
    return product if v["wide"] else f"(uint32_t)({product})"


def _summed_dtype(ctx: OpContext) -> str:
    """The integer data a kernel's sums read: its input's, int8 for a hybrid (quantized) one."""
    return "int8" if isinstance(ctx.params.output, HybridRescale) else ctx.inputs[0].dtype


def _accumulator_bytes(p) -> int:
    """Bytes of one accumulator of the kernel: int64_t for the wide sums, else 4."""
    return 8 if isinstance(p.output, WideRequantize) else 4


def _block(total: int, per_item_bytes: int) -> int:
    """The largest divisor of `total` whose items fit MAX_STACK_BYTES."""
    fit = max(1, MAX_STACK_BYTES // per_item_bytes)
    return max(d for d in range(1, min(total, fit) + 1) if total % d == 0)


def _pairwise(terms: list[str]) -> str:
    """C text adding `terms` as a balanced tree: ((a + b) + (c + d)) + ((e + f) + (g + h))."""
    while len(terms) > 1:
        pairs = [f"({a} + {b})" for a, b in zip(terms[::2], terms[1::2], strict=True)]
        terms = pairs + terms[len(pairs) * 2:]
    return terms[0][1:-1] if terms[0].startswith("(") else terms[0]


def _nested(*blocks: ConstantLoop | bool) -> int:
    """How many of `blocks` (loops, or True for a branch) are written around a line."""
    return sum(1 for b in blocks if (b.written if isinstance(b, ConstantLoop) else b))


def _comment(text: str, depth: int) -> str:
    """c_comment of a template line inside `depth` written loops and branches: wrapped for its
    real indentation, its later lines indented from the template's."""
    real = INDENT * (1 + depth)
    return c_comment(text, real).replace("\n" + real, "\n" + INDENT)


def _declare(ctype: str, items: list[str], depth: int) -> list[str]:
    """One declaration of `items`, or one a line where that would pass LINE_LIMIT."""
    line = f"{ctype} {', '.join(items)};"
    if len(INDENT * (1 + depth) + line) <= LINE_LIMIT:
        return [line]
    return [f"{ctype} {item};" for item in items]


def _sum_lines(head: str, terms: list[str], tail: str = "") -> str:
    """`head` + the sum of `terms` + `tail`, a term a line, each `+` under the first term's
    statement's right-hand side (`head` starts with `lhs = `)."""
    indent = "\n" + INDENT + " " * (head.index("= ") + 2)
    return head + terms[0] + "".join(f"{indent}+ {t}" for t in terms[1:]) + tail


def _values(loop: ConstantLoop) -> range:
    """The values of a loop's variable: all it takes, or the start alone of a loop that is not
    written (which c_sum folds into the index expressions)."""
    return range(loop.start, loop.stop, loop.step) if loop.written else range(loop.start,
                                                                            loop.start + 1)


def _range(terms: list, constant: int) -> tuple[int, int]:
    """The least and greatest value of c_sum(terms, constant) over its loops' values."""
    low = high = constant
    for loop, coefficient in terms:
        values = _values(loop)
        ends = (values[0] * coefficient, values[-1] * coefficient)
        low, high = low + min(ends), high + max(ends)
    return low, high


def _guard(terms: list[str] | None) -> dict:
    """A condition for the template's `guard`: it never holds (None: the guarded lines are not
    written), always holds ([]: written bare) or holds when all of `terms` do."""
    return {"runs": terms is not None, "condition": " && ".join(terms or [])}


def _both(a: list[str] | None, b: list[str] | None) -> list[str] | None:
    return None if a is None or b is None else [*a, *b]


def _sum(terms: list, constant: int = 0) -> str:
    """c_sum(terms, constant), the terms of one coefficient (other than 1) added up first, as an
    index is written by hand: `(y0 + ky) * 384 + (x0 + kx) * 8 + c0`."""
    groups: dict[int, list] = {}
    for term, k in terms:
        if isinstance(term, ConstantLoop) and not term.written:
            constant += term.start * k
        elif k:
            groups.setdefault(k, []).append(term)
    named: list[tuple[str | ConstantLoop, int]] = []
    for k, group in groups.items():
        if k == 1 or len(group) == 1:
            named += [(t, k) for t in group]
        else:
            named.append((f"({c_sum([(t, 1) for t in group])})", k))
    return c_sum(named, constant)


def _offset(base: str, terms: list, constant: int = 0) -> str:
    """`base` advanced by _sum(terms, constant) elements: `x + oy * 48 - 3`, or `x`."""
    offset = _sum(terms, constant)
    if offset == "0":
        return base
    return f"{base} - {offset[1:]}" if offset.startswith("-") else f"{base} + {offset}"


def _pointer(name: str, ctype: str, base: str, terms: list,
             constant: int = 0) -> tuple[str, list[str]]:
    """A pointer `name` at _offset(base, terms, constant): its name and declaration, or `base`
    and none when the offset is nothing."""
    at = _offset(base, terms, constant)
    return (base, []) if at == base else (name, [f"{ctype} *{name} = {at};"])


def _walk(name: str, ctype: str, base: str, terms: list, constant: int,
          loop: ConstantLoop) -> tuple[str, list[str]]:
    """Element `loop` of the array at _offset(base, terms, constant): `base` indexed directly
    when the loop is not written (and the index is short), else through a pointer `name`,
    whose declaration comes too."""
    index = _sum([*terms, (loop, 1)], constant)
    if not loop.written and len(index) <= MAX_INDEX:
        return f"{base}[{index}]", []
    pointer, lines = _pointer(name, ctype, base, terms, constant)
    return f"{pointer}[{loop.index}]", lines


@dataclass(frozen=True)
class _Index:
    """An input index along one axis as the kernel reads it: the declarations naming it (when a
    bounds test reads it), the test that it lies inside the image ([] always, None never) and
    the index as c_sum(terms, constant)."""

    lines: list[str]
    test: list[str] | None
    terms: list
    constant: int


def _inside(var: str, terms: list, constant: int, size: int) -> _Index:
    """The index `var` = c_sum(terms, constant), tested against [0, size) where its loops'
    ranges can leave it."""
    low, high = _range(terms, constant)
    if high < 0 or low >= size:
        return _Index([], None, terms, constant)
    test = ([f"{var} >= 0"] if low < 0 else []) + ([f"{var} < {size}"] if high >= size else [])
    if not test:
        return _Index([], [], terms, constant)
    return _Index([f"const int {var} = {_sum(terms, constant)};"], test, [(var, 1)], 0)


def _scattered(axis: str, out: ConstantLoop, tap: ConstantLoop, pad: int, stride: int,
               size: int) -> _Index:
    """TRANSPOSE_CONV's input index i<axis>: output position out (out + pad in the plane)
    receives input i through `tap` when out + pad - tap = i * stride."""
    var, terms = f"i{axis}", [(out, 1), (tap, -1)]
    if stride == 1:
        return _inside(var, terms, pad, size)
    low, high = _range(terms, pad)
    if low == high:  # the tap reads one input pixel or none
        inside = low >= 0 and low % stride == 0 and low // stride < size
        return _Index([], [] if inside else None, [], low // stride)
    if high < 0:
        return _Index([], None, [], 0)
    t = f"t{axis}"
    test = ([f"{t} >= 0"] if low < 0 else []) + [f"{t} % {stride} == 0"]
    test += [f"{var} < {size}"] if high // stride >= size else []
    return _Index([f"const int {t} = {c_sum(terms, pad)};", f"const int {var} = {t} / {stride};"],
                  test, [(var, 1)], 0)


def _common(ctx: OpContext, x_index: int, bias_index: int, count: int, blocks: int,
            repeat: bool = False) -> dict:
    """The tensors, the loops over output pixels and the output stage for `count`
    accumulators, `blocks` blocks of output channels per pixel."""
    p = ctx.params
    x, out = ctx.inputs[x_index], ctx.outputs[0]
    bias = ctx.inputs[bias_index] if len(ctx.inputs) > bias_index else None
    batch = p.input_shape[0]
    _, out_h, out_w, out_channels = p.output_shape
    is_float = isinstance(p.output, FloatClamp)
    hybrid = isinstance(p.output, HybridRescale)
    # a hybrid kernel reads its input quantized to int8, in the scratch
    ctype = "int8_t" if hybrid else x.ctype
    b, oy, ox = ConstantLoop("b", batch), ConstantLoop("oy", out_h), ConstantLoop("ox", out_w)
    px, px_lines = _pointer("px", out.ctype, "out", [(b, out_h * out_w * out_channels),
                                                      (oy, out_w * out_channels),
                                                      (ox, out_channels)])
    filt, filter_copy = ctx.inputs[1], None
    w_ctype = filt.ctype
    if filt.dtype == "uint8":
        filt, filter_copy, w_ctype = _offset_filter_copy(ctx)
    # the pointers a kernel may declare: name, type and tensor
    tensors = [("x", f"const {ctype}", x), ("w", f"const {w_ctype}", filt),
               ("out", out.ctype, out)]
    if bias is not None:
        tensors.insert(2, ("bias", f"const {bias.ctype}", bias))
    if hybrid:
        tensors[:1] = [("input", "const float", x),
                       ("x", "int8_t", _Array(f"(int8_t *){ctx.scratch[0]}"))]
    wide = isinstance(p.output, WideRequantize)
    v = {
        "fn": ctx.fn,
        "prefix": ctx.prefix,
        "name": f"{ctx.op.opcode} '{out.name}'",
        "is_float": is_float,
        "ctype": ctype,
        # the integer data the sums read
        "dtype": "int8" if hybrid else x.dtype,
        "w_ctype": w_ctype,
        "filter_copy": filter_copy,
        "bias": bias is not None,
        "int_bias": bias is not None and not (is_float or hybrid),
        # hybrid: the asymmetric input's zero point, known at run time
        "offset": "-zp" if hybrid and p.output.asymmetric else p.input_offset,
        "tensors": tensors,
        "batch": b, "out_y": oy, "out_x": ox,
        "px": px, "pixel_lines": px_lines,
        "shape": p.input_shape,
        "count": count,
        # int16's sums are int64 (unless its options ask for int32 ones); int8's int32 sums
        # are kept in uint32_t, which wraps as TFLite's do in practice
        "wide": wide,
        "hybrid": _hybrid_values(ctx, b) if hybrid else None,
        "batch_lines": [],
    }
    if hybrid:
        low, high = p.output.clamp
        v.update(rq=None, acc_size=count, act_min=c_float(low), act_max=c_float(high),
                 accumulators=[f"uint32_t acc[{count}];"], batch_lines=v["hybrid"]["lines"])
    elif is_float:
        low, high = p.output.clamp
        v.update(rq=None, acc_size=count, act_min=c_float(low), act_max=c_float(high),
                 accumulators=[f"float acc[{count}];"])
    elif wide:
        v.update(rq=wide_requantize_values(ctx, p.output, count, blocks), acc_size=count,
                 accumulators=[f"int64_t acc[{count}];"])
    else:
        rq = requantize_values(ctx, p.output, count, blocks, repeat)
        size = rq["padded"]
        v.update(rq=rq, acc_size=size, accumulators=[f"uint32_t acc[{size}];"],
                 output_helpers=("requantize",))
        if size > count:
            v["accumulators"].append(f"{ctype} tail[{size}]; /* the requantization's whole "
                                     f"vectors; {count} values are kept */")
    # the padding lanes of int8's accumulators hold 0 for good
    v["acc_init"] = ConstantLoop("o", v["acc_size"], count)
    v["acc_init_step"] = f"acc[{v['acc_init'].index}] = 0;"
    return v


def _summed(v: dict, parenthesized: bool = False) -> str:
    """What the integer sums multiply the filter with, for a comment."""
    if v["hybrid"]:
        text = "quantized input - zero point" if v["offset"] else "quantized input"
    elif v["offset"]:
        text = "input + input offset"
    else:
        return "input"
    return f"({text})" if parenthesized and v["offset"] else text


def _about(v: dict) -> str:
    """The sentence a hybrid kernel's comment ends with ("" for the others)."""
    if not v["hybrid"]:
        return ""
    return (" Hybrid: each batch image is first quantized to int8 into the scratch `x`, as "
            "TFLite's x86 reference build does; each int32 sum goes back to float32 through the "
            "image's scale and the filter's, then the bias and the clamp.")


def _hybrid_values(ctx: OpContext, b: ConstantLoop) -> dict:
    """A hybrid kernel's lines quantizing batch image b into the scratch (`x`), as TFLite does,
    its filter scale table (per channel) and its rescaling of an int32 sum `{acc}` of output
    channel `{o}` to float32 (a str.format pattern)."""
    p = ctx.params
    stage: HybridRescale = p.output
    image = math.prod(p.input_shape[1:])
    k = ConstantLoop("k", image)
    src, src_lines = _pointer("xb", "const float", "input", [(b, image)])
    dst, dst_lines = _pointer("q", "int8_t", "x", [(b, image)])
    kind = "asymmetric, with a zero point" if stage.asymmetric else "symmetric"
    lines = [_comment(f"this image of {image} values quantized to int8 ({kind}) as TFLite's x86 "
                      "reference build does", _nested(b)),
             *src_lines, *dst_lines,
             "float scale;" + (" int32_t zp;" if stage.asymmetric else ""),
             *quantize_lines(image, stage.asymmetric, k, src, dst)]
    tables = []
    table = f"{ctx.prefix}_filter_scale"
    if len(stage.filter_scales) > 1:
        tables.append({"comment": c_comment(f"{ctx.op.opcode} '{ctx.outputs[0].name}': the filter "
                                            "scale per output channel"),
                       "ctype": "float", "name": table,
                       "length": c_length(len(stage.filter_scales)),
                       "data": c_array(np.asarray(stage.filter_scales, np.float32))})
        if stage.scales_first:
            rescale = "(float)(int32_t){acc} * (" + table + "[{o}] * scale)"
        else:
            rescale = "(float)(int32_t){acc} * " + table + "[{o}] * scale"
    else:
        lines.append(f"scale *= {c_float(stage.filter_scales[0])}; /* times the filter's */")
        rescale = "(float)(int32_t){acc} * scale"
    return {"lines": lines, "loops": [k], "tables": tables, "rescale": rescale}


@dataclass(frozen=True)
class _Array:
    """A constant array the kernel defines itself, pointed at like a tensor."""

    ptr: str


def _offset_filter_copy(ctx: OpContext) -> tuple[_Array, dict, str]:
    """A uint8 filter minus its zero point (the params' weights), in the filter's own layout,
    as int16: what the kernel reads in place of the filter (which is then not emitted)."""
    p, filt = ctx.params, ctx.inputs[1]
    if isinstance(p, ConvParams):  # [group, (ky, kx, c), output in group] -> OHWI
        values = p.weights.transpose(0, 2, 1).reshape(filt.shape)
    else:  # [input channel, tap, multiplier] -> [1, kh, kw, output channel]
        values = p.weights.transpose(1, 0, 2).reshape(filt.shape)
    name = f"{ctx.prefix}_w"
    copy = {"comment": c_comment(f"{ctx.op.opcode} '{ctx.outputs[0].name}': the uint8 filter "
                                 f"minus its zero point, as int16 ({values.size * 2} bytes of "
                                 "flash)"),
            "name": name, "length": c_length(values.size),
            "data": c_array(values.astype(np.int64).reshape(-1))}
    return _Array(name), copy, "int16_t"


def _read(filter_copy: dict | None, unread: tuple[str, ...]) -> dict | None:
    """The filter copy, where the kernel reads the filter `w` at all."""
    return None if "w" in unread else filter_copy


def _declarations(v: dict, arrays: list[str], loops: list, unread: tuple[str, ...] = ()
                  ) -> list[str]:
    """The lines opening a kernel: its pointers (but the `unread` ones, whose tensors it does not
    point at then), arrays, accumulators and loop counters. A hybrid kernel always writes its
    quantized input `x`."""
    if v["hybrid"]:
        unread = tuple(name for name in unread if name != "x")
        loops = [*loops, *v["hybrid"]["loops"]]
    pointers = [f"{ctype} *{name} = {t.ptr};" for name, ctype, t in v["tensors"]
                if name not in unread]
    counters = written_vars(sorted(loops, key=lambda loop: COUNTERS.index(loop.var)))
    return [*pointers, *arrays, *v["accumulators"], *([f"int {counters};"] if counters else [])]


def _finish(v: dict, terms: list, depth: int, acc: str = "acc", shift: int = 0) -> dict:
    """Turn acc[0..count) (output channels c_sum(terms), ...) into the outputs at px, inside
    `depth` written loops: a loop of one statement (float32's bias and clamp; `inline` when the
    statement fits on the loop's line) or of a few (hybrid's rescale, bias and clamp), or lines
    alone (the integer requantizations, which may take another array `acc` into the outputs
    `shift` elements from px)."""
    rq, px = v["rq"], v["px"]
    if v["hybrid"]:
        o = ConstantLoop("o", v["count"])
        at = c_sum([*terms, (o, 1)])
        lines = [f"float y = {v['hybrid']['rescale'].format(acc=f'acc[{o.index}]', o=at)};"]
        if v["bias"]:
            lines.append(f"y += bias[{at}];")
        lines.append(f"{px}[{at}] = arenac_clampf(y, {v['act_min']}, {v['act_max']});")
        return {"loop": o, "lines": lines, "inline": False}
    if rq is None:
        o = ConstantLoop("o", v["count"])
        at = c_sum([*terms, (o, 1)])
        bias = f" + bias[{at}]" if v["bias"] else ""
        clamp = f"arenac_clampf(acc[{o.index}]{bias}, {v['act_min']}, {v['act_max']})"
        line = f"{px}[{at}] = {clamp};"
        inline = len(f"{INDENT * (1 + depth)}for ({o.header}) {line}") <= LINE_LIMIT
        return {"loop": o, "lines": [line], "inline": inline}
    first = f"{c_sum(terms)}, " if rq["offset"] else ""
    dst = _offset(px, terms, shift)
    if v["acc_size"] > v["count"]:
        kept = v["count"] * (2 if v["ctype"] == "int16_t" else 1)  # bytes
        return {"loop": None, "lines": [f"{rq['fn']}({acc}, {first}tail);",
                                        f"memcpy({dst}, tail, {kept});"]}
    return {"loop": None, "lines": [f"{rq['fn']}({acc}, {first}{dst});"]}


def _widened(element: str, offset: int, is_float: bool, ctype: str = "int16_t") -> str:
    """A column value: the input `element` as it is (float32, or an integer with no offset to
    add) or (ctype)(element + offset)."""
    if is_float or not offset:
        return element
    return f"({ctype})({element}{plus(offset)})"


def _product(x: str, w: str, offset: int) -> str:
    """(x + offset) * w, the offset being the int8 input offset or 0."""
    return f"({x}{plus(offset)}) * {w}" if offset else f"{x} * {w}"


def _nhwc(b: ConstantLoop, shape: tuple[int, ...], y: list, x: list, constant: tuple[int, int],
          more: list = ()) -> tuple[list, int]:
    """c_sum terms and constant of element (b, y, x, 0) of an NHWC tensor of `shape`, given the
    terms and constants of y and x (plus `more` terms in elements)."""
    _, height, width, channels = shape
    terms = [(b, height * width * channels), *[(t, k * width * channels) for t, k in y],
             *[(t, k * channels) for t, k in x], *more]
    return terms, (constant[0] * width + constant[1]) * channels


# -- CONV_2D -----------------------------------------------------------------------------------


def _interior(oy: ConstantLoop, ox: ConstantLoop, window, input_shape: tuple[int, ...]
              ) -> list[str] | None:
    """The C condition on (oy, ox) for the whole window to lie inside the image: its terms, []
    when every output pixel's window does, None when none does."""
    terms = []
    for out, size, k, s, d, pad in zip((oy, ox), input_shape[1:3], window.filter, window.stride,
                                       window.dilation, window.padding, strict=True):
        low = -(-pad // s)  # the first output whose window starts inside
        high = (size - 1 - (k - 1) * d + pad) // s + 1  # past the last that ends inside
        values = _values(out)
        if max(low, values[0]) >= min(high, values[-1] + 1):
            return None
        terms += [f"{out.var} >= {low}"] if low > values[0] else []
        terms += [f"{out.var} < {high}"] if high <= values[-1] else []
    return terms


def _column(v: dict, p: ConvParams, g: ConstantLoop, col_type: str) -> dict:
    """The lines gathering a pixel's receptive field (of group g) into `col`, and their loops."""
    b, oy, ox = v["batch"], v["out_y"], v["out_x"]
    shape = p.input_shape
    _, height, width, channels = shape
    kh, kw = p.window.filter
    (sh, sw), (dh, dw), (pad_top, pad_left) = p.window.stride, p.window.dilation, p.window.padding
    group_channels = channels // p.groups
    ctype, offset, is_float = v["ctype"], v["offset"], v["is_float"]
    depth_here = _nested(b, oy, ox, g)
    c = ConstantLoop("c", group_channels)
    if kh == kw == 1:
        terms, first = _nhwc(b, shape, [(oy, sh)], [(ox, sw)], (0, 0), [(g, group_channels)])
        x, x_lines = _walk("xp", f"const {ctype}", "x", terms, first, c)
        of_group = " of the group" if p.groups > 1 else ""
        return {"pointwise": {
            "comment": _comment(f"1x1: the window is this pixel's channels{of_group}, never "
                                "padded", depth_here),
            "lines": x_lines, "each": c,
            "step": f"col[{c.index}] = {_widened(x, offset, is_float, col_type)};"},
            "loops": [c], "reads": True}
    ky, kx = ConstantLoop("ky", kh), ConstantLoop("kx", kw)
    # interior windows copy whole rows (contiguous without groups or horizontal dilation) when
    # the pixels' channels do not make whole vectors anyway
    interior = (_interior(oy, ox, p.window, shape)
                if p.groups == 1 and dw == 1 and channels % VECTOR_STEP != 0 else None)
    rows = None
    if interior is not None:
        row = ConstantLoop("c", kw * channels)
        terms, first = _nhwc(b, shape, [(oy, sh), (ky, dh)], [(ox, sw)], (-pad_top, -pad_left))
        x, x_lines = _walk("xp", f"const {ctype}", "x", terms, first, row)
        col, col_lines = _walk("cp", col_type, "col", [(ky, kw * channels)], 0, row)
        rows = {
            "condition": " && ".join(interior),
            "comment": _comment("the whole window inside the image: each window row is "
                                f"{kw * channels} contiguous values",
                                depth_here + _nested(bool(interior))),
            "ky": ky, "lines": x_lines + col_lines, "each": row,
            "step": f"{col} = {_widened(x, offset, is_float, col_type)};",
        }
        if not interior:  # every window is interior: no taps one by one
            return {"pointwise": None, "rows": rows, "taps": None, "loops": [ky, row],
                    "reads": True}
    iy = _inside("iy", [(oy, sh), (ky, dh)], -pad_top, height)
    ix = _inside("ix", [(ox, sw), (kx, dw)], -pad_left, width)
    col, col_lines = _walk("cp", col_type, "col", [(ky, kw * group_channels),
                                                    (kx, group_channels)], 0, c)
    terms, first = _nhwc(b, shape, iy.terms, ix.terms, (iy.constant, ix.constant),
                         [(g, group_channels)])
    x, x_lines = _walk("xp", f"const {ctype}", "x", terms, first, c)
    test = _both(iy.test, ix.test)
    named = test is not None  # the indices, when some tap is inside
    taps = {
        "ky": ky, "kx": kx, "y_lines": iy.lines if named else [],
        "x_lines": (ix.lines if named else []) + col_lines,
        "test": _guard(test), "lines": x_lines, "each": c,
        "step": f"{col} = {_widened(x, offset, is_float, col_type)};",
        "pad": f"{col} = 0; /* padding */",
    }
    loops = [ky, kx, c, *([rows["each"]] if rows else [])]
    return {"pointwise": None, "rows": rows, "taps": taps, "loops": loops,
            "reads": bool(rows) or taps["test"]["runs"]}


def _dot_products(v: dict, p: ConvParams, g: ConstantLoop, depth: int, col_size: int,
                  rows: str, w_type: str, pair: bool = False, depth_extra: int = 0) -> dict:
    """The dot products of col with the filter rows of group g's output channels, into
    acc[g * group_outputs + o]: float32 in FLOAT_LANES partial sums, int8 OUTPUT_BLOCK output
    channels at a time. A `pair` takes the columns cols[0] and cols[1] of two pixels at once,
    into acc and acc2, so that each load of a filter row serves both."""
    group_outputs = p.output_shape[3] // p.groups
    depth_here = _nested(v["batch"], v["out_y"], v["out_x"], g) + depth_extra

    def at(loop: ConstantLoop, k: int = 0) -> str:
        return c_sum([(g, group_outputs), (loop, 1)], k)

    if v["is_float"]:
        o = ConstantLoop("o", group_outputs)
        wr, wr_lines = _pointer("wr", "const float", "w", [(g, group_outputs * depth),
                                                           (o, depth)])
        depth_main = depth - depth % FLOAT_LANES
        main = ConstantLoop("k", depth_main, 0, FLOAT_LANES)
        rest = ConstantLoop("k", depth, depth_main)
        if main.runs:
            lanes = [f"s{lane}" for lane in range(FLOAT_LANES)]
            comment = _comment(f"{FLOAT_LANES} partial sums, kept in registers",
                               depth_here + _nested(o))
            steps = [f"{s} += col[{c_sum([(main, 1)], k)}] * {wr}[{c_sum([(main, 1)], k)}];"
                     for k, s in enumerate(lanes)]
        else:  # too short for lanes: one sum, which the lanes' sum would equal
            lanes, comment, steps = ["s"], None, []
        return {"floats": {
            "o": o, "comment": comment, "lines": wr_lines,
            "sums": _declare("float", [f"{s} = 0.0f" for s in lanes], depth_here + _nested(o)),
            "main": main, "steps": steps,
            "rest": rest, "rest_step": f"{lanes[0]} += col[{rest.index}] * {wr}[{rest.index}];",
            "store": f"acc[{at(o)}] = {_pairwise(lanes)};"}, "ints": None,
            "loops": [o, main, rest]}

    width = PAIR_BLOCK if pair else OUTPUT_BLOCK
    blocked = group_outputs - group_outputs % width
    block = ConstantLoop("o", blocked, 0, width)
    single = ConstantLoop("o", group_outputs, blocked)
    k = ConstantLoop("k", col_size)
    filters = [f"*w0 = {_offset(rows, [(g, group_outputs * col_size), (block, col_size)])}"]
    filters += [f"*w{i} = w{i - 1} + {col_size}" for i in range(1, width)]
    wr, wr_lines = _pointer("wr", f"const {w_type}", rows, [(g, group_outputs * col_size),
                                                            (single, col_size)])
    # per pixel: its column, its sums' names, its accumulators and its column value's name
    pixels = ([("cols[0]", "d", "acc", "xv"), ("cols[1]", "e", "acc2", "yv")] if pair
              else [("col", "d", "acc", "xv")])
    sums = [f"{d}{i} = 0" for _, d, _, _ in pixels for i in range(width)]
    shared = "col" if not pair else "the columns"
    return {"floats": None, "ints": {
        "comment": _comment(f"{width} output channels at a time share each load of "
                            f"{shared}" + (", and both pixels each load of a filter row"
                                           if pair else ""),
                            depth_here) if block.runs else None,
        "block": block,
        "pointers": _declare(f"const {w_type}", filters, depth_here + _nested(block)),
        "sums": _declare("int32_t", sums, depth_here + _nested(block)),
        "k": k,
        "x": "const int32_t " + ", ".join(f"{xv} = {col}[{k.index}]"
                                          for col, _, _, xv in pixels) + ";",
        "steps": [f"{d}{i} += {xv} * w{i}[{k.index}];"
                  for i in range(width) for _, d, _, xv in pixels],
        "stores": [_kept(v, f"{acc}[{at(block, i)}]", f"{d}{i}", at(block, i))
                   for _, d, acc, _ in pixels for i in range(width)],
        "single": single, "lines": wr_lines,
        "single_sums": "int32_t " + ", ".join(f"{d} = 0" for _, d, _, _ in pixels) + ";",
        "single_steps": [f"{d} += {col}[{k.index}] * {wr}[{k.index}];"
                         for col, d, _, _ in pixels],
        "single_stores": [_kept(v, f"{acc}[{at(single)}]", d, at(single))
                          for _, d, acc, _ in pixels],
    }, "loops": [block, single, k]}


def _pair_pixels(v: dict, pair_dots: dict, odd: bool, out_w: int, out_channels: int,
                 col_type: str, depth_here: int) -> None:
    """Into `v`: the pixels of a row in pairs, each with a column and accumulators of its own,
    the sums of the pair's first pixel waiting for its second (a last odd pixel alone)."""
    wait = "ox % 2 == 0" + (f" && ox < {out_w - 1}" if odd else "")
    v["pair"] = {
        "wait": f"if ({wait}) continue; /* the sums wait for the pair's second pixel */",
        "condition": "ox % 2 == 1" if odd else None,
        "ints": pair_dots["ints"],
        "finish": {"loop": None, "lines": [
            *_finish(v, [], depth_here, shift=-out_channels)["lines"],
            *_finish(v, [], depth_here, acc="acc2")["lines"]]},
    }
    v["pixel_lines"] = [*v["pixel_lines"],
                        f"{col_type} *col = cols[ox % 2]; /* each pixel of a pair has its "
                        "own */"]
    v["accumulators"][0] = v["accumulators"][0].replace(
        f"acc[{v['acc_size']}];", f"acc[{v['acc_size']}], acc2[{v['acc_size']}];")
    v["acc_init_step"] = f"acc[{v['acc_init'].index}] = acc2[{v['acc_init'].index}] = 0;"


def _widened_filter(v: dict, p: ConvParams, name: str, depth: int, col_size: int) -> dict:
    """The filter widened to int16, its rows padded with zeros to `col_size` values, for dot
    products of a depth that is not a multiple of VECTOR_STEP."""
    out_channels = p.output_shape[3]
    widened = np.zeros((out_channels, col_size), np.int16)
    # weights: [group, (ky, kx, c), output in group] -> [output, (ky, kx, c)]
    widened[:, :depth] = p.weights.transpose(0, 2, 1).reshape(out_channels, depth)
    return {
        "comment": c_comment(f"{v['name']}: the filter widened to int16, each row padded "
                             f"with zeros to {col_size} values so that every dot product "
                             f"runs in whole vectors ({widened.nbytes} bytes of flash)"),
        "name": name, "length": c_length(widened.size), "data": c_array(widened)}


def conv_values(ctx: OpContext) -> dict:
    p: ConvParams = ctx.params
    channels, out_channels = p.input_shape[3], p.output_shape[3]
    kh, kw = p.window.filter
    depth = kh * kw * (channels // p.groups)
    is_float = isinstance(p.output, FloatClamp)
    # the column path keeps one pixel's accumulators and column on the stack (and sums at most
    # that many integer products in an int32)
    column = (_accumulator_bytes(p) * out_channels <= MAX_STACK_BYTES
              and (4 if is_float else 2) * depth <= MAX_STACK_BYTES
              and (is_float or depth * MAX_PRODUCT[_summed_dtype(ctx)] <= INT32_MAX))
    if not column:
        return _conv_direct_values(ctx)
    # int8 dot products of a depth that is not a multiple of VECTOR_STEP read an int16 copy of
    # the filter whose rows are padded to a multiple of WIDE_STEP
    wide = not is_float and depth % VECTOR_STEP != 0
    col_size = -(-depth // WIDE_STEP) * WIDE_STEP if wide else depth
    v = _common(ctx, 0, 2, out_channels, 1)
    # int8 input + 128 is a byte, which x86's VNNI multiplies by the int8 filter in place
    byte = not wide and v["dtype"] == "int8" and not v["hybrid"] and v["offset"] == 128
    col_type = "float" if is_float else BYTE_COLUMN if byte else "int16_t"
    g = ConstantLoop("g", p.groups)
    gather = _column(v, p, g, col_type)
    filter_rows, w_type = (f"{ctx.prefix}_w16", "int16_t") if wide else ("w", v["w_ctype"])
    out_w = p.output_shape[2]
    # on the host (generic C), integer sums take the pixels of a row in pairs (ox even, ox + 1),
    # whose dot products share each load of a filter row, where two columns and two pixels'
    # accumulators fit; a Cortex-M has too few registers for a pair's sums and pointers
    pair = (ctx.target == GENERIC and v["rq"] is not None and p.groups == 1 and out_w > 1
            and 2 * _accumulator_bytes(p) * v["acc_size"] <= MAX_STACK_BYTES
            and 2 * 2 * col_size <= MAX_STACK_BYTES)
    odd = pair and out_w % 2 == 1  # then the row's last pixel goes alone
    depth_here = _nested(v["batch"], v["out_y"], v["out_x"])
    dots = _dot_products(v, p, g, depth, col_size, filter_rows, w_type, depth_extra=int(odd))
    dot_loops = dots.pop("loops")  # the loops written: a pair's, and a lone pixel's
    # the zeros after the depth meet the zeros padding the widened rows
    col_pad = ConstantLoop("k", col_size, depth)
    finish = _finish(v, [], depth_here + int(odd))
    if pair:
        pair_dots = _dot_products(v, p, g, depth, col_size, filter_rows, w_type, pair=True,
                                  depth_extra=int(odd))
        dot_loops = [*pair_dots.pop("loops"), *(dot_loops if odd else [])]
        _pair_pixels(v, pair_dots, odd, out_w, out_channels, col_type, depth_here)
    else:
        v["pair"] = None
    loops = [v["batch"], v["out_y"], v["out_x"], g, v["acc_init"], col_pad, *gather.pop("loops"),
             *dot_loops, finish["loop"] or col_pad]
    # the dot products read the widened filter; with no tap of a window ever inside the image
    # (dilated taps around a narrow one), nothing reads the input
    unread = (("w",) if wide else ()) + (() if gather.pop("reads") else ("x",))
    v["wide"] = _widened_filter(v, p, filter_rows, depth, col_size) if wide else None
    (sh, sw), (dh, dw) = p.window.stride, p.window.dilation
    groups = f", {p.groups} groups" if p.groups > 1 else ""
    as_int16 = ("" if is_float else f", as {_summed(v)}, 0 to 255, in {col_type} (padding is 0)"
                if byte else f", as {_summed(v)} in int16 (padding is 0)")
    v.update(
        **gather, **dots,
        kernel="conv_column", group=g, col_pad=col_pad,
        helpers=("byte_column",) if byte else (),
        col_pad_step=(f"cols[0][{col_pad.index}] = cols[1][{col_pad.index}] = 0;" if pair
                      else f"col[{col_pad.index}] = 0;") + " /* meets the rows' zero padding */",
        finish=finish,
        declarations=_declarations(v, [f"{col_type} cols[2][{col_size}];" if pair
                                       else f"{col_type} col[{col_size}];"], loops, unread),
        filter_copy=_read(v["filter_copy"], unread),
        comment=c_comment(
            f"{v['name']}: {kh}x{kw} filter, stride {sh}x{sw}, dilation {dh}x{dw}{groups}. Per "
            f"output pixel{' and group' if p.groups > 1 else ''}, `col` holds the receptive "
            f"field in filter (ky, kx, c) order{as_int16}; each output channel is a dot product "
            "of col with its filter row. "
            + ("The pixels of a row go in pairs, whose dot products share each load of a filter "
               "row. " if pair else "")
            + f"Pixels are written in NHWC order (ORDER CONTRACT, top of conv.c.j2).{_about(v)}"),
    )
    return v


def _gather(v: dict, iy: _Index, ix: _Index, ky: ConstantLoop, kx: ConstantLoop, channels: int,
            more: list, filter_at: list, acc_type: str) -> dict | None:
    """The sum d of filter * input over the in-bounds taps (ky, kx) of a window, the input at
    (iy, ix) and `more` elements, the filter at c_sum(filter_at) of filter element (ky, kx, 0);
    None when no tap is ever inside."""
    if iy.test is None or ix.test is None:
        return None
    ctype, offset = v["ctype"], v["offset"]
    c = ConstantLoop("c", channels)
    terms, first = _nhwc(v["batch"], v["shape"], iy.terms, ix.terms, (iy.constant, ix.constant),
                         more)
    x, x_lines = _walk("xp", f"const {ctype}", "x", terms, first, c)
    w, w_lines = _walk("wp", f"const {v['w_ctype']}", "w", filter_at, 0, c)
    step = (f"d += {x} * {w};" if v["is_float"]
            else f"d += ({acc_type})({_product(x, w, offset)});")
    return {"ky": ky, "kx": kx, "y_lines": iy.lines, "x_lines": ix.lines,
            "y_test": _guard(iy.test), "x_test": _guard(ix.test), "pointers": x_lines + w_lines,
            "channel": c, "step": step, "loops": [ky, kx, c]}


def _direct(v: dict, o0: ConstantLoop, o: ConstantLoop, gather: dict | None, lines: list[str],
            acc_type: str, comment: str) -> dict:
    """The values of the template's `direct`: per output pixel, blocks o0 of `count` output
    channels o0 + o, each channel's sum gathered from its window."""
    at = c_sum([(o0, 1), (o, 1)])
    store = f"acc[{o.index}] = d;" if v["is_float"] else _kept(v, f"acc[{o.index}]", "d", at)
    finish = _finish(v, [(o0, 1)], _nested(v["batch"], v["out_y"], v["out_x"], o0))
    loops = [v["batch"], v["out_y"], v["out_x"], o0, o, v["acc_init"],
             *(gather["loops"] if gather else []), finish["loop"] or o]
    return {**v, "kernel": "direct", "block": o0, "channel": o, "channel_lines": lines,
            "sum": f"{acc_type} d = 0;", "gather": gather, "store": store, "finish": finish,
            "declarations": _declarations(v, [], loops, () if gather else ("x", "w")),
            "filter_copy": _read(v["filter_copy"], () if gather else ("w",)),
            "comment": comment}


def _conv_direct_values(ctx: OpContext) -> dict:
    """CONV_2D without a column, for receptive fields (or output channels) too many for the
    stack: every output channel walks the in-bounds part of its window directly."""
    p: ConvParams = ctx.params
    _, height, width, channels = p.input_shape
    out_channels = p.output_shape[3]
    kh, kw = p.window.filter
    (sh, sw), (dh, dw), (pad_top, pad_left) = p.window.stride, p.window.dilation, p.window.padding
    group_channels, group_outputs = channels // p.groups, out_channels // p.groups
    count = _block(out_channels, _accumulator_bytes(p))
    v = _common(ctx, 0, 2, count, out_channels // count)
    is_float = v["is_float"]
    acc_type = "float" if is_float else _int_accumulator(kh * kw * group_channels, v["dtype"],
                                                         v["wide"])
    o0, o = ConstantLoop("o0", out_channels, 0, count), ConstantLoop("o", count)
    ky, kx = ConstantLoop("ky", kh), ConstantLoop("kx", kw)
    iy = _inside("iy", [(v["out_y"], sh), (ky, dh)], -pad_top, height)
    ix = _inside("ix", [(v["out_x"], sw), (kx, dw)], -pad_left, width)
    gather = _gather(v, iy, ix, ky, kx, group_channels, [("c0", 1)] if p.groups > 1 else [],
                     [(o0, kh * kw * group_channels), (o, kh * kw * group_channels),
                      (ky, kw * group_channels), (kx, group_channels)], acc_type)
    lines = []
    if p.groups > 1 and gather:  # then there are several output channels: o0 or o is written
        channel = c_sum([(o0, 1), (o, 1)])
        channel = channel if channel.isidentifier() else f"({channel})"
        lines = ["/* the first input channel of this output channel's group */",
                 f"const int c0 = {channel} / {group_outputs} * {group_channels};"]
    groups = f", {p.groups} groups" if p.groups > 1 else ""
    source = "input" if is_float else _summed(v, parenthesized=True)
    comment = c_comment(
        f"{v['name']}: {kh}x{kw} filter, stride {sh}x{sw}, dilation {dh}x{dw}{groups}; too large "
        f"for a stack column, so each output channel sums filter * {source} over the in-bounds "
        f"pixels of its window (padding adds zero), {count} channels at a time. Pixels are "
        f"written in NHWC order (ORDER CONTRACT, top of conv.c.j2).{_about(v)}")
    return _direct(v, o0, o, gather, lines, acc_type, comment)


def emit_conv_2d(ctx: OpContext) -> Kernel:
    v = conv_values(ctx)
    return Kernel(render_macro(TEMPLATE, v["kernel"], v),
                  (*v.get("helpers", ()), *v.get("output_helpers", ())),
                  definitions=definitions(v))


def definitions(v: dict) -> tuple[CDefinition, ...]:
    """What a convolution's function uses at file scope, in file order: its output stage (the
    requantizing function after the tables it reads, or a hybrid's tables), a uint8 filter's
    offset copy, a column kernel's widened filter, and a depthwise span's filter and bias."""
    rq, span = v["rq"], v.get("span")
    found = []
    if rq:
        found += [table_definition({"ctype": "uint32_t", **t}) for t in rq["tables"]]
        macro = "requantize_wide" if rq["wide"] else "requantize"
        found.append(definition(rq["fn"], render_macro(TEMPLATE, macro, rq), gap=True))
    elif v["hybrid"]:
        found += [table_definition(t) for t in v["hybrid"]["tables"]]
    if v["filter_copy"]:
        found.append(table_definition({"ctype": "int16_t", **v["filter_copy"]}))
    if v.get("kernel") == "conv_column" and v["wide"]:
        found.append(table_definition({"ctype": "int16_t", **v["wide"]}))
    if span:
        found += [table_definition({"comment": span["comment"], "ctype": v["w_ctype"],
                                    "name": span["filter_name"],
                                    "length": span["filter_length"], "data": span["filter"]}),
                  table_definition({"ctype": "int32_t", "name": span["bias_name"],
                                    "length": span["bias_length"], "data": span["bias"]})]
    return tuple(found)


# -- DEPTHWISE_CONV_2D -------------------------------------------------------------------------


@dataclass(frozen=True)
class _WindowAxis:
    """The window of an output position along one axis: the lines computing its origin (first
    input index) and tap bounds at run time, the origin as c_sum(origin, constant), the loop
    over the taps inside the image, and the test that they are all of the window's ([] always,
    None never)."""

    lines: list[str]
    origin: list
    constant: int
    taps: ConstantLoop | RuntimeLoop
    whole: list[str] | None

    @property
    def tap(self) -> ConstantLoop | str:
        """The tap loop as a c_sum term."""
        return self.taps if isinstance(self.taps, ConstantLoop) else self.taps.var


def _window_axis(axis: str, out: ConstantLoop, stride: int, dilation: int, pad: int, size: int,
                 k: int) -> _WindowAxis:
    """The taps k<axis> of output position `out` whose input index <axis>0 + k<axis> *
    dilation lies in [0, size): constant bounds where `out` is (or where no window is clipped
    at that end), else bounds computed per position."""
    origin, tap = f"{axis}0", f"k{axis}"

    def first(at: int) -> int:
        return -(at // dilation) if at < 0 else 0

    def end(at: int) -> int:
        return min(k, -(-(size - at) // dilation))

    origins = [o * stride - pad for o in _values(out)]
    clipped_start = any(first(at) for at in origins)
    clipped_end = any(end(at) != k for at in origins)
    if not (clipped_start or clipped_end):
        return _WindowAxis([], [(out, stride)], -pad, ConstantLoop(tap, k), [])
    if not out.written:
        at = origins[0]
        return _WindowAxis([], [], at, ConstantLoop(tap, end(at), first(at)), None)
    ceil = "" if dilation == 1 else f" + {dilation - 1}) / {dilation}"
    lines = [f"const int {origin} = {c_sum([(out, stride)], -pad)};"]
    start, stop, whole = "0", str(k), []
    if clipped_start:
        first_tap = f"-{origin}" if dilation == 1 else f"(-{origin}{ceil}"
        lines.append(f"const int {tap}_start = {origin} < 0 ? {first_tap} : 0;")
        start = f"{tap}_start"
        whole.append(f"{start} == 0")
    if clipped_end:
        room = f"{size} - {origin}" if dilation == 1 else f"({size} - {origin}{ceil}"
        lines += [f"const int {tap}_room = {room};",
                  f"const int {tap}_end = {tap}_room < {k} ? {tap}_room : {k};"]
        stop = f"{tap}_end"
        whole.append(f"{stop} == {k}")
    if not any(first(at) == 0 and end(at) == k for at in origins):
        whole = None  # no position's window is whole
    return _WindowAxis(lines, [(origin, 1)], 0, RuntimeLoop(tap, start, stop), whole)


def _span_test(y: _WindowAxis, x: _WindowAxis, out_w: int, pad_left: int, width: int,
               span: int, reach: int) -> list[str] | None:
    """The condition for pixels ox..ox+span-1 (stride 1) to have whole windows inside the
    image, the last tap of the last reaching `reach` past the first's origin."""
    if y.whole is None:
        return None
    low, high = _range([(ConstantLoop("ox", out_w - span + 1), 1)], -pad_left)
    if high < 0 or low + reach >= width:
        return None
    test = [*y.whole] + ([f"{c_sum(x.origin, x.constant)} >= 0"] if low < 0 else [])
    test.append(f"ox + {span} <= {out_w}")
    if high + reach >= width:
        test.append(f"{c_sum(x.origin, x.constant + reach)} < {width}")
    return test


def _depthwise_terms(p: DepthwiseConvParams, lane: ConstantLoop, xp: str, wp: str,
                     filter_stride: int, offset: int) -> list[str]:
    """The products of an interior pixel's taps, in (ky, kx) order: tap (ky, kx) reads the
    input and the filter at constant offsets from the window's first pixel (xp) and from the
    first tap (wp)."""
    _, _, width, channels = p.input_shape
    kh, kw = p.window.filter
    dh, dw = p.window.dilation
    terms = []
    for ky in range(kh):
        for kx in range(kw):
            at = (ky * dh * width + kx * dw) * channels
            tap = (ky * kw + kx) * filter_stride
            terms.append(_product(f"{xp}[{c_sum([(lane, 1)], at)}]",
                                  f"{wp}[{c_sum([(lane, 1)], tap)}]", offset))
    return terms


def _wrapped(v: dict, is_float: bool, head: str) -> tuple[str, str]:
    """The head and tail of a sum of products after `head`: an int8 sum in uint32_t, as
    TFLite's int32 sum wraps; a wide sum in int (it fits: at most MAX_UNROLLED_TAPS products),
    then added to the bias in int64_t."""
    if is_float or (v["wide"] and not v["int_bias"]):
        return head, ";"
    return (f"{head}(" if v["wide"] else f"{head}(uint32_t)("), ");"


def _depthwise_span(ctx: OpContext, v: dict, origin: tuple, span: int, span_test: list[str],
                    depth_pixel: int) -> tuple[dict, ConstantLoop]:
    """The pass of `span` horizontally adjacent interior pixels whose few int8 channels fill
    one vector together, with its filter and bias repeated for them; and its lane loop."""
    p: DepthwiseConvParams = ctx.params
    channels = p.input_shape[3]
    taps = p.window.filter[0] * p.window.filter[1]
    lanes = ConstantLoop("c", VECTOR_STEP)
    filt = p.weights[:, :, 0].T  # [tap, channel]
    span_w, span_bias = f"{ctx.prefix}_span_w", f"{ctx.prefix}_span_bias"
    xp, xp_lines = _pointer("xp", f"const {v['ctype']}", "x", *origin)
    xp_lines.append(f"const {v['w_ctype']} *wp = {span_w};")
    values = {
        "comment": c_comment(f"{v['name']}: the filter and bias repeated for {span} "
                             f"adjacent pixels ({taps * VECTOR_STEP + VECTOR_STEP * 4} "
                             "bytes of flash)"),
        "filter_name": span_w, "filter_length": c_length(taps * VECTOR_STEP),
        "filter": c_array(np.tile(filt, (1, span)).astype(np.int64)),
        "bias_name": span_bias, "bias_length": VECTOR_STEP,
        "bias": c_array(np.tile(np.asarray(p.bias, np.int64), span)),
        "condition": " && ".join(span_test),
        "inside": _comment(f"pixels ox..ox+{span - 1} all inside: their {span} x {channels} "
                           "channels fill one vector", depth_pixel + 1),
        "lines": xp_lines,
        "lanes": lanes,
        "sum": _sum_lines(f"acc[{lanes.index}] = (uint32_t){span_bias}[{lanes.index}] + "
                          "(uint32_t)(", _depthwise_terms(p, lanes, xp, "wp", VECTOR_STEP,
                                                          v["offset"]), ");"),
        "call": f"{v['rq']['fn']}(acc, {v['px']});",
        "skip": span - 1,
    }
    return values, lanes


def _depthwise_unrolled(p: DepthwiseConvParams, v: dict, whole: list[str], origin: tuple,
                        c0: ConstantLoop, c: ConstantLoop, depth_pixel: int) -> dict:
    """The one pass of a pixel whose whole window is inside the image, each tap at a constant
    offset."""
    xp, xp_lines = _pointer("xp", f"const {v['ctype']}", "x", [*origin[0], (c0, 1)], origin[1])
    wp, wp_lines = _pointer("wp", f"const {v['w_ctype']}", "w", [(c0, 1)])
    bias = ""
    if v["int_bias"]:
        bias = f"{'' if v['wide'] else '(uint32_t)'}bias[{c_sum([(c0, 1), (c, 1)])}] + "
    head, tail = _wrapped(v, isinstance(p.output, FloatClamp), f"acc[{c.index}] = {bias}")
    return {
        "condition": " && ".join(whole),
        "comment": _comment("the whole window inside the image: each tap at a constant "
                            "offset, one pass", depth_pixel + _nested(c0, bool(whole))),
        "lines": xp_lines + wp_lines,
        "lanes": c,
        "sum": _sum_lines(head, _depthwise_terms(p, c, xp, wp, p.output_shape[3], v["offset"]),
                          tail),
    }


def _depthwise_taps(p: DepthwiseConvParams, v: dict, y, x, c0: ConstantLoop, c: ConstantLoop,
                    block: int) -> tuple[dict, list[ConstantLoop]]:
    """The loops over the taps inside the image, for the pixels whose window is not whole; and
    the loops they add."""
    shape, multiplier = p.input_shape, p.depth_multiplier
    is_float = isinstance(p.output, FloatClamp)
    (dh, dw), kw, out_channels = p.window.dilation, p.window.filter[1], p.output_shape[3]
    ctype, offset, b = v["ctype"], v["offset"], v["batch"]
    count = ConstantLoop("c", block * multiplier)
    init = "0"
    if v["int_bias"]:
        init = (f"{'' if v['wide'] else '(uint32_t)'}"
                f"bias[{c_sum([(c0, multiplier), (count, 1)])}]")
    terms, first = _nhwc(b, shape, [*y.origin, (y.tap, dh)], [*x.origin, (x.tap, dw)],
                         (y.constant, x.constant), [(c0, 1)])
    w_terms = [(y.tap, kw * out_channels), (x.tap, out_channels), (c0, multiplier)]
    # no tap of some axis is ever inside the image (dilated taps around a narrow image)
    runs = y.taps.runs and x.taps.runs
    taps = {"init": count, "init_step": f"acc[{count.index}] = {init};", "runs": runs,
            "ky": y.taps, "kx": x.taps, "channel": c}
    loops = [y.taps, x.taps, count] if runs else [count]
    if runs and multiplier == 1:
        xv, x_lines = _walk("xp", f"const {ctype}", "x", terms, first, c)
        wv, w_lines = _walk("wp", f"const {v['w_ctype']}", "w", w_terms, 0, c)
        product = _product(xv, wv, offset)
        taps.update(lines=x_lines + w_lines, xv=None, multiplier=None,
                    step=f"acc[{c.index}] += {product if is_float else _added(v, product)};")
    elif runs:
        m = ConstantLoop("m", multiplier)
        loops.append(m)
        xv, x_lines = _walk("xp", f"const {ctype}", "x", terms, first, c)
        wp, w_lines = _pointer("wp", f"const {v['w_ctype']}", "w", w_terms)
        at = c_sum([(c, multiplier), (m, 1)])
        taps.update(
            lines=x_lines + w_lines, multiplier=m,
            xv=f"const float xv = {xv};" if is_float
            else f"const int32_t xv = {xv}{plus(offset)};",
            step=f"acc[{at}] += xv * {wp}[{at}];" if is_float
            else f"acc[{at}] += {_added(v, f'xv * {wp}[{at}]')};")
    return taps, loops


def depthwise_values(ctx: OpContext) -> dict:
    p: DepthwiseConvParams = ctx.params
    shape = p.input_shape
    _, height, width, channels = shape
    _, out_h, out_w, _ = p.output_shape
    multiplier = p.depth_multiplier
    kh, kw = p.window.filter
    (sh, sw), (dh, dw), (pad_top, pad_left) = p.window.stride, p.window.dilation, p.window.padding
    # input channels per pass: their accumulators (block * multiplier) fit the stack
    block = _block(channels, _accumulator_bytes(p) * multiplier)
    unrolled = multiplier == 1 and kh * kw <= MAX_UNROLLED_TAPS
    y = _window_axis("y", ConstantLoop("oy", out_h), sh, dh, pad_top, height, kh)
    x = _window_axis("x", ConstantLoop("ox", out_w), sw, dw, pad_left, width, kw)
    # int8 with fewer channels than a vector: `span` horizontally adjacent interior pixels fill
    # the vector together (stride 1: their channels are contiguous in the input too)
    span, span_test = 1, None
    if (unrolled and ctx.inputs[0].dtype in QUANTIZED and channels < VECTOR_STEP
            and VECTOR_STEP % channels == 0 and sw == 1 and out_w >= VECTOR_STEP // channels):
        span = VECTOR_STEP // channels
        span_test = _span_test(y, x, out_w, pad_left, width, span, span - 1 + (kw - 1) * dw)
        span = span if span_test is not None else 1
    v = _common(ctx, 0, 2, block * multiplier, channels // block, repeat=span > 1)
    b = v["batch"]
    c0, c = ConstantLoop("c0", channels, 0, block), ConstantLoop("c", block)
    loops = [b, v["out_y"], v["out_x"], c0, c, v["acc_init"]]
    depth_pixel = _nested(b, v["out_y"], v["out_x"])
    # the input at the window's first tap
    origin = _nhwc(b, shape, y.origin, x.origin, (y.constant, x.constant))
    v["span"] = None
    if span > 1:
        v["span"], lanes = _depthwise_span(ctx, v, origin, span, span_test, depth_pixel)
        loops.append(lanes)
    whole = _both(y.whole, x.whole) if unrolled else None
    v["unrolled"] = (None if whole is None else
                     _depthwise_unrolled(p, v, whole, origin, c0, c, depth_pixel))
    v["taps"] = None
    if whole != []:  # unless every window is whole, and the unrolled pass is all
        v["taps"], tap_loops = _depthwise_taps(p, v, y, x, c0, c, block)
        loops += tap_loops
    finish = _finish(v, [(c0, multiplier)], depth_pixel + _nested(c0))
    loops.append(finish["loop"] or c)
    reads = v["taps"] is None or v["taps"]["runs"]
    y_lines = y.lines if reads else []
    if y_lines:
        y_lines = [f"/* the taps ky with y0 + {c_sum([('ky', dh)])} inside the image */", *y_lines]
    multiplied = (f", depth multiplier {multiplier}: output channel c * {multiplier} + m reads "
                  "input channel c" if multiplier > 1 else "")
    v.update(
        y_lines=y_lines, x_lines=x.lines if reads else [], block=c0, finish=finish,
        declarations=_declarations(v, [], loops, () if reads else ("x", "w")),
        filter_copy=_read(v["filter_copy"], () if reads else ("w",)),
        comment=c_comment(
            f"{v['name']}: {kh}x{kw} filter, stride {sh}x{sw}, dilation {dh}x{dw}{multiplied}. "
            "Taps outside the image are skipped (padding adds zero). Pixels are written in NHWC "
            f"order (ORDER CONTRACT, top of conv.c.j2).{_about(v)}"),
    )
    return v


def emit_depthwise_conv_2d(ctx: OpContext) -> Kernel:
    v = depthwise_values(ctx)
    return Kernel(render_macro(TEMPLATE, "depthwise", v), v.get("output_helpers", ()),
                  definitions=definitions(v))


# -- TRANSPOSE_CONV ----------------------------------------------------------------------------


def transpose_conv_values(ctx: OpContext) -> dict:
    p: TransposeConvParams = ctx.params
    _, height, width, channels = p.input_shape
    _, out_h, out_w, out_channels = p.output_shape
    kh, kw = p.window.filter
    (sh, sw), (pad_top, pad_left) = p.window.stride, p.window.padding
    count = _block(out_channels, _accumulator_bytes(p))
    v = _common(ctx, 2, 3, count, out_channels // count)
    is_float = v["is_float"]
    # an output pixel receives at most ceil(kh / sh) * ceil(kw / sw) input pixels
    reach = -(-kh // sh) * -(-kw // sw)
    acc_type = "float" if is_float else _int_accumulator(reach * channels, v["dtype"], v["wide"])
    o0, o = ConstantLoop("o0", out_channels, 0, count), ConstantLoop("o", count)
    ky, kx = ConstantLoop("ky", kh), ConstantLoop("kx", kw)
    iy = _scattered("y", v["out_y"], ky, pad_top, sh, height)
    ix = _scattered("x", v["out_x"], kx, pad_left, sw, width)
    gather = _gather(v, iy, ix, ky, kx, channels, [],
                     [(o0, kh * kw * channels), (o, kh * kw * channels), (ky, kw * channels),
                      (kx, channels)], acc_type)
    source = "input" if is_float else _summed(v, parenthesized=True)
    comment = c_comment(
        f"{v['name']}: {kh}x{kw} filter, stride {sh}x{sw}, output {out_h}x{out_w} (the output "
        "shape operand, applied when this function was generated); each output channel of a "
        f"pixel sums filter[o][ky][kx] . {source} over the input pixels whose patch covers the "
        f"pixel, {count} channels at a time (TFLite scatters the same products into an "
        f"{'int64' if v['wide'] else 'int32'} scratch plane).")
    return _direct(v, o0, o, gather, [], acc_type, comment)


def emit_transpose_conv(ctx: OpContext) -> Kernel:
    v = transpose_conv_values(ctx)
    return Kernel(render_macro(TEMPLATE, "direct", v), v.get("output_helpers", ()),
                  definitions=definitions(v))


def convolution_scratch(p) -> tuple[MemoryRequest, ...]:
    """A hybrid kernel quantizes its input to int8 into the arena, image by image."""
    if isinstance(p.output, HybridRescale):
        return (MemoryRequest(math.prod(p.input_shape), "the input quantized to int8"),)
    return ()
