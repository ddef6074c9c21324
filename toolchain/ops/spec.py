"""The registry entry every op family fills in, and the checks every family's prepare shares."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from toolchain.errors import ModelError
from toolchain.ir import Graph, Operator, Tensor
from toolchain.ops.overlaps import OverlapRule, Rule
from toolchain.ops.padding import PadRule
from toolchain.ops.striping import Striping

# Most elements of the padded plane a windowed op (convolution, pooling) slides over.
# runtime_py builds that plane (in float64 for convolutions: at most 512 MiB); the generated C
# never builds it, but computes its indices in int32.
MAX_PLANE_ELEMENTS = 2**26


@dataclass(frozen=True)
class MemoryRequest:
    """Bytes a kernel needs beyond its tensors. Scratch lives during its op's step only and is
    planned in the arena like any buffer, so a window copy never hides on the stack."""

    size: int
    purpose: str


@dataclass(frozen=True)
class StateRequest:
    """Memory a kernel keeps from one invoke to the next (a noise estimate, a delay line):
    a slot of the state block, zeros until the kernel writes it and again after a reset, as
    TFLite Micro's persistent buffers start and its Reset leaves them."""

    dtype: str
    shape: tuple[int, ...]
    purpose: str


# Targets a kernel can be emitted for: the portable C every C compiler builds (and every
# target runs), or the names of toolchain.targets (a kernel for some cores only).
PORTABLE_C = "c"
TARGETS = (PORTABLE_C,)

# The interpreters whose arithmetic a kernel reproduces, and `check` compares with: LiteRT's
# reference kernels, or TFLite Micro's where LiteRT's kernel is wrong for the operands (it
# reads or writes them as another type).
LITERT_REF = "litert-ref"
TFLM = "tflm"


@dataclass(frozen=True)
class Signature:
    """The operand dtypes one kernel runs: a set of dtypes per input and per output position.

    `optional` inputs may be absent (TFLite's index -1, or a shorter input list: a convolution
    without bias); a side in `repeats` ("inputs", "outputs") repeats its last position any
    number of times (CONCATENATION's operands, SPLIT's results). `form` is the signature as
    written in the registry, shared by every signature one written form expands to. `oracle`
    is the interpreter whose results the kernel reproduces bit for bit.
    """

    inputs: tuple[frozenset[str], ...]
    outputs: tuple[frozenset[str], ...]
    optional: frozenset[int] = frozenset()
    repeats: frozenset[str] = frozenset()
    targets: frozenset[str] = frozenset({PORTABLE_C})
    form: str = ""
    bound: tuple[tuple[str, str], ...] = ()  # the dtype each name of `form` stands for here
    oracle: str = LITERT_REF
    each: tuple[tuple[str, tuple[str, ...]], ...] = ()  # names standing for any dtype of theirs

    def matches(self, inputs: Sequence[str | None], outputs: Sequence[str | None]) -> bool:
        """Whether an op with these operand dtypes (None for an absent one) runs on it."""
        return self._side(self.inputs, inputs, "inputs", self.optional) and self._side(
            self.outputs, outputs, "outputs", frozenset()
        )

    def _side(self, allowed: tuple[frozenset[str], ...], actual: Sequence[str | None],
              side: str, optional: frozenset[int]) -> bool:
        if side in self.repeats and len(actual) >= len(allowed):
            allowed = (*allowed, *[allowed[-1]] * (len(actual) - len(allowed)))
        if not len(allowed) - len(optional) <= len(actual) <= len(allowed):
            return False
        # trailing optional operands may be absent altogether: `actual` may be the shorter
        return all(
            (i in optional) if dtype is None else dtype in dtypes
            for i, (dtype, dtypes) in enumerate(zip(actual, allowed, strict=False))
        )


def kernels(*forms: str, targets: Iterable[str] = TARGETS, oracle: str = LITERT_REF,
            each: dict[str, Iterable[str]] | None = None,
            **variables: Iterable[str]) -> tuple[Signature, ...]:
    """Signatures from their written form, `"int8, int8, int32? -> int8"`: `a|b` allows
    either dtype, a trailing `?` marks an input that may be absent, a trailing `...` a last
    position that repeats. A name given in `variables` (`T=("int8", "float32")`) stands for
    each of its dtypes in turn, the same one at every position it appears; a name given in
    `each` for any of its dtypes at each position on its own (the operands IF passes on). `oracle`
    names the interpreter the kernels reproduce (LITERT_REF unless LiteRT's kernel is wrong for
    them)."""
    if oracle not in (LITERT_REF, TFLM):
        raise ValueError(f"unknown oracle {oracle!r}")
    found = []
    for form in forms:
        words = set(re.findall(r"\w+", form))
        names = sorted(n for n in variables if n in words)
        for values in product(*(sorted(variables[n]) for n in names)):
            found.append(_parse(form, dict(zip(names, values,
                                               strict=True)), frozenset(targets), oracle,
                                {n: tuple(sorted(v)) for n, v in (each or {}).items()}))
    return tuple(found)


def _parse(form: str, bound: dict[str, str], targets: frozenset[str],
           oracle: str = LITERT_REF, each: dict[str, tuple[str, ...]] | None = None) -> Signature:
    each = each or {}
    sides: dict[str, list[frozenset[str]]] = {"inputs": [], "outputs": []}
    optional: set[int] = set()
    repeats: set[str] = set()
    for side, text in zip(sides, form.split("->"), strict=True):
        for i, word in enumerate(w.strip() for w in text.split(",") if w.strip()):
            if word.endswith("..."):
                word = word[:-3]
                repeats.add(side)
            if word.endswith("?"):
                word = word[:-1]
                optional.add(i)
            sides[side].append(frozenset(x for d in word.split("|")
                                         for x in each.get(d, (bound.get(d, d),))))
    return Signature(tuple(sides["inputs"]), tuple(sides["outputs"]), frozenset(optional),
                     frozenset(repeats), targets, form, tuple(sorted(bound.items())), oracle,
                     tuple(sorted(each.items())))


def describe(dtypes: Sequence[str | None]) -> str:
    """Operand dtypes as messages write them, `-` for an absent input."""
    return ", ".join(d or "-" for d in dtypes)


def first_kernel(kernels: tuple[Signature, ...], memo: dict, inputs: tuple[str | None, ...],
                 outputs: tuple[str | None, ...], target: str | None = None) -> Signature | None:
    """The first of `kernels` (for `target`, if given) that runs these operand dtypes.

    Remembered in `memo`, the owner's: a graph of 100,000 alike ops asks the same question
    100,000 times, and a match walks every written signature.
    """
    key = (inputs, outputs, target)
    if key not in memo:
        memo[key] = next((k for k in kernels if (target is None or target in k.targets)
                          and k.matches(inputs, outputs)), None)
    return memo[key]


@dataclass(frozen=True)
class TargetKernel:
    """A kernel of one op written for some targets only (its signatures' `targets`), bound
    there in place of the op's portable kernel when it `accepts` the op: it runs from the same
    params (the OpSpec's prepare), so runtime_py and every other backend compute the same
    values, but emits its own C and asks for its own scratch and overlaps, which follow its own
    loop order.

    `accepts(graph, op, params)` is None when the kernel runs this op, else the reason it
    does not (the portable kernel then does); `overlaps(graph, op, params)` lists the rules
    its write order makes safe (toolchain/ops/overlaps.py); `name` says what it is in reports.
    `scratch_alignment`: the alignment its scratch needs (the plan's must be at least that).
    `state`: the memory it keeps across invokes, as OpSpec.state; it need not keep what the
    portable kernel keeps (a target kernel may keep its delay line in another layout), so it
    says its own. `narrows`: the kernels of the op this one is a form of with less scratch
    for some more cycles, which a plan held to the generic arena gives up for it; where
    `narrows_at_peak`, only for scratch at the arena's peak (its cycles cost too much for a
    try elsewhere).
    """

    opcode: str
    name: str
    kernels: tuple[Signature, ...]
    accepts: Callable[[Graph, Operator, Any], str | None]
    emit: Callable[[Any], Any]
    scratch: Callable[[Any], tuple[MemoryRequest, ...]] | None = None
    overlaps: Rule | None = None
    scratch_alignment: int = 1
    state: Callable[[Any], tuple[StateRequest, ...]] | None = None
    narrows: tuple[str, ...] = ()
    narrows_at_peak: bool = False
    matched: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def runs_on(self, target: str) -> bool:
        return any(target in k.targets for k in self.kernels)

    def kernel_for(self, inputs: tuple[str | None, ...], outputs: tuple[str | None, ...],
                   target: str) -> Signature | None:
        """Its first signature for `target` that runs these operand dtypes."""
        return first_kernel(self.kernels, self.matched, inputs, outputs, target)


@dataclass(frozen=True)
class Binding:
    """One operator bound to its kernel before anything is planned: what every backend runs
    from (`params`), the memory the kernel asks for (`scratch`), and the outputs its loop order
    lets share an input's memory (`overlaps`, every rule; the techniques switched on pick).
    `variant` is the target kernel bound in place of the portable one, if any."""

    op: int
    opcode: str
    kernel: Signature
    params: Any
    scratch: tuple[MemoryRequest, ...] = ()
    overlaps: tuple[OverlapRule, ...] = ()
    variant: TargetKernel | None = None
    state: tuple[StateRequest, ...] = ()
    tflm_scratch: tuple[MemoryRequest, ...] = ()  # what TFLite Micro's kernel would request

    @property
    def kernel_name(self) -> str:
        """What reports call the kernel: the target kernel's name, or "portable"."""
        return self.variant.name if self.variant is not None else "portable"


@dataclass(frozen=True)
class OpSpec:
    """What the toolchain knows of one operator type: everything a new op family fills in.

    `kernels`: the operand dtypes each of its kernels runs, and the targets it is emitted for.
    `prepare(graph, op)` returns the op's params (a frozen dataclass: shapes, options and
    quantization constants such as multipliers, shifts and clamps) that every backend executes
    from; it raises UnsupportedOpError for a variant it cannot run and ModelError for an op the
    model cannot mean (a required input or option missing).
    """

    opcode: str
    kernels: tuple[Signature, ...]
    prepare: Callable[[Graph, Operator], Any]
    # The C function's text from an OpContext (toolchain/ops/emit.py).
    emit: Callable[[Any], Any]
    # The scratch the C kernel asks for, from the op's params; none by default.
    scratch: Callable[[Any], tuple[MemoryRequest, ...]] | None = None
    # The outputs the kernel's loop order lets share an input's memory (toolchain/ops/overlaps).
    overlaps: Rule | None = None
    # The input that holds the output's shape (TRANSPOSE_CONV's output_shape). Shapes are fixed
    # when the model is planned: given at run time, it must hold the declared output shape.
    shape_input: int | None = None
    # The state the kernel keeps across invokes (StateRequest), from the op's params: slots of
    # the state block, after the graph's inputs in runtime_py's kernel call and the C's
    # OpContext.state.
    state: Callable[[Any], tuple[StateRequest, ...]] | None = None
    # The scratch TFLite Micro's kernel for the op requests in its Prepare, in its order, from
    # the op's params: what `--planner tflm` plans in place of ours, to show TFLM's own arena
    # (toolchain.lower.program.Program.tflm_scratch). None: it requests none.
    tflm_scratch: Callable[[Any], tuple[MemoryRequest, ...]] | None = None
    # How the kernel runs on a band of its output rows, if it can (toolchain.ops.striping):
    # what striped segments (toolchain.lower.tiling) need of it.
    striping: Striping | None = None
    # What a PAD in front of it must write to be fused into its window (toolchain.ops.padding,
    # toolchain.lower.fusion); None: a PAD before it stays a PAD.
    pad: PadRule | None = None
    # Whether running it does more than write its outputs from its inputs (it keeps a variable,
    # runs a subgraph): such ops keep the file's order among themselves
    # (toolchain.lower.schedule).
    effects: bool = False
    # Whether LiteRT's kernel leaves some output entries unwritten (past its results), where
    # ours writes 0: the oracle zeroes those outputs before each invoke (toolchain.lab.oracle)
    partial_outputs: bool = False
    # The kernel may end the invoke after its own work (TFLite Micro's kTfLiteAbort: a
    # CIRCULAR_BUFFER still gathering frames): the ops after it wait for a later invoke, and
    # the model's outputs are left as they were
    stops: bool = False
    # The multiply-accumulates of an op that does not run in stripes, from its params, for the
    # per-layer cost (a striped family's Striping.macs counts its own); None: it counts none
    macs: Callable[[Any], int] | None = None
    matched: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def kernel_for(self, inputs: tuple[str | None, ...],
                   outputs: tuple[str | None, ...]) -> Signature | None:
        """Its first signature that runs these operand dtypes."""
        return first_kernel(self.kernels, self.matched, inputs, outputs)


def required_input(graph: Graph, op: Operator, position: int, what: str) -> Tensor:
    """Input `position` of the op, which TFLite's kernel requires to be present."""
    if position >= len(op.inputs) or op.inputs[position] < 0:
        raise ModelError(f"the required {what} (input {position}) is missing")
    return graph.tensors[op.inputs[position]]


def input_and_output_alike(graph: Graph, op: Operator) -> tuple[Tensor, Tensor]:
    """Input 0 and the output of an op whose output TFLite's kernel resizes to the input's
    shape: a model whose output states another shape cannot mean it."""
    x = required_input(graph, op, 0, "input")
    out = graph.tensors[op.outputs[0]]
    if x.shape != out.shape:
        raise ModelError(f"output shape {list(out.shape)} is not the input's {list(x.shape)}")
    return x, out


def required_options(op: Operator, *keys: str) -> dict[str, Any]:
    """The op's options, which must hold `keys`: without its options table an op such as a
    pooling has no window, and TFLite's zeroed defaults describe none."""
    missing = [k for k in keys if k not in op.options]
    if missing:
        raise ModelError(f"its options lack {', '.join(missing)}")
    return dict(op.options)
