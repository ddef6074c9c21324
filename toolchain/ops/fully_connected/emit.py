"""C emitters for FULLY_CONNECTED and BATCH_MATMUL, from the same params as runtime_py.

FULLY_CONNECTED walks the input as (batches, depth) rows and the filter as (units, depth) rows,
so every dot product reads two contiguous rows; outputs are written row by row. Its int8
requantization is TFLite's double-precision one, reproduced operation for operation.
BATCH_MATMUL multiplies one (rows, depth) x (depth, cols) matrix pair per broadcast batch.

Every loop is a ConstantLoop and every index a c_sum of them, so a loop of one trip is written
as its body alone and a loop of none not at all.
"""

from __future__ import annotations

import numpy as np

from toolchain.ir import INT32_MAX
from toolchain.ops.conv.emit import BYTE_COLUMN, MAX_STACK_BYTES
from toolchain.ops.emit import (
    ConstantLoop,
    CTensor,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_length,
    c_offset,
    c_pointer,
    c_sum,
    definition,
    plus,
    render_macro,
    written_vars,
)
from toolchain.ops.fully_connected.prepare import (
    FLOAT_LANES,
    VECTOR_ACTIVATIONS,
    BatchMatMulFloatParams,
    BatchMatMulHybridParams,
    BatchMatMulInt8Params,
    BatchMatMulInt16Params,
    FullyConnectedFloatParams,
    FullyConnectedHybridParams,
    FullyConnectedQuantizedParams,
)
from toolchain.ops.hybrid import quantize_lines

TEMPLATE = "c/fully_connected.c.j2"
# Dot products run a main loop whose trip count is a multiple of this (so GCC's -O2 vectorizer,
# which refuses loops needing a scalar epilogue, takes it) and a short scalar tail.
VECTOR_STEP = 16
# int8 FULLY_CONNECTED computes this many units at once (the template spells out four), so that
# each input load serves four filter rows and four sums run in parallel.
UNIT_BLOCK = 4
# BATCH_MATMUL with a row-major rhs accumulates whole output rows in a stack array of at most
# this many bytes; wider outputs fall back to dot products down the rhs columns.
MAX_ROW_ACCUMULATOR_BYTES = 1024
ACCUMULATOR_BYTES = {"float": 4, "int32_t": 4, "uint32_t": 4, "int64_t": 8}
# |(int8 + offset) * (int8 + offset)| when both offsets may reach +-128 (zero points in int8);
# int16 inputs have no offset, their int8 filter may.
MAX_OFFSET_PRODUCT = 255 * 255
MAX_OFFSET_PRODUCT_INT16 = 32768 * 255
MAX_RAW_PRODUCT = {"int8": 128 * 128, "uint8": 255 * 255, "int16": 32768 * 128}
# Per-unit scales printed this many to a line.
SCALES_PER_LINE = 4


def _offset(value: int, expr: str) -> str:
    """`(expr + value)`, or just `expr` for a zero offset."""
    return f"({expr}{plus(value)})" if value else expr


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
        pairs = [f"({a} + {b})" for a, b in zip(terms[::2], terms[1::2], strict=True)]
        terms = pairs + terms[len(pairs) * 2:]
    return terms[0][1:-1] if terms[0].startswith("(") else terms[0]


def _constant_data(tensor: CTensor | None) -> np.ndarray | None:
    """The values of a constant tensor, when the codegen context provides them."""
    return None if tensor is None else tensor.data


# -- FULLY_CONNECTED -------------------------------------------------------------------------


def _fc_common(ctx: OpContext) -> dict:
    p = ctx.params
    weights = ctx.inputs[1]
    bias = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    out = ctx.outputs[0]
    batch = ConstantLoop("b", p.batches)
    xb, x_decl = c_pointer("xb", f"const {out.ctype}", "x", [(batch, p.depth)])
    ob, o_decl = c_pointer("ob", out.ctype, "out", [(batch, p.units)])
    return {
        "fn": ctx.fn, "prefix": ctx.prefix, "ctype": out.ctype, "name": out.name,
        "x": ctx.inputs[0].ptr, "w": weights.ptr, "bias": bias.ptr if bias is not None else None,
        "out": out.ptr, "units_length": c_length(p.units),
        "batch": batch, "xb": xb, "ob": ob, "batch_pointers": x_decl + o_decl,
    }


def fc_float_values(ctx: OpContext) -> dict:
    p: FullyConnectedFloatParams = ctx.params
    v = _fc_common(ctx)
    unit = ConstantLoop("u", p.units)
    wr, w_decl = c_pointer("wr", f"const {v['ctype']}", "w", [(unit, p.depth)])
    depth_main = p.depth - p.depth % FLOAT_LANES
    main, lanes = ConstantLoop("d", depth_main, 0, FLOAT_LANES), ConstantLoop("l", FLOAT_LANES)
    tail = ConstantLoop("d", p.depth, depth_main)
    at = c_sum([(main, 1), (lanes, 1)])
    bias = " + bias[u]" if v["bias"] else ""
    comment = (f"{ctx.op.opcode} '{v['name']}': out[b][u] = clamp(dot(x row b, filter row u)"
               f"{bias}), row by row")
    return {
        **v, "comment": c_comment(comment), "unit": unit, "unit_pointers": w_decl,
        "main": main, "tail": tail, "lanes": lanes if main.runs else None,
        "lane_step": f"lane[{lanes.index}] += {v['xb']}[{at}] * {wr}[{at}];",
        "lane_sum": _pairwise_sum([f"lane[{i}]" for i in range(FLOAT_LANES)]),
        "tail_step": f"acc += {v['xb']}[{tail.index}] * {wr}[{tail.index}];",
        "store": f"{v['ob']}[{unit.index}] = arenac_clampf(acc, {c_float(p.activation_min)}, "
                 f"{c_float(p.activation_max)});",
        "counters": written_vars([v["batch"], unit, main, *([lanes] if main.runs else []), tail]),
    }


def _folded_row_terms(p: FullyConnectedQuantizedParams, weights: np.ndarray,
                      byte: bool) -> str | None:
    """The per-unit constant of a constant filter's sums, as a C array (None when all 0).

    sum((x + io) * (w + fo)) = sum(x * w) + fo * sum(x) + [io * sum(w) + depth * io * fo]: the
    bracket is a per-unit constant, so the inner loop is a plain int8 dot product (of x + 128
    with the copy: its io is then io - 128). (The bias stays in its own array, which the C
    still reads.)"""
    w = np.asarray(weights, np.int64).reshape(p.units, p.depth)
    terms = ((p.input_offset - (128 if byte else 0)) * w.sum(axis=1)
             + p.depth * p.input_offset * p.filter_offset)
    return c_array(_wrap_int32(terms)) if terms.any() else None


def _fc_stage_values(ctx: OpContext, v: dict, wide: bool, byte: bool, row_terms: str | None,
                     filter_offset: int) -> dict:
    """The values of the output stage: from a unit's sum of products, its folded terms, bias
    and filter offset term, to the rescaled, clamped output."""
    p: FullyConnectedQuantizedParams = ctx.params
    name, prefix = v["name"], v["prefix"]
    per_channel = len(p.requant_scales) > 1
    scales = [_c_double(s) for s in p.requant_scales]
    row_comment = (f"{ctx.op.opcode} '{name}': per unit, "
                   + ("(input offset - 128)" if byte else "input offset") + " * filter row sum"
                   + (" + depth * input offset * filter offset" if filter_offset else "")
                   + " (int32, wrapped)")
    return {
        "comment": c_comment(f"{ctx.op.opcode} '{name}'"),
        "row_comment": c_comment(row_comment),
        "scale_comment": c_comment(f"{ctx.op.opcode} '{name}': per unit, (double)input_scale * "
                                   "filter_scale[u] / output_scale"),
        "plus_bias": " + bias[u]" if v["bias"] else "",
        "uses_unit": bool(row_terms or v["bias"] or per_channel),
        "row_terms": row_terms,
        "output_comment": c_comment(
            "Output unit u from its sum of products, "
            + ("in int64_t as TFLite's 16x8 accumulator. " if wide else
               "in uint32_t so that it wraps like TFLite's int32 accumulator. ")
            + "TFLite's reference rescales this op in double: round((double)acc * scale) with "
            "C's round (halves away from zero), then a cast to int32 that gives INT32_MIN out of "
            "range on x86. Without <math.h>: t truncates, and scaled - t is exact."),
        "sum_type": "int64_t" if wide else "uint32_t",
        "bias_type": "int64_t" if wide else "int32_t",
        "acc": ("const int64_t acc = sum" + (" + bias[u];" if v["bias"] else ";")) if wide
        else "const int32_t acc = (int32_t)(sum" + (f" + (uint32_t){prefix}_row[u]" if row_terms
                                                     else "")
        + (" + (uint32_t)bias[u]" if v["bias"] else "") + ");",
        "filter_offset": filter_offset,
        "sums_rows": filter_offset != 0,  # the filter offset times each input row's sum
        "xsum_type": "int64_t" if p.dtype == "int16" else "int32_t",  # int16 rows may not fit
        "xterm_type": "int64_t" if wide else "uint32_t",
        "xterm": (f"(int64_t){filter_offset} * xsum" if wide
                  else f"(uint32_t){filter_offset} * (uint32_t)xsum"),
        "scales": ",\n  ".join(", ".join(scales[i:i + SCALES_PER_LINE])
                               for i in range(0, len(scales), SCALES_PER_LINE))
        if per_channel else None,
        "scale": f"{prefix}_scale[u]" if per_channel else scales[0],
        # added in uint32_t: TFLite's int32 sum wraps before the clamp
        "output_offset": f"{plus(p.output_offset)}u" if p.output_offset else "",
        "act_min": p.activation_min, "act_max": p.activation_max,
    }


def _fc_unit_values(ctx: OpContext, v: dict, acc_type: str, x_term: str, w_term: str,
                    xterm: str, wide: bool) -> dict:
    """The dot products: units in blocks of UNIT_BLOCK, then one by one; each dot product in a
    main loop of a multiple of VECTOR_STEP steps and a tail. `x_term` and `w_term`: an input
    and a filter element at depth {d} of a {row}."""
    p: FullyConnectedQuantizedParams = ctx.params
    w_ctype, prefix, xb = ctx.inputs[1].ctype, v["prefix"], v["xb"]
    units_main = p.units - p.units % UNIT_BLOCK
    depth_main = p.depth - p.depth % VECTOR_STEP
    block = ConstantLoop("u", units_main, 0, UNIT_BLOCK)
    unit_tail = ConstantLoop("u", p.units, units_main)
    main, tail = ConstantLoop("d", depth_main), ConstantLoop("d", p.depth, depth_main)
    filters = [f"w{k}" for k in range(UNIT_BLOCK)]
    block_pointers = [f"const {w_ctype} *w0 = {c_offset('w', [(block, p.depth)])}"
                      + "".join(f", *w{k} = w{k - 1} + {p.depth}" for k in range(1, UNIT_BLOCK))
                      + ";"]
    tail_row, tail_pointers = c_pointer("wr", f"const {w_ctype}", "w", [(unit_tail, p.depth)])

    def step4(depth: ConstantLoop) -> dict:
        """One step along the depth for the four units of a block: the input element loaded
        once, each product added to its unit's sum."""
        return {"acc_type": acc_type, "x": f"({acc_type}){x_term.format(row=xb, d=depth.index)}",
                "dots": [f"dot{k} += xv * {w_term.format(row=row, d=depth.index)};"
                         for k, row in enumerate(filters)]}

    def step1(depth: ConstantLoop) -> str:
        x, w = (term.format(row=row, d=depth.index) for term, row in
                ((x_term, xb), (w_term, tail_row)))
        return f"dot += ({acc_type}){x} * {w};"

    def store(unit: str, dot: str) -> str:
        sum_value = f"{dot}{xterm}" if wide else f"(uint32_t){dot}{xterm}"
        return f"{v['ob']}[{unit}] = {prefix}_output({sum_value}, {unit});"

    return {
        "block": block, "block_pointers": block_pointers,
        "block_main": main, "block_tail": tail,
        "block_main_step": step4(main), "block_tail_step": step4(tail),
        "block_stores": [store(c_sum([(block, 1)], k), f"dot{k}") for k in range(UNIT_BLOCK)],
        "unit_tail": unit_tail, "unit_tail_pointers": tail_pointers,
        "unit_main": main, "unit_rest": tail,
        "unit_main_step": step1(main), "unit_rest_step": step1(tail),
        "unit_tail_store": store(unit_tail.index, "dot"),
    }


def fc_quantized_values(ctx: OpContext) -> dict:
    p: FullyConnectedQuantizedParams = ctx.params
    v = _fc_common(ctx)
    weights = _constant_data(ctx.inputs[1])
    folded = weights is not None
    w_ctype = ctx.inputs[1].ctype
    wide = p.accumulator == "int64"  # TFLite's 16x8 accumulator and bias, unless asked int32
    # int8 input + 128 is a byte: the dot products read a stack copy of each input row in
    # arenac_col8, which x86's VNNI multiplies by the int8 filter in place (as CONV_2D's column)
    byte = (folded and p.dtype == "int8" and w_ctype == "int8_t" and not wide
            and 2 * p.depth <= MAX_STACK_BYTES)
    row_terms = _folded_row_terms(p, weights, byte) if folded else None
    offset_product = MAX_OFFSET_PRODUCT_INT16 if p.dtype == "int16" else MAX_OFFSET_PRODUCT
    acc_type = "int64_t" if wide else _accumulator(
        p.depth, 255 * 128 if byte else MAX_RAW_PRODUCT[p.dtype] if folded else offset_product)
    filter_offset = p.filter_offset if folded else 0
    # an input and a filter element at depth {d} of a row, offset unless folded
    x_term = ("xr[{d}]" if byte else "{row}[{d}]" if folded
              else _offset(p.input_offset, "{row}[{d}]"))
    w_term = "{row}[{d}]" if folded else _offset(p.filter_offset, "{row}[{d}]")
    xterm = " + xterm" if filter_offset else ""
    xb = v["xb"]
    copy_loop = ConstantLoop("d", p.depth if byte else 0)
    copy = {"declaration": f"{BYTE_COLUMN} xr[{p.depth}];",
            "comment": "/* this input row + 128, which the dot products read */",
            "loop": copy_loop,
            "step": f"xr[{copy_loop.index}] = ({BYTE_COLUMN})({xb}[{copy_loop.index}] + 128);",
            } if byte else None
    row_sum = ConstantLoop("d", p.depth if filter_offset else 0)
    units = _fc_unit_values(ctx, v, acc_type, x_term, w_term, xterm, wide)
    return {
        **v, **_fc_stage_values(ctx, v, wide, byte, row_terms, filter_offset), **units,
        "acc_type": acc_type, "w_ctype": w_ctype, "depth_loop": row_sum,
        "counters": written_vars([v["batch"], row_sum, copy_loop, units["block"],
                                  units["unit_tail"], units["block_main"],
                                  units["block_tail"]]),
        "row_copy": copy,
    }


def _quantize_row_lines(p, k: ConstantLoop, xb: str) -> list[str]:
    """Lines quantizing row `xb` (p.depth values) into q: its scale in `scale` (and zero point in
    `zp`)."""
    return quantize_lines(p.depth, p.asymmetric, k, xb, "q")


def fc_hybrid_values(ctx: OpContext) -> dict:
    p: FullyConnectedHybridParams = ctx.params
    v = _fc_common(ctx)
    unit, k = ConstantLoop("u", p.units), ConstantLoop("k", p.depth)
    per_channel = len(p.filter_scales) > 1
    tables = []
    if per_channel:
        tables.append({"comment": c_comment(f"FULLY_CONNECTED '{v['name']}': the filter scale "
                                            "per unit"),
                       "ctype": "float", "name": f"{v['prefix']}_filter_scale",
                       "length": c_length(p.units),
                       "data": c_array(np.asarray(p.filter_scales, np.float32))})
    if p.asymmetric:
        tables.append({"comment": c_comment(f"FULLY_CONNECTED '{v['name']}': the sum of each "
                                            "filter row, times a row's zero point"),
                       "ctype": "int32_t", "name": f"{v['prefix']}_row_sum",
                       "length": c_length(p.units), "data": c_array(p.row_sums)})
    quantize = [f"float scale;{' int32_t zp;' if p.asymmetric else ''}",
                *_quantize_row_lines(p, k, v["xb"])]
    if not per_channel:
        quantize.append(f"scale *= {c_float(p.filter_scales[0])}; /* times the filter's */")
    row_scale = f"{v['prefix']}_filter_scale[{unit.index}] * scale" if per_channel else "scale"
    finish = []
    if p.asymmetric:
        finish.append(f"acc = (int32_t)((uint32_t)acc - (uint32_t)zp * "
                      f"(uint32_t){v['prefix']}_row_sum[{unit.index}]);")
    if per_channel:
        finish.append(f"const float unit_scale = {row_scale};")
        row_scale = "unit_scale"
    finish += [f"y = (float)acc * {row_scale};",
               (f"y = bias[{unit.index}] + y;" if v["bias"]
                else "y = 0.0f + y; /* TFLite adds to a zeroed output: -0.0f becomes 0.0f */"),
               *vector_activation_lines(p.activation, "y"),
               f"{v['ob']}[{unit.index}] = y;"]
    comment = (f"FULLY_CONNECTED '{v['name']}' (hybrid: float32 input, int8 weights): each input "
               "row quantized to int8 in the arena as TFLite's x86 reference build does, int32 "
               "dot products, scaled back to float, bias and clamp")
    return {**v, "comment": c_comment(comment), "tables": tables, "scratch": ctx.scratch[0],
            "unit": unit, "depth": k, "row": c_offset("w", [(unit, p.depth)]),
            "quantize": quantize, "finish": finish,
            "counters": written_vars([v["batch"], k, unit]) or "k"}


def vector_activation_lines(activation: str, y: str) -> list[str]:
    """C applying `activation` to float `y` in place as std::min, then std::max, would."""
    low, high = VECTOR_ACTIVATIONS[activation]
    lines = []
    if high is not None:
        lines.append(f"{y} = {c_float(high)} < {y} ? {c_float(high)} : {y};")
    if low is not None:
        lines.append(f"{y} = {c_float(low)} < {y} ? {y} : {c_float(low)};")
    return lines


def fc_band_values(ctx: OpContext) -> dict:
    """A band of the input (p.reduction) added to each unit's sum of products, offsets and all:
    the sums, and after them the depth added so far (where the band's filter columns start),
    are the segment's, after its input's rows (ctx.scratch). The last band writes the output
    from them as the whole op does, with the bias."""
    p: FullyConnectedQuantizedParams = ctx.params
    band, starts = ctx.inputs[0].size, p.reduction.starts
    unit, depth = ConstantLoop("u", p.units), ConstantLoop("d", band)
    zeroed = ConstantLoop("u", p.units + 1 if starts else 0)
    v = _fc_common(ctx)
    x_term = _offset(p.input_offset, f"x[{depth.index}]")
    w_term = _offset(p.filter_offset, f"wr[{depth.index}]")
    return {
        **v, **_fc_stage_values(ctx, v, False, False, None, 0),
        "band_comment": c_comment(
            f"{ctx.op.opcode} '{v['name']}': {band} more of the input's {p.depth} values "
            "added to each unit's sum of products, wrapping as TFLite's int32 sums"
            + ("; then the output from the sums" if p.reduction.finishes else "")),
        "w_ctype": ctx.inputs[1].ctype, "out": v["out"] if p.reduction.finishes else None,
        "sums": ctx.scratch[0],
        "units": p.units, "band": band, "unit": unit, "depth": depth, "zeroed": zeroed,
        "row": c_offset("w", [(unit, p.depth)]),
        "step": f"dot += (uint32_t)({x_term} * {w_term});",
        "counters": written_vars([unit, depth, zeroed]),
    }


def emit_fc_band(ctx: OpContext) -> Kernel:
    """A band's function; the last band's after the output stage it calls (and per-channel
    scales)."""
    v = fc_band_values(ctx)
    definitions = ()
    if ctx.params.reduction.finishes:
        definitions = tuple(definition(name, render_macro(TEMPLATE, macro, v), gap=True)
                            for name, macro in ((f"{v['prefix']}_scale", "fc_scales"),
                                                (f"{v['prefix']}_output", "fc_output"))
                            if macro != "fc_scales" or v["scales"])
    return Kernel(render_macro(TEMPLATE, "fully_connected_band", v), ("clamp",),
                  definitions=definitions)


def emit_fully_connected(ctx: OpContext) -> Kernel:
    if getattr(ctx.params, "reduction", None) is not None:
        return emit_fc_band(ctx)
    if isinstance(ctx.params, FullyConnectedHybridParams):
        return Kernel(render_macro(TEMPLATE, "fully_connected_hybrid", fc_hybrid_values(ctx)))
    if isinstance(ctx.params, FullyConnectedFloatParams):
        return Kernel(render_macro(TEMPLATE, "fully_connected_float", fc_float_values(ctx)))
    v = fc_quantized_values(ctx)
    return Kernel(render_macro(TEMPLATE, "fully_connected_quantized", v),
                  ("clamp", *(("byte_column",) if v["row_copy"] else ())))


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
    p: BatchMatMulFloatParams | BatchMatMulInt8Params | BatchMatMulInt16Params = ctx.params
    lhs, rhs, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    rows, cols = out.shape[-2], out.shape[-1]
    depth = lhs.shape[-2] if p.adj_x else lhs.shape[-1]
    batch = tuple(out.shape[:-2])
    padded = (1,) * (3 - len(batch)) + batch
    # lhs element (i, k) sits at i * lhs_i + k * lhs_k; rhs (k, j) at k * rhs_k + j * rhs_j.
    lhs_i, lhs_k = (1, rows) if p.adj_x else (depth, 1)
    rhs_k, rhs_j = (1, depth) if p.adj_y else (cols, 1)
    is_float = isinstance(p, BatchMatMulFloatParams)
    is_int16 = isinstance(p, BatchMatMulInt16Params)
    batches = [ConstantLoop(f"b{n}", size) for n, size in enumerate(padded)]
    i, j, k = ConstantLoop("i", rows), ConstantLoop("j", cols), ConstantLoop("k", depth)
    lhs_strides, rhs_strides = _batch_strides(lhs.shape, batch), _batch_strides(rhs.shape, batch)
    out_strides = [padded[1] * padded[2] * rows * cols, padded[2] * rows * cols, rows * cols]

    lhs_offset = rhs_offset = ""
    lhs_term, rhs_term = "lhs(i, k)", "rhs(k, j)"
    acc_type = "float"
    requantize = False
    if is_int16:
        acc_type, requantize = "int64_t", True
    elif not is_float:
        max_product = MAX_OFFSET_PRODUCT if p.requantize else MAX_RAW_PRODUCT["int8"]
        acc_type, requantize = _accumulator(depth, max_product), p.requantize
        lhs_offset, rhs_offset = plus(p.lhs_offset), plus(p.rhs_offset)
        lhs_term, rhs_term = _offset(p.lhs_offset, lhs_term), _offset(p.rhs_offset, rhs_term)

    # row form: acc[j] += lhs(i, k) * rhs row k, contiguous in j (vectorizes, also for float:
    # each acc[j] still sums its products in k order); else dot products in k.
    row_form = not p.adj_y and cols * ACCUMULATOR_BYTES[acc_type] <= MAX_ROW_ACCUMULATOR_BYTES

    def stored(acc: str) -> str:
        if is_float:
            return f"orow[{j.index}] = {acc};"
        if is_int16:
            scaled = f"({acc} * {p.multiplier} + ((int64_t)1 << {p.shift - 1})) >> {p.shift}"
            return (f"orow[{j.index}] = (int16_t)arenac_clamp((int32_t)(uint32_t)({scaled}), "
                    "-32768, 32767);")
        if requantize:
            # clamp(v + offset, lo, hi) == clamp(v, lo - offset, hi - offset) + offset, without
            # the int32 overflow the left side could hit.
            low, high = p.activation_min - p.output_offset, p.activation_max - p.output_offset
            return (f"orow[{j.index}] = ({out.ctype})(arenac_clamp(arenac_mbqm((int32_t){acc}, "
                    f"{p.output_multiplier}, {p.output_shift}), {low}, {high})"
                    f"{plus(p.output_offset)});")
        return f"orow[{j.index}] = ({out.ctype}){acc};"

    lhs_at = f"l[{c_sum([(i, lhs_i), (k, lhs_k)])}]"
    comment = (f"{ctx.op.opcode} '{out.name}': for each of {padded[0]}x{padded[1]}x{padded[2]} "
               f"batches, out(i, j) = sum over k of {lhs_term} * {rhs_term}"
               + (", requantized" if requantize else "") + "; written row by row"
               + (". int16: the sum in int64, requantized as TFLite's int64 "
                  "MultiplyByQuantizedMultiplier does, by a 16-bit multiplier and one rounding "
                  "right shift (half up), then truncated to int32" if is_int16 else ""))
    return {
        "fn": ctx.fn, "comment": c_comment(comment),
        "ctype": lhs.ctype, "rhs_type": rhs.ctype, "out_type": out.ctype, "acc_type": acc_type,
        "lhs": lhs.ptr, "rhs": rhs.ptr, "out": out.ptr, "cols": cols,
        "batches": batches, "row": i, "col": j, "depth": k,
        "broadcasts": any(b.written and 0 in (sl, sr)
                          for b, sl, sr in zip(batches, lhs_strides, rhs_strides, strict=True)),
        "l": c_offset("lhs", list(zip(batches, lhs_strides, strict=True))),
        "r": c_offset("rhs", list(zip(batches, rhs_strides, strict=True))),
        "o": c_offset("out", list(zip(batches, out_strides, strict=True))),
        "orow": c_offset("o", [(i, cols)]),
        "row_form": row_form,
        "lhs_value": f"({acc_type})({lhs_at}{lhs_offset})",
        "rrow": c_offset("r", [(k, rhs_k)]),
        "row_step": f"acc[{j.index}] += a * (rrow[{j.index}]{rhs_offset});",
        "row_store": stored(f"acc[{j.index}]"),
        "dot_step": f"acc += ({acc_type})({lhs_at}{lhs_offset}) * "
                    f"(r[{c_sum([(k, rhs_k), (j, rhs_j)])}]{rhs_offset});",
        "dot_store": stored("acc"),
        "counters": written_vars([*batches, i, j, k]),
        "helpers": ("clamp",) if is_int16 else ("mbqm", "clamp") if requantize else (),
    }


def _batch_matmul_quantize_rows(p: BatchMatMulHybridParams, k: ConstantLoop
                          ) -> tuple[list[ConstantLoop], list[str]]:
    """Stage 1: every lhs row quantized into the arena, as hybrid FULLY_CONNECTED does (with
    adj_x a row is a column of the stored matrix: it is gathered first); its loops and lines."""
    rows, depth = p.rows, p.depth
    if p.adj_x:
        lhs_batch, row = ConstantLoop("lb", p.lhs_rows // rows), ConstantLoop("i", rows)
        quantize_loops = [lhs_batch, row]
        row_terms = [(lhs_batch, rows), (row, 1)]
        gather = [f"for ({k.header}) column[{k.index}] = "
                  f"lhs[{c_sum([(lhs_batch, rows * depth), (k, rows), (row, 1)])}];"]
        source = ["const float *xr = column;"]
    else:
        row = ConstantLoop("row", p.lhs_rows)
        quantize_loops = [row]
        row_terms = [(row, 1)]
        gather = []
        source = [f"const float *xr = {c_offset('lhs', [(row, depth)])};"]
    r = c_sum(row_terms)
    q_at = c_offset("quantized", [(loop, n * depth) for loop, n in row_terms])
    quantize = [*gather, *source, f"int8_t *q = {q_at};",
                f"float scale;{' int32_t zp;' if p.asymmetric else ''}",
                *_quantize_row_lines(p, k, "xr")]
    if len(p.filter_scales) > 1:
        quantize.append(f"row_scale[{r}] = scale;")
    else:
        quantize.append(f"row_scale[{r}] = scale * {c_float(p.filter_scales[0])}; "
                        "/* times the filter's */")
    if p.asymmetric:
        quantize.append(f"row_zp[{r}] = zp;")
    return quantize_loops, quantize


def _batch_matmul_finish(p: BatchMatMulHybridParams, prefix: str, i: ConstantLoop, j: ConstantLoop,
                   acc: str) -> list[str]:
    """Output (i, j) from its int32 sum `acc`: TFLite's float zero point correction, truncated
    back to int32, and the rescale."""
    lines = []
    total = f"(float){acc}"
    if p.asymmetric:
        lines.append(f"const int32_t total = (int32_t)((float){acc} - (float)sums[{j.index}] "
                     f"* (float)z[{i.index}]);")
        total = "(float)total"
    scale = f"s[{i.index}]"
    if len(p.filter_scales) > 1:
        lines.append(f"const float scale = s[{i.index}] * {prefix}_filter_scale[{j.index}];")
        scale = "scale"
    lines.append(f"orow[{j.index}] = 0.0f + {scale} * {total};")
    return lines


def _batch_matmul_tables(p: BatchMatMulHybridParams, prefix: str, name: str) -> list[dict]:
    """The rhs scale per column (per-channel), and the column sums (asymmetric rows)."""
    tables = []
    if len(p.filter_scales) > 1:
        tables.append({"comment": c_comment(f"BATCH_MATMUL '{name}': the rhs scale per column"),
                       "ctype": "float", "name": f"{prefix}_filter_scale",
                       "length": c_length(p.cols),
                       "data": c_array(np.asarray(p.filter_scales, np.float32))})
    if p.asymmetric:
        tables.append({"comment": c_comment(f"BATCH_MATMUL '{name}': the sum of each rhs column "
                                            "per rhs matrix, times a row's zero point"),
                       "ctype": "int32_t", "name": f"{prefix}_column_sum",
                       "length": c_length(len(p.row_sums)), "data": c_array(p.row_sums)})
    return tables


def _batch_matmul_scratch(ctx: OpContext) -> list[dict]:
    """The arena's quantized rows, their scales (and zero points), and the gathered column."""
    p: BatchMatMulHybridParams = ctx.params
    scratch = dict(zip(["quantized", "row_scale", *(["row_zp"] if p.asymmetric else [])],
                       ctx.scratch, strict=False))  # and the column last, with adj_x
    if p.adj_x:
        scratch["column"] = ctx.scratch[-1]
    ctypes = {"quantized": "int8_t", "row_scale": "float", "row_zp": "int32_t",
              "column": "float"}
    return [{"ctype": ctypes[key], "name": key, "at": at} for key, at in scratch.items()]


def batch_matmul_hybrid_values(ctx: OpContext) -> dict:
    p: BatchMatMulHybridParams = ctx.params
    lhs, rhs, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    prefix, name = ctx.prefix, out.name
    rows, depth, cols = p.rows, p.depth, p.cols
    batch = tuple(out.shape[:-2])
    padded = (1,) * (3 - len(batch)) + batch
    per_channel = len(p.filter_scales) > 1
    k = ConstantLoop("k", depth)
    quantize_loops, quantize = _batch_matmul_quantize_rows(p, k)

    # Stage 2: int32 sums of each quantized row with the rhs columns, then TFLite's float
    # correction and rescale.
    batches = [ConstantLoop(f"b{n}", size) for n, size in enumerate(padded)]
    i, j = ConstantLoop("i", rows), ConstantLoop("j", cols)
    lhs_strides = _batch_strides(lhs.shape, batch)  # quantized rows: the lhs's layout
    rhs_strides = _batch_strides(rhs.shape, batch)
    out_strides = [padded[1] * padded[2] * rows * cols, padded[2] * rows * cols, rows * cols]
    rhs_k, rhs_j = (1, depth) if p.adj_y else (cols, 1)
    row_form = not p.adj_y and cols * 4 <= MAX_ROW_ACCUMULATOR_BYTES
    # per-row (and per-column) tables advance by one entry where the matrices advance by depth
    # the strides run on past the batch dimensions: only those are looped over
    lhs_terms = list(zip(batches, lhs_strides, strict=False))
    rhs_terms = list(zip(batches, rhs_strides, strict=False))
    row_table = [(b, stride // depth) for b, stride in lhs_terms]
    pointers = [f"const int8_t *l = {c_offset('quantized', lhs_terms)};",
                f"const float *s = {c_offset('row_scale', row_table)};"]
    if p.asymmetric:
        sums = c_offset(f"{prefix}_column_sum", [(b, stride // depth) for b, stride in rhs_terms])
        pointers += [f"const int32_t *z = {c_offset('row_zp', row_table)};",
                     f"const int32_t *sums = {sums};"]
    pointers += [f"const int8_t *w = {c_offset('rhs', rhs_terms)};",
                 f"float *o = {c_offset('out', list(zip(batches, out_strides, strict=True)))};"]
    comment = (f"BATCH_MATMUL '{name}' (hybrid: float32 lhs, int8 rhs): every lhs row quantized "
               "to int8 in the arena as TFLite's x86 reference build does, int32 sums with the "
               "rhs columns, then as TFLite's reference kernel: "
               + ("the zero point correction in float, truncated back to int32, "
                  if p.asymmetric else "")
               + "the sum in float (which rounds beyond 2^24), times the row's scale"
               + (" times the column's" if per_channel else "")
               + ", added to 0.0f (so -0.0f becomes 0.0f)")
    return {
        "fn": ctx.fn, "comment": c_comment(comment),
        "tables": _batch_matmul_tables(p, prefix, name),
        "lhs": lhs.ptr, "rhs": rhs.ptr, "out": out.ptr, "scratch": _batch_matmul_scratch(ctx),
        "quantize_loops": quantize_loops, "quantize": quantize,
        "batches": batches, "pointers": pointers, "broadcasts": any(
            b.written and 0 in (sl, sr) for b, sl, sr in zip(batches, lhs_strides, rhs_strides,
                                                             strict=False)),
        "row": i, "col": j, "depth": k, "cols": cols,
        "qrow": c_offset("l", [(i, depth)]), "orow": c_offset("o", [(i, cols)]),
        "row_form": row_form,
        "wrow": c_offset("w", [(k, rhs_k)]),
        "row_step": f"acc[{j.index}] += a * wrow[{j.index}];",
        "row_finish": _batch_matmul_finish(p, prefix, i, j, f"acc[{j.index}]"),
        "dot_step": f"acc += qi[{k.index}] * w[{c_sum([(k, rhs_k), (j, rhs_j)])}];",
        "dot_finish": _batch_matmul_finish(p, prefix, i, j, "acc"),
        "counters": ", ".join(dict.fromkeys(
            [loop.var for loop in [*quantize_loops, *batches, i, j] if loop.written] + ["k"])),
    }


def emit_batch_matmul(ctx: OpContext) -> Kernel:
    if isinstance(ctx.params, BatchMatMulHybridParams):
        return Kernel(render_macro(TEMPLATE, "batch_matmul_hybrid",
                                   batch_matmul_hybrid_values(ctx)))
    values = batch_matmul_values(ctx)
    return Kernel(render_macro(TEMPLATE, "batch_matmul", values), values["helpers"])
