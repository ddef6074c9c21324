"""Resource variables and the initialization subgraph: VAR_HANDLE, READ_VARIABLE,
ASSIGN_VARIABLE and CALL_ONCE.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops.spec import OpSpec, kernels
from toolchain.ops.variables.emit import (
    emit_assign_variable,
    emit_call_once,
    emit_read_variable,
    emit_var_handle,
)
from toolchain.ops.variables.prepare import (
    VALUE_DTYPES,
    prepare_assign_variable,
    prepare_call_once,
    prepare_read_variable,
    prepare_var_handle,
)

SPECS: tuple[OpSpec, ...] = (
    OpSpec("VAR_HANDLE", kernels("-> resource"), prepare_var_handle, emit_var_handle,
           effects=True),
    OpSpec("READ_VARIABLE", kernels("resource -> T", T=VALUE_DTYPES), prepare_read_variable,
           emit_read_variable, effects=True),
    OpSpec("ASSIGN_VARIABLE", kernels("resource, T ->", T=VALUE_DTYPES),
           prepare_assign_variable, emit_assign_variable, effects=True),
    OpSpec("CALL_ONCE", kernels("->"), prepare_call_once, emit_call_once, effects=True),
)
