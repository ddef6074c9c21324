"""Estimated Cortex-M cycles from an execution profile: what `arenac bench` adds to its counts.

QEMU counts instructions, not cycles. The bench firmware also runs under a TCG plugin of our own
(profile_plugin.c beside this file, built with the host's cc), which counts for every executed
instruction how often it ran, how often a branch left it, how often it was branched to, and how
many of its data reads came from flash, separately between each two readings of the harness's
counter (a phase). Joined with the disassembly of the firmware, a timing table per core
(toolchain.lab.timings: each core with its manual and what is approximated) turns a phase into
cycles:

    cycles = sum over instructions of  count x base cost
             + taken x P                          (pipeline refill after a taken branch)
             + pipelining and address interlocks (from the instruction before, when it ran
               straight before: count - entered times)
             + wait states x (flash reads + taken branches)

three times: optimistic, nominal and pessimistic (the table's ranges). The estimate is
deterministic: the same firmware and input give the same profile.

    plugin = build_plugin(directory)                # QEMU gets plugin_arguments(plugin, ...)
    phases = read_profile(path)                     # per phase: address -> Counts
    estimate(phases[k], disassemble(elf), timing("cortex-m4"))
"""

from __future__ import annotations

import functools
import math
import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from toolchain.errors import RuntimeBackendError
from toolchain.lab.firmware import TOOL_PREFIX
from toolchain.lab.timings import TIMINGS, BeatTiming, DualIssueTiming, Timing

PLUGIN_SOURCE = Path(__file__).with_name("profile_plugin.c")
VARIANTS = ("optimistic", "nominal", "pessimistic")
HARNESS_FUNCTIONS = ("main", "mark", "spin")  # the bench harness's own code, never a step's

CONDITIONS = ("eq", "ne", "cs", "hs", "cc", "lo", "mi", "pl", "vs", "vc", "hi", "ls", "ge", "lt",
              "gt", "le", "al")
BRANCHES = {"b", "bl", "bx", "blx", "cbz", "cbnz", "le", "letp", "wls", "wlstp"}
TABLE_BRANCHES = {"tbb", "tbh"}
LOADS = {"ldr", "ldrb", "ldrh", "ldrsb", "ldrsh", "ldrex", "ldrexb", "ldrexh", "ldrt", "ldrbt",
         "ldrht", "ldrsbt", "ldrsht", "vldr"}
STORES = {"str", "strb", "strh", "strex", "strexb", "strexh", "strt", "strbt", "strht", "vstr"}
PAIRS = {"ldrd", "strd"}
MULTIPLES = {"ldm", "ldmia", "ldmfd", "ldmdb", "stm", "stmia", "stmea", "stmdb", "stmfd", "push",
             "pop", "vldm", "vldmia", "vldmdb", "vstm", "vstmia", "vstmdb", "vpush", "vpop"}
DIVIDES = {"sdiv", "udiv"}
FLOAT_MACS = {"vmla", "vmls", "vnmla", "vnmls", "vfma", "vfms", "vfnma", "vfnms"}
FLOAT_DIVIDES = {"vdiv", "vsqrt"}
# instructions that write no general register the next one could address with
NO_DESTINATION = {"cmp", "cmn", "tst", "teq", "it", "nop", "vcmp", "vcmpe", "dmb", "dsb", "isb",
                  "bkpt", "svc", "msr", "cpsid", "cpsie", "wfi", "wfe", "sev", "yield"}
REGISTER = re.compile(r"\b(r\d+|sp|lr|pc|ip|fp|sl|sb)\b")


@dataclass(frozen=True)
class Counts:
    """One instruction's profile in one phase (see profile_plugin.c)."""

    count: int
    taken: int
    entered: int
    flash: int


@dataclass(frozen=True)
class Instruction:
    address: int
    size: int
    mnemonic: str  # without width (.w, .n), condition or flag-setting suffix, lower case
    operands: str

    @functools.cached_property
    def kind(self) -> str:
        """The timing class of the instruction (a key of the mix)."""
        m = self.mnemonic
        if m in BRANCHES or writes_pc(self):
            return "branch"
        for kind, names in (("table branch", TABLE_BRANCHES), ("load", LOADS),
                            ("store", STORES), ("load/store pair", PAIRS),
                            ("load/store multiple", MULTIPLES), ("divide", DIVIDES),
                            ("float multiply-add", FLOAT_MACS), ("float divide", FLOAT_DIVIDES)):
            if m in names:
                return kind
        return "data processing"

    @functools.cached_property
    def address_registers(self) -> frozenset[str]:
        """The registers a load or store computes its address from."""
        if self.kind in ("load", "store", "load/store pair"):
            inside = re.search(r"\[([^\]]*)\]", self.operands)
            return frozenset(REGISTER.findall(inside.group(1))) if inside else frozenset()
        if self.kind == "load/store multiple":
            base = self.operands.split(",")[0].strip().rstrip("!")
            return frozenset({base} if self.mnemonic not in ("push", "pop", "vpush", "vpop")
                             else {"sp"})
        return frozenset()

    @functools.cached_property
    def destination(self) -> str | None:
        """The general register a data-processing instruction or a single load writes."""
        if self.kind not in ("data processing", "load") or self.mnemonic in NO_DESTINATION:
            return None
        first = REGISTER.match(self.operands.strip())
        return first.group(1) if first else None

    @functools.cached_property
    def registers_moved(self) -> int:
        """N of a load/store multiple: its registers (a double register counts two)."""
        inside = re.search(r"\{([^}]*)\}", self.operands)
        if inside is None:
            return 1
        total = 0
        for part in inside.group(1).split(","):
            ends = re.findall(r"([rsd])(\d+)", part)
            span = int(ends[-1][1]) - int(ends[0][1]) + 1 if len(ends) == 2 else 1
            total += span * (2 if ends and ends[0][0] == "d" else 1)
        return max(total, 1)


def writes_pc(insn: Instruction) -> bool:
    """An instruction other than a branch that moves the program counter (POP {..., pc},
    LDR pc, MOV pc, ADD pc)."""
    first = insn.operands.split(",")[0].strip()
    return "pc" in REGISTER.findall(insn.operands.split("}")[0]) and (
        insn.mnemonic in ("pop", "ldm", "ldmia", "ldmfd") or first == "pc")


def timing(core: str) -> Timing | DualIssueTiming | BeatTiming | None:
    """The core's timing table, or None where there is none yet (Cortex-M0+)."""
    return TIMINGS.get(core)


@dataclass(frozen=True)
class Estimate:
    """Estimated cycles of one phase: optimistic, nominal and pessimistic; and its mix."""

    instructions: int
    optimistic: int
    nominal: int
    pessimistic: int
    mix: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> instructions, cycles


def base_cost(insn: Instruction, t: Timing, variant: int) -> int:
    """Cycles of one execution that did not follow a pipelinable load, branch refill apart."""
    kind = insn.kind
    if kind == "branch":
        if insn.mnemonic in ("pop", "ldm", "ldmia", "ldmfd"):
            return t.multiple + insn.registers_moved
        return t.load if insn.mnemonic == "ldr" else t.alu
    costs = {
        "table branch": t.table_branch,
        "load": t.load,
        "store": t.store[variant],
        "load/store pair": t.pair,
        "load/store multiple": t.multiple + insn.registers_moved,
        "divide": t.divide[variant],
        "float multiply-add": t.float_mac,
        "float divide": t.float_divide,
    }
    if kind in costs:
        return costs[kind]
    if insn.mnemonic == "vmov" and insn.operands.count(",") >= 3:
        return t.move_two
    return t.alu


def sequential_saving(insn: Instruction, before: Instruction | None, t: Timing) -> int:
    """Cycles gained (negative: lost) when `insn` runs straight after `before`: a single load
    or store pipelined behind a single load, or stalled by an address its predecessor
    computed."""
    if before is None:
        return 0
    addressed = insn.address_registers
    if before.kind == "data processing" and before.destination in addressed:
        return -t.address_interlock
    if (insn.kind == "load" and before.kind == "load" and before.destination not in addressed):
        return t.load - t.load_pipelined
    return 0


def estimate(phase: dict[int, Counts], code: dict[int, Instruction],
             t: Timing | DualIssueTiming | BeatTiming, wait_states: int = 0,
             exclude: frozenset[int] = frozenset()) -> Estimate:
    """The phase's cycles by the core's timing table; instructions at `exclude` are left out.
    Each executed instruction's cycles (optimistic, nominal, pessimistic) come from its core's
    rule, given the instruction that ran straight before it; `wait_states` add to every flash
    read and every refill."""
    if isinstance(t, DualIssueTiming):
        younger = [paired(code, t, loads) for loads in t.load_pairs]

        def cycles_of(insn: Instruction, before: Instruction | None, c: Counts) -> list[int]:
            return dual_issue_cycles(insn, before, c, t, younger)
    elif isinstance(t, BeatTiming):
        def cycles_of(insn: Instruction, before: Instruction | None, c: Counts) -> list[int]:
            return beat_cycles(insn, before, c, t)
    else:
        def cycles_of(insn: Instruction, before: Instruction | None, c: Counts) -> list[int]:
            return single_issue_cycles(insn, before, c, t)
    totals = [0, 0, 0]
    mix: dict[str, Counter] = {}
    instructions = 0
    for address, c in sorted(phase.items()):
        if address in exclude:
            continue
        insn = code.get(address)
        if insn is None:
            raise RuntimeBackendError(f"the profile ran an instruction at 0x{address:x} that "
                                      "the firmware's disassembly lacks", None)
        before = code.get(address - 2) or code.get(address - 4)
        if before is not None and before.address + before.size != address:
            before = None
        extra = wait_states * (c.flash + c.taken)
        cycles = [v + extra for v in cycles_of(insn, before, c)]
        totals = [a + b for a, b in zip(totals, cycles, strict=True)]
        instructions += c.count
        kind = mix.setdefault(insn.kind, Counter())
        kind["instructions"] += c.count
        kind["cycles"] += cycles[1]
    ordered = sorted(mix.items(), key=lambda item: (-item[1]["cycles"], item[0]))
    return Estimate(instructions, *totals, mix={k: dict(v) for k, v in ordered})


def single_issue_cycles(insn: Instruction, before: Instruction | None, c: Counts,
                        t: Timing) -> list[int]:
    """A single-issue core (Cortex-M4, M33): the table's cost of each run, a taken branch's
    refill, less what running straight after `before` saves (or plus what it costs)."""
    saving = (c.count - c.entered) * sequential_saving(insn, before, t)
    return [c.count * base_cost(insn, t, v) + c.taken * t.refill[v] - saving for v in range(3)]


def beat_cycles(insn: Instruction, before: Instruction | None, c: Counts,
                t: BeatTiming) -> list[int]:
    """The Cortex-M55: a Helium instruction's beats, one fewer straight after one on another
    pipe; a low-overhead loop's end; the scalar table for the rest."""
    if insn.mnemonic in LOOP_ENDS:
        return [c.count * t.loop_end[v] for v in range(3)]
    pipe = mve_pipe(insn)
    if pipe is None:
        return single_issue_cycles(insn, before, c, t.scalar)
    overlapped = before is not None and mve_pipe(before) not in (None, pipe)
    return [c.count * t.beats - (c.count - c.entered) * overlapped] * 3


# -- Helium beats (the Cortex-M55) -----------------------------------------------------------

MVE_LOAD_STORE = ("vldrb", "vldrh", "vldrw", "vldrd", "vstrb", "vstrh", "vstrw", "vstrd", "vld2",
                  "vld4", "vst2", "vst4")
MVE_MULTIPLY = ("vmladav", "vmlav", "vmlsdav", "vmlaldav", "vmlalv", "vmlsldav", "vrmlaldavh",
                "vrmlalvh", "vmla", "vmlas", "vqdmlah", "vqrdmlah", "vqdmladh", "vqrdmladh",
                "vqrdmulh", "vqdmulh", "vmulh", "vrmulh", "vmul", "vmull", "vaddv", "vaddlv",
                "vfma", "vfms", "vcmul", "vcmla")
MVE_CONTROL = ("vctp", "vpst", "vpnot", "vpt")
LOOP_ENDS = {"le", "letp"}
Q_REGISTER = re.compile(r"\bq\d+\b")


def mve_pipe(insn: Instruction) -> str | None:
    """The Helium pipe an MVE instruction runs on (load/store, multiply, control, integer), or
    None for a scalar one (a floating-point V instruction names no Q register)."""
    m = insn.mnemonic
    if m.startswith(MVE_LOAD_STORE):
        return "load/store"
    if m.startswith(MVE_CONTROL):
        return "control"
    if not m.startswith("v") or not Q_REGISTER.search(insn.operands):
        return None
    return "multiply" if m.startswith(MVE_MULTIPLY) else "integer"


# -- dual issue (the Cortex-M7) ------------------------------------------------------------

MAC_PREFIXES = ("mul", "mla", "mls", "smul", "smla", "smls", "smmul", "smmla", "smmls", "smuad",
                "smusd", "umull", "umlal", "umaal")
DSP = {"sxtb16", "uxtb16", "sxtab16", "uxtab16", "sxtb", "uxtb", "sxth", "uxth", "sxtab",
       "uxtab", "sxtah", "uxtah", "sadd16", "ssub16", "sadd8", "ssub8", "uadd16", "usub16",
       "uadd8", "usub8", "qadd", "qsub", "qadd16", "qsub16", "qadd8", "qsub8", "qdadd",
       "qdsub", "shadd16", "uhadd16", "sel", "pkhbt", "pkhtb", "ubfx", "sbfx", "bfi", "bfc",
       "rev", "rev16", "revsh", "rbit", "clz", "usat", "ssat", "usat16", "ssat16", "usad8",
       "usada8"}
NARROW_LOADS = {"ldrb", "ldrh", "ldrsb", "ldrsh"}
SYSTEM = {"mrs", "msr", "dmb", "dsb", "isb", "svc", "cpsid", "cpsie", "wfi", "wfe", "bkpt"}
SHIFTED = re.compile(r",\s*(lsl|lsr|asr|ror|rrx)\b")


def instruction_class(insn: Instruction) -> str:
    """What the Cortex-M7's issue rules know an instruction as: alu, shifted (an ALU operation
    with a shifted operand), dsp, mac, load, store, branch, or one that issues alone (pair,
    multiple, table branch, divide, float divide, system)."""
    kind, m = insn.kind, insn.mnemonic
    if kind == "branch":
        return "multiple" if m in ("pop", "ldm", "ldmia", "ldmfd") else "branch"
    if kind == "load/store pair":
        return "pair"
    if kind in ("load", "store", "load/store multiple", "table branch", "divide",
                "float divide"):
        return {"load/store multiple": "multiple"}.get(kind, kind)
    if m.startswith(MAC_PREFIXES):
        return "mac"
    if m in DSP:
        return "dsp"
    if m in SYSTEM:
        return "system"
    return "shifted" if SHIFTED.search(insn.operands) else "alu"


def sources(insn: Instruction) -> frozenset[str]:
    """The general registers an instruction reads (a destination written first apart: a
    multiply-accumulate names its accumulator again among its operands)."""
    names = REGISTER.findall(insn.operands)
    if insn.destination is not None and names and names[0] == insn.destination:
        names = names[1:]
    return frozenset(names)


def stall(before: Instruction, insn: Instruction, t: DualIssueTiming) -> int:
    """Cycles `insn` waits for a result of `before`, which ran straight before it."""
    produced = before.destination
    if produced is None:
        return 0
    reads, addressed = sources(insn), insn.address_registers
    if produced not in reads | addressed:
        return 0
    made = instruction_class(before)
    used = instruction_class(insn)
    if made == "load" and before.mnemonic in NARROW_LOADS:
        return t.stalls.get(("narrow load", "any"), 0)
    if produced in addressed:
        return t.stalls.get((made, "address"), 0)
    if made == "load" and used == "mac":
        return t.stalls.get(("load", "mac"), 0)
    if made == "mac" and used != "mac":
        return t.stalls.get(("mac", "other"), 0)
    return 0


def paired(code: dict[int, Instruction], t: DualIssueTiming, loads: bool) -> frozenset[int]:
    """The addresses of instructions that issue with the one before them, pairs formed greedily
    in address order; `loads`: whether two loads pair."""
    younger: set[int] = set()
    previous: Instruction | None = None
    for address in sorted(code):
        insn = code[address]
        if (previous is not None and previous.address + previous.size == address
                and previous.address not in younger and can_pair(previous, insn, t, loads)):
            younger.add(address)
        previous = insn
    return frozenset(younger)


def can_pair(older: Instruction, younger: Instruction, t: DualIssueTiming, loads: bool) -> bool:
    classes = (instruction_class(older), instruction_class(younger))
    if classes == ("load", "load") and not loads:
        return False
    if classes not in t.pairs or older.kind == "branch":
        return False
    produced = older.destination
    return produced is None or produced not in sources(younger) | younger.address_registers


def dual_issue_cycles(insn: Instruction, before: Instruction | None, c: Counts,
                      t: DualIssueTiming, younger: list[frozenset[int]]) -> list[int]:
    """The Cortex-M7: a cycle a run, none when it issues beside the one before it (run straight
    after it), its class's cycles when it issues alone, plus the stall a result of the one
    before costs it (nominal, pessimistic) and a taken branch's refill."""
    sequential = c.count - c.entered
    kind = instruction_class(insn)
    if kind == "multiple":
        alone = math.ceil(insn.registers_moved * t.per_register)
    else:
        alone = t.single.get(kind, 1)
    waited = stall(before, insn, t) if before is not None else 0
    return [c.count * alone - (sequential if insn.address in younger[v] else 0)
            + (sequential * waited if v else 0) + c.taken * t.refill[v] for v in range(3)]


KNOWN = (BRANCHES | TABLE_BRANCHES | LOADS | STORES | PAIRS | MULTIPLES | DIVIDES | FLOAT_MACS
         | FLOAT_DIVIDES | NO_DESTINATION | {"mov", "vmov"})


def mnemonic_of(text: str) -> str:
    """objdump's mnemonic without width (.w), data type (.f32), condition or flag suffix: `bls`
    is `b`, `ldrhs` `ldr`, `ldmia.w` `ldmia`."""
    base = text.lower().split(".")[0]
    if base in KNOWN:
        return base
    for condition in CONDITIONS:
        stem = base[:-2]
        if base.endswith(condition) and (stem in KNOWN or stem.rstrip("s") in KNOWN):
            return stem if stem in KNOWN else stem.rstrip("s")
    return base


LINE = re.compile(r"^\s*([0-9a-f]+):\s+([0-9a-f]{4})(?: ([0-9a-f]{4}))?\s+(\S+)\s*([^;@<]*)")


def disassemble(elf: str) -> dict[int, Instruction]:
    """Every instruction of the firmware's code by address (arm-none-eabi-objdump -d)."""
    result = subprocess.run([TOOL_PREFIX + "objdump", "-d", elf], capture_output=True,
                            text=True, check=True)
    code = {}
    for line in result.stdout.splitlines():
        match = LINE.match(line)
        if match and not match.group(4).startswith("."):
            address = int(match.group(1), 16)
            size = 4 if match.group(3) else 2
            code[address] = Instruction(address, size, mnemonic_of(match.group(4)),
                                        match.group(5).strip())
    return code


def harness_addresses(elf: str) -> tuple[int, frozenset[int]]:
    """The entry of `mark` (a phase starts there) and every address of the harness's own
    functions, from the firmware's symbol table."""
    result = subprocess.run([TOOL_PREFIX + "nm", "-S", elf], capture_output=True, text=True,
                            check=True)
    spans = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tT" and parts[3] in HARNESS_FUNCTIONS:
            start = int(parts[0], 16) & ~1
            spans[parts[3]] = range(start, start + int(parts[1], 16))
    if "mark" not in spans:
        raise RuntimeBackendError("the bench firmware has no `mark` function", None)
    return spans["mark"].start, frozenset(a for span in spans.values() for a in span)


def build_plugin(directory: str) -> str:
    """profile_plugin.c built with the host's cc into `directory`."""
    path = os.path.join(directory, "libprofile.so")
    if shutil.which("cc") is None:
        raise RuntimeBackendError("no host C compiler (cc) to build the profiling plugin that "
                                  "estimates cycles", None)
    result = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-o", path,
                             str(PLUGIN_SOURCE)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeBackendError(f"the profiling plugin does not build: "
                                  f"{result.stderr.strip().splitlines()[-1:]}", None)
    return path


def plugin_arguments(plugin: str, out: str, mark: int, flash: range) -> list[str]:
    return ["-plugin", f"{plugin},out={out},mark=0x{mark:x},"
                       f"flash=0x{flash.start:x}:0x{flash.stop:x}"]


def read_profile(path: str) -> list[dict[int, Counts]]:
    """The phases the plugin wrote, in order."""
    phases: list[dict[int, Counts]] = []
    with open(path) as f:
        for line in f:
            if line.startswith("phase"):
                phases.append({})
            elif line.startswith("overflow"):
                raise RuntimeBackendError("the profile overflowed its instruction table", None)
            else:
                address, _size, *numbers = line.split()
                phases[-1][int(address, 16)] = Counts(*(int(n) for n in numbers))
    return phases
