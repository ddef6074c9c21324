"""`arenac bench`: instructions executed per inference on a Cortex-M target under QEMU.

The generated C is built for the plan's target (toolchain.lab.firmware: its -mcpu and FPU, here at
-O2 unless asked otherwise) with a harness (templates/mcu/bench_main.c.j2) that includes the
model's C and reads the MPS2 FPGA's free-running COUNTER around the whole invoke and around each
step's kernel function. QEMU runs with `-icount shift=7,align=off,sleep=off`: its virtual clock
then advances by exactly 2^7 ns per executed instruction, whatever the host does, and the
counter counts that clock at the board's prescale frequency (25 MHz on the MPS2 boards: 3.2
ticks per instruction), so

    instructions = round(ticks * 10^9 / (frequency * 2^shift))

exactly: two readings are each at most one tick away from the true count, and a tick is less
than half an instruction. The count is deterministic: the same firmware on the same input
executes the same instructions. QEMU 7.2 does not emulate the DWT cycle counter, has no insn
plugin in the Debian build, and with `-icount shift=0` (1 ns per instruction) the 25 MHz counter
would resolve 40 instructions only; shift=7 keeps the meaning (one count per instruction) and
makes it exact.

Each run also checks the counter's meaning: two loops of known length (2 instructions a trip)
must differ by exactly the instructions their trip counts say, and the cost of an empty bracket
(the counter read itself, constant) is subtracted from every measurement. An instruction is not
a cycle: where the core has a timing table (toolchain.lab.timings: Cortex-M4, M33, M7, M55) the
same QEMU run also profiles every instruction (toolchain.lab.cycles), and the bench estimates
cycles, optimistic, nominal and pessimistic, per inference and per step, at `wait_states`
flash wait states.

    result = bench(plan_model(model, target="cortex-m4"))
    result.instructions                 # per inference
    result.steps                        # per step: op, opcode, kernel, instructions, bytes
    result.cycles                       # an Estimate (None where the core has no table)
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from toolchain.c.generate import generate, kernel_function
from toolchain.errors import RuntimeBackendError
from toolchain.lab import cycles as cycle_model
from toolchain.lab.check import random_inputs
from toolchain.lab.firmware import (
    INPUT_FILE,
    OUTPUT_FILE,
    board_of,
    build_mcu,
    firmware_failure,
    harness_values,
    mcu_target,
    support_files,
    tool,
    uses_external_io,
)
from toolchain.lab.footprint import measure
from toolchain.lower.plan import ModelPlan
from toolchain.progress import step
from toolchain.render import render
from toolchain.targets import Region
from toolchain.text import c_identifier

ICOUNT_SHIFT = 7  # 2^7 ns of virtual time per instruction
ICOUNT = f"shift={ICOUNT_SHIFT},align=off,sleep=off"
SPIN_SHORT, SPIN_LONG = 1000, 3000  # trips of the calibration loops (2 instructions a trip)
BENCH_TIMEOUT = 900.0  # seconds for one QEMU run
OPTIMIZATIONS = ("-O2", "-Os", "-O3")
# The readings before the steps: the two loops, the empty bracket and the whole invoke.
CALIBRATION_READINGS = 8
INVOKE_BRACKET = 3  # the brackets: two loops, the empty one, the invoke, then the steps
BRACKETS_BEFORE_STEPS = 4


@dataclass(frozen=True)
class StepCount:
    step: int
    op: int
    opcode: str
    kernel: str  # "portable", or the target kernel's name
    function: str
    instructions: int
    bytes: int  # the kernel function's code size
    cycles: int | None = None  # estimated, nominal (None where the core has no timing table)


@dataclass(frozen=True)
class BenchResult:
    model: str
    target: str
    board: str
    optimization: str
    kernels: str  # "target" (the target's own kernels where they apply) or "portable"
    instructions: int  # the whole invoke, per inference
    steps: tuple[StepCount, ...]
    counter_overhead: int  # instructions of an empty bracket, subtracted from every count
    arena_bytes: int
    flash: int  # of the firmware (toolchain.lab.footprint), weights and harness included
    ram: int  # .data + .bss of that firmware: the arena, the state and the harness's few bytes
    outputs_match: bool | None  # the last run's outputs equal runtime_py's (None: not checked)
    cycles: cycle_model.Estimate | None = None  # the whole invoke, where the core has a table
    wait_states: int = 0  # flash wait states the estimate assumes
    timing: str | None = None  # the timing table's source
    # toolchain.lab.footprint.measure of the firmware (flash and RAM split, stack, per kernel)
    footprint: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["instructions_per_inference"] = data.pop("instructions")
        return data


def bench_sources(mp: ModelPlan, name: str) -> tuple[dict[str, str], list[dict]]:
    """The model's C, the board's support files and the counting harness; and the steps."""
    target = mcu_target(mp)
    board = board_of(target, mp.model.source)
    if uses_external_io(mp):
        raise RuntimeBackendError("bench runs plans made without external I/O", mp.model.source)
    files = generate(mp, name)
    del files[f"{name}_main.c"]
    defined = set(re.findall(r"\b\w+\b", files[f"{name}.c"]))  # the kernels with code
    files.update(support_files(target))
    graph, program = mp.graph, mp.program
    # The steps the invoke calls: the main graph's (a CALL_ONCE's count holds the steps of the
    # subgraph it runs, as the state is reset before each), each op with code of its own.
    # A striped segment is one step: the function that runs its stripes.
    segments = {s.first: s for s in mp.tiling.segments}
    steps = [
        {"step": step, "op": op, "opcode": graph.operators[op].opcode, "fn": fn,
         "comment": mp.step_label(step)} if step not in segments else
        {"step": step, "op": op, "opcode": "STRIPED", "fn": fn, "kernel": "stripes",
         "comment": f"steps {step}-{segments[step].last} striped"}
        for step, op in enumerate(mp.lifetimes.order)
        if program.op_origin(op)[0] == mp.graph_index
        and (fn := f"{name}_stripes{step}" if step in segments
             else kernel_function(name, mp, op)) in defined
    ]
    harness = render(
        "mcu/bench_main.c.j2",
        board=board.machine,
        cpu=target.name,
        name=name,
        counter=f"0x{board.counter:08x}",
        readings=CALIBRATION_READINGS + 2 * len(steps),
        **harness_values(mp, name),
        steps=steps,
        # GCC reads Armv6-M inline assembly in the divided syntax, where `sub` sets the flags
        spin_decrement="sub %0, #1" if target.arch == "armv6-m" else "subs %0, %0, #1",
        spin_short=SPIN_SHORT,
        spin_long=SPIN_LONG,
    )
    files[f"{name}_bench.c"] = harness
    return files, steps


def bench(mp: ModelPlan, name: str = "model", optimization: str = "-O2",
          inputs: list[np.ndarray] | None = None, check: bool = True,
          timeout: float = BENCH_TIMEOUT, wait_states: int = 0) -> BenchResult:
    """Instructions per inference and per step of the plan's C on its target under QEMU, on
    `inputs` (default: check's random input set of seed 0), and their estimated cycles where
    the core has a timing table. With `check`, the outputs are compared with runtime_py's."""
    from toolchain.lab.qemu_backend import qemu

    source = mp.model.source
    if optimization not in OPTIMIZATIONS:
        raise RuntimeBackendError(f"optimization {optimization!r} (one of "
                                  f"{', '.join(OPTIMIZATIONS)})", source)
    if mp.program.stops_early:
        raise RuntimeBackendError("bench counts one whole invoke from the initial state, which "
                                  "this model's CIRCULAR_BUFFER ends early: not measured", source)
    name = c_identifier(name)
    tool("gcc", source)
    qemu(source)
    target = mcu_target(mp)
    board = board_of(target, source)
    graph = mp.graph
    values = random_inputs(graph, 0) if inputs is None else inputs
    directory = tempfile.mkdtemp(prefix="arenac-bench-")
    try:
        files, steps = bench_sources(mp, name)
        # the harness includes NAME.c: it is compiled there, not on its own
        with step(f"building for {board.machine}"):
            build = build_mcu(mp, directory, name, optimization, files,
                              sources=("startup.c", f"{name}_bench.c"))
        data = b"".join(np.ascontiguousarray(v, np.dtype(graph.tensors[t].dtype)).tobytes()
                        for t, v in zip(graph.inputs, values, strict=True))
        with open(os.path.join(directory, INPUT_FILE), "wb") as f:
            f.write(data)
        timing = cycle_model.timing(target.name)
        profiled = Profiled(build.elf, board.code, directory) if timing else None
        with step(f"QEMU {board.machine}, counting instructions"):
            raw = run_firmware(build.elf, board.machine, directory, timeout, source,
                               profiled.arguments if profiled else ())
        estimates = profiled.estimates(timing, wait_states) if profiled else None
        # the footprint of the firmware as `check` and `make mcu` build it, at this optimization
        shipped = os.path.join(directory, "firmware")
        os.mkdir(shipped)
        figures = measure(build_mcu(mp, shipped, name, optimization), mp)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    readings, outputs = split_readings(raw, mp, CALIBRATION_READINGS + 2 * len(steps))
    counts = [instructions(b - a, board.counter_hz) for a, b in zip(readings[::2], readings[1::2],
                                                                    strict=True)]
    short, long, empty, invoke, *per_step = counts
    if long - short != 2 * (SPIN_LONG - SPIN_SHORT):
        raise RuntimeBackendError(
            f"the {board.machine} counter does not count instructions as expected: loops of "
            f"{2 * (SPIN_LONG - SPIN_SHORT)} more instructions measured {long - short} more",
            source)
    matches = None
    if check:
        from runtime_py.interpreter import ArenaInterpreter

        expected = ArenaInterpreter(mp).invoke(list(values))
        matches = all(np.array_equal(e, a) for e, a in zip(expected, outputs, strict=True))
    symbols = {k["function"]: k["bytes"] for k in figures["kernels"]}
    step_cycles = ([e.nominal for e in estimates[BRACKETS_BEFORE_STEPS:]] if estimates
                   else [None] * len(steps))
    result_steps = tuple(
        StepCount(s["step"], s["op"], s["opcode"], s.get("kernel") or kernel_name(mp, s["op"]),
                  s["fn"], count - empty, symbols.get(s["fn"], 0), nominal)
        for s, count, nominal in zip(steps, per_step, step_cycles, strict=True))
    return BenchResult(
        model=source, target=target.name, board=board.machine, optimization=optimization,
        kernels="portable" if mp.program.portable else "target",
        instructions=invoke - empty, steps=result_steps, counter_overhead=empty,
        arena_bytes=mp.arena_bytes, flash=figures["flash"], ram=figures["ram"],
        outputs_match=matches, cycles=estimates[INVOKE_BRACKET] if estimates else None,
        wait_states=wait_states, timing=timing.source if timing else None, footprint=figures)


class Profiled:
    """The QEMU arguments that profile a bench firmware, and the estimates made from it: one per
    bracket of the harness (two counter readings), the harness's own code left out."""

    def __init__(self, elf: str, flash: Region, directory: str) -> None:
        self.elf = elf
        self.path = os.path.join(directory, "profile.txt")
        self.mark, self.harness = cycle_model.harness_addresses(elf)
        plugin = cycle_model.build_plugin(directory)
        flash_range = range(flash.origin, flash.origin + flash.length)
        self.arguments = cycle_model.plugin_arguments(plugin, self.path, self.mark, flash_range)

    def estimates(self, timing: cycle_model.Timing, wait_states: int
                  ) -> list[cycle_model.Estimate]:
        phases = cycle_model.read_profile(self.path)
        code = cycle_model.disassemble(self.elf)
        # phase 2k + 1 runs from the (2k)-th reading to the (2k + 1)-th: bracket k
        return [cycle_model.estimate(phase, code, timing, wait_states, self.harness)
                for phase in phases[1::2]]


def kernel_name(mp: ModelPlan, op: int) -> str:
    binding = mp.program.bindings[op]
    return binding.kernel_name if binding is not None else "portable"


def instructions(ticks: int, hz: int) -> int:
    """Counter ticks (mod 2^32) as executed instructions under -icount shift=ICOUNT_SHIFT."""
    ticks %= 2**32
    return round(ticks * 10**9 / (hz * 2**ICOUNT_SHIFT))


def run_firmware(elf: str, machine: str, directory: str, timeout: float,
                 source: str | None, extra: tuple[str, ...] | list[str] = ()) -> bytes:
    from toolchain.lab.qemu_backend import qemu_command

    command = qemu_command(elf, machine, ("-icount", ICOUNT, *extra))
    try:
        result = subprocess.run(command, cwd=directory, stdin=subprocess.DEVNULL,
                                capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeBackendError(f"the benchmark did not finish within {timeout:g} s",
                                  source) from None
    if result.returncode != 0:
        raise firmware_failure(result, "benchmark firmware", source)
    path = os.path.join(directory, OUTPUT_FILE)
    if not os.path.exists(path):
        raise RuntimeBackendError(f"benchmark firmware wrote no {OUTPUT_FILE}", source)
    with open(path, "rb") as f:
        return f.read()


def split_readings(raw: bytes, mp: ModelPlan, expected: int
                   ) -> tuple[list[int], list[np.ndarray]]:
    graph = mp.graph
    (count,) = struct.unpack_from("<I", raw, 0) if len(raw) >= 4 else (0,)
    out_bytes = sum(graph.tensors[t].nbytes for t in graph.outputs)
    if count != expected or len(raw) != 4 + 4 * count + out_bytes:
        raise RuntimeBackendError(
            f"benchmark firmware wrote {len(raw)} bytes ({count} readings), expected "
            f"{4 + 4 * expected + out_bytes} ({expected} readings)", mp.model.source)
    readings = list(struct.unpack_from(f"<{count}I", raw, 4))
    outputs, position = [], 4 + 4 * count
    for t in graph.outputs:
        tensor = graph.tensors[t]
        outputs.append(np.frombuffer(raw, np.dtype(tensor.dtype), tensor.num_elements, position)
                       .reshape(tensor.shape).copy())
        position += tensor.nbytes
    return readings, outputs


def bench_text(result: BenchResult) -> str:
    from toolchain.text import table

    total = max(result.instructions, 1)
    estimated = result.cycles is not None
    rows = [[s.step, s.op, s.opcode, s.kernel, f"{s.instructions:,}",
             f"{100 * s.instructions / total:.1f}%", *([f"{s.cycles:,}"] if estimated else []),
             s.bytes] for s in result.steps]
    match = {True: "outputs equal runtime_py's", False: "OUTPUTS DIFFER from runtime_py's",
             None: "outputs not checked"}[result.outputs_match]
    return "\n".join([
        f"model     {result.model}",
        f"target    {result.target} ({result.kernels} kernels), QEMU {result.board}, "
        f"arm-none-eabi-gcc {result.optimization}",
        f"count     instructions executed (qemu-system-arm -icount {ICOUNT}; the counter read "
        f"itself, {result.counter_overhead} instructions, subtracted)",
        *cycles_lines(result),
        f"memory    flash {result.flash} bytes, RAM {result.ram} bytes (arena "
        f"{result.arena_bytes})",
        "",
        table(["step", "op", "type", "kernel", "instructions", "share",
               *(["est. cycles"] if estimated else []), "bytes"], rows),
        "",
        f"instructions per inference: {result.instructions:,} ({match})",
        *([f"estimated cycles per inference: {result.cycles.nominal:,} nominal "
           f"({result.cycles.optimistic:,} to {result.cycles.pessimistic:,}; "
           f"{result.cycles.nominal / total:.2f} per instruction)"] if estimated else []),
    ])


def cycles_lines(result: BenchResult) -> list[str]:
    """What the cycle estimate rests on, or why there is none."""
    if result.cycles is None:
        return [f"cycles    not estimated: no timing table for {result.target} yet "
                f"(toolchain.lab.timings has {', '.join(cycle_model.TIMINGS)})"]
    mix = ", ".join(f"{kind} {100 * v['cycles'] / max(result.cycles.nominal, 1):.0f}%"
                    for kind, v in result.cycles.mix.items())
    return [f"cycles    estimated from the executed instructions at {result.wait_states} flash "
            f"wait states, by {result.timing}",
            f"mix       {mix} (of nominal cycles)"]
