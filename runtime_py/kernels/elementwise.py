"""numpy kernels for the elementwise binary ops and ADD_N; numpy broadcasting is TFLite's
broadcasting.

Integer arithmetic runs in int64 and is wrapped back to int32 where C's int32 would wrap, so
the results match the reference kernels bit for bit, overflow included.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from toolchain.numerics.fixedpoint import (
    multiply_by_quantized_multiplier,
    rounding_divide_by_pot,
    wrap_int32,
)
from toolchain.ops.elementwise.prepare import (
    INT16_MASK_BITS,
    OPCODES,
    AddNParams,
    PlainParams,
    RescaledParams,
    ScaledProductParams,
    ShiftedParams,
)

Binary = Callable[[np.ndarray, np.ndarray], np.ndarray]


def _select_greater(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`a > b ? a : b`, TFLite's MaximumOp (so a NaN in `a` yields `b`, unlike np.maximum)."""
    return np.where(a > b, a, b)


def _select_less(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(a < b, a, b)


def _squared_difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    difference = a - b
    return difference * difference


def _int_squared_difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    difference = wrap_int32(a - b)
    return difference * difference


def _truncating_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C's integer division (toward zero). TFLite's DIV refuses to run on a zero divisor; the
    C kernel cannot refuse mid-inference, so both backends agree on x / 0 = 0 instead."""
    divisor = np.where(b == 0, 1, b)
    quotient = np.abs(a) // np.abs(divisor)
    return np.where(b == 0, 0, np.where((a < 0) != (divisor < 0), -quotient, quotient))


def _floor_divide_float(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """TFLite's: the quotient in double, floored, back to float32."""
    return np.floor(a.astype(np.float64) / b.astype(np.float64)).astype(np.float32)


def _floor_mod_float(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """fmod (C's, exact), moved onto the divisor's sign when it is not on it."""
    m = np.fmod(a, b)
    return np.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)


def _floor_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Floor division; x / 0 = 0 as in the C (TFLite refuses a zero divisor)."""
    divisor = np.where(b == 0, 1, b)
    return np.where(b == 0, 0, np.floor_divide(a, divisor))


def _floor_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy's remainder takes the divisor's sign, as TFLite's FLOOR_MOD; x mod 0 = 0."""
    divisor = np.where(b == 0, 1, b)
    return np.where(b == 0, 0, np.remainder(a, divisor))


_FLOAT_OPS: dict[str, Binary] = {
    "ADD": np.add,
    "SUB": np.subtract,
    "MUL": np.multiply,
    "DIV": np.divide,
    "MAXIMUM": _select_greater,
    "MINIMUM": _select_less,
    "SQUARED_DIFFERENCE": _squared_difference,
    "FLOOR_DIV": _floor_divide_float,
    "FLOOR_MOD": _floor_mod_float,
}

# On int64 copies of int8/int32 values; the caller wraps the result to int32.
_INT_OPS: dict[str, Binary] = {
    "ADD": np.add,
    "SUB": np.subtract,
    "MUL": np.multiply,
    "DIV": _truncating_divide,
    "MAXIMUM": _select_greater,
    "MINIMUM": _select_less,
    "SQUARED_DIFFERENCE": _int_squared_difference,
    "FLOOR_DIV": _floor_divide,
    "FLOOR_MOD": _floor_mod,
}


def _plain(p: PlainParams, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if p.dtype == "float32":
        with np.errstate(all="ignore"):  # IEEE infinities and NaNs are the intended results
            result = _FLOAT_OPS[p.opcode](a, b)
    else:
        result = wrap_int32(_INT_OPS[p.opcode](a.astype(np.int64), b.astype(np.int64)))
    if p.clamp_min is not None:
        result = np.clip(result, p.clamp_min, p.clamp_max)
    return result


def _rescale_inputs(p: RescaledParams, a: np.ndarray,
                    b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both inputs, offset and shifted left, at their common scale (still int32 values)."""
    shifted1 = (a.astype(np.int64) + p.input1_offset) << p.left_shift
    shifted2 = (b.astype(np.int64) + p.input2_offset) << p.left_shift
    return (multiply_by_quantized_multiplier(shifted1, p.input1_multiplier, p.input1_shift),
            multiply_by_quantized_multiplier(shifted2, p.input2_multiplier, p.input2_shift))


# How the rescaled int8 inputs (int32 values, as are the results) are combined.
_COMBINE: dict[str, Binary] = {
    "ADD": np.add,
    "SUB": np.subtract,
    "SQUARED_DIFFERENCE": _squared_difference,
    "FLOOR_DIV": _floor_divide_float,
    "FLOOR_MOD": _floor_mod_float,
}


def _rescaled(p: RescaledParams, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    raw = _COMBINE[p.opcode](*_rescale_inputs(p, a, b))
    scaled = multiply_by_quantized_multiplier(raw, p.output_multiplier, p.output_shift)
    return np.clip(scaled + p.output_offset, p.activation_min, p.activation_max)


def _int16_rounding_divide_by_pot(x: np.ndarray, exponent: int) -> np.ndarray:
    """gemmlowp's RoundingDivideByPOT on int16 values: the usual rounding shift up to 15 bits;
    from 16 bits on its 16-bit mask is all ones, and every value rounds to 1 (0 included), or
    to -1 if negative."""
    if exponent >= INT16_MASK_BITS:
        return np.where(x >= 0, 1, -1)
    return rounding_divide_by_pot(x, exponent)


def _shifted(p: ShiftedParams, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """int16 power-of-two ADD/SUB: the activation's range lies within int16, so its clamp
    also saturates the sum or difference as TFLite does."""
    raw = _COMBINE[p.opcode](_int16_rounding_divide_by_pot(a.astype(np.int64), p.input1_shift),
                             _int16_rounding_divide_by_pot(b.astype(np.int64), p.input2_shift))
    return np.clip(raw, p.activation_min, p.activation_max)


def _scaled_product(p: ScaledProductParams, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    product = (a.astype(np.int64) + p.input1_offset) * (b.astype(np.int64) + p.input2_offset)
    scaled = multiply_by_quantized_multiplier(product, p.output_multiplier, p.output_shift)
    return np.clip(scaled + p.output_offset, p.activation_min, p.activation_max)


_EVALUATE: dict[type, Callable] = {
    PlainParams: _plain,
    RescaledParams: _rescaled,
    ShiftedParams: _shifted,
    ScaledProductParams: _scaled_product,
}


def binary(params, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> None:
    """Every op of the family: the params' type picks the arithmetic, its opcode the op."""
    a, b = inputs
    outputs[0][...] = _EVALUATE[type(params)](params, a, b)


def add_n(p: AddNParams, inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> None:
    """The first input plus each other in turn, in the tensors' type (numpy's int32 wraps as
    C's uint32_t)."""
    total = inputs[0]
    for x in inputs[1:]:
        total = total + x
    outputs[0][...] = total


KERNELS = {**dict.fromkeys(OPCODES, binary), "ADD_N": add_n}
