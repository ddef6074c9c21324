"""C emitters for the resource variables and CALL_ONCE: copies between a variable's bytes in the
state block and its tensor, and the once-only guard of the initialization subgraph's steps;
templates/c/variables.c.j2 lays them out."""

from __future__ import annotations

from toolchain.ops.emit import Kernel, OpContext, c_comment, render_macro

TEMPLATE = "c/variables.c.j2"


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
