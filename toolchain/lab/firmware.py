"""The generated C as firmware for a Cortex-M target under QEMU, built with arm-none-eabi-gcc.

`build_mcu` writes the model's C (toolchain.c.generate) beside a startup file, a linker script and
an MCU harness (templates/mcu/), and links them with arm-none-eabi-gcc and newlib-nano, with the
flags of the plan's target (toolchain.targets: -mcpu, the FPU and the float ABI) and the memory
map of its QEMU machine. A plan made for `generic` (portable C) is built for DEFAULT_MCU, the
Cortex-M4 of QEMU's mps2-an386. The build passes -fno-inline-functions-called-once
-fno-inline-small-functions so that each kernel stays a function of its own (a call per op,
about 0.5% more code; without them -Os inlines most kernels into NAME_invoke), and
-fstack-usage so that toolchain.lab.footprint can bound the stack. The `static inline` fixed-point
helpers are still inlined.

Python computes every value; the templates only lay out text.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from toolchain.c.generate import c_identifier, generate, io_info, stream_values
from toolchain.errors import RuntimeBackendError
from toolchain.lower.plan import ModelPlan
from toolchain.render import render
from toolchain.targets import CODE_FLAGS, DEFAULT_MCU, GENERIC, TARGETS, Board, Region, Target

TOOL_PREFIX = "arm-none-eabi-"
TOOLS = ("gcc", "size", "nm", "objdump")
STACK_RESERVE = 32 * 1024  # bytes kept free at the top of RAM for the stack
STACK_PAINT = 0xA5C3A5C3
SECTION_ALIGNMENT = 16

# The Cortex-M4 (QEMU's mps2-an386) that portable C is built for, and its map.
DEFAULT = TARGETS[DEFAULT_MCU]
BOARD = DEFAULT.board.machine
CPU = DEFAULT_MCU
FLASH = DEFAULT.board.code
RAM = DEFAULT.board.ram

# Hard float where the core has an FPU (QEMU models it): float kernels then use FPU
# instructions instead of soft-float calls, and the IEEE results are the same either way
# (-std=c99 keeps -ffp-contract=off: no fused multiply-adds). The int8 kernels do not touch the
# FPU; Reset_Handler enables it (CPACR) before anything else runs. The flags per target are in
# toolchain.targets.
ARCH_FLAGS = DEFAULT.flags
OPTIMIZATION = "-Os"
C_FLAGS = (
    "-std=c99",
    "-Wall",
    "-Wextra",
    "-Wpedantic",
    "-Werror",
    "-ffunction-sections",
    "-fdata-sections",
    "-fstack-usage",
    *CODE_FLAGS,
)
LINK_FLAGS = ("--specs=nano.specs", "-nostartfiles", "-Wl,--gc-sections")
# The Cortex-M4 core's SCB->CPACR, whose CP10 and CP11 fields switch the FPU (and MVE) on.
CPACR = "0xE000ED88"


def mcu_target(mp: ModelPlan) -> Target:
    """The target a plan's firmware is built for: its own, or DEFAULT_MCU for portable C."""
    return TARGETS[DEFAULT_MCU if mp.program.target == GENERIC else mp.program.target]


def board_of(target: Target, source: str | None = None) -> Board:
    if target.board is None:
        raise RuntimeBackendError(f"QEMU has no machine for {target.name}", source)
    return target.board


# ARM semihosting operations and constants ("Semihosting for AArch32 and AArch64", v2.0).
SEMIHOSTING = {
    "open": "0x01",
    "close": "0x02",
    "write0": "0x04",
    "write": "0x05",
    "read": "0x06",
    "exit_extended": "0x20",  # SYS_EXIT_EXTENDED: 32-bit code can pass an exit status
    "application_exit": "0x20026u",  # ADP_Stopped_ApplicationExit
    "mode_rb": "1u",
    "mode_wb": "5u",
}
INPUT_FILE = "input.bin"
OUTPUT_FILE = "output.bin"
STATUS = {"ok": 0, "input": 2, "invoke": 3, "io": 4, "stack": 5, "fault": 6}
STATUS_MEANING = {
    "ok": "success",
    "input": "input file too short",
    "invoke": "invoke failed",
    "io": "semihosting file error",
    "stack": "stack overflow",
    "fault": "processor fault",
}


def harness_values(mp: ModelPlan, name: str) -> dict:
    """What every firmware harness template says of the model's I/O and the exit statuses."""
    graph = mp.graph
    return {
        **stream_values(mp, name),
        "inputs": [io_info(graph.tensors[t], i, True) for i, t in enumerate(graph.inputs)],
        "outputs": [io_info(graph.tensors[t], i, True) for i, t in enumerate(graph.outputs)],
        "input_file": INPUT_FILE,
        "output_file": OUTPUT_FILE,
        "status": STATUS,
        "statuses": [{"code": STATUS[k], "meaning": STATUS_MEANING[k]} for k in STATUS],
    }


def firmware_failure(result: subprocess.CompletedProcess, what: str,
                     source: str | None) -> RuntimeBackendError:
    """The error of a firmware run that exited non-zero: its status's meaning and its own
    last message ("arenac: ..."), else the last line QEMU wrote."""
    meaning = {STATUS[k]: v for k, v in STATUS_MEANING.items()}.get(result.returncode)
    lines = (result.stdout + result.stderr).decode(errors="replace").strip().splitlines()
    said = [x for x in lines if x.startswith("arenac:")] or lines
    detail = f": {said[-1].strip()}" if said else ""
    return RuntimeBackendError(
        f"{what} failed (exit {result.returncode}{', ' + meaning if meaning else ''}){detail}",
        source)


EXCEPTIONS = (  # Cortex-M exception numbers 2..15 after the reset vector
    "NMI",
    "HardFault",
    "MemManage",
    "BusFault",
    "UsageFault",
    None,  # SecureFault on Armv8-M Mainline (Target.armv8m)
    None,
    None,
    None,
    "SVCall",
    "DebugMonitor",
    None,
    "PendSV",
    "SysTick",
)


def tool(name: str, source: str | None = None) -> str:
    """Full path of an arm-none-eabi tool, or a RuntimeBackendError naming the package."""
    path = shutil.which(TOOL_PREFIX + name)
    if path is None:
        raise RuntimeBackendError(
            f"{TOOL_PREFIX}{name} is not on PATH (Debian: apt-get install gcc-arm-none-eabi "
            "libnewlib-arm-none-eabi binutils-arm-none-eabi)",
            source,
        )
    return path


def toolchain_available() -> bool:
    return all(shutil.which(TOOL_PREFIX + t) for t in TOOLS)


def uses_external_io(mp: ModelPlan) -> bool:
    """A plan made with external_io=True keeps the graph's inputs and outputs out of the arena
    (a variable among them lives in the state block either way)."""
    planned = mp.offset_of_tensor()
    return any(t not in planned and not mp.graph.tensors[t].is_variable
               and t not in mp.streamed_inputs | mp.streamed_outputs
               for t in (*mp.graph.inputs, *mp.graph.outputs))


def mcu_sources(mp: ModelPlan, name: str = "model", trace: bool = False) -> dict[str, str]:
    """File name -> text: the model's NAME.h/NAME.c plus the MCU files (no host harness).
    With `trace`, a tracing build (toolchain.c.generate.generate): the harness writes every
    traced tensor to the output file before its set's outputs."""
    name = c_identifier(name)
    if name in ("startup", "semihosting", "link"):
        raise RuntimeBackendError(
            f"the name {name!r} collides with an MCU file; choose another", mp.model.source
        )
    target = mcu_target(mp)
    board = board_of(target, mp.model.source)
    external_io = uses_external_io(mp)
    files = generate(mp, name, external_io=external_io, trace=trace)
    del files[f"{name}_main.c"]
    where = {"board": board.machine, "cpu": target.name}
    files.update(support_files(target, pool_sections(mp)))
    files[f"{name}_mcu.c"] = render(
        "mcu/mcu_main.c.j2",
        **where,
        name=name,
        external_io=external_io,
        **harness_values(mp, name),
        stack_reserve=STACK_RESERVE,
        trace=trace,
        waits=mp.program.stops_early,
    )
    return files


def pool_sections(mp: ModelPlan) -> dict[str, str]:
    """The linker sections of the plan's memory pools -> the output section that takes them:
    .data for the state block's (copied from flash at reset, as its initial values must be),
    .bss for the others (zeroed at reset, as a static array is)."""
    state = mp.pools[mp.state_pool].pool.section if mp.state_pool is not None else None
    return {a.pool.section: ".data" if a.pool.section == state else ".bss"
            for a in mp.pools if a.pool.section}


def support_files(target: Target, sections: dict[str, str] | None = None,
                  board: Board | None = None) -> dict[str, str]:
    """semihosting.h, startup.c and link.ld for the target's board (or `board`, a real part's);
    its one RAM takes the pools' `sections` too (`pool_sections`)."""
    sections = sections or {}
    board = board or board_of(target)
    where = {"board": board.machine, "cpu": target.name}
    names = [*EXCEPTIONS]
    if target.armv8m:
        names[5] = "SecureFault"
    handlers = [{"name": "Reset", "function": "Reset_Handler"}] + [
        {"name": e or "reserved", "function": "Fault_Handler" if e else "0"} for e in names
    ]
    vectors = board.vectors
    return {
        "semihosting.h": render("mcu/semihosting.h.j2", sys=SEMIHOSTING),
        "startup.c": render(
            "mcu/startup.c.j2",
            **where,
            handlers=handlers,
            vectors_at=f"0x{(vectors or board.code).origin:08x}",
            enable_fpu=target.fpu,
            cpacr_address=CPACR,
            cpacr_full_access=f"0x{0xF << 20:08x}",
            stack_paint=f"0x{STACK_PAINT:08X}",
            fault_status=STATUS["fault"],
        ),
        "link.ld": render(
            "mcu/link.ld.j2",
            **where,
            vectors=None if vectors is None else region_values(vectors),
            flash=region_values(board.code),
            ram=region_values(board.ram),
            data_sections=[s for s, out in sections.items() if out == ".data"],
            bss_sections=[s for s, out in sections.items() if out == ".bss"],
            section_alignment=SECTION_ALIGNMENT,
            stack_reserve=STACK_RESERVE,
        ),
    }


def region_values(region: Region) -> dict:
    return {"name": region.name, "origin": f"0x{region.origin:08x}", "length": region.length}


@dataclass(frozen=True)
class McuBuild:
    """A linked firmware image and the files it was measured from."""

    directory: str
    name: str
    elf: str
    objects: tuple[str, ...]
    stack_files: tuple[str, ...]


def run_tool(command: list[str], directory: str, what: str, source: str | None = None) -> str:
    """The tool's stdout; a failure is one RuntimeBackendError with its first error line."""
    try:
        result = subprocess.run(command, cwd=directory, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise RuntimeBackendError(f"{what} timed out", source) from None
    if result.returncode != 0:
        raise RuntimeBackendError(f"{what} failed: {tool_complaint(result.stderr)}", source)
    return result.stdout


def tool_complaint(stderr: str) -> str:
    """The line of a failed compile or link that says what is wrong: the linker's own words
    (a region that overflowed, and by how much; an undefined reference) before the driver's
    `collect2: error: ld returned 1 exit status`, which says only that the linker failed."""
    lines = [x.strip() for x in stderr.splitlines() if x.strip()]
    own = [x for x in lines if not x.startswith("collect2:")] or lines
    for marks in (("overflowed",), ("error", "undefined reference", "will not fit")):
        found = [x for x in own if any(m in x.lower() for m in marks)]
        if found:
            return found[0]
    return own[0] if own else "no message"


def build_mcu(mp: ModelPlan, directory: str, name: str = "model",
              optimization: str = OPTIMIZATION, files: dict[str, str] | None = None,
              sources: tuple[str, ...] | None = None) -> McuBuild:
    """Write, compile and link the firmware in `directory`; returns where everything is.
    `files` replaces mcu_sources(mp, name) and `sources` the C files compiled (every .c file):
    toolchain.lab.bench builds its own harness, which includes the model's C."""
    name = c_identifier(name)
    source = mp.model.source
    gcc = tool("gcc", source)
    flags = mcu_target(mp).flags
    files = mcu_sources(mp, name) if files is None else files
    for file_name, text in files.items():
        with open(os.path.join(directory, file_name), "w") as f:
            f.write(text)
    sources = [f for f in files if f.endswith(".c")] if sources is None else list(sources)
    run_tool(
        [gcc, *flags, optimization, *C_FLAGS, "-c", *sources], directory,
        "arm-none-eabi-gcc (compile)", source,
    )
    objects = tuple(os.path.join(directory, f[:-2] + ".o") for f in sources)
    elf = os.path.join(directory, f"{name}.elf")
    run_tool(
        [
            gcc,
            *flags,
            *LINK_FLAGS,
            "-T",
            "link.ld",
            f"-Wl,-Map={name}.map",
            *objects,
            "-lm",
            "-o",
            elf,
        ],
        directory,
        "arm-none-eabi-gcc (link)",
        source,
    )
    stack_files = tuple(os.path.join(directory, f[:-2] + ".su") for f in sources)
    return McuBuild(directory, name, elf, objects, stack_files)
