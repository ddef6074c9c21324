"""Params and C emitters for the comparison and logical ops: LESS, LESS_EQUAL, GREATER,
GREATER_EQUAL, EQUAL, NOT_EQUAL, LOGICAL_AND, LOGICAL_OR (bool outputs, broadcast as the
elementwise binary ops) and LOGICAL_NOT.

Two arithmetic shapes, following LiteRT's comparisons.cc:
- `ComparisonParams`: stored values compared in their own type (float32, int16 unless EQUAL or
  NOT_EQUAL on quantized inputs, int32, int64, bool), and LOGICAL_AND/OR on bools.
- `RescaledComparisonParams`: int8, uint8 (and quantized int16 for EQUAL/NOT_EQUAL): each input,
  offset by its zero point and shifted left 8 bits, is multiplied by its own scale in fixed
  point; the two results, int32 values at a common scale, are compared.

The broadcast reuses the elementwise family's collapsed loop nest; each input's C type is its
own and the output's is the bool's uint8_t.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.fixedpoint import multiply_by_quantized_multiplier
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops import overlaps
from toolchain.ops.elementwise import (
    BYTE_VALUES,
    WIDE_TYPE,
    BinaryOpParams,
    _plus,
    _shapes,
    _table_load,
    broadcast_loops,
    broadcast_nest,
)
from toolchain.ops.emit import ConstantLoop, Kernel, OpContext, c_array, c_comment, render_macro
from toolchain.ops.spec import OpSpec, kernels
from toolchain.quant import INT_RANGES, per_tensor_quantization, quantize_multiplier

# LiteRT's comparison and logical kernels broadcast through its 4-D loops; equal shapes run flat
# at any rank.
MAX_BROADCAST_RANK = 4
# The left shift comparisons.cc gives each offset quantized input before scaling it.
COMPARISON_LEFT_SHIFT = 8

# The C operator (and numpy function) of each binary op, on values of one type.
C_OPERATORS: dict[str, str] = {
    "LESS": "<", "LESS_EQUAL": "<=", "GREATER": ">", "GREATER_EQUAL": ">=",
    "EQUAL": "==", "NOT_EQUAL": "!=", "LOGICAL_AND": "&&", "LOGICAL_OR": "||",
}
ORDERED = ("LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL")
EQUALITY = ("EQUAL", "NOT_EQUAL")
LOGICAL = ("LOGICAL_AND", "LOGICAL_OR")
OPCODES = (*ORDERED, *EQUALITY, *LOGICAL)

_NUMBERS = frozenset({"float32", "int8", "uint8", "int16", "int32", "int64"})
SIGNATURES = {
    **{opcode: kernels("T, T -> bool", T=_NUMBERS) for opcode in ORDERED},
    **{opcode: kernels("T, T -> bool", T=_NUMBERS | {"bool"}) for opcode in EQUALITY},
    **{opcode: kernels("bool, bool -> bool") for opcode in LOGICAL},
}


@dataclass(frozen=True)
class ComparisonParams(BinaryOpParams):
    """The op on the inputs' stored values, in their type `dtype`."""

    dtype: str


@dataclass(frozen=True)
class RescaledComparisonParams(BinaryOpParams):
    """Quantized inputs compared at a common scale: input n becomes
    MultiplyByQuantizedMultiplier((x + offset_n) << left_shift, multiplier_n, shift_n)."""

    dtype: str
    left_shift: int
    input1_offset: int
    input1_multiplier: int
    input1_shift: int
    input2_offset: int
    input2_multiplier: int
    input2_shift: int


@dataclass(frozen=True)
class LogicalNotParams:
    """LOGICAL_NOT: the negation of every bool of `shape`."""

    shape: tuple[int, ...]


def _operands(graph: Graph, op: Operator) -> tuple[Tensor, Tensor, Tensor]:
    """The inputs and the output (their number and dtypes are the signatures' business)."""
    a, b = (graph.tensors[i] for i in op.inputs)
    return a, b, graph.tensors[op.outputs[0]]


def _input_scaling(t: Tensor) -> tuple[int, int, int]:
    """(offset, multiplier, shift) of one quantized input. LiteRT's scaling assumes a scale
    below 1 (a larger one takes a left shift its rounding division cannot do)."""
    scale, zero_point = per_tensor_quantization(t)
    if scale >= 1.0:
        raise UnsupportedOpError(f"{t.dtype} tensor {t.name!r}: scale {scale} is not below 1 "
                                 "(LiteRT's comparison rescale needs it)")
    multiplier, shift = quantize_multiplier(scale)
    return -zero_point, multiplier, shift


def _prepare_rescaled(op: Operator, a: Tensor, b: Tensor,
                      out: Tensor) -> RescaledComparisonParams:
    (o1, m1, s1), (o2, m2, s2) = _input_scaling(a), _input_scaling(b)
    return RescaledComparisonParams(
        **_shapes(op, a, b, out, MAX_BROADCAST_RANK), dtype=a.dtype,
        left_shift=COMPARISON_LEFT_SHIFT, input1_offset=o1, input1_multiplier=m1,
        input1_shift=s1, input2_offset=o2, input2_multiplier=m2, input2_shift=s2)


def prepare(graph: Graph, op: Operator) -> BinaryOpParams:
    """int8 and uint8 compare at a common scale; int16 does for EQUAL and NOT_EQUAL when it is
    quantized (LiteRT's NOT_EQUAL writes nothing for an unquantized int16, so we refuse it),
    and otherwise compares stored values, as every other type does."""
    a, b, out = _operands(graph, op)
    if a.dtype in ("int8", "uint8"):
        return _prepare_rescaled(op, a, b, out)
    if a.dtype == "int16" and op.opcode in EQUALITY:
        if a.quantization is not None:
            return _prepare_rescaled(op, a, b, out)
        if op.opcode == "NOT_EQUAL":
            raise UnsupportedOpError("unquantized int16 (LiteRT's NOT_EQUAL leaves the "
                                     "output unwritten)")
    quantized = a.quantization is not None or b.quantization is not None
    if a.dtype == "int16" and quantized:
        if len({per_tensor_quantization(t) for t in (a, b)}) != 1:
            raise UnsupportedOpError("int16 compares stored values: the inputs need identical "
                                     "quantization")
    return ComparisonParams(**_shapes(op, a, b, out, MAX_BROADCAST_RANK), dtype=a.dtype)


def prepare_not(graph: Graph, op: Operator) -> LogicalNotParams:
    x, out = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    if x.shape != out.shape:
        raise UnsupportedOpError(f"LOGICAL_NOT output shape {out.shape} is not the input's "
                                 f"{x.shape}")
    return LogicalNotParams(x.shape)


# -- C -------------------------------------------------------------------------------------

TEMPLATE = "c/comparisons.c.j2"


def rescaled_table(dtype: str, offset: int, multiplier: int, shift: int) -> np.ndarray:
    """The scaled value of every stored value of an int8 or uint8 input, the lowest first."""
    low, high = INT_RANGES[dtype]
    values = np.arange(low, high + 1, dtype=np.int64)
    return multiply_by_quantized_multiplier((values + offset) << COMPARISON_LEFT_SHIFT,
                                            multiplier, shift)


def _inputs(p: RescaledComparisonParams) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return ((p.input1_offset, p.input1_multiplier, p.input1_shift),
            (p.input2_offset, p.input2_multiplier, p.input2_shift))


def _rescaled_values(p: RescaledComparisonParams, prefix: str) -> dict:
    """int8 and uint8: a table of 256 scaled values per input; int16: each input scaled as it
    is read (|x + offset| < 2^16, so shifted 8 bits it fits in int32)."""
    if p.dtype == "int16":
        return {"macro": "rescaled_computed_op", "wide": WIDE_TYPE,
                "scale_up": 1 << p.left_shift,
                "inputs": [{"value": f"(x {_plus(o)})" if o else "x", "multiplier": m, "shift": s}
                           for o, m, s in _inputs(p)],
                "loads": (lambda e: f"{prefix}_in1({e})", lambda e: f"{prefix}_in2({e})")}
    return {"macro": "rescaled_op", "wide": WIDE_TYPE, "left_shift": p.left_shift,
            "table_length": BYTE_VALUES,
            "tables": [c_array(rescaled_table(p.dtype, *scaling), per_line=8)
                       for scaling in _inputs(p)],
            "loads": tuple(_table_load(f"{prefix}_in{n}", -INT_RANGES[p.dtype][0])
                           for n in (1, 2))}


def emit_binary(ctx: OpContext) -> Kernel:
    p = ctx.params
    a, b = ctx.inputs
    out = ctx.outputs[0]
    if isinstance(p, RescaledComparisonParams):
        values = _rescaled_values(p, ctx.prefix)
    else:
        values = {"macro": "plain_op", "wide": a.ctype, "loads": (str, str)}
    loops = broadcast_loops(p.input1_shape, p.input2_shape, p.output_shape)
    comment = (f"{p.opcode} {a.dtype} {list(p.input1_shape)}, {list(p.input2_shape)} -> "
               f"{list(p.output_shape)} '{out.name}'")
    values.update({
        "empty": not loops,
        "nest": broadcast_nest(loops, out.ctype, values["wide"], f"{ctx.prefix}_op",
                               values["loads"], in_ctype=a.ctype) if loops else None,
        "fn": ctx.fn, "prefix": ctx.prefix, "ctype": out.ctype, "in_ctype": a.ctype,
        "operator": C_OPERATORS[p.opcode], "a": a.ptr, "b": b.ptr, "out": out.ptr,
        "comment": c_comment(comment),
    })
    values["op_function"] = render_macro(TEMPLATE, values["macro"], values)
    text = render_macro(TEMPLATE, "binary", values)
    uses_ivdep = values["nest"] is not None and values["nest"]["inner"]["ivdep"]
    return Kernel(text, ("ivdep",) if uses_ivdep else ())


def emit_not(ctx: OpContext) -> Kernel:
    x, out = ctx.inputs[0], ctx.outputs[0]
    text = render_macro(TEMPLATE, "logical_not", {
        "fn": ctx.fn, "x": x.ptr, "out": out.ptr, "loop": ConstantLoop("i", out.size),
        "comment": c_comment(f"LOGICAL_NOT bool {list(out.shape)} '{out.name}'")})
    return Kernel(text)


SPECS: tuple[OpSpec, ...] = (
    *(OpSpec(opcode, SIGNATURES[opcode], prepare, emit_binary,
             overlaps=overlaps.elementwise(0, 1))
      for opcode in OPCODES),
    OpSpec("LOGICAL_NOT", kernels("bool -> bool"), prepare_not, emit_not,
           overlaps=overlaps.elementwise(0)),
)
