"""The footprint of the generated C on a Cortex-M (the plan's target; a Cortex-M4 for portable
C), from the firmware toolchain.lab.firmware builds.

`footprint` measures the linked ELF with arm-none-eabi-size, -nm and -objdump, and GCC's
-fstack-usage (.su) files:

- flash = .text + .rodata + .ARM.extab/.ARM.exidx + .data's initial values (+ .vectors where
  the board keeps the vector table apart), split into
  `weights` (the model's constant tensors as it stores them: the const `NAME_t<N>` arrays),
  `kernel_weights` (filters a target's kernels keep in a layout of their own, widened or
  interleaved: `NAME_op<N>_filter`, `_w16`, `_w`, `_span_w`; where a kernel reads only its
  copy, the linker drops the model's array, so the copy replaces it rather than adding to it),
  `code` (.text: kernels, startup, harness, C library) and `constants` (the rest: offset
  table, per-channel rescaling tables, state initializers, library tables);
- RAM = .data + .bss, split into `arena` (`NAME_arena`), `state` (`NAME_state`) and
  `ram_other` (the harness and the C library); the stack is not in it;
- stack: a static worst case, the deepest chain of frames from Reset_Handler. The firmware
  has one chain, Reset_Handler -> main -> NAME_invoke -> a kernel -> its helpers and C library
  calls, so this is the brief's "main + invoke + largest kernel" made exact: frames come from
  the .su files for the generated code and from the disassembly for the C library (every push
  and `sub sp` of a library function counted: an upper bound), calls from the disassembly
  (`bl`, and branches into other functions). `stack_unknown` lists anything that would make it
  no bound (dynamic frames, recursion, indirect calls); it is empty for generated models. The
  harness also measures the real high-water mark by painting the stack (QemuBackend);
- flash per kernel: the size of each `NAME_op<N>_<opcode>` function (the build keeps every
  kernel a function of its own). A kernel with `present` False is not in the image: its body
  compiled to nothing (a RESHAPE whose output the plan placed over its input) and -Os dropped
  the call.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from toolchain.c.generate import kernel_function
from toolchain.lab.firmware import McuBuild, build_mcu, mcu_target, run_tool, tool
from toolchain.lower.plan import ModelPlan
from toolchain.ops.emit import KERNEL_WEIGHT_TABLE
from toolchain.targets import TARGETS

FLASH_SECTIONS = (".vectors", ".text", ".rodata", ".ARM.extab", ".ARM.exidx", ".data")
RAM_SECTIONS = (".data", ".bss")
# A kernel's own copy of its filter (op<N>, a striped op<N>s<K>): the names toolchain.ops give
KERNEL_WEIGHTS = r"{name}_(?:sg\d+_)?" + KERNEL_WEIGHT_TABLE


def section_sizes(path: str) -> dict[str, int]:
    """`arm-none-eabi-size -A`: section name -> bytes."""
    out = run_tool([tool("size"), "-A", path], os.path.dirname(path), "arm-none-eabi-size")
    return {m[0]: int(m[1]) for m in re.findall(r"^(\.\S+)\s+(\d+)\s+\d+\s*$", out, re.M)}


def symbol_sizes(path: str) -> dict[str, tuple[str, int]]:
    """`arm-none-eabi-nm -S --size-sort`: symbol -> (type letter, bytes)."""
    out = run_tool(
        [tool("nm"), "-S", "--size-sort", path], os.path.dirname(path), "arm-none-eabi-nm"
    )
    symbols = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4:
            symbols[parts[3]] = (parts[2], int(parts[1], 16))
    return symbols


def stack_frames(paths: tuple[str, ...]) -> dict[str, tuple[int, str]]:
    """GCC's .su files: function -> (frame bytes, qualifier: static, dynamic, bounded)."""
    frames = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                location, size, qualifier = line.rstrip("\n").split("\t")
                frames[location.rsplit(":", 1)[-1]] = (int(size), qualifier)
    return frames


@dataclass(frozen=True)
class StackBound:
    """The deepest call chain from the reset handler, and what the bound could not see."""

    bytes: int
    path: tuple[tuple[str, int], ...]  # (function, frame bytes), outermost first
    unknown: tuple[str, ...]  # dynamic frames, recursion, indirect calls: the bound is not one


# Calls and branches with a target address: bl, blx <label>, b, b<cond>, with .n/.w widths.
BRANCH = re.compile(r"b(l|lx)?(eq|ne|cs|cc|hs|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le|al)?(\.[nw])?")


def disassembly(elf: str) -> dict[str, tuple[int, set[str], bool]]:
    """Per function of the ELF: the bytes its pushes and `sub sp` take (all of them, whatever
    the path: an upper bound), the functions it calls or branches into, and whether it makes
    an indirect call."""
    out = run_tool(
        [tool("objdump"), "-d", "--no-show-raw-insn", elf], os.path.dirname(elf), "objdump"
    )
    functions: dict[str, tuple[int, set[str], bool]] = {}
    current, frame, callees, indirect = None, 0, set(), False
    for line in out.splitlines() + [""]:
        header = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if header or not line:
            if current is not None:
                functions[current] = (frame, callees, indirect)
            current, frame, callees, indirect = (header[1] if header else None), 0, set(), False
            continue
        fields = line.split("\t")
        if current is None or len(fields) < 3:
            continue
        mnemonic, operands = fields[1].strip(), fields[2].strip()
        frame += sp_decrement(mnemonic, operands)
        if BRANCH.fullmatch(mnemonic):
            target = re.search(r"<([^>+]+)(\+0x[0-9a-f]+)?>", operands)
            if target is None:
                indirect |= mnemonic.startswith("blx")  # blx rN: a call through a register
            elif target[1] != current:
                callees.add(target[1])
    return functions


def sp_decrement(mnemonic: str, operands: str) -> int:
    """Bytes one Thumb-2 instruction takes from the stack pointer (0 for most)."""
    registers = re.search(r"\{([^}]*)\}", operands)
    if (
        mnemonic in ("push", "push.w", "vpush")
        or (mnemonic.startswith("stmdb") and operands.startswith("sp!"))
        or (mnemonic.startswith("vstmdb") and operands.startswith("sp!"))
    ):
        total = 0
        for item in registers[1].split(",") if registers else []:
            ends = [int(x) for x in re.findall(r"\d+", item)] or [0]
            count = ends[-1] - ends[0] + 1
            total += count * (8 if item.strip().startswith("d") else 4)
        return total
    if re.fullmatch(r"subw?(\.w)?", mnemonic) and re.match(r"sp, (sp, )?#\d+", operands):
        return int(re.search(r"#(\d+)", operands)[1])
    pre_indexed = re.search(r"\[sp, #-(\d+)\]!", operands)
    return int(pre_indexed[1]) if pre_indexed and mnemonic.startswith(("str", "vstr")) else 0


def worst_stack(build: McuBuild, root: str = "Reset_Handler") -> StackBound:
    """The deepest chain of frames from `root`: frames from GCC's .su files for the generated
    code, from the disassembly for the C library (every push counted: an upper bound); calls
    from the disassembly (`bl`, and branches into other functions: tail calls)."""
    functions = disassembly(build.elf)
    su = stack_frames(build.stack_files)
    unknown: set[str] = set()
    memo: dict[str, tuple[int, tuple[tuple[str, int], ...]]] = {}

    def deepest(fn: str, active: frozenset[str]) -> tuple[int, tuple[tuple[str, int], ...]]:
        if fn in memo:
            return memo[fn]
        disassembled, callees, indirect = functions.get(fn, (0, set(), False))
        if fn in su:
            frame, qualifier = su[fn]
            if "dynamic" in qualifier and "bounded" not in qualifier:
                unknown.add(f"{fn}: dynamic frame")
        else:
            frame = disassembled
        if fn not in functions:
            unknown.add(f"{fn}: not in the image")
        if indirect:
            unknown.add(f"{fn}: indirect call")
        best: tuple[int, tuple[tuple[str, int], ...]] = (0, ())
        for callee in sorted(callees):
            if callee in active:
                unknown.add(f"{fn} -> {callee}: recursion")
                continue
            best = max(best, deepest(callee, active | {callee}), key=lambda b: b[0])
        memo[fn] = (frame + best[0], ((fn, frame),) + best[1])
        return memo[fn]

    total, path = deepest(root, frozenset({root}))
    return StackBound(total, path, tuple(sorted(unknown)))


def object_sizes(path: str) -> dict[str, int]:
    """One object file's text, rodata, data and bss, summed over its -ffunction-sections."""
    totals = {"text": 0, "rodata": 0, "data": 0, "bss": 0}
    for section, size in section_sizes(path).items():
        kind = section.lstrip(".").split(".")[0]
        if kind in totals:
            totals[kind] += size
    return totals


def footprint(mp: ModelPlan, name: str = "model") -> dict[str, Any]:
    """Build the firmware in a temporary directory and measure it (see the module docstring)."""
    directory = tempfile.mkdtemp(prefix="arenac-mcu-")
    try:
        return measure(build_mcu(mp, directory, name), mp)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def measure(build: McuBuild, mp: ModelPlan) -> dict[str, Any]:
    """Footprint of a linked build of `mp`, as plain data."""
    name = build.name
    sections = section_sizes(build.elf)
    symbols = symbol_sizes(build.elf)
    flash = sum(sections.get(s, 0) for s in FLASH_SECTIONS)
    ram = sum(sections.get(s, 0) for s in RAM_SECTIONS)
    weights = sum(size for sym, (_, size) in symbols.items()
                  if re.fullmatch(rf"{name}_(?:sg\d+_)?t\d+(?:_int4)?", sym))
    kernel_weights = sum(size for sym, (_, size) in symbols.items()
                         if re.fullmatch(KERNEL_WEIGHTS.format(name=name), sym))
    code = sections.get(".text", 0)
    pools = [
        {"name": a.pool.name, "section": a.pool.section, "capacity": a.pool.capacity,
         "planned": a.bytes,
         "measured": symbols.get(f"{name}_{a.pool.name}_arena", ("b", 0))[1] if a.bytes else 0}
        for a in mp.pools
    ]
    arena = sum(p["measured"] for p in pools) if pools else \
        symbols.get(f"{name}_arena", ("b", 0))[1]
    state = symbols.get(f"{name}_state", ("b", 0))[1]

    graph = mp.graph
    kernel_names = {index: kernel_function(name, mp, index) for index in mp.lifetimes.order}
    striped = {op for s in mp.tiling.segments for op in s.ops}

    def functions(index: int, fn: str) -> list[str]:
        """A kernel's function; a striped op's, one per run of alike stripes (in each column
        tile cut its own way)."""
        return [f for f in symbols if f.startswith((f"{fn}_stripes", f"{fn}_tile"))] \
            if index in striped else [fn] if fn in symbols else []

    kernels = [
        {
            "op": index,
            "opcode": graph.operators[index].opcode,
            "function": f"{fn}_stripes*" if index in striped else fn,
            "bytes": sum(symbols[f][1] for f in functions(index, fn)),
            "present": bool(functions(index, fn)),
        }
        for index, fn in kernel_names.items()
    ]

    stack = worst_stack(build)
    target = mcu_target(mp)
    return {
        "model": mp.model.source,
        "planner": mp.plan.planner,
        "board": target.board.machine,
        "cpu": target.name,
        "flash": flash,
        "weights": weights,
        "kernel_weights": kernel_weights,
        "code": code,
        "constants": flash - weights - kernel_weights - code,
        "ram": ram,
        "arena": arena,
        "state": state,
        "ram_other": ram - arena - state,
        "planned_arena": mp.arena_bytes,
        **({"pools": pools} if pools else {}),
        "stack": stack.bytes,
        "stack_path": [{"function": fn, "bytes": size} for fn, size in stack.path],
        "stack_unknown": list(stack.unknown),
        "kernels": kernels,
        "sections": {s: sections[s] for s in sections if s in FLASH_SECTIONS + RAM_SECTIONS},
        "objects": {os.path.basename(o): object_sizes(o) for o in build.objects},
    }


def footprint_table(rows: list[dict[str, Any]]) -> str:
    """One line per footprint: flash and its split, RAM and its split, worst-case stack."""
    from toolchain.text import table

    headers = ["model", "flash", "weights", "kernel w", "code", "const", "ram", "arena", "state",
               "other"]
    pooled = any("pools" in r for r in rows)
    return table(
        headers + ["stack"] + (["pools"] if pooled else []),
        [
            [
                os.path.splitext(os.path.basename(r["model"]))[0],
                r["flash"],
                r["weights"],
                r["kernel_weights"],
                r["code"],
                r["constants"],
                r["ram"],
                r["arena"],
                r["state"],
                r["ram_other"],
                r["stack"],
                *([", ".join(f"{p['name']} {p['measured']}" for p in r.get("pools", ()))]
                  if pooled else []),
            ]
            for r in rows
        ],
    )


def kernel_table(row: dict[str, Any]) -> str:
    """Flash per kernel of one footprint, in execution order."""
    from toolchain.text import table

    return table(
        ["op", "opcode", "function", "bytes"],
        [
            [k["op"], k["opcode"], k["function"], k["bytes"] if k["present"] else "-"]
            for k in row["kernels"]
        ],
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m toolchain.lab.footprint MODEL... [planning options] [--kernels] [--json]`."""
    import argparse
    import json
    import sys

    from toolchain.errors import ArenacError
    from toolchain.front.reader import read_model
    from toolchain.lower.plan import plan_model
    from toolchain.options import add_planning, planning

    parser = argparse.ArgumentParser(
        prog="python -m toolchain.lab.footprint",
        description="flash, RAM and stack of each model's C built for a Cortex-M target",
        allow_abbrev=False,
    )
    parser.add_argument("models", nargs="+", metavar="MODEL", help=".tflite files")
    add_planning(parser)  # the options and defaults of every arenac command that plans
    parser.add_argument("--target", default="generic", choices=[t for t in TARGETS],
                        help="kernels and core (default: generic, portable C on a Cortex-M4)")
    parser.add_argument("--kernels", action="store_true", help="also flash per kernel")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    try:
        rows = [footprint(plan_model(read_model(m), **planning(args))) for m in args.models]
    except ArenacError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(footprint_table(rows))
    for row in rows if args.kernels else []:
        print(
            f"\n{row['model']}: stack path "
            + " -> ".join(f"{s['function']} {s['bytes']}" for s in row["stack_path"])
        )
        print(kernel_table(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
