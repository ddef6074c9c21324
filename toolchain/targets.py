"""The machines arenac generates C for: `--target` on plan, gen, check and bench.

A target picks three things:

- the kernels: each op binds the first registered kernel whose signature lists the target
  (toolchain.ops.VARIANTS: the DSP-extension kernels of toolchain/ops/<family>/arm_dsp.py for
  cortex-m4, cortex-m7 and cortex-m33, the Helium ones of toolchain/ops/<family>/arm_mve.py for
  cortex-m55), else its portable C kernel (PORTABLE_C), which every target runs;
- the C compiler's flags for the firmware (toolchain.lab.firmware): arm-none-eabi-gcc's -mcpu, the
  FPU and the float ABI;
- the QEMU machine the firmware runs on, with its memory map and the counter the benchmark
  reads (toolchain.lab.bench).

The generated file says which target it was made for and refuses to compile for another: an
`#error` unless the compiler's architecture macros (ACLE's __ARM_ARCH_*, __ARM_FEATURE_DSP,
__ARM_FEATURE_MVE) are those of the target. They name an architecture, not a core, so code made
for cortex-m4 also compiles for cortex-m7 (both Armv7E-M with DSP, the same kernels).

QEMU 7.2 has no Cortex-M0+ machine. Its only Armv6-M one, the micro:bit (a Cortex-M0), has
16 KiB of RAM; cortex-m0plus therefore runs on mps2-an385, a Cortex-M3. The image is built
for Armv6-M (-mcpu=cortex-m0plus: 16-bit Thumb and the few 32-bit instructions Armv6-M
has), and the M3 executes each of those instructions as an M0+ does, so the outputs and the
instruction counts are those of the M0+ code.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolchain.errors import ArenacError

GENERIC = "generic"

# Flags the generated kernels are built and measured with, beyond the CPU's: the build keeps
# each kernel a function of its own (the footprint's flash per kernel; the inliner would
# otherwise copy the large row helpers into every caller and spill), and address 0 is memory on
# a Cortex-M (the vector table): GCC 12's loop optimizer can rewrite an arena store as an
# address computed from 0, which the pure-function analysis then takes for a null dereference
# and deletes the kernel's call (an int8 -> int16 SOFTMAX whose output lies below its input did
# that). The fragments (toolchain.c.fragments) offer the same flags, so a firmware gets the
# code arenac measured.
CODE_FLAGS = (
    "-fno-inline-functions-called-once",
    "-fno-inline-small-functions",
    "-fno-delete-null-pointer-checks",
)


@dataclass(frozen=True)
class Region:
    """A memory of the board: code and constants, or data."""

    name: str
    origin: int
    length: int


@dataclass(frozen=True)
class Board:
    """A QEMU machine the firmware runs on.

    `code` holds the vector table (where the core fetches it at reset), the code and the
    constants; `ram` the data, the arena and the stack. `counter` is the address of the MPS2
    FPGA's free-running COUNTER register (FPGAIO, prescaler 0 after reset), which counts
    `counter_hz` ticks per second of QEMU's virtual clock: under -icount that clock advances by
    a fixed time per instruction, so the counter measures executed instructions (a real part's
    board, Part.as_board, counts core cycles with the DWT: `counter_hz` 0, and `uart` 0: none).
    `secure`: the core starts in the Secure state (Armv8-M with TrustZone), so the firmware is
    linked at the Secure aliases of the memories and of the peripherals. `vectors`: where the
    core fetches its vector table at reset when that is not the start of `code`."""

    machine: str
    core: str
    code: Region
    ram: Region
    counter: int
    counter_hz: int
    uart: int  # UART0, a CMSDK APB UART: the self-test firmware's serial line
    secure: bool = False
    vectors: Region | None = None


@dataclass(frozen=True)
class Target:
    """One `--target`: `flags` are arm-none-eabi-gcc's for the firmware, `requires` the C
    preprocessor conditions the generated file checks (none for generic), `board` the QEMU
    machine it runs on (None: generated and compiled, but not run)."""

    name: str
    title: str
    arch: str = ""  # the Arm architecture, as -march spells it
    flags: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    board: Board | None = None
    fpu: bool = False  # the firmware enables the FPU (CPACR) before anything else runs
    armv8m: bool = False  # Armv8-M Mainline: exception 7 is the SecureFault
    # Its kernels run whole ops faster than stripes of them, so a plan under --max-arena stripes
    # only where whole ops do not fit. Measured (`make bench`, section speed) on the shared
    # models: the DSP cores' kernels striped take 0.2-2.6% more estimated cycles; the Helium
    # depthwise kernel runs faster a few rows at a time (1.3-3.3% more instructions whole), and
    # the portable kernels go either way by less than 0.5%.
    whole_ops_fastest: bool = False

    @property
    def guard(self) -> str | None:
        """The `#if` condition under which the generated file refuses to compile."""
        if not self.requires:
            return None
        return " || ".join(r[1:] if r.startswith("!") else f"!{r}" for r in self.requires)


# QEMU's mps2-an385/an386/an500 (hw/arm/mps2.c; `info mtree` in QEMU 7.2): 4 MiB of ZBT SSRAM1
# at 0x00000000, where the core fetches its vector table, 4 MiB of ZBT SSRAM2&3 at 0x20000000,
# the FPGAIO block at 0x40028000 with a 25 MHz prescale clock, and UART0 at 0x40004000. On the
# real FPGA board SSRAM1 holds the code the MCC loads; it is the flash here.
MPS2_CODE = Region("ZBT SSRAM1 (code)", 0x00000000, 0x00400000)
MPS2_RAM = Region("ZBT SSRAM2&3 (data)", 0x20000000, 0x00400000)
MPS2_COUNTER = 0x40028000 + 0x18
MPS2_COUNTER_HZ = 25_000_000
MPS2_UART = 0x40004000

BOARDS = {
    "mps2-an386": Board("mps2-an386", "Cortex-M4", MPS2_CODE, MPS2_RAM, MPS2_COUNTER,
                        MPS2_COUNTER_HZ, MPS2_UART),
    "mps2-an500": Board("mps2-an500", "Cortex-M7", MPS2_CODE, MPS2_RAM, MPS2_COUNTER,
                        MPS2_COUNTER_HZ, MPS2_UART),
    "mps2-an385": Board("mps2-an385", "Cortex-M3", MPS2_CODE, MPS2_RAM, MPS2_COUNTER,
                        MPS2_COUNTER_HZ, MPS2_UART),
    # AN505 (hw/arm/mps2-tz.c, SSE-200): the core boots Secure with its vector table at
    # 0x10000000, the Secure alias of the 4 MiB SSRAM1; SSRAM2 and SSRAM3 (2 MiB each) follow
    # each other at 0x38000000 (Secure alias of 0x28000000); the FPGAIO at 0x50302000 (Secure
    # alias of 0x40302000) counts at 20 MHz; UART0 at 0x50200000 (of 0x40200000).
    "mps2-an505": Board("mps2-an505", "Cortex-M33",
                        Region("SSRAM1 (code, Secure alias)", 0x10000000, 0x00400000),
                        Region("SSRAM2+3 (data, Secure alias)", 0x38000000, 0x00400000),
                        0x50302000 + 0x18, 20_000_000, 0x50200000, secure=True),
    # AN547 (hw/arm/mps2-tz.c, SSE-300): Secure boot with the vector table in the 512 KiB
    # ITCM at 0x10000000 (the code and constants go to the 2 MiB SRAM after it, at the Secure
    # alias 0x11000000: the linker script keeps the vectors in the ITCM), data in the 4 MiB
    # of ISRAM0+1 at 0x31000000; the FPGAIO at 0x59302000 counts at 20 MHz (QEMU 7.2 leaves
    # the AN547's at the device's default); UART0 at 0x59303000 (of 0x49303000).
    "mps3-an547": Board("mps3-an547", "Cortex-M55",
                        Region("SRAM (code, Secure alias)", 0x11000000, 0x00200000),
                        Region("ISRAM0+1 (data, Secure alias)", 0x31000000, 0x00400000),
                        0x59302000 + 0x18, 20_000_000, 0x59303000, secure=True,
                        vectors=Region("ITCM (vector table)", 0x10000000, 0x00080000)),
}



@dataclass(frozen=True)
class Part:
    """A real board's memory (the MLPerf Tiny reference boards): its flash and the RAM a
    firmware's data, arena and stack go in (the largest contiguous SRAM); `target` is its
    core's. What a plan's footprint is held against (`plan --layers --measure`)."""

    name: str
    target: str
    flash: Region
    ram: Region

    def as_board(self) -> Board:
        """The part as the board a firmware project is written for: the vector table and code
        in its flash, the data, arena and stack in its main RAM, the core's DWT cycle counter
        for timing; no QEMU machine runs it and no UART is known."""
        core = TARGETS[self.target].board.core
        return Board(self.name, core, self.flash, self.ram, DWT_CYCCNT, 0, 0)


# The Armv7-M/Armv8-M Data Watchpoint and Trace unit's cycle counter, and what starts it: DEMCR's
# TRCENA (bit 24), then DWT_CTRL's CYCCNTENA (bit 0); a Cortex-M7's DWT must be unlocked first
# through its CoreSight lock access register.
DWT_CYCCNT = 0xE0001004
DWT_CTRL = 0xE0001000
DWT_LAR = 0xE0001FB0
DEMCR = 0xE000EDFC
CORESIGHT_UNLOCK = 0xC5ACCE55


# From each part's reference manual's memory map: STM32L4R5 (RM0432), STM32H7A3 (RM0455),
# STM32U575 (RM0456). On the L4R5 SRAM2 is also mapped right after SRAM1, so SRAM1-3 are one
# 640 KiB run; on the U575 SRAM1-3 are one 768 KiB run (SRAM4 lies apart); the H7A3's TCMs
# and AHB SRAMs lie apart from its AXI SRAM.
PARTS = {p.name: p for p in (
    Part("nucleo-l4r5zi", "cortex-m4", Region("flash", 0x08000000, 2 << 20),
         Region("SRAM1-3", 0x20000000, 640 << 10)),
    Part("nucleo-h7a3zi-q", "cortex-m7", Region("flash", 0x08000000, 2 << 20),
         Region("AXI SRAM", 0x24000000, 1 << 20)),
    Part("nucleo-u575zi-q", "cortex-m33", Region("flash", 0x08000000, 2 << 20),
         Region("SRAM1-3", 0x20000000, 768 << 10)),
)}

_DSP = ("defined(__ARM_FEATURE_DSP)",)

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(GENERIC, "portable C99 for any compiler (the default)"),
        Target("cortex-m0plus", "Cortex-M0+: Armv6-M, no DSP extension", "armv6-m",
               ("-mcpu=cortex-m0plus", "-mthumb", "-mfloat-abi=soft"),
               ("defined(__ARM_ARCH_6M__)",), BOARDS["mps2-an385"]),
        Target("cortex-m4", "Cortex-M4: Armv7E-M with the DSP extension, FPv4-SP", "armv7e-m",
               ("-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv4-sp-d16"),
               ("defined(__ARM_ARCH_7EM__)", *_DSP), BOARDS["mps2-an386"], fpu=True,
               whole_ops_fastest=True),
        Target("cortex-m7", "Cortex-M7: Armv7E-M with the DSP extension, FPv5", "armv7e-m",
               ("-mcpu=cortex-m7", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv5-d16"),
               ("defined(__ARM_ARCH_7EM__)", *_DSP), BOARDS["mps2-an500"], fpu=True,
               whole_ops_fastest=True),
        Target("cortex-m33", "Cortex-M33: Armv8-M Mainline with the DSP extension",
               "armv8-m.main",
               ("-mcpu=cortex-m33", "-mthumb", "-mfloat-abi=hard", "-mfpu=fpv5-sp-d16"),
               ("defined(__ARM_ARCH_8M_MAIN__)", *_DSP, "!defined(__ARM_FEATURE_MVE)"),
               BOARDS["mps2-an505"], fpu=True, armv8m=True, whole_ops_fastest=True),
        Target("cortex-m55", "Cortex-M55: Armv8.1-M Mainline with Helium (MVE)",
               "armv8.1-m.main",
               ("-mcpu=cortex-m55", "-mthumb", "-mfloat-abi=hard"),
               # GCC names Armv8.1-M Mainline __ARM_ARCH_8M_MAIN__, Clang __ARM_ARCH_8_1M_MAIN__
               ("(defined(__ARM_ARCH_8M_MAIN__) || defined(__ARM_ARCH_8_1M_MAIN__))",
                "defined(__ARM_FEATURE_MVE)"),
               BOARDS["mps3-an547"], fpu=True, armv8m=True),
    )
}

# The target `check --backends qemu` and `make mcu` build portable C for when none is given.
DEFAULT_MCU = "cortex-m4"
# The board `arenac project` writes for when none is given: DEFAULT_MCU's QEMU machine.
DEFAULT_BOARD = "mps2-an386"


def get_target(name: str, source: str | None = None) -> Target:
    """The target called `name`, or one clear error listing the known ones."""
    if name not in TARGETS:
        raise ArenacError(f"unknown target {name!r} (targets: {', '.join(TARGETS)})", source)
    return TARGETS[name]
