"""IF and WHILE: nothing to compute at their own step. The interpreter runs the steps of the
subgraphs that follow it and makes the copies toolchain.lower.program.Control lists (see
runtime_py.interpreter)."""

from __future__ import annotations

import numpy as np

from toolchain.ops.control.prepare import IfParams, WhileParams


def control(params: IfParams | WhileParams, inputs: list[np.ndarray | None],
            outputs: list[np.ndarray]) -> None:
    """The interpreter chooses, loops and copies."""


KERNELS: dict = {"IF": control, "WHILE": control}
