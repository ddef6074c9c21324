"""Hand arenac's plan to stock TensorFlow Lite Micro: the model's "OfflineMemoryAllocation".

TFLM (tensorflow/tflite-micro: micro_allocation_info.cc, micro_allocator.cc,
memory_planner/greedy_memory_planner.cc, docs/memory_management.md) reads one metadata entry of
that name whose buffer holds little-endian int32 values:

    [version 1, number of subgraphs, n, offset of tensor 0, ..., offset of tensor n-1]

n must equal the number of tensors of all subgraphs together (TFLM refuses the model otherwise),
and entries follow the subgraphs' tensors concatenated in subgraph order. An offset counts bytes
from the start of TFLM's head (its non-persistent section, 16-byte aligned); -1 leaves a tensor
to TFLM's online planner. TFLM ignores the entry of a tensor it does not plan (constants,
zero-byte tensors); a variable with an entry other than -1 would move from TFLM's persistent
tail into the head, so constants and variables get -1. TFLM trusts offline offsets (it never
checks them for overlap) and pads every buffer to 16 bytes, then places the online buffers -
kernels' scratch buffers and any -1 tensors - first-fit in the gaps of the offline plan, above it
where nothing fits; its head is the end of the highest buffer.

So the plan embedded here must be valid in the order TFLM runs the operators (the file's order)
with no bytes shared between tensors alive together (TFLM's kernels are not written for
in-place or overlapping buffers): `embed_plan` checks that the plan's own lifetimes follow the
file's order and that no two live tensors share a byte, and drops planned scratch buffers (TFLM
never takes offline offsets for scratch), and refuses a plan that fused a PAD into the op
reading it (toolchain.lower.fusion: TFLM runs the PAD, which needs its output planned). Make
the plan with `techniques=NO_TECHNIQUES`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

import flatbuffers
import numpy as np

from toolchain.errors import ModelError, PlanError, RuntimeBackendError
from toolchain.files import write_atomic
from toolchain.front.builder import FILE_IDENTIFIER, AlignedBufferT
from toolchain.front.reader import parse_model
from toolchain.front.schema import fb
from toolchain.ir import INT32_MAX, Model
from toolchain.lower.plan import ModelPlan
from toolchain.planners import Placement, verify

METADATA_NAME = "OfflineMemoryAllocation"
FORMAT_VERSION = 1
HEADER_SIZE = 3  # version, number of subgraphs, number of offsets
ONLINE = -1  # "let TFLM's own planner place this tensor"
TFLM_ALIGNMENT = 16  # MicroArenaBufferAlignment(): TFLM's head start and buffer padding


def offline_offsets(model: Model, model_plan: ModelPlan) -> list[int]:
    """One entry per tensor of every subgraph, in TFLM's order: the plan's offset or -1.

    Raises PlanError when the plan was not made from this model, or would not be safe under the
    operator order TFLM uses, or TFLM could not honour it.
    """
    index = model_plan.graph_index
    planned_graph = model_plan.graph
    if not 0 <= index < len(model.graphs):
        raise PlanError(
            f"the plan is for subgraph {index}, but the model has {len(model.graphs)} subgraphs; "
            "plan this model",
            model.source,
        )
    program = model_plan.program
    if program.fused_pads:
        fused = ", ".join(f"{program.op_label(f.pad)} into {program.op_label(f.op)}"
                          for f in program.fused_pads)
        raise PlanError(f"the plan fuses PADs into the ops reading them ({fused}), but TFLM "
                        "runs the file's PADs: plan with fuse_padding off (NO_TECHNIQUES)",
                        model.source)
    for g in program.subgraphs:  # the graph and the subgraphs it calls (CALL_ONCE)
        planned_count = len(program.model.graphs[g].tensors)
        have = len(model.graphs[g].tensors) if g < len(model.graphs) else None
        if have != planned_count:
            raise PlanError(
                f"the plan is for a graph of {planned_count} tensors, but subgraph {g} of the "
                f"model has {'none' if have is None else have}: it was made from another model",
                model.source,
            )
    plan = model_plan.plan
    if plan.alignment % TFLM_ALIGNMENT:
        raise PlanError(
            f"the plan is aligned to {plan.alignment} bytes; TFLM aligns every buffer to "
            f"{TFLM_ALIGNMENT}, so plan with an alignment that is a multiple of {TFLM_ALIGNMENT}",
            model.source,
        )
    offsets = model_plan.offset_of_tensor()
    for t, offset in offsets.items():
        g, i = program.tensor_origin(t)
        tensor, planned = model.graphs[g].tensors[i], planned_graph.tensors[t]
        if tensor.is_constant or tensor.is_variable or tensor.nbytes != planned.nbytes:
            raise PlanError(
                f"the plan places tensor {t} ({planned.name!r}, {planned.nbytes} bytes), which "
                f"in the model is {_kind(tensor)}: it was made from another model",
                model.source,
            )
        if offset > INT32_MAX:
            raise PlanError(f"tensor {t} offset {offset} does not fit in int32", model.source)
    _check_in_file_order(model, model_plan, offsets)

    # entries follow the tensors of every subgraph, concatenated in subgraph order; a called
    # subgraph's tensors live within its caller's step in TFLM's lifetimes as in arenac's
    bases = [sum(len(g.tensors) for g in model.graphs[:k]) for k in range(len(model.graphs))]
    entries = [ONLINE] * sum(len(g.tensors) for g in model.graphs)
    for t, offset in offsets.items():
        g, i = program.tensor_origin(t)
        if planned_graph.tensors[t].nbytes:
            entries[bases[g] + i] = offset
    _check_variables(model, entries)
    return entries


def _kind(tensor) -> str:
    if tensor.is_constant:
        return "a constant"
    if tensor.is_variable:
        return "a variable"
    return f"{tensor.nbytes} bytes"


def _check_in_file_order(model: Model, model_plan: ModelPlan, offsets: dict[int, int]) -> None:
    """No two tensors TFLM keeps alive at the same time may share a byte.

    TFLM runs the operators in the file's order and its kernels assume their buffers are
    disjoint, so the plan is checked against lifetimes in that order with no overlap allowed,
    whatever schedule and overlaps it was made with: plans that did not use them pass.
    """
    index = model_plan.graph_index
    lifetimes = model_plan.lifetimes
    if lifetimes.order != model_plan.program.file_order():
        raise PlanError(
            "the plan was made for another operator order, but TFLM runs the operators in the "
            "file's order; plan with the file's order",
            model.source,
        )
    life = {t: lifetimes.buffers[i] for t, i in lifetimes.tensor_buffers.items()}
    missing = sorted(set(offsets) - set(life))
    if missing:
        raise PlanError(
            f"the plan places tensor {missing[0]}, which is not an activation of subgraph {index}",
            model.source,
        )
    tensors = sorted(offsets)
    buffers = [replace(life[t], id=t) for t in tensors]
    alignment = model_plan.plan.alignment
    check = Placement.from_offsets("embedded", alignment, buffers, [offsets[t] for t in tensors])
    try:
        verify(check)
    except PlanError as e:
        if model_plan.plan.overlaps:
            why = (
                "the plan lets tensors share bytes (in-place or overlapping placement), which "
                "TFLM's kernels are not written for; plan without in-place and overlaps"
            )
        else:
            why = "the plan is not safe in the file's operator order, which TFLM runs"
        raise PlanError(f"{why} ({e.message})", model.source) from None


def _check_variables(model: Model, entries: Sequence[int]) -> None:
    """TFLM decides whether to give a variable persistent memory from entry `i` of the whole
    list, where `i` counts in the variable's own subgraph (AllocateVariables): a variable of a
    later subgraph whose index meets a planned entry would get no memory at all."""
    for g in model.graphs[1:]:
        for t in g.tensors:
            if t.is_variable and t.index < len(entries) and entries[t.index] != ONLINE:
                raise PlanError(
                    f"TFLM would leave variable {t.name!r} of subgraph {g.index} without memory "
                    f"(it reads the offline entry of tensor {t.index} of subgraph 0 for it)",
                    model.source,
                )


def metadata_bytes(entries: Sequence[int], subgraph_count: int) -> bytes:
    """The metadata buffer: header and entries as little-endian int32."""
    values = [FORMAT_VERSION, subgraph_count, len(entries), *entries]
    return np.asarray(values, dtype="<i4").tobytes()


def embed_plan(model_bytes: bytes, model_plan: ModelPlan, source: str = "<bytes>") -> bytes:
    """A copy of the model whose "OfflineMemoryAllocation" metadata carries the plan.

    Everything else is kept: the file is rewritten through the schema's object API with only
    that metadata entry and its buffer added (or, when the model already has the entry, its
    buffer's contents replaced). The same inputs always give the same bytes.
    """
    model = parse_model(model_bytes, source)  # the plan must be one of these very bytes
    entries = offline_offsets(model, model_plan)
    data = metadata_bytes(entries, len(model.graphs))

    tree = _object_tree(model_bytes, source)
    buffers = [_aligned(b) for b in tree.buffers or []]
    if any(b.offset > 1 for b in buffers):
        raise ModelError(
            "model keeps its buffers outside the flatbuffer (over 2 GB); cannot rewrite it", source
        )
    metadata = list(tree.metadata or [])
    ours = [i for i, m in enumerate(metadata) if _name(m) == METADATA_NAME]
    payload = np.frombuffer(data, np.uint8)
    if ours:
        first = metadata[ours[0]]
        for i in reversed(ours[1:]):  # TFLM would read the last duplicate: keep one entry only
            stale = metadata.pop(i).buffer
            if _users(tree, metadata, stale) == 0 and 0 < stale < len(buffers):
                buffers[stale] = AlignedBufferT()
        if _users(tree, metadata, first.buffer) == 1 and 0 < first.buffer < len(buffers):
            buffers[first.buffer] = AlignedBufferT(data=payload)
        else:
            buffers.append(AlignedBufferT(data=payload))
            first.buffer = len(buffers) - 1
        first.name = METADATA_NAME
    else:
        buffers.append(AlignedBufferT(data=payload))
        metadata.append(fb.MetadataT(name=METADATA_NAME, buffer=len(buffers) - 1))
    tree.buffers, tree.metadata = buffers, metadata

    builder = flatbuffers.Builder(len(model_bytes) + len(data) + 1024)
    try:
        builder.Finish(tree.Pack(builder), file_identifier=FILE_IDENTIFIER)
    except Exception as e:  # values the object API read from an unchecked part
        raise ModelError(f"cannot rewrite the model ({type(e).__name__})", source) from None
    return bytes(builder.Output())


def _object_tree(model_bytes: bytes, source: str) -> fb.ModelT:
    """The whole model through the generated object API.

    The object API reads every field of the file, also those the reader skips (sparsity,
    custom options, quantization min and max, ...), and without a verifier it fails in many
    ways on corrupt ones: each becomes one ModelError.
    """
    try:
        return fb.ModelT.InitFromPackedBuf(bytes(model_bytes), 0)
    except RecursionError:
        raise ModelError("corrupt flatbuffer (cyclic offsets); cannot rewrite it", source) from None
    except Exception as e:
        raise ModelError(
            f"corrupt flatbuffer in a part arenac does not read ({type(e).__name__}); "
            "cannot rewrite it",
            source,
        ) from None


def _name(metadata) -> str:
    name = metadata.name
    return name.decode("utf-8", errors="replace") if isinstance(name, bytes) else name or ""


def _aligned(buffer: fb.BufferT) -> fb.BufferT:
    """The same buffer, packed with its data on a 16-byte boundary as the converter writes it."""
    aligned = AlignedBufferT()
    aligned.__dict__.update(vars(buffer))
    return aligned


def _users(tree, metadata: Sequence, buffer: int) -> int:
    """How many tensors and metadata entries refer to buffer `buffer`."""
    count = sum(m.buffer == buffer for m in metadata)
    count += sum(int(b) == buffer for b in tree.metadataBuffer or [])
    for g in tree.subgraphs or []:
        count += sum(t.buffer == buffer for t in g.tensors or [])
    return count


@dataclass(frozen=True)
class TFLMArena:
    """The arena a TFLM user allocates for a model, in bytes: the head (planned tensors and
    its kernels' scratch) and the tail (TFLM's own records: tensor and node structs, kernels'
    persistent data), measured in the tflite-micro interpreter of this host."""

    head: int
    tail: int

    @property
    def total(self) -> int:
        return self.head + self.tail


# The measuring child: the model on stdin, the arena size as argument, TFLM's figures out.
_MEASURE = (
    "import json, sys\n"
    "from toolchain.lab.oracle import TFLMOracle\n"
    "tflm = TFLMOracle(sys.stdin.buffer.read(), 0, arena_size=int(sys.argv[1]))\n"
    "print(json.dumps(tflm.allocations()))\n"
)
MEASURE_TIMEOUT = 120.0  # seconds for the child to load the model


def measure_tflm_arena(model_bytes: bytes, room: int, source: str = "<bytes>") -> TFLMArena | None:
    """TFLM's head and tail for the model, allocated in an arena of `room` bytes (more than it
    needs), or None when the tflite-micro package is not installed.

    The interpreter runs in a child process: TFLM reads a model without a verifier, and a
    crash there must not take arenac with it. Raises RuntimeBackendError if it fails.
    """
    if importlib.util.find_spec("tflite_micro") is None:
        return None
    room = -(-room // TFLM_ALIGNMENT) * TFLM_ALIGNMENT  # an unaligned end shortens the tail
    try:
        done = subprocess.run(
            [sys.executable, "-c", _MEASURE, str(room)], input=model_bytes,
            capture_output=True, timeout=MEASURE_TIMEOUT, check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeBackendError(
            f"TFLite Micro took over {MEASURE_TIMEOUT:g} s to load the model", source
        ) from None
    try:
        figures = json.loads(done.stdout)
        return TFLMArena(int(figures["head"]), int(figures["tail"]))
    except (ValueError, KeyError, TypeError):
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeBackendError(
            f"TFLite Micro could not allocate the model (exit {done.returncode}"
            f"{': ' + said[-1][:100] if said else ''})",
            source,
        ) from None


def embed_file(path: str | os.PathLike, out_path: str | os.PathLike, model_plan: ModelPlan) -> None:
    """Write `embed_plan` of the model at `path` to `out_path`: the whole file or nothing."""
    source, target = os.fspath(path), os.fspath(out_path)
    try:
        with open(source, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ModelError("no such file", source) from None
    except OSError as e:
        raise ModelError(f"cannot read file ({e.strerror})", source) from None
    write_atomic(target, embed_plan(data, model_plan, source))
