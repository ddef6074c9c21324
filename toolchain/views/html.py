"""`arenac report`: inspect, plan, the memory map, the footprint and check on one HTML page.

Python computes every figure and every table row; templates/report.html.j2 only lays them
out. The page is self-contained (inline style and SVG, no script, nothing fetched) and, like
the generated C, names the model by its SHA-256 and file name, never by the path typed.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from toolchain import __version__
from toolchain.errors import ArenacError
from toolchain.lower.plan import ModelPlan
from toolchain.render import render
from toolchain.views.report import (
    CLOCK_CUT,
    bounds,
    inspect_data,
    memory_map_svg,
    plan_data,
    symbol,
    tensor_type,
)


def report_html(mp: ModelPlan, model_bytes: bytes, inputs: int = 3, seed: int = 0,
                check: bool = True, footprint: bool = True) -> str:
    """The page for a plan. A check or footprint that cannot run here (no C compiler, no Arm
    toolchain, an oracle that refuses the model) is reported as not run, with the reason."""
    model = inspect_data(mp.model)
    plan = plan_data(mp)
    graph = model["graphs"][mp.graph_index]
    rows = mp.rows()
    measured = footprint_section(mp) if footprint else not_run("not asked for")
    return render(
        "report.html.j2",
        version=__version__,
        file_name=os.path.basename(mp.model.source),
        sha256=mp.model.sha256,
        summary=[
            ("planner", plan["planner"] + (", proven optimal" if plan["proven_optimal"] else "")),
            ("arena", f"{plan['arena_bytes']} bytes (alignment {plan['alignment']})"),
            ("lower bound", "; ".join(bounds(mp))),
            ("naive sum", f"{plan['naive_bytes']} bytes"),
            ("state", f"{plan['state_bytes']} bytes"),
            ("weights", f"{graph['weight_bytes']} bytes"),
            ("operators", f"{len(graph['operators'])} in subgraph {mp.graph_index}, "
                          f"{len(plan['order'])} steps"),
            ("target", mp.program.target),
            *([("time limit", CLOCK_CUT)] if mp.clock_cut else []),
        ],
        svg=memory_map_svg(mp),  # markup of its own template, escaped there
        buffers=[[symbol(r.buffer, len(rows)), "-" if b["tensor"] is None else b["tensor"],
                  b["name"], b["bytes"], b["first_op"], b["last_op"], b["offset"]]
                 for r, b in zip(rows, plan["buffers"], strict=True)],
        state=[[s["offset"], s["bytes"], s["kind"], s["name"]] for s in plan["state"]],
        operators=[[o["index"], o["opcode"],
                    " ".join(str(t) if t >= 0 else "-" for t in o["inputs"]),
                    " ".join(map(str, o["outputs"])),
                    "yes" if o["supported"] else f"NO: {o['refusal']}"]
                   for o in graph["operators"]],
        tensors=[[t["index"], t["name"], tensor_type(t), t["bytes"], t["kind"]]
                 for t in graph["tensors"]],
        layers=layer_cells(mp, measured),
        footprint=measured,
        check=check_section(mp, model_bytes, inputs, seed) if check else not_run("not asked for"),
    )


def not_run(reason: str) -> dict[str, Any]:
    return {"ran": False, "reason": reason}


def footprint_section(mp: ModelPlan) -> dict[str, Any]:
    """Flash, RAM and stack of the C built for the plan's Cortex-M, with flash per kernel."""
    from toolchain.lab.firmware import toolchain_available
    from toolchain.lab.footprint import footprint

    if not toolchain_available():
        return not_run("the Arm GNU toolchain (arm-none-eabi-gcc) is not installed")
    try:
        f = footprint(mp)
    except ArenacError as e:
        return not_run(e.message)
    return {
        "ran": True,
        "where": f"{f['cpu']} ({f['board']})",
        "figures": [("flash", f["flash"]), ("weights", f["weights"]),
                    ("kernel weights", f["kernel_weights"]), ("code", f["code"]),
                    ("constants", f["constants"]), ("RAM", f["ram"]), ("arena", f["arena"]),
                    ("state", f["state"]), ("other RAM", f["ram_other"]),
                    ("stack (worst case)", f["stack"])],
        "kernels": [[k["op"], k["opcode"], k["function"], k["bytes"] if k["present"] else "-"]
                    for k in f["kernels"]],
        "code_of": {k["op"]: k["bytes"] for k in f["kernels"] if k["present"]},
    }


def layer_cells(mp: ModelPlan, measured: dict[str, Any]) -> list[list[Any]]:
    """`plan --layers`'s rows: each step's MACs, arena in use and top, scratch and weights,
    and its kernel's code where the footprint ran."""
    from toolchain.views.layers import layer_rows

    code = measured.get("code_of", {})
    return [[r["step"], r["op"], r["opcode"], r["macs"] or "-", r["live_bytes"],
             r["arena_high_water"], r["scratch_bytes"] or "-",
             r["weight_bytes"] + r["kernel_weight_bytes"] or "-",
             code.get(r["op_index"], "-")] for r in layer_rows(mp)]


def check_section(mp: ModelPlan, model_bytes: bytes, inputs: int, seed: int) -> dict[str, Any]:
    """`check` with its default backends: runtime_py and the C on this host, or under QEMU
    for a Cortex-M target."""
    from toolchain.lab.c_backend import CBackend
    from toolchain.lab.check import check_plan

    try:
        with contextlib.ExitStack() as stack:
            if mp.program.target == "generic":
                extra = [("c", stack.enter_context(CBackend(mp)).invoke_many)]
            else:
                from toolchain.lab.qemu_backend import QemuBackend

                extra = [("qemu", stack.enter_context(QemuBackend(mp)).invoke_many)]
            report = check_plan(mp, model_bytes, inputs, seed, extra)
    except ArenacError as e:
        return not_run(e.message)
    return {
        "ran": True,
        "ok": report.ok,
        "backends": f"{report.backends[0]} (oracle) vs {', '.join(report.backends[1:])}",
        "inputs": f"{inputs} random input set(s) from seed {seed}, {report.sequence} "
                  "invoke(s) each, state kept within a set",
        "outputs": [[o.name, o.dtype, f"{o.max_abs_diff:g}", o.mismatches,
                     "ok" if o.mismatches == 0 else "DIFFERS"] for o in report.outputs],
    }
