"""C emitters for the activation ops (RELU, RELU6, RELU_N1_TO_1, LOGISTIC, TANH, HARD_SWISH,
LEAKY_RELU, PRELU, SOFTMAX, L2_NORMALIZATION; float32, int8 and int16), from the same params
as runtime_py.

Each params type has a function that turns it into the values of the template's macros
(templates/c/activations.c.j2): which macro defines the op's per-element (or per-row) function,
every number (multipliers, shifts, offsets, tables, loop bounds) and the C expressions of the
simple float functions; the template only lays them out.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from toolchain.numerics.quant import INT_RANGES
from toolchain.numerics.tables import INT16_MAX, lut_lookup_int16, softmax_exp_lut
from toolchain.ops.activations.prepare import (
    LOG_SOFTMAX_INT8_OUTPUT,
    LOG_SOFTMAX_OUTPUT_INTEGER_BITS,
    SOFTMAX_SCALED_DIFF_INTEGER_BITS,
    FloatClampParams,
    FloatFunctionParams,
    FloatL2NormalizationParams,
    FloatLeakyReluParams,
    FloatLogSoftmaxParams,
    FloatPreluParams,
    FloatSoftmaxParams,
    Int16SigmoidParams,
    Int16SoftmaxParams,
    LookupTableParams,
    QuantizedHardSwishParams,
    QuantizedL2NormalizationParams,
    QuantizedLeakyReluParams,
    QuantizedLogSoftmaxParams,
    QuantizedPreluParams,
    QuantizedSoftmaxParams,
    RequantizeClampParams,
)
from toolchain.ops.elementwise.emit import broadcast_loops, broadcast_nest
from toolchain.ops.emit import (
    MATH_H,
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_int32,
    c_offset,
    plus,
    render_macro,
    written_vars,
)
from toolchain.ops.spec import LITERT_REF, TFLM, Signature, kernels

TEMPLATE = "c/activations.c.j2"

# reference_ops::Logistic (float): 1 above the high cutoff, exp(x) below the low one. The same
# float32 constants as runtime_py.kernels.activations (tests/ops/test_activations_c.py checks).
LOGISTIC_CUTOFF_HIGH = 16.619047164916992188
LOGISTIC_CUTOFF_LOW = -9.0
# The int8 softmax sums Q12.19 terms of at most 2^19 (exp(0) = 1): a row of fewer classes than
# this cannot overflow an int32_t sum.
SOFTMAX_INT32_SUM_DEPTH = 1 << 12
# Its output scale is 2^-7.
L2_OUTPUT_SHIFT = 7
# An int16 saturating left shift of 16 bits or more saturates every non-zero value: shifting by
# 16 gives the same result and keeps the product within int32_t.
INT16_SHIFT_CAP = 16
# An int8 table is indexed by the value's bits read as unsigned.
LOOKUP_INDEX_TYPE = "uint8_t"
LOOKUP_LENGTH = 256


def _base(ctx: OpContext) -> dict:
    out = ctx.outputs[0]
    return {
        "fn": ctx.fn,
        "prefix": ctx.prefix,
        "ctype": out.ctype,
        "in_ctype": ctx.inputs[0].ctype,
        "x": ctx.inputs[0].ptr,
        "out": out.ptr,
        "empty": out.size == 0,
        "comment": c_comment(f"{ctx.op.opcode} {out.dtype}{list(out.shape)} '{out.name}'"),
    }


def _int_range(ctx: OpContext) -> dict:
    """The output type's range, where the int8 kernels saturate."""
    low, high = INT_RANGES[ctx.outputs[0].dtype]
    return {"low": low, "high": high}


# -- elementwise: `{prefix}_op` of one value and a flat loop ---------------------------------


def _float_clamp(ctx: OpContext, p: FloatClampParams) -> dict:
    low, high = c_float(p.low), c_float(p.high)
    expression = (f"x < {low} ? {low} : x" if math.isinf(p.high)
                  else f"arenac_clampf(x, {low}, {high})")
    return {"op_macro": "expression_op", "op_comment": None, "expression": expression}


def _requantize_clamp(ctx: OpContext, p: RequantizeClampParams) -> dict:
    return {"op_macro": "requantize_clamp_op",
            "in_offset": plus(-p.input_zero_point), "out_offset": plus(p.output_zero_point),
            "multiplier": p.multiplier, "shift": p.shift, "low": p.low, "high": p.high}


def _lookup(ctx: OpContext, p: LookupTableParams) -> dict:
    return {"op_macro": "lookup_op", "index_type": LOOKUP_INDEX_TYPE,
            "table_length": LOOKUP_LENGTH,
            "table": c_array(np.asarray(p.table, dtype=ctx.outputs[0].dtype))}


# The float functions that are one C expression of x: (comment, expression).
_FLOAT_EXPRESSIONS: dict[str, tuple[str | None, str]] = {
    "TANH": (None, "tanhf(x)"),
    "HARD_SWISH": ("/* x * relu6(x + 3) / 6, multiplied before dividing as the reference kernel "
                   "does. */", "x * arenac_clampf(x + 3.0f, 0.0f, 6.0f) / 6.0f"),
    "ELU": (None, "x < 0.0f ? expm1f(x) : x"),
}


def _float_function(ctx: OpContext, p: FloatFunctionParams) -> dict:
    if p.function == "LOGISTIC":
        return {"op_macro": "logistic_op", "cutoff_high": c_float(LOGISTIC_CUTOFF_HIGH),
                "cutoff_low": c_float(LOGISTIC_CUTOFF_LOW)}
    comment, expression = _FLOAT_EXPRESSIONS[p.function]
    return {"op_macro": "expression_op", "op_comment": comment, "expression": expression,
            "math": p.function in _CALLS_MATH}


def _float_leaky_relu(ctx: OpContext, p: FloatLeakyReluParams) -> dict:
    return {"op_macro": "expression_op", "op_comment": None,
            "expression": f"x > 0.0f ? x : x * {c_float(p.alpha)}"}


def _int8_leaky_relu(ctx: OpContext, p: QuantizedLeakyReluParams) -> dict:
    return {"op_macro": "int8_leaky_relu_op", **_int_range(ctx),
            "in_offset": plus(-p.input_zero_point), "out_offset": plus(p.output_zero_point),
            "identity_multiplier": p.identity_multiplier, "identity_shift": p.identity_shift,
            "negate": p.alpha_multiplier < 0, "alpha_sign": "-" if p.alpha_multiplier < 0 else "",
            "alpha_multiplier": abs(p.alpha_multiplier), "alpha_shift": p.alpha_shift}


def _int8_hard_swish(ctx: OpContext, p: QuantizedHardSwishParams) -> dict:
    exponent = p.reluish_exponent
    return {"op_macro": "int8_hard_swish_op", "helpers": ("int16", "sdhm16"), **_int_range(ctx),
            "input": f"(x{plus(-p.input_zero_point)})" if p.input_zero_point else "x",
            "out_offset": plus(p.output_zero_point),
            "output_multiplier": p.output_multiplier, "output_right_shift": -p.output_exponent,
            "reluish_multiplier": p.reluish_multiplier, "reluish_exponent": exponent,
            "splits_left_shift": exponent > 0,
            "reluish_pre_shift": min(exponent - 1, INT16_SHIFT_CAP),
            "shifts_right": exponent < 0, "reluish_right_shift": -exponent}


def _int16_sigmoid(ctx: OpContext, p: Int16SigmoidParams) -> dict:
    """The input rescale as one C expression of x (no rounding term or shift where there is
    none: the power-of-two case multiplies by 3 * 2^k)."""
    product = f"x * {p.multiplier}"
    rescaled = f"({product} + {p.rounding}) >> {p.shift}" if p.shift else product
    return {"op_macro": f"int16_{p.function.lower()}_op", "rescaled": rescaled,
            "helpers": ("int16_sigmoid_table",)}


def _elementwise(ctx: OpContext, values: dict) -> dict:
    loop = ConstantLoop("i", ctx.outputs[0].size)
    return {**values, "macro": "elementwise", "loop": loop, "counters": written_vars([loop])}


# -- PRELU ----------------------------------------------------------------------------------


def _prelu(ctx: OpContext, input_shape: tuple[int, ...], alpha_shape: tuple[int, ...],
           values: dict) -> dict:
    """The broadcast of alpha over the input, as collapsed loops; x and the output walk all.
    An int16 input's alpha is int8: its pointers are retyped, and a hoisted element is held in
    int32_t, the type the op function takes."""
    loops = broadcast_loops(input_shape, alpha_shape, input_shape)
    ctype, alpha_ctype = ctx.outputs[0].ctype, ctx.inputs[1].ctype
    hoisted = ctype if alpha_ctype == ctype else "int32_t"
    nest = (broadcast_nest(loops, ctype, hoisted, f"{ctx.prefix}_op", ivdep=False)
            if loops else None)
    if nest is not None and alpha_ctype != ctype:
        for level in nest["outer"]:
            level["pointers"][1] = level["pointers"][1].replace(
                f"const {ctype} *", f"const {alpha_ctype} *", 1)
    return {**values, "macro": "prelu", "alpha": ctx.inputs[1].ptr, "alpha_ctype": alpha_ctype,
            "nest": nest}


def _float_prelu(ctx: OpContext, p: FloatPreluParams) -> dict:
    return _prelu(ctx, p.input_shape, p.alpha_shape, {"op_macro": "float_prelu_op"})


def _quantized_prelu(ctx: OpContext, p: QuantizedPreluParams) -> dict:
    return _prelu(ctx, p.input_shape, p.alpha_shape, {
        "op_macro": "quantized_prelu_op", "low": p.low, "high": p.high,
        "in_offset": plus(-p.input_zero_point), "alpha_offset": plus(-p.alpha_zero_point),
        "out_offset": plus(p.output_zero_point),
        "identity_multiplier": p.identity_multiplier, "identity_shift": p.identity_shift,
        "alpha_multiplier": p.alpha_multiplier, "alpha_shift": p.alpha_shift})


# -- SOFTMAX, L2_NORMALIZATION: `{prefix}_row` on every row ---------------------------------


def _rows(ctx: OpContext, depth: int, row_macro: str, values: dict) -> dict:
    """The op as a row function applied to each row of `depth` elements; inside a row, `each`
    walks its elements and `rest` those after the first."""
    rows = ConstantLoop("r", ctx.outputs[0].size // depth if depth else 0)
    each, rest = ConstantLoop("i", depth), ConstantLoop("i", depth, 1)
    return {**values, "macro": "rows", "row_macro": row_macro, "row": rows,
            "row_x": c_offset("x", [(rows, depth)]), "row_out": c_offset("out", [(rows, depth)]),
            "each": each, "rest": rest, "counters": written_vars([each, rest])}


def _float_softmax(ctx: OpContext, p: FloatSoftmaxParams) -> dict:
    return _rows(ctx, p.depth, "float_softmax_row", {"beta": c_float(p.beta)})


def _int8_log_softmax(ctx: OpContext, p: QuantizedLogSoftmaxParams) -> dict:
    return _rows(ctx, p.depth, "int8_log_softmax_row", {
        "helpers": ("gemmlowp_log",), "multiplier": p.input_multiplier,
        "left_shift": p.input_left_shift, "diff_min": c_int32(p.diff_min),
        "bound_min": c_int32(p.diff_min - 1), "reverse_multiplier": p.reverse_multiplier,
        "reverse_shift": p.reverse_shift, "zero_point": LOG_SOFTMAX_INT8_OUTPUT[1],
        "output_shift": 31 - SOFTMAX_SCALED_DIFF_INTEGER_BITS - LOG_SOFTMAX_OUTPUT_INTEGER_BITS})


def _float_log_softmax(ctx: OpContext, p: FloatLogSoftmaxParams) -> dict:
    return _rows(ctx, p.depth, "float_log_softmax_row",
                 {"lowest": c_float(np.finfo(np.float32).min)})


def _int8_softmax(ctx: OpContext, p: QuantizedSoftmaxParams) -> dict:
    bits = 8 * np.dtype(p.dtype).itemsize
    low = INT_RANGES[p.dtype][0]
    # only an 8-bit output's final shift can exceed 31, where TFLite aborts
    aborts = bits == 8
    comment = (
        f"reference_ops::Softmax for {ctx.inputs[0].dtype} in, {p.dtype} out (scale 1/2^{bits}, "
        f"zero point {low}): the exponentials of the row's differences to its max (those below "
        f"{p.diff_min} count as 0) summed in Q12.19, each times the sum's reciprocal. The "
        "exponentials are computed twice (as TFLite does) rather than stored: no buffer. The "
        "row's max and sum are read before any of it is written, and the last pass reads each "
        "element before writing it: in-place safe."
        + (f" TFLite aborts on a row whose exponentials sum to 512 or more (possible from 512 "
           f"classes on); a void kernel cannot, so such a row is all {low} here: each probability "
           "is then at most 1/512, under half an output step." if aborts else ""))
    return _rows(ctx, p.depth, "int8_softmax_row", {
        "row_comment": c_comment(comment), "output_bits": bits, "aborts": aborts,
        "helpers": ("gemmlowp_exp", "clz32"), **_int_range(ctx),
        "multiplier": p.input_multiplier, "left_shift": p.input_left_shift,
        "diff_min": c_int32(p.diff_min), "out_offset": plus(INT_RANGES[p.dtype][0]),
        "sum_type": "int32_t" if p.depth < SOFTMAX_INT32_SUM_DEPTH else "int64_t"})


def _int16_softmax(ctx: OpContext, p: Int16SoftmaxParams) -> dict:
    """With the bound the C's comment states: the exponential of a zero difference, so the
    sum's leading zeros are few."""
    peak = int(lut_lookup_int16(softmax_exp_lut(), np.array(INT16_MAX)))
    return _rows(ctx, p.depth, "int16_softmax_row", {
        "helpers": ("clz32", "int16_softmax_tables"), "peak": peak,
        "max_headroom": 32 - peak.bit_length(),
        "multiplier": p.input_multiplier, "shift": p.input_shift})


def _float_l2_normalization(ctx: OpContext, p: FloatL2NormalizationParams) -> dict:
    return _rows(ctx, p.depth, "float_l2_normalization_row", {"epsilon": c_float(p.epsilon)})


def _int8_l2_normalization(ctx: OpContext, p: QuantizedL2NormalizationParams) -> dict:
    return _rows(ctx, p.depth, "int8_l2_normalization_row", {
        "helpers": ("gemmlowp_inv_sqrt",), **_int_range(ctx),
        "in_offset": plus(-p.input_zero_point), "output_shift": L2_OUTPUT_SHIFT})


_ELEMENTWISE: dict[type, Callable[[OpContext, object], dict]] = {
    FloatClampParams: _float_clamp,
    RequantizeClampParams: _requantize_clamp,
    LookupTableParams: _lookup,
    FloatFunctionParams: _float_function,
    FloatLeakyReluParams: _float_leaky_relu,
    QuantizedLeakyReluParams: _int8_leaky_relu,
    QuantizedHardSwishParams: _int8_hard_swish,
    Int16SigmoidParams: _int16_sigmoid,
}
_OTHERS: dict[type, Callable[[OpContext, object], dict]] = {
    FloatPreluParams: _float_prelu,
    QuantizedPreluParams: _quantized_prelu,
    FloatSoftmaxParams: _float_softmax,
    FloatLogSoftmaxParams: _float_log_softmax,
    QuantizedLogSoftmaxParams: _int8_log_softmax,
    QuantizedSoftmaxParams: _int8_softmax,
    Int16SoftmaxParams: _int16_softmax,
    FloatL2NormalizationParams: _float_l2_normalization,
    QuantizedL2NormalizationParams: _int8_l2_normalization,
}


def activation_values(ctx: OpContext) -> dict:
    """The values of every macro the op's kernel is made of; `macro` lays out the kernel."""
    kind = type(ctx.params)
    values = {**_base(ctx), "helpers": ()}
    if kind in _ELEMENTWISE:
        return _elementwise(ctx, {**values, **_ELEMENTWISE[kind](ctx, ctx.params)})
    return {**values, **_OTHERS[kind](ctx, ctx.params)}


def _render(macro: str, values: dict) -> str:
    return render_macro(TEMPLATE, macro, values)


# The fixed-point helpers (toolchain.ops.emit.FIXED_POINT) each macro of the template calls.
MACRO_HELPERS: dict[str, tuple[str, ...]] = {
    "requantize_clamp_op": ("mbqm", "clamp"),
    "int8_leaky_relu_op": ("mbqm", "clamp"),
    "quantized_prelu_op": ("mbqm", "clamp"),
    "int8_hard_swish_op": ("rdbpot", "clamp"),
    "int8_softmax_row": ("srdhm", "rdbpot", "clamp"),
    "int8_log_softmax_row": ("srdhm", "rdbpot", "mbqm", "clamp"),
    "int16_softmax_row": ("mbqm", "clamp"),
    "int8_l2_normalization_row": ("mbqm", "clamp"),
}
# The macros of the template that call <math.h> (expf, sqrtf), and the float functions whose
# expression does (tanhf, expm1f).
MATH_MACROS = frozenset({"logistic_op", "float_softmax_row", "float_log_softmax_row",
                         "float_l2_normalization_row"})
_CALLS_MATH = frozenset({"TANH", "ELU"})


def emit_activation(ctx: OpContext) -> Kernel:
    """Every activation op: the per-element or per-row function its params call for, then the
    kernel that applies it."""
    values = activation_values(ctx)
    if "op_macro" in values:
        values["op_function"] = _render(values["op_macro"], values)
    if "row_macro" in values:
        values["row_function"] = _render(values["row_macro"], values)
    called = (values.get("op_macro"), values.get("row_macro"))
    helpers = (*values["helpers"], *(h for m in called for h in MACRO_HELPERS.get(m, ())))
    math = values.get("math") or not MATH_MACROS.isdisjoint(called)
    return Kernel(_render(values["macro"], values), helpers, includes=(MATH_H,) if math else ())


# The ops whose TFLite kernels also run legacy uint8 (as int8, in [0, 255]), and those that run
# int16 (16x8, zero points 0); int16 PRELU takes an int8 alpha. TFLite has no int16 kernel for
# RELU_N1_TO_1 or HARD_SWISH (it fails them when it runs them).
_UINT8_OPCODES = frozenset({"RELU", "RELU6", "RELU_N1_TO_1", "LOGISTIC", "TANH", "SOFTMAX"})
_INT16_OPCODES = frozenset({"RELU", "RELU6", "LEAKY_RELU", "LOGISTIC", "TANH", "SOFTMAX"})


def activation_kernels(opcode: str) -> tuple[Signature, ...]:
    dtypes = ("float32", "int8", *(("uint8",) if opcode in _UINT8_OPCODES else ()),
              *(("int16",) if opcode in _INT16_OPCODES else ()))
    if opcode == "PRELU":
        return kernels("T, T -> T", "int16, int8 -> int16", T=dtypes)
    widening = ("int8 -> int16",) if opcode == "SOFTMAX" else ()
    # LiteRT's reference resolver has no ELU: `check` compares it with TFLite Micro
    return kernels("T -> T", *widening, T=dtypes, oracle=TFLM if opcode == "ELU" else LITERT_REF)
