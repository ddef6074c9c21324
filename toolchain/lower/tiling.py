"""Striped execution: a chain of windowed ops run one horizontal stripe of output rows at a time.

A segment is a run of consecutive steps (CONV_2D, DEPTHWISE_CONV_2D, AVERAGE/MAX_POOL_2D and
same-shape ADD/SUB/MUL of two activations between them) with one input tensor from outside (it
may be read by several ops of the segment: a residual ADD) and one output that leaves it. Its
intermediates never exist whole: each keeps, in a stripe buffer of its own, only the rows a later
window still needs (StreamNet's way: nothing is computed twice). Before a stripe, the rows a
buffer keeps move to its top and the stripe's new rows go below them, so every op still reads
and writes plain NHWC rows and runs its usual kernel, on fewer rows and with its own top padding.

NHWC with batch 1 makes a row range a byte range, so the input's rows die as the stripes pass
and the output may grow over them: the output may start `shift` bytes below the input, the
largest excess of output bytes written over input bytes dead when the stripe's last op writes
them (the ops before it in the stripe have read their rows; an Overlap the planner honours and
`verify` checks). The planner sees the whole segment at its first step:
input, output, stripe buffers and the scratch of the segment's kernels all live there together.

A streamed segment's input is a graph input that never exists whole: like an intermediate it
has a stripe buffer, and before each stripe the rows its windows need next are fetched into it
(from the firmware's function in the C, `--stream-input`). Only the segment reads it, so such a
segment may run longer (MAX_STREAMED_OPS): its output is the first tensor held whole.

A segment's output that is a graph output no op reads may stream too (`--stream-output`): it
has a stripe buffer of one stripe's rows, handed on after each stripe as they are final (to the
firmware's function in the C), and never exists whole.

A streamed segment may also run in column tiles (MCUNetV2's patches, cut across the width only):
its stripes run once per tile, each on the columns of every tensor that tile's share of the
output needs, so its stripe buffers are a tile wide rather than the whole width. A tile's input
rows are fetched whole through a staging row and cut to its columns; its output rows go from a
stripe buffer of one stripe's rows into their columns of the output, which is held whole. The
columns next to a tile's edge that its neighbour needs too are computed twice: the segment's
MACs count them, and the search keeps such a segment only within a cap on them.

A segment may end in an op that reduces its whole input to one row (a global pool; its kernel
says so, Striping.accumulates): its input never exists whole either. The ops before it stripe
as if that input streamed out, in a stripe buffer of one stripe's rows, and the reducing op adds
each stripe's rows to accumulators kept after them; the last stripe writes its output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import pairwise
from typing import Any

from toolchain.ir import Graph
from toolchain.lower.folding import Elided
from toolchain.ops import REGISTRY
from toolchain.ops.spec import Binding
from toolchain.ops.striping import RowMap, Striping

# The longest run of ops one segment may hold (a streamed one, or one ending in a reducing op:
# its output is the first tensor held whole), and the stripe heights tried (in output rows).
MAX_SEGMENT_OPS = 8
MAX_STREAMED_OPS = 16
STRIPE_HEIGHTS = (1, 2, 3, 4, 6, 8, 12, 16)
# The column tiles tried for a streamed segment (1: the whole width at once).
TILE_COUNTS = (1, 2, 3, 4)

Schedule = tuple[int, int, int]  # a stripe height, a pace (below), and column tiles
# How a segment's stripes pace its ops: each stripe makes what its output rows need
# (demanded_rows); or each op makes at most its share of rows a stripe, the strides after it
# counted (wavefront_rows); or at most `height` rows of every tensor a stripe, whatever the
# strides (the same, row by row: more stripes, but an op before a stride keeps only its
# readers' windows, not two stripes' rows).
ON_DEMAND, WAVEFRONT, ROW_BY_ROW = 0, 1, 2


@dataclass(frozen=True)
class OpRows:
    """One op's work in one stripe: output rows [out_lo, out_hi), and per activation input
    the rows [lo, hi) it reads."""

    op: int
    out_lo: int
    out_hi: int
    reads: tuple[tuple[int, int, int], ...]  # (tensor, lo, hi)


@dataclass(frozen=True)
class Stripe:
    """One stripe: the row each stripe buffer starts at (its `base`), the rows it keeps from the
    stripe before (they move up to the top first), the ops' work in order, the first row of
    the segment input still needed after the stripe (the rows above it die), when the input
    is streamed, the rows [lo, hi) of it fetched before the ops run (none: lo == hi), and when
    the output is, the rows [lo, hi) of it handed on after them."""

    bases: tuple[int, ...]  # per stripe buffer, in Segment.buffers order
    kept: tuple[int, ...]  # per stripe buffer: rows moved up from the previous stripe
    ops: tuple[OpRows, ...]
    input_done_to: int
    fetch: tuple[int, int] = (0, 0)
    emit: tuple[int, int] = (0, 0)

    def input_alive_from(self, k: int, x: int) -> int:
        """The first row of the segment input `x` still needed when the stripe's k-th op runs:
        the rows it and the ops after it in this stripe read, and the rows later stripes read.
        The ops before it have run, so the rows only they read are dead."""
        return min([self.input_done_to, *(lo for w in self.ops[k:] for t, lo, _ in w.reads
                                          if t == x)])


@dataclass(frozen=True)
class StripeBuffer:
    """The rows of one intermediate a stripe buffer holds: `rows` rows of `row_bytes`, then
    `staging` bytes (a column-tiled segment's input: one whole row, fetched there and cut to
    the tile's columns), or from the next word the `accumulator` bytes of the reducing op that
    reads it (a segment's last)."""

    tensor: int
    rows: int
    row_bytes: int
    staging: int = 0
    accumulator: int = 0

    @property
    def accumulator_at(self) -> int:
        """Where the accumulators start, in bytes from the buffer's start: a word boundary."""
        return -(-self.rows * self.row_bytes // ACCUMULATOR_ALIGNMENT) * ACCUMULATOR_ALIGNMENT

    @property
    def size(self) -> int:
        if self.accumulator:
            return self.accumulator_at + self.accumulator
        return self.rows * self.row_bytes + self.staging


ACCUMULATOR_ALIGNMENT = 4  # int32 and float accumulators


@dataclass(frozen=True)
class Tile:
    """One column tile of a segment: columns [lo, hi) of each tensor its stripes read or make
    (the segment output's are the tile's share of it)."""

    columns: tuple[tuple[int, int, int], ...]  # (tensor, lo, hi)

    def span(self, tensor: int) -> tuple[int, int]:
        """Tensor t's columns [lo, hi) in this tile."""
        return next((lo, hi) for t, lo, hi in self.columns if t == tensor)


@dataclass(frozen=True)
class Segment:
    """Steps [first, last] of the order run stripe by stripe, `height` output rows at a time.
    A `streamed` segment's input has the first stripe buffer, and its stripes fetch its rows;
    a `streamed_output` segment's output has the last, and its stripes hand its rows on. A
    segment that `reduces` ends in a reducing op (its height and stripes are its input's), whose
    input's stripe buffer, the last, keeps its accumulators."""

    first: int
    last: int
    ops: tuple[int, ...]
    input: int
    output: int
    height: int
    buffers: tuple[StripeBuffer, ...]
    stripes: tuple[Stripe, ...]
    shift: int  # the output may start this many bytes below the input
    moved_bytes: int  # bytes the stripe buffers move up over the whole segment
    macs: int  # multiply-accumulates of the striped run: none repeats, unread rows are skipped
    whole_macs: int  # of the same ops run whole
    streamed: bool = False
    pace: int = ON_DEMAND  # how its stripes pace its ops (Schedule)
    streamed_output: bool = False
    tiles: tuple[Tile, ...] = ()  # column tiles, each running every stripe; none: whole rows
    recomputed: int = 0  # MACs of columns two tiles or more compute, each time after the first

    @property
    def schedule(self) -> Schedule:
        return self.height, self.pace, len(self.tiles) or 1

    @property
    def reduces(self) -> bool:
        """Whether it ends in an op that adds its input up: the last stripe buffer, that
        input's, keeps the accumulators."""
        return bool(self.buffers) and self.buffers[-1].accumulator > 0

    @property
    def reducer(self) -> int | None:
        """The op that adds up its input stripe by stripe, ending the segment (if it reduces)."""
        return self.ops[-1] if self.reduces else None

    @property
    def wavefront(self) -> bool:
        """Whether its stripes fill the chain a share at a time (wavefront_rows)."""
        return self.pace != ON_DEMAND

    @property
    def emits(self) -> bool:
        """Whether its stripes hand output rows on from a stripe buffer: to the firmware (a
        streamed output), or into their columns of the output (column tiles)."""
        return self.streamed_output or bool(self.tiles)

    def buffer_of(self, tensor: int) -> int | None:
        return next((i for i, b in enumerate(self.buffers) if b.tensor == tensor), None)


@dataclass(frozen=True)
class Tiling:
    """The segments a plan runs striped, by their first step."""

    segments: tuple[Segment, ...] = ()

    def segment_at(self, step: int) -> Segment | None:
        return next((s for s in self.segments if s.first == step), None)

    def merged_steps(self) -> dict[int, int]:
        """Step -> the step it counts at in the plan: a segment's steps all at its first."""
        return {step: s.first for s in self.segments for step in range(s.first, s.last + 1)}

    def intermediates(self) -> frozenset[int]:
        """Tensors that never exist whole: only their stripe buffers are planned (a column-tiled
        segment's output is whole beside its stripe buffer)."""
        return frozenset(b.tensor for s in self.segments for b in s.buffers
                         if not (s.tiles and b.tensor == s.output))


NO_TILING = Tiling()


# -- which ops stripe, and how their rows map: their kernels say (OpSpec.striping) ------------


def striping_of(binding: Binding) -> Striping | None:
    return REGISTRY[binding.opcode].striping


def row_map(binding: Binding, graph: Graph) -> RowMap | None:
    """How the op's output rows read its first input's rows, or None if it cannot stripe."""
    op = graph.operators[binding.op]
    striping = striping_of(binding)
    if striping is None or len(op.outputs) != 1 or op.outputs[0] < 0:
        return None
    out = graph.tensors[op.outputs[0]]
    if (len(out.shape) != 4 or out.shape[0] != 1) and not accumulator_bytes(binding, graph):
        return None  # rows of an NHWC tensor, but a reducing op's one output row
    found = striping.rows(binding.params)
    return None if found is None else replace(found, rows=graph.tensors[op.inputs[0]].shape[1])


def striped_params(opcode: str, params: Any, out_lo: int, out_hi: int, in_lo: int,
                   in_hi: int) -> Any:
    """The op's params for output rows [out_lo, out_hi) read from input rows [in_lo, in_hi):
    the same op on fewer rows, its top padding what is left of the padding above row in_lo."""
    return REGISTRY[opcode].striping.band(params, out_lo, out_hi, in_lo, in_hi)


def band_key(opcode: str, params: Any, out_lo: int, out_hi: int, in_lo: int, in_hi: int) -> tuple:
    """What makes two bands of one op run the same kernel: the parts of their params that
    differ from band to band (Striping.key)."""
    striping = REGISTRY[opcode].striping
    return striping.key(striping.band(params, out_lo, out_hi, in_lo, in_hi))


# -- segments ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chain:
    """A run of steps that may stripe: its ops (the steps' but fused PADs), input, output and
    each op's reads; `streamed` when its input is a graph input fetched row by row,
    `streamed_output` when its output is a graph output handed on row by row; `accumulator`,
    the bytes of accumulators of a last op that reduces its whole input (0: none does)."""

    first: int
    last: int
    ops: tuple[int, ...]
    input: int
    output: int
    reads: Mapping[int, tuple[tuple[int, RowMap], ...]]  # op -> (tensor, rows map) per input
    row_bytes: Mapping[int, int]  # tensor -> bytes per row
    rows: Mapping[int, int]  # tensor -> rows
    produced: Mapping[int, int]  # op -> its output
    streamed: bool = False
    streamed_output: bool = False
    accumulator: int = 0

    @property
    def striped(self) -> int:
        """The tensor its stripes make row by row to the end: its output, or the input of the
        op that reduces it."""
        return self.reads[self.ops[-1]][0][0] if self.accumulator else self.output


def accumulator_bytes(binding: Binding | None, graph: Graph) -> int:
    """The bytes of accumulators with which the op adds up its input band by band, if it
    reduces the whole input to one row (Striping.accumulates), else 0."""
    if binding is None or isinstance(binding.params, Elided):
        return 0
    striping = striping_of(binding)
    if striping is None or striping.accumulates is None:
        return 0
    op = graph.operators[binding.op]
    shape = graph.tensors[op.inputs[0]].shape
    if len(shape) != 4 or len(graph.tensors[op.outputs[0]].shape) < 2:
        return 0  # rows of an NHWC input into an output of rows (one)
    return striping.accumulates(binding.params, shape)


def chain_at(graph: Graph, bindings: Sequence[Binding | None], order: Sequence[int],
             first: int, last: int, readers: Mapping[int, set[int]],
             kept: frozenset[int], streams: frozenset[int] = frozenset()) -> Chain | None:
    """Steps [first, last] as a stripable chain, or None: ops that stripe, one input from
    outside, every tensor they make read only inside but the last op's output. An input in
    `streams` (graph inputs to fetch row by row) must be read only inside: it never exists
    whole. An output in `streams` (graph outputs to hand on row by row) that no op reads
    streams. The last op may reduce its input (accumulator_bytes): then its output, one row,
    is the first tensor held whole, and it streams no more."""
    if fused_away(bindings[order[first]]) or fused_away(bindings[order[last]]):
        return None  # a segment starts and ends on ops that run
    ops = tuple(o for o in order[first:last + 1] if not fused_away(bindings[o]))
    inside = set(ops)
    produced, reads = {}, {}
    outside_inputs: set[int] = set()
    for op_index in ops:
        binding = bindings[op_index]
        if binding is None:
            return None
        rows = row_map(binding, graph)
        if rows is None:
            return None
        op = graph.operators[op_index]
        activations = [t for t in op.inputs if t >= 0 and not graph.tensors[t].is_constant]
        if striping_of(binding).every_input:
            if len(activations) < len([t for t in op.inputs if t >= 0]):
                return None  # a constant operand the kernel would read whole, not its band
            ins = tuple((t, replace(rows, rows=graph.tensors[t].shape[1])) for t in activations)
        else:
            if len(activations) != 1 or activations[0] != op.inputs[0]:
                return None
            ins = ((op.inputs[0], rows),)
        for t, _ in ins:
            if t not in produced.values():
                outside_inputs.add(t)
        reads[op_index] = ins
        produced[op_index] = op.outputs[0]
    if len(outside_inputs) != 1:
        return None
    (x,) = outside_inputs
    y = produced[ops[-1]]
    graph_outputs = set(graph.outputs)
    for t in produced.values():
        if t == y:
            continue
        if t in graph_outputs or t in kept or not readers.get(t) or not readers[t] <= inside:
            return None
    if x in graph_outputs or not graph.tensors[x].shape or len(graph.tensors[x].shape) != 4:
        return None
    if x in streams and not readers.get(x, set()) <= inside:
        return None
    tensors = {x, *produced.values()}
    accumulator = accumulator_bytes(bindings[ops[-1]], graph) if len(ops) > 1 else 0
    if any(len(graph.tensors[t].shape) != 4 or graph.tensors[t].shape[0] != 1
           or graph.tensors[t].shape[1] < 2 for t in tensors if t != y or not accumulator):
        return None  # rows of NHWC tensors, but a reducing op's output
    return Chain(first, last, ops, x, y, reads,
                 {t: graph.tensors[t].nbytes // graph.tensors[t].shape[1] for t in tensors},
                 {t: graph.tensors[t].shape[1] for t in tensors}, produced, x in streams,
                 y in streams and y in graph_outputs and not readers.get(y) and not accumulator,
                 accumulator)


def stripe_chain(chain: Chain, height: int, graph: Graph,
                 bindings: Sequence[Binding | None], pace: int = ON_DEMAND) -> Segment | None:
    """The stripes of `chain` at `height` output rows each, the stripe buffers they need and
    how far the output must start below the input. A streamed input is buffered as the
    intermediates are, its rows fetched as the stripes first need them; a streamed output
    keeps one stripe's rows, handed on after it (it lies over nothing: no shift).

    By default each stripe makes what its output rows need (`demanded_rows`), so the first
    stripe makes every op's whole reach at once; a wavefront (`pace` WAVEFRONT or ROW_BY_ROW,
    `wavefront_rows`) lets each op make at most its share of rows a stripe, so the first
    stripes fill the chain a little at a time and the stripe buffers keep only the steady
    state's rows. None if it stalls. A chain ending in a reducing op: `reduced_chain`."""
    if chain.accumulator:
        return reduced_chain(chain, height, graph, bindings, pace)
    x, y, ops = chain.input, chain.output, chain.ops
    intermediates = [chain.produced[o] for o in ops[:-1]]
    consumers: dict[int, list[tuple[int, RowMap]]] = {t: [] for t in (x, *intermediates)}
    for op_index in ops:
        for t, rows in chain.reads[op_index]:
            consumers[t].append((chain.produced[op_index], rows))
    if chain.streamed:
        intermediates.insert(0, x)
    if chain.streamed_output:  # one stripe's rows, handed on after it
        intermediates.append(y)
        consumers[y] = []
    computed = {t: 0 for t in (x, *chain.produced.values())}
    capacity = dict.fromkeys(intermediates, 0)
    previous_base = dict.fromkeys(intermediates, 0)
    stripes, moved, shift = [], 0, 0
    rows_of = (demanded_rows if pace == ON_DEMAND
               else partial(wavefront_rows, row_by_row=pace == ROW_BY_ROW))
    for start, need in rows_of(chain, height, consumers):
        bases = tuple(first_needed(consumers[t], start) if consumers[t] else start[t]
                      for t in intermediates)
        kept = tuple(max(0, computed[t] - base) for t, base in zip(intermediates, bases,
                                                                   strict=True))
        moved += sum(k * chain.row_bytes[t] for k, t, base in zip(kept, intermediates, bases,
                                                                  strict=True)
                     if k and previous_base[t] != base)
        work = []
        for op_index in ops:
            out = chain.produced[op_index]
            if need[out] > start[out]:
                reads = tuple((t, rows.first(start[out]), rows.end(need[out] - 1))
                              for t, rows in chain.reads[op_index])
                work.append(OpRows(op_index, start[out], need[out], reads))
        for t, base in zip(intermediates, bases, strict=True):
            capacity[t] = max(capacity[t], need[t] - base)
        fetch = (computed[x], need[x]) if chain.streamed else (0, 0)
        emit = (computed[y], need[y]) if chain.streamed_output else (0, 0)
        computed = need
        previous_base.update(zip(intermediates, bases, strict=True))
        stripe = Stripe(bases, kept, tuple(work), first_needed(consumers[x], computed), fetch,
                        emit)
        if not chain.streamed and not chain.streamed_output and work:
            shift = max(shift, need[y] * chain.row_bytes[y]
                        - stripe.input_alive_from(len(work) - 1, x) * chain.row_bytes[x])
        stripes.append(stripe)
    if computed[y] < chain.rows[y]:
        return None
    buffers = tuple(StripeBuffer(t, capacity[t], chain.row_bytes[t]) for t in intermediates)
    per_row = {o: op_macs(graph, bindings[o]) // chain.rows[chain.produced[o]] for o in ops}
    macs = sum((w.out_hi - w.out_lo) * per_row[w.op] for s in stripes for w in s.ops)
    return Segment(chain.first, chain.last, ops, x, y, height, buffers,
                   tuple(stripes), max(0, shift), moved, macs,
                   sum(per_row[o] * chain.rows[chain.produced[o]] for o in ops), chain.streamed,
                   pace, chain.streamed_output)


def reduced_chain(chain: Chain, height: int, graph: Graph, bindings: Sequence[Binding | None],
                  pace: int) -> Segment | None:
    """A chain ending in a reducing op: the ops before it striped as if they streamed its input
    out (a stripe buffer of one stripe's rows), the reducing op adding those rows up each stripe
    instead (its accumulators after them), and writing its output, the segment's, in the last.
    The output lies over the input's rows dead by then."""
    reducer, t = chain.ops[-1], chain.striped
    segment = stripe_chain(replace(chain, ops=chain.ops[:-1], output=t, streamed_output=True,
                                   accumulator=0), height, graph, bindings, pace)
    if segment is None:
        return None
    stripes = []
    for stripe in segment.stripes:
        lo, hi = stripe.emit
        adds = (OpRows(reducer, 0, int(hi == chain.rows[t]), ((t, lo, hi),)),) if hi > lo else ()
        stripes.append(replace(stripe, ops=stripe.ops + adds, emit=(0, 0)))
    *buffers, rows = segment.buffers
    shift = 0 if chain.streamed else max(0, graph.tensors[chain.output].nbytes
                                         - stripes[-1].input_done_to * chain.row_bytes[chain.input])
    macs = op_macs(graph, bindings[reducer])
    return replace(segment, last=chain.last, ops=chain.ops, output=chain.output,
                   buffers=(*buffers, replace(rows, accumulator=chain.accumulator)),
                   stripes=tuple(stripes), shift=shift, macs=segment.macs + macs,
                   whole_macs=segment.whole_macs + macs, streamed_output=False)


def column_map(binding: Binding, graph: Graph) -> RowMap | None:
    """How the op's output columns read its first input's columns, or None if it cannot be cut
    into columns."""
    striping = striping_of(binding)
    if striping is None or striping.columns is None:
        return None
    found = striping.columns(binding.params)
    width = graph.tensors[graph.operators[binding.op].inputs[0]].shape[2]
    return None if found is None else replace(found, rows=width)


def tile_of(chain: Chain, graph: Graph, bindings: Sequence[Binding | None], lo: int,
            hi: int) -> Tile | None:
    """The columns each tensor of the chain needs for output columns [lo, hi), backwards from
    the output; None where an op cannot be cut into columns or a tensor has two readers (a
    kernel reads its input's rows whole, so each tensor's columns must be its one reader's)."""
    spans = {chain.output: (lo, hi)}
    for op_index in reversed(chain.ops):
        columns = column_map(bindings[op_index], graph)
        if columns is None:
            return None
        first, last = spans[chain.produced[op_index]]
        for t, _ in chain.reads[op_index]:
            if t in spans:
                return None
            spans[t] = (columns.first(first), columns.end(last - 1))
    return Tile(tuple((t, a, b) for t, (a, b) in sorted(spans.items())))


def column_tiled(segment: Segment, chain: Chain, count: int, graph: Graph,
          bindings: Sequence[Binding | None]) -> Segment | None:
    """`segment` (a streamed chain's, striped with an output stripe buffer) run in `count`
    column tiles of the output's width: its stripe buffers as wide as the widest tile's
    columns, the input's with a whole row to stage fetched rows in, and its MACs those of every
    tile (the columns two tiles share are computed twice). None if the chain cannot be cut."""
    width = graph.tensors[chain.output].shape[2]
    if count > width or not segment.streamed or not segment.streamed_output:
        return None
    tiles = []
    for k in range(count):
        tile = tile_of(chain, graph, bindings, k * width // count, (k + 1) * width // count)
        if tile is None:
            return None
        tiles.append(tile)

    def row_bytes(t: int, tile: Tile) -> int:
        lo, hi = tile.span(t)
        return chain.row_bytes[t] // graph.tensors[t].shape[2] * (hi - lo)

    buffers = tuple(replace(b, row_bytes=max(row_bytes(b.tensor, tile) for tile in tiles),
                            staging=chain.row_bytes[b.tensor] if b.tensor == chain.input else 0)
                    for b in segment.buffers)
    per_pixel = {o: op_macs(graph, bindings[o]) // (chain.rows[chain.produced[o]]
                                                     * graph.tensors[chain.produced[o]].shape[2])
                 for o in chain.ops}
    rows = {o: sum(w.out_hi - w.out_lo for stripe in segment.stripes for w in stripe.ops
                   if w.op == o) for o in chain.ops}
    spans = {o: [tile.span(chain.produced[o]) for tile in tiles] for o in chain.ops}
    macs = sum(rows[o] * per_pixel[o] * (hi - lo) for o in chain.ops for lo, hi in spans[o])
    once = sum(rows[o] * per_pixel[o] * len({c for lo, hi in spans[o] for c in range(lo, hi)})
               for o in chain.ops)
    moved = sum(kept * row_bytes(b.tensor, tile) for tile in tiles
                for before, stripe in pairwise(segment.stripes)
                for b, kept, base, previous in zip(buffers, stripe.kept, stripe.bases,
                                                   before.bases, strict=True)
                if kept and base != previous)
    return replace(segment, buffers=buffers, macs=macs, moved_bytes=moved,
                   streamed_output=False, tiles=tuple(tiles), recomputed=macs - once)


def tile_params(segment: Segment, tile: Tile, graph: Graph, params: Sequence[Any]) -> list[Any]:
    """Each op's params cut to its columns in `tile` (the rest as they are)."""
    cut = list(params)
    for o in segment.ops:
        op = graph.operators[o]
        lo, hi = tile.span(op.outputs[0])
        in_lo, in_hi = tile.span(op.inputs[0])
        cut[o] = REGISTRY[op.kind].striping.column_band(params[o], lo, hi, in_lo, in_hi)
    return cut


Rows = dict[int, int]  # tensor -> a row count: the first row an op makes, or rows made so far


def demanded_rows(chain: Chain, height: int, consumers: Mapping[int, Sequence[tuple[int, RowMap]]]
                  ) -> Iterator[tuple[Rows, Rows]]:
    """Per stripe of `height` output rows: the first row each tensor makes, and the rows each
    has made after it, backwards from the output (an intermediate skips rows no window reads:
    a strided 1x1 convolution's)."""
    x, y = chain.input, chain.output
    computed = {t: 0 for t in (x, *chain.produced.values())}
    for lo in range(0, chain.rows[y], height):
        need = dict(computed)
        need[y] = min(lo + height, chain.rows[y])
        start: dict[int, int] = {}
        for op_index in reversed(chain.ops):
            out = chain.produced[op_index]
            start[out] = computed[out] if out == y else max(computed[out],
                                                             first_needed(consumers[out], start))
            need[out] = max(need[out], start[out])
            if need[out] > start[out]:
                for t, rows in chain.reads[op_index]:
                    if t != x or chain.streamed:
                        need[t] = max(need[t], rows.end(need[out] - 1))
        start[x] = computed[x]
        yield start, need
        computed = need


def wavefront_rows(chain: Chain, height: int,
                   consumers: Mapping[int, Sequence[tuple[int, RowMap]]],
                   row_by_row: bool = False) -> Iterator[tuple[Rows, Rows]]:
    """Per stripe: each op, in order, makes as many rows as its inputs allow, up to its share
    (the rows `height` output rows take of it, through the strides after it; `row_by_row`:
    `height`, an op after a stride making its rows every other stripe); a streamed input's
    rows are fetched for its readers' shares. Stops early if a stripe makes nothing."""
    x, y = chain.input, chain.output
    share = {y: height}
    for op_index in reversed(chain.ops):
        for t, rows in chain.reads[op_index]:
            share[t] = height if row_by_row else max(
                share.get(t, 0), share[chain.produced[op_index]] * rows.stride)
    computed = {t: 0 for t in (x, *chain.produced.values())}
    while computed[y] < chain.rows[y]:
        need = dict(computed)
        if chain.streamed:
            need[x] = max(rows.end(min(chain.rows[out], computed[out] + share[out]) - 1)
                          for out, rows in consumers[x])
        for op_index in chain.ops:
            out = chain.produced[op_index]
            made, most = computed[out], min(chain.rows[out], computed[out] + share[out])
            while made < most and all(
                    rows.end(made) <= (need[t] if t != x or chain.streamed else chain.rows[x])
                    for t, rows in chain.reads[op_index]):
                made += 1
            need[out] = made
        if need == computed:
            return
        yield dict(computed), need
        computed = need


def stripe_scratch_fits(binding: Binding, params: Any) -> bool:
    """Whether a stripe's kernel (`params`) asks for no more scratch than its whole op: no
    more requests (a reducing band asks none), none larger."""
    spec = binding.variant if binding.variant is not None else REGISTRY[binding.opcode]
    asked = spec.scratch(params) if spec.scratch else ()
    return len(asked) <= len(binding.scratch) and all(
        a.size <= b.size for a, b in zip(asked, binding.scratch, strict=False))


def fits_scratch(segment: Segment, graph: Graph, bindings: Sequence[Binding | None], params,
                 bands: dict[tuple, bool] | None = None) -> bool:
    """Whether every stripe of the segment (in each of its column tiles) runs in its ops'
    planned scratch; `bands` keeps what each band of an op's rows gave (many stripes and
    segments cut an op alike)."""
    bands = {} if bands is None else bands

    def fits(w: OpRows, tile: Tile | None, cut: Sequence[Any]) -> bool:
        binding = bindings[w.op]
        op = graph.operators[w.op]
        columns = (tile.span(op.outputs[0]), tile.span(op.inputs[0])) if tile else None
        key = (w.op, kernel_name(binding), w.out_lo, w.out_hi, *w.reads[0][1:], columns)
        if key not in bands:
            bands[key] = stripe_scratch_fits(binding, striped_params(
                binding.opcode, cut[w.op], w.out_lo, w.out_hi, *w.reads[0][1:]))
        return bands[key]

    tiles = [(tile, tile_params(segment, tile, graph, params)) for tile in segment.tiles] \
        or [(None, params)]
    return all(fits(w, tile, cut) for tile, cut in tiles for s in segment.stripes for w in s.ops)


def kernel_name(binding: Binding | None) -> str | None:
    """The target kernel an op runs (None: the portable one)."""
    return binding.variant.name if binding is not None and binding.variant is not None else None


@dataclass
class TilingMemo:
    """What the tiling searches of one model's plans on one target share (the hold plans it
    again with a few ops' kernels narrowed): the segments built, by their steps and schedule
    (None where the chain stalls or cannot be cut so); whether each runs in the scratch of its
    ops' kernels, by those kernels too; whether a band of an op's rows fits its kernel's
    scratch; and how the tensors and stripe buffers of the whole-op problem load the steps, and
    what each segment changes in that, by what else lays them out
    (toolchain.lower.plan.tiling_loads), then by the segment."""

    segments: dict[tuple, Segment | None] = field(default_factory=dict)
    fits: dict[tuple, bool] = field(default_factory=dict)
    bands: dict[tuple, bool] = field(default_factory=dict)
    deltas: dict[tuple, dict[tuple, tuple[dict[int, int], dict[int, int]]]] = field(
        default_factory=dict)


def first_needed(consumers: Sequence[tuple[int, RowMap]], made: Mapping[int, int]) -> int:
    """The first row of a tensor its consumers still read, each making its rows from `made`."""
    return min(rows.first(made[out]) for out, rows in consumers)


def model_macs(graph: Graph, bindings: Sequence[Binding | None]) -> int:
    """Multiply-accumulates of every op, run whole: what `--max-recompute` is a share of."""
    return sum(op_macs(graph, b) for b in bindings)


def op_macs(graph: Graph, binding: Binding | None) -> int:
    """Multiply-accumulates of the op, as its kernel counts them (0 for ops that count none)."""
    if binding is None or isinstance(binding.params, Elided):
        return 0
    striping = striping_of(binding)
    if striping is not None and striping.macs is not None:
        return striping.macs(binding.params)
    spec = REGISTRY[binding.opcode]
    return spec.macs(binding.params) if spec.macs is not None else 0


def readers_of(graph: Graph) -> dict[int, set[int]]:
    readers: dict[int, set[int]] = {}
    for op in graph.operators:
        for t in op.inputs:
            if t >= 0:
                readers.setdefault(t, set()).add(op.index)
    return readers


def candidates(graph: Graph, bindings: Sequence[Binding | None], order: Sequence[int],
               kept: frozenset[int] = frozenset(),
               streams: frozenset[int] = frozenset()) -> list[Chain]:
    """Every run of 2 to MAX_SEGMENT_OPS steps that may stripe (MAX_STREAMED_OPS from an op
    reading an input in `streams` or to an op that reduces its input, and 1 step too from an
    op reading or making a tensor in `streams`: a streamed input or output needs a segment)."""
    readers = readers_of(graph)
    position = {op: step for step, op in enumerate(order)}
    found = []
    for first in range(len(order)):
        op = graph.operators[order[first]]
        streamed = bool(streams) and any(t in streams for t in op.inputs)
        alone = streamed or bool(streams) and any(t in streams for t in op.outputs)
        longest = MAX_STREAMED_OPS if streamed else MAX_SEGMENT_OPS
        end = min(len(order), first + longest)
        # A chain of two steps or more must read the first op's output inside it (chain_at):
        # one read later than `end` (a wide graph's branches, all read by one op at the end)
        # leaves none to look at.
        made = readers.get(op.outputs[0], ()) if op.outputs else ()
        if not made or max(position.get(r, end) for r in made) >= end:
            end = min(end, first + 1)
        reach = max(end, min(len(order), first + MAX_STREAMED_OPS)) if end > first + 1 else end
        for last in range(first + (0 if alone else 1), reach):
            if row_map_of(graph, bindings, order[last]) is None \
                    and not fused_away(bindings[order[last]]):
                break
            if last >= end and not accumulator_bytes(bindings[order[last]], graph):
                continue
            chain = chain_at(graph, bindings, order, first, last, readers, kept, streams)
            if chain is not None:
                found.append(chain)
    return found


def fused_away(binding: Binding | None) -> bool:
    """A PAD fused into the window after it (toolchain.lower.fusion), or an op folded into a
    constant (toolchain.lower.folding): a step that does nothing, which a segment runs
    through."""
    return binding is not None and isinstance(binding.params, Elided)


def row_map_of(graph: Graph, bindings: Sequence[Binding | None], op: int) -> RowMap | None:
    binding = bindings[op]
    return None if binding is None else row_map(binding, graph)


def schedules(chain: Chain) -> list[Schedule]:
    """The schedules the search tries for a chain, tallest stripes first, each on demand
    before as a wavefront (fewer stripes among equals), and at one row row by row last (a
    chain that cannot run in column tiles: a streamed one takes those instead), each in whole
    rows before in column tiles (a streamed chain's: TILE_COUNTS)."""
    rows = chain.rows[chain.striped]
    counts = (TILE_COUNTS if chain.streamed and not chain.streamed_output
              and not chain.accumulator else (1,))
    return [(h, pace, n) for h in sorted(STRIPE_HEIGHTS, reverse=True) if h < rows
            for pace in (ON_DEMAND, WAVEFRONT, ROW_BY_ROW) for n in counts
            if pace != ROW_BY_ROW or (h == 1 and counts == (1,))]


Score = tuple[int, int]
# The one schedule of a segment added away from the others: one row at a time, on demand, in
# whole rows (the fewest rows held).
ADDED_SCHEDULE: Schedule = (1, ON_DEMAND, 1)


def with_segment(tiling: Tiling, segment: Segment) -> Tiling:
    """`tiling` with `segment` in place of the segments whose steps it meets."""
    others = tuple(s for s in tiling.segments if s.last < segment.first or s.first > segment.last)
    return Tiling(tuple(sorted((*others, segment), key=lambda s: s.first)))


def trials(tiling: Tiling, chain: Chain, build: Callable[[Chain, Schedule], Segment | None],
           only: Schedule | None = None) -> Iterator[Tiling]:
    """`tiling` with the chain's segment, in each schedule it builds in (or `only` that one),
    in place of the segments it meets."""
    for schedule in schedules(chain) if only is None else [only]:
        segment = build(chain, schedule)
        if segment is not None:
            yield with_segment(tiling, segment)


def choose_tiling(chains: Sequence[Chain], build: Callable[[Chain, Schedule], Segment | None],
                  evaluate: Callable[[Tiling], tuple[Score, int]],
                  start: Tiling = NO_TILING) -> Tiling:
    """Segments that lower the peak: from `start`, while some chain over the peak step
    (`evaluate` gives the score (peak, sum of loads) and the peak step) lowers the score, take
    the best of them with its best stripe height (the tallest among equals: fewer stripes), in
    place of the chosen segments it meets."""
    tiling = start
    score, peak = evaluate(tiling)
    for _ in range(4 * len(chains) + 1):
        best = None
        for chain in chains:
            if not chain.first <= peak <= chain.last:
                continue
            for trial in trials(tiling, chain, build):
                found, at = evaluate(trial)
                if found < (best[0] if best else score):
                    best = (found, at, trial)
        if best is None:
            return tiling
        score, peak, tiling = best
    return tiling


def neighbours(tiling: Tiling, chains: Sequence[Chain],
               build: Callable[[Chain, Schedule], Segment | None],
               evaluate: Callable[[Tiling], tuple[Score, int]],
               below: int, apart: bool = False, added: bool = True
               ) -> list[tuple[Score, Tiling]]:
    """The tilings one segment away from `tiling` (a chain meeting one of its segments, at any
    height, in place of the segments it meets; with `apart`, a chain meeting none, added)
    whose peak is below `below`, with their scores, best first (none `apart` unless `added`).

    The peak counts bytes, not where they go: a segment with a higher peak may still plan
    smaller, when the one chosen leaves a run of outputs each a little below its input (each
    shift stacks on the one before) and the other takes that run inside, or a segment away
    from the peak takes it (tried in ADDED_SCHEDULE only: there are many more of them)."""
    found: dict[tuple, tuple[Score, Tiling]] = {}
    for chain in chains if added or not apart else ():
        if apart == any(chain.first <= s.last and s.first <= chain.last
                        for s in tiling.segments):
            continue
        for trial in trials(tiling, chain, build, ADDED_SCHEDULE if apart else None):
            if trial == tiling:
                continue
            score, _ = evaluate(trial)
            if score[0] < below:
                key = tuple((s.first, s.last, s.schedule) for s in trial.segments)
                found.setdefault(key, (score, trial))
    return sorted(found.values(), key=lambda f: (f[0], [(s.first, s.last, -s.height, s.pace,
                                                         len(s.tiles))
                                                        for s in f[1].segments]))


# -- runs of alike stripes: one C loop each ----------------------------------------------------


@dataclass(frozen=True)
class Run:
    """Stripes [start, start + count) that do the same work: the same rows through the same
    kernels at the same places in the stripe buffers, the segment input and output rows only
    moving on by a fixed number of rows per stripe. `rows[k][i]` is (row at stripe 0 of the run,
    rows per stripe) of the k-th op's i-th operand (its reads, then its output); None for an
    operand in a stripe buffer, whose place in it is the same in every stripe of the run.
    `fetch` is the same (row, rows per stripe) of the first row a streamed input's stripes
    fetch (None if the segment streams no input), `emit` of the first row a streamed output's
    stripes hand on (None if it streams no output). With a `period` of 2 the run is every other
    stripe, [start, start + 2 * count), its rows moving on by their step each two stripes: row
    by row, an op after a stride makes its row every other stripe, so the stripes alternate,
    and the runs of both phases share one loop."""

    start: int
    count: int
    rows: tuple[tuple[tuple[int, int] | None, ...], ...]
    fetch: tuple[int, int] | None = None
    emit: tuple[int, int] | None = None
    period: int = 1


def stripe_operands(segment: Segment, k: int) -> list[list[tuple[int, int]]]:
    """Per op of stripe k: (tensor, first row) of its reads, then of its output; last, the
    streamed input's first row fetched and the streamed output's first row handed on, each as
    an op of its own (tensor -1: in no stripe buffer)."""
    stripe = segment.stripes[k]
    fetched = [[(-1, stripe.fetch[0])]] if segment.streamed else []
    emitted = [[(-1, stripe.emit[0])]] if segment.emits else []
    return [*([*((t, lo) for t, lo, _ in w.reads), (segment.output if w.op == segment.ops[-1]
                                                    else -1, w.out_lo)]
              for w in stripe.ops), *fetched, *emitted]


def stripe_signature(segment: Segment, k: int, graph: Graph, params: Sequence[Any],
                     produced) -> tuple:
    """Stripe k's work, its places in the stripe buffers and its moves, without the rows of the
    segment input and output (which move on from stripe to stripe)."""
    stripe = segment.stripes[k]
    previous = segment.stripes[k - 1].bases if k else stripe.bases
    where = {b.tensor: i for i, b in enumerate(segment.buffers)}
    work = []
    for w in stripe.ops:
        out = produced[w.op]
        _, lo, hi = w.reads[0]
        places = tuple(None if t not in where else lo_t - stripe.bases[where[t]]
                       for t, lo_t, _ in w.reads)
        out_place = None if out not in where else w.out_lo - stripe.bases[where[out]]
        work.append((w.op, places, out_place,
                     band_key(graph.operators[w.op].kind, params[w.op], w.out_lo, w.out_hi, lo,
                              hi)))
    moves = tuple((kept, base - before) for kept, base, before
                  in zip(stripe.kept, stripe.bases, previous, strict=True))
    lo, hi = stripe.fetch
    fetch = (lo - stripe.bases[0], hi - lo) if segment.streamed else None
    lo, hi = stripe.emit
    emit = (lo - stripe.bases[-1], hi - lo) if segment.emits else None
    return (tuple(work), moves, fetch, emit)


def stripe_runs(segment: Segment, graph: Graph, params: Sequence[Any],
                produced: Mapping[int, int]) -> list[Run]:
    """The segment's stripes as runs of alike stripes, in order: where no stripe is like the
    next, runs of every other stripe, two by two (the phases of rows made row by row)."""
    where = {b.tensor for b in segment.buffers}
    n = len(segment.stripes)
    signatures = [stripe_signature(segment, k, graph, params, produced) for k in range(n)]
    operands = [stripe_operands(segment, k) for k in range(n)]

    def run(start: int, count: int, steps, period: int) -> Run:
        first = operands[start]
        steps = steps or [[0] * len(op) for op in first]
        rows = tuple(tuple(None if t in where else (row, step)
                           for (t, row), step in zip(op, op_steps, strict=True))
                     for op, op_steps in zip(first, steps, strict=True))
        emit = fetch = None
        if segment.emits:
            *rows, (emit,) = rows
        if segment.streamed:
            *rows, (fetch,) = rows
        return Run(start, count, tuple(rows), fetch, emit, period)

    runs: list[Run] = []
    k = 0
    while k < n:
        count, steps = repeats(signatures, operands, k, 1)
        if count == 1 and k + 3 < n:
            (count_a, steps_a), (count_b, steps_b) = (repeats(signatures, operands, k + i, 2)
                                                      for i in (0, 1))
            if min(count_a, count_b) > 1:
                count = min(count_a, count_b)
                runs += [run(k, count, steps_a, 2), run(k + 1, count, steps_b, 2)]
                k += 2 * count
                continue
        runs.append(run(k, count, steps, 1))
        k += count
    return runs


def repeats(signatures: Sequence[tuple], operands: Sequence[list[list[tuple[int, int]]]], k: int,
            period: int) -> tuple[int, list[list[int]] | None]:
    """How many times stripe k's work repeats, every `period` stripes from k, its operands'
    rows moving on by a fixed step each time, and those steps (None if it does not repeat)."""
    first, steps, count = operands[k], None, 1
    while k + count * period < len(signatures) and signatures[k + count * period] == signatures[k]:
        moved = [[row - row0 for (_, row), (_, row0) in zip(a, b, strict=True)]
                 for a, b in zip(operands[k + count * period], first, strict=True)]
        per = [[d // count if d % count == 0 else None for d in op] for op in moved]
        if steps is None:
            steps = per
        if per != steps or any(s is None for op in per for s in op):
            break
        count += 1
    return count, steps
