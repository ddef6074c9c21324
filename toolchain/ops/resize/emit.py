"""C emitters for RESIZE_NEAREST_NEIGHBOR and RESIZE_BILINEAR (NHWC), from the same params as
runtime_py.

prepare's row and column tables become static const arrays of element offsets (an input row's
offset within its image, a column's within its row), so the C only gathers and blends; the
fixed-point weights and float32 weights are prepare's own values.
"""

from __future__ import annotations

from toolchain.errors import UnsupportedOpError
from toolchain.ops.emit import (
    ConstantLoop,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_length,
    c_pointer,
    render_macro,
    written_vars,
)
from toolchain.ops.resize.prepare import FIXED_SHIFT, BilinearParams, NearestParams, blend_reach

TEMPLATE = "c/resize.c.j2"
# The C types of the bilinear weights' tables, per method.
WEIGHT_TYPES = {"float32": "float", "float32_rounded": "float", "fixed10": "int16_t"}
BILINEAR_MACROS = {"float32": "bilinear_float", "float32_rounded": "bilinear_float",
                   "fixed10": "bilinear_fixed"}
FLOAT_SUM = "v_tl + v_bl + v_tr + v_br"


def _index_type(values: list[int]) -> str:
    """The smallest unsigned type holding every offset: tables stay small in flash."""
    top = max(values, default=0)
    return "uint8_t" if top < 2**8 else "uint16_t" if top < 2**16 else "uint32_t"


def _table(prefix: str, name: str, ctype: str, values: list) -> dict:
    return {"name": f"{prefix}_{name}", "ctype": ctype, "length": c_length(len(values)),
            "data": c_array(values)}


def _offsets(prefix: str, name: str, values: list[int]) -> dict:
    return _table(prefix, name, _index_type(values), values)


def _common(ctx: OpContext) -> dict:
    x, out = ctx.inputs[0], ctx.outputs[0]
    batch_size, height, width, channels = x.shape
    _, out_h, out_w, _ = out.shape
    batch, out_y = ConstantLoop("b", batch_size), ConstantLoop("oy", out_h)
    out_x, channel = ConstantLoop("ox", out_w), ConstantLoop("c", channels)
    image, image_lines = c_pointer("image", f"const {x.ctype}", "x",
                                   [(batch, height * width * channels)])
    return {
        "fn": ctx.fn,
        "ctype": x.ctype,
        "x": x.ptr,
        "out": out.ptr,
        "channels": channels,
        "batch": batch, "out_y": out_y, "out_x": out_x, "channel": channel, "c": channel.index,
        "image": image, "image_lines": image_lines,
        "empty": out.size == 0,
        "comment": c_comment(f"{ctx.op.opcode} {x.dtype}{list(x.shape)} -> {list(out.shape)} "
                             f"'{out.name}'"),
    }


def _look_up(table: dict, loop: ConstantLoop) -> str:
    return f"{table['name']}[{loop.index}]"


def emit_nearest(ctx: OpContext) -> Kernel:
    p: NearestParams = ctx.params
    v = _common(ctx)
    row, channels = ctx.inputs[0].shape[2] * v["channels"], v["channels"]
    rows = _offsets(ctx.prefix, "rows", [r * row for r in p.rows])
    cols = _offsets(ctx.prefix, "cols", [c * channels for c in p.cols])
    v.update(tables=[] if v["empty"] else [rows, cols], rows=_look_up(rows, v["out_y"]),
             cols=_look_up(cols, v["out_x"]),
             counters=written_vars([v["batch"], v["out_y"], v["out_x"]]))
    return Kernel(render_macro(TEMPLATE, "nearest", v))


def _weights(prefix: str, name: str, weights: tuple, method: str) -> dict:
    convert = int if method == "fixed10" else float
    return _table(prefix, name, WEIGHT_TYPES[method], [convert(w) for w in weights])


def _fixed_blend(c: str, wide: bool) -> list[str]:
    """The four-corner sum of the fixed-point blend as lines of C, each product widened to
    int64 first when the sum needs it."""
    widen = "(int64_t)" if wide else ""
    terms = [f"{widen}{corner}[{c}] * w_{corner}" for corner in ("tl", "bl", "tr", "br")]
    if not wide:
        return [" + ".join(terms) + ";"]
    return [" + ".join(terms[:2]) + " +", " + ".join(terms[2:]) + ";"]


def emit_bilinear(ctx: OpContext) -> Kernel:
    p: BilinearParams = ctx.params
    v = _common(ctx)
    row, channels = ctx.inputs[0].shape[2] * v["channels"], v["channels"]
    if p.method not in BILINEAR_MACROS:
        raise UnsupportedOpError(f"no C for bilinear method {p.method!r}")
    by_row = {
        "top": _offsets(ctx.prefix, "top", [r * row for r in p.rows.low]),
        "bottom": _offsets(ctx.prefix, "bottom", [r * row for r in p.rows.high]),
        "wtop": _weights(ctx.prefix, "wtop", p.rows.low_weight, p.method),
        "wbottom": _weights(ctx.prefix, "wbottom", p.rows.high_weight, p.method),
    }
    by_column = {
        "left": _offsets(ctx.prefix, "left", [c * channels for c in p.cols.low]),
        "right": _offsets(ctx.prefix, "right", [c * channels for c in p.cols.high]),
        "wleft": _weights(ctx.prefix, "wleft", p.cols.low_weight, p.method),
        "wright": _weights(ctx.prefix, "wright", p.cols.high_weight, p.method),
    }
    v.update({name: _look_up(t, v["out_y"]) for name, t in by_row.items()})
    v.update({name: _look_up(t, v["out_x"]) for name, t in by_column.items()})
    # int8's blend fits int32 (|q| <= 2^7 and the weights' reach is at most 2^11 per axis);
    # int16's needs int64, as TFLite's own sum.
    wide = p.method == "fixed10" and blend_reach(p, ctx.inputs[0].dtype) >= 2**31
    v.update(tables=[] if v["empty"] else [*by_row.values(), *by_column.values()],
             weight_type=WEIGHT_TYPES[p.method], shift=FIXED_SHIFT,
             sum_type="int64_t" if wide else "int32_t", blend=_fixed_blend(v["c"], wide),
             store=(f"({v['ctype']})({FLOAT_SUM} + 0.5f)" if p.method == "float32_rounded"
                    else FLOAT_SUM),
             half=1 << (FIXED_SHIFT - 1), one=1 << FIXED_SHIFT,
             counters=written_vars([v["batch"], v["out_y"], v["out_x"], v["channel"]]))
    return Kernel(render_macro(TEMPLATE, BILINEAR_MACROS[p.method], v))
