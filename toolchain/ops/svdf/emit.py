"""C emitter for SVDF, from the same params as runtime_py (prepare.py, whose docstring states
the arithmetic); templates/c/svdf.c.j2 lays it out.

The integer kernel folds the zero points into per-filter and per-unit constants: the input's
into the feature sums (zero point * the filter row's sum), the state's into the unit sums
(with the bias). The time sums of a unit's `rank` filters are one dot product, since the
filters are consecutive rows of weights_time and of the state and integer sums may be taken in
any order (they wrap modulo 2^32, as TFLite's int32 sums do). The float kernel keeps TFLite's
order of additions, so a unit of rank > 1 sums its filters' results from the arena.
"""

from __future__ import annotations

import numpy as np

from toolchain.ir import INT32_MAX
from toolchain.numerics.quant import INT_RANGES
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_length,
    c_pointer,
    c_sum,
    plus,
    render_macro,
    written_vars,
)
from toolchain.ops.hybrid import quantize_lines
from toolchain.ops.svdf.prepare import (
    LANES,
    SvdfFloatParams,
    SvdfHybridParams,
    SvdfIntegerParams,
    SvdfShape,
)

TEMPLATE = "c/svdf.c.j2"


def _wrap_int32(values: np.ndarray) -> np.ndarray:
    return ((values.astype(np.int64) + 2**31) & 0xFFFFFFFF) - 2**31


def _accumulator(bound: int) -> str:
    """int32_t for sums that cannot leave it, else uint32_t, which wraps as TFLite's do."""
    return "int32_t" if bound <= INT32_MAX else "uint32_t"


def _mbqm_bound(multiplier: int, shift: int) -> int:
    """The largest |MultiplyByQuantizedMultiplier(x, multiplier, shift)| over int32 x."""
    if shift > 0:
        return 2**31  # the left shift wraps: anything
    return -(-multiplier // 2**-shift) + 1  # |SRDHM| <= multiplier, then a rounding shift


def _common(ctx: OpContext) -> dict:
    """The pointers every kernel reads (the integer one folds the bias into a table)."""
    x, weights_feature, weights_time, _, state = ctx.inputs
    # a hybrid kernel reads weights_time dequantized, from its own table
    hybrid = isinstance(ctx.params, SvdfHybridParams)
    return {"fn": ctx.fn, "prefix": ctx.prefix, "x": x.ptr, "wf": weights_feature.ptr,
            "wf_ctype": weights_feature.ctype,
            "wt": f"{ctx.prefix}_weights_time" if hybrid else weights_time.ptr,
            "state": state.ptr, "out": ctx.outputs[0].ptr, "hybrid": False, "tables": []}


def _shift(p: SvdfShape) -> str | None:
    """The state's slide: every element moves one place toward the start (a row's first value
    falls onto the previous row's newest slot, which the feature step then writes)."""
    moved = p.state_size - 1
    if not moved:
        return None
    return (f"memmove(state, state + 1, {moved} * sizeof *state); /* each row of {p.memory} drops "
            "its oldest */")


def _integer_output_store(p: SvdfIntegerParams, ob: str, unit: ConstantLoop,
                          unit_acc: str) -> str:
    """A unit's output from its sum: requantized, the zero point added (in uint32_t where the
    sum could pass INT32_MAX), clamped to int8."""
    acc = "acc" if unit_acc == "int32_t" else "(int32_t)acc"
    scaled = f"arenac_mbqm({acc}, {p.output_multiplier}, {p.output_shift})"
    zero_point = p.output_zero_point
    if zero_point and _mbqm_bound(p.output_multiplier, p.output_shift) + abs(zero_point) \
            > INT32_MAX:
        wrap = f" + {zero_point}u" if zero_point > 0 else f" - {-zero_point}u"
        scaled = f"(int32_t)((uint32_t){scaled}{wrap})"
    else:
        scaled += plus(zero_point)
    return f"{ob}[{unit.index}] = (int8_t)arenac_clamp({scaled}, -128, 127);"


def _integer_comment(p: SvdfIntegerParams, name: str) -> str:
    """What the integer kernel computes, and whose arithmetic it follows."""
    who = ("TFLite Micro computes it (LiteRT reads an int8 state as int16)"
           if p.state_dtype == "int8" else "LiteRT computes it")
    return (f"SVDF '{name}' (int8, an {p.state_dtype} state), as {who}: the state "
            "slides one step, each filter's feature sum is requantized into its newest slot"
            + (" plus the state's zero point (the sum wraps in int8)"
               if p.state_zero_point else "")
            + ", then each unit adds "
            + ("its filter's" if p.shape.rank == 1 else f"its {p.shape.rank} filters'")
            + " time products (weights_time times the state"
            + (" less its zero point" if p.state_zero_point else "")
            + ") to its bias and is requantized; the fused activation is never applied")


def svdf_integer_values(ctx: OpContext) -> dict:
    p: SvdfIntegerParams = ctx.params
    s = p.shape
    x, weights_feature, weights_time, bias, state = ctx.inputs
    out = ctx.outputs[0]
    wf = np.asarray(weights_feature.data, np.int64).reshape(s.filters, s.input_size)
    wt = np.asarray(weights_time.data, np.int64).reshape(s.filters, s.memory)
    low, high = INT_RANGES[p.state_dtype]
    batch, unit = ConstantLoop("b", s.batches), ConstantLoop("u", s.units)
    filt, c = ConstantLoop("f", s.filters), ConstantLoop("c", s.input_size)
    k = ConstantLoop("k", s.rank * s.memory)
    xb, x_decl = c_pointer("xb", "const int8_t", "x", [(batch, s.input_size)])
    sb, s_decl = c_pointer("sb", state.ctype, "state", [(batch, s.filters * s.memory)])
    ob, o_decl = c_pointer("ob", "int8_t", "out", [(batch, s.units)])
    wr, wr_decl = c_pointer("wr", "const int8_t", "wf", [(filt, s.input_size)])
    tr, tr_decl = c_pointer("tr", f"const {weights_time.ctype}", "wt",
                            [(unit, s.rank * s.memory)])
    sr, sr_decl = c_pointer("sr", f"const {state.ctype}", sb, [(unit, s.rank * s.memory)])
    tables = []

    # feature: sum(w * (x - zp)) = sum(w * x) - zp * sum(w), the second term per filter
    feature_terms = _wrap_int32(-p.input_zero_point * wf.sum(axis=1))
    if feature_terms.any():
        tables.append({"comment": c_comment(f"SVDF '{out.name}': minus the input's zero point "
                                            "times each feature row's sum"),
                       "name": f"{ctx.prefix}_feature_term", "length": c_length(s.filters),
                       "data": c_array(feature_terms)})
        feature_start = f"{ctx.prefix}_feature_term[{filt.index}]"
    else:
        feature_start = "0"
    feature_bound = int((np.abs(wf).sum(axis=1) * 128 + np.abs(feature_terms)).max())
    feature_acc = _accumulator(feature_bound)
    dot = "dot" if feature_acc == "int32_t" else "(int32_t)dot"
    product = f"{wr}[{c.index}] * {xb}[{c.index}]"
    feature_step = (f"dot += {product};" if feature_acc == "int32_t"
                    else f"dot += (uint32_t)({product});")
    new = f"arenac_clamp(arenac_mbqm({dot}, {p.feature_multiplier}, {p.feature_shift}), " \
          f"{low}, {high})"
    newest = c_sum([(filt, s.memory)], s.memory - 1)
    feature_store = f"{sb}[{newest}] = ({state.ctype})" + (
        f"({new}{plus(p.state_zero_point)});" if p.state_zero_point else f"{new};")

    # time: per unit, bias - state zp * sum of its weights_time rows, + sum(wt * state)
    unit_wt = wt.reshape(s.units, s.rank * s.memory)
    bias_values = (np.zeros(s.units, np.int64) if bias is None
                   else np.asarray(bias.data, np.int64))
    unit_terms = _wrap_int32(bias_values - p.state_zero_point * unit_wt.sum(axis=1))
    if unit_terms.any():
        what = "its bias" if bias is not None and bias_values.any() else ""
        if p.state_zero_point:
            what += " minus the state's zero point times the sum of its weights_time rows"
        tables.append({"comment": c_comment(f"SVDF '{out.name}': per unit, {what.strip()}"),
                       "name": f"{ctx.prefix}_unit_term", "length": c_length(s.units),
                       "data": c_array(unit_terms)})
        unit_start = f"{ctx.prefix}_unit_term[{unit.index}]"
    else:
        unit_start = "0"
    state_max = 2 ** (INT_RANGES[p.state_dtype][1].bit_length())
    unit_bound = int((np.abs(unit_wt).sum(axis=1) * state_max + np.abs(unit_terms)).max())
    unit_acc = _accumulator(unit_bound)
    product = f"{tr}[{k.index}] * {sr}[{k.index}]"
    time_step = (f"acc += {product};" if unit_acc == "int32_t"
                 else f"acc += (uint32_t)({product});")
    start = unit_start if unit_acc == "int32_t" or unit_start == "0" else f"(uint32_t){unit_start}"
    output_store = _integer_output_store(p, ob, unit, unit_acc)
    return {
        **_common(ctx), "comment": c_comment(_integer_comment(p, out.name)), "tables": tables,
        "wt_type": weights_time.ctype, "state_type": state.ctype,
        "shift": _shift(s),
        "batch": batch, "batch_pointers": x_decl + s_decl + o_decl,
        "filter": filt, "filter_pointers": wr_decl, "depth": c,
        "feature_start": f"{feature_acc} dot = {feature_start};", "feature_step": feature_step,
        "feature_store": feature_store,
        "unit": unit, "unit_pointers": tr_decl + sr_decl, "memory": k,
        "unit_start": f"{unit_acc} acc = {start};", "time_step": time_step,
        "output_store": output_store,
        "counters": written_vars([batch, filt, c, unit, k]),
    }


def _lanes(term, var: str, n: int) -> dict:
    """A float sum of n terms into `sum`, in TFLite's x86 lane order: `term(terms, constant)`
    is the C text of the term at index c_sum(terms, constant). The lanes start at +0.0f and
    can never hold -0.0f, so neither can the sum: adding it to TFLite's zeroed accumulator
    changes nothing, and is not written."""
    head = n - n % LANES
    main, tail = ConstantLoop(var, head, 0, LANES), ConstantLoop(var, n, head)
    return {"main": main, "tail": tail,
            "steps": [f"lane{j} += {term([(main, 1)], j)};" for j in range(LANES)],
            "first": "((lane0 + lane1) + lane2) + lane3" if main.runs else "0.0f",
            "tail_step": f"sum += {term([(tail, 1)], 0)};"}


def _activation_lines(activation: str) -> list[str]:
    """`activation` on `sum` as TFLite's std::max(low, std::min(sum, high)) evaluates it (a NaN
    becomes the low bound)."""
    low, high = {"RELU": ("0.0f", None), "RELU6": ("0.0f", "6.0f"),
                 "RELU_N1_TO_1": ("-1.0f", "1.0f")}.get(activation, (None, None))
    lines = [f"sum = {high} < sum ? {high} : sum;"] if high else []
    return lines + ([f"sum = {low} < sum ? sum : {low};"] if low else [])


def svdf_float_values(ctx: OpContext) -> dict:
    p: SvdfFloatParams = ctx.params
    s = p.shape
    out, bias = ctx.outputs[0], ctx.inputs[3]
    v = {**_common(ctx), "bias": bias.ptr if bias is not None else None}
    batch, filt = ConstantLoop("b", s.batches), ConstantLoop("f", s.filters)
    unit = ConstantLoop("u", s.units)
    xb, x_decl = c_pointer("xb", "const float", "x", [(batch, s.input_size)])
    sb, s_decl = c_pointer("sb", "float", "state", [(batch, s.filters * s.memory)])
    ob, o_decl = c_pointer("ob", "float", "out", [(batch, s.units)])
    wr, wr_decl = c_pointer("wr", "const float", "wf", [(filt, s.input_size)])
    feature = _lanes(lambda terms, j: f"{wr}[{c_sum(terms, j)}] * {xb}[{c_sum(terms, j)}]",
                     "c", s.input_size)
    # the time sums run over filters, or directly over units when each unit is one filter
    time_loop = unit if s.rank == 1 else filt
    tr, tr_decl = c_pointer("tr", "const float", "wt", [(time_loop, s.memory)])
    sr, sr_decl = c_pointer("sr", "const float", sb, [(time_loop, s.memory)])
    time = _lanes(lambda terms, j: f"{tr}[{c_sum(terms, j)}] * {sr}[{c_sum(terms, j)}]",
                  "m", s.memory)
    finish = [*([f"sum += bias[{unit.index}];"] if v["bias"] else []),
              *_activation_lines(p.activation), f"{ob}[{unit.index}] = sum;"]
    reduce = None
    if s.rank > 1:
        reduce = _lanes(lambda terms, j: f"partial[{c_sum([(unit, s.rank), *terms], j)}]",
                        "r", s.rank)
    comment = (f"SVDF '{out.name}' (float32, as LiteRT's reference kernel computes it on x86): "
               "the state slides one step, each filter's feature sum goes into its newest slot, "
               "and each unit's output is "
               + ("its filter's time sum" if s.rank == 1 else
                  f"the sum of its {s.rank} filters' time sums")
               + (" plus its bias" if v["bias"] else "")
               + (f", through {p.activation}" if p.activation != "NONE" else "")
               + ". Every sum runs four lanes (term i into lane i mod 4) up to the last multiple "
               "of four terms, adds the lanes in order, then the other terms one at a time, as "
               "TFLite's NEON code compiled for SSE does")
    loops = [batch, filt, unit, feature["main"], feature["tail"], time["main"], time["tail"]]
    return {
        **v, "comment": c_comment(comment), "shift": _shift(s),
        "scratch": ctx.scratch[0] if reduce is not None else None,
        "batch": batch, "batch_pointers": x_decl + s_decl + o_decl,
        "filter": filt, "filter_pointers": wr_decl, "feature": feature,
        "feature_store": f"{sb}[{c_sum([(filt, s.memory)], s.memory - 1)}] = sum;",
        "time_loop": time_loop, "time_pointers": tr_decl + sr_decl, "time": time,
        "time_store": finish if reduce is None else [f"partial[{filt.index}] = sum;"],
        "unit": unit, "reduce": reduce, "finish": finish,
        "counters": written_vars(loops + ([reduce["main"], reduce["tail"]] if reduce else [])),
    }


def svdf_hybrid_values(ctx: OpContext) -> dict:
    """The float kernel's values with the hybrid feature sums and the dequantized time weights
    as a table."""
    p: SvdfHybridParams = ctx.params
    s = p.shape
    v = svdf_float_values(ctx)
    out = ctx.outputs[0]
    filt, c = v["filter"], ConstantLoop("c", s.input_size)
    xb = "xb" if any(line.startswith("const float *xb") for line in v["batch_pointers"]) else "x"
    sb = "sb" if any(line.startswith("float *sb") for line in v["batch_pointers"]) else "state"
    wr, wr_decl = c_pointer("wr", "const int8_t", "wf", [(filt, s.input_size)])
    tables = [{"comment": c_comment(f"SVDF '{out.name}': weights_time as float32(w) * scale, "
                                    "as LiteRT dequantizes them"),
               "ctype": "float", "name": f"{ctx.prefix}_weights_time",
               "length": len(p.time_weights), "data": c_array(np.float32(p.time_weights))}]
    zero_point = ""
    if p.asymmetric:
        tables.append({"comment": c_comment(f"SVDF '{out.name}': the row sums of "
                                            "weights_feature, for the input zero point"),
                       "ctype": "int32_t", "name": f"{ctx.prefix}_row_sums",
                       "length": len(p.row_sums), "data": c_array(p.row_sums)})
        zero_point = f"acc -= {ctx.prefix}_row_sums[{filt.index}] * zp;"
    comment = (f"SVDF '{out.name}' (hybrid: float32, int8 weights, as LiteRT's reference kernel "
               "computes it on x86): the state slides one step; the input row is quantized to "
               f"int8 ({'asymmetric' if p.asymmetric else 'symmetric'}) and each filter's int32 "
               "feature sum, rescaled, goes into its newest slot; the time sums and the rest "
               "are the float kernel's, four lanes at a time")
    return {
        **v, "hybrid": True, "asymmetric": p.asymmetric, "tables": tables,
        "comment": c_comment(comment),
        "quantized": ctx.scratch[-1],
        "quantize": quantize_lines(s.input_size, p.asymmetric, c, xb, "q"),
        "row_scale": f"const float row_scale = scale * {c_float(p.feature_scale)};",
        "filter_pointers": wr_decl,
        "feature_sum": f"for ({c.header}) acc += {wr}[{c.index}] * q[{c.index}];",
        "zero_point": zero_point,
        "feature_store": f"{sb}[{c_sum([(filt, s.memory)], s.memory - 1)}] = (float)acc * "
                         "row_scale;",
        "counters": ", ".join(filter(None, [v["counters"], "c" if "c" not in
                                            v["counters"].split(", ") else ""])),
    }


def emit_svdf(ctx: OpContext) -> Kernel:
    if isinstance(ctx.params, SvdfHybridParams):
        return Kernel(render_macro(TEMPLATE, "svdf_float", svdf_hybrid_values(ctx)))
    if isinstance(ctx.params, SvdfFloatParams):
        return Kernel(render_macro(TEMPLATE, "svdf_float", svdf_float_values(ctx)))
    return Kernel(render_macro(TEMPLATE, "svdf_integer", svdf_integer_values(ctx)),
                  ("mbqm", "clamp"))
