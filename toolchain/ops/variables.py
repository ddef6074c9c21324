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
from toolchain.ops.emit import Kernel, OpContext, c_comment, render_macro
from toolchain.ops.spec import OpSpec, kernels, required_input

# The element types a variable may hold: every type the backends store.
VALUE_DTYPES = frozenset({"float32", "int8", "uint8", "int16", "int32", "int64", "bool"})

TEMPLATE = "c/variables.c.j2"


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


# --- C emission -------------------------------------------------------------------------------


def emit_var_handle(ctx: OpContext) -> Kernel:
    """No code: the generator resolved the handle to the variable's bytes in the state block."""
    return Kernel("", note=f"names resource variable '{ctx.outputs[0].name}': no code")


def emit_read_variable(ctx: OpContext) -> Kernel:
    var, out = ctx.inputs[0], ctx.outputs[0]
    comment = (f"READ_VARIABLE '{var.name}' -> '{out.name}' {out.dtype}{list(out.shape)}: a copy "
               f"of the variable's {ctx.params.nbytes} bytes in the state block.")
    return _copy(ctx, comment, src=("var", var), dst=("out", out))


def emit_assign_variable(ctx: OpContext) -> Kernel:
    var, value = ctx.inputs[0], ctx.inputs[1]
    comment = (f"ASSIGN_VARIABLE '{var.name}' <- '{value.name}' {value.dtype}{list(value.shape)}: "
               f"the variable keeps these {ctx.params.nbytes} bytes until the next assignment or "
               "reset.")
    return _copy(ctx, comment, src=("value", value), dst=("var", var))


def _copy(ctx: OpContext, comment: str, src: tuple, dst: tuple) -> Kernel:
    (src_name, source), (dst_name, target) = src, dst
    return Kernel(render_macro(TEMPLATE, "copy", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "src_name": src_name,
        "src_type": source.ctype,
        "src": source.ptr,
        "dst_name": dst_name,
        "dst_type": target.ctype,
        "dst": target.ptr,
        "nbytes": ctx.params.nbytes,
    }))


def emit_call_once(ctx: OpContext) -> Kernel:
    callee = ctx.callee
    if callee is None:  # an earlier CALL_ONCE runs the same subgraph: never anything left to do
        return Kernel("", note=f"an earlier CALL_ONCE runs subgraph {ctx.params.subgraph}: no "
                               "code")
    comment = (f"CALL_ONCE: runs subgraph {callee.label} on the first invoke after a reset; "
               f"{callee.flag} records that it ran.")
    return Kernel(render_macro(TEMPLATE, "call_once", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "flag": callee.flag,
        "statements": callee.statements,
    }))


SPECS: tuple[OpSpec, ...] = (
    OpSpec("VAR_HANDLE", kernels("-> resource"), prepare_var_handle, emit_var_handle),
    OpSpec("READ_VARIABLE", kernels("resource -> T", T=VALUE_DTYPES), prepare_read_variable,
           emit_read_variable),
    OpSpec("ASSIGN_VARIABLE", kernels("resource, T ->", T=VALUE_DTYPES),
           prepare_assign_variable, emit_assign_variable),
    OpSpec("CALL_ONCE", kernels("->"), prepare_call_once, emit_call_once),
)
