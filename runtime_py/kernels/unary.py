"""numpy kernels of the float32 math functions (toolchain.ops.unary), each one IEEE operation
per element as TFLite's reference kernels compute it (ROUND: their steps of such operations;
EXP, LOG, SIN, COS: the C library's function, as theirs call it)."""

from __future__ import annotations

import numpy as np

from toolchain.numerics.tables import cosf, expf, logf, sinf
from toolchain.ops.unary.prepare import UnaryMathParams


def round_half_even(x: np.ndarray) -> np.ndarray:
    """TFLite's ROUND, step for step: the float below, or the one above when x is past the half
    or at the half of an odd one (so -0.3 gives +0.0, where np.rint gives -0.0)."""
    below = np.floor(x)
    diff = x - below
    odd = np.fmod(below, np.float32(2)) != 0  # at a half |below| < 2^23: TFLite's int cast
    return np.where((diff < 0.5) | ((diff == 0.5) & ~odd), below, below + np.float32(1))


FUNCTIONS = {
    "ABS": np.abs,
    "NEG": np.negative,
    "SQUARE": np.square,
    "SQRT": np.sqrt,
    "RSQRT": lambda x: np.float32(1.0) / np.sqrt(x),
    "FLOOR": np.floor,
    "CEIL": np.ceil,
    "ROUND": round_half_even,
    "EXP": expf,
    "LOG": logf,
    "SIN": sinf,
    "COS": cosf,
}


def unary_math(p: UnaryMathParams, inputs, outputs) -> None:
    # NaN and infinities are values here, as in C; numpy's integer negation wraps as the C's
    with np.errstate(all="ignore"):
        outputs[0][...] = FUNCTIONS[p.function](inputs[0]).astype(outputs[0].dtype)


KERNELS = {opcode: unary_math for opcode in FUNCTIONS}
