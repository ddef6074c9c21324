"""numpy kernels for the comparison and logical ops; numpy broadcasting is LiteRT's."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier
from toolchain.ops.comparisons.prepare import (
    OPCODES,
    ComparisonParams,
    LogicalNotParams,
    RescaledComparisonParams,
    SelectParams,
)

Binary = Callable[[np.ndarray, np.ndarray], np.ndarray]

_OPS: dict[str, Binary] = {
    "LESS": np.less, "LESS_EQUAL": np.less_equal, "GREATER": np.greater,
    "GREATER_EQUAL": np.greater_equal, "EQUAL": np.equal, "NOT_EQUAL": np.not_equal,
    "LOGICAL_AND": np.logical_and, "LOGICAL_OR": np.logical_or,
}


def _scaled(x: np.ndarray, offset: int, multiplier: int, shift: int,
            left_shift: int) -> np.ndarray:
    """One quantized input at the common scale (int32 values)."""
    return multiply_by_quantized_multiplier((x.astype(np.int64) + offset) << left_shift,
                                            multiplier, shift)


def compare(params: ComparisonParams | RescaledComparisonParams,
            inputs: list[np.ndarray | None], outputs: list[np.ndarray]) -> None:
    a, b = inputs
    if isinstance(params, RescaledComparisonParams):
        p = params
        a = _scaled(a, p.input1_offset, p.input1_multiplier, p.input1_shift, p.left_shift)
        b = _scaled(b, p.input2_offset, p.input2_multiplier, p.input2_shift, p.left_shift)
    outputs[0][...] = _OPS[params.opcode](a, b)


def logical_not(params: LogicalNotParams, inputs: list[np.ndarray | None],
                outputs: list[np.ndarray]) -> None:
    outputs[0][...] = np.logical_not(inputs[0])


def select(params: SelectParams, inputs: list[np.ndarray | None],
           outputs: list[np.ndarray]) -> None:
    """The condition in its broadcast shape (SELECT's per-slice condition), then numpy's."""
    condition, x, y = inputs
    chosen = np.where(condition.reshape(params.condition_shape), x.reshape(params.x_shape),
                      y.reshape(params.y_shape))
    outputs[0][...] = chosen.reshape(outputs[0].shape)


KERNELS = {**dict.fromkeys(OPCODES, compare), "LOGICAL_NOT": logical_not,
           "SELECT": select, "SELECT_V2": select}
