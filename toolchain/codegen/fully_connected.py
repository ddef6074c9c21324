"""C emitters for FULLY_CONNECTED and BATCH_MATMUL, from the same params as runtime_py.

FULLY_CONNECTED walks the input as (batches, depth) rows and the filter as (units, depth) rows,
so every dot product reads two contiguous rows; outputs are written row by row. Its int8
requantization is TFLite's double-precision one, reproduced operation for operation.
BATCH_MATMUL multiplies one (rows, depth) x (depth, cols) matrix pair per broadcast batch.
"""

from __future__ import annotations

import numpy as np

from toolchain.codegen.context import (
    CTensor,
    OpContext,
    c_array,
    c_float,
    c_length,
    family_macro,
)
from toolchain.ops.fully_connected import (
    BatchMatMulFloatParams,
    BatchMatMulInt8Params,
    FullyConnectedFloatParams,
    FullyConnectedInt8Params,
)

TEMPLATE = "c/fully_connected.c.j2"
# Dot products run a main loop whose trip count is a multiple of this (so GCC's -O2 vectorizer,
# which refuses loops needing a scalar epilogue, takes it) and a short scalar tail.
VECTOR_STEP = 16
# float dot products keep this many partial sums: a float reduction only vectorizes this way.
FLOAT_LANES = 8
# int8 FULLY_CONNECTED computes this many units at once (the template spells out four), so that
# each input load serves four filter rows and four sums run in parallel.
UNIT_BLOCK = 4
# BATCH_MATMUL with a row-major rhs accumulates whole output rows in a stack array of at most
# this many elements; wider outputs fall back to dot products down the rhs columns.
MAX_ROW_ACCUMULATOR = 256
INT32_MAX = 2**31 - 1
# |(int8 + offset) * (int8 + offset)| when both offsets may reach +-128 (zero points in int8).
MAX_OFFSET_PRODUCT = 255 * 255
MAX_RAW_PRODUCT = 128 * 128


def _plus(value: int) -> str:
    """` + v` / ` - v` / `` for adding a constant in C text."""
    return f" + {value}" if value > 0 else f" - {-value}" if value < 0 else ""


def _offset(value: int, expr: str) -> str:
    """`(expr + value)`, or just `expr` for a zero offset."""
    return f"({expr}{_plus(value)})" if value else expr


def _accumulator(depth: int, max_product: int) -> str:
    """int32_t when `depth` products cannot overflow it (the common case, and what vectorizes
    best); otherwise uint32_t, which wraps as TFLite's int32 accumulator does in practice."""
    return "int32_t" if depth * max_product <= INT32_MAX else "uint32_t"


def _wrap_int32(values: np.ndarray) -> np.ndarray:
    return ((values.astype(np.int64) + 2**31) & 0xFFFFFFFF) - 2**31


def _c_double(value: float) -> str:
    """A double literal that parses back to exactly `value` (repr is the shortest round trip)."""
    text = repr(float(value))
    return text if ("." in text or "e" in text) else text + ".0"


def _pairwise_sum(terms: list[str]) -> str:
    """C text adding `terms` as a balanced tree: ((a + b) + (c + d))."""
    while len(terms) > 1:
        pairs = [f"({a} + {b})" for a, b in zip(terms[::2], terms[1::2])]
        terms = pairs + terms[len(pairs) * 2:]
    return terms[0][1:-1] if terms[0].startswith("(") else terms[0]


def _constant_data(tensor: CTensor | None) -> np.ndarray | None:
    """The values of a constant tensor, when the codegen context provides them."""
    return None if tensor is None else tensor.data


# -- FULLY_CONNECTED -------------------------------------------------------------------------


def _fc_common(ctx: OpContext) -> dict:
    p = ctx.params
    x, weights = ctx.inputs[0], ctx.inputs[1]
    bias = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    out = ctx.outputs[0]
    return {
        "fn": ctx.fn, "prefix": ctx.prefix, "comment": f"{ctx.op.opcode} '{out.name}'",
        "x": x.ptr, "w": weights.ptr, "bias": bias.ptr if bias is not None else None,
        "out": out.ptr, "batches": p.batches, "depth": p.depth, "units": p.units,
        "units_length": c_length(p.units),
    }


def fc_float_values(ctx: OpContext) -> dict:
    p: FullyConnectedFloatParams = ctx.params
    return {
        **_fc_common(ctx), "is_float": True,
        "lanes": FLOAT_LANES, "depth_main": p.depth - p.depth % FLOAT_LANES,
        "lane_sum": _pairwise_sum([f"lane[{i}]" for i in range(FLOAT_LANES)]),
        "act_min": c_float(p.activation_min), "act_max": c_float(p.activation_max),
    }


def fc_int8_values(ctx: OpContext) -> dict:
    p: FullyConnectedInt8Params = ctx.params
    v = _fc_common(ctx)
    weights = _constant_data(ctx.inputs[1])
    folded = weights is not None
    row_terms = None
    if folded:
        # sum((x + io) * (w + fo)) = sum(x * w) + fo * sum(x) + [io * sum(w) + depth * io * fo]:
        # the bracket is a per-unit constant, so the inner loop is a plain int8 dot product.
        # (The bias stays in its own array, which the C still reads.)
        w = np.asarray(weights, np.int64).reshape(p.units, p.depth)
        terms = p.input_offset * w.sum(axis=1) + p.depth * p.input_offset * p.filter_offset
        row_terms = c_array(_wrap_int32(terms)) if terms.any() else None
    per_channel = len(p.requant_scales) > 1
    scales = [_c_double(s) for s in p.requant_scales]
    return {
        **v, "is_float": False,
        "depth_main": p.depth - p.depth % VECTOR_STEP,
        "acc_type": _accumulator(p.depth, MAX_RAW_PRODUCT if folded else MAX_OFFSET_PRODUCT),
        "x_term": "xb[d]" if folded else _offset(p.input_offset, "xb[d]"),
        "w_terms": [f"w{k}[d]" if folded else _offset(p.filter_offset, f"w{k}[d]")
                    for k in range(UNIT_BLOCK)],
        "units_main": p.units - p.units % UNIT_BLOCK, "unit_tail": p.units % UNIT_BLOCK > 0,
        "uses_unit": bool(row_terms or v["bias"] or per_channel),
        "row_terms": row_terms,
        # the filter offset times each input row's sum, when folded and the offset is nonzero
        "filter_offset": p.filter_offset if folded else 0,
        "scales": ",\n  ".join(", ".join(scales[i:i + 4]) for i in range(0, len(scales), 4))
        if per_channel else None,
        "scale": f"{v['prefix']}_scale[u]" if per_channel else scales[0],
        # added in uint32_t: TFLite's int32 sum wraps before the clamp
        "output_offset": f"{_plus(p.output_offset)}u" if p.output_offset else "",
        "act_min": p.activation_min, "act_max": p.activation_max,
    }


def emit_fully_connected(ctx: OpContext) -> str:
    if isinstance(ctx.params, FullyConnectedFloatParams):
        return family_macro(TEMPLATE, "fully_connected_float")(fc_float_values(ctx))
    return family_macro(TEMPLATE, "fully_connected_int8")(fc_int8_values(ctx))


# -- BATCH_MATMUL ----------------------------------------------------------------------------


def _batch_strides(shape: tuple[int, ...], batch: tuple[int, ...]) -> list[int]:
    """Element strides of an operand over the output's batch dimensions (0 where it
    broadcasts), for batch dimensions padded on the left to 3."""
    dims = (1,) * (len(batch) - len(shape[:-2])) + tuple(shape[:-2])
    stride = shape[-2] * shape[-1]
    strides = []
    for size in reversed(dims):
        strides.append(stride if size > 1 else 0)
        stride *= size
    return [0] * (3 - len(dims)) + strides[::-1]


def batch_matmul_values(ctx: OpContext) -> dict:
    p: BatchMatMulFloatParams | BatchMatMulInt8Params = ctx.params
    lhs, rhs, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    rows, cols = out.shape[-2], out.shape[-1]
    depth = lhs.shape[-2] if p.adj_x else lhs.shape[-1]
    batch = tuple(out.shape[:-2])
    padded = (1,) * (3 - len(batch)) + batch
    # lhs element (i, k) sits at i * lhs_i + k * lhs_k; rhs (k, j) at k * rhs_k + j * rhs_j.
    lhs_i, lhs_k = (1, rows) if p.adj_x else (depth, 1)
    rhs_k, rhs_j = (1, depth) if p.adj_y else (cols, 1)
    is_float = isinstance(p, BatchMatMulFloatParams)
    row_form = not p.adj_y and cols <= MAX_ROW_ACCUMULATOR
    v = {
        "fn": ctx.fn, "comment": f"{ctx.op.opcode} '{out.name}'",
        "ctype": lhs.ctype, "out_type": out.ctype, "lhs": lhs.ptr, "rhs": rhs.ptr,
        "out": out.ptr, "batch": padded, "lhs_strides": _batch_strides(lhs.shape, batch),
        "rhs_strides": _batch_strides(rhs.shape, batch), "rows": rows, "cols": cols,
        "matrix": rows * cols,
        "depth": depth, "lhs_i": lhs_i, "lhs_k": lhs_k, "rhs_k": rhs_k, "rhs_j": rhs_j,
        # row form: acc[j] += lhs(i, k) * rhs row k, contiguous in j (vectorizes, also for
        # float: each acc[j] still sums its products in k order); else dot products in k.
        "row_form": row_form, "is_float": is_float, "requantize": False,
        "lhs_offset": "", "rhs_offset": "", "lhs_term": "lhs(i, k)", "rhs_term": "rhs(k, j)",
    }
    if is_float:
        return {**v, "acc_type": "float"}
    max_product = MAX_OFFSET_PRODUCT if p.requantize else MAX_RAW_PRODUCT
    v.update(acc_type=_accumulator(depth, max_product), requantize=p.requantize,
             lhs_offset=_plus(p.lhs_offset), rhs_offset=_plus(p.rhs_offset),
             lhs_term=_offset(p.lhs_offset, "lhs(i, k)"),
             rhs_term=_offset(p.rhs_offset, "rhs(k, j)"))
    if p.requantize:
        # clamp(v + offset, lo, hi) == clamp(v, lo - offset, hi - offset) + offset, without
        # the int32 overflow the left side could hit.
        v.update(multiplier=p.output_multiplier, shift=p.output_shift,
                 output_offset=_plus(p.output_offset), clamp_min=p.activation_min - p.output_offset,
                 clamp_max=p.activation_max - p.output_offset)
    return v


def emit_batch_matmul(ctx: OpContext) -> str:
    return family_macro(TEMPLATE, "batch_matmul")(batch_matmul_values(ctx))


EMITTERS = {"FULLY_CONNECTED": emit_fully_connected, "BATCH_MATMUL": emit_batch_matmul}
