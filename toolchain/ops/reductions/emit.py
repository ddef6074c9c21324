"""C emitters for MEAN, SUM, REDUCE_MAX, REDUCE_MIN, REDUCE_ANY, REDUCE_ALL, ARG_MAX and
ARG_MIN, from the same params as runtime_py.

The input's dimensions are collapsed here into loops over constants: dimensions of size 1
vanish and neighbours that are both kept (or both reduced) merge, leaving alternating groups.
The C walks the kept groups outermost, in order, so it writes the output sequentially; inside,
it walks the reduced groups in order, so each output element takes its inputs in increasing
address order, the order of TFLite's reference (which matters to float sums). A trailing kept
group is the innermost, contiguous loop, over a small accumulator array on the stack (`chunk`
elements, a divisor of the group's size; the rest of the group joins the kept loops).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_comment,
    c_float,
    c_int32,
    c_offset,
    c_sum,
    render_macro,
)
from toolchain.ops.reductions.prepare import ArgParams, ReduceParams

TEMPLATE = "c/reductions.c.j2"
MAX_CHUNK = 64  # accumulators on the stack: at most 512 bytes


@dataclass(frozen=True)
class Loop:
    """`n` steps of `stride` input elements."""

    n: int
    stride: int


@dataclass(frozen=True)
class Walk:
    """Kept loops (outermost first), reduced loops (outermost first), and the contiguous run of
    `chunk` output elements computed together innermost."""

    kept: tuple[Loop, ...]
    reduced: tuple[Loop, ...]
    chunk: int


def _chunk(n: int) -> int:
    """The largest divisor of n up to MAX_CHUNK."""
    return max((d for d in range(1, min(n, MAX_CHUNK) + 1) if n % d == 0), default=1)


def collapse(shape: tuple[int, ...], axes: tuple[int, ...]) -> Walk:
    """The loops that visit every input element of each output element, outputs in order."""
    groups: list[list] = []  # [size, reduced]
    for i, n in enumerate(shape):
        if n == 1:
            continue
        reduced = i in axes
        if groups and groups[-1][1] == reduced:
            groups[-1][0] *= n
        else:
            groups.append([n, reduced])
    chunk = 1
    if groups and not groups[-1][1]:
        chunk = _chunk(groups[-1][0])
        groups[-1][0] //= chunk
    kept, reduced, stride = [], [], chunk
    for n, is_reduced in reversed(groups):
        if n > 1:
            (reduced if is_reduced else kept).append(Loop(n, stride))
        stride *= n
    return Walk(tuple(kept[::-1]), tuple(reduced[::-1]), chunk)


def _levels(walk: Walk, in_type: str) -> dict:
    """Loop k derives pointer p<k+1> from p<k> (p0 is the input); `chunk` walks the outputs
    computed side by side."""
    loops = [*walk.kept, *walk.reduced]
    levels = []
    for k, loop in enumerate(loops):
        counter = ConstantLoop(f"i{k}", loop.n)
        pointer = c_offset(f"p{k}", [(counter, loop.stride)])
        levels.append({"loop": counter, "pointer": f"const {in_type} *p{k + 1} = {pointer};"})
    chunk = ConstantLoop("c", walk.chunk)
    depth_kept = len(walk.kept)
    return {
        "kept": levels[:depth_kept],
        "reduced": levels[depth_kept:],
        "last": len(loops),
        "chunk": chunk,
        # One output element at a time needs no array: `acc` and `best` are then scalars.
        "vector": chunk.written,
        "acc": "acc[c]" if chunk.written else "acc",
        "value": "v" if chunk.written else f"*p{len(loops)}",
        "counters": [level["loop"].var for level in levels] + (["c"] if chunk.written else []),
    }


# TFLite starts REDUCE_MAX (MIN) at the type's lowest (highest) finite value and lets a value
# replace the running extreme only when strictly beyond it: NaN never wins and, for float32,
# a row of -inf (inf) gives -FLT_MAX (FLT_MAX).
_FLT_MAX = c_float(np.finfo(np.float32).max)
_LOWEST = {"float32": "-" + _FLT_MAX, "int8": "INT8_MIN", "uint8": "0", "int16": "INT16_MIN",
           "int32": "INT32_MIN", "bool": "0"}
_HIGHEST = {"float32": _FLT_MAX, "int8": "INT8_MAX", "uint8": "UINT8_MAX",
            "int16": "INT16_MAX", "int32": "INT32_MAX", "bool": "1"}


def _reduce_arithmetic(p: ReduceParams, dtype: str, ctype: str) -> dict:
    """The accumulator's C type, start value, update from input value `{v}` and result: C text
    with `{a}` for the accumulator."""
    if (p.method == "sum" and dtype == "float32") or p.method == "mean":
        finish = f"{{a}} / {c_float(p.count)}" if p.method == "mean" else "{a}"
        return {"acc_type": "float", "init": "0.0f", "add": "{a} += {v}", "finish": finish}
    if p.method == "sum":  # int32, wrapping around as TFLite's does
        return {"acc_type": "uint32_t", "init": "0u", "add": "{a} += (uint32_t){v}",
                "finish": "(int32_t){a}"}
    if p.method == "mean_truncate":  # int32: int64 sum, C's division (toward zero)
        return {"acc_type": "int64_t", "init": "0", "add": "{a} += {v}",
                "finish": f"(int32_t)({{a}} / {p.count})"}
    if p.method in ("max", "min"):
        beyond = ">" if p.method == "max" else "<"
        start = (_LOWEST if p.method == "max" else _HIGHEST)[dtype]
        return {"acc_type": ctype, "init": start,
                "add": f"{{a}} = {{v}} {beyond} {{a}} ? {{v}} : {{a}}", "finish": "{a}"}
    if p.method == "requantized_sum":
        # sum - count * input_zero_point wraps to int32 as in TFLite: uint32_t arithmetic from
        # -count * input_zero_point on.
        start = -p.count * p.input_zero_point
        start_text = f"(uint32_t){start}" if -(2**31) < start < 0 else f"{start % 2**32}u"
        zero_point = p.output_zero_point
        plus = f" + {zero_point}" if zero_point > 0 else f" - {-zero_point}" if zero_point else ""
        finish = (f"({ctype})arenac_clamp(arenac_mbqm((int32_t){{a}}, {p.multiplier}, {p.shift})"
                  f"{plus}, {c_int32(p.output_min)}, {c_int32(p.output_max)})")
        return {"acc_type": "uint32_t", "init": start_text, "add": "{a} += (uint32_t){v}",
                "finish": finish, "helpers": ("mbqm", "clamp")}
    raise UnsupportedOpError(f"no C for reduction method {p.method!r}")


def reduce_values(ctx: OpContext) -> dict:
    p: ReduceParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    arithmetic = _reduce_arithmetic(p, x.dtype, x.ctype)
    levels = _levels(collapse(x.shape, p.axes), x.ctype)
    return {
        **levels,
        "acc_type": arithmetic["acc_type"],
        "init": arithmetic["init"],
        "add": arithmetic["add"].format(a=levels["acc"], v=levels["value"]),
        "finish": arithmetic["finish"].format(a=levels["acc"]),
        "helpers": () if out.size == 0 else arithmetic.get("helpers", ()),
        "counters": ", ".join(levels["counters"]),
        "fn": ctx.fn,
        "in_type": x.ctype,
        "out_type": out.ctype,
        "x": x.ptr,
        "out": out.ptr,
        "empty": out.size == 0,
        "comment": c_comment(f"{ctx.op.opcode} {x.dtype}{list(x.shape)} over axes "
                             f"{list(p.axes)} -> {list(out.shape)} ({p.method}) '{out.name}'"),
    }


def emit_reduce(ctx: OpContext) -> Kernel:
    values = reduce_values(ctx)
    return Kernel(render_macro(TEMPLATE, "reduce", values), values["helpers"])


def arg_values(ctx: OpContext) -> dict:
    p: ArgParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    walk = collapse(x.shape, (p.axis,))
    n = x.shape[p.axis]
    stride = math.prod(x.shape[p.axis + 1:])
    levels = _levels(Walk(walk.kept, (), walk.chunk), x.ctype)
    scan = ConstantLoop("j", n, 1)
    last = f"p{levels['last']}"
    return {
        **levels,
        "scan": scan,
        "row": c_offset(last, [(scan, stride)]),
        "element": f"{last}[{c_sum([(scan, stride)])}]",
        "counters": ", ".join([*levels["counters"], *(["j"] if scan.written else [])]),
        "fn": ctx.fn,
        "in_type": x.ctype,
        "out_type": out.ctype,
        "x": x.ptr,
        "out": out.ptr,
        "better": ">" if p.maximize else "<",
        "empty": out.size == 0 or n == 0,
        # an axis of one element: each output is index 0, and the input is not read
        "macro": "arg" if n > 1 else "arg_zeros",
        "each": ConstantLoop("i", out.size),
        "comment": c_comment(f"{ctx.op.opcode} {x.dtype}{list(x.shape)} along axis {p.axis} "
                             f"-> {out.dtype}{list(out.shape)} '{out.name}'"),
    }


def emit_arg(ctx: OpContext) -> Kernel:
    values = arg_values(ctx)
    return Kernel(render_macro(TEMPLATE, values["macro"], values))
