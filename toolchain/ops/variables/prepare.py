"""Resource variables and the initialization subgraph: VAR_HANDLE, READ_VARIABLE,
ASSIGN_VARIABLE and CALL_ONCE, as TFLite's converter writes streaming models.

A VAR_HANDLE names a resource variable by (container, shared name); handles of one name in any
subgraph of the model name the same variable, as in TFLite. The handle holds no bytes: every
backend resolves it before anything runs to the variable's place in the state block (the
persistent memory beside the arena, toolchain.lower.program.ResourceVariable), so READ_VARIABLE is a
copy from there and ASSIGN_VARIABLE a copy to there. CALL_ONCE runs its initialization subgraph
on the first invocation after a reset; toolchain.lower.program inlines that subgraph's steps right
after it, and the backends skip them once a byte of the state block says they ran.

What TFLite would do differently from a copy of a fixed size, or fail on, is refused here or by
toolchain.lower.program: a handle that no VAR_HANDLE writes (LiteRT also takes int32 resource ids,
whose numbering the file does not fix; a handle IF or WHILE passes into a subgraph is the
caller's, as toolchain.lower.program lays it out), a variable assigned or read with different types
or sizes, and a read before anything assigned the variable.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops.spec import required_input

# The element types a variable may hold: every type the backends store.
VALUE_DTYPES = frozenset({"float32", "int8", "uint8", "int16", "int32", "int64", "bool"})


@dataclass(frozen=True)
class VarHandleParams:
    """Which resource variable the handle names: TFLite's key, (container, shared name)."""

    container: str
    shared_name: str

    @property
    def key(self) -> tuple[str, str]:
        return self.container, self.shared_name


@dataclass(frozen=True)
class CopyParams:
    """READ_VARIABLE and ASSIGN_VARIABLE: the bytes copied between the variable and a tensor."""

    nbytes: int


@dataclass(frozen=True)
class CallOnceParams:
    """CALL_ONCE: the initialization subgraph it runs."""

    subgraph: int


def prepare_var_handle(graph: Graph, op: Operator) -> VarHandleParams:
    """TFLite reads absent names as empty ones."""
    handle = graph.tensors[op.outputs[0]]
    _single_element(handle, "its handle")
    return VarHandleParams(str(op.options.get("container") or ""),
                           str(op.options.get("shared_name") or ""))


def prepare_read_variable(graph: Graph, op: Operator) -> CopyParams:
    handle_of(graph, op)
    return CopyParams(graph.tensors[op.outputs[0]].nbytes)


def prepare_assign_variable(graph: Graph, op: Operator) -> CopyParams:
    handle_of(graph, op)
    return CopyParams(required_input(graph, op, 1, "value").nbytes)


def prepare_call_once(graph: Graph, op: Operator) -> CallOnceParams:
    """The subgraph index was validated with the model (toolchain.front.validate.check_calls)."""
    index = op.options.get("init_subgraph_index")
    if not isinstance(index, int):
        raise ModelError("its options lack init_subgraph_index")
    return CallOnceParams(index)


def handle_of(graph: Graph, op: Operator) -> int:
    """The op's variable handle (input 0), which a VAR_HANDLE of the same subgraph must write."""
    handle = required_input(graph, op, 0, "variable handle")
    if not handle.is_handle:
        raise UnsupportedOpError(
            f"it names its variable by an {handle.dtype} resource id (input 0, tensor "
            f"{handle.index} {handle.name!r}), which TFLite numbers as it meets VAR_HANDLEs; "
            "a VAR_HANDLE's handle is supported"
        )
    _single_element(handle, "its variable handle")
    if op.inputs[0] in graph.inputs:
        raise UnsupportedOpError(
            f"its variable handle (input 0, tensor {handle.index} {handle.name!r}) is an input "
            "of the subgraph: the handle an IF or WHILE passes in, which names a variable only "
            "where the subgraph runs with its caller"
        )
    writers = [w for w in graph.operators if op.inputs[0] in w.outputs]
    if not writers or writers[0].opcode != "VAR_HANDLE":
        what = f"op {writers[0].index} {writers[0].opcode}" if writers else "no operator"
        raise ModelError(
            f"its variable handle (input 0, tensor {handle.index} {handle.name!r}) is written by "
            f"{what}, not by a VAR_HANDLE of this subgraph"
        )
    return handle.index


def _single_element(t: Tensor, what: str) -> None:
    """TFLite's kernels require a handle of one element."""
    if t.num_elements != 1:
        raise ModelError(f"{what} (tensor {t.index} {t.name!r}) has shape {list(t.shape)}, "
                         "not one element")
