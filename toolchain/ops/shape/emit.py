"""C emitters for the shape family (RESHAPE, SQUEEZE, EXPAND_DIMS, PAD, PADV2, CONCATENATION,
PACK, UNPACK, SPLIT, SPLIT_V, TRANSPOSE, SLICE, STRIDED_SLICE, GATHER), from the same params as
runtime_py.

These ops move stored values, so Python reduces each one to a few loops with constant counts
and strides around block copies: a memcpy of a contiguous run, or one element (a uint8
CONCATENATION rescales its unlike-quantized inputs element by element through a helper). Size-1
dimensions vanish, adjacent dimensions that every copy walks alike merge, and the innermost
contiguous stretch becomes the memcpy length, so e.g. a slice that keeps whole rows is one
loop of memcpys. Every kernel writes its output(s) in order (a large TRANSPOSE tile by tile);
PAD, SPLIT, SPLIT_V and UNPACK also read their input in order.

RESHAPE, SQUEEZE and EXPAND_DIMS keep the bytes: one memmove, skipped when the output lies over
the input. The other ops copy with memcpy, so their outputs must not overlap their inputs.
Constant operands prepare already resolved (shapes, paddings, perms, slice bounds, axes,
indices) are not read at run time, so the generator does not emit them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from toolchain.ops.emit import (
    ConstantLoop,
    CTensor,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_int32,
    c_length,
    c_sum,
    render_macro,
)
from toolchain.ops.shape.prepare import (
    AxisParams,
    BlockParams,
    ConcatenationParams,
    GatherParams,
    MirrorPadParams,
    PadParams,
    SliceParams,
    SplitParams,
    TransposeParams,
)

TEMPLATE = "c/shape.c.j2"
OFFSET_TYPE = "int32_t"  # GATHER's table of input offsets (the reader bounds tensors below 2^31)


def _at(pointer: str, index: str) -> str:
    """Address of element `index` of `pointer`."""
    return pointer if index == "0" else f"&{pointer}[{index}]"


def _row_major(shape: Sequence[int]) -> list[int]:
    """Element strides of a contiguous tensor of `shape`."""
    return [math.prod(shape[i + 1:]) for i in range(len(shape))]


def _element_bytes(t: CTensor) -> int:
    return np.dtype(t.dtype).itemsize


def _literal(value: int | float, dtype: str) -> str:
    """A C constant of `dtype` holding `value`."""
    if dtype == "float32":
        if math.isnan(value):
            return "-NAN" if math.copysign(1.0, value) < 0 else "NAN"
        return c_float(value)
    if dtype == "int64" and int(value) == -(2**63):
        return "INT64_MIN"
    return c_int32(value) if dtype == "int32" else str(int(value))


# --- operands -----------------------------------------------------------------------------


def _data_positions(ctx: OpContext) -> list[int]:
    """Positions of the inputs whose values the op moves; the others are resolved constants."""
    if ctx.op.opcode in ("CONCATENATION", "PACK"):
        return list(range(len(ctx.inputs)))
    return [1] if ctx.op.opcode == "SPLIT" else [0]


def _in_name(ctx: OpContext, k: int) -> str:
    """C name of the k-th data input: x, or x0, x1, ... when there are several."""
    return "x" if len(_data_positions(ctx)) == 1 else f"x{k}"


def _out_name(ctx: OpContext, k: int) -> str:
    return "o" if len(ctx.outputs) == 1 else f"o{k}"


def _render(macro: str, values: dict) -> Kernel:
    return Kernel(render_macro(TEMPLATE, macro, values))


def _base(ctx: OpContext) -> dict:
    outs = ", ".join(f"'{t.name}'{list(t.shape)}" for t in ctx.outputs)
    return {
        "fn": ctx.fn,
        "comment": c_comment(f"{ctx.op.opcode} {ctx.outputs[0].dtype} -> {outs}"),
    }


# --- RESHAPE, SQUEEZE, EXPAND_DIMS --------------------------------------------------------


def emit_reshape(ctx: OpContext) -> Kernel:
    x, out = ctx.inputs[0], ctx.outputs[0]
    values = _base(ctx)
    nbytes = x.size * _element_bytes(x)
    values.update(ctype=x.ctype, x=x.ptr, out=out.ptr, nbytes=nbytes, moves=nbytes > 0)
    return _render("reshape", values)


# --- loop nests of block copies -----------------------------------------------------------


@dataclass(frozen=True)
class Move:
    """Copy `run` contiguous elements from `src` to `dst` (C names) at every point of a loop
    nest; each loop advances dst and src by its stride here, in elements. `src_table`, if set,
    is a C expression (a table look-up) added to the source offset; `dst_table` to the
    destination's."""

    dst: str
    src: str
    run: int
    dst_strides: tuple[int, ...]
    src_strides: tuple[int, ...]
    dst_offset: int = 0
    src_offset: int = 0
    src_table: str = ""
    dst_table: str = ""  # likewise, added to the destination offset


def simplify(counts: Sequence[int], moves: Sequence[Move]) -> tuple[list[int], list[Move]]:
    """The fewest loops doing the same copies: size-1 loops vanish, a loop whose strides are its
    inner neighbour's times that one's count merges with it, and an innermost loop that steps
    every move by its run lengthens the runs. No loops and no moves if nothing is copied."""
    moves = [m for m in moves if m.run]
    if not moves or 0 in counts:
        return [], []
    loops: list[tuple[int, list[tuple[int, int]]]] = []  # (count, (dst, src) stride per move)
    for i, count in enumerate(counts):
        if count == 1:
            continue
        strides = [(m.dst_strides[i], m.src_strides[i]) for m in moves]
        if loops and loops[-1][1] == [(d * count, s * count) for d, s in strides]:
            loops[-1] = (loops[-1][0] * count, strides)
        else:
            loops.append((count, strides))
    runs = [m.run for m in moves]
    while loops and all(stride == (r, r) for stride, r in zip(loops[-1][1], runs, strict=True)):
        count, _ = loops.pop()
        runs = [r * count for r in runs]
    return [c for c, _ in loops], [
        Move(m.dst, m.src, run, tuple(s[k][0] for _, s in loops),
             tuple(s[k][1] for _, s in loops), m.dst_offset, m.src_offset, m.src_table)
        for k, (m, run) in enumerate(zip(moves, runs, strict=True))
    ]


def _loops(counts: Sequence[int]) -> list[dict]:
    """Plain loops: variable i<k> runs over [0, counts[k])."""
    return [{"var": f"i{k}", "start": "0", "end": str(c), "step": f"++i{k}"}
            for k, c in enumerate(counts)]


def _nest(ctx: OpContext, counts: Sequence[int], moves: Sequence[Move],
          tables: Sequence[dict] = (), loops: Sequence[dict] | None = None,
          fill: int | None = None) -> Kernel:
    """Render a loop nest over `counts` doing every move at each point, in order. The moves
    index with i<k> for loop k; `loops` may lay those loops out differently (tiled). With
    `fill`, every byte of the output is set to it first."""
    loop_vars = [f"i{k}" for k in range(len(counts))]
    loops = list(_loops(counts) if loops is None else loops) if moves else []
    element_bytes = _element_bytes(ctx.outputs[0])
    rows = []
    for m in moves:
        dst = c_sum(list(zip(loop_vars, m.dst_strides, strict=True)), m.dst_offset)
        src = c_sum(list(zip(loop_vars, m.src_strides, strict=True)), m.src_offset)
        if m.src_table:
            src = m.src_table if src == "0" else f"{m.src_table} + {src}"
        if m.dst_table:
            dst = m.dst_table if dst == "0" else f"{m.dst_table} + {dst}"
        rows.append({
            "dst": f"{m.dst}[{dst}]",
            "src": f"{m.src}[{src}]",
            "dst_at": _at(m.dst, dst),
            "src_at": _at(m.src, src),
            "bytes": m.run * element_bytes,
            "run": m.run > 1,  # a memcpy of the run, else one element's assignment
        })
    used = {m.dst for m in moves} | {m.src for m in moves}
    data = [ctx.inputs[p] for p in _data_positions(ctx)]
    pointers = [
        {"decl": f"const {t.ctype} *{_in_name(ctx, k)}", "expr": t.ptr}
        for k, t in enumerate(data) if _in_name(ctx, k) in used
    ] + [
        {"decl": f"{t.ctype} *{_out_name(ctx, k)}", "expr": t.ptr}
        for k, t in enumerate(ctx.outputs) if _out_name(ctx, k) in used
    ]
    values = _base(ctx)
    values.update(
        tables=list(tables) if moves else [],
        pointers=pointers,
        loop_vars=sorted(loop["var"] for loop in loops),
        loops=[{**loop, "indent": "  " * k} for k, loop in enumerate(loops)],
        indent="  " * len(loops),
        moves=rows,
        fill=None if fill is None else {"dst": _out_name(ctx, 0), "byte": f"0x{fill:02x}",
                                        "bytes": ctx.outputs[0].size * element_bytes},
    )
    return _render("copy", values)


# Least size in bytes, per element size, from which a transpose is tiled. Measured on a desktop
# host: below these the straight loop is as fast; above, tiles run 1.5-3x faster.
TILE_MIN_BYTES = {1: 256 * 1024, 2: 64 * 1024}
TILE_MIN_BYTES_WIDE = 16 * 1024
TILES = (16, 8)


def _tiled(counts: Sequence[int], move: Move, nbytes: int, element_bytes: int) -> list | None:
    """Loops of a transpose in square tiles: the innermost loop (contiguous in the output) and
    the loop contiguous in the input go in TILE x TILE blocks, so that both sides of a tile
    stay in cache. None when the input side is already contiguous, the tensor is small or no
    tile divides both counts."""
    inner = len(counts) - 1
    a = next((k for k, s in enumerate(move.src_strides) if s == 1), None)
    least = TILE_MIN_BYTES.get(element_bytes, TILE_MIN_BYTES_WIDE)
    if a is None or a == inner or move.run != 1 or nbytes < least:
        return None
    tile = next((t for t in TILES if counts[a] % t == 0 and counts[inner] % t == 0), None)
    if tile is None:
        return None
    plain = _loops(counts)
    split = [k for k in (a, inner) if counts[k] > tile]  # a count of one tile needs no split
    tiles = [{"var": f"t{k}", "start": "0", "end": str(counts[k]), "step": f"t{k} += {tile}"}
             for k in split]
    within = [{"var": f"i{k}", "start": f"t{k}", "end": f"t{k} + {tile}", "step": f"++i{k}"}
              if k in split else plain[k] for k in (a, inner)]
    return [loop for k, loop in enumerate(plain) if k not in (a, inner)] + tiles + within


# --- TRANSPOSE, SLICE, STRIDED_SLICE ------------------------------------------------------


def emit_transpose(ctx: OpContext) -> Kernel:
    """Walk the output in order (in tiles if large); output axis i steps the input (or its
    view) along axis perm[i]. Also DEPTH_TO_SPACE and SPACE_TO_DEPTH."""
    p: TransposeParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    view = p.view or x.shape
    walked = tuple(view[a] for a in p.perm)  # the output as the transpose's axes see it
    x_strides = _row_major(view)
    move = Move("o", "x", 1, tuple(_row_major(walked)), tuple(x_strides[a] for a in p.perm))
    counts, moves = simplify(walked, [move])
    nbytes = out.size * _element_bytes(out)
    loops = _tiled(counts, moves[0], nbytes, _element_bytes(out)) if moves else None
    return _nest(ctx, counts, moves, loops=loops)


def emit_slice(ctx: OpContext) -> Kernel:
    """SLICE and STRIDED_SLICE: walk the output in order; element k along axis i is input index
    begin[i] + k * strides[i]. New axes have size 1 and shrunk axes count 1, so neither
    adds a loop."""
    p: SliceParams = ctx.params
    x_strides = _row_major(p.input_shape)
    move = Move("o", "x", 1, tuple(_row_major(p.counts)),
                tuple(s * step for s, step in zip(x_strides, p.strides, strict=True)),
                src_offset=sum(b * s for b, s in zip(p.begin, x_strides, strict=True)))
    return _nest(ctx, *simplify(p.counts, [move]))


# --- CONCATENATION, PACK, SPLIT, SPLIT_V, UNPACK ------------------------------------------


def _join(ctx: OpContext, shape: Sequence[int], axis: int, extents: Sequence[int],
          split: bool) -> Kernel:
    """The whole tensor of `shape` seen as [outer, row], each part as [outer, extent * inner]:
    one loop over outer copies each part's block into the row in turn (concatenation) or out
    of it in turn (split)."""
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    row = sum(extents) * inner
    moves, offset = [], 0
    for k, extent in enumerate(extents):
        block = extent * inner
        if split:
            moves.append(Move(_out_name(ctx, k), "x", block, (block,), (row,), 0, offset))
        else:
            moves.append(Move("o", _in_name(ctx, k), block, (row,), (block,), offset, 0))
        offset += block
    return _nest(ctx, *simplify([outer], moves))


def emit_concatenation(ctx: OpContext) -> Kernel:
    p: ConcatenationParams = ctx.params
    extents = [t.shape[p.axis] for t in ctx.inputs]
    if any(p.rescales):
        return _concatenation_rescaled(ctx, p, extents)
    return _join(ctx, ctx.outputs[0].shape, p.axis, extents, False)


# TFLite's float32 arithmetic, which the helper repeats statement by statement.
_RESCALE_NOTE = (
    "TFLite's ConcatenationWithScaling: round(q * scale + bias) in float32, halves away from "
    "zero, plus the output zero point, clamped to uint8. The product and the sum are separate "
    "statements, so no compiler fuses them; the value lies within int32 (checked when "
    "generating), where value - t is exact.")


def _concatenation_rescaled(ctx: OpContext, p: ConcatenationParams,
                            extents: Sequence[int]) -> Kernel:
    """uint8 with some inputs rescaled: one loop over the outer dimensions; in it each input's
    block is copied, or rescaled element by element through the op's helper."""
    out = ctx.outputs[0]
    outer = math.prod(out.shape[:p.axis])
    inner = math.prod(out.shape[p.axis + 1:])
    row = sum(extents) * inner
    each_outer = ConstantLoop("i0", outer)
    helper = f"{ctx.prefix}_rescale"
    zero_point = next(r.zero_point for r in p.rescales if r)
    parts, pointers, offset = [], [], 0
    for k, (t, extent, rescale) in enumerate(zip(ctx.inputs, extents, p.rescales, strict=True)):
        block = extent * inner
        if block and out.size:
            name = _in_name(ctx, k)
            pointers.append(f"const uint8_t *{name} = {t.ptr};")
            dst = c_sum([(each_outer, row)], offset)
            src = c_sum([(each_outer, block)])
            if rescale is None:
                parts.append({"copies": True, "dst_at": _at("o", dst), "src_at": _at(name, src),
                              "bytes": block})
            else:
                each = ConstantLoop("k", block)
                at = c_sum([(each_outer, row), (each, 1)], offset)
                from_at = c_sum([(each_outer, block), (each, 1)])
                parts.append({"copies": False, "each": each, "dst": f"o[{at}]",
                              "value": f"{helper}({name}[{from_at}], {c_float(rescale.scale)}, "
                                       f"{c_float(rescale.bias)})"})
        offset += block
    values = _base(ctx)
    values.update(
        helper=helper, note=c_comment(_RESCALE_NOTE), empty=not parts,
        plus_zero_point=f" + {zero_point}" if zero_point else "",
        out=out.ptr, pointers=pointers, outer=each_outer, parts=parts,
        counters=", ".join([*(["i0"] if each_outer.written else []),
                            *(["k"] if any(not q["copies"] and q["each"].written
                                           for q in parts) else [])]),
    )
    # the helper rescaling a uint8 value clamps it, when there is something to rescale
    return Kernel(render_macro(TEMPLATE, "concatenation_rescaled", values),
                  () if values["empty"] else ("clamp",))


def emit_pack(ctx: OpContext) -> Kernel:
    """PACK concatenates size-1 slabs along the new axis."""
    p: AxisParams = ctx.params
    return _join(ctx, ctx.outputs[0].shape, p.axis, [1] * len(ctx.inputs), False)


def emit_split(ctx: OpContext) -> Kernel:
    """SPLIT and SPLIT_V."""
    p: SplitParams = ctx.params
    return _join(ctx, ctx.inputs[_data_positions(ctx)[0]].shape, p.axis, p.sizes, True)


def emit_unpack(ctx: OpContext) -> Kernel:
    """UNPACK splits into size-1 slabs that drop the axis."""
    p: AxisParams = ctx.params
    x = ctx.inputs[0]
    return _join(ctx, x.shape, p.axis, [1] * x.shape[p.axis], True)


# --- GATHER -------------------------------------------------------------------------------


def emit_gather(ctx: OpContext) -> Kernel:
    """Walk the output [batch, outer, index, inner] in order; a constant table holds, per
    (batch, index), the input offset of the picked block of `inner` elements."""
    p: GatherParams = ctx.params
    batch, count = p.indices.shape
    if 0 in (p.outer, p.inner, batch, count):
        return _nest(ctx, [], [])
    table = f"{ctx.prefix}_src"
    offsets = [(b * p.outer * p.axis_size + int(i)) * p.inner
               for b in range(batch) for i in p.indices[b]]
    # (name, count, output stride, input stride besides the table's offset), size 1 dropped
    loops = [loop for loop in (
        ("b", batch, p.outer * count * p.inner, 0),
        ("o", p.outer, count * p.inner, p.axis_size * p.inner),
        ("j", count, p.inner, 0),
    ) if loop[1] != 1]
    var = {loop[0]: f"i{k}" for k, loop in enumerate(loops)}
    look_up = c_sum([(var[n], s) for n, s in (("b", count), ("j", 1)) if n in var])
    move = Move("o", "x", p.inner, tuple(loop[2] for loop in loops),
                tuple(loop[3] for loop in loops), src_table=f"{table}[{look_up}]")
    tables = [{"name": table, "ctype": OFFSET_TYPE, "length": c_length(len(offsets)),
               "init": c_array(offsets)}]
    return _nest(ctx, [loop[1] for loop in loops], [move], tables)


# --- SPACE_TO_BATCH_ND with paddings, BATCH_TO_SPACE_ND with crops -------------------------


def _offset_table(ctx: OpContext, name: str, offsets: Sequence[int]) -> tuple[dict, str]:
    table = f"{ctx.prefix}_{name}"
    return ({"name": table, "ctype": OFFSET_TYPE, "length": c_length(len(offsets)),
             "init": c_array(offsets)}, table)


def emit_blocks(ctx: OpContext) -> Kernel:
    """SPACE_TO_BATCH_ND's and BATCH_TO_SPACE_ND's moves of transposes, for paddings or crops:
    one run of channels per input (padding) or output (crops) pixel, along each spatial axis a
    constant table of where its row or column lands (or comes from), separately for rows and
    columns. Padding fills the output first."""
    if ctx.op.opcode == "BATCH_TO_SPACE_ND":
        return _batch_to_space_cropped(ctx)
    p: BlockParams = ctx.params
    n, h, w, c = p.shape
    (bh, bw), ((top, bottom), (left, right)) = p.block, p.edges
    out_h, out_w = (h + top + bottom) // bh, (w + left + right) // bw
    plane = out_h * out_w * c  # one output batch
    # padded row r + top of input row r lies in block (r + top) % bh at row (r + top) // bh
    rows_table, rows = _offset_table(ctx, "rows", [
        (r + top) % bh * bw * n * plane + (r + top) // bh * out_w * c for r in range(h)])
    cols_table, cols = _offset_table(ctx, "cols", [
        (q + left) % bw * n * plane + (q + left) // bw * c for q in range(w)])
    move = Move("o", "x", c, (plane, 0, 0), (h * w * c, w * c, c),
                dst_table=f"{rows}[i1] + {cols}[i2]")
    return _nest(ctx, (n, h, w), [move], [rows_table, cols_table], fill=p.pad_byte)


def _batch_to_space_cropped(ctx: OpContext) -> Kernel:
    p: BlockParams = ctx.params
    n, h, w, c = p.shape
    (bh, bw), ((top, bottom), (left, right)) = p.block, p.edges
    out_n, out_h, out_w = n // (bh * bw), h * bh - top - bottom, w * bw - left - right
    batch = h * w * c  # one input batch
    # output row y is row (y + top) of the uncropped result: block (y + top) % bh, its row
    # (y + top) // bh
    rows_table, rows = _offset_table(ctx, "rows", [
        (y + top) % bh * bw * out_n * batch + (y + top) // bh * w * c for y in range(out_h)])
    cols_table, cols = _offset_table(ctx, "cols", [
        (x + left) % bw * out_n * batch + (x + left) // bw * c for x in range(out_w)])
    move = Move("o", "x", c, (out_h * out_w * c, out_w * c, c), (batch, 0, 0),
                src_table=f"{rows}[i1] + {cols}[i2]")
    return _nest(ctx, (out_n, out_h, out_w), [move], [rows_table, cols_table])


def emit_space_batch(ctx: OpContext) -> Kernel:
    """SPACE_TO_BATCH_ND and BATCH_TO_SPACE_ND: a transpose without paddings or crops, else
    the moves through offset tables of emit_blocks."""
    return emit_blocks(ctx) if isinstance(ctx.params, BlockParams) else emit_transpose(ctx)


# --- MIRROR_PAD ---------------------------------------------------------------------------


def emit_mirror_pad(ctx: OpContext) -> Kernel:
    """Walk the output in order, one run of the unpadded innermost axes at a time; along each
    padded axis a constant table holds, per output index, the input offset it mirrors."""
    p: MirrorPadParams = ctx.params
    if ctx.outputs[0].size == 0:
        return _nest(ctx, [], [])
    rank = len(p.input_shape)
    out_shape = [extent + before + after
                 for extent, (before, after) in zip(p.input_shape, p.paddings, strict=True)]
    looped = rank  # the axes after these are unpadded: one contiguous run
    while looped > 1 and p.paddings[looped - 1] == (0, 0):
        looped -= 1
    run = math.prod(p.input_shape[looped:])
    x_strides, out_strides = _row_major(p.input_shape), _row_major(out_shape)
    counts, dst_strides, src_strides, look_ups, tables = [], [], [], [], []
    for axis in range(looped):
        padded = p.paddings[axis] != (0, 0)
        if out_shape[axis] == 1 and not padded:
            continue
        if padded:
            table = f"{ctx.prefix}_src{axis}"
            offsets = [p.source(axis, i) * x_strides[axis] for i in range(out_shape[axis])]
            tables.append({"name": table, "ctype": OFFSET_TYPE,
                           "length": c_length(len(offsets)), "init": c_array(offsets)})
            look_ups.append(f"{table}[i{len(counts)}]")
        counts.append(out_shape[axis])
        dst_strides.append(out_strides[axis])
        src_strides.append(0 if padded else x_strides[axis])
    move = Move("o", "x", run, tuple(dst_strides), tuple(src_strides),
                src_table=" + ".join(look_ups))
    return _nest(ctx, counts, [move], tables)


# --- PAD, PADV2 ---------------------------------------------------------------------------


def pad_dims(shape: Sequence[int], paddings: Sequence[tuple[int, int]]) -> list[tuple[int, ...]]:
    """(extent, before, after) per dimension, fewest dimensions: an unpadded size-1 dimension
    vanishes and an unpadded dimension merges into its outer neighbour."""
    dims: list[tuple[int, ...]] = []
    for extent, (before, after) in zip(shape, paddings, strict=True):
        if before or after or not dims:
            if extent != 1 or before or after:
                dims.append((extent, before, after))
        else:
            dims[-1] = tuple(d * extent for d in dims[-1])
    return dims or [(1, 0, 0)]


def emit_pad(ctx: OpContext) -> Kernel:
    """Write the output in order: each level fills its border block before, then its interior
    (a loop over the next level, or at the innermost level one copy of an input row), then
    its border block after."""
    p: PadParams = ctx.params
    x, out = ctx.inputs[0], ctx.outputs[0]
    values = _base(ctx)
    values.update(ctype=out.ctype, out=out.ptr, x=x.ptr, value=_literal(p.value, out.dtype),
                  levels=[], loop_vars=[], row=None, uses_k=False)
    if out.size == 0:
        return _render("pad", values)
    dims = [(0, out.size, 0)] if x.size == 0 else pad_dims(x.shape, p.paddings)
    out_strides = _row_major([sum(d) for d in dims])
    x_strides = _row_major([d[0] for d in dims])

    def fill(terms: list[tuple[str, int]], start: int, count: int) -> dict:
        if count > 1:
            values["uses_k"] = True
        return {"count": count, "repeated": count > 1,
                "dst": f"o[{c_sum([*terms, ('k', int(count > 1))], start)}]"}

    terms: list[tuple[str, int]] = []  # the current block's output offset: sum of these...
    start = 0  # ... plus this
    src_terms: list[tuple[str, int]] = []
    indent = ""
    for level, ((extent, before, after), so, sx) in enumerate(zip(dims, out_strides, x_strides,
                                                                  strict=True)):
        borders = {
            "before": fill(terms, start, before * so) if before else None,
            "after": fill(terms, start + (before + extent) * so, after * so) if after else None,
        }
        if level == len(dims) - 1:  # so == sx == 1
            dst, src = c_sum(terms, start + before), c_sum(src_terms)
            values["row"] = {**borders, "count": extent, "bytes": extent * _element_bytes(out),
                             "copies": extent > 1, "single": extent == 1,
                             "dst": f"o[{dst}]", "src": f"x[{src}]",
                             "dst_at": _at("o", dst), "src_at": _at("x", src)}
        else:  # a loop over the interior, none if it is one block
            var = f"i{len(terms)}" if extent > 1 else ""
            values["levels"].append({**borders, "var": var, "count": extent, "indent": indent})
            start += before * so
            if var:
                terms, src_terms = [*terms, (var, so)], [*src_terms, (var, sx)]
                indent += "  "
    values["indent"] = indent
    values["loop_vars"] = [name for name, _ in terms]
    return _render("pad", values)
