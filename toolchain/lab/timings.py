"""Cycle costs of the Cortex-M cores, as their manuals give them: what one executed instruction
costs by its class at zero wait states (toolchain.lab.cycles applies them). A triple is
(optimistic, nominal, pessimistic) where the manual gives a range; `refill` is P, the pipeline
refill after a taken branch. Each core names its source and what is approximated."""

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

TIMINGS = {t.core: t for t in (CORTEX_M4, CORTEX_M33)}
