"""C emitters for IF and WHILE: an `if`/`else` and a loop around the statements of the steps
toolchain.lower.program laid out for their subgraphs; templates/c/control.c.j2 lays them out."""

from __future__ import annotations

from toolchain.ops.emit import Kernel, OpContext, c_comment, render_macro

TEMPLATE = "c/control.c.j2"


def emit_if(ctx: OpContext) -> Kernel:
    """An `if`/`else` around the branches' statements (a branch with none goes unwritten)."""
    control = ctx.control
    then, otherwise = control.blocks
    if not then.statements and not otherwise.statements:
        return Kernel("", note="neither branch has anything to do: no code")
    comment = (f"IF '{control.condition.name}': runs subgraph {then.label} when it holds, else "
               f"subgraph {otherwise.label}; the branch's results are copied into the IF's "
               "outputs.")
    return Kernel(render_macro(TEMPLATE, "if_else", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "condition": control.condition.ptr,
        "then": then.statements,
        "else": otherwise.statements,
    }))


def emit_while(ctx: OpContext) -> Kernel:
    control = ctx.control
    test, body = control.blocks
    comment = (f"WHILE: the loop values start as its inputs; subgraph {test.label} tests them "
               f"('{control.condition.name}'), and while that holds subgraph {body.label} "
               "computes the next ones, copied back into the loop values.")
    return Kernel(render_macro(TEMPLATE, "while_loop", {
        "fn": ctx.fn,
        "comment": c_comment(comment),
        "condition": control.condition.ptr,
        "entry": control.entry,
        "test": test.statements,
        "body": body.statements,
    }))
