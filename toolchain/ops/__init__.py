"""Op knowledge, once: the registry of every operator type arenac runs.

Each op family is a folder, toolchain/ops/<family>/: prepare.py turns an operator into frozen
params, emit.py writes the portable C from them, and its __init__.py lists `SPECS`: per opcode,
the operand dtypes each kernel runs and the targets it is emitted for, the prepare, the C
emitter, the scratch it asks for and the overlaps its loop order makes safe. `bind` is the one
question every command asks: `inspect`, `run`, `gen` and `check` agree because they ask it
alike.

Kernels written for some targets only (TargetKernel) sit beside the portable one in their
family's folder: arm_dsp.py for the cores with the DSP extension, arm_mve.py for Helium (what
they share across families is in toolchain/ops/arm_dsp_common.py and arm_mve_common.py). A
family's `TARGET_KERNELS` lists them; `VARIANTS` gathers them per opcode, and binding for such a
target takes the first that accepts the op, from the same params, and the portable kernel
otherwise.

The shared core stays here: spec.py (OpSpec, TargetKernel, signatures), emit.py (the C
emitters' context and helpers), overlaps.py (the overlap rules), padding.py (fused padding) and
hybrid.py (the hybrid ops' input quantization).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from toolchain.errors import ArenacError, ModelError, UnsupportedOpError
from toolchain.ir import HANDLE_DTYPES, Graph, Operator
from toolchain.ops import (
    activations,
    circular_buffer,
    comparisons,
    control,
    conv,
    decode,
    detection,
    elementwise,
    fill,
    fully_connected,
    lookup,
    lstm,
    pooling,
    quantize,
    reductions,
    resize,
    scan,
    shape,
    signal,
    svdf,
    unary,
    variables,
)
from toolchain.ops.overlaps import declared_overlaps
from toolchain.ops.spec import (
    LITERT_REF,
    TFLM,
    Binding,
    OpSpec,
    Signature,
    TargetKernel,
    describe,
)
from toolchain.targets import GENERIC

FAMILIES = (conv, fully_connected, pooling, elementwise, activations, quantize, shape, reductions,
            resize, svdf, lstm, variables, control, signal, comparisons, unary, fill, scan, lookup,
            detection, decode, circular_buffer)

REGISTRY: dict[str, OpSpec] = {spec.opcode: spec for family in FAMILIES for spec in family.SPECS}

# Operators refused by name, with what they are: no kernel of any family could run them.
OUT_OF_SCOPE: dict[str, str] = {
    "ethos-u": "an Arm Ethos-U NPU's command stream (a Vela-compiled model): NPU code is out of "
               "scope; give arenac the model before Vela compiled it",
}

# Target kernels per opcode, tried in this order before the portable kernel: each family lists
# its own (the DSP-extension ones before the Helium ones), and no opcode is in two families.
TARGET_FAMILIES = (conv, elementwise, fully_connected, pooling)
VARIANTS: dict[str, tuple[TargetKernel, ...]] = {}
for _variant in (v for family in TARGET_FAMILIES for v in family.TARGET_KERNELS):
    VARIANTS[_variant.opcode] = (*VARIANTS.get(_variant.opcode, ()), _variant)


def all_kernels(opcode: str) -> tuple[Signature, ...]:
    """Every signature of an op: its portable kernels' and its target kernels'."""
    return (*REGISTRY[opcode].kernels, *(k for v in VARIANTS.get(opcode, ()) for k in v.kernels))

# Element types the backends store (a C type each); an operand of any other type is refused
# before a kernel or an emitter sees it, whatever role the op gives it.
OPERAND_DTYPES = frozenset({"float32", "int8", "uint8", "int16", "int32", "int64", "uint32",
                            "uint64", "bool"})


def operand_dtypes(graph: Graph, op: Operator) -> tuple[tuple[str | None, ...], tuple[str, ...]]:
    """The dtypes of the op's inputs (None where an optional one is absent) and outputs."""
    tensors = graph.tensors
    return (tuple([tensors[t].dtype if t >= 0 else None for t in op.inputs]),
            tuple([tensors[t].dtype for t in op.outputs]))


def kernel_for(spec: OpSpec, graph: Graph, op: Operator) -> Signature:
    """The signature of the kernel that runs this op's operand dtypes, or UnsupportedOpError."""
    inputs, outputs = operand_dtypes(graph, op)
    signature = spec.kernel_for(inputs, outputs)
    if signature is None:
        raise UnsupportedOpError(f"no kernel for {describe(inputs)} -> {describe(outputs)}")
    return signature


def planned_shape_values(graph: Graph) -> dict[int, np.ndarray]:
    """The value each non-constant shape input must hold (see OpSpec.shape_input): the shape
    of the output it describes, which the plan fixed."""
    values = {}
    for op in graph.operators:
        spec = REGISTRY.get(op.kind)
        if spec is None or spec.shape_input is None or spec.shape_input >= len(op.inputs):
            continue
        index = op.inputs[spec.shape_input]
        if index >= 0 and not graph.tensors[index].is_constant:
            dtype = np.dtype(graph.tensors[index].dtype)
            values[index] = np.asarray(graph.tensors[op.outputs[0]].shape, dtype)
    return values


@dataclass(frozen=True)
class Refusal:
    """Why one operator has no binding: `invalid` for a model that cannot mean the op, else a
    variant no kernel runs."""

    op: int
    message: str
    invalid: bool = False


def bind(graph: Graph, op: Operator, target: str = GENERIC,
         given_up: frozenset[str] = frozenset()) -> Binding:
    """The op bound to its kernel for `target` (a toolchain.targets name), none of the target
    kernels named in `given_up` (a plan held to --max-arena); raises UnsupportedOpError or
    ModelError (without the file)."""
    with np.errstate(all="ignore"):  # a float overflow surfaces as a refused value
        return _bind(graph, op, target, given_up)


def _bind(graph: Graph, op: Operator, target: str, given_up: frozenset[str]) -> Binding:
    """`bind`, with float errors already silenced (once for a whole graph: bind_graph)."""
    spec = REGISTRY.get(op.kind)
    if spec is None:
        raise UnsupportedOpError(OUT_OF_SCOPE.get(op.kind, "no kernel for this operator"))
    _check_operands(spec, graph, op)
    try:
        kernel = kernel_for(spec, graph, op)
    except UnsupportedOpError:
        _raise_if_invalid(spec, graph, op)
        raise
    params = spec.prepare(graph, op)
    tflm = tuple(spec.tflm_scratch(params)) if spec.tflm_scratch else ()
    variant = target_kernel(graph, op, params, target, given_up)
    if variant is not None:
        return replace(variant, tflm_scratch=tflm)
    scratch = spec.scratch(params) if spec.scratch else ()
    state = spec.state(params) if spec.state else ()
    return Binding(op.index, op.kind, kernel, params, tuple(scratch),
                   tuple(declared_overlaps(graph, op, params, spec.overlaps)), state=tuple(state),
                   tflm_scratch=tflm)


def target_kernel(graph: Graph, op: Operator, params: Any, target: str,
                  given_up: frozenset[str] = frozenset()) -> Binding | None:
    """The binding of the first target kernel for `target` that runs the op, if any, passing
    over those named in `given_up`."""
    variants = VARIANTS.get(op.opcode, ())
    if not variants:
        return None
    inputs, outputs = operand_dtypes(graph, op)
    for variant in variants:
        if variant.name in given_up:
            continue
        signature = variant.kernel_for(inputs, outputs, target)
        if signature is None or variant.accepts(graph, op, params) is not None:
            continue
        scratch = variant.scratch(params) if variant.scratch else ()
        state = variant.state(params) if variant.state else ()
        return Binding(op.index, op.opcode, signature, params, tuple(scratch),
                       tuple(declared_overlaps(graph, op, params, variant.overlaps)), variant,
                       tuple(state))
    return None


def _raise_if_invalid(spec: OpSpec, graph: Graph, op: Operator) -> None:
    """An op the model cannot mean (a required input or option missing) is invalid whatever
    its dtypes: its prepare says so before it looks at them."""
    try:
        spec.prepare(graph, op)
    except ModelError:
        raise
    except Exception:  # a variant of dtypes no kernel runs: the signature's refusal stands
        return


def oracle_of(bindings: Sequence[Binding | None]) -> tuple[str, tuple[Binding, ...]]:
    """The interpreter a graph's kernels reproduce, which `check` compares them with: LiteRT's
    reference kernels, unless some kernel follows TFLite Micro's because LiteRT's is wrong for
    its operands (those bindings come along, for messages)."""
    tflm = tuple(b for b in bindings if b is not None and b.kernel.oracle == TFLM)
    return (TFLM, tflm) if tflm else (LITERT_REF, ())


def bind_graph(
    graph: Graph, target: str = GENERIC, label: Callable[[Operator], str] | None = None,
    given: Mapping[int, Binding] | None = None,
) -> tuple[tuple[Binding | None, ...], tuple[Refusal, ...]]:
    """Every op's binding for `target` (None where it has none) and every refusal, graph-wide
    ones first.

    `label(op)` names an op in refusals ("op 3" by default; "subgraph 1 op 0" for the ops of a
    called subgraph). Any exception other than the toolchain's own is a check a prepare lacks,
    and still becomes one refusal naming the op rather than a traceback. `given` holds the
    bindings of ops whose work was done before binding (toolchain.lower.folding).
    """
    bindings: list[Binding | None] = []
    refusals = [Refusal(-1, problem) for problem in _unstorable(graph)]
    with np.errstate(all="ignore"):  # as `bind`, once
        for op in graph.operators:
            if given and op.index in given:
                bindings.append(given[op.index])
                continue
            try:
                bindings.append(_bind(graph, op, target, frozenset()))
                continue
            except ModelError as e:
                problem, invalid = e.message, True
            except ArenacError as e:
                problem, invalid = e.message, False
            except Exception as e:  # the last line of defense: still one line naming the op
                problem, invalid = f"cannot prepare ({type(e).__name__}: {_first_line(e)})", False
            where = f"{label(op) if label else f'op {op.index}'} {op.kind}"
            refusals.append(Refusal(op.index, f"{where}: {problem}", invalid=invalid))
            bindings.append(None)
    return tuple(bindings), tuple(refusals)


def refusal_error(refusals: tuple[Refusal, ...], source: str | None) -> ArenacError:
    """One error for all refusals; invalid ops are reported alone when there are any."""
    invalid = [r.message for r in refusals if r.invalid]
    if invalid:
        return ModelError("invalid: " + "; ".join(invalid), source)
    return UnsupportedOpError("unsupported: " + "; ".join(r.message for r in refusals), source)


def prepare_graph(graph: Graph, source: str | None = None) -> list[Any]:
    """Params for every operator, or one error naming every operator that fails."""
    bindings, refusals = bind_graph(graph)
    if refusals:
        raise refusal_error(refusals, source)
    return [b.params for b in bindings]


def _unstorable(graph: Graph) -> list[str]:
    """Graph inputs, outputs and variables that no backend can hold, whatever reads them."""
    roles = [*((f"graph input {i}", t) for i, t in enumerate(graph.inputs)),
             *((f"graph output {i}", t) for i, t in enumerate(graph.outputs)),
             *(("a variable", t.index) for t in graph.tensors if t.is_variable)]
    return [f"{role} (tensor {t} {graph.tensors[t].name!r}) is of type {graph.tensors[t].dtype}"
            for role, t in roles if graph.tensors[t].dtype not in OPERAND_DTYPES]


def _check_operands(spec: OpSpec, graph: Graph, op: Operator) -> None:
    """What every backend assumes of every op: outputs exist (unless no kernel of the op has
    any: ASSIGN_VARIABLE, CALL_ONCE) and operands have a C type, or are resource handles."""
    if not op.outputs and all(k.outputs for k in spec.kernels):
        raise ModelError("has no outputs")
    for t in (*op.inputs, *op.outputs):
        if t >= 0 and graph.tensors[t].dtype not in OPERAND_DTYPES | HANDLE_DTYPES:
            tensor = graph.tensors[t]
            raise UnsupportedOpError(f"tensor {t} ({tensor.name!r}) of type {tensor.dtype}")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:200]


def unsupported_ops(graph: Graph) -> dict[int, str]:
    """Operators that no backend can run, with the reason: what `inspect` marks is exactly what
    `run`, `gen` and `check` refuse, since all of them ask the same `bind`."""
    return {r.op: r.message for r in bind_graph(graph)[1] if r.op >= 0}
