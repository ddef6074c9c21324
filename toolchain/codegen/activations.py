"""C emitters for the activation ops (RELU, RELU6, RELU_N1_TO_1, LOGISTIC, TANH, HARD_SWISH,
LEAKY_RELU, PRELU, SOFTMAX, L2_NORMALIZATION; float32 and int8), from the same params as
runtime_py.

Each params type has a function that turns it into the values of one macro of
templates/c/activations.c.j2; every number (multipliers, shifts, offsets, tables, loop counts)
is taken or derived here, the template only lays them out.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from toolchain.codegen.context import OpContext, c_array, c_float, c_int32, family_macro
from toolchain.codegen.elementwise import broadcast_loops
from toolchain.errors import UnsupportedOpError
from toolchain.ops.activations import (
    SPECS,
    FloatClampParams,
    FloatFunctionParams,
    FloatL2NormalizationParams,
    FloatLeakyReluParams,
    FloatPreluParams,
    FloatSoftmaxParams,
    LookupTableParams,
    QuantizedHardSwishParams,
    QuantizedL2NormalizationParams,
    QuantizedLeakyReluParams,
    QuantizedPreluParams,
    QuantizedSoftmaxParams,
    RequantizeClampParams,
)

TEMPLATE = "c/activations.c.j2"

# reference_ops::Logistic (float): 1 above the high cutoff, exp(x) below the low one. The same
# float32 constants as runtime_py.kernels.activations (tests/ops/test_activations_c.py checks).
LOGISTIC_CUTOFF_HIGH = 16.619047164916992188
LOGISTIC_CUTOFF_LOW = -9.0
# The int8 softmax sums Q12.19 terms of at most 2^19 (exp(0) = 1): a row of fewer classes than
# this cannot overflow an int32_t sum.
SOFTMAX_INT32_SUM_DEPTH = 1 << 12
# The int8 L2 normalization sums squares of values within 255 in an int32_t, as TFLite does.
L2_INT32_SUM_DEPTH = (2**31 - 1) // (255 * 255)
# An int16 saturating left shift of 16 bits or more saturates every non-zero value: shifting by
# 16 gives the same result and keeps the product within int32_t.
INT16_SHIFT_CAP = 16


def _plus(value: int) -> str:
    """`+ 3` or `- 10`: an added constant as it reads best after an operand."""
    return f"+ {value}" if value >= 0 else f"- {-value}"


def _base(ctx: OpContext) -> dict:
    x, out = ctx.inputs[0], ctx.outputs[0]
    return {
        "fn": ctx.fn,
        "prefix": ctx.prefix,
        "ctype": out.ctype,
        "x": x.ptr,
        "out": out.ptr,
        "size": out.size,
        "comment": f"{ctx.op.opcode} {out.dtype}{list(out.shape)} '{out.name}'",
        "helpers": None,
    }


def _rows(ctx: OpContext, depth: int) -> dict:
    size = ctx.outputs[0].size
    return {"depth": depth, "rows": size // depth if depth else 0}


# -- elementwise ----------------------------------------------------------------------------


def _float_clamp(ctx: OpContext, p: FloatClampParams) -> dict:
    return {"macro": "elementwise", "kind": "float_clamp", "low": c_float(p.low),
            "has_high": not math.isinf(p.high), "high": c_float(p.high)}


def _requantize_clamp(ctx: OpContext, p: RequantizeClampParams) -> dict:
    return {"macro": "elementwise", "kind": "requantize_clamp",
            "in_offset": _plus(-p.input_zero_point), "out_offset": _plus(p.output_zero_point),
            "multiplier": p.multiplier, "shift": p.shift, "low": p.low, "high": p.high}


def _lookup(ctx: OpContext, p: LookupTableParams) -> dict:
    return {"macro": "elementwise", "kind": "lookup",
            "table": c_array(np.asarray(p.table, dtype=np.int8))}


_FLOAT_FUNCTION_KINDS = {"LOGISTIC": "logistic", "TANH": "tanh", "HARD_SWISH": "float_hard_swish"}


def _float_function(ctx: OpContext, p: FloatFunctionParams) -> dict:
    return {"macro": "elementwise", "kind": _FLOAT_FUNCTION_KINDS[p.function],
            "cutoff_high": c_float(LOGISTIC_CUTOFF_HIGH),
            "cutoff_low": c_float(LOGISTIC_CUTOFF_LOW)}


def _float_leaky_relu(ctx: OpContext, p: FloatLeakyReluParams) -> dict:
    return {"macro": "elementwise", "kind": "float_leaky_relu", "alpha": c_float(p.alpha)}


def _int8_leaky_relu(ctx: OpContext, p: QuantizedLeakyReluParams) -> dict:
    return {"macro": "elementwise", "kind": "int8_leaky_relu",
            "in_offset": _plus(-p.input_zero_point), "out_offset": _plus(p.output_zero_point),
            "identity_multiplier": p.identity_multiplier, "identity_shift": p.identity_shift,
            "negate": p.alpha_multiplier < 0, "alpha_multiplier": abs(p.alpha_multiplier),
            "alpha_shift": p.alpha_shift}


def _int8_hard_swish(ctx: OpContext, p: QuantizedHardSwishParams) -> dict:
    exponent = p.reluish_exponent
    return {"macro": "elementwise", "kind": "int8_hard_swish", "helpers": "int16",
            "in_offset": _plus(-p.input_zero_point), "out_offset": _plus(p.output_zero_point),
            "output_multiplier": p.output_multiplier, "output_right_shift": -p.output_exponent,
            "reluish_multiplier": p.reluish_multiplier, "reluish_exponent": exponent,
            "reluish_pre_shift": min(exponent - 1, INT16_SHIFT_CAP) if exponent > 0 else None,
            "reluish_right_shift": -exponent if exponent < 0 else 0}


# -- PRELU ----------------------------------------------------------------------------------


def _prelu_loops(ctx: OpContext, input_shape: tuple[int, ...],
                 alpha_shape: tuple[int, ...]) -> dict:
    """The broadcast of alpha over the input as collapsed loops; x and the output walk all."""
    loops = broadcast_loops(input_shape, alpha_shape, input_shape)
    levels = [{"n": loop.n, "sx": loop.so, "sa": loop.sb, "k": k, "next": k + 1,
               "pad": "  " * (k + 1)} for k, loop in enumerate(loops)]
    return {"macro": "prelu", "alpha": ctx.inputs[1].ptr, "empty": not levels,
            "outer": levels[:-1], "inner": levels[-1] if levels else None}


def _float_prelu(ctx: OpContext, p: FloatPreluParams) -> dict:
    return {**_prelu_loops(ctx, p.input_shape, p.alpha_shape), "is_float": True}


def _int8_prelu(ctx: OpContext, p: QuantizedPreluParams) -> dict:
    return {**_prelu_loops(ctx, p.input_shape, p.alpha_shape), "is_float": False,
            "in_offset": _plus(-p.input_zero_point), "alpha_offset": _plus(-p.alpha_zero_point),
            "out_offset": _plus(p.output_zero_point),
            "identity_multiplier": p.identity_multiplier, "identity_shift": p.identity_shift,
            "alpha_multiplier": p.alpha_multiplier, "alpha_shift": p.alpha_shift}


# -- SOFTMAX, L2_NORMALIZATION --------------------------------------------------------------


def _float_softmax(ctx: OpContext, p: FloatSoftmaxParams) -> dict:
    return {"macro": "float_softmax", **_rows(ctx, p.depth), "beta": c_float(p.beta)}


def _int8_softmax(ctx: OpContext, p: QuantizedSoftmaxParams) -> dict:
    return {"macro": "int8_softmax", **_rows(ctx, p.depth),
            "multiplier": p.input_multiplier, "left_shift": p.input_left_shift,
            "diff_min": c_int32(p.diff_min),
            "sum_type": "int32_t" if p.depth < SOFTMAX_INT32_SUM_DEPTH else "int64_t"}


def _float_l2_normalization(ctx: OpContext, p: FloatL2NormalizationParams) -> dict:
    return {"macro": "float_l2_normalization", **_rows(ctx, p.depth),
            "epsilon": c_float(p.epsilon)}


def _int8_l2_normalization(ctx: OpContext, p: QuantizedL2NormalizationParams) -> dict:
    if p.depth > L2_INT32_SUM_DEPTH:
        raise UnsupportedOpError(f"int8 L2_NORMALIZATION over {p.depth} values: its int32 sum "
                                 "of squares could overflow")
    return {"macro": "int8_l2_normalization", **_rows(ctx, p.depth),
            "in_offset": _plus(-p.input_zero_point)}


_BY_PARAMS: dict[type, Callable[[OpContext, object], dict]] = {
    FloatClampParams: _float_clamp,
    RequantizeClampParams: _requantize_clamp,
    LookupTableParams: _lookup,
    FloatFunctionParams: _float_function,
    FloatLeakyReluParams: _float_leaky_relu,
    QuantizedLeakyReluParams: _int8_leaky_relu,
    QuantizedHardSwishParams: _int8_hard_swish,
    FloatPreluParams: _float_prelu,
    QuantizedPreluParams: _int8_prelu,
    FloatSoftmaxParams: _float_softmax,
    QuantizedSoftmaxParams: _int8_softmax,
    FloatL2NormalizationParams: _float_l2_normalization,
    QuantizedL2NormalizationParams: _int8_l2_normalization,
}


def emit_activation(ctx: OpContext) -> str:
    """Every activation op: the values for its params type, rendered by that type's macro."""
    values = {**_base(ctx), **_BY_PARAMS[type(ctx.params)](ctx, ctx.params)}
    return str(family_macro(TEMPLATE, values["macro"])(values)).strip("\n")


EMITTERS = {spec.opcode: emit_activation for spec in SPECS}
