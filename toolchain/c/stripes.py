"""A striped segment's C (toolchain.lower.tiling): one kernel per op and run of alike stripes,
each over its rows of the op's tensors, and the function that runs them stripe by stripe, a run
of several stripes as a loop over the segment's stripe cursor; a segment in column tiles runs
its stripes once per tile, each tile's kernels cut to its columns."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from toolchain.errors import PlanError
from toolchain.lower.tiling import (
    ROW_BY_ROW,
    OpRows,
    Run,
    Segment,
    StripeBuffer,
    Tile,
    stripe_runs,
    stripe_scratch_fits,
    striped_params,
    tile_params,
)
from toolchain.ops import REGISTRY
from toolchain.ops.emit import C_TYPES, CTensor, Kernel, OpContext, c_comment, c_sum
from toolchain.render import render
from toolchain.text import c_text

if TYPE_CHECKING:
    from toolchain.c.steps import Emission

Place = tuple[int, int] | None  # an operand's (row at the run's first stripe, rows per stripe)
LINE_ROOM = 116  # of a line in a stripe function, indented by at most 4 of the 120 a line has


@dataclass(frozen=True)
class StripedSegment:
    """One segment as its kernels address it: the cursor the stripe kernels of a loop read, the
    tensor each op writes, and the stripe buffers with their slots of the offset table."""

    em: Emission
    seg: Segment
    cursor: str
    produced: dict[int, int]  # op -> its output
    buffer_at: dict[int, tuple[StripeBuffer, int]]  # intermediate -> its buffer, its slot
    tile: Tile | None = None  # the column tile its kernels are on (None: whole rows)
    tile_index: int = 0
    kernels_of: int = 0  # the tile whose kernels it calls: the first one cut alike

    def width(self, t: int) -> int:
        """The columns of tensor t its kernels see: the tile's, or the whole width."""
        lo, hi = self.tile.span(t) if self.tile else (0, self.em.mp.graph.tensors[t].shape[2])
        return hi - lo

    def row_bytes(self, t: int) -> int:
        """The bytes of a row of tensor t in its stripe buffer (a tile's columns of it)."""
        tensor = self.em.mp.graph.tensors[t]
        return tensor.nbytes // (tensor.shape[1] * tensor.shape[2]) * self.width(t)

    def rows_at(self, t: int, place: Place, row: int, rows: int, run: Run) -> CTensor:
        """`rows` rows of tensor t as a stripe's kernel sees them: from `row` of its stripe
        buffer, or where `place` puts them in the whole tensor for the stripes of `run`."""
        at = self.em.at
        tensor = self.em.mp.graph.tensors[t]
        ctype = C_TYPES[tensor.dtype]
        elems = tensor.num_elements // (tensor.shape[1] * tensor.shape[2]) * self.width(t)
        if t in self.buffer_at:
            base = f"(({ctype} *)({at.arena} + {at.macros[self.buffer_at[t][1]]}))"
            first = str(row)
        else:
            base = at.pointer(t)
            first = self.moving_row(place, run)
        ptr = base if first == "0" else f"({base} + ({first}) * {elems})"
        return CTensor(t, c_text(tensor.name), tensor.dtype,
                       (1, rows, self.width(t), *tensor.shape[3:]), ptr, None, at.used)

    @property
    def pairs(self) -> str:
        """The cursor of the loops over stripes two by two (Run.period 2): the pair they are on,
        from 0."""
        return f"{self.em.at.name}_pair{self.seg.first}"

    def moving_row(self, place: Place, run: Run) -> str:
        """The C of a row that moves on through a run: (row, step) at its first stripe, on by
        the step each stripe (on the stripe cursor), or each pair of stripes (on the pair
        cursor, from 0)."""
        row0, per = place
        if not per:
            return str(row0)
        if run.period == 1:
            return c_sum([(self.cursor, per)], row0 - per * run.start)
        return c_sum([(self.pairs, per)], row0)

    def row_in_buffer(self, t: int, row: int, stripe: int) -> int:
        """A row of tensor t relative to where the stripe has it: in its stripe buffer, from
        the buffer's base row; in the whole tensor, as it is."""
        if t not in self.buffer_at:
            return row
        return row - self.seg.stripes[stripe].bases[self.seg.buffer_of(t)]


def striped_segment(em: Emission, seg: Segment) -> StripedSegment:
    return StripedSegment(
        em, seg, f"{em.at.name}_stripe{seg.first}",
        {o: em.mp.graph.operators[o].outputs[0] for o in seg.ops},
        {b.tensor: (b, em.at.stripe_slot[b.tensor]) for b in seg.buffers})


def emit_segment(em: Emission, seg: Segment) -> None:
    """A striped segment's kernels, one per op and run of alike stripes (in each column tile),
    and the function that runs them stripe by stripe, after a comment saying how it stripes."""
    s = striped_segment(em, seg)
    header_at = len(em.texts)  # the segment's comment, and its cursor where anything reads it
    em.texts.append("")
    defined: dict[str, str] = {}  # what the op's earlier runs defined: name -> text
    moving: set[int] = set()  # the stripe buffers whose rows move up, are fetched or handed on
    runs = []
    if seg.tiles:
        em.texts.append(tile_copies(s))
    cuts: list[tuple] = []  # each tile's ops as their kernels see them, to share alike tiles'
    for k, tile in enumerate(seg.tiles or (None,)):
        params = em.params if tile is None else tile_params(seg, tile, em.mp.graph, em.params)
        cut = tuple(REGISTRY[em.mp.graph.operators[o].kind].striping.key(params[o])
                    for o in seg.ops)
        cuts.append(cut)
        s = replace(s, tile=tile, tile_index=k, kernels_of=cuts.index(cut))
        if tile is not None:
            lo, hi = tile.span(seg.output)
            runs.append({"loop": False, "lines": [f"/* column tile {k}: output columns {lo}-"
                                                  f"{hi - 1} */"]})
        for run in stripe_runs(seg, em.mp.graph, params, s.produced):
            stripe = seg.stripes[run.start]
            lines = keep_moves(s, run, moving) + fetched_rows(s, run, moving)
            lines += [stripe_call(s, run, w, places, defined, params)
                      for w, places in zip(stripe.ops, run.rows, strict=True)]
            lines += handed_rows(s, run, moving)
            if run.period == 2 and runs and runs[-1].get("phase") == run.start - 1:
                runs[-1]["lines"] += lines  # the second phase, in the first one's loop
                del runs[-1]["phase"]
            elif run.period == 2:
                runs.append({"loop": True, "cursor": s.pairs, "start": 0, "stop": run.count,
                             "lines": lines, "phase": run.start})
            else:
                runs.append({"loop": run.count > 1, "cursor": s.cursor, "start": run.start,
                             "stop": run.start + run.count, "lines": lines})
    program, name, arena = em.mp.program, em.at.name, em.at.arena
    declarations = [f"uint8_t *const rows{b.tensor} = {arena} + {em.at.macros[slot]}; "
                    f"/* {program.tensor_label(b.tensor)}: {counted(b.rows, 'row')} */"
                    for b, slot in s.buffer_at.values() if b.tensor in moving]
    em.texts.append(render("c/stripes.c.j2", v={"fn": f"{name}_stripes{seg.first}",
                                                "runs": runs,
                                                "declarations": declarations}))
    em.texts[header_at] = segment_comment(s, {run["cursor"] for run in runs if run["loop"]})


def each(run: Run) -> str:
    """How often a run's rows move on."""
    return "each stripe" if run.period == 1 else "each two stripes"


def segment_comment(s: StripedSegment, cursors: set[str]) -> str:
    """What the segment runs, and the cursors its loops use: a stripe's kernel reads one only
    in a loop (in one stripe alone its rows are constants), so a segment written out declares
    none."""
    seg = s.seg
    ops = ", ".join(s.em.mp.program.op_label(o) for o in seg.ops)
    rows = (f"at most {counted(seg.height, 'row')} of each tensor (row by row)"
            if seg.pace == ROW_BY_ROW else counted(seg.height, 'output row'))
    what = f"Steps {seg.first}-{seg.last} ({ops}) run in {len(seg.stripes)} stripes of {rows}"
    if seg.tiles:
        what += (f" in each of {len(seg.tiles)} column tiles ({seg.recomputed:,} MACs computed "
                 "twice where the tiles meet)")
    if not cursors:
        return c_comment(f"{what}, each written out.")
    said = [f"{s.cursor} is the stripe the kernels below are on"] if s.cursor in cursors else []
    if s.pairs in cursors:
        said.append(f"{s.pairs} is the pair of stripes, where the stripes alternate")
    return (c_comment(f"{what}; {' and '.join(said)}.")
            + "".join(f"\nstatic int {c};" for c in (s.cursor, s.pairs) if c in cursors))


def keep_moves(s: StripedSegment, run: Run, moving: set[int]) -> list[str]:
    """The memmoves that start a run: each stripe buffer's kept rows up to its top, where the
    stripe before left them lower (recording those buffers in `moving`)."""
    stripe = s.seg.stripes[run.start]
    previous = s.seg.stripes[run.start - 1].bases if run.start else stripe.bases
    lines = []
    for (b, _), kept, base, before in zip(s.buffer_at.values(), stripe.kept, stripe.bases,
                                          previous, strict=True):
        if kept and base != before:
            moving.add(b.tensor)
            row_bytes = s.row_bytes(b.tensor)
            lines.append(f"memmove(rows{b.tensor}, rows{b.tensor} + "
                         f"{(base - before) * row_bytes}, {kept * row_bytes}); /* keep its "
                         f"last {'row' if kept == 1 else f'{kept} rows'} at the top */")
    return lines


def fetched_rows(s: StripedSegment, run: Run, named: set[int]) -> list[str]:
    """The call that fetches a streamed input's rows for a run's stripe, from the firmware's
    NAME_input_rows() into its stripe buffer (through the segment's NAME_input_columnsN() in a
    column tile), recording that buffer in `named`."""
    seg = s.seg
    if not seg.streamed:
        return []
    return streamed_rows(s, run, named, seg.input, seg.stripes[run.start].fetch, run.fetch,
                         "input", s.em.mp.graph.inputs.index(seg.input))


def handed_rows(s: StripedSegment, run: Run, named: set[int]) -> list[str]:
    """The calls that hand a streamed output's rows on after a run's stripe, from its stripe
    buffer to the firmware's NAME_output_rows(), one per place the graph lists it among its
    outputs (in a column tile, the one call copying them into its columns of the output),
    recording that buffer in `named`."""
    seg = s.seg
    emit = seg.stripes[run.start].emit
    if seg.tiles:
        return streamed_rows(s, run, named, seg.output, emit, run.emit, "output", 0)
    if not seg.streamed_output:
        return []
    return [line for i, t in enumerate(s.em.mp.graph.outputs) if t == seg.output
            for line in streamed_rows(s, run, named, seg.output, emit, run.emit, "output", i)]


def streamed_rows(s: StripedSegment, run: Run, named: set[int], tensor: int,
                  rows: tuple[int, int], place: tuple[int, int], what: str, index: int
                  ) -> list[str]:
    """The call of NAME_input_rows() or NAME_output_rows() (`what`) for rows [lo, hi) of graph
    input or output `index` in a run's first stripe, `place` the (row, rows per stripe) it
    moves on by in the run; in a column tile, of the segment's NAME_input_columnsN() or
    NAME_output_columnsN() with the tile's columns."""
    lo, hi = rows
    if hi == lo:
        return []
    b, _ = s.buffer_at[tensor]
    named.add(b.tensor)
    per = place[1]
    first = s.moving_row(place, run)
    at = (lo - s.seg.stripes[run.start].bases[s.seg.buffer_of(tensor)]) * s.row_bytes(tensor)
    which = f"rows {lo}-{hi - 1}" if hi - lo > 1 else f"row {lo}"
    then = f", then the next {per} {each(run)}" if run.count > 1 else ""
    rows_at = f"rows{b.tensor}{f' + {at}' if at else ''}"
    if s.tile is None:
        call = f"{s.em.at.name}_{what}_rows({index}, {first}, {hi - lo}, {rows_at})"
    else:
        skip = s.tile.span(tensor)[0] * s.row_bytes(tensor) // s.width(tensor)
        call = (f"{s.em.at.name}_{what}_columns{s.seg.first}({first}, {hi - lo}, {rows_at}, "
                f"{skip}, {s.row_bytes(tensor)})")
    line = f"{call}; /* {what} {which}{then} */"
    if len(line) > LINE_ROOM:  # the comment on a line of its own, above the call
        return [f"/* {what} {which}{then}: */", f"{call};"]
    return [line]


def tile_copies(s: StripedSegment) -> str:
    """The two functions a segment in column tiles moves rows with: its input's rows fetched
    one at a time into the staging row after its stripe buffer and their tile's columns copied
    out, and its output rows copied from their stripe buffer into their columns of the
    output."""
    em, seg = s.em, s.seg
    name, graph = em.at.name, em.mp.graph
    x, y = seg.input, seg.output
    staged, slot = s.buffer_at[x]
    y_row = graph.tensors[y].nbytes // graph.tensors[y].shape[1]
    return render("c/tile_copies.c.j2", v={
        "name": name, "first": seg.first, "steps": f"{seg.first}-{seg.last}",
        "input": graph.inputs.index(x),
        "staging": f"{em.at.arena} + {em.at.macros[slot]} + {staged.rows * staged.row_bytes}",
        "output": em.at.slot_bytes(em.at.slot_of[y]), "output_row": y_row})


def stripe_call(s: StripedSegment, run: Run, w: OpRows, places: tuple[Place, ...],
                defined: dict[str, str], params) -> str:
    """One op's kernel for a run (its text added to the file) and the line calling it."""
    em, program = s.em, s.em.mp.program
    context = stripe_context(s, run, w, places, params)
    out_rows = w.out_hi - w.out_lo
    _, lo, hi = w.reads[0]
    reduces = w.op == s.seg.reducer
    then = (f", then the next {hi - lo if reduces else out_rows} {each(run)}"
            if run.count > 1 else "")
    if reduces:
        did = f"adds up input {rows_named(lo, hi)}{then}"
        did += ", writes its output" if out_rows else ""
        done = f"{counted(hi - lo, 'input row')} added up" + (
            " and its output written" if out_rows else "")
    else:
        did = f"output {rows_named(w.out_lo, w.out_hi)}{then}"
        done = (f"{counted(out_rows, 'output row')} of its {context.op_rows} from "
                f"{counted(hi - lo, 'input row')}")
    call = f"{context.fn}(); /* {program.op_label(w.op)}: {did} */"
    if s.kernels_of != s.tile_index:  # an earlier tile's kernel, cut alike
        return call
    label = f"{run.start}t{s.tile_index}" if s.tile else str(run.start)
    kernel, text = shared_kernel(em, context, label, defined)
    em.kernel_of[w.op] = kernel
    last = run.start + run.period * (run.count - 1)
    stripes = (f"stripe {run.start}" if run.count == 1 else f"stripes {run.start}-{last}"
               if run.period == 1 else f"every other stripe from {run.start} to {last}")
    if s.tile:
        first, end = s.tile.span(s.produced[w.op])
        stripes += f" of column tile {s.tile_index} (its output columns {first}-{end - 1})"
    em.texts.append(c_comment(
        f"{program.op_label(w.op)} in {stripes} of step {s.seg.first}: {done}.") + "\n" + text)
    em.groups.extend(kernel.helpers)
    return call


def stripe_context(s: StripedSegment, run: Run, w: OpRows, places: tuple[Place, ...],
                   params) -> OpContext:
    """What an op's kernel for a run of stripes gets: its rows of the tensors it stripes, the
    rest whole, and `params` (the ops', cut to a column tile's columns) cut to its rows;
    refused when it would need more scratch."""
    em = s.em
    mp, at = em.mp, em.at
    op = mp.graph.operators[w.op]
    ins = [s.rows_at(t, place, s.row_in_buffer(t, r_lo, run.start), r_hi - r_lo, run)
           for (t, r_lo, r_hi), place in zip(w.reads, places[:-1], strict=True)]  # then out's
    out_t = s.produced[w.op]
    reduces = w.op == s.seg.reducer
    out = at.c_tensor(out_t) if reduces else s.rows_at(
        out_t, places[-1], s.row_in_buffer(out_t, w.out_lo, run.start), w.out_hi - w.out_lo, run)
    _, lo, hi = w.reads[0]
    tile = f"_tile{s.kernels_of}" if s.tile else ""
    scratch = at.scratch_of.get(w.op, ())
    if reduces:  # its accumulators, after its input's rows
        rows, slot = s.buffer_at[w.reads[0][0]]
        scratch = (f"({at.arena} + {at.macros[slot]} + {rows.accumulator_at})",)
    context = OpContext(
        f"{em.fns[w.op]}{tile}_stripes{run.start}", f"{at.name}_{mp.program.op_symbol(w.op)}s",
        op, striped_params(op.kind, params[w.op], w.out_lo, w.out_hi, lo, hi),
        (*ins, *(at.c_tensor(t) for t in op.inputs[len(ins):])), (out,),
        scratch, None, mp.program.op_label(w.op),
        target=mp.program.target, op_rows=mp.graph.tensors[out_t].shape[1])
    if not stripe_scratch_fits(mp.program.bindings[w.op], context.params):
        raise PlanError(f"{mp.program.op_label(w.op)} {op.opcode}: a stripe's kernel needs more "
                        "scratch than the op's", mp.model.source)
    return context


def shared_kernel(em: Emission, context: OpContext, start: str,
                  defined: dict[str, str]) -> tuple[Kernel, str]:
    """A run's kernel and the text the file adds for it: the runs of an op share the
    definitions they state alike (`defined`: name -> text, of the runs before); one whose
    definitions differ has its own, under a prefix of its own, but for those equal to the
    earlier runs' save the prefix."""
    kernel = em.emit(context)
    if any(defined.get(d.name, d.text) != d.text for d in kernel.definitions):
        prefix = f"{context.prefix}{start}"
        kernel = alike_renamed(em.emit(replace(context, prefix=prefix)), prefix,
                               context.prefix, defined)
    new = [d for d in kernel.definitions if d.name not in defined]
    defined.update((d.name, d.text) for d in new)
    em.count_kernel_weights(context.op.index, new)
    return kernel, "".join(d.text for d in new) + kernel.text


def alike_renamed(kernel: Kernel, prefix: str, earlier: str, defined: dict[str, str]) -> Kernel:
    """A kernel emitted under `prefix` as one of its definitions differs from the earlier
    runs': each of its definitions that is theirs under `earlier` (the same text, but for the
    name) dropped and its uses renamed, so only what differs is defined twice."""
    renames = {}
    for d in kernel.definitions:
        if d.name.startswith(f"{prefix}_"):
            before = f"{earlier}{d.name[len(prefix):]}"
            if defined.get(before) == renamed(d.text, {d.name: before}):
                renames[d.name] = before
    return replace(kernel, text=renamed(kernel.text, renames), definitions=tuple(
        replace(d, text=renamed(d.text, renames))
        for d in kernel.definitions if d.name not in renames))


def renamed(text: str, renames: dict[str, str]) -> str:
    """C text with each of the names `renames` maps (whole identifiers) spelled as it says."""
    if not renames:
        return text
    pattern = rf"\b({'|'.join(map(re.escape, renames))})\b"
    return re.sub(pattern, lambda m: renames[m[1]], text)


def rows_named(lo: int, hi: int) -> str:
    """"row 3", "rows 3-4"."""
    return f"row {lo}" if hi - lo == 1 else f"rows {lo}-{hi - 1}"


def counted(n: int, noun: str) -> str:
    """"1 row", "3 rows"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
