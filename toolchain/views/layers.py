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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolchain.c.generate import flash_weights
from toolchain.lower.lifetimes import TENSOR
from toolchain.lower.plan import ModelPlan
from toolchain.lower.tiling import op_macs
from toolchain.targets import BOARDS, PARTS
from toolchain.text import display_text, table

if TYPE_CHECKING:
    from toolchain.lab.bench import BenchResult


def layer_rows(mp: ModelPlan) -> list[dict[str, Any]]:
    """One row per step of the plan's execution order."""
    program, graph, lifetimes = mp.program, mp.graph, mp.lifetimes
    flash = flash_weights(mp)
    weights = flash.constants
    seen: set[int] = set()
    rows = []
    tops = mp.arena_tops()
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
            "arena_high_water": tops[step],
            "scratch_bytes": sum(r.size for r in binding.scratch) if binding else 0,
            "weight_bytes": sum(weights[t] for t in constants),
            "kernel_weight_bytes": flash.kernel.get(op_index, 0),
            "op_index": op_index,
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


@dataclass(frozen=True)
class Limits:
    """The memory a firmware must fit in: a board's flash and the RAM its data and stack use."""

    name: str
    flash: int
    ram: int


def board_limits(mp: ModelPlan, board: str | None) -> Limits:
    """A named board's limits: a real part (targets.PARTS) or a QEMU machine; by default the
    machine the plan's target runs on."""
    from toolchain.lab.firmware import mcu_target

    if board in PARTS:
        part = PARTS[board]
        return Limits(f"{part.name} {part.flash.name} and {part.ram.name}", part.flash.length,
                      part.ram.length)
    machine = BOARDS[board] if board else mcu_target(mp).board
    return Limits(machine.machine, machine.code.length, machine.ram.length)


def layers_data(mp: ModelPlan, measured: BenchResult | None = None,
                limits: Limits | None = None) -> dict[str, Any]:
    """The rows and totals; with `measured` (a bench of the plan) each step's code,
    instructions and estimated cycles too, and the firmware's flash and RAM against `limits`."""
    rows = layer_rows(mp)
    totals = {
        "macs": sum(r["macs"] for r in rows),
        "arena_bytes": mp.arena_bytes,
        "state_bytes": mp.state_bytes,
        "weight_bytes": sum(r["weight_bytes"] for r in rows),
        "kernel_weight_bytes": sum(r["kernel_weight_bytes"] for r in rows),
        "tensors_planned": sum(1 for k in mp.lifetimes.keys if k.kind == TENSOR),
    }
    if measured is not None:
        add_measured(rows, totals, measured, limits or board_limits(mp, None))
    return {"layers": rows, "totals": totals}


def add_measured(rows: list[dict[str, Any]], totals: dict[str, Any], measured: BenchResult,
                 limits: Limits) -> None:
    """Each step's code (its kernel's functions, a striped op's stripe functions), instructions
    and nominal cycles; the firmware's flash and RAM, each split, against the limits."""
    f = measured.footprint
    code = {k["op"]: k["bytes"] for k in f["kernels"]}
    steps = {s.step: s for s in measured.steps}
    for row in rows:
        row["code_bytes"] = code.get(row["op_index"], 0)
        row["instructions"] = steps[row["step"]].instructions if row["step"] in steps else None
        row["cycles"] = steps[row["step"]].cycles if row["step"] in steps else None
    ram = f["ram"] + f["stack"]
    totals.update({
        "code_bytes": sum(r["code_bytes"] for r in rows),
        "instructions": measured.instructions,
        "cycles": measured.cycles.nominal if measured.cycles else None,
        "flash": {"bytes": f["flash"], "weights": f["weights"],
                  "kernel_weights": f["kernel_weights"], "code": f["code"],
                  "constants": f["constants"], "limit": limits.flash,
                  "margin": limits.flash - f["flash"]},
        "ram": {"bytes": ram, "arena": f["arena"], "state": f["state"], "stack": f["stack"],
                "other": f["ram_other"], "limit": limits.ram, "margin": limits.ram - ram},
        "limits": limits.name,
    })


def layers_text(mp: ModelPlan, measured: BenchResult | None = None,
                limits: Limits | None = None) -> str:
    data = layers_data(mp, measured, limits)
    rows, totals = data["layers"], data["totals"]
    extra = ["code", "instr", "cycles"] if measured is not None else []
    body = table(["step", "op", "opcode", "MACs", "live", "arena top", "scratch", "weights",
                  *extra],
                 [[r["step"], r["op"], display_text(r["opcode"]), r["macs"] or "-",
                   r["live_bytes"], r["arena_high_water"], r["scratch_bytes"] or "-",
                   r["weight_bytes"] + r["kernel_weight_bytes"] or "-",
                   *([r["code_bytes"] or "-", dash(r["instructions"]), dash(r["cycles"])]
                     if measured is not None else [])] for r in rows])
    lines = [
        body, "",
        f"total        {totals['macs']:,} MACs; arena {totals['arena_bytes']:,} bytes (the "
        f"highest top), state {totals['state_bytes']:,} bytes, weights "
        f"{totals['weight_bytes'] + totals['kernel_weight_bytes']:,} bytes"
        + (f" ({totals['kernel_weight_bytes']:,} of them in the kernels' own layouts)"
           if totals["kernel_weight_bytes"] else ""),
    ]
    if measured is not None:
        fl, ram = totals["flash"], totals["ram"]
        cycles = f", {totals['cycles']:,} cycles (nominal)" if totals["cycles"] else ""
        lines += [
            f"invoke       {totals['instructions']:,} instructions{cycles}; kernels' code "
            f"{totals['code_bytes']:,} bytes",
            f"flash        {fl['bytes']:,} bytes: weights {fl['weights']:,} + kernel weights "
            f"{fl['kernel_weights']:,} + code {fl['code']:,} + constants {fl['constants']:,}; "
            f"limit {fl['limit']:,}, margin {fl['margin']:,}",
            f"RAM          {ram['bytes']:,} bytes: arena {ram['arena']:,} + state "
            f"{ram['state']:,} + stack {ram['stack']:,} + other {ram['other']:,}; limit "
            f"{ram['limit']:,}, margin {ram['margin']:,}",
            f"limits       {totals['limits']}",
            *(f"striped      steps {seg.first}-{seg.last} run in one call: their instructions "
              f"and cycles stand at step {seg.first}" for seg in mp.tiling.segments),
        ]
    return "\n".join(lines)


def dash(value: int | None) -> str | int:
    return "-" if value is None else value
