"""C emitters for the elementwise binary ops (ADD, SUB, MUL, DIV, MAXIMUM, MINIMUM,
SQUARED_DIFFERENCE), from the same params as runtime_py.

The broadcast is collapsed here to the fewest loops with constant strides: dimensions of size 1
vanish and adjacent dimensions that both inputs walk (or skip) alike merge, so equal shapes are
one flat loop and, e.g., a per-channel operand is two loops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolchain.codegen.context import OpContext, c_array, c_float, c_int32, family_macro
from toolchain.fixedpoint import multiply_by_quantized_multiplier
from toolchain.ops.elementwise import (
    OPCODES,
    BinaryOpParams,
    PlainParams,
    RescaledParams,
    ScaledProductParams,
)
from toolchain.quant import INT_RANGES


def _plus(value: int) -> str:
    """`+ 3` or `- 10`: an added constant as it reads best after an operand."""
    return f"+ {value}" if value >= 0 else f"- {-value}"


# C operator of the plain ops that have one.
_OPERATORS = {"ADD": "+", "SUB": "-", "MUL": "*", "DIV": "/"}


@dataclass(frozen=True)
class Loop:
    """One collapsed dimension: `n` iterations, element strides of input1, input2 (0 where that
    input is broadcast) and of the output."""

    n: int
    sa: int
    sb: int
    so: int


def broadcast_loops(shape1: tuple[int, ...], shape2: tuple[int, ...],
                    out_shape: tuple[int, ...]) -> list[Loop]:
    """Loops, outermost first, that visit the output in order. The innermost loop has stride 1
    for the output and for each input it walks. An empty list means an empty output."""
    if any(n == 0 for n in out_shape):
        return []
    rank = len(out_shape)
    s1 = (1,) * (rank - len(shape1)) + tuple(shape1)
    s2 = (1,) * (rank - len(shape2)) + tuple(shape2)
    merged: list[list] = []  # [size, input1 walks it, input2 walks it]
    for n, d1, d2 in zip(out_shape, s1, s2):
        if n == 1:
            continue
        walks = (d1 == n, d2 == n)
        if merged and tuple(merged[-1][1:]) == walks:
            merged[-1][0] *= n
        else:
            merged.append([n, *walks])
    if not merged:  # a single element
        merged = [[1, True, True]]
    loops, stride1, stride2, stride_out = [], 1, 1, 1
    for n, walks1, walks2 in reversed(merged):
        loops.append(Loop(n, stride1 if walks1 else 0, stride2 if walks2 else 0, stride_out))
        stride1 *= n if walks1 else 1
        stride2 *= n if walks2 else 1
        stride_out *= n
    return loops[::-1]


def _loop_values(loops: list[Loop]) -> dict:
    """Each loop's level (its pointers a<k>, b<k>, o<k> derive a<k+1>...) and indentation."""
    levels = [{"n": loop.n, "sa": loop.sa, "sb": loop.sb, "so": loop.so, "k": k, "next": k + 1,
               "pad": "  " * (k + 1)} for k, loop in enumerate(loops)]
    return {"empty": not levels, "outer": levels[:-1], "inner": levels[-1] if levels else None}


def _bound(value: float | int | None, extreme: int | None, fmt) -> str | None:
    """C text of one clamp bound, None where there is nothing to clamp (no activation, or an
    integer type's own extreme, which would also trip -Wtype-limits)."""
    return None if value is None or value == extreme else fmt(value)


def _plain_values(p: PlainParams) -> dict:
    is_float = p.dtype == "float32"
    low, high = (None, None) if is_float else INT_RANGES[p.dtype]
    fmt = c_float if is_float else c_int32
    return {
        "kind": "plain", "is_float": is_float, "operator": _OPERATORS.get(p.opcode, ""),
        # float clamps even without an activation: infinities become +-FLT_MAX
        "clamp_min": _bound(p.clamp_min, low, fmt), "clamp_max": _bound(p.clamp_max, high, fmt),
    }


def _rescaled_input_table(p: RescaledParams, offset: int, multiplier: int,
                          shift: int) -> str:
    """The rescaled value of every int8 input, -128 first: runtime_py's input stage, exactly."""
    values = np.arange(-128, 128, dtype=np.int64)
    return c_array(multiply_by_quantized_multiplier((values + offset) << p.left_shift,
                                                    multiplier, shift), per_line=8)


def _rescaled_values(p: RescaledParams) -> dict:
    return {
        "kind": "rescaled", "left_shift": p.left_shift,
        "in1_table": _rescaled_input_table(p, p.input1_offset, p.input1_multiplier,
                                           p.input1_shift),
        "in2_table": _rescaled_input_table(p, p.input2_offset, p.input2_multiplier,
                                           p.input2_shift),
        "out_offset": _plus(p.output_offset), "out_multiplier": p.output_multiplier,
        "out_shift": p.output_shift, "act_min": p.activation_min, "act_max": p.activation_max,
    }


def _product_values(p: ScaledProductParams) -> dict:
    return {
        "kind": "product",
        "in1_offset": _plus(p.input1_offset), "in2_offset": _plus(p.input2_offset),
        "out_offset": _plus(p.output_offset), "out_multiplier": p.output_multiplier,
        "out_shift": p.output_shift, "act_min": p.activation_min, "act_max": p.activation_max,
    }


def binary_values(ctx: OpContext) -> dict:
    p: BinaryOpParams = ctx.params
    a, b = ctx.inputs
    out = ctx.outputs[0]
    if isinstance(p, RescaledParams):
        values = _rescaled_values(p)
    elif isinstance(p, ScaledProductParams):
        values = _product_values(p)
    else:
        values = _plain_values(p)
    return {
        **values,
        **_loop_values(broadcast_loops(p.input1_shape, p.input2_shape, p.output_shape)),
        "fn": ctx.fn, "prefix": ctx.prefix, "opcode": p.opcode, "ctype": out.ctype,
        # The type `_op` takes: int8 values are offset (and rescaled) into int32 first.
        "wide": out.ctype if values["kind"] == "plain" else "int32_t",
        "a": a.ptr, "b": b.ptr, "out": out.ptr,
        "comment": f"{p.opcode} {out.dtype} {list(p.input1_shape)}, {list(p.input2_shape)} -> "
                   f"{list(p.output_shape)} '{out.name}'",
    }


def emit_binary(ctx: OpContext) -> str:
    return family_macro("c/elementwise.c.j2", "binary")(binary_values(ctx))


EMITTERS = dict.fromkeys(OPCODES, emit_binary)
