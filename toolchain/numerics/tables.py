"""The lookup tables of TFLite's reference LOGISTIC, TANH, ELU and SOFTMAX kernels, and the float32
helpers their Prepare functions call.

int8 and uint8 LOGISTIC and TANH build a 256-entry table in Prepare: LUTPopulate<T>
(kernels/internal/common.h) runs, for every value v of the type, in float32:
dequantize `input_scale * (v - input_zero_point)`, apply the function, multiply by
`1 / output_scale`, round half away from zero, add the output zero point, clamp to the type.

The function calls the C library's float32 expf / tanhf, which are not correctly rounded (glibc's
tanhf is an ulp off for about one argument in ten), and an ulp decides a table entry whenever the
scaled result sits near a rounding edge. So the tables are built with the same C functions, called
through ctypes; only where no C math library can be loaded do we fall back to float64 evaluation
rounded to float32 (correctly rounded, within an ulp of any libm).

int16 LOGISTIC and TANH interpolate in one fixed table of the sigmoid (sigmoid_table_uint16), and
int16 SOFTMAX in two 513-entry tables LUTPopulate<int16_t> builds in double (softmax_exp_lut,
softmax_reciprocal_lut); all three are independent of the tensors' scales, and computed here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from collections.abc import Callable
from functools import cache

import numpy as np

from toolchain.errors import UnsupportedOpError

Float32Function = Callable[[np.ndarray], np.ndarray]


def _c_math_library() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("m")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


_LIBM = _c_math_library()


def _float32_function(c_name: str, float64_function: Callable[[np.ndarray], np.ndarray]
                      ) -> Float32Function:
    """The C library's float32 function `c_name`, elementwise on a float32 array."""
    if _LIBM is None:
        def rounded(x: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore"):
                return float64_function(x.astype(np.float64)).astype(np.float32)
        return rounded
    c_function = getattr(_LIBM, c_name)
    c_function.restype, c_function.argtypes = ctypes.c_float, [ctypes.c_float]
    return lambda x: np.array([c_function(float(v)) for v in x.ravel()],
                              dtype=np.float32).reshape(x.shape)


expf = _float32_function("expf", np.exp)
tanhf = _float32_function("tanhf", np.tanh)
logf = _float32_function("logf", np.log)
sinf = _float32_function("sinf", np.sin)
cosf = _float32_function("cosf", np.cos)
expm1f = _float32_function("expm1f", np.expm1)


def round_half_away_from_zero(x: np.ndarray) -> np.ndarray:
    """TfLiteRound on float32 values, done in float64 where `|x| + 0.5` is exact."""
    x = np.asarray(x, dtype=np.float64)
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def logistic_float32(x: np.ndarray) -> np.ndarray:
    """`1.0f / (1.0f + std::exp(-x))` in float32 (exp overflowing to infinity gives 0)."""
    return np.float32(1.0) / (np.float32(1.0) + expf(-x))


def elu_float32(x: np.ndarray) -> np.ndarray:
    """`x < 0 ? std::exp(x) - 1.0f : x` in float32, as the int8 ELU table's function."""
    with np.errstate(invalid="ignore"):
        return np.where(x < 0, expf(x) - np.float32(1.0), x).astype(np.float32)


def lookup_table(dtype: str, input_scale: float, input_zero_point: int, output_scale: float,
                 output_zero_point: int, function: Float32Function) -> np.ndarray:
    """LUTPopulate<T> for int8 or uint8: T[256] indexed by the input's bits read as uint8.

    TFLite casts each rounded float (plus the zero point) to int32 before clamping. A value
    past int32 (a tiny output scale) makes that cast undefined, and LiteRT's own build answers
    it two ways (its int8 TANH table saturates, its uint8 TANH and int8 ELU tables take
    INT32_MIN, then the type's least): such a table is refused, not guessed."""
    info = np.iinfo(dtype)
    values = np.arange(info.min, info.max + 1, dtype=np.int64)
    dequantized = np.float32(input_scale) * (values - input_zero_point).astype(np.float32)
    inverse_scale = np.float32(1.0) / np.float32(output_scale)
    with np.errstate(invalid="ignore", over="ignore"):
        rescaled = round_half_away_from_zero(function(dequantized) * inverse_scale)
        shifted = (rescaled + np.float32(output_zero_point)).astype(np.float32)
    if not np.all(np.abs(shifted.astype(np.float64)) < 2.0**31):
        raise UnsupportedOpError(
            f"{dtype} lookup table for output scale {output_scale:.6g}: its values pass int32, "
            "where TFLite's cast to int32 is undefined")
    quantized = np.clip(shifted, info.min, info.max).astype(dtype)
    table = np.empty(256, dtype=dtype)
    table[values.astype(dtype).view(np.uint8)] = quantized
    return table


def checked_log2(x: float) -> tuple[bool, int]:
    """CheckedLog2, all in float32 with the C library's logf: whether x is a power of two to
    within a thousandth of a binary order (about 0.07%), and its log2 rounded half away from
    zero."""
    x_log2 = logf(np.array([x], np.float32))[0] * (np.float32(1.0) / logf(
        np.array([2.0], np.float32))[0])
    rounded = np.float32(round_half_away_from_zero(x_log2))
    return bool(abs(np.float32(x_log2 - rounded)) < np.float32(1e-3)), int(rounded)


# -- the int16 LOGISTIC and TANH table ------------------------------------------------------

# sigmoid(i / SIGMOID_STEPS_PER_UNIT) for i below SIGMOID_TABLE_LENGTH, as uint16 0.16 fixed
# point; the last entry is the saturated value the kernels interpolate towards.
SIGMOID_TABLE_LENGTH = 256
SIGMOID_STEPS_PER_UNIT = 24
SIGMOID_ONE = 65536.0
UINT16_MAX = 65535


@cache
def sigmoid_table_uint16() -> np.ndarray:
    """The table int16 LOGISTIC and TANH interpolate in (uint16[256], read-only).

    Each entry is the sample sigmoid(i / 24) * 2^16 moved by half of the error that linear
    interpolation between it and the next sample makes at their midpoint, rounded half away
    from zero (no entry is within 0.004 of a rounding edge); the last is 65535."""
    i = np.arange(SIGMOID_TABLE_LENGTH - 1, dtype=np.float64)

    def scaled_sigmoid(x: np.ndarray) -> np.ndarray:
        return SIGMOID_ONE / (1.0 + np.exp(-x))

    sample = scaled_sigmoid(i / SIGMOID_STEPS_PER_UNIT)
    following = scaled_sigmoid((i + 1) / SIGMOID_STEPS_PER_UNIT)
    midpoint = scaled_sigmoid((i + 0.5) / SIGMOID_STEPS_PER_UNIT)
    moved = sample - ((sample + following) / 2 - midpoint) / 2
    table = np.append(round_half_away_from_zero(moved), UINT16_MAX).astype(np.uint16)
    table.flags.writeable = False
    return table


# -- the int16 SOFTMAX tables ---------------------------------------------------------------

INT16_MIN, INT16_MAX = -32768, 32767
INT16_RANGE = INT16_MAX - INT16_MIN  # 65535
# An int16 table holds 512 segments (indexed by a value's top 9 bits) and the end of the last.
INT16_LUT_SEGMENTS = 512


def _round(x: float) -> float:
    """TfLiteRound on a double: half away from zero."""
    return math.copysign(math.floor(abs(x) + 0.5), x)


def lut_populate_int16(input_scale: float, input_zero_point: int, output_scale: float,
                       output_zero_point: int, function: Callable[[float], float]) -> np.ndarray:
    """LUTPopulate<int16_t> in double: `function` over the int16 input range in 512 segments,
    each entry the sample moved by half the (rounded) error that interpolating between it and
    the next makes at the segment's midpoint, clamped to int16; entry 512 is the last sample."""
    input_min = input_scale * (INT16_MIN - input_zero_point)
    input_max = input_scale * (INT16_MAX - input_zero_point)
    output_min = output_scale * (INT16_MIN - output_zero_point)
    output_max = output_scale * (INT16_MAX - output_zero_point)
    step = (input_max - input_min) / INT16_LUT_SEGMENTS
    half_step = step / 2
    inverse_scale = (INT16_RANGE + 1) / (output_max - output_min)

    def clamped(value: float) -> int:
        return int(min(max(value, float(INT16_MIN)), float(INT16_MAX)))

    lut = np.empty(INT16_LUT_SEGMENTS + 1, dtype=np.int16)
    for i in range(INT16_LUT_SEGMENTS):
        value = function(input_min + i * step)
        midpoint = function(input_min + i * step + half_step)
        following = function(input_min + (i + 1) * step)
        sample = _round(value * inverse_scale)
        interpolated = _round((following * inverse_scale + _round(value * inverse_scale)) / 2)
        bias = _round((interpolated - _round(midpoint * inverse_scale)) / 2)
        lut[i] = clamped(sample - bias)
    lut[INT16_LUT_SEGMENTS] = clamped(_round(function(input_max) * inverse_scale))
    lut.flags.writeable = False
    return lut


# SOFTMAX's tables map [-1, 1] to the int16 range on output.
_SOFTMAX_LUT_OUTPUT_SCALE = 2.0 / INT16_RANGE


@cache
def softmax_exp_lut() -> np.ndarray:
    """exp(x) for x in [-10, 0] (int16 input -32768..32767), output in Q0.15."""
    return lut_populate_int16(10.0 / INT16_RANGE, INT16_MAX, _SOFTMAX_LUT_OUTPUT_SCALE, 0,
                              math.exp)


@cache
def softmax_reciprocal_lut() -> np.ndarray:
    """1 / (1 + x) for x in [0, 1] (int16 input -32768..32767), output in Q0.15."""
    return lut_populate_int16(1.0 / INT16_RANGE, INT16_MIN, _SOFTMAX_LUT_OUTPUT_SCALE, 0,
                              lambda x: 1.0 / (1.0 + x))


def _wrap_int16(x: np.ndarray) -> np.ndarray:
    return ((x - INT16_MIN) & 0xFFFF) + INT16_MIN


def lut_lookup_int16(lut: np.ndarray, value: np.ndarray) -> np.ndarray:
    """LUTLookup on int16 values (held in int64): the entry of the value's top 9 bits plus the
    slope to the next times its low 7 bits, rounded; the slope and the sum are int16 in TFLite
    (which the tables' small steps never wrap)."""
    value = np.asarray(value, dtype=np.int64)
    index = (INT16_LUT_SEGMENTS // 2) + (value >> 7)
    base = lut.astype(np.int64)[index]
    slope = _wrap_int16(lut.astype(np.int64)[index + 1] - base)
    return _wrap_int16(base + ((slope * (value & 0x7F) + 64) >> 7))


# TFLite Micro's fixed-point log (signal library): segments of the mantissa, as a power of two.
LOG_SEGMENTS_LOG2 = 7


def log_table() -> np.ndarray:
    """The correction table of TFLite Micro's Log32: log2(1 + i / 128) - i / 128 in 16 fraction
    bits for i in 0..128, then a closing 0 (the last segment's upper neighbour). Its values are
    exactly the ones TFLite Micro lists."""
    segments = 1 << LOG_SEGMENTS_LOG2
    values = [round((math.log2(1 + i / segments) - i / segments) * (1 << 16))
              for i in range(segments + 1)]
    return np.array([*values, 0], np.int64)
