"""Params for the elementwise binary ops: ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM, SQUARED_DIFFERENCE.

Four arithmetic shapes, following TFLite's reference kernels:
- `PlainParams`: float32 and int32 (and int8/uint8/int16 MAXIMUM/MINIMUM, which compare stored
  values): the op in the tensor's own type, then the fused activation's clamp.
- `RescaledParams`: int8, uint8 and int16 ADD and SUB, int8 SQUARED_DIFFERENCE: each input is
  shifted left and rescaled to a common scale by its own multiplier, combined, then rescaled to
  the output. The legacy uint8 kernels compute exactly as the int8 ones, in their own range.
- `ShiftedParams`: int16 ADD and SUB whose scales are all powers of two (TFLite's
  `pot_scale_int16` path): the input with the finer scale is divided by a power of two, the
  sum or difference saturates to int16.
- `ScaledProductParams`: int8, uint8 and int16 MUL: the product of the offset inputs, rescaled
  once.

C emission.

C emitters for the elementwise binary ops (ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM,
SQUARED_DIFFERENCE), from the same params as runtime_py.

The broadcast is collapsed here to the fewest loops with constant strides: dimensions of size 1
vanish and adjacent dimensions that both inputs walk (or skip) alike merge, so equal shapes are
one flat loop and, e.g., a per-channel operand is two loops. Each op's arithmetic is C text
from the tables below; the template only lays out the function and the loop nest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier
from toolchain.numerics.quant import (
    ACTIVATION_FLOAT_RANGE,
    INT_RANGES,
    activation_range_quantized,
    per_tensor_quantization,
    quantize_multiplier,
    require_int16_zero_points,
)
from toolchain.ops import overlaps
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_int32,
    c_offset,
    render_macro,
)
from toolchain.ops.spec import OpSpec, kernels

# The fused activations TFLite clamps with; it silently ignores any other for float and int32
# (and rejects it for int8), so we refuse them rather than compute something else.
CLAMPING_ACTIVATIONS = frozenset(ACTIVATION_FLOAT_RANGE)

# Left shift that gives int8 inputs headroom before rescaling (add.cc, sub.cc); int16 inputs
# have less room to grow.
ADD_LEFT_SHIFT = 20
INT16_ADD_LEFT_SHIFT = 15
# CheckedLog2's tolerance: a scale this close to a power of two counts as one.
POWER_OF_TWO_TOLERANCE = 1e-3
# gemmlowp's rounding division of an int16 value takes exponents up to 31.
MAX_POWER_OF_TWO_SHIFT = 31
# From this many bits on, that division's 16-bit mask is all ones: every value rounds to 1, or
# to -1 if negative (0 too rounds to 1), as LiteRT computes.
INT16_MASK_BITS = 16
# squared_difference.cc shifts less so that the square of the difference fits in int32.
SQUARED_DIFFERENCE_LEFT_SHIFT = 7

# Ops whose options carry a fused activation.
FUSED_ACTIVATION_OPS = frozenset({"ADD", "SUB", "MUL", "DIV"})

# Most dimensions a broadcast (unequal input shapes) may have: the reference kernels' 6-D loops,
# and what a generated C loop nest spells out. Equal shapes run flat at any rank.
MAX_BROADCAST_RANK = 6


@dataclass(frozen=True)
class BinaryOpParams:
    """What every elementwise binary op knows: which op, and the (numpy-broadcast) shapes."""

    opcode: str
    input1_shape: tuple[int, ...]
    input2_shape: tuple[int, ...]
    output_shape: tuple[int, ...]


@dataclass(frozen=True)
class PlainParams(BinaryOpParams):
    """The op computed in the tensors' own type (int32 wrapping as C does), then clamped to
    [clamp_min, clamp_max]; `clamp_min` is None for ops without a fused activation."""

    dtype: str
    clamp_min: float | int | None
    clamp_max: float | int | None


@dataclass(frozen=True)
class RescaledInputs(BinaryOpParams):
    """Two quantized inputs brought to a common scale: input n becomes
    MultiplyByQuantizedMultiplier((x + offset_n) << left_shift, multiplier_n, shift_n)."""

    dtype: str  # of the inputs
    left_shift: int
    input1_offset: int
    input1_multiplier: int
    input1_shift: int
    input2_offset: int
    input2_multiplier: int
    input2_shift: int


@dataclass(frozen=True)
class RescaledParams(RescaledInputs):
    """int8 and uint8 ADD/SUB (int8 SQUARED_DIFFERENCE): the inputs at a common scale
    (RescaledInputs) are combined (sum, difference, squared difference) and the result is
    rescaled to the output (of the inputs' dtype), offset and clamped."""

    output_offset: int
    output_multiplier: int
    output_shift: int
    activation_min: int
    activation_max: int


@dataclass(frozen=True)
class ShiftedParams(BinaryOpParams):
    """int16 ADD/SUB with power-of-two scales (zero points 0): each input divided by
    2^input<n>_shift with rounding (at most one shift is not 0), then their sum or difference,
    saturated to int16 and clamped."""

    input1_shift: int
    input2_shift: int
    activation_min: int
    activation_max: int


@dataclass(frozen=True)
class ScaledProductParams(BinaryOpParams):
    """int8 MUL: out = offset + rescale((in1 + off1) * (in2 + off2)), clamped."""

    input1_offset: int
    input2_offset: int
    output_offset: int
    output_multiplier: int
    output_shift: int
    activation_min: int
    activation_max: int


def _operands(graph: Graph, op: Operator) -> tuple[Tensor, Tensor, Tensor]:
    if len(op.inputs) != 2 or len(op.outputs) != 1 or min(op.inputs) < 0:
        raise UnsupportedOpError(f"{op.opcode} needs exactly two inputs and one output")
    a, b = (graph.tensors[i] for i in op.inputs)
    out = graph.tensors[op.outputs[0]]
    if not a.dtype == b.dtype == out.dtype:
        raise UnsupportedOpError(
            f"{op.opcode} with mixed dtypes {a.dtype}, {b.dtype} -> {out.dtype}")
    return a, b, out


def _shapes(op: Operator, a: Tensor, b: Tensor, out: Tensor,
            max_rank: int = MAX_BROADCAST_RANK) -> dict:
    """The shape fields of the params, once the inputs are known to broadcast to the output
    (over at most `max_rank` dimensions where their shapes differ)."""
    try:
        broadcast = tuple(np.broadcast_shapes(a.shape, b.shape))
    except ValueError:
        raise UnsupportedOpError(f"shapes {a.shape} and {b.shape} do not broadcast") from None
    if broadcast != out.shape:
        raise UnsupportedOpError(f"output shape {out.shape} is not the broadcast {broadcast}")
    if a.shape != b.shape and len(broadcast) > max_rank:
        raise UnsupportedOpError(f"broadcasting over more than {max_rank} dimensions")
    return {"opcode": op.opcode, "input1_shape": a.shape, "input2_shape": b.shape,
            "output_shape": out.shape}


def _activation(op: Operator) -> str:
    activation = op.options.get("fused_activation_function", "NONE")
    if activation not in CLAMPING_ACTIVATIONS:
        raise UnsupportedOpError(f"fused activation {activation}")
    return activation


def _plain_clamp(activation: str, dtype: str) -> tuple[float | int, float | int]:
    """CalculateActivationRange<T>: unbounded ends become the type's extremes, so float results
    of +-inf are clamped to +-FLT_MAX even without an activation."""
    low, high = ACTIVATION_FLOAT_RANGE[activation]
    if dtype == "float32":
        extreme = float(np.finfo(np.float32).max)
        return max(low, -extreme), min(high, extreme)
    type_min, type_max = INT_RANGES[dtype]
    return int(max(low, type_min)), int(min(high, type_max))


def _multiplier_below_one(real: float, what: str) -> tuple[int, int]:
    """QuantizeMultiplierSmallerThanOneExp, which TFLite asserts is given a value in (0, 1)."""
    multiplier, shift = quantize_multiplier(real)
    if not 0.0 < real < 1.0 or shift > 0:
        raise UnsupportedOpError(f"{what} multiplier {real} is outside (0, 1)")
    return multiplier, shift


def _prepare_plain(op: Operator, a: Tensor, b: Tensor, out: Tensor) -> PlainParams:
    """float32 and int32: the op in their own type, clamped by the fused activation if any."""
    if op.opcode in FUSED_ACTIVATION_OPS:
        clamp_min, clamp_max = _plain_clamp(_activation(op), out.dtype)
    else:
        clamp_min = clamp_max = None
    return PlainParams(**_shapes(op, a, b, out), dtype=out.dtype,
                       clamp_min=clamp_min, clamp_max=clamp_max)


def _prepare_int8_select(op: Operator, a: Tensor, b: Tensor, out: Tensor) -> PlainParams:
    """int8, uint8 and int16 MAXIMUM/MINIMUM compare stored values, which means something only
    when both inputs and the output share one quantization (TFLite checks neither scales nor
    zero points, int16 ones included; we refuse otherwise)."""
    if len({per_tensor_quantization(t) for t in (a, b, out)}) != 1:
        raise UnsupportedOpError(f"{out.dtype} inputs and output need identical quantization")
    return PlainParams(**_shapes(op, a, b, out), dtype=out.dtype, clamp_min=None, clamp_max=None)


def _checked_log2(scale: float) -> int | None:
    """CheckedLog2 in float32: the rounded log2 of the scale if that is within 1e-3 of it (the
    scale is a power of two, near enough), else None."""
    log2 = float(np.float32(np.log(np.float32(scale))) * np.float32(1.0 / np.log(2.0)))
    rounded = round(log2)
    return rounded if abs(log2 - rounded) < POWER_OF_TWO_TOLERANCE else None


def _int16_power_of_two_log2s(op: Operator, a: Tensor, b: Tensor,
                              out: Tensor) -> tuple[int, int, int] | None:
    """TFLite's choice between the two 16x8 ADD/SUB paths: the shift path when the options set
    `pot_scale_int16` (the schema's default once the options table is there; an op without
    one reads false) and every scale is a power of two. Then the scales' log2, else None."""
    if not op.options.get("pot_scale_int16", False):
        return None
    log2s = tuple(_checked_log2(per_tensor_quantization(t)[0]) for t in (a, b, out))
    return None if None in log2s else log2s


def _prepare_int16_shifted(op: Operator, a: Tensor, b: Tensor, out: Tensor,
                           log2s: tuple[int, int, int]) -> ShiftedParams:
    """add.cc / sub.cc on power-of-two scales: an input whose scale is 2^k times finer than the
    output's is divided by 2^k; TFLite requires the other input to be at the output's scale."""
    log2_1, log2_2, log2_out = log2s
    shift1, shift2 = log2_out - log2_1, log2_out - log2_2
    if min(shift1, shift2) < 0:
        raise UnsupportedOpError("int16 power-of-two scales: an input scale is coarser than "
                                 "the output's (TFLite refuses it)")
    if shift1 and shift2:
        raise UnsupportedOpError("int16 power-of-two scales: both input scales differ from "
                                 "the output's (TFLite refuses it)")
    if max(shift1, shift2) > MAX_POWER_OF_TWO_SHIFT:
        raise UnsupportedOpError(f"int16 power-of-two scales: an input shift of more than "
                                 f"{MAX_POWER_OF_TWO_SHIFT} bits")
    if op.opcode == "ADD" and not a.num_elements == b.num_elements == out.num_elements:
        raise UnsupportedOpError("int16 ADD with power-of-two scales does not broadcast "
                                 "(TFLite aborts)")
    act_min, act_max = activation_range_quantized(_activation(op), out)
    return ShiftedParams(**_shapes(op, a, b, out), input1_shift=shift1, input2_shift=shift2,
                         activation_min=act_min, activation_max=act_max)


def _prepare_int8_rescaled(op: Operator, a: Tensor, b: Tensor, out: Tensor, left_shift: int,
                           output_scale_power: int) -> RescaledParams | ShiftedParams:
    """The common-scale pipeline of add.cc / sub.cc / squared_difference.cc, in double as there:
    both inputs go to half the larger input scale and the output multiplier undoes that
    (squared for SQUARED_DIFFERENCE: `output_scale_power` 2). int16 ADD and SUB (zero points
    0) shift less, or take the shift path of power-of-two scales."""
    if out.dtype == "int16":
        require_int16_zero_points(a, b, out)
        log2s = _int16_power_of_two_log2s(op, a, b, out)
        if log2s is not None:
            return _prepare_int16_shifted(op, a, b, out, log2s)
        left_shift = INT16_ADD_LEFT_SHIFT
    (scale1, zp1), (scale2, zp2), (scale_out, zp_out) = map(per_tensor_quantization, (a, b, out))
    twice_max_input_scale = 2.0 * max(scale1, scale2)
    real_output = twice_max_input_scale**output_scale_power / (
        (1 << (left_shift * output_scale_power)) * scale_out)
    m1, s1 = _multiplier_below_one(scale1 / twice_max_input_scale, "input1")
    m2, s2 = _multiplier_below_one(scale2 / twice_max_input_scale, "input2")
    m_out, s_out = _multiplier_below_one(real_output, "output")
    if op.opcode in FUSED_ACTIVATION_OPS:
        act_min, act_max = activation_range_quantized(_activation(op), out)
    else:
        act_min, act_max = INT_RANGES[out.dtype]
    return RescaledParams(
        **_shapes(op, a, b, out), dtype=out.dtype, left_shift=left_shift,
        input1_offset=-zp1, input1_multiplier=m1, input1_shift=s1,
        input2_offset=-zp2, input2_multiplier=m2, input2_shift=s2,
        output_offset=zp_out, output_multiplier=m_out, output_shift=s_out,
        activation_min=act_min, activation_max=act_max)


def _prepare_int8_product(op: Operator, a: Tensor, b: Tensor, out: Tensor) -> ScaledProductParams:
    """mul.cc: real multiplier in1_scale * in2_scale / out_scale, evaluated in float (the
    scales are floats and the expression is not cast) before it is widened to double."""
    require_int16_zero_points(a, b, out)
    (scale1, zp1), (scale2, zp2), (scale_out, zp_out) = map(per_tensor_quantization, (a, b, out))
    real = float(np.float32(scale1) * np.float32(scale2) / np.float32(scale_out))
    multiplier, shift = quantize_multiplier(real)
    act_min, act_max = activation_range_quantized(_activation(op), out)
    return ScaledProductParams(
        **_shapes(op, a, b, out), input1_offset=-zp1, input2_offset=-zp2, output_offset=zp_out,
        output_multiplier=multiplier, output_shift=shift,
        activation_min=act_min, activation_max=act_max)


# The quantized pipeline of each op that runs on int8 (and on uint8 and int16, but
# SQUARED_DIFFERENCE: its TFLite kernel computes int8 only).
_QUANTIZED_PREPARE = {
    "ADD": partial(_prepare_int8_rescaled, left_shift=ADD_LEFT_SHIFT, output_scale_power=1),
    "SUB": partial(_prepare_int8_rescaled, left_shift=ADD_LEFT_SHIFT, output_scale_power=1),
    "SQUARED_DIFFERENCE": partial(_prepare_int8_rescaled, left_shift=SQUARED_DIFFERENCE_LEFT_SHIFT,
                                  output_scale_power=2),
    "MUL": _prepare_int8_product,
    "MAXIMUM": _prepare_int8_select,
    "MINIMUM": _prepare_int8_select,
}


OPCODES = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE")

# dtypes each op runs on: float32 and int32 everywhere, the quantized types where it has a
# pipeline. TFLite's SQUARED_DIFFERENCE takes neither uint8 nor int16: its Eval fails on any
# other output type than float32, int32 and int8.
_QUANTIZED_DTYPES = {"ADD": {"int8", "uint8", "int16"}, "SUB": {"int8", "uint8", "int16"},
                     "MUL": {"int8", "uint8", "int16"}, "MAXIMUM": {"int8", "uint8", "int16"},
                     "MINIMUM": {"int8", "uint8", "int16"}, "SQUARED_DIFFERENCE": {"int8"}}
DTYPES: dict[str, frozenset[str]] = {
    opcode: frozenset({"float32", "int32", *_QUANTIZED_DTYPES.get(opcode, ())})
    for opcode in OPCODES
}


def prepare(graph: Graph, op: Operator) -> BinaryOpParams:
    """int8, uint8 and int16 take the op's quantized pipeline; float32 and int32 the plain
    one."""
    a, b, out = _operands(graph, op)
    if out.dtype not in DTYPES[op.opcode]:
        raise UnsupportedOpError(f"{op.opcode} on {out.dtype}")
    if out.dtype in ("int8", "uint8", "int16"):
        return _QUANTIZED_PREPARE[op.opcode](op, a, b, out)
    return _prepare_plain(op, a, b, out)




TEMPLATE = "c/elementwise.c.j2"
# The rescaled int8 inputs and the int8 products are int32 values.
WIDE_TYPE = "int32_t"
BYTE_VALUES = 256  # values of an int8 or uint8 element


def _plus(value: int) -> str:
    """`+ 3` or `- 10`: an added constant as it reads best after an operand."""
    return f"+ {value}" if value >= 0 else f"- {-value}"


@dataclass(frozen=True)
class Loop:
    """One collapsed dimension: `n` iterations, element strides of input1, input2 (0 where that
    input is broadcast) and of the output."""

    n: int
    sa: int
    sb: int
    so: int


def broadcast_loops(shape1: tuple[int, ...], shape2: tuple[int, ...],
                    out_shape: tuple[int, ...]) -> list[Loop]:
    """Loops, outermost first, that visit the output in order. The innermost loop has stride 1
    for the output and for each input it walks. An empty list means an empty output."""
    return [Loop(n, sa, sb, so) for n, (sa, sb), so in
            collapsed_loops((shape1, shape2), out_shape)]


def collapsed_loops(shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...]
                    ) -> list[tuple[int, tuple[int, ...], int]]:
    """The broadcast of any number of inputs as (trips, each input's element stride, 0 where
    it is broadcast, the output's stride) per loop, outermost first: dimensions of size 1
    vanish and adjacent dimensions every input walks (or skips) alike merge."""
    if any(n == 0 for n in out_shape):
        return []
    rank = len(out_shape)
    padded = [(1,) * (rank - len(shape)) + tuple(shape) for shape in shapes]
    merged: list[list] = []  # [size, which inputs walk it]
    for k, n in enumerate(out_shape):
        if n == 1:
            continue
        walks = tuple(shape[k] == n for shape in padded)
        if merged and merged[-1][1] == walks:
            merged[-1][0] *= n
        else:
            merged.append([n, walks])
    if not merged:  # a single element
        merged = [[1, (True,) * len(shapes)]]
    loops = []
    strides, stride_out = [1] * len(shapes), 1
    for n, walks in reversed(merged):
        loops.append((n, tuple(s if w else 0 for s, w in zip(strides, walks)), stride_out))
        strides = [s * n if w else s for s, w in zip(strides, walks)]
        stride_out *= n
    return loops[::-1]


Load = Callable[[str], str]  # an input element's C text -> the value `_op` takes
_CONSTANT_HERE = " /* constant along this loop */"


def broadcast_nest(loops: list[Loop], ctype: str, wide: str, op: str,
                   loads: tuple[Load, Load] = (str, str), ivdep: bool = True,
                   in_ctype: str | None = None) -> dict:
    """The loop nest of `loops` as C text: loop k derives the pointers a<k+1>, b<k+1>, o<k+1>
    from a<k>, b<k>, o<k> (the operands at level 0); the innermost loop stores `op(x, y)` of
    one element of each input, hoisting an input it does not walk into a constant of type
    `wide`. The nest writes output element j right after reading the input elements it needs.
    The inputs are of C type `in_ctype` where it differs from the output's `ctype`."""
    in_ctype = in_ctype or ctype
    levels = []
    for k, loop in enumerate(loops[:-1]):
        i = ConstantLoop(f"i{k}", loop.n)
        levels.append({
            "header": i.header,
            "pad": "  " * (k + 1),
            "pointers": [
                f"const {in_ctype} *a{k + 1} = {c_offset(f'a{k}', [(i, loop.sa)])};",
                f"const {in_ctype} *b{k + 1} = {c_offset(f'b{k}', [(i, loop.sb)])};",
                f"{ctype} *o{k + 1} = {c_offset(f'o{k}', [(i, loop.so)])};",
            ],
        })
    depth = len(loops) - 1
    inner = ConstantLoop("i", loops[-1].n)
    a, b = (loads[0](f"a{depth}[{inner.index}]"), loads[1](f"b{depth}[{inner.index}]"))
    hoisted = None
    if not loops[-1].sa:
        hoisted, a = f"const {wide} x = {loads[0](f'a{depth}[0]')};{_CONSTANT_HERE}", "x"
    elif not loops[-1].sb:
        hoisted, b = f"const {wide} y = {loads[1](f'b{depth}[0]')};{_CONSTANT_HERE}", "y"
    return {
        "outer": levels,
        "inner": {
            "loop": inner,
            "pad": "  " * (depth + 1),
            "hoisted": hoisted,
            "ivdep": ivdep and inner.written,
            "statement": f"o{depth}[{inner.index}] = {op}({a}, {b});",
        },
    }


# -- the arithmetic of each op, in C ---------------------------------------------------------

# The plain ops' result `r` of x and y in the tensors' type `{t}`, line by line.
_FLOAT_BODIES: dict[str, tuple[str, ...]] = {
    "ADD": ("{t} r = x + y;",),
    "SUB": ("{t} r = x - y;",),
    "MUL": ("{t} r = x * y;",),
    "DIV": ("{t} r = x / y; /* IEEE: a zero divisor gives an infinity or NaN */",),
    "MAXIMUM": ("{t} r = x > y ? x : y; /* TFLite's select: a NaN in x yields y */",),
    "MINIMUM": ("{t} r = x < y ? x : y; /* TFLite's select: a NaN in x yields y */",),
    "SQUARED_DIFFERENCE": ("const {t} d = x - y;", "{t} r = d * d;"),
}
_WRAPS = ("/* TFLite's int32 wraps on overflow; uint32_t arithmetic wraps without undefined "
          "behaviour. */")
_INT_BODIES: dict[str, tuple[str, ...]] = {
    "ADD": (_WRAPS, "{t} r = ({t})((uint32_t)x + (uint32_t)y);"),
    "SUB": (_WRAPS, "{t} r = ({t})((uint32_t)x - (uint32_t)y);"),
    "MUL": (_WRAPS, "{t} r = ({t})((uint32_t)x * (uint32_t)y);"),
    "DIV": (
        "/* C division truncates toward zero as TFLite's does. TFLite refuses a zero divisor,",
        "   which a void kernel cannot report: x / 0 gives 0 here, as in runtime_py.",
        "   INT32_MIN / -1 wraps to INT32_MIN. */",
        "{t} r = y == 0 ? 0 : y == -1 ? ({t})(0u - (uint32_t)x) : x / y;",
    ),
    "MAXIMUM": ("{t} r = x > y ? x : y;",),
    "MINIMUM": ("{t} r = x < y ? x : y;",),
    "SQUARED_DIFFERENCE": (_WRAPS, "const uint32_t d = (uint32_t)x - (uint32_t)y;",
                           "{t} r = ({t})(d * d);"),
}
# How the rescaled int8 inputs x and y (int32 values at a common scale) combine.
_COMBINED: dict[str, str] = {
    "ADD": "x + y",
    "SUB": "x - y",
    "SQUARED_DIFFERENCE": "(x - y) * (x - y)",
}


def _clamp_lines(low: str | None, high: str | None) -> list[str]:
    """Clamping `r` between bounds (None: nothing to clamp at that end), as two selects, a form
    compilers turn into vector min/max."""
    lines = [] if low is None else [f"r = r < {low} ? {low} : r;"]
    return lines + ([] if high is None else [f"r = r > {high} ? {high} : r;"])


def _bound(value: float | int | None, extreme: int | None, fmt) -> str | None:
    """C text of one clamp bound, None where there is nothing to clamp (no activation, or an
    integer type's own extreme, which would also trip -Wtype-limits)."""
    return None if value is None or value == extreme else fmt(value)


def _plain_values(p: PlainParams, ctype: str) -> dict:
    is_float = p.dtype == "float32"
    low, high = (None, None) if is_float else INT_RANGES[p.dtype]
    fmt = c_float if is_float else c_int32
    # float clamps even without an activation: infinities become +-FLT_MAX
    clamp = _clamp_lines(_bound(p.clamp_min, low, fmt), _bound(p.clamp_max, high, fmt))
    body = (_FLOAT_BODIES if is_float else _INT_BODIES)[p.opcode]
    return {"macro": "plain_op", "wide": ctype, "loads": (str, str),
            "body": [line.format(t=ctype) for line in body] + clamp}


def rescaled_inputs(p: RescaledInputs, offset: int, multiplier: int, shift: int) -> np.ndarray:
    """The rescaled value of every input value, the type's lowest first: runtime_py's input
    stage, exactly."""
    low, high = INT_RANGES[p.dtype]
    values = np.arange(low, high + 1, dtype=np.int64)
    return multiply_by_quantized_multiplier((values + offset) << p.left_shift, multiplier, shift)


def _rescaled_input_table(p: RescaledParams, offset: int, multiplier: int,
                          shift: int) -> str:
    return c_array(rescaled_inputs(p, offset, multiplier, shift), per_line=8)


def _rescaled_values(p: RescaledParams, prefix: str, ctype: str) -> dict:
    if p.dtype == "int16":  # no table of 65536 values: each input is rescaled as it is read
        return _rescaled_computed_values(p, prefix, ctype)
    return {
        "macro": "rescaled_op", "wide": WIDE_TYPE, "left_shift": p.left_shift,
        "table_length": BYTE_VALUES,
        "tables": [_rescaled_input_table(p, p.input1_offset, p.input1_multiplier,
                                         p.input1_shift),
                   _rescaled_input_table(p, p.input2_offset, p.input2_multiplier,
                                         p.input2_shift)],
        "loads": tuple(_table_load(f"{prefix}_in{n}", -INT_RANGES[p.dtype][0]) for n in (1, 2)),
        "body": [f"{WIDE_TYPE} r = {_COMBINED[p.opcode]};",
                 f"r = arenac_mbqm(r, {p.output_multiplier}, {p.output_shift}) "
                 f"{_plus(p.output_offset)};",
                 *_clamp_lines(str(p.activation_min), str(p.activation_max)),
                 f"return ({ctype})r;"],
    }


def _rescaled_computed_values(p: RescaledParams, prefix: str, ctype: str) -> dict:
    """int16 ADD and SUB (zero points 0): MultiplyByQuantizedMultiplierSmallerThanOneExp of
    each input shifted left, computed per element; |x| <= 2^15, so x * 2^15 fits in int32."""
    return {
        "macro": "rescaled_computed_op", "wide": WIDE_TYPE, "scale_up": 1 << p.left_shift,
        "comment": c_comment(f"Each int16 input shifted left {p.left_shift} bits for headroom "
                             "and rescaled to the common scale (TFLite's "
                             "MultiplyByQuantizedMultiplierSmallerThanOneExp)."),
        "inputs": [{"multiplier": p.input1_multiplier, "shift": p.input1_shift},
                   {"multiplier": p.input2_multiplier, "shift": p.input2_shift}],
        "loads": (lambda e: f"{prefix}_in1({e})", lambda e: f"{prefix}_in2({e})"),
        "body": [f"{WIDE_TYPE} r = {_COMBINED[p.opcode]};",
                 f"r = arenac_mbqm(r, {p.output_multiplier}, {p.output_shift});",
                 *_clamp_lines(str(p.activation_min), str(p.activation_max)),
                 f"return ({ctype})r;"],
    }


def _shifted_input(n: int, shift: int) -> dict:
    """One input's division by 2^shift on the power-of-two path, as gemmlowp rounds an int16."""
    if shift >= INT16_MASK_BITS:
        return {"n": n, "value": "x >= 0 ? 1 : -1", "comment": c_comment(
            f"input{n}'s scale is 2^{shift} times finer than the output's. TFLite divides it "
            f"by 2^{shift} with a 16-bit rounding mask, all ones from {INT16_MASK_BITS} bits on: "
            "every value rounds to 1 (0 included), or to -1 if negative.")}
    return {"n": n, "value": f"arenac_rdbpot(x, {shift})", "comment": c_comment(
        f"input{n}'s scale is 2^{shift} times finer than the output's: divided by 2^{shift}, "
        "rounding halves away from zero.")}


def _shifted_values(p: ShiftedParams, prefix: str, ctype: str) -> dict:
    """int16 ADD and SUB on power-of-two scales: at most one input is shifted; the
    activation's range lies within int16, so its clamp also saturates."""
    shifts = (p.input1_shift, p.input2_shift)
    how = ("each int16 input brought to the output's scale by a rounding right shift (where its "
           "scale is finer), then combined." if any(shifts) else
           "both int16 inputs are at the output's scale.")
    return {
        "macro": "shifted_op", "wide": WIDE_TYPE,
        "comment": c_comment(f"TFLite's path for power-of-two scales: {how}"),
        "inputs": [_shifted_input(n, shift) for n, shift in enumerate(shifts, 1) if shift],
        "loads": tuple((lambda e, n=n: f"{prefix}_in{n}({e})") if shift else str
                       for n, shift in enumerate(shifts, 1)),
        "body": [f"{WIDE_TYPE} r = {_COMBINED[p.opcode]};",
                 *_clamp_lines(str(p.activation_min), str(p.activation_max)),
                 f"return ({ctype})r;"],
    }


def _table_load(table: str, offset: int) -> Load:
    """An element's rescaled value: the table entry of its value (the table starts at the
    type's lowest value, `offset` entries below zero)."""
    if not offset:
        return lambda element: f"{table}[{element}]"
    return lambda element: f"{table}[{element} {_plus(offset)}]"


def _product_values(p: ScaledProductParams, prefix: str, ctype: str) -> dict:
    return {
        "macro": "product_op", "wide": WIDE_TYPE,
        "in1_offset": f" {_plus(p.input1_offset)}" if p.input1_offset else "",
        "in2_offset": f" {_plus(p.input2_offset)}" if p.input2_offset else "",
        "loads": (lambda e: f"{prefix}_in1({e})", lambda e: f"{prefix}_in2({e})"),
        "body": [f"{WIDE_TYPE} r = arenac_mbqm(x * y, {p.output_multiplier}, {p.output_shift}) "
                 f"{_plus(p.output_offset)};",
                 *_clamp_lines(str(p.activation_min), str(p.activation_max)),
                 f"return ({ctype})r;"],
    }


def binary_values(ctx: OpContext) -> dict:
    p = ctx.params
    a, b = ctx.inputs
    out = ctx.outputs[0]
    if isinstance(p, RescaledParams):
        values = _rescaled_values(p, ctx.prefix, out.ctype)
    elif isinstance(p, ShiftedParams):
        values = _shifted_values(p, ctx.prefix, out.ctype)
    elif isinstance(p, ScaledProductParams):
        values = _product_values(p, ctx.prefix, out.ctype)
    else:
        values = _plain_values(p, out.ctype)
    loops = broadcast_loops(p.input1_shape, p.input2_shape, p.output_shape)
    comment = (f"{p.opcode} {out.dtype} {list(p.input1_shape)}, {list(p.input2_shape)} -> "
               f"{list(p.output_shape)} '{out.name}'")
    return {
        **values,
        "empty": not loops,
        "nest": broadcast_nest(loops, out.ctype, values["wide"], f"{ctx.prefix}_op",
                               values["loads"]) if loops else None,
        "fn": ctx.fn, "prefix": ctx.prefix, "ctype": out.ctype,
        "a": a.ptr, "b": b.ptr, "out": out.ptr,
        "comment": c_comment(comment),
    }


def emit_binary(ctx: OpContext) -> Kernel:
    values = binary_values(ctx)
    values["op_function"] = render_macro(TEMPLATE, values["macro"], values)
    text = render_macro(TEMPLATE, "binary", values)
    uses_ivdep = values["nest"] is not None and values["nest"]["inner"]["ivdep"]
    return Kernel(text, ("ivdep",) if uses_ivdep else ())


SPECS: tuple[OpSpec, ...] = tuple(
    OpSpec(opcode, kernels("T, T -> T", T=DTYPES[opcode]), prepare, emit_binary,
           overlaps=overlaps.elementwise(0, 1))
    for opcode in OPCODES
)
