"""Generate C from a plan: a static arena, an offset table, const weights and one specialized
function per operator, all laid out by the Jinja templates in templates/c/.

Python computes every value (offsets, shapes, constants, kernel bodies' numbers); the templates
only place them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from toolchain import __version__
from toolchain.errors import ArenacError, ModelError, PlanError, UnsupportedOpError
from toolchain.ir import Graph, Tensor
from toolchain.lower.fusion import PadFusion
from toolchain.lower.lifetimes import STRIPE, overlap_pairs
from toolchain.lower.plan import ModelPlan, StateSlot, segment_overlaps
from toolchain.lower.tiling import (
    Segment,
    stripe_runs,
    stripe_scratch_fits,
    striped_params,
)
from toolchain.ops import REGISTRY
from toolchain.ops.emit import (
    C_TYPES,
    Callee,
    CBlock,
    CControl,
    CTensor,
    Kernel,
    OpContext,
    c_array,
    c_comment,
    c_float,
    c_int64,
    c_length,
    c_sum,
    helper_definitions,
    needs_math_h,
)
from toolchain.ops.spec import PORTABLE_C
from toolchain.planners import PooledPlacement, verify, verify_pools
from toolchain.render import render
from toolchain.targets import get_target
from toolchain.text import c_identifier, c_text

# The fixed-point functions every file may define (templates/c/model.c.j2): each is defined only
# where a kernel calls it, so that no compiler warns of an unused static function.
FIXED_POINT = ("arenac_srdhm", "arenac_rdbpot", "arenac_mbqm", "arenac_clamp")


@dataclass(frozen=True)
class IOInfo:
    """What the header says of one input or output (`name` spelled for a comment)."""

    index: int
    name: str
    ctype: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    scale: str
    zero_point: str
    in_arena: bool

    @property
    def array_length(self) -> int:
        """Elements to declare a buffer of it with (never zero)."""
        return c_length(math.prod(self.shape))

    @property
    def bytes_length(self) -> int:
        """Bytes to declare a byte buffer of it with (never zero)."""
        return c_length(self.nbytes)


@dataclass(frozen=True)
class SharedArena:
    """The one arena that models generated together run in, one at a time: as large and as
    aligned as the most demanding of them needs (`generate_shared`)."""

    symbol: str
    header: str
    bytes: int
    alignment: int
    models: tuple[str, ...]


# How NAME_arena comes to be: a static array of the file's own, or the caller's memory
# (`NAME_init(arena, bytes)`).
ARENAS = ("static", "extern")
SHARED_NAME = "arenac_shared"


def generate(mp: ModelPlan, name: str = "model", external_io: bool = False,
             arena: str = "static", shared: SharedArena | None = None,
             trace: bool = False) -> dict[str, str]:
    """File name -> text of NAME.h, NAME.c and the host harness NAME_main.c.

    `arena="extern"` leaves the arena to the caller, who hands it to NAME_init; `shared`
    puts the activations in an arena that other models' files use too. The plan is verified
    again here, whoever made it: C from an unsafe plan would corrupt its own activations
    without a word. With `trace`, invoke hands every tensor of `traced_tensors` to NAME_trace
    right after the step that wrote it, and the harness writes them to stdout before each
    set's outputs (`check --per-layer` on the C)."""
    name = c_identifier(name)
    graph = mp.graph
    source = mp.model.source
    check_graph(graph, source)
    check_plan(mp, external_io)
    if arena not in ARENAS:
        raise ArenacError(f"the arena is static or extern, not {arena!r}", source)
    if mp.pools and (arena != "static" or shared):
        raise ArenacError("memory pools are static arrays of the generated file: they take "
                          "neither --arena extern nor a shared arena", source)
    params = mp.program.params()
    target = get_target(mp.program.target, source)
    elsewhere = [b for b in mp.program.bindings
                 if PORTABLE_C not in b.kernel.targets and target.name not in b.kernel.targets]
    if elsewhere:
        raise UnsupportedOpError(f"no C kernel for {target.name} runs " + ", ".join(
            f"{mp.program.op_label(b.op)} {b.opcode} ({b.kernel.form})" for b in elsewhere),
            source)
    offsets = mp.offset_of_tensor()
    slot_of = {t: k for k, t in enumerate(offsets)}
    scratch = mp.scratch_offsets()
    pools = pool_arrays(mp, name)
    # Each slot of the offset table: the array it indexes and its offset there (tensors, then
    # scratch, as the table lists them).
    positions = [*mp.lifetimes.tensor_buffers.values(),
                 *(mp.lifetimes.buffer_of[r.key] for r in mp.lifetimes.scratch)]
    arena_symbol = shared.symbol if shared and arena == "static" else f"{name}_arena"
    places = [mp.place(i) for i in positions]
    array_of = [arena_symbol if k is None else pools[k]["symbol"] for k, _ in places]
    scratch_of: dict[int, list[str]] = {}  # op -> its scratch, by slot of the offset table
    stripe_slot: dict[int, int] = {}  # an intermediate -> the slot of its stripe buffer
    for k, (request, _) in enumerate(scratch, start=len(offsets)):
        if request.key.kind == STRIPE:
            stripe_slot[request.key.index] = k
            continue
        if request.kernel:  # else held only as TFLite Micro's kernel would hold it
            scratch_of.setdefault(request.op, []).append(f"({array_of[k]} + {name}_offsets[{k}])")
    program = mp.program
    state_at = {slot.tensor: slot for slot in mp.state_slots if slot.tensor is not None}
    external = set(graph.inputs) | set(graph.outputs) if external_io else set()
    # With the weights pinned to a RAM pool, kernels read their copy there.
    weights_at = mp.weights_layout[0] if mp.weights_pool is not None else {}

    def pointer(t: int) -> str:
        tensor = graph.tensors[t]
        if tensor.is_handle:  # a handle is its variable's bytes in the state block
            slot = mp.state_of_handle(t)
            if slot is None:
                return "NULL"  # names a variable that nothing assigns or reads
            return f"(({C_TYPES[slot.dtype]} *)({name}_state + {slot.offset}))"
        ctype = C_TYPES[tensor.dtype]
        if t in weights_at:
            return f"((const {ctype} *)({name}_weights + {weights_at[t]}))"
        if tensor.is_constant:
            return constant_name(t)  # kernels read a constant from flash, even an output's
        if t in external:
            if t in graph.inputs:
                return f"(({ctype} *){name}_io_in[{graph.inputs.index(t)}])"
            return f"(({ctype} *){name}_io_out[{graph.outputs.index(t)}])"
        if t in slot_of:
            return f"(({ctype} *)({array_of[slot_of[t]]} + {name}_offsets[{slot_of[t]}]))"
        if t in state_at:
            return f"(({ctype} *)({name}_state + {state_at[t].offset}))"
        return constant_name(t)

    def constant_name(t: int) -> str:
        return f"{name}_{program.tensor_symbol(t)}"

    def c_tensor(t: int) -> CTensor | None:
        if t < 0:
            return None
        tensor = graph.tensors[t]
        if tensor.is_handle:
            slot = mp.state_of_handle(t)
            variable = program.resources[program.handles[t]] if slot else None
            return CTensor(t, c_text(variable.name if variable else tensor.name),
                           slot.dtype if slot else "uint8", slot.shape if slot else (0,),
                           pointer(t), None, used)
        data = tensor.data if tensor.is_constant else None
        return CTensor(t, c_text(tensor.name), tensor.dtype, tensor.shape, pointer(t), data, used)

    order = mp.lifetimes.order
    steps_of: dict[int, list[int]] = {}  # subgraph -> its steps, in order
    for step, op_index in enumerate(order):
        steps_of.setdefault(program.op_origin(op_index)[0], []).append(step)
    fns = {op_index: kernel_function(name, mp, op_index) for op_index in order}
    used: set[int] = set()  # tensors some kernel points at
    kernel_of: dict[int, Kernel] = {}

    segment_of = {step: seg for seg in mp.tiling.segments
                  for step in range(seg.first, seg.last + 1)}

    def call(step: int) -> str:
        """The line that runs a step: a call, or for an op with no code a comment saying why."""
        op_index = order[step]
        if step in segment_of:
            seg = segment_of[step]
            what = f"step {step}: {mp.step_label(step)}"
            if step != seg.first:
                return f"/* {what}: runs in the stripes of step {seg.first} */"
            return f"{name}_stripes{step}(); /* steps {seg.first}-{seg.last} striped */"
        kernel = kernel_of[op_index]
        what = f"step {step}: {mp.step_label(step)}"
        if not kernel.text:
            return f"/* {what}: {kernel.note} */"
        return f"{fns[op_index]}(); /* {what} */"

    # Every op's kernel, a CALL_ONCE after the steps of the subgraph it runs (their calls are
    # its body); the file defines the kernels a CALL_ONCE calls before it, as C needs.
    texts: list[str] = []
    groups: list[str] = []  # the helper groups the kernels call
    flags = {slot.subgraph: f"{name}_state[{slot.offset}]"
             for slot in mp.state_slots if slot.kind == "call_once"}

    def byte_pointer(t: int) -> str:
        """Where a tensor's bytes are, for the copies of IF and WHILE."""
        if t in slot_of and t not in external:
            return f"{array_of[slot_of[t]]} + {name}_offsets[{slot_of[t]}]"
        used.add(t)
        return pointer(t)

    def copy_lines(moves, verb: str = "<-") -> tuple[str, ...]:
        """The statements of IF's and WHILE's copies, each after a comment saying what."""
        lines = []
        for move in moves:
            dst, src = graph.tensors[move.dst], graph.tensors[move.src]
            if dst.nbytes:
                lines.append(f"/* {program.tensor_label(move.dst)} '{c_text(dst.name)}' {verb} "
                             f"{program.tensor_label(move.src)} '{c_text(src.name)}' */")
                lines.append(f"memcpy({byte_pointer(move.dst)}, {byte_pointer(move.src)}, "
                             f"{dst.nbytes});")
        return tuple(lines)

    def c_control(op_index: int) -> CControl:
        """An IF's or WHILE's blocks as C, the kernels of their steps emitted first."""
        control = program.controls[op_index]
        blocks = []
        for block in control.blocks:
            emit_subgraph(block.subgraph)
            blocks.append(CBlock(c_subgraph(program, block.subgraph),
                                 (*(call(s) for s in steps_of.get(block.subgraph, ())),
                                  *copy_lines(block.copies))))
        return CControl(c_tensor(control.condition), tuple(blocks),
                        copy_lines(control.entry, "starts as"))

    def emit(context: OpContext) -> Kernel:
        op_index = context.op.index
        binding = program.bindings[op_index]
        emitter = binding.variant if binding.variant is not None else REGISTRY[context.op.kind]
        try:
            if isinstance(binding.params, PadFusion):
                return fused_kernel(program, binding.params)
            return emitter.emit(context)
        except ArenacError as e:  # an emitter's refusal names the op and the file
            raise type(e)(f"{program.op_label(op_index)} {context.op.opcode}: {e.message}",
                          source) from None

    def emit_segment(seg: Segment) -> None:
        """A striped segment's kernels, one per op and run of alike stripes, and the function
        that runs them stripe by stripe (toolchain.lower.tiling)."""
        produced = {o: graph.operators[o].outputs[0] for o in seg.ops}
        constants_of: dict[str, str] = {}  # file-scope constant -> its definition
        cursor = f"{name}_stripe{seg.first}"
        buffer_at = {b.tensor: (b, stripe_slot[b.tensor]) for b in seg.buffers}
        ops = ", ".join(program.op_label(o) for o in seg.ops)
        header_at = len(texts)  # the segment's comment, and its cursor where anything reads it
        texts.append("")
        keep = {b.tensor: f"rows{b.tensor}" for b in seg.buffers}
        moving: set[int] = set()  # the stripe buffers whose rows move up

        def rows_at(t: int, place, row: int, rows: int, start: int) -> CTensor:
            tensor = graph.tensors[t]
            ctype, elems = C_TYPES[tensor.dtype], tensor.num_elements // tensor.shape[1]
            if t in buffer_at:
                base = f"(({ctype} *)({arena_symbol} + {name}_offsets[{buffer_at[t][1]}]))"
                at = str(row)
            else:
                base = pointer(t)
                row0, per = place
                constant = row0 - per * start
                at = c_sum([(cursor, per)], constant) if per else str(row0)
            ptr = base if at == "0" else f"({base} + ({at}) * {elems})"
            return CTensor(t, c_text(tensor.name), tensor.dtype,
                           (1, rows, *tensor.shape[2:]), ptr, None, used)

        runs = []
        for run in stripe_runs(seg, params, produced):
            stripe = seg.stripes[run.start]
            previous = seg.stripes[run.start - 1].bases if run.start else stripe.bases
            lines = []
            for (b, _), kept, base, before in zip(buffer_at.values(), stripe.kept,
                                                  stripe.bases, previous):
                if kept and base != before:
                    at = keep[b.tensor]
                    moving.add(b.tensor)
                    lines.append(f"memmove({at}, {at} + {(base - before) * b.row_bytes}, "
                                 f"{kept * b.row_bytes}); /* keep its last "
                                 f"{'row' if kept == 1 else f'{kept} rows'} at the top */")
            for w, places in zip(stripe.ops, run.rows):
                op = graph.operators[w.op]
                _, lo, hi = w.reads[0]
                ins = [rows_at(t, place, r_lo - (stripe.bases[seg.buffer_of(t)]
                                                 if t in buffer_at else 0),
                               r_hi - r_lo, run.start)
                       for (t, r_lo, r_hi), place in zip(w.reads, places)]
                out_t = produced[w.op]
                out = rows_at(out_t, places[-1], w.out_lo - (
                    stripe.bases[seg.buffer_of(out_t)] if out_t in buffer_at else 0),
                    w.out_hi - w.out_lo, run.start)
                fn = f"{fns[w.op]}_stripes{run.start}"
                context = OpContext(
                    fn, f"{name}_{program.op_symbol(w.op)}s", op,
                    striped_params(params[w.op], w.out_lo, w.out_hi, lo, hi),
                    (*ins, *(c_tensor(t) for t in op.inputs[len(ins):])), (out,),
                    tuple(scratch_of.get(w.op, ())), None, program.op_label(w.op),
                    op_rows=graph.tensors[out_t].shape[1])
                if not stripe_scratch_fits(program.bindings[w.op], context.params):
                    raise PlanError(f"{program.op_label(w.op)} {op.opcode}: a stripe's kernel "
                                    "needs more scratch than the op's", source)
                # The runs of an op share its constants; one whose differ has its own.
                kernel = emit(context)
                text = shared_definitions(kernel.text, constants_of)
                if text is None:
                    prefix = f"{context.prefix}{run.start}"
                    kernel = emit(replace(context, prefix=prefix))
                    text = shared_definitions(
                        alike_renamed(kernel.text, prefix, context.prefix, constants_of),
                        constants_of)
                kernel_of[w.op] = kernel
                stripes = (f"stripes {run.start}-{run.start + run.count - 1}" if run.count > 1
                           else f"stripe {run.start}")
                texts.append(c_comment(
                    f"{program.op_label(w.op)} in {stripes} of step {seg.first}: "
                    f"{counted(w.out_hi - w.out_lo, 'output row')} of its "
                    f"{graph.tensors[out_t].shape[1]} from {counted(hi - lo, 'input row')}.")
                    + "\n" + text)
                groups.extend(kernel.helpers)
                then = f", then the next {w.out_hi - w.out_lo} each stripe" if run.count > 1 else ""
                rows = (f"row {w.out_lo}" if w.out_hi - w.out_lo == 1
                        else f"rows {w.out_lo}-{w.out_hi - 1}")
                lines.append(f"{fn}(); /* {program.op_label(w.op)}: output {rows}{then} */")
            runs.append({"loop": run.count > 1, "start": run.start,
                         "stop": run.start + run.count, "lines": lines})
        declarations = [f"uint8_t *const {keep[b.tensor]} = {arena_symbol} + "
                        f"{name}_offsets[{slot}]; /* {program.tensor_label(b.tensor)}: "
                        f"{b.rows} rows */" for b, slot in buffer_at.values() if b.tensor in moving]
        texts.append(render("c/stripes.c.j2", v={"fn": f"{name}_stripes{seg.first}",
                                                 "cursor": cursor, "runs": runs,
                                                 "declarations": declarations}))
        what = (f"Steps {seg.first}-{seg.last} ({ops}) run in {len(seg.stripes)} stripes of "
                f"{counted(seg.height, 'output row')}")
        # every stripe written out with constant rows reads no cursor: none is declared
        if re.search(rf"\b{cursor}\b", "\n".join(texts[header_at + 1:])):
            texts[header_at] = (c_comment(f"{what}; {cursor} is the stripe the kernels below "
                                          "are on.") + f"\nstatic int {cursor};")
        else:
            texts[header_at] = c_comment(f"{what}, each written out.")

    def emit_subgraph(subgraph: int) -> None:
        for step in steps_of.get(subgraph, ()):
            op_index = order[step]
            op = graph.operators[op_index]
            if step in segment_of:
                if step == segment_of[step].first:
                    emit_segment(segment_of[step])
                continue
            callee = None
            if op_index in program.calls:
                called = program.calls[op_index]
                emit_subgraph(called)
                callee = Callee(c_subgraph(program, called),
                                tuple(call(s) for s in steps_of.get(called, ())), flags[called])
            control = c_control(op_index) if op_index in program.controls else None
            context = OpContext(
                fns[op_index],
                f"{name}_{program.op_symbol(op_index)}",
                op,
                params[op_index],
                tuple(c_tensor(t) for t in op.inputs),
                tuple(c_tensor(t) for t in op.outputs),
                tuple(scratch_of.get(op_index, ())),
                callee,
                program.op_label(op_index),
                control,
                tuple(f"(({C_TYPES[slot.dtype]} *)({name}_state + {slot.offset}))"
                      for slot in mp.state_slots if slot.op == op_index),
                program.target,
            )
            kernel = emit(context)
            kernel_of[op_index] = kernel
            if kernel.text:
                texts.append(kernel.text)
            groups.extend(kernel.helpers)

    emit_subgraph(mp.graph_index)
    calls = [call(step) for step in steps_of.get(mp.graph_index, ())]
    if trace:
        traced: dict[int, list[int]] = {}
        for step, t in traced_tensors(mp):
            traced.setdefault(step, []).append(t)
        calls = [line for step, c in zip(steps_of.get(mp.graph_index, ()), calls)
                 for line in [c] + [f"{name}_trace({step}, {t}, {pointer(t)}, "
                                    f"{graph.tensors[t].nbytes}u);" for t in traced.get(step, ())]]
    input_ptrs = [pointer(t) for t in graph.inputs]
    output_ptrs = [pointer(t) for t in graph.outputs]
    copies = external_copies(graph, name) if external_io else []
    referenced = {*used, *graph.inputs, *graph.outputs}
    constants = [
        {
            "name": constant_name(t.index),
            "ctype": C_TYPES[t.dtype],
            "length": c_length(t.num_elements),
            "initializer": c_array(t.data),
            "comment": f"{program.tensor_label(t.index)} '{c_text(t.name)}' "
                       f"{t.dtype}{list(t.shape)}",
        }
        for t in graph.tensors
        if t.is_constant and t.index in referenced
    ]
    rows = {r.tensor: r for r in mp.rows()}
    offset_rows = [
        {
            "offset": places[k][1],
            "comment": f"{program.tensor_symbol(t)} '{c_text(rows[t].name)}': {rows[t].bytes} "
            f"bytes, ops {rows[t].first_op}-{rows[t].last_op}",
        }
        for k, t in enumerate(offsets)
    ] + [
        {
            "offset": places[k][1],
            "comment": f"scratch of {program.op_label(request.op)} ({c_text(request.purpose)}): "
            f"{request.size} bytes",
        }
        for k, (request, _) in enumerate(scratch, start=len(offsets))
    ]
    if mp.pools:  # say which pool each slot indexes
        for row, (k, _) in zip(offset_rows, places):
            row["comment"] = f"{mp.pools[k].pool.name}: {row['comment']}"
    state = [state_info(slot, k, name, program) for k, slot in enumerate(mp.state_slots)]
    image = bytearray(mp.state_bytes)  # what the state block starts as
    for slot in mp.state_slots:
        image[slot.offset : slot.offset + slot.nbytes] = slot.init
    inputs = [io_info(graph.tensors[t], i, t not in external) for i, t in enumerate(graph.inputs)]
    outputs = [
        io_info(graph.tensors[t], i, t not in external) for i, t in enumerate(graph.outputs)
    ]
    uses_float = any(t.dtype == "float32" for t in graph.tensors)
    helpers = helper_definitions(groups)
    words = c_words([*texts, *helpers])
    fixed_point = {f for f in FIXED_POINT if f in words}
    if "arenac_mbqm" in fixed_point:  # it calls both
        fixed_point |= {"arenac_srdhm", "arenac_rdbpot"}
    values = {
        "name": name,
        "guard": name.upper() + "_H",
        "version": __version__,
        "sha256": mp.model.sha256,
        "planner": mp.plan.planner,
        "alignment": mp.plan.alignment,
        "arena_bytes": mp.arena_bytes,
        "arena_length": c_length(mp.arena_bytes),
        "lower_bound_bytes": mp.overlap_bound_bytes,  # the bound of this plan (overlaps, stripes)
        "state_bytes": mp.state_bytes,
        "state_length": c_length(mp.state_bytes),
        "state_image": c_array(np.frombuffer(bytes(image), np.uint8)) if any(image) else None,
        "external_io": external_io,
        "inputs": inputs,
        "outputs": outputs,
        "input_ptrs": input_ptrs,
        "output_ptrs": output_ptrs,
        "uses_float": uses_float,
        "source_needs_math_h": uses_float
        or needs_math_h(c_words([*texts, *(c["initializer"] for c in constants)])),
        "header_needs_math_h": needs_math_h(c_words([io.scale for io in inputs + outputs])),
        "offsets": offset_rows,
        "constants": constants,
        "state": state,
        "helpers": helpers,
        "fixed_point": fixed_point,
        "includes": sorted({header for k in kernel_of.values() for header in k.includes}),
        "target": None if target.guard is None else {
            "name": target.name, "title": target.title, "guard": target.guard},
        "kernels": texts,
        "calls": calls,
        "copies": copies,
        "trace": trace,
        "arena": arena,
        "shared": shared,
        "pools": [p for p in pools if p["used"]],
        "all_pools": pools,
        "weights": None if mp.weights_pool is None else {
            "pool": mp.pools[mp.weights_pool].pool.name,
            "section": mp.pools[mp.weights_pool].pool.section,
            "bytes": mp.weights_layout[1],
            "length": c_length(mp.weights_layout[1]),
            "copies": [{"offset": offset, "source": constant_name(t),
                        "nbytes": graph.tensors[t].nbytes}
                       for t, offset in weights_at.items() if t in used],
        },
        "state_section": (mp.pools[mp.state_pool].pool.section
                          if mp.state_pool is not None else None),
        "state_pool": (mp.pools[mp.state_pool].pool.name
                       if mp.state_pool is not None else None),
        "sections": any(p["section"] for p in pools if p["used"]) or any(
            k is not None and mp.pools[k].pool.section is not None and nbytes > 0
            for k, nbytes in ((mp.state_pool, mp.state_bytes),
                              (mp.weights_pool, mp.weights_layout[1]))),
    }
    return {
        f"{name}.h": render("c/model.h.j2", **values),
        f"{name}.c": render("c/model.c.j2", **values),
        f"{name}_main.c": render("c/harness.c.j2", **values),
    }


# The first name a top-level definition gives: `static const int8_t NAME[4] = ...`,
# `static void NAME(void) {`.
DEFINED_NAME = re.compile(r"\b(\w+)\s*[\[(]")
TOP_LEVEL_STARTS = ("static", "ARENAC_", "/*", "#")
MACROS = re.compile(r"\bARENAC_\w+(?:\([^)]*\))?\s*")  # ARENAC_ALIGN(4), ARENAC_DSP_KERNEL


def top_level_items(text: str) -> list[tuple[str | None, str]]:
    """A kernel's text as its top-level items, each with the comment above it, and the name it
    defines (None for one that defines nothing, such as a lone comment)."""
    items: list[list[str]] = []

    def definition(lines: list[str]) -> str | None:
        return next((x for x in lines if x.startswith(("static", "ARENAC_"))), None)

    for line in text.splitlines(keepends=True):
        below_its_comment = (items and items[-1][0].startswith("/*")
                             and definition(items[-1]) is None and not line.startswith("/*"))
        if not items or line.startswith(TOP_LEVEL_STARTS) and not below_its_comment:
            items.append([line])
        else:
            items[-1].append(line)
    named = []
    for lines in items:
        head = definition(lines)
        found = DEFINED_NAME.search(MACROS.sub("", head).split("=")[0]) if head else None
        named.append((found.group(1) if found else None, "".join(lines)))
    return named


def shared_definitions(text: str, defined: dict[str, str]) -> str | None:
    """A kernel's text without what an earlier kernel defined alike (recording its own), or
    None when it defines a name an earlier one defined otherwise."""
    items = top_level_items(text)
    if any(n is not None and defined.get(n, d) != d for n, d in items):
        return None
    kept = []
    for n, d in items:
        if n is None or n not in defined:
            kept.append(d)
        if n is not None:
            defined[n] = d
    return "".join(kept)


def alike_renamed(text: str, prefix: str, earlier: str, defined: Mapping[str, str]) -> str:
    """A kernel emitted under `prefix` because one of its names clashed with the kernel under
    `earlier`: each of its definitions equal to the earlier one's, but for the name, dropped
    and its uses renamed to that one, so only what differs is defined twice."""
    items = top_level_items(text)
    renames = {}
    for n, d in items:
        if n is None or not n.startswith(f"{prefix}_"):
            continue
        before = f"{earlier}{n[len(prefix):]}"
        if defined.get(before) == re.sub(rf"\b{re.escape(n)}\b", before, d):
            renames[n] = before
    if not renames:
        return text
    kept = "".join(d for n, d in items if n not in renames)
    return re.sub(rf"\b({'|'.join(map(re.escape, renames))})\b", lambda m: renames[m[1]], kept)


def counted(n: int, noun: str) -> str:
    """"1 row", "3 rows"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def traced_tensors(mp: ModelPlan) -> list[tuple[int, int]]:
    """(step, tensor) of every value the main graph's ops write, in execution order: what a
    per-layer check compares (a called subgraph's tensors and resource handles excepted)."""
    graph, program = mp.graph, mp.program
    main = set(program.ops_of(program.graph_index))
    striped = mp.tiling.intermediates()  # never whole: only their stripes' rows exist
    return [(step, t) for step, op in enumerate(mp.lifetimes.order) if op in main
            for t in graph.operators[op].outputs
            if t >= 0 and not graph.tensors[t].is_handle and t not in striped]


def pool_arrays(mp: ModelPlan, name: str) -> list[dict]:
    """What the templates say of each memory pool's array (none without pools); a pool that
    holds no buffer gets no array, which nothing would use."""
    return [
        {
            "name": a.pool.name,
            "symbol": f"{name}_{a.pool.name}_arena",
            "macro": f"{name.upper()}_POOL_{a.pool.name.upper()}_BYTES",
            "bytes": a.bytes,
            "length": c_length(a.bytes),
            "capacity": a.pool.capacity,
            "section": a.pool.section,
            "reserved": a.reserved,
            "reserved_for": mp.reserved_in(k),
            "used": any(p == k for p in mp.pool_of) and a.bytes > 0,
        }
        for k, a in enumerate(mp.pools)
    ]


def generate_shared(models: list[tuple[ModelPlan, str]], external_io: bool = False,
                    arena: str = "static") -> dict[str, str]:
    """Several models' files sharing one arena, for models that run one at a time: each
    model's NAME.h, NAME.c and NAME_main.c with its own prefixed API and state block, and
    arenac_shared.h/.c defining the arena, sized to the largest (with `arena="extern"` the
    caller's, handed to every model's NAME_init, so no arenac_shared files)."""
    names = [c_identifier(n) for _, n in models]
    folded = [n.upper() for n in names]  # header guards and macros are NAME in upper case
    repeated = sorted({n for n, f in zip(names, folded) if folded.count(f) > 1})
    if repeated:
        raise ArenacError(f"two models would both be called {repeated[0]!r} (or names that "
                          "differ only in case, which header guards and macros spell alike): "
                          "give each its own --name")
    if SHARED_NAME.upper() in folded:
        raise ArenacError(f"the name {SHARED_NAME!r} is the shared arena's; choose another")
    shared = SharedArena(f"{SHARED_NAME}_arena", f"{SHARED_NAME}.h",
                         max(mp.arena_bytes for mp, _ in models),
                         max(mp.plan.alignment for mp, _ in models), tuple(names))
    files: dict[str, str] = {}
    for (mp, _), name in zip(models, names):
        own = generate(mp, name, external_io, arena, shared)
        taken = {f.lower() for f in files} & {f.lower() for f in own}
        if taken:  # `a` and `a_main`: a's harness is a_main.c, the other's model file
            raise ArenacError(f"two models' files would both be {sorted(taken)[0]}: give them "
                              "--name values whose files differ", mp.model.source)
        files.update(own)
    if arena == "static":
        values = {"shared": shared, "guard": SHARED_NAME.upper() + "_H",
                  "macro": SHARED_NAME.upper() + "_ARENA_BYTES",
                  "length": c_length(shared.bytes),
                  "models": [{"name": n, "bytes": mp.arena_bytes}
                             for (mp, _), n in zip(models, names)]}
        files[f"{SHARED_NAME}.h"] = render("c/shared.h.j2", **values)
        files[f"{SHARED_NAME}.c"] = render("c/shared.c.j2", **values)
    return files


def fused_kernel(program, fusion: PadFusion) -> Kernel:
    """A PAD fused into the op reading it has no code: that op pads as it reads."""
    reader = program.graph.operators[fusion.op]
    return Kernel("", note=f"fused into {program.op_label(fusion.op)} {reader.opcode}, "
                           "which reads its input as padded")


def kernel_function(name: str, mp: ModelPlan, op: int) -> str:
    """The C function of one op's kernel: NAME_op3_add, NAME_sg1_op0_assign_variable,
    NAME_op2_signal_rfft (a custom op by its code)."""
    operator = mp.graph.operators[op]
    kind = operator.opcode
    if kind == "CUSTOM":  # only registered codes get here: CamelCase letters
        kind = re.sub(r"[^A-Za-z0-9_]", "", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", operator.kind))
    return f"{name}_{mp.program.op_symbol(op)}_{kind.lower()}"


def c_subgraph(program, graph: int) -> str:
    """A subgraph as comments name it: its index, and its name spelled for a comment."""
    name = program.model.graphs[graph].name
    return f"{graph} '{c_text(name)}'" if name else str(graph)


def state_info(slot: StateSlot, k: int, name: str, program) -> dict:
    """What the templates say of one slot of the state block: where it is, how a reset
    restores it (one byte value, or a copy of `init`), and what it is in words."""
    if slot.kind == "variable":
        what = (f"{program.tensor_label(slot.tensor)} '{c_text(slot.name)}' "
                f"{slot.dtype}{list(slot.shape)}")
        if slot.dtype == "int8" and slot.fill:  # the byte of an int8 variable's zero point
            what += f", its zero point {slot.fill - 256 if slot.fill > 127 else slot.fill}"
    elif slot.kind == "resource":
        what = f"resource variable '{c_text(slot.name)}' {slot.dtype}{list(slot.shape)}"
    elif slot.kind == "kernel":
        what = f"{c_text(slot.name)}, {slot.dtype}{list(slot.shape)}"
    else:
        what = f"whether CALL_ONCE ran subgraph {c_subgraph(program, slot.subgraph)}"
    span = (f"byte {slot.offset}" if slot.nbytes <= 1
            else f"bytes {slot.offset}-{slot.offset + slot.nbytes - 1}")
    return {
        "offset": slot.offset,
        "nbytes": slot.nbytes,
        "length": c_length(slot.nbytes),
        "fill": slot.fill if slot.nbytes else 0,
        "init": None if slot.fill is not None or not slot.nbytes
        else c_array(np.frombuffer(slot.init, np.uint8)),
        "init_name": f"{name}_state_init{k}",
        "comment": what,
        "span": span,
    }


def external_copies(graph: Graph, name: str) -> list[dict]:
    """With external I/O, the caller's output buffers that no kernel writes: an output that is
    a constant or a graph input, or a tensor listed again as a later output, is copied there
    after the kernels ran."""
    written = {t for op in graph.operators for t in op.outputs}
    first = {}
    copies = []
    for j, t in enumerate(graph.outputs):
        tensor = graph.tensors[t]
        if t in first:
            src, why = f"{name}_io_out[{first[t]}]", f"the same tensor as output {first[t]}"
        elif t in written:
            first[t] = j
            continue
        elif t in graph.inputs:
            src, why = f"{name}_io_in[{graph.inputs.index(t)}]", "a graph input"
        else:
            src, why = f"{name}_t{t}", "a constant"
        first.setdefault(t, j)
        copies.append({"dst": f"{name}_io_out[{j}]", "src": src, "nbytes": tensor.nbytes,
                       "comment": f"output {j} is {why}"})
    return copies


def c_words(texts: list[str]) -> set[str]:
    """Every identifier-like word of some C text."""
    return set(re.findall(r"\b\w+\b", "\n".join(texts)))


def check_graph(graph: Graph, source: str) -> None:
    """Refuses graphs whose C could not compile or could not be driven: no inputs (the harness
    would wait for input sets that have no bytes), no outputs (nothing to read; an empty
    initializer is not C), a constant input (the harness would write into the weights), or an
    output that nothing ever writes (a symbol no declaration backs)."""
    if not graph.inputs:
        raise UnsupportedOpError(
            "the graph has no inputs: generated C is driven by at least one", source
        )
    if not graph.outputs:
        raise ModelError("the graph has no outputs", source)
    for i, t in enumerate(graph.inputs):
        if graph.tensors[t].is_constant:
            raise ModelError(
                f"graph input {i} is tensor {t} ({graph.tensors[t].name!r}), a constant", source
            )
    written = {t for op in graph.operators for t in op.outputs} | set(graph.inputs)
    for i, t in enumerate(graph.outputs):
        tensor = graph.tensors[t]
        if t not in written and not tensor.is_constant and not tensor.is_variable:
            raise ModelError(
                f"graph output {i} is tensor {t} ({tensor.name!r}), which no operator writes "
                "and which is neither a graph input nor a constant",
                source,
            )


def check_plan(mp: ModelPlan, external_io: bool) -> None:
    """Refuses a plan made for other I/O than asked for, an unsafe one (`verify`: PlanError),
    and one that is not a plan of this graph: its buffers must be the ones the graph's
    lifetimes give in the order it was made for, and each overlap it may use one that the
    graph's operators allow."""
    graph, source = mp.graph, mp.model.source
    planned = set(mp.offset_of_tensor())
    io = set(graph.inputs) | set(graph.outputs)
    if external_io and io & planned:
        raise UnsupportedOpError("external I/O needs a plan made with external_io=True", source)
    unplanned = {t for t in io - planned if not graph.tensors[t].is_constant}
    if not external_io and unplanned - set(mp.lifetimes.variables):
        raise UnsupportedOpError(
            "the plan keeps inputs or outputs out of the arena (it was made with "
            "external_io=True): generate with external_io=True",
            source,
        )
    try:
        verify(mp.plan)
        if mp.pools:
            verify_pools(PooledPlacement(mp.plan, mp.pools, mp.pool_of))
    except PlanError as e:
        raise PlanError(f"unsafe plan: {e.message}", source) from None
    if mp.lifetimes.buffers != mp.plan.buffers:
        raise PlanError(
            "the plan's buffers (sizes or lives) are not the ones this graph needs", source
        )
    kept = mp.program.control_lives(mp.lifetimes.order)[1]
    allowed = {*overlap_pairs(graph, mp.lifetimes, mp.program.bindings, kept=kept),
               *segment_overlaps(mp.lifetimes, mp.tiling, kept)}
    for o in mp.plan.overlaps:
        if o not in allowed:
            raise PlanError(
                f"the plan lets buffers {o.below} and {o.above} overlap, which no operator "
                "allows",
                source,
            )


def io_info(t: Tensor, index: int, in_arena: bool) -> IOInfo:
    q = t.quantization
    return IOInfo(
        index,
        c_text(t.name),
        C_TYPES[t.dtype],
        t.dtype,
        t.shape,
        t.nbytes,
        c_float(q.scale[0] if q else 0.0),
        c_int64(q.zero_point[0] if q else 0),
        in_arena,
    )
