"""What a C kernel emitter receives (the op's params and C expressions for its tensors), what it
returns (a Kernel), and the pieces emitters build C text from.

Emitters (in each op family's module under toolchain/ops/) turn an OpContext into the text of
one specialized C function per op by rendering a macro of the family's template; every value
they hand the template is computed in Python: C types, constants, expressions and statements.
Loops of constant bounds are ConstantLoops, so that a loop of one trip is written as its body
and a loop of none not at all; helper functions several kernels call are helper groups, which
the generator defines once per file.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from toolchain.ir import Operator
from toolchain.numerics import gemmlowp
from toolchain.numerics.tables import (
    log_table,
    sigmoid_table_uint16,
    softmax_exp_lut,
    softmax_reciprocal_lut,
)
from toolchain.render import environment
from toolchain.targets import GENERIC

C_TYPES: dict[str, str] = {
    "float32": "float",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "int16": "int16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "uint32": "uint32_t",
    "uint64": "uint64_t",
    "bool": "uint8_t",
}


@dataclass(frozen=True)
class CTensor:
    """A tensor as C sees it: `ptr` is an expression pointing at its first element. `name` is
    already spelled for a comment (toolchain.text.c_text): emitters paste it as it is.

    Reading `ptr` records the tensor in `used`: the generator defines a constant's array only
    when some kernel points at it, not when every kernel folded its values."""

    index: int
    name: str
    dtype: str
    shape: tuple[int, ...]
    pointer: str
    data: np.ndarray | None = None  # a constant's values, for emitters that fold them
    used: set[int] | None = field(default=None, compare=False, repr=False)

    @property
    def ptr(self) -> str:
        if self.used is not None:
            self.used.add(self.index)
        return self.pointer

    @property
    def ctype(self) -> str:
        return C_TYPES[self.dtype]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


@dataclass(frozen=True)
class Callee:
    """The subgraph an operator runs (CALL_ONCE's initialization subgraph), as C: its name for
    comments (already spelled for one), the statements that run its steps in order, and an
    lvalue byte of the state block that records it has run since the last reset."""

    label: str
    statements: tuple[str, ...]
    flag: str


@dataclass(frozen=True)
class CBlock:
    """A subgraph a control-flow operator runs, as C: its name for comments (already spelled
    for one) and the statements that run its steps, then copy its results out."""

    label: str
    statements: tuple[str, ...]


@dataclass(frozen=True)
class CControl:
    """What IF and WHILE emit around their subgraphs' steps: the bool they test, their blocks
    in order (IF: then, else; WHILE: condition, body) and the statements before them (WHILE:
    the loop values start as its inputs)."""

    condition: CTensor
    blocks: tuple[CBlock, ...]
    entry: tuple[str, ...] = ()


@dataclass(frozen=True)
class OpContext:
    """One operator to emit: `fn` is the name of the `static void fn(void)` to define and
    `prefix` a unique prefix for any file-scope constants the emitter adds. `label` names the
    op in comments ("op 3", "subgraph 1 op 0")."""

    fn: str
    prefix: str
    op: Operator
    params: Any
    inputs: tuple[CTensor | None, ...]
    outputs: tuple[CTensor, ...]
    scratch: tuple[str, ...] = ()  # `uint8_t *` expressions of the op's scratch in the arena
    callee: Callee | None = None  # the subgraph the op runs, if it runs one
    label: str = ""
    control: CControl | None = None  # what an IF or WHILE runs
    state: tuple[str, ...] = ()  # typed pointers to the kernel's state (Binding.state)
    # the toolchain.targets name the C is made for: a portable kernel may shape its loops for
    # the host's vector units (generic) or for a Cortex-M's registers
    target: str = GENERIC
    # A stripe's kernel (toolchain.lower.tiling): the rows of the op's whole output, of which it
    # writes some; the kernels of the op's stripes share its constants. 0: the whole op.
    op_rows: int = 0


@dataclass(frozen=True)
class CDefinition:
    """A file-scope definition a kernel's function uses, by the name it defines: a constant
    table, or a function it calls. Its text keeps its comment and the blank line after it, if
    the family writes one."""

    name: str
    text: str
    flash_bytes: int = 0  # a constant table's bytes in flash (0: a function)

    @property
    def is_kernel_weights(self) -> bool:
        """A kernel's own layout of a model's weights (a filter reordered or widened for its
        loops), by the table's name: what `footprint` counts as kernel weights."""
        return self.flash_bytes > 0 and bool(re.search(rf"_{KERNEL_WEIGHT_TABLE}$", self.name))


# The name of a kernel's table of weights after the model's name (and subgraph): its op
# (a stripe's `s`, a run of stripes' start) and `_filter`, `_w16`, `_w` or `_span_w`; its other
# tables (per-channel constants, offsets) are not weights.
KERNEL_WEIGHT_TABLE = r"op\d+(?:s\d*)?_(?:filter|w16|w|span_w)"
# The bytes of an element of each C type a kernel's table may hold.
C_SIZES = {"int8_t": 1, "uint8_t": 1, "int16_t": 2, "uint16_t": 2, "int32_t": 4,
           "uint32_t": 4, "int64_t": 8, "uint64_t": 8, "float": 4}


@dataclass(frozen=True)
class Kernel:
    """One op's C: its function (`text`) after the file-scope `definitions` it uses, the
    helper groups they call (HELPER_GROUPS), which the file defines once, ahead of every
    kernel, and the system headers they need (`includes`, such as a target kernel's
    <arm_acle.h>). An op with nothing to do at run time has no text; `note` then says why, in
    the comment the generator writes where it would be called.

    A kernel of a family that runs in stripes (OpSpec.striping) states every definition besides
    its function in `definitions`: the kernels of an op's stripes share those they define alike
    (toolchain.c.stripes). Others may keep theirs in `text`."""

    text: str
    helpers: tuple[str, ...] = ()
    note: str = ""
    includes: tuple[str, ...] = ()  # MATH_H among them: see there
    definitions: tuple[CDefinition, ...] = ()
    stops: bool = False  # its function returns nonzero when the invoke ends there (OpSpec.stops)

    @property
    def code(self) -> str:
        """What the file holds of the kernel: its definitions, then its function."""
        return "".join(d.text for d in self.definitions) + self.text


Emitter = Callable[[OpContext], Kernel]

# The header a kernel includes when it calls a function of <math.h> (the file then links libm:
# toolchain.c.fragments) or names its NAN or INFINITY.
MATH_H = "math.h"

DEFINITIONS_TEMPLATE = "c/definitions.c.j2"


def definition(name: str, text: str, gap: bool = False) -> CDefinition:
    """A rendered definition as a kernel states it: its text on lines of its own, then a blank
    line if the family writes one (`gap`)."""
    return CDefinition(name, text.strip("\n") + ("\n\n" if gap else "\n"))


def table_definition(table: dict, gap: bool = False) -> CDefinition:
    """A constant table of a kernel: `name`, `ctype`, `length` and `data` (c_array text), with
    an optional `comment` above it and `align` (such as "ARENAC_ALIGN(4) ") before it."""
    values = {"comment": "", "align": "", **table}
    rendered = definition(table["name"], render_macro(DEFINITIONS_TEMPLATE, "table", values), gap)
    return replace(rendered, flash_bytes=C_SIZES.get(table["ctype"], 0) * int(table["length"]))

HELPERS_TEMPLATE = "c/helpers.c.j2"
# Each helper group (a macro of HELPERS_TEMPLATE) and the groups its functions call.
HELPER_GROUPS: dict[str, tuple[str, ...]] = {
    # TFLite's fixed-point arithmetic (FIXED_POINT): SaturatingRoundingDoublingHighMul,
    # RoundingDivideByPOT, MultiplyByQuantizedMultiplier and an int32 clamp
    "srdhm": (),
    "rdbpot": (),
    "mbqm": ("srdhm", "rdbpot"),
    "clamp": (),
    "requantize": (),
    "ivdep": (),
    "byte_column": (),
    "clz32": (),
    "sat_shl": (),
    "round_half_even": (),
    "unpack_int4": (),
    "index_failure": (),  # FAILURES
    "shape_failure": (),
    "detection_failure": (),
    "gemmlowp_exp": ("sat_shl", "srdhm", "rdbpot"),
    "gemmlowp_log": ("gemmlowp_exp", "clz32", "sat_shl", "srdhm", "rdbpot"),
    "gemmlowp_inv_sqrt": ("clz32", "sat_shl", "srdhm", "rdbpot"),
    "int16": (),
    "sdhm16": (),
    "int16_sigmoid_table": (),
    "int16_softmax_tables": (),
    "arm_dsp_inline": (),
    "arm_dsp": ("arm_dsp_inline",),
    "arm_dsp_rounding": (),
    "arm_dsp_stepped": (),
    "arm_dsp_sign_step": ("arm_dsp_inline",),
    "arm_dsp_high_stepped": (),
    "arm_dsp_smmla_by_sign": ("arm_dsp_inline",),
    "arm_dsp_channel": (),
    "arm_dsp_high_channel": (),
    "arm_dsp_smmla": ("arm_dsp_inline",),
    "arm_dsp_unroll4": (),
    "arm_dsp_sxtab16": ("arm_dsp",),
    "arm_dsp_max8": ("arm_dsp",),
    "arm_dsp_ror8": ("arm_dsp",),  # the rotated widening, for the steps that read int8 pairs
    **{f"arm_dsp_{part}": ("arm_dsp",) for part in (
        "partial", "load2", "mac16_2x1", "mac16_1x2", "mac16_1x1", "mac16_3x1")},
    **{f"arm_dsp_{part}": ("arm_dsp", "arm_dsp_ror8") for part in (
        "widen4", "widen4_in_order", "pixel_pair", "mac_2x2", "mac_2x1", "mac_1x2", "mac_1x1",
        "mac_3x1", "mac_1x2_word", "mac_1x1_word")},
    # arenac_widen_1 widens its last groups one at a time
    **{f"arm_dsp_widen_1{form}": ("arm_dsp", "arm_dsp_widen4") for form in ("", "_apart")},
    **{f"arm_dsp_widen_{n}{form}": ("arm_dsp", "arm_dsp_ror8")
       for n in (2, 3) for form in ("", "_apart")},
    "arm_dsp_in_order": (),
    "arm_dsp_dual_issue": (),  # a comment: why the Cortex-M7's kernels of load runs schedule
    "arm_dsp_pipeline": ("arm_dsp_in_order",),  # a comment: the Cortex-M7's written-out steps
    "arm_dsp_mac16_2x2_runs": ("arm_dsp",),
    "arm_dsp_mac16_3x2_runs": ("arm_dsp",),
    "arm_dsp_mac_1x4_word_runs": ("arm_dsp", "arm_dsp_ror8"),
    "arm_dsp_mac_1x4_runs": ("arm_dsp", "arm_dsp_ror8"),
    "arm_dsp_mac_3x2": ("arm_dsp", "arm_dsp_ror8", "arm_dsp_load2"),
    "arm_dsp_mac_3x2_runs": ("arm_dsp", "arm_dsp_ror8"),
    "arm_dsp_joint": ("arm_dsp",),
    "arm_dsp_lift": ("arm_dsp",),
    "arm_dsp_lift_bytes": ("arm_dsp",),
    **{f"arm_dsp_mac_{kind}": ("arm_dsp", "arm_dsp_ror8", "arm_dsp_joint")
       for kind in ("2x2_joint", "1x2_joint", "1x4_joint_runs", "3x2_joint_runs",
                    "3x2_joint_half_runs", "1x2_word_joint", "1x4_word_joint_runs")},
    **{f"signal_{kind}": () for kind in ("fft16", "fft32", "fftf")},
    **{f"signal_{kind}_{part}": (f"signal_{kind}",) for kind in ("fft16", "fft32", "fftf")
       for part in ("scale", "radix2", "radix4", "radix4_inverse")},
    # the stages of odd radix multiply by twiddle factors' parts (the scale function)
    **{f"signal_{kind}_{part}": (f"signal_{kind}", f"signal_{kind}_scale")
       for kind in ("fft16", "fft32", "fftf") for part in ("radix3", "radix5")},
    "signal_sqrt": (),
    "signal_pcan": ("clz32",),
    "signal_log": ("clz32",),
}


@dataclass(frozen=True)
class Failure:
    """A way a kernel can fail the invoke on values the model computes: the helper group that
    defines its flag, which the invoke clears first and returns as NAME_ERROR_`error` (`code`)
    when a kernel set it."""

    group: str
    flag: str
    error: str
    code: int
    meaning: str


FAILURES = (
    Failure("index_failure", "arenac_index_failure", "INDEX_OUT_OF_RANGE", 5,
            "an index the model computed lies outside its tensor (GATHER_ND, EMBEDDING_LOOKUP "
            "check theirs as TFLite does)"),
    Failure("shape_failure", "arenac_shape_failure", "INCOMPATIBLE_SHAPES", 6,
            "shapes the model computed do not broadcast (BROADCAST_ARGS: TFLite stops the "
            "process)"),
    Failure("detection_failure", "arenac_box_failure", "INVALID_BOXES", 7,
            "a decoded box ends before it starts (TFLite_Detection_PostProcess fails so in "
            "TFLite too)"),
)
# What invoke returns when a kernel ended it early (OpSpec.stops): not an error, TFLite Micro's
# kTfLiteAbort, whose value it keeps.
WAITING_STATUS = 15
# The groups the file defines first, in this order, under one comment (templates/c/model.c.j2).
FIXED_POINT = ("srdhm", "rdbpot", "mbqm", "clamp")
# Groups laid out by another template than HELPERS_TEMPLATE: the target kernels' own.
HELPER_TEMPLATES: dict[str, str] = {
    **{group: "c/arm_dsp.c.j2" for group in HELPER_GROUPS if group.startswith("arm_dsp")},
    **{group: "c/signal.c.j2" for group in HELPER_GROUPS if group.startswith("signal_")}}


def _sigmoid_table() -> dict:
    table = sigmoid_table_uint16()
    return {"length": table.size, "table": c_array(table)}


def _softmax_tables() -> dict:
    """The two tables, with the bounds the C's comment states: their steps and values, so a
    lookup needs no int16 wrap."""
    exp_table, reciprocal_table = softmax_exp_lut(), softmax_reciprocal_lut()
    both = np.concatenate([exp_table, reciprocal_table]).astype(np.int64)
    steps = np.concatenate([np.diff(exp_table.astype(np.int64)),
                            np.diff(reciprocal_table.astype(np.int64))])
    return {"length": exp_table.size, "exp_table": c_array(exp_table),
            "reciprocal_table": c_array(reciprocal_table),
            "max_step": int(np.abs(steps).max()), "low": int(both.min()), "high": int(both.max())}


# kiss_fft's scalar types for the FFT groups of templates/c/signal.c.j2, by element type: the
# name of their functions, the C type and the wider one products and sums are formed in (the
# cast of a store and of a sum's first operand), and for fixed point the fraction bits of a
# product, its rounding constant and the largest value.
FFT_SCALARS: dict[str, dict] = {
    dtype: {"name": name, "ctype": C_TYPES[dtype], "wide": wide, "fixed": bits > 0,
            "bits": bits, "frac": bits - 1, "half": 1 << max(bits - 2, 0),
            "max": (1 << max(bits - 1, 0)) - 1, "wraps": bits == 32,
            "cast": f"({C_TYPES[dtype]})" if bits else "", "widen": f"({wide})" if bits else ""}
    for dtype, name, wide, bits in (("int16", "fft16", "int32_t", 16),
                                    ("int32", "fft32", "int64_t", 32),
                                    ("float32", "fftf", "float", 0))
}


def _gemmlowp_exp() -> dict:
    """gemmlowp's constants, from toolchain.numerics.gemmlowp: the Taylor expansion's, the
    barrel shifter's exp(-2^k) for each bit of -a above its lowest quarter (Q5.26: bit 26 + k),
    and the Newton-Raphson start of 1 / (1 + x)."""
    barrel = []
    for k, factor in gemmlowp.EXP_BARREL_SHIFTER:
        power = f"1/{2 ** -k}" if k < 0 else str(2**k)
        step = f"if (remainder & (1u << {26 + k})) result = arenac_srdhm(result, {factor});"
        barrel.append(f"{step.ljust(70)} /* exp(-{power}) */")
    return {"g": {"one_third": gemmlowp.ONE_THIRD,
                  "exp_minus_one_eighth": gemmlowp.EXP_MINUS_ONE_EIGHTH, "barrel": barrel,
                  "forty_eight_over_seventeen": gemmlowp.FORTY_EIGHT_OVER_SEVENTEEN_Q2,
                  "minus_thirty_two_over_seventeen": gemmlowp.MINUS_THIRTY_TWO_OVER_SEVENTEEN_Q2}}


def _gemmlowp_log() -> dict:
    """TFLite's log_x_for_x_greater_than_or_equal_to_1 constants, from toolchain.numerics."""
    return {"g": {"log_2": gemmlowp.LOG_2, "sqrt_half": gemmlowp.HALF_SQRT_TWO,
                  "sqrt_sqrt_half": gemmlowp.SQRT_SQRT_HALF,
                  "quarter": int(gemmlowp.rescale(gemmlowp.ONE_QUARTER, 0, 6)),
                  "alpha_n": gemmlowp.LOG_ALPHA_N, "alpha_d": gemmlowp.LOG_ALPHA_D,
                  "alpha_i": gemmlowp.LOG_ALPHA_I, "alpha_f": gemmlowp.LOG_ALPHA_F}}


# The values of the groups whose text lays out tables computed here.
HELPER_VALUES: dict[str, Callable[[], dict]] = {
    "gemmlowp_exp": _gemmlowp_exp,
    "gemmlowp_log": _gemmlowp_log,
    "int16_sigmoid_table": _sigmoid_table,
    "int16_softmax_tables": _softmax_tables,
    "signal_log": lambda: {"length": log_table().size, "table": c_array(log_table())},
    **{group: (lambda t=t: {"t": t}) for t in FFT_SCALARS.values()
       for group in HELPER_GROUPS if group.startswith(f"signal_{t['name']}")},
}


def helper_definitions(groups: Iterable[str]) -> tuple[list[str], list[str]]:
    """The text of every group asked for and of the groups they build on, each once, a group
    after those it calls: the FIXED_POINT groups' (in their order) and the others'."""
    ordered = _closure(groups)

    def text(group: str) -> str:
        return str(family_macro(HELPER_TEMPLATES.get(group, HELPERS_TEMPLATE), group)(
            **HELPER_VALUES.get(group, dict)())).strip("\n")

    return ([text(g) for g in FIXED_POINT if g in ordered],
            [text(g) for g in ordered if g not in FIXED_POINT])


LINE_LIMIT = 120  # characters of any generated line
COMMENT_WIDTH = 100  # characters of a generated comment's lines, as the hand-written ones


@dataclass(frozen=True)
class RuntimeLoop:
    """A loop whose bounds are C expressions computed at run time (a window clipped to the
    image): always written as a `for`, for the macros of templates/c/loops.c.j2."""

    var: str
    start: str
    stop: str
    written = True
    runs = True

    @property
    def header(self) -> str:
        return f"{self.var} = {self.start}; {self.var} < {self.stop}; ++{self.var}"


@dataclass(frozen=True)
class ConstantLoop:
    """A loop of constant bounds: `var` from `start` while below `stop`, by `step`. The macros
    of templates/c/loops.c.j2 write a loop of several trips as a `for`, the body of a one-trip
    loop bare (its expressions, built by `c_sum`, hold `start` in place of `var`) and nothing
    for a loop that never runs."""

    var: str
    stop: int
    start: int = 0
    step: int = 1

    @property
    def trips(self) -> int:
        return max(0, -(-(self.stop - self.start) // self.step))

    @property
    def written(self) -> bool:
        return self.trips > 1

    @property
    def runs(self) -> bool:
        return self.trips > 0

    @property
    def header(self) -> str:
        """What goes between the parentheses of its `for`."""
        step = f"++{self.var}" if self.step == 1 else f"{self.var} += {self.step}"
        return f"{self.var} = {self.start}; {self.var} < {self.stop}; {step}"

    @property
    def index(self) -> str:
        """The loop's variable as an expression: `start` when the loop is not written."""
        return c_sum([(self, 1)])


def written_vars(loops: Sequence[ConstantLoop]) -> str:
    """The variables of the loops that are written, each once, for one declaration ("" if
    none)."""
    return ", ".join(dict.fromkeys(loop.var for loop in loops if loop.written))


def c_sum(terms: Sequence[tuple[ConstantLoop | str, int]], constant: int = 0) -> str:
    """C text of sum(term * coefficient) + constant, e.g. `i0 * 12 - i1 + 3` or `29 - i0 * 2`;
    a loop that is not written counts as its start."""
    named: list[tuple[str, int]] = []
    for term, coefficient in terms:
        if isinstance(term, ConstantLoop) and not term.written:
            constant += term.start * coefficient
        elif coefficient:
            named.append((term.var if isinstance(term, ConstantLoop) else term, coefficient))
    parts = [(name if abs(c) == 1 else f"{name} * {abs(c)}", c < 0) for name, c in named]
    if constant or not parts:  # first if that keeps the text from starting with a minus
        where = 0 if parts and parts[0][1] and constant > 0 else len(parts)
        parts.insert(where, (str(abs(constant)), constant < 0))
    text = ("-" if parts[0][1] else "") + parts[0][0]
    return text + "".join(f" {'-' if negative else '+'} {p}" for p, negative in parts[1:])


def c_offset(pointer: str, terms: Sequence[tuple[ConstantLoop | str, int]],
             constant: int = 0) -> str:
    """`pointer` advanced by c_sum(terms, constant) elements: `x + b * 16`, or `x`."""
    offset = c_sum(terms, constant)
    if offset == "0":
        return pointer
    return f"{pointer} - {offset[1:]}" if offset.startswith("-") else f"{pointer} + {offset}"


def c_pointer(name: str, ctype: str, base: str,
              terms: Sequence[tuple[ConstantLoop | str, int]]) -> tuple[str, list[str]]:
    """A pointer `name` (of type `ctype *`) at `base` advanced by c_sum(terms): the name to use
    and its declaration, or `base` itself and no declaration when the offset is nothing."""
    at = c_offset(base, terms)
    return (base, []) if at == base else (name, [f"{ctype} *{name} = {at};"])


def c_function_head(declaration: str, params: Sequence[str], width: int = 100) -> str:
    """`declaration(params) {` on one line, or its parameters on as many lines as they need
    within about `width` characters, aligned after the parenthesis."""
    line = f"{declaration}({', '.join(params)}) {{"
    if len(line) <= width:
        return line
    indent = " " * (len(declaration) + 1)
    lines = [f"{declaration}({params[0]}"]
    for param in params[1:]:
        if len(lines[-1]) + len(param) + 2 > width:
            lines[-1] += ","
            lines.append(indent + param)
        else:
            lines[-1] += f", {param}"
    return "\n".join(lines) + ") {"


def c_comment(text: str, indent: str = "") -> str:
    """`text` as a block comment broken at spaces into lines that, indented by `indent`, stay
    within COMMENT_WIDTH; later lines align under the first's text."""
    width = COMMENT_WIDTH - len(indent) - len("/*  */")
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)
    return "/* " + f"\n{indent}   ".join(lines) + " */"


def family_macro(template: str, macro: str) -> Callable[..., str]:
    """A macro of a family template (templates/c/<family>.c.j2), callable from Python."""
    return getattr(environment().get_template(template).module, macro)


def render_macro(template: str, macro: str, values: dict) -> str:
    """What a macro of a family template lays out for `values`, without blank lines around."""
    return str(family_macro(template, macro)(values)).strip("\n")


def c_array(values: Sequence | np.ndarray, per_line: int = 16) -> str:
    """Comma-separated C initializer text for a line indented two spaces: at most `per_line`
    values a line and no line over LINE_LIMIT characters (floats round-trip)."""
    array = np.asarray(values)
    if array.dtype.kind == "f":
        items = [c_float(v) for v in array.ravel().tolist()]
    else:
        items = [str(int(v)) for v in array.ravel().tolist()]
    return ",\n  ".join(_pack(items, per_line, LINE_LIMIT - len("  ") - len(","))) or "0"


def _pack(items: list[str], per_line: int, width: int) -> list[str]:
    """`items` joined by ", " into lines of at most `per_line` items and `width` characters."""
    lines: list[str] = []
    line: list[str] = []
    length = -2  # of ", ".join(line), once it holds an item
    for item in items:
        if line and (len(line) == per_line or length + 2 + len(item) > width):
            lines.append(", ".join(line))
            line, length = [], -2
        line.append(item)
        length += 2 + len(item)
    return [*lines, ", ".join(line)] if line else lines


def c_float(value: float) -> str:
    """A float32 literal that parses back to the same float32. NaN and infinity have no
    literal: they are <math.h>'s NAN and INFINITY, constant expressions C99 allows in static
    initializers (a file of float tensors includes <math.h>; a kernel naming them in another
    declares MATH_H). A NaN keeps its sign but not its payload bits, which no kernel's result
    depends on."""
    value = np.float32(value)
    sign = "-" if np.signbit(value) else ""
    if np.isnan(value):
        return f"{sign}NAN"
    if np.isinf(value):
        return f"{sign}INFINITY"
    return np.format_float_scientific(value, unique=True) + "f"


def c_int32(value: int) -> str:
    """INT32_MIN cannot be written as a plain literal in C."""
    return "INT32_MIN" if value == -(2**31) else str(int(value))


def c_int64(value: int) -> str:
    """An integer literal of any int64 value: plain within int32, else INT64_C (a bare
    9223372036854775808 has no signed type) and INT64_MIN for the one value no literal spells."""
    value = int(value)
    if -(2**31) <= value < 2**31:
        return c_int32(value)
    return "INT64_MIN" if value == -(2**63) else f"INT64_C({value})"


def c_length(count: int) -> int:
    """The length to declare an array of `count` elements with: C99 has no zero-length arrays,
    so an empty one gets a single element nothing reads."""
    return max(int(count), 1)


def _closure(groups: Iterable[str]) -> list[str]:
    ordered: list[str] = []

    def add(group: str) -> None:
        if group not in ordered:
            for needed in HELPER_GROUPS[group]:
                add(needed)
            ordered.append(group)

    for group in sorted(set(groups)):
        add(group)
    return ordered


def plus(value: int | str) -> str:
    """` + 3`, ` - 10` or nothing: a constant added right after an operand, as it reads best;
    a C term such as "-zp" likewise (` - zp`)."""
    if isinstance(value, str):
        return f" - {value[1:]}" if value.startswith("-") else f" + {value}"
    return f" + {value}" if value > 0 else f" - {-value}" if value < 0 else ""


def signed(value: int) -> str:
    """`+ 3`, `- 10`, `+ 0`: a constant with its sign as the operator, where the operator is
    always written."""
    return f"+ {value}" if value >= 0 else f"- {-value}"
