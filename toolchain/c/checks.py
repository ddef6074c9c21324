"""What `generate` refuses before writing any C: graphs whose C could not compile or be driven,
plans that are unsafe or not of this graph, and options or kernels the plan cannot take."""

from __future__ import annotations

from toolchain.errors import ArenacError, ModelError, PlanError, UnsupportedOpError
from toolchain.ir import Graph
from toolchain.lower.lifetimes import overlap_pairs
from toolchain.lower.plan import ModelPlan, segment_overlaps
from toolchain.ops.spec import PORTABLE_C
from toolchain.planners import PooledPlacement, verify, verify_pools
from toolchain.targets import Target

# How NAME_arena comes to be: a static array of the file's own, or the caller's memory
# (`NAME_init(arena, bytes)`).
ARENAS = ("static", "extern")


def check_graph(graph: Graph, source: str) -> None:
    """Refuses graphs whose C could not compile or could not be driven: no inputs (the harness
    would wait for input sets that have no bytes), no outputs (nothing to read; an empty
    initializer is not C), a constant input (the harness would write into the weights), or an
    output that nothing ever writes (a symbol no declaration backs)."""
    if not graph.inputs:
        raise UnsupportedOpError(
            "the graph has no inputs: generated C is driven by at least one", source
        )
    if not graph.outputs:
        raise ModelError("the graph has no outputs", source)
    for i, t in enumerate(graph.inputs):
        if graph.tensors[t].is_constant:
            raise ModelError(
                f"graph input {i} is tensor {t} ({graph.tensors[t].name!r}), a constant", source
            )
    written = {t for op in graph.operators for t in op.outputs} | set(graph.inputs)
    for i, t in enumerate(graph.outputs):
        tensor = graph.tensors[t]
        if t not in written and not tensor.is_constant and not tensor.is_variable:
            raise ModelError(
                f"graph output {i} is tensor {t} ({tensor.name!r}), which no operator writes "
                "and which is neither a graph input nor a constant",
                source,
            )


def check_plan(mp: ModelPlan, external_io: bool) -> None:
    """Refuses a plan made for other I/O than asked for, an unsafe one (`verify`: PlanError),
    and one that is not a plan of this graph: its buffers must be the ones the graph's
    lifetimes give in the order it was made for, and each overlap it may use one that the
    graph's operators allow."""
    graph, source = mp.graph, mp.model.source
    planned = set(mp.offset_of_tensor())
    io = set(graph.inputs) | set(graph.outputs)
    if external_io and io & planned:
        raise UnsupportedOpError("external I/O needs a plan made with external_io=True", source)
    streamed = mp.streamed_inputs | mp.streamed_outputs
    if external_io and streamed:
        raise UnsupportedOpError("external I/O passes the inputs and outputs whole; this plan "
                                 "streams some (--stream-input, --stream-output)", source)
    unplanned = {t for t in io - planned - streamed if not graph.tensors[t].is_constant}
    if not external_io and unplanned - set(mp.lifetimes.variables):
        raise UnsupportedOpError(
            "the plan keeps inputs or outputs out of the arena (it was made with "
            "external_io=True): generate with external_io=True",
            source,
        )
    try:
        verify(mp.plan)
        if mp.pools:
            verify_pools(PooledPlacement(mp.plan, mp.pools, mp.pool_of))
    except PlanError as e:
        raise PlanError(f"unsafe plan: {e.message}", source) from None
    if mp.lifetimes.buffers != mp.plan.buffers:
        raise PlanError(
            "the plan's buffers (sizes or lives) are not the ones this graph needs", source
        )
    kept = mp.program.control_lives(mp.lifetimes.order)[1]
    allowed = {*overlap_pairs(graph, mp.lifetimes, mp.program.bindings, kept=kept),
               *segment_overlaps(mp.lifetimes, mp.tiling, kept)}
    for o in mp.plan.overlaps:
        if o not in allowed:
            raise PlanError(
                f"the plan lets buffers {o.below} and {o.above} overlap, which no operator "
                "allows",
                source,
            )


def check_arena(mp: ModelPlan, arena: str, shared: bool) -> None:
    """Refuses an arena that is neither static nor extern, and pools with any but the file's
    own static arena."""
    source = mp.model.source
    if arena not in ARENAS:
        raise ArenacError(f"the arena is static or extern, not {arena!r}", source)
    if mp.pools and (arena != "static" or shared):
        raise ArenacError("memory pools are static arrays of the generated file: they take "
                          "neither --arena extern nor a shared arena", source)


def check_kernels(mp: ModelPlan, target: Target) -> None:
    """Refuses a plan binding an op to a kernel made for another target than the C's."""
    program = mp.program
    elsewhere = [b for b in program.bindings
                 if PORTABLE_C not in b.kernel.targets and target.name not in b.kernel.targets]
    if elsewhere:
        raise UnsupportedOpError(f"no C kernel for {target.name} runs " + ", ".join(
            f"{program.op_label(b.op)} {b.opcode} ({b.kernel.form})" for b in elsewhere),
            mp.model.source)
