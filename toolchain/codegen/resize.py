"""C emitters for RESIZE_NEAREST_NEIGHBOR and RESIZE_BILINEAR (NHWC), from the same params as
runtime_py.

prepare's row and column tables become static const arrays of element offsets (an input row's
offset within its image, a column's within its row), so the C only gathers and blends; the
fixed-point weights and float32 weights are prepare's own values.
"""

from __future__ import annotations

from toolchain.codegen.context import OpContext, c_array, c_length, family_macro
from toolchain.errors import UnsupportedOpError
from toolchain.ops.resize import BilinearParams, NearestParams

TEMPLATE = "c/resize.c.j2"
FIXED_SHIFT = 20  # the int8 blend carries two 10-bit weights (runtime_py.kernels.resize)


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
    batch, height, width, channels = x.shape
    _, out_h, out_w, _ = out.shape
    return {
        "fn": ctx.fn,
        "ctype": x.ctype,
        "x": x.ptr,
        "out": out.ptr,
        "batch": batch,
        "image": height * width * channels,
        "channels": channels,
        "out_h": out_h,
        "out_w": out_w,
        "empty": out.size == 0,
        "comment": f"{ctx.op.opcode} {x.dtype}{list(x.shape)} -> {list(out.shape)} '{out.name}'",
    }


def nearest_values(ctx: OpContext) -> dict:
    p: NearestParams = ctx.params
    values = _common(ctx)
    row, channels = ctx.inputs[0].shape[2] * values["channels"], values["channels"]
    values["tables"] = [
        _offsets(ctx.prefix, "rows", [r * row for r in p.rows]),
        _offsets(ctx.prefix, "cols", [c * channels for c in p.cols]),
    ]
    values["rows"], values["cols"] = (t["name"] for t in values["tables"])
    return values


def emit_nearest(ctx: OpContext) -> str:
    return family_macro(TEMPLATE, "nearest")(nearest_values(ctx))


def _weights(prefix: str, name: str, weights: tuple, is_float: bool) -> dict:
    if is_float:
        return _table(prefix, name, "float", [float(w) for w in weights])
    return _table(prefix, name, "int16_t", [int(w) for w in weights])


def bilinear_values(ctx: OpContext) -> dict:
    p: BilinearParams = ctx.params
    values = _common(ctx)
    row, channels = ctx.inputs[0].shape[2] * values["channels"], values["channels"]
    is_float = p.method == "float32"
    if p.method not in ("float32", "fixed10"):
        raise UnsupportedOpError(f"no C for bilinear method {p.method!r}")
    if not is_float:
        # Each product |q| * |wy| * |wx| and their sum must fit int32, as in int64 (runtime_py).
        # Weights lie in [-512, 1536] and |wy_lo| + |wy_hi| <= 2048, so the sum stays below 2^29.
        reach = [max((abs(lo) + abs(hi) for lo, hi in zip(t.low_weight, t.high_weight)),
                     default=0) for t in (p.rows, p.cols)]
        if 128 * reach[0] * reach[1] + (1 << (FIXED_SHIFT - 1)) >= 2**31:
            raise UnsupportedOpError("bilinear weights too large for the int32 blend")
    tables = [
        _offsets(ctx.prefix, "top", [r * row for r in p.rows.low]),
        _offsets(ctx.prefix, "bottom", [r * row for r in p.rows.high]),
        _weights(ctx.prefix, "wtop", p.rows.low_weight, is_float),
        _weights(ctx.prefix, "wbottom", p.rows.high_weight, is_float),
        _offsets(ctx.prefix, "left", [c * channels for c in p.cols.low]),
        _offsets(ctx.prefix, "right", [c * channels for c in p.cols.high]),
        _weights(ctx.prefix, "wleft", p.cols.low_weight, is_float),
        _weights(ctx.prefix, "wright", p.cols.high_weight, is_float),
    ]
    values.update({
        "is_float": is_float,
        "tables": tables,
        "t": {t["name"][len(ctx.prefix) + 1:]: t["name"] for t in tables},
        "half": 1 << (FIXED_SHIFT - 1),
        "one": 1 << FIXED_SHIFT,
    })
    return values


def emit_bilinear(ctx: OpContext) -> str:
    return family_macro(TEMPLATE, "bilinear")(bilinear_values(ctx))


EMITTERS = {"RESIZE_NEAREST_NEIGHBOR": emit_nearest, "RESIZE_BILINEAR": emit_bilinear}
