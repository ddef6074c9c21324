"""VAR_HANDLE, READ_VARIABLE, ASSIGN_VARIABLE and CALL_ONCE.

The interpreter hands a handle operand over as the view of its variable's bytes in the state
block, so reading and assigning are copies; the steps of CALL_ONCE's subgraph follow it in the
execution order, and the interpreter skips them once the subgraph has run (see
runtime_py.interpreter).
"""

from __future__ import annotations

import numpy as np

from toolchain.ops.variables.prepare import CallOnceParams, CopyParams, VarHandleParams


def var_handle(params: VarHandleParams, inputs: list[np.ndarray | None],
               outputs: list[np.ndarray]) -> None:
    """Nothing to compute: the handle is its variable's view already."""


def read_variable(params: CopyParams, inputs: list[np.ndarray | None],
                  outputs: list[np.ndarray]) -> None:
    outputs[0][...] = inputs[0].reshape(outputs[0].shape)


def assign_variable(params: CopyParams, inputs: list[np.ndarray | None],
                    outputs: list[np.ndarray]) -> None:
    inputs[0][...] = inputs[1].reshape(inputs[0].shape)


def call_once(params: CallOnceParams, inputs: list[np.ndarray | None],
              outputs: list[np.ndarray]) -> None:
    """Nothing to compute: the interpreter runs or skips the subgraph's steps that follow."""


KERNELS: dict = {
    "VAR_HANDLE": var_handle,
    "READ_VARIABLE": read_variable,
    "ASSIGN_VARIABLE": assign_variable,
    "CALL_ONCE": call_once,
}
