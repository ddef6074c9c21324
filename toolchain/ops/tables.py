"""The 256-entry lookup tables that TFLite's reference int8 and uint8 LOGISTIC and TANH build in
Prepare.

LUTPopulate<T> (kernels/internal/common.h) runs, for every value v of the type, in float32:
dequantize `input_scale * (v - input_zero_point)`, apply the function, multiply by
`1 / output_scale`, round half away from zero, add the output zero point, clamp to the type.

The function calls the C library's float32 expf / tanhf, which are not correctly rounded (glibc's
tanhf is an ulp off for about one argument in ten), and an ulp decides a table entry whenever the
scaled result sits near a rounding edge. So the tables are built with the same C functions, called
through ctypes; only where no C math library can be loaded do we fall back to float64 evaluation
rounded to float32 (correctly rounded, within an ulp of any libm).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

import numpy as np

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


def round_half_away_from_zero(x: np.ndarray) -> np.ndarray:
    """TfLiteRound on float32 values, done in float64 where `|x| + 0.5` is exact."""
    x = np.asarray(x, dtype=np.float64)
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def logistic_float32(x: np.ndarray) -> np.ndarray:
    """`1.0f / (1.0f + std::exp(-x))` in float32 (exp overflowing to infinity gives 0)."""
    return np.float32(1.0) / (np.float32(1.0) + expf(-x))


def lookup_table(dtype: str, input_scale: float, input_zero_point: int, output_scale: float,
                 output_zero_point: int, function: Float32Function) -> np.ndarray:
    """LUTPopulate<T> for int8 or uint8: T[256] indexed by the input's bits read as uint8."""
    info = np.iinfo(dtype)
    values = np.arange(info.min, info.max + 1, dtype=np.int64)
    dequantized = np.float32(input_scale) * (values - input_zero_point).astype(np.float32)
    inverse_scale = np.float32(1.0) / np.float32(output_scale)
    rescaled = round_half_away_from_zero(function(dequantized) * inverse_scale)
    quantized = np.clip(rescaled + output_zero_point, info.min, info.max).astype(dtype)
    table = np.empty(256, dtype=dtype)
    table[values.astype(dtype).view(np.uint8)] = quantized
    return table
