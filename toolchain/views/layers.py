"""`arenac plan --layers`: what each step of a plan costs, from the plan alone.

Per step: its op, the multiply-accumulates its kernel does (for the ops that count them: the
convolutions, pooling, striped elementwise ops and FULLY_CONNECTED), the arena bytes its live
buffers cover while it runs (shared bytes once) and the arena's top then (the highest byte any
of them reaches), its
kernel's scratch, and the weights it reads first: the constant arrays the generated C defines,
each counted at its first reader (an int4 filter packed), and the tables in which its kernel
lays its filter out for its loops, widened or reordered (toolchain.c.generate.flash_weights).
The totals are the plan's arena, the state block and the C's weights, the `weights` and
`kernel_weights` of `footprint`'s linked image; `bench` adds each step's instructions and
cycles on a Cortex-M.
"""

from __future__ import annotations

from typing import Any

from toolchain.c.generate import flash_weights
from toolchain.lower.lifetimes import TENSOR
from toolchain.lower.plan import ModelPlan
from toolchain.lower.tiling import op_macs
from toolchain.text import display_text, table


def layer_rows(mp: ModelPlan) -> list[dict[str, Any]]:
    """One row per step of the plan's execution order."""
    program, graph, lifetimes = mp.program, mp.graph, mp.lifetimes
    flash = flash_weights(mp)
    weights = flash.constants
    seen: set[int] = set()
    rows = []
    for step, op_index in enumerate(lifetimes.order):
        op = graph.operators[op_index]
        live = [(buffer, offset) for buffer, offset in zip(mp.plan.buffers, mp.plan.offsets,
                                                           strict=True)
                if buffer.first <= step <= buffer.last]
        binding = program.bindings[op_index]
        constants = [t for t in op.inputs if t in weights and t not in seen]
        seen.update(constants)
        rows.append({
            "step": step,
            "op": program.op_label(op_index),
            "opcode": op.opcode if op.opcode != "CUSTOM" else op.kind,
            "macs": op_macs(graph, binding),
            "live_bytes": covered(sorted((o, o + b.size) for b, o in live)),
            "arena_high_water": max((o + b.size for b, o in live), default=0),
            "scratch_bytes": sum(r.size for r in binding.scratch) if binding else 0,
            "weight_bytes": sum(weights[t] for t in constants),
            "kernel_weight_bytes": flash.kernel.get(op_index, 0),
        })
    return rows


def covered(spans: list[tuple[int, int]]) -> int:
    """Bytes of the arena within at least one of the sorted spans (an output placed over its
    dying input shares bytes with it: counted once)."""
    total, reached = 0, 0
    for start, end in spans:
        total += max(0, end - max(start, reached))
        reached = max(reached, end)
    return total


def layers_data(mp: ModelPlan) -> dict[str, Any]:
    rows = layer_rows(mp)
    return {"layers": rows, "totals": {
        "macs": sum(r["macs"] for r in rows),
        "arena_bytes": mp.arena_bytes,
        "state_bytes": mp.state_bytes,
        "weight_bytes": sum(r["weight_bytes"] for r in rows),
        "kernel_weight_bytes": sum(r["kernel_weight_bytes"] for r in rows),
        "tensors_planned": sum(1 for k in mp.lifetimes.keys if k.kind == TENSOR),
    }}


def layers_text(mp: ModelPlan) -> str:
    data = layers_data(mp)
    rows, totals = data["layers"], data["totals"]
    body = table(["step", "op", "opcode", "MACs", "live", "arena top", "scratch", "weights"],
                 [[r["step"], r["op"], display_text(r["opcode"]), r["macs"] or "-",
                   r["live_bytes"], r["arena_high_water"], r["scratch_bytes"] or "-",
                   r["weight_bytes"] + r["kernel_weight_bytes"] or "-"] for r in rows])
    return "\n".join([
        body, "",
        f"total        {totals['macs']:,} MACs; arena {totals['arena_bytes']:,} bytes (the "
        f"highest top), state {totals['state_bytes']:,} bytes, weights "
        f"{totals['weight_bytes'] + totals['kernel_weight_bytes']:,} bytes"
        + (f" ({totals['kernel_weight_bytes']:,} of them in the kernels' own layouts)"
           if totals["kernel_weight_bytes"] else ""),
    ])
