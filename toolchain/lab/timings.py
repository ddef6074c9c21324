"""Cycle costs of the Cortex-M cores, as their manuals give them: what one executed instruction
costs by its class at zero wait states (toolchain.lab.cycles applies them). A triple is
(optimistic, nominal, pessimistic) where the manual gives a range; `refill` is P, the pipeline
refill after a taken branch. Each core names its source and what is approximated: the
single-issue cores (Cortex-M4, M33) by Timing, the dual-issue Cortex-M7 by DualIssueTiming,
the Cortex-M55's Helium beats by BeatTiming."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    core: str
    source: str
    approximated: str
    refill: tuple[int, int, int]
    divide: tuple[int, int, int]  # SDIV, UDIV
    store: tuple[int, int, int]  # STR, STRB, STRH, VSTR (single)
    alu: int = 1
    load: int = 2  # LDR, LDRB, LDRH, LDRSB, LDRSH, LDREX, VLDR (single)
    load_pipelined: int = 1  # a single load right after a single load it does not address with
    pair: int = 3  # LDRD, STRD: 1 + N, never pipelined
    multiple: int = 1  # LDM, STM, PUSH, POP, VLDM, VSTM, VPUSH, VPOP: this + one per register
    address_interlock: int = 1  # a load or store addressed by what the instruction before computed
    table_branch: int = 2  # TBB, TBH: 2 + P
    float_mac: int = 3  # VMLA, VMLS, VNMLA, VNMLS, VFMA, VFMS, VFNMA, VFNMS
    float_divide: int = 14  # VDIV, VSQRT
    move_two: int = 2  # VMOV of two core registers


CORTEX_M4 = Timing(
    core="cortex-m4",
    source="Arm Cortex-M4 Processor Technical Reference Manual r0p1 (ARM 100166_0001_00), "
           "3.3.1 Table 3-1 and its load/store timing notes",
    approximated="P is 1 to 3 by the branch target's alignment and width (1, 2, 3 here); SDIV "
                 "and UDIV take 2 to 12 by their operands (2, 7, 12); a store is one cycle into "
                 "the write buffer (two when it stalls: pessimistic); IT is one cycle (never "
                 "folded); floating-point register dependencies are not modelled",
    refill=(1, 2, 3),
    divide=(2, 7, 12),
    store=(1, 1, 2),
)

CORTEX_M33 = Timing(
    core="cortex-m33",
    source="the Cortex-M4's table (ARM 100166_0001_00, Table 3-1): the Cortex-M33 Technical "
           "Reference Manual (ARM 100230) gives no per-instruction table; both are three-stage, "
           "single-issue pipelines with single-cycle DSP multiplies",
    approximated="every figure is the Cortex-M4's, which the Cortex-M33 is not documented to "
                 "share instruction by instruction",
    refill=(1, 2, 3),
    divide=(2, 7, 12),
    store=(1, 1, 2),
)



@dataclass(frozen=True)
class DualIssueTiming:
    """A core that issues two instructions a cycle when their classes pair (the Cortex-M7):
    `pairs` are the (older, younger) classes that may issue together (toolchain.lab.cycles:
    instruction_class), each other instruction issuing alone; `single` the cycles of the
    classes that issue alone and whole; `stalls` the cycles a result costs the instruction
    straight after that reads it, by (producer class, reader use); `refill` a taken branch's
    cycles (predicted, typical, mispredicted), `load_pairs` whether two loads pair in each
    variant (they do when the words sit in different banks)."""

    core: str
    source: str
    approximated: str
    pairs: frozenset[tuple[str, str]]
    single: dict[str, int]
    stalls: dict[tuple[str, str], int]
    refill: tuple[int, int, int]
    load_pairs: tuple[bool, bool, bool]
    per_register: float = 0.5  # LDM, STM, PUSH, POP: ceil(registers x this) cycles


def _both_ways(*pairs: tuple[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset({*pairs, *((b, a) for a, b in pairs)})


CORTEX_M7 = DualIssueTiming(
    core="cortex-m7",
    source="the Cortex-M7 TRM (ARM DDI0489F) gives no instruction table; Arm's own scheduling "
           "model of the core in LLVM (llvm/lib/Target/ARM/ARMScheduleM7.td and "
           "ARMLatencyMutations.cpp) and cycle measurements published for the STM32H7 "
           "(jnk0le/random, pipeline cycle test/doc/cortex_m7.md): dual issue, one MAC, one "
           "store port, two load ports, LDRD in one cycle alone, LDM/STM in ceil(n/2)",
    approximated="pairs are formed greedily in address order along straight-line code; two "
                 "loads pair (optimistic, nominal) or not (pessimistic: same bank); a taken "
                 "branch costs 0, 1 or 3 cycles (predicted and paired, predicted, a share of "
                 "the 8-cycle mispredicts the profile cannot see); stalls count the "
                 "instruction straight after a producer only; unaligned accesses, the store "
                 "buffer and fetch alignment are not modelled",
    pairs=_both_ways(("alu", "alu"), ("alu", "load"), ("alu", "store"), ("alu", "mac"),
                     ("alu", "branch"), ("load", "load"), ("load", "store"), ("load", "mac"),
                     ("load", "branch"), ("mac", "branch"), ("store", "branch"),
                     ("shifted", "alu"), ("shifted", "load"), ("shifted", "store"),
                     ("shifted", "mac"), ("shifted", "branch"))
    | frozenset({("dsp", "alu"), ("dsp", "load"), ("dsp", "store"), ("dsp", "mac"),
                 ("dsp", "branch")}),
    single={"pair": 1, "table branch": 2, "divide": 7, "float divide": 16, "system": 1},
    stalls={("load", "mac"): 1, ("load", "address"): 1, ("narrow load", "any"): 1,
            ("mac", "other"): 1, ("alu", "address"): 1, ("dsp", "address"): 1},
    refill=(0, 1, 3),
    load_pairs=(True, True, False),
)

@dataclass(frozen=True)
class BeatTiming:
    """A core that runs its Helium (MVE) instructions in beats (the Cortex-M55: two beats of
    a 128-bit operation, one cycle each, on the instruction's pipe): an MVE instruction takes
    `beats` cycles, one fewer when it runs straight after one on another pipe (their beats
    overlap); the scalar instructions cost what `scalar` says."""

    core: str
    source: str
    approximated: str
    scalar: Timing
    beats: int = 2
    # LE, LETP: a low-overhead loop's end, per run (its loop cache makes the branch back cost
    # nothing on a hit: optimistic; a cycle: nominal; a branch refill and more: pessimistic)
    loop_end: tuple[int, int, int] = (0, 1, 4)


CORTEX_M55 = BeatTiming(
    core="cortex-m55",
    source="Arm's scheduling model of the Cortex-M55 in LLVM (llvm/lib/Target/ARM/"
           "ARMScheduleM55.td: four pipes, load/store, integer, multiply/float and control, "
           "each MVE instruction two beats on its pipe, consecutive instructions on different "
           "pipes overlapping) and the Helium optimization notes of Arm-Examples; the scalar "
           "core is the Cortex-M4's table, as that model calls the M55 'a lot like the M4/M33'",
    approximated="Arm's Cortex-M55 Software Optimization Guide (document 102692) was not "
                 "read: result latencies between MVE instructions, same-bank TCM stalls and "
                 "scalar issue beside a beat are not modelled; a low-overhead loop's LE costs "
                 "0, 1 or 4 cycles a run; the scalar figures are the Cortex-M4's",
    scalar=Timing(core="cortex-m55 scalar", source=CORTEX_M4.source,
                  approximated=CORTEX_M4.approximated, refill=(1, 2, 3), divide=(2, 7, 12),
                  store=(1, 1, 2)),
)

TIMINGS: dict[str, Timing | DualIssueTiming | BeatTiming] = {
    t.core: t for t in (CORTEX_M4, CORTEX_M33, CORTEX_M7, CORTEX_M55)}
