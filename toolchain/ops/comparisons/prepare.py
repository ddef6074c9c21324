"""Params for the comparison and logical ops: LESS, LESS_EQUAL, GREATER,
GREATER_EQUAL, EQUAL, NOT_EQUAL, LOGICAL_AND, LOGICAL_OR (bool outputs, broadcast as the
elementwise binary ops) and LOGICAL_NOT; and SELECT and SELECT_V2, which take a bool condition.

Two arithmetic shapes, following LiteRT's comparisons.cc:
- `ComparisonParams`: stored values compared in their own type (float32, int16 unless EQUAL or
  NOT_EQUAL on quantized inputs, int32, int64, bool), and LOGICAL_AND/OR on bools.
- `RescaledComparisonParams`: int8, uint8 (and quantized int16 for EQUAL/NOT_EQUAL): each input,
  offset by its zero point and shifted left 8 bits, is multiplied by its own scale in fixed
  point; the two results, int32 values at a common scale, are compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolchain.errors import UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.numerics.quant import per_tensor_quantization, quantize_multiplier
from toolchain.ops.elementwise.prepare import BinaryOpParams, RescaledInputs, _shapes
from toolchain.ops.spec import kernels

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
