"""The files of one model, laid out by templates/c/model.h.j2, model.c.j2 and harness.c.j2 from
values computed here: what the header says of the arena, the state block and the I/O; the
includes, helper functions, constants and kernels of the C file; and its init, invoke, input,
output and reset functions."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from toolchain import __version__
from toolchain.c.addressing import Addresses
from toolchain.c.control import c_subgraph
from toolchain.c.steps import Emission
from toolchain.ir import Graph, Tensor
from toolchain.lower.plan import ModelPlan, StateSlot, block_alignment
from toolchain.lower.program import Program
from toolchain.ops.emit import (
    C_TYPES,
    FAILURES,
    MATH_H,
    WAITING_STATUS,
    c_array,
    c_float,
    c_int64,
    c_length,
    helper_definitions,
)
from toolchain.render import render
from toolchain.targets import Target
from toolchain.text import c_text

SHARED_NAME = "arenac_shared"

# Every constant array in flash starts on this boundary: the widest load a kernel makes of
# one (a Helium vector, or LDRD's pair of words) is then aligned.
CONSTANT_ALIGNMENT = 16


@dataclass(frozen=True)
class SharedArena:
    """The one arena that models generated together run in, one at a time: as large and as
    aligned as the most demanding of them needs (`generate_shared`)."""

    symbol: str
    header: str
    bytes: int
    alignment: int
    models: tuple[str, ...]


@dataclass(frozen=True)
class IOInfo:
    """What the header says of one input or output (`name` spelled for a comment)."""

    index: int
    name: str
    ctype: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    scale: str
    zero_point: str
    in_arena: bool

    @property
    def array_length(self) -> int:
        """Elements to declare a buffer of it with (never zero)."""
        return c_length(math.prod(self.shape))

    @property
    def bytes_length(self) -> int:
        """Bytes to declare a byte buffer of it with (never zero)."""
        return c_length(self.nbytes)


@dataclass(frozen=True)
class Layout:
    """How the generated file holds its memory and is driven, as `generate` was asked."""

    external_io: bool
    arena: str  # "static" or "extern" (toolchain.c.checks.ARENAS)
    shared: SharedArena | None
    trace: bool
    pools: list[dict]  # toolchain.c.addressing.pool_arrays


def model_files(em: Emission, calls: list[str], layout: Layout,
                target: Target) -> dict[str, str]:
    """File name -> text of NAME.h, NAME.c and the host harness NAME_main.c, once every kernel
    was emitted."""
    name = em.at.name
    values = {**about(em.mp, name, target), **memory(em.mp, em.at, layout),
              **interface(em.mp, em.at, layout), **code(em, calls, layout.trace)}
    return {
        f"{name}.h": render("c/model.h.j2", **values),
        f"{name}.c": render("c/model.c.j2", **values),
        f"{name}_main.c": render("c/harness.c.j2", **values),
    }


def about(mp: ModelPlan, name: str, target: Target) -> dict:
    """The values the files' opening comments, guards and size macros state."""
    return {
        "name": name,
        "guard": name.upper() + "_H",
        "version": __version__,
        "sha256": mp.model.sha256,
        "planner": mp.plan.planner,
        "alignment": mp.plan.alignment,
        "block_alignment": block_alignment(mp.plan.alignment),
        "constant_alignment": CONSTANT_ALIGNMENT,
        "arena_bytes": mp.arena_bytes,
        "arena_length": c_length(mp.arena_bytes),
        "lower_bound_bytes": mp.overlap_bound_bytes,  # the bound of this plan (overlaps, stripes)
        "target": None if target.guard is None else {
            "name": target.name, "title": target.title, "guard": target.guard},
    }


def memory(mp: ModelPlan, at: Addresses, layout: Layout) -> dict:
    """The values of the arena, the pools, the offset table, the state block and the weights'
    RAM copy."""
    image = bytearray(mp.state_bytes)  # what the state block starts as
    for slot in mp.state_slots:
        image[slot.offset : slot.offset + slot.nbytes] = slot.init
    pools = layout.pools
    return {
        "state_bytes": mp.state_bytes,
        "state_length": c_length(mp.state_bytes),
        "state_image": c_array(np.frombuffer(bytes(image), np.uint8)) if any(image) else None,
        "offsets": offset_rows(mp, at),
        "state": [state_info(slot, k, at.name, mp.program)
                  for k, slot in enumerate(mp.state_slots)],
        "arena": layout.arena,
        "shared": layout.shared,
        "pools": [p for p in pools if p["used"]],
        "all_pools": pools,
        "weights": weights(mp, at),
        "state_section": (mp.pools[mp.state_pool].pool.section
                          if mp.state_pool is not None else None),
        "state_pool": (mp.pools[mp.state_pool].pool.name
                       if mp.state_pool is not None else None),
        "sections": any(p["section"] for p in pools if p["used"]) or any(
            k is not None and mp.pools[k].pool.section is not None and nbytes > 0
            for k, nbytes in ((mp.state_pool, mp.state_bytes),
                              (mp.weights_pool, mp.weights_layout[1]))),
    }


def interface(mp: ModelPlan, at: Addresses, layout: Layout) -> dict:
    """The values of the model's inputs and outputs: what the header says of each, where
    NAME_input and NAME_output find them, and the outputs invoke copies with external I/O."""
    graph = mp.graph
    inputs = [io_info(graph.tensors[t], i, t not in at.external)
              for i, t in enumerate(graph.inputs)]
    outputs = [io_info(graph.tensors[t], i, t not in at.external)
               for i, t in enumerate(graph.outputs)]
    scales = [graph.tensors[t].quantization for t in (*graph.inputs, *graph.outputs)]
    return {
        "external_io": layout.external_io,
        "inputs": inputs,
        "outputs": outputs,
        "input_ptrs": ["NULL" if t in mp.streamed_inputs else at.pointer(t)
                       for t in graph.inputs],
        **stream_values(mp, at.name),
        **streamed_words(mp),
        "output_ptrs": ["NULL" if t in mp.streamed_outputs else at.pointer(t)
                        for t in graph.outputs],
        "copies": external_copies(graph, at.name) if layout.external_io else [],
        "header_needs_math_h": non_finite([q.scale[0] for q in scales if q]),
    }


def streamed_words(mp: ModelPlan) -> dict:
    """What the header says of the streamed inputs and outputs: which ("input 0") and their
    rows."""
    graph = mp.graph
    words = {}
    for what, tensors, streamed in (("input", graph.inputs, mp.streamed_inputs),
                                    ("output", graph.outputs, mp.streamed_outputs)):
        found = [(i, t) for i, t in enumerate(tensors) if t in streamed]
        rows = [f"{what} {i}'s rows are {graph.tensors[t].nbytes // graph.tensors[t].shape[1]} "
                "bytes of NHWC" for i, t in found]
        words[f"streamed_{what}s"] = " and ".join(f"{what} {i}" for i, _ in found)
        words[f"streamed_{what}_rows"] = "; ".join(rows)
    # a segment in column tiles fetches its input's rows once per tile, from row 0 each time
    tiles = {graph.inputs.index(s.input): len(s.tiles) for s in mp.tiling.segments if s.tiles}
    times = "; ".join(f"input {i}'s rows {n} times each" for i, n in sorted(tiles.items()))
    words["fetch_order"] = (f"in order once per column tile ({times})" if tiles
                            else "in order and each row once")
    tile_counts = "; ".join(f"input {i}: {n} tiles" for i, n in sorted(tiles.items()))
    words["fetch_times"] = (f"once per column tile ({tile_counts}, each from row 0)" if tiles
                            else "each once per invoke")
    return words


def stream_values(mp: ModelPlan, name: str) -> dict:
    """What a harness says of the streamed inputs and outputs (templates/c/streamed_input.c.j2
    and streamed_output.c.j2), and where it finds input and output i: in its own copy of a
    streamed one, else where NAME_input(i) and NAME_output(i) say."""
    streams, handed = input_streams(mp), output_streams(mp)
    return {
        "streams": streams, "output_streams": handed,
        "input_at": f"(streamed[i] != NULL ? (void *)streamed[i] : {name}_input(i))" if streams
        else f"{name}_input(i)",
        "output_at": f"(handed[i] != NULL ? (void *)handed[i] : {name}_output(i))" if handed
        else f"{name}_output(i)",
    }


def io_streams(mp: ModelPlan, tensors: Sequence[int], streamed: frozenset[int],
               buffer: str) -> list[dict]:
    """What a harness says of each input or output (`tensors`) when the model streams some of
    them (none otherwise): the array `buffer`N it keeps a streamed one in, "NULL" for one in
    the arena, and the bytes of a row (templates/c/streamed_input.c.j2, streamed_output.c.j2)."""
    graph = mp.graph
    if not streamed & set(tensors):
        return []
    return [{"index": i, "buffer": f"{buffer}{i}" if t in streamed else "NULL",
             "length": c_length(graph.tensors[t].nbytes),
             "row_bytes": graph.tensors[t].nbytes // max(graph.tensors[t].shape[1], 1)
             if t in streamed else 0}
            for i, t in enumerate(tensors)]


def input_streams(mp: ModelPlan) -> list[dict]:
    """io_streams of the inputs: each streamed one kept in `streamed`N."""
    return io_streams(mp, mp.graph.inputs, mp.streamed_inputs, "streamed")


def output_streams(mp: ModelPlan) -> list[dict]:
    """io_streams of the outputs: each streamed one kept in `handed`N."""
    return io_streams(mp, mp.graph.outputs, mp.streamed_outputs, "handed")


def code(em: Emission, calls: list[str], trace: bool) -> dict:
    """The values of the C file's code: includes, constants, helpers, kernels and the calls
    invoke makes."""
    mp, at = em.mp, em.at
    graph = mp.graph
    referenced = {*at.used, *graph.inputs, *graph.outputs}
    folded = [t for t in graph.tensors if t.is_constant and t.index in referenced]
    uses_float = any(t.dtype == "float32" for t in graph.tensors)
    fixed_point, helpers = helper_definitions(em.groups)
    declared = em.includes()
    return {
        "uses_float": uses_float,
        # float code may use <math.h>'s NAN or INFINITY (toolchain.ops.emit.c_float)
        "source_needs_math_h": uses_float or MATH_H in declared
        or any(non_finite(t.data) for t in folded),
        "constants": [constant(mp, at, t) for t in folded] + packed_int4(mp, at),
        "helpers": helpers,
        "fixed_point": fixed_point,
        "includes": sorted(declared - {MATH_H}),
        "kernels": em.texts,
        "calls": calls,
        "trace": trace,
        "failures": [f for f in FAILURES if f.group in em.groups],
        "waiting": WAITING_STATUS if any(k.stops for k in em.kernel_of.values()) else None,
    }


def non_finite(values: Iterable[float] | np.ndarray) -> bool:
    """Whether floats include one that C names NAN or INFINITY (c_float), which <math.h>
    defines; integers never do."""
    array = np.asarray(values)
    return array.dtype.kind == "f" and not np.isfinite(array.astype(np.float32)).all()


def constant(mp: ModelPlan, at: Addresses, t: Tensor) -> dict:
    """What the C file says of a constant array some kernel points at."""
    return {
        "name": at.constant_name(t.index),
        "ctype": C_TYPES[t.dtype],
        "length": c_length(t.num_elements),
        "initializer": c_array(t.data),
        "comment": f"{mp.program.tensor_label(t.index)} '{c_text(t.name)}' "
                   f"{t.dtype}{list(t.shape)}",
    }


def packed_int4(mp: ModelPlan, at: Addresses) -> list[dict]:
    """The int4 filters kept packed in flash (Program.int4_unpacks), each once."""
    packed = dict(mp.program.int4_unpacks.values())
    return [{"name": f"{at.constant_name(t)}_int4", "ctype": "uint8_t",
             "length": c_length(len(data)), "initializer": c_array(np.frombuffer(data, np.uint8)),
             "comment": f"{mp.program.tensor_label(t)} '{c_text(mp.graph.tensors[t].name)}' "
                        f"int4{list(mp.graph.tensors[t].shape)}, packed two a byte, the low "
                        "nibble first"} for t, data in sorted(packed.items())]


def offset_rows(mp: ModelPlan, at: Addresses) -> list[dict]:
    """Each planned buffer's offset in its array, as a macro named by what it holds, and a
    comment saying what that is (and in which pool)."""
    program = mp.program
    rows = {r.tensor: r for r in mp.rows()}
    comments = [
        f"{program.tensor_label(t)} '{c_text(rows[t].name)}': {rows[t].bytes} "
        f"bytes, ops {rows[t].first_op}-{rows[t].last_op}" for t in at.slot_of
    ] + [
        f"scratch of {program.op_label(request.op)} ({c_text(request.purpose)}): "
        f"{request.size} bytes" for request, _ in mp.scratch_offsets()
    ]
    if mp.pools:  # say which pool each slot indexes
        comments = [f"{mp.pools[k].pool.name}: {c}" for c, (k, _) in zip(comments, at.places,
                                                                         strict=True)]
    return [{"macro": macro, "offset": offset, "comment": c}
            for macro, c, (_, offset) in zip(at.macros, comments, at.places, strict=True)]


def weights(mp: ModelPlan, at: Addresses) -> dict | None:
    """With the weights pinned to a RAM pool, its array and the constants copied into it."""
    if mp.weights_pool is None:
        return None
    pool = mp.pools[mp.weights_pool].pool
    return {
        "pool": pool.name,
        "section": pool.section,
        "bytes": mp.weights_layout[1],
        "length": c_length(mp.weights_layout[1]),
        "copies": [{"offset": offset, "source": at.constant_name(t),
                    "nbytes": mp.graph.tensors[t].nbytes}
                   for t, offset in at.weights_at.items() if t in at.used],
    }


def state_info(slot: StateSlot, k: int, name: str, program: Program) -> dict:
    """What the templates say of one slot of the state block: where it is, how a reset
    restores it (one byte value, or a copy of `init`), and what it is in words."""
    if slot.kind == "variable":
        what = (f"{program.tensor_label(slot.tensor)} '{c_text(slot.name)}' "
                f"{slot.dtype}{list(slot.shape)}")
        if slot.dtype == "int8" and slot.fill:  # the byte of an int8 variable's zero point
            what += f", its zero point {slot.fill - 256 if slot.fill > 127 else slot.fill}"
    elif slot.kind == "resource":
        what = f"resource variable '{c_text(slot.name)}' {slot.dtype}{list(slot.shape)}"
    elif slot.kind == "kernel":
        what = f"{c_text(slot.name)}, {slot.dtype}{list(slot.shape)}"
    else:
        what = f"whether CALL_ONCE ran subgraph {c_subgraph(program, slot.subgraph)}"
    span = (f"byte {slot.offset}" if slot.nbytes <= 1
            else f"bytes {slot.offset}-{slot.offset + slot.nbytes - 1}")
    return {
        "offset": slot.offset,
        "nbytes": slot.nbytes,
        "length": c_length(slot.nbytes),
        "fill": slot.fill if slot.nbytes else 0,
        "init": None if slot.fill is not None or not slot.nbytes
        else c_array(np.frombuffer(slot.init, np.uint8)),
        "init_name": f"{name}_state_init{k}",
        "comment": what,
        "span": span,
    }


def external_copies(graph: Graph, name: str) -> list[dict]:
    """With external I/O, the caller's output buffers that no kernel writes: an output that is
    a constant or a graph input, or a tensor listed again as a later output, is copied there
    after the kernels ran."""
    written = {t for op in graph.operators for t in op.outputs}
    first = {}
    copies = []
    for j, t in enumerate(graph.outputs):
        tensor = graph.tensors[t]
        if t in first:
            src, why = f"{name}_io_out[{first[t]}]", f"the same tensor as output {first[t]}"
        elif t in written:
            first[t] = j
            continue
        elif t in graph.inputs:
            src, why = f"{name}_io_in[{graph.inputs.index(t)}]", "a graph input"
        else:
            src, why = f"{name}_t{t}", "a constant"
        first.setdefault(t, j)
        copies.append({"dst": f"{name}_io_out[{j}]", "src": src, "nbytes": tensor.nbytes,
                       "comment": f"output {j} is {why}"})
    return copies


def io_info(t: Tensor, index: int, in_arena: bool) -> IOInfo:
    """What the header says of tensor t as input or output `index`."""
    q = t.quantization
    return IOInfo(
        index,
        c_text(t.name),
        C_TYPES[t.dtype],
        t.dtype,
        t.shape,
        t.nbytes,
        c_float(q.scale[0] if q else 0.0),
        c_int64(q.zero_point[0] if q else 0),
        in_arena,
    )


def traced_tensors(mp: ModelPlan) -> list[tuple[int, int]]:
    """(step, tensor) of every value the main graph's ops write, in execution order: what a
    per-layer check compares (a called subgraph's tensors and resource handles excepted)."""
    graph, program = mp.graph, mp.program
    main = set(program.ops_of(program.graph_index))
    striped = mp.tiling.intermediates()  # never whole: only their stripes' rows exist
    return [(step, t) for step, op in enumerate(mp.lifetimes.order) if op in main
            for t in graph.operators[op].outputs
            if t >= 0 and not graph.tensors[t].is_handle and t not in striped]


def traced_calls(mp: ModelPlan, at: Addresses, steps: list[int], calls: list[str]) -> list[str]:
    """Invoke's calls of the main graph's steps, each followed by NAME_trace of every tensor
    `traced_tensors` lists for it."""
    traced: dict[int, list[int]] = {}
    for step, t in traced_tensors(mp):
        traced.setdefault(step, []).append(t)
    return [line for step, c in zip(steps, calls, strict=True)
            for line in [c] + [f"{at.name}_trace({step}, {t}, {at.pointer(t)}, "
                               f"{mp.graph.tensors[t].nbytes}u);" for t in traced.get(step, ())]]

