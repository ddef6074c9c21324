"""numpy kernels of the float32 math functions (toolchain.ops.unary), each one IEEE operation
per element as TFLite's reference kernels compute it."""

from __future__ import annotations

import numpy as np

from toolchain.ops.unary.prepare import UnaryMathParams

FUNCTIONS = {
    "ABS": np.abs,
    "NEG": np.negative,
    "SQUARE": np.square,
    "SQRT": np.sqrt,
    "RSQRT": lambda x: np.float32(1.0) / np.sqrt(x),
    "FLOOR": np.floor,
    "CEIL": np.ceil,
}


def unary_math(p: UnaryMathParams, inputs, outputs) -> None:
    with np.errstate(all="ignore"):  # NaN and infinities are values here, as in C
        outputs[0][...] = FUNCTIONS[p.function](inputs[0]).astype(np.float32)


KERNELS = {opcode: unary_math for opcode in FUNCTIONS}
