"""What `inspect` and `plan` show: tables, the text memory map, the SVG map, JSON objects.

Pure functions from the IR and a plan to text or plain data; the CLI only prints them.
"""

from __future__ import annotations

import bisect
import math
import textwrap
from typing import Any

from toolchain.errors import ArenacError
from toolchain.ir import Model
from toolchain.lower.lifetimes import TENSOR
from toolchain.lower.plan import BufferRow, ModelPlan
from toolchain.lower.tiling import ON_DEMAND, ROW_BY_ROW, WAVEFRONT, model_macs
from toolchain.ops import unsupported_ops
from toolchain.render import render
from toolchain.text import TABLE_WIDTH, display_text, middle_cut, table

MAP_SYMBOLS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
# What a plan says when the caller's --time-limit ran out before its search ended.
CLOCK_CUT = "ran out before the search ended: the plan may differ on another machine or load"
TICK_INTERVALS = tuple(m * 10**e for e in range(10) for m in (1, 2, 5))  # 1, 2, 5, 10, 20, ...


def symbol(buffer_id: int, count: int) -> str:
    """The map's mark of a buffer, one of `count`: a letter or digit while every buffer can have
    its own, else its number (the map is then drawn one row per buffer)."""
    return MAP_SYMBOLS[buffer_id] if count <= len(MAP_SYMBOLS) else str(buffer_id)


# --- inspect ----------------------------------------------------------------------------
def inspect_data(model: Model) -> dict[str, Any]:
    """The model as plain data: operators in execution order, tensors, totals.

    Operators are marked unsupported exactly as `run` refuses them: the main graph and the
    subgraphs it calls as one program (toolchain.lower.program), any other subgraph on its own."""
    program = program_of(model)
    refusals: dict[int, dict[int, str]] = {}
    padding: dict[int, dict[int, dict]] = {}  # subgraph -> PAD -> what became of it
    if program is not None:
        for r in refused_ops(program):
            refusals.setdefault(r["subgraph"], {})[r["op"]] = r["reason"]
        for f in program.pad_fusions:
            graph, op = program.op_origin(f.pad)
            padding.setdefault(graph, {})[op] = {
                "into": program.op_origin(f.op)[1], "opcode": program.graph.operators[f.op].opcode,
                "fused": f.fused, "refused": f.refused or None}
    graphs = []
    for g in model.graphs:
        in_program = program is not None and g.index in program.subgraphs
        unsupported = refusals.get(g.index, {}) if in_program else unsupported_ops(g)
        ops = [
            {
                "index": op.index,
                "opcode": op.custom_code if op.opcode == "CUSTOM" else op.opcode,
                "inputs": list(op.inputs),  # tensor indices; -1: an optional input left out
                "outputs": list(op.outputs),
                "options": dict(op.options),
                "supported": op.index not in unsupported,
                "refusal": unsupported.get(op.index),
                "padding": padding.get(g.index, {}).get(op.index) if in_program else None,
            }
            for op in g.operators
        ]
        tensors = [
            {
                "index": t.index,
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "bytes": t.nbytes,
                "kind": "constant"
                if t.is_constant
                else "variable"
                if t.is_variable
                else "handle"
                if t.is_handle
                else "activation",
                "scale": list(t.quantization.scale) if t.quantization else None,
                "zero_point": list(t.quantization.zero_point) if t.quantization else None,
            }
            for t in g.tensors
        ]
        graphs.append(
            {
                "index": g.index,
                "name": g.name,
                "inputs": list(g.inputs),
                "outputs": list(g.outputs),
                "operators": ops,
                "tensors": tensors,
                "weight_bytes": sum(t["bytes"] for t in tensors if t["kind"] == "constant"),
                "activation_bytes": sum(t["bytes"] for t in tensors if t["kind"] == "activation"),
                "variable_bytes": sum(t["bytes"] for t in tensors if t["kind"] == "variable"),
            }
        )
    return {
        "model": model.source,
        "sha256": model.sha256,
        "version": model.version,
        "description": model.description,
        "metadata": sorted(model.metadata),
        "signatures": [s.key for s in model.signature_defs],
        "graphs": graphs,
        "resource_variables": [
            {"name": v.name, "dtype": v.dtype, "shape": list(v.shape), "bytes": v.nbytes}
            for v in (program.resources if program is not None else ())
        ],
    }


def program_of(model: Model):
    """The main graph lowered with the subgraphs it calls, or None when the model cannot mean
    it (an invalid op: each graph is then shown on its own, with that op's reason)."""
    from toolchain.lower.program import lower

    try:
        return lower(model)
    except ArenacError:
        return None


def inspect_text(data: dict[str, Any]) -> str:
    out = [f"model {display_text(data['model'])} (schema version {data['version']})",
           f"SHA-256 {data['sha256']}",
           "ops' inputs and outputs are tensor indices (- for an optional input left out)"]
    for g in data["graphs"]:
        out.append(
            f"\nsubgraph {g['index']} {g['name']!r}: {len(g['operators'])} operators, "
            f"{len(g['tensors'])} tensors"
        )
        out.append(
            table(
                ["op", "type", "inputs", "outputs", "output type", "supported"],
                [
                    [
                        o["index"],
                        o["opcode"],
                        " ".join(str(t) if t >= 0 else "-" for t in o["inputs"]),
                        " ".join(map(str, o["outputs"])),
                        ", ".join(tensor_type(g["tensors"][t]) for t in o["outputs"]),
                        "yes" if o["supported"] else "NO",
                    ]
                    for o in g["operators"]
                ],
            )
        )
        out.extend(f"  {display_text(o['refusal'])}" for o in g["operators"] if o["refusal"])
        out.extend(f"  op {o['index']} {o['opcode']}: {padding_text(o['padding'])}"
                   for o in g["operators"] if o["padding"])
        out.append("")
        out.append(
            table(
                ["tensor", "name", "type", "bytes", "kind"],
                [
                    [t["index"], t["name"], tensor_type(t), t["bytes"], t["kind"]]
                    for t in g["tensors"]
                ],
            )
        )
        out.append(
            f"\nweights {g['weight_bytes']} bytes, activations {g['activation_bytes']} bytes"
            f" (unplanned sum), state {g['variable_bytes']} bytes"
        )
    if data["resource_variables"]:
        out.append("\nresource variables (state, beside the variable tensors): " + ", ".join(
            f"{display_text(v['name'])} {v['dtype']}{v['shape']} ({v['bytes']} bytes)"
            for v in data["resource_variables"]))
    return "\n".join(out)


def padding_text(p: dict[str, Any]) -> str:
    """What became of a PAD in front of a windowed op (toolchain.lower.fusion), in words."""
    into = f"op {p['into']} {p['opcode']}"
    if p["fused"]:
        return f"fused into {into}, which pads as it reads (its output is never stored)"
    return f"not fused into {into}: {display_text(p['refused'])}"


def tensor_type(t: dict[str, Any]) -> str:
    """int8[1x49x80] (int32[] for a scalar): a tensor of inspect_data, as tables show it."""
    return f"{t['dtype']}[{'x'.join(map(str, t['shape']))}]"


# --- plan -------------------------------------------------------------------------------
def plan_data(mp: ModelPlan) -> dict[str, Any]:
    graph = mp.graph
    return {
        "model": mp.model.source,
        "graph": mp.graph_index,
        "planner": mp.plan.planner,
        "alignment": mp.plan.alignment,
        "arena_bytes": mp.arena_bytes,
        "lower_bound_bytes": mp.lower_bound_bytes,
        "naive_bytes": mp.naive_bytes,
        "arena_over_lower_bound": ratio(mp.arena_bytes, mp.lower_bound_bytes),
        "overlap_bound_bytes": mp.overlap_bound_bytes,
        "untiled_bound_bytes": mp.untiled_bound_bytes,
        "tiling": [segment_data(mp, s) for s in mp.tiling.segments],
        "portable_arena_bytes": mp.portable_arena,
        "given_up_kernels": [{"op": op, "given_up": list(names),
                              "kernel": mp.program.bindings[op].kernel_name}
                             for op, names in sorted(mp.program.given_up.items())],
        "proven_optimal": mp.plan.proven_optimal,
        "clock_cut": mp.clock_cut,
        "unsupported_ops": refused_ops(mp.program),
        "gap_bytes": mp.plan.gap_bytes,
        "order": list(mp.lifetimes.order),
        "overlaps": [
            {"output": mp.lifetimes.keys[o.below].index, "input": mp.lifetimes.keys[o.above].index,
             "shift": o.shift, "any_offset": o.any_offset,
             "shared_bytes": shared_bytes(mp, o.below, o.above)}
            for o in mp.plan.overlaps
        ],
        "buffers": [
            {
                "tensor": None if r.tensor is None else mp.program.tensor_origin(r.tensor)[1],
                "subgraph": None if r.tensor is None else mp.program.tensor_origin(r.tensor)[0],
                "name": r.name,
                "bytes": r.bytes,
                "first_op": r.first_op,
                "last_op": r.last_op,
                "offset": r.offset,
                **pool_fields(mp, r.buffer),
            }
            for r in mp.rows()
        ],
        **({"pools": pools_data(mp)} if mp.pools else {}),
        "variables": [
            {"tensor": t, "name": graph.tensors[t].name, "bytes": graph.tensors[t].nbytes}
            for t in mp.lifetimes.variables
        ],
        "state_bytes": mp.state_bytes,
        "state": [
            {"kind": slot.kind, "name": slot.name, "offset": slot.offset, "bytes": slot.nbytes,
             "dtype": slot.dtype, "shape": list(slot.shape),
             "subgraph": slot.subgraph if slot.kind == "call_once" else None}
            for slot in mp.state_slots
        ],
        "subgraphs": subgraph_steps(mp),
        "fused_pads": fused_pads(mp),
        "scratch": [
            {"op": s.op, "bytes": s.size, "purpose": s.purpose} for s in mp.lifetimes.scratch
        ],
    }


def fused_pads(mp: ModelPlan) -> list[dict[str, Any]]:
    """The PADs whose padding the op reading them applies: their output has no buffer."""
    program = mp.program
    rows = []
    for f in program.fused_pads:
        (graph, pad), tensor = program.op_origin(f.pad), mp.graph.tensors[f.tensor]
        rows.append({"subgraph": graph, "pad": pad, "pad_opcode": mp.graph.operators[f.pad].opcode,
                     "into": program.op_origin(f.op)[1],
                     "opcode": mp.graph.operators[f.op].opcode,
                     "tensor": program.tensor_origin(f.tensor)[1], "name": tensor.name,
                     "bytes": tensor.nbytes, "padding": [list(pair) for pair in f.padding]})
    return rows


def pool_fields(mp: ModelPlan, position: int) -> dict[str, Any]:
    """With pools, a buffer's pool and its offset there (`offset` is in all pools joined)."""
    if not mp.pools:
        return {}
    k, offset = mp.place(position)
    return {"pool": mp.pools[k].pool.name, "pool_offset": offset}


def pools_data(mp: ModelPlan) -> list[dict[str, Any]]:
    return [
        {"name": a.pool.name, "section": a.pool.section, "capacity": a.pool.capacity,
         "bytes": a.bytes, "reserved_bytes": a.reserved, "reserved_for": mp.reserved_in(k),
         "base": a.base,
         "buffers": sum(1 for p in mp.pool_of if p == k)}
        for k, a in enumerate(mp.pools)
    ]


def pool_lines(mp: ModelPlan) -> list[str]:
    """One line per pool: what the plan takes of it, against what it holds."""
    lines = []
    for k, a in enumerate(mp.pools):
        count = sum(1 for p in mp.pool_of if p == k)
        state = f" + {a.reserved} for {mp.reserved_in(k)}" if a.reserved else ""
        section = f", section {a.pool.section}" if a.pool.section else ""
        lines.append(f"pool {a.pool.name:<7} {a.bytes}{state} of {a.pool.capacity} bytes, "
                     f"{count} buffer{'' if count == 1 else 's'}{section}")
    return lines


def shared_bytes(mp: ModelPlan, a: int, b: int) -> int:
    """How many bytes two buffers of the plan actually share."""
    (ba, oa), (bb, ob) = ((mp.plan.buffers[i], mp.plan.offsets[i]) for i in (a, b))
    return max(0, min(oa + ba.size, ob + bb.size) - max(oa, ob))


def ratio(a: int, b: int) -> float:
    return round(a / b, 4) if b else 1.0


# What a subgraph is to the op that runs it, by that op and the subgraph's position among those
# it runs.
ROLES = {"CALL_ONCE": ("first invoke after a reset only",),
         "IF": ("its then branch", "its else branch"),
         "WHILE": ("its condition, before each iteration", "its body, while the condition holds")}


def subgraph_steps(mp: ModelPlan) -> list[dict[str, Any]]:
    """Each subgraph the plan runs, with its steps, the op that runs it (CALL_ONCE, IF, WHILE)
    and what it is to that op."""
    program, order = mp.program, mp.lifetimes.order
    called_by = {g: (op, k) for op in range(len(program.graph.operators))
                 for k, g in enumerate(program.runs(op))}
    steps_of: dict[int, list[int]] = {g: [] for g in program.subgraphs}
    for step, o in enumerate(order):  # once for all subgraphs: 5,000 of them took seconds
        steps_of.setdefault(program.op_origin(o)[0], []).append(step)
    rows = []
    for g in program.subgraphs:
        op, k = called_by.get(g, (None, 0))
        opcode = None if op is None else program.graph.operators[op].opcode
        rows.append({
            "subgraph": g,
            "name": mp.model.graphs[g].name,
            "steps": steps_of[g],
            "called_by_op": None if op is None else program.op_origin(op)[1],
            "caller": None if op is None else program.op_origin(op)[0],
            "called_by": opcode,
            "role": None if op is None else ROLES[opcode][k],
            "inputs_read_as": [
                dict(zip(("subgraph", "tensor"), program.tensor_origin(program.aliases[t]),
                         strict=True))
                for t in (program.layout.tensor_base[g] + i for i in mp.model.graphs[g].inputs)
                if t in program.aliases
            ] if program.layout else [],
        })
    return rows


def step_ranges(steps: list[int]) -> str:
    """[0, 3, 4, 5] -> "0, 3-5"."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


def plan_text(mp: ModelPlan) -> str:
    rows = mp.rows()
    program = mp.program
    several = program.layout is not None
    ops = {r.key: r.op for r in (*mp.lifetimes.scratch, *mp.lifetimes.shared)}
    subgraph_of = [program.tensor_origin(key.index)[0] if key.kind == TENSOR
                   else program.op_origin(ops[key])[0] for key in mp.lifetimes.keys]
    pooled = bool(mp.pools)
    headers = ["map", *(["subgraph"] if several else []), "tensor", "name", "bytes", "first",
               "last", *(["pool"] if pooled else []), "offset"]
    out = [
        table(
            headers,
            [
                [
                    symbol(r.buffer, len(rows)),
                    *([subgraph_of[r.buffer]] if several else []),
                    "-" if r.tensor is None else program.tensor_origin(r.tensor)[1],
                    r.name,
                    r.bytes,
                    r.first_op,
                    r.last_op,
                    *([mp.pools[mp.pool_of[r.buffer]].pool.name] if pooled else []),
                    mp.place(r.buffer)[1],
                ]
                for r in rows
            ],
        )
    ]
    if several:
        out.append("")
        for g in subgraph_steps(mp):
            label = f"subgraph {program.subgraph_label(g['subgraph'])}"
            line = f"{display_text(label)}: steps {step_ranges(g['steps'])}"
            if g["called_by_op"] is not None:
                caller = ("op" if g["caller"] == mp.graph_index
                          else f"subgraph {g['caller']} op")
                line += (f", within the step of {caller} {g['called_by_op']} {g['called_by']} "
                         f"({g['role']})")
            if g["inputs_read_as"]:
                line += "; it reads its inputs in place: " + ", ".join(
                    f"tensor {a['tensor']}" if a["subgraph"] == mp.graph_index
                    else f"subgraph {a['subgraph']} tensor {a['tensor']}"
                    for a in g["inputs_read_as"])
            out.append(line)
    if mp.state_slots:
        out.append("")
        out.append(f"state block: {mp.state_bytes} bytes kept across invokes, outside the arena "
                   "(never reused);\na reset restores them")
        out.append(table(
            ["offset", "bytes", "kind", "name", "holds"],
            [[slot.offset, slot.nbytes, slot.kind, slot.name,
              "flag" if slot.kind == "call_once" else f"{slot.dtype}{list(slot.shape)}"]
             for slot in mp.state_slots],
        ))
    out.append("")
    proof = {True: ", proven optimal", False: ", not proven optimal", None: ""}
    out.append(f"planner      {mp.plan.planner} (alignment {mp.plan.alignment})"
               f"{proof[mp.plan.proven_optimal]}")
    if mp.clock_cut:
        out.append(f"time limit   {CLOCK_CUT}")
    refused = refused_ops(mp.program)
    if refused:
        names = ", ".join(sorted({r["opcode"] for r in refused}))
        out.append(f"unsupported  {len(refused)} ops ({display_text(names)}) have no kernel here: "
                   "the arena below lacks their scratch,")
        out.append("             and run, gen and check refuse the model (inspect says why)")
    out.extend(given_up_lines(mp))
    out.extend(held_lines(mp))
    shared = [o for o in mp.plan.overlaps if shared_bytes(mp, o.below, o.above)]
    if shared:
        out.append(f"overlaps     {len(shared)} outputs placed over their dying inputs, "
                   f"{sum(shared_bytes(mp, o.below, o.above) for o in shared)} bytes shared")
    for k, f in enumerate(fused_pads(mp)):
        where = "" if f["subgraph"] == mp.graph_index else f"subgraph {f['subgraph']} "
        out.append(f"{'fused pads' if k == 0 else '':13}{where}op {f['pad']} {f['pad_opcode']} "
                   f"into op {f['into']} {f['opcode']}: tensor {f['tensor']} "
                   f"{display_text(repr(f['name']))} ({f['bytes']} bytes) never stored")
    out.append(f"arena        {mp.arena_bytes} bytes" + (
        f" in {len(mp.pools)} pools (offsets are within each pool)" if pooled else ""))
    out.extend(pool_lines(mp))
    if mp.state_slots:
        out.append(f"state        {mp.state_bytes} bytes (persistent, beside the arena)")
    out.extend(f"{'lower bound' if k == 0 else '':13}{phrase}"
               for k, phrase in enumerate(bounds(mp)))
    out.extend(tiling_lines(mp))
    out.append(
        f"naive sum    {mp.naive_bytes} bytes "
        f"(arena / naive = {ratio(mp.arena_bytes, mp.naive_bytes):.3f})"
    )
    out.append("")
    out.append(memory_map_text(mp.rows(), mp.arena_bytes, len(mp.lifetimes.order)))
    return "\n".join(out)


def given_up_lines(mp: ModelPlan) -> list[str]:
    """The ops that gave up target kernels for the arena to fit (`--max-arena`, or the
    portable kernels' arena through narrow kernels: toolchain.lower.plan.narrowed), and what
    they run instead."""
    given_up = mp.program.given_up
    if not given_up:
        return []
    ops = ", ".join(f"op {op} {mp.graph.operators[op].opcode} "
                    f"{mp.program.bindings[op].kernel_name} (not {', '.join(names)})"
                    for op, names in sorted(given_up.items()))
    return labelled("given up", f"{len(given_up)} op{'s' if len(given_up) > 1 else ''} gave "
                                f"up {mp.program.target} kernels for the arena to fit: {ops}")


def held_lines(mp: ModelPlan) -> list[str]:
    """Whether a target's plan reached the portable kernels' arena through narrow kernels."""
    if mp.portable_arena is None:
        return []
    return labelled("held", f"to the portable kernels' arena, {mp.portable_arena} bytes, "
                            "through narrow kernels: " + (
                                "reached" if mp.arena_bytes <= mp.portable_arena else
                                "not reached, no kernel with scratch at the peak has a narrow "
                                "form (--max-arena trades more)"))


def labelled(label: str, text: str) -> list[str]:
    """`text` as lines of the plan's summary: wrapped within 100 columns after a 13-column
    label column, the label on the first line only."""
    wrapped = textwrap.wrap(text, 100 - 13, break_on_hyphens=False)
    return [f"{label if k == 0 else '':<13}{line}" for k, line in enumerate(wrapped)]


def refused_ops(program) -> list[dict[str, Any]]:
    """The operators no kernel here runs, by subgraph and op of the file, with the reason:
    planned as tensors only, without their scratch."""
    rows = []
    for r in program.refusals:
        if r.op >= 0:
            graph, op = program.op_origin(r.op)
            operator = program.model.graphs[graph].operators[op]
            rows.append({"subgraph": graph, "op": op, "reason": r.message,
                         "opcode": operator.custom_code if operator.opcode == "CUSTOM"
                         else operator.opcode})
    return rows


def bounds(mp: ModelPlan) -> list[str]:
    """The bounds the arena is measured against, one phrase each: first the plan's own lower
    bound (the most bytes that must coexist, overlaps and stripes counted), then the looser
    ones it beats. `plan` lists them under "lower bound", the HTML report on one line."""
    how = "striped" if mp.untiled_bound_bytes is not None else "outputs over inputs"
    phrases = [f"{mp.overlap_bound_bytes} bytes, {how}: the most that must coexist "
               f"(arena / bound = {ratio(mp.arena_bytes, mp.overlap_bound_bytes):.3f})"]
    if mp.untiled_bound_bytes is not None:
        phrases.append(f"{mp.untiled_bound_bytes} bytes without striping (outputs over their "
                       "inputs)")
    phrases.append(f"{mp.lower_bound_bytes} bytes if no two live tensors share a byte "
                   f"(arena / that = {ratio(mp.arena_bytes, mp.lower_bound_bytes):.3f})")
    return phrases


def segment_data(mp: ModelPlan, s) -> dict[str, Any]:
    """One striped segment as `plan --json` gives it."""
    return {"steps": [s.first, s.last], "ops": list(s.ops), "input": s.input, "output": s.output,
            "stripe_rows": s.height, "stripes": len(s.stripes), "shift": s.shift,
            "moved_bytes": s.moved_bytes, "macs": s.macs, "whole_macs": s.whole_macs,
            "streamed": s.streamed, "streamed_output": s.streamed_output,
            "wavefront": s.wavefront, "pace": PACE_NAMES[s.pace],
            "tiles": [list(t.span(s.output)) for t in s.tiles],
            "recomputed_macs": s.recomputed,
            "buffers": [{"tensor": b.tensor, "rows": b.rows, "bytes": b.size}
                        for b in s.buffers]}


PACE_NAMES = {ON_DEMAND: "on demand", WAVEFRONT: "wavefront", ROW_BY_ROW: "row by row"}


def stripe_phrase(height: int, pace: int) -> str:
    """What one stripe of a segment makes."""
    rows = f"{height} {'output ' if pace != ROW_BY_ROW else ''}row{'s' if height > 1 else ''}"
    return {ON_DEMAND: rows, WAVEFRONT: f"{rows} (a wavefront)",
            ROW_BY_ROW: f"at most {rows} of each tensor (row by row)"}[pace]


def tiling_lines(mp: ModelPlan) -> list[str]:
    """What the striped segments are, a few lines each within 100 columns."""
    lines = []
    for s in mp.tiling.segments:
        ops = ", ".join(str(o) for o in s.ops)
        kept = ", ".join(f"{b.rows} of {mp.graph.tensors[b.tensor].shape[1]}"
                         for b in s.buffers)
        rows = stripe_phrase(s.height, s.pace)
        skipped = (f", {s.whole_macs - s.macs} MACs of unread rows skipped"
                   if s.macs < s.whole_macs else "")
        streamed = (f"; streamed input: tensor {s.input}'s rows fetched as needed"
                    if s.streamed else "")
        streamed += (f"; streamed output: tensor {s.output}'s rows handed on as made"
                     if s.streamed_output else "")
        recomputed = "no MAC recomputed"
        if s.tiles:
            widths = ", ".join(str(hi - lo) for lo, hi in (t.span(s.output) for t in s.tiles))
            share = s.recomputed / max(1, model_macs(mp.graph, mp.program.bindings))
            rows += f", in each of {len(s.tiles)} column tiles (output columns {widths})"
            recomputed = f"{s.recomputed} MACs recomputed ({share:.1%} of the model's)"
            skipped = ""
        text = (f"steps {s.first}-{s.last} (ops {ops}) in {len(s.stripes)} stripes of {rows}; "
                f"rows kept: {kept}; {s.moved_bytes} bytes moved, {recomputed}{skipped}"
                f"{streamed}")
        lines += labelled("striped" if s is mp.tiling.segments[0] else "", text)
    return lines


def memory_map_text(rows: list[BufferRow], arena: int, steps: int, height: int = 16) -> str:
    """Offset (down) against execution step (across): each cell shows the buffer holding it.
    Beyond len(MAP_SYMBOLS) buffers no mark could be each buffer's own: the map is then one
    numbered row per buffer, live where it is marked."""
    if arena == 0 or steps == 0:
        return "memory map: empty arena"
    band = max(1, -(-arena // height))
    row_count = -(-arena // band)
    numbered = len(rows) > len(MAP_SYMBOLS)
    margin = len(str(max(r.buffer for r in rows) if numbered else (row_count - 1) * band))
    width = min(steps, TABLE_WIDTH - margin - 3)  # "label |cells|" within TABLE_WIDTH
    columns = [
        (col * steps // width, max(col * steps // width, (col + 1) * steps // width - 1))
        for col in range(width)
    ]
    per_column = "1 op" if width == steps else f"{steps / width:.1f} ops"
    if numbered:
        return lifetime_map_text(rows, columns, per_column)
    # Each cell shows the buffer holding most of its bytes (the first such in `rows`); every
    # buffer paints only the cells it covers, so wide graphs stay cheap.
    best: dict[tuple[int, int], tuple[int, BufferRow]] = {}
    for r in rows:
        if not r.bytes:
            continue
        cols = live_columns(r, columns, steps)
        for row_index in range(r.offset // band, min(row_count, -(-(r.offset + r.bytes) // band))):
            lo, hi = row_index * band, min(arena, (row_index + 1) * band)
            held = min(hi, r.offset + r.bytes) - max(lo, r.offset)
            for col in cols:
                if held > best.get((row_index, col), (0, None))[0]:
                    best[row_index, col] = (held, r)
    lines = [f"memory map: offset in bytes down ({band} bytes per row), op step across "
             f"({per_column} per column)"]
    for row_index in range(row_count):
        cells = [
            symbol(best[row_index, col][1].buffer, len(rows)) if (row_index, col) in best else "."
            for col in range(width)
        ]
        lines.append(f"{row_index * band:>{margin}} |{''.join(cells)}|")
    return "\n".join([*lines, *step_axis(columns, margin + 1)])


def live_columns(r: BufferRow, columns: list[tuple[int, int]], steps: int) -> list[int]:
    """The map's columns (each a range of steps) during which buffer `r` is live."""
    width = len(columns)
    first_col = max(0, r.first_op * width // steps - 1)
    last_col = min(width - 1, r.last_op * width // steps + 1)
    return [c for c in range(first_col, last_col + 1)
            if columns[c][0] <= r.last_op and columns[c][1] >= r.first_op]


def lifetime_map_text(rows: list[BufferRow], columns: list[tuple[int, int]],
                      per_column: str) -> str:
    """One row per buffer, numbered as the table's map column: '#' where it is live."""
    steps = columns[-1][1] + 1
    margin = len(str(max(r.buffer for r in rows)))
    lines = [f"memory map: {len(rows)} buffers, too many for one mark each: one row per buffer",
             f"(numbered as in the map column), op step across ({per_column} per column)"]
    for r in rows:
        live = set(live_columns(r, columns, steps))
        cells = "".join("#" if col in live else "." for col in range(len(columns)))
        lines.append(f"{r.buffer:>{margin}} |{cells}|")
    return "\n".join([*lines, *step_axis(columns, margin + 1)])


def step_axis(columns: list[tuple[int, int]], indent: int) -> list[str]:
    """The map's bottom edge and the steps below it: a tick label under the column holding its
    step, at least two spaces apart, the last step always labelled at the right edge."""
    width, steps = len(columns), columns[-1][1] + 1
    last = str(steps - 1)
    interval = next(i for i in TICK_INTERVALS if i * width / steps >= len(last) + 2 or i >= steps)
    starts = [lo for lo, _ in columns]
    placed: list[tuple[int, str]] = []
    for step in range(0, steps - 1, interval):
        col = bisect.bisect_right(starts, step) - 1  # the column holding the step
        if not placed or col >= placed[-1][0] + len(placed[-1][1]) + 2:
            placed.append((col, str(step)))
    end = max(width - len(last), 0)
    while placed and placed[-1][0] + len(placed[-1][1]) + 2 > end:
        placed.pop()
    placed.append((end, last))
    labels = ""
    for col, text in placed:
        labels = labels.ljust(col) + text
    edge = " " * indent + "+" + "-" * width + "+"
    return [edge, " " * (indent + 1) + labels, " " * (indent + 1) + "op step"]


# The SVG map's layout, in pixels. Text is monospace, so Python knows how wide every label is
# and only writes one where it fits.
SVG_WIDTH = 960
SVG_PLOT_HEIGHT = 420
SVG_FONT = 11
SVG_CHAR = 0.62 * SVG_FONT  # advance of one monospace character, with a little to spare
SVG_LINE = 15
SVG_LEGEND_COLUMNS = 3
SVG_LEGEND_LIMIT = 240  # buffers the legend lists; `plan --json` has every one


def memory_map_svg(mp: ModelPlan) -> str:
    """The memory map as SVG: one rectangle per buffer, x = op step, y = offset in bytes, with
    axes, the peak step, a legend and names on the rectangles wide enough for them. Python
    places every element; the template escapes markup. Names are first made displayable
    (`display_text`), since XML has no way at all to carry a NUL or most other controls."""
    from toolchain import __version__

    rows = mp.rows()
    order = mp.lifetimes.order
    steps = max(len(order), 1)
    step_names = [f"{step} {mp.graph.operators[op].opcode}" for step, op in enumerate(order)]
    arena = max(mp.arena_bytes, 1)
    y_ticks = nice_ticks(arena)
    left = round(SVG_CHAR * max(len(str(t)) for t in y_ticks) + 8 + SVG_LINE + 12)
    top = 4 * SVG_LINE  # two title lines, then the peak's label above the tick of offset 0
    plot_w, plot_h = SVG_WIDTH - left - 24, SVG_PLOT_HEIGHT
    x_scale, y_scale = plot_w / steps, plot_h / arena
    bottom = top + plot_h
    x_every = max(1, math.ceil((SVG_FONT + 3) / x_scale))
    x_ticks = [
        {"x": round(left + (s + 0.5) * x_scale, 2), "label": display_text(step_names[s])}
        for s in range(0, len(order), x_every)
    ]
    x_label_room = SVG_CHAR * max((len(t["label"]) for t in x_ticks), default=0)
    x_title_y = round(bottom + 10 + x_label_room + SVG_LINE)
    buffers = []
    for r in rows:
        x, y = left + r.first_op * x_scale, top + r.offset * y_scale
        w, h = (r.last_op - r.first_op + 1) * x_scale, max(r.bytes * y_scale, 0.5)
        mark = symbol(r.buffer, len(rows))
        buffers.append({
            "x": round(x, 2), "y": round(y, 2), "w": round(w, 2), "h": round(h, 2),
            "hue": (r.buffer * 47) % 360,
            "title": f"{mark}: {display_text(r.name)}: {r.bytes} bytes at offset {r.offset}, "
                     f"ops {r.first_op}-{r.last_op}",
            "label": rect_label(f"{mark} {shown_name(r.name)}", mark, w, h),
            "label_x": round(x + 3, 2), "label_y": round(y + h / 2 + SVG_FONT * 0.35, 2),
        })
    peak_step, peak_bytes = peak_of(rows, len(order))
    peak_x = left + (peak_step + 0.5) * x_scale
    peak_text = (f"peak: step {display_text(step_names[peak_step])}, {peak_bytes} bytes live"
                 if order else "no steps")
    peak_w = SVG_CHAR * len(peak_text)
    legend_top = x_title_y + SVG_LINE + 8
    legend, legend_more = legend_entries(rows, legend_top)
    legend_rows = -(-len(legend) // SVG_LEGEND_COLUMNS)
    height = legend_top + SVG_LINE * (legend_rows + (2 if legend_more else 1)) + 8
    pools = [
        {"y": round(top + (a.base + a.bytes) * y_scale, 2),
         "label": f"{display_text(a.pool.name)}: {a.bytes} of {a.pool.capacity} bytes"}
        for a in mp.pools
    ]
    return render(
        "memory_map.svg.j2",
        width=SVG_WIDTH,
        height=round(height),
        font=SVG_FONT,
        left=left,
        top=top,
        plot_w=round(plot_w, 2),
        plot_h=plot_h,
        bottom=bottom,
        titles=[f"arenac {__version__}: {mp.plan.planner} plan, arena {mp.arena_bytes} bytes, "
                f"lower bound {mp.lower_bound_bytes} bytes, {len(rows)} buffers, {steps} steps",
                f"model SHA-256 {mp.model.sha256}"],
        y_ticks=[{"y": round(top + t * y_scale, 2), "label": t} for t in y_ticks],
        y_title_x=round(left - 8 - SVG_CHAR * len(str(y_ticks[-1])) - 10),
        x_ticks=x_ticks,
        x_title_y=x_title_y,
        buffers=buffers,
        peak={"x": round(peak_x, 2), "text": peak_text,
              "text_x": round(min(max(peak_x - peak_w / 2, 8), SVG_WIDTH - 8 - peak_w), 2),
              "text_y": top - 13},
        legend=legend,
        legend_more=legend_more,
        legend_more_y=round(legend_top + SVG_LINE * (legend_rows + 1)),
        legend_title_y=legend_top,
        pools=pools,
    )


def nice_ticks(limit: int) -> list[int]:
    """0, a round interval (1, 2 or 5 times a power of ten) giving at most ten ticks, ..., and
    the limit itself when the last tick is not it (dropped if it would crowd the one before)."""
    interval = next(i for i in TICK_INTERVALS if limit / i <= 10)
    ticks = list(range(0, limit + 1, interval))
    if ticks[-1] != limit:
        if limit - ticks[-1] < interval / 3:
            ticks.pop()
        ticks.append(limit)
    return ticks


def shown_name(name: str) -> str:
    """A tensor name as the map shows it: of the names a converter joins with `;` when it fuses
    ops, the first (the op's own) is what tells tensors apart; the title has them all."""
    first, fused, _ = name.partition(";")
    return display_text(first + (";..." if fused else ""))


def rect_label(name: str, mark: str, w: float, h: float) -> str:
    """What a rectangle of w x h pixels can show: its mark and name (cut in the middle when at
    least a few characters of it fit), else its mark alone, else nothing."""
    if h < SVG_FONT + 2:
        return ""
    room = int((w - 6) / SVG_CHAR)
    if room >= len(name) or room >= len(mark) + 1 + 8:
        return middle_cut(name, room)
    return mark if room >= len(mark) else ""


def peak_of(rows: list[BufferRow], steps: int) -> tuple[int, int]:
    """The step with the most bytes in use (overlapping buffers counted once) and that count."""
    live: list[list[tuple[int, int]]] = [[] for _ in range(steps)]
    for r in rows:
        if r.bytes:
            for step in range(r.first_op, r.last_op + 1):
                live[step].append((r.offset, r.offset + r.bytes))
    best = (0, 0)
    for step, spans in enumerate(live):
        used, reach = 0, 0
        for lo, hi in sorted(spans):
            used += max(0, hi - max(lo, reach))
            reach = max(reach, hi)
        if used > best[1]:
            best = (step, used)
    return best


def legend_entries(rows: list[BufferRow], top: float) -> tuple[list[dict[str, Any]], int]:
    """The legend's entries, column by column, and how many buffers it leaves out."""
    column_w = (SVG_WIDTH - 16) / SVG_LEGEND_COLUMNS
    shown = rows[:SVG_LEGEND_LIMIT]
    per_column = -(-len(shown) // SVG_LEGEND_COLUMNS)
    entries = []
    for k, r in enumerate(shown):
        x = 8 + (k // per_column) * column_w
        y = top + SVG_LINE * (k % per_column + 1)
        size = f" {r.bytes} B"
        room = int((column_w - 22) / SVG_CHAR) - len(size)
        text = middle_cut(f"{symbol(r.buffer, len(rows))} {shown_name(r.name)}", room)
        entries.append({"x": round(x, 2), "y": round(y, 2), "hue": (r.buffer * 47) % 360,
                        "text": text + size})
    return entries, len(rows) - len(shown)
