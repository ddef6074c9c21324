"""Params and C emitters for the comparison and logical ops: LESS, LESS_EQUAL, GREATER,
GREATER_EQUAL, EQUAL, NOT_EQUAL, LOGICAL_AND, LOGICAL_OR (bool outputs, broadcast as the
elementwise binary ops) and LOGICAL_NOT; and SELECT and SELECT_V2, which take a bool condition.

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
from toolchain.ir import Graph, Operator, Tensor
from toolchain.numerics.quant import INT_RANGES, per_tensor_quantization, quantize_multiplier
from toolchain.ops import overlaps
from toolchain.ops.elementwise import (
    BYTE_VALUES,
    WIDE_TYPE,
    BinaryOpParams,
    RescaledInputs,
    _plus,
    _shapes,
    _table_load,
    broadcast_loops,
    broadcast_nest,
    collapsed_loops,
    rescaled_inputs,
)
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_offset,
    render_macro,
)
from toolchain.ops.spec import OpSpec, kernels

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
class RescaledComparisonParams(RescaledInputs):
    """Quantized inputs compared at the common scale RescaledInputs brings them to."""


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


# -- SELECT, SELECT_V2 -----------------------------------------------------------------------

# SELECT_V2 broadcasts through LiteRT's 5-D loops.
MAX_SELECT_BROADCAST_RANK = 5
SELECT_DTYPES = frozenset({"bool", "float32", "int8", "uint8", "int16", "int32", "int64"})


@dataclass(frozen=True)
class SelectParams:
    """output = condition ? x : y, element by element, every operand broadcast to the output.
    SELECT's condition of rank 1 (one bool per slice along the first dimension) or 0 is given
    here as the broadcast shape it stands for."""

    opcode: str
    condition_shape: tuple[int, ...]
    x_shape: tuple[int, ...]
    y_shape: tuple[int, ...]
    output_shape: tuple[int, ...]


def _select_shapes(op: Operator, cond: Tensor, x: Tensor, y: Tensor, out: Tensor
                   ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The condition's broadcast shape and the output's, as LiteRT's Prepare decides them."""
    if cond.num_elements == x.num_elements == y.num_elements == out.num_elements == 1:
        return (), ()  # one element: LiteRT keeps the output's declared shape
    if cond.shape == x.shape == y.shape:
        broadcast = x.shape
    elif op.opcode == "SELECT":
        if x.shape != y.shape:
            raise UnsupportedOpError(f"SELECT of shapes {x.shape} and {y.shape} (SELECT does "
                                     "not broadcast; SELECT_V2 does)")
        if not (cond.shape == () or len(cond.shape) == 1 and x.shape
                and cond.shape[0] == x.shape[0]):
            raise UnsupportedOpError(f"SELECT condition of shape {cond.shape} for values of "
                                     f"shape {x.shape}: neither the same, one bool, nor one "
                                     "per slice along the first dimension")
        return cond.shape + (1,) * (len(x.shape) - len(cond.shape)), x.shape
    else:
        try:
            broadcast = tuple(np.broadcast_shapes(cond.shape, x.shape, y.shape))
        except ValueError:
            raise UnsupportedOpError(f"shapes {cond.shape}, {x.shape} and {y.shape} do not "
                                     "broadcast") from None
        if len(broadcast) > MAX_SELECT_BROADCAST_RANK:
            raise UnsupportedOpError(f"broadcasting over more than "
                                     f"{MAX_SELECT_BROADCAST_RANK} dimensions")
    if broadcast != out.shape:
        raise UnsupportedOpError(f"output shape {out.shape} is not the broadcast {broadcast}")
    return cond.shape, broadcast


def prepare_select(graph: Graph, op: Operator) -> SelectParams:
    """LiteRT copies the chosen values' bits: quantized values must share one quantization
    with the output to mean the same (we refuse otherwise)."""
    cond, x, y = (graph.tensors[i] for i in op.inputs)
    out = graph.tensors[op.outputs[0]]
    if any(t.quantization is not None for t in (x, y, out)):
        if len({per_tensor_quantization(t) for t in (x, y, out)}) != 1:
            raise UnsupportedOpError("x, y and the output need identical quantization "
                                     "(LiteRT copies stored values)")
    condition_shape, output_shape = _select_shapes(op, cond, x, y, out)
    one = output_shape == ()
    return SelectParams(op.opcode, condition_shape, () if one else x.shape,
                        () if one else y.shape, output_shape)


# -- C -------------------------------------------------------------------------------------

TEMPLATE = "c/comparisons.c.j2"


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
            "tables": [c_array(rescaled_inputs(p, *scaling), per_line=8)
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


def _element(pointer: str, stride: int, index: str) -> str:
    return f"{pointer}[{index if stride else 0}]"


def select_nest(loops: list[tuple[int, tuple[int, ...], int]], ctype: str) -> dict:
    """The loop nest of SELECT: pointers c<k>, a<k>, b<k>, o<k> derived level by level as in
    the elementwise nest; the innermost loop stores `c ? a : b`, reading index 0 of an operand
    it does not walk."""
    types = ("const uint8_t", f"const {ctype}", f"const {ctype}", ctype)
    levels = []
    for k, (n, strides, stride_out) in enumerate(loops[:-1]):
        i = ConstantLoop(f"i{k}", n)
        levels.append({"header": i.header, "pad": "  " * (k + 1), "pointers": [
            f"{t} *{name}{k + 1} = {c_offset(f'{name}{k}', [(i, stride)])};"
            for t, name, stride in zip(types, "cabo", (*strides, stride_out))]})
    depth = len(loops) - 1
    n, (sc, sa, sb), _ = loops[-1]
    inner = ConstantLoop("i", n)
    c, a, b = (_element(f"{name}{depth}", stride, inner.index)
               for name, stride in zip("cab", (sc, sa, sb)))
    return {"outer": levels, "inner": {
        "loop": inner, "pad": "  " * (depth + 1), "hoisted": None, "ivdep": inner.written,
        "statement": f"o{depth}[{inner.index}] = {c} ? {a} : {b};"}}


def emit_select(ctx: OpContext) -> Kernel:
    p = ctx.params
    cond, x, y = ctx.inputs
    out = ctx.outputs[0]
    loops = collapsed_loops((p.condition_shape, p.x_shape, p.y_shape), p.output_shape)
    nest = select_nest(loops, out.ctype) if loops else None
    comment = (f"{p.opcode} {out.dtype} {list(p.condition_shape)} ? {list(p.x_shape)} : "
               f"{list(p.y_shape)} -> {list(p.output_shape)} '{out.name}'")
    text = render_macro(TEMPLATE, "select", {
        "fn": ctx.fn, "ctype": out.ctype, "c": cond.ptr, "a": x.ptr, "b": y.ptr,
        "out": out.ptr, "nest": nest, "comment": c_comment(comment)})
    return Kernel(text, ("ivdep",) if nest is not None and nest["inner"]["ivdep"] else ())


SPECS: tuple[OpSpec, ...] = (
    *(OpSpec(opcode, kernels("bool, T, T -> T", T=SELECT_DTYPES), prepare_select, emit_select,
             overlaps=overlaps.elementwise(0, 1, 2))
      for opcode in ("SELECT", "SELECT_V2")),
    *(OpSpec(opcode, SIGNATURES[opcode], prepare, emit_binary,
             overlaps=overlaps.elementwise(0, 1))
      for opcode in OPCODES),
    OpSpec("LOGICAL_NOT", kernels("bool -> bool"), prepare_not, emit_not,
           overlaps=overlaps.elementwise(0)),
)
