"""What `inspect` and `plan` show: tables, the text memory map, the SVG map, JSON objects.

Pure functions from the IR and a plan to text or plain data; the CLI only prints them.
"""

from __future__ import annotations

from typing import Any

from toolchain.errors import ArenacError
from toolchain.ir import Model, Tensor
from toolchain.ops import unsupported_ops
from toolchain.plan import BufferRow, ModelPlan
from toolchain.render import render
from toolchain.text import display_text

MAP_SYMBOLS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def symbol(buffer_id: int) -> str:
    return MAP_SYMBOLS[buffer_id % len(MAP_SYMBOLS)]


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain aligned text table; numbers right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(r[i], int) for r in rows) and rows for i in range(len(headers))]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells])


def describe_tensor(t: Tensor) -> str:
    shape = "x".join(str(d) for d in t.shape) or "scalar"
    return f"{t.dtype}[{shape}]"


# --- inspect ----------------------------------------------------------------------------
def inspect_data(model: Model) -> dict[str, Any]:
    """The model as plain data: operators in execution order, tensors, totals.

    Operators are marked unsupported exactly as `run` refuses them: the main graph and the
    subgraphs it calls as one program (toolchain.program), any other subgraph on its own."""
    program = program_of(model)
    refusals: dict[int, dict[int, str]] = {}
    if program is not None:
        for r in program.refusals:
            if r.op >= 0:
                graph, op = program.op_origin(r.op)
                refusals.setdefault(graph, {})[op] = r.message
    graphs = []
    for g in model.graphs:
        in_program = program is not None and g.index in program.subgraphs
        unsupported = refusals.get(g.index, {}) if in_program else unsupported_ops(g)
        ops = [
            {
                "index": op.index,
                "opcode": op.custom_code if op.opcode == "CUSTOM" else op.opcode,
                "inputs": [describe_tensor(g.tensors[t]) if t >= 0 else "-" for t in op.inputs],
                "outputs": [describe_tensor(g.tensors[t]) for t in op.outputs],
                "options": dict(op.options),
                "supported": op.index not in unsupported,
                "refusal": unsupported.get(op.index),
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
    from toolchain.program import lower

    try:
        return lower(model)
    except ArenacError:
        return None


def inspect_text(data: dict[str, Any]) -> str:
    out = [f"model {data['model']} (schema version {data['version']})"]
    for g in data["graphs"]:
        out.append(
            f"\nsubgraph {g['index']} {g['name']!r}: {len(g['operators'])} operators, "
            f"{len(g['tensors'])} tensors"
        )
        out.append(
            table(
                ["op", "type", "inputs", "outputs", "supported"],
                [
                    [
                        o["index"],
                        o["opcode"],
                        ", ".join(o["inputs"]),
                        ", ".join(o["outputs"]),
                        "yes" if o["supported"] else "NO",
                    ]
                    for o in g["operators"]
                ],
            )
        )
        out.extend(f"  {display_text(o['refusal'])}" for o in g["operators"] if o["refusal"])
        out.append("")
        out.append(
            table(
                ["tensor", "name", "type", "bytes", "kind"],
                [
                    [t["index"], display_text(t["name"]), f"{t['dtype']}{t['shape']}",
                     t["bytes"], t["kind"]]
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
        "proven_optimal": mp.plan.proven_optimal,
        "gap_bytes": mp.plan.gap_bytes,
        "order": list(mp.lifetimes.order),
        "overlaps": [
            {"output": mp.lifetimes.tensor_of[o.below], "input": mp.lifetimes.tensor_of[o.above],
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
        "scratch": [
            {"op": s.op, "bytes": s.size, "purpose": s.purpose} for s in mp.lifetimes.scratch
        ],
    }


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


def subgraph_steps(mp: ModelPlan) -> list[dict[str, Any]]:
    """Each subgraph the plan runs, with its steps and the CALL_ONCE that runs it."""
    program, order = mp.program, mp.lifetimes.order
    called_by = {g: op for op, g in program.calls.items()}
    return [
        {
            "subgraph": g,
            "name": mp.model.graphs[g].name,
            "steps": [step for step, op in enumerate(order) if program.op_origin(op)[0] == g],
            "called_by_op": None if g not in called_by else program.op_origin(called_by[g])[1],
            "caller": None if g not in called_by else program.op_origin(called_by[g])[0],
        }
        for g in program.subgraphs
    ]


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
    several = bool(program.calls)
    scratch = iter(mp.lifetimes.scratch)
    subgraph_of = [program.tensor_origin(t)[0] if t is not None
                   else program.op_origin(next(scratch).op)[0]
                   for t in mp.lifetimes.tensor_of]
    pooled = bool(mp.pools)
    headers = ["map", *(["subgraph"] if several else []), "tensor", "name", "bytes", "first",
               "last", *(["pool"] if pooled else []), "offset"]
    out = [
        table(
            headers,
            [
                [
                    symbol(r.buffer),
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
                line += (f", within the step of {caller} {g['called_by_op']} CALL_ONCE "
                         "(first invoke after a reset only)")
            out.append(line)
    if mp.state_slots:
        out.append("")
        out.append(f"state block: {mp.state_bytes} bytes kept across invokes, outside the arena "
                   "(never reused); a reset restores them")
        out.append(table(
            ["offset", "bytes", "kind", "name", "holds"],
            [[slot.offset, slot.nbytes, slot.kind, display_text(slot.name),
              "flag" if slot.kind == "call_once" else f"{slot.dtype}{list(slot.shape)}"]
             for slot in mp.state_slots],
        ))
    out.append("")
    proof = {True: ", proven optimal", False: ", not proven optimal", None: ""}
    out.append(f"planner      {mp.plan.planner} (alignment {mp.plan.alignment})"
               f"{proof[mp.plan.proven_optimal]}")
    shared = [o for o in mp.plan.overlaps if shared_bytes(mp, o.below, o.above)]
    if shared:
        out.append(f"overlaps     {len(shared)} outputs placed over their dying inputs, "
                   f"{sum(shared_bytes(mp, o.below, o.above) for o in shared)} bytes shared")
    out.append(f"arena        {mp.arena_bytes} bytes" + (
        f" in {len(mp.pools)} pools (offsets are within each pool)" if pooled else ""))
    out.extend(pool_lines(mp))
    if mp.state_slots:
        out.append(f"state        {mp.state_bytes} bytes (persistent, beside the arena)")
    out.append(
        f"lower bound  {mp.lower_bound_bytes} bytes "
        f"(arena / lower bound = {ratio(mp.arena_bytes, mp.lower_bound_bytes):.3f}; "
        f"{mp.overlap_bound_bytes} bytes when outputs may overlap their inputs)"
    )
    out.append(
        f"naive sum    {mp.naive_bytes} bytes "
        f"(arena / naive = {ratio(mp.arena_bytes, mp.naive_bytes):.3f})"
    )
    out.append("")
    out.append(memory_map_text(mp.rows(), mp.arena_bytes, len(mp.lifetimes.order)))
    return "\n".join(out)


def memory_map_text(rows: list[BufferRow], arena: int, steps: int, height: int = 16) -> str:
    """Offset (down) against execution step (across): each cell shows the buffer holding it."""
    if arena == 0 or steps == 0:
        return "memory map: empty arena"
    band = max(1, -(-arena // height))
    width = min(steps, 96)
    lines = [
        f"memory map: {band} bytes per row, "
        f"{'1 op' if width == steps else f'{steps / width:.1f} ops'} per column"
    ]
    row_count = -(-arena // band)
    step_ranges = [
        (col * steps // width, max(col * steps // width, (col + 1) * steps // width - 1))
        for col in range(width)
    ]
    # Each cell shows the buffer holding most of its bytes (the first such in `rows`); every
    # buffer paints only the cells it covers, so wide graphs stay cheap.
    best: dict[tuple[int, int], tuple[int, BufferRow]] = {}
    for r in rows:
        if not r.bytes:
            continue
        first_col = max(0, r.first_op * width // steps - 1)
        last_col = min(width - 1, r.last_op * width // steps + 1)
        cols = [c for c in range(first_col, last_col + 1)
                if step_ranges[c][0] <= r.last_op and step_ranges[c][1] >= r.first_op]
        for row_index in range(r.offset // band, min(row_count, -(-(r.offset + r.bytes) // band))):
            lo, hi = row_index * band, min(arena, (row_index + 1) * band)
            held = min(hi, r.offset + r.bytes) - max(lo, r.offset)
            for col in cols:
                if held > best.get((row_index, col), (0, None))[0]:
                    best[row_index, col] = (held, r)
    for row_index in range(row_count):
        cells = [
            symbol(best[row_index, col][1].buffer) if (row_index, col) in best else "."
            for col in range(width)
        ]
        lines.append(f"{row_index * band:>9} |{''.join(cells)}|")
    lines.append(" " * 10 + "+" + "-" * width + "+")
    last = f"op {steps - 1}"
    if width > len("op 0") + len(last):
        lines.append(" " * 11 + "op 0" + last.rjust(width - len("op 0")))
    else:  # too narrow for both labels
        lines.append(" " * 11 + ("op 0" if steps == 1 else f"ops 0-{steps - 1}"))
    return "\n".join(lines)


def memory_map_svg(mp: ModelPlan) -> str:
    """The memory map as SVG: one rectangle per buffer, x = op step, y = offset. The template
    escapes markup; names and the path are first made displayable (`display_text`), since XML
    has no way at all to carry a NUL or most other control characters."""
    steps = max(len(mp.lifetimes.order), 1)
    width, height, margin = 800, 480, 48
    x_scale = (width - 2 * margin) / steps
    y_scale = (height - 2 * margin) / max(mp.arena_bytes, 1)
    rects = [
        {
            "x": round(margin + r.first_op * x_scale, 2),
            "y": round(margin + r.offset * y_scale, 2),
            "w": round((r.last_op - r.first_op + 1) * x_scale, 2),
            "h": round(max(r.bytes * y_scale, 0.5), 2),
            "hue": (r.buffer * 47) % 360,
            "title": f"{display_text(r.name)}: {r.bytes} bytes at offset {r.offset}, "
            f"ops {r.first_op}-{r.last_op}",
        }
        for r in mp.rows()
    ]
    pools = [
        {"y": round(margin + (a.base + a.bytes) * y_scale, 2),
         "label": f"{display_text(a.pool.name)}: {a.bytes} of {a.pool.capacity} bytes"}
        for a in mp.pools
    ]
    return render(
        "memory_map.svg.j2",
        width=width,
        height=height,
        margin=margin,
        rects=rects,
        title=f"{display_text(mp.model.source)}: {mp.plan.planner} plan, "
        f"arena {mp.arena_bytes} bytes, "
        f"lower bound {mp.lower_bound_bytes} bytes",
        arena_bytes=mp.arena_bytes,
        steps=steps,
        pools=pools,
    )
