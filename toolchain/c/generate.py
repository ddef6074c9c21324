"""Generate C from a plan: a static arena, an offset table, const weights and one specialized
function per operator, all laid out by the Jinja templates in templates/c/.

Python computes every value (offsets, shapes, constants, kernel bodies' numbers); the templates
only place them. The parts: checks (what is refused), addressing (where every buffer is),
steps, stripes and control (the kernels in the order C needs), module (the files' values)."""

from __future__ import annotations

from dataclasses import dataclass

from toolchain.c.addressing import addresses, pool_arrays
from toolchain.c.checks import check_arena, check_graph, check_kernels, check_plan
from toolchain.c.fragments import build_fragments
from toolchain.c.module import (
    SHARED_NAME,
    Layout,
    SharedArena,
    io_info,
    model_files,
    stream_values,
    traced_calls,
    traced_tensors,
)
from toolchain.c.steps import Emission, kernel_function
from toolchain.errors import ArenacError
from toolchain.lower.plan import ModelPlan
from toolchain.lower.steps import own_steps
from toolchain.ops.emit import MATH_H, c_length
from toolchain.render import render
from toolchain.targets import get_target
from toolchain.text import c_identifier

# what code outside toolchain/c uses of the generator
__all__ = ["SHARED_NAME", "FlashWeights", "SharedArena", "flash_weights", "generate",
           "generate_shared", "io_info", "kernel_function", "stream_values", "traced_tensors"]


def generate(mp: ModelPlan, name: str = "model", external_io: bool = False,
             arena: str = "static", shared: SharedArena | None = None,
             trace: bool = False, fragments: bool = False) -> dict[str, str]:
    """File name -> text of NAME.h, NAME.c and the host harness NAME_main.c (and with
    `fragments` the build fragments NAME.cmake and NAME.mk, toolchain.c.fragments).

    `arena="extern"` leaves the arena to the caller, who hands it to NAME_init; `shared`
    puts the activations in an arena that other models' files use too. The plan is verified
    again here, whoever made it: C from an unsafe plan would corrupt its own activations
    without a word. With `trace`, invoke hands every tensor of `traced_tensors` to NAME_trace
    right after the step that wrote it, and the harness writes them to stdout before each
    set's outputs (`check --per-layer` on the C)."""
    name = c_identifier(name)
    check_graph(mp.graph, mp.model.source)
    check_plan(mp, external_io)
    check_arena(mp, arena, shared is not None)
    params = mp.program.params()
    target = get_target(mp.program.target, mp.model.source)
    check_kernels(mp, target)
    layout = Layout(external_io, arena, shared, trace, pool_arrays(mp, name))
    at = addresses(mp, name, external_io,
                   shared.symbol if shared and arena == "static" else f"{name}_arena",
                   layout.pools)
    em = Emission(mp, at, params)
    em.emit_subgraph(mp.graph_index)
    calls = list(em.calls(mp.graph_index))
    if trace:
        calls = traced_calls(mp, at, own_steps(mp.steps), calls)
    files = model_files(em, calls, layout, target)
    if fragments:
        files.update(build_fragments(mp, name, MATH_H in em.includes(),
                                     shared is not None and arena == "static"))
    return files


@dataclass(frozen=True)
class FlashWeights:
    """The weights NAME.c holds in flash: the model's constant arrays (`constants`: tensor ->
    bytes, an int4 filter kept packed counted packed; a constant no kernel points at, folded
    into a kernel's own table or code, has none) and the tables in which a target's kernels
    lay weights out for their loops (`kernel`: op -> bytes, `footprint`'s kernel weights)."""

    constants: dict[int, int]
    kernel: dict[int, int]


def flash_weights(mp: ModelPlan) -> FlashWeights:
    """What NAME.c holds of the model's weights, from the kernels it would emit."""
    at = addresses(mp, "model", False, "model_arena", pool_arrays(mp, "model"))
    em = Emission(mp, at, mp.program.params())
    em.emit_subgraph(mp.graph_index)
    em.calls(mp.graph_index)
    graph = mp.graph
    referenced = {*at.used, *graph.inputs, *graph.outputs}
    sizes = {t.index: t.nbytes for t in graph.tensors if t.is_constant and t.index in referenced}
    sizes.update({t: len(data) for t, data in mp.program.int4_unpacks.values()})
    return FlashWeights(sizes, em.kernel_weights)


def generate_shared(models: list[tuple[ModelPlan, str]], external_io: bool = False,
                    arena: str = "static", fragments: bool = False) -> dict[str, str]:
    """Several models' files sharing one arena, for models that run one at a time: each
    model's NAME.h, NAME.c and NAME_main.c with its own prefixed API and state block, and
    arenac_shared.h/.c defining the arena, sized to the largest (with `arena="extern"` the
    caller's, handed to every model's NAME_init, so no arenac_shared files)."""
    names = [c_identifier(n) for _, n in models]
    folded = [n.upper() for n in names]  # header guards and macros are NAME in upper case
    repeated = sorted({n for n, f in zip(names, folded, strict=True) if folded.count(f) > 1})
    if repeated:
        raise ArenacError(f"two models would both be called {repeated[0]!r} (or names that "
                          "differ only in case, which header guards and macros spell alike): "
                          "give each its own --name")
    if SHARED_NAME.upper() in folded:
        raise ArenacError(f"the name {SHARED_NAME!r} is the shared arena's; choose another")
    shared = SharedArena(f"{SHARED_NAME}_arena", f"{SHARED_NAME}.h",
                         max(mp.arena_bytes for mp, _ in models),
                         max(mp.plan.alignment for mp, _ in models), tuple(names))
    files: dict[str, str] = {}
    for (mp, _), name in zip(models, names, strict=True):
        own = generate(mp, name, external_io, arena, shared, fragments=fragments)
        taken = {f.lower() for f in files} & {f.lower() for f in own}
        if taken:  # `a` and `a_main`: a's harness is a_main.c, the other's model file
            raise ArenacError(f"two models' files would both be {sorted(taken)[0]}: give them "
                              "--name values whose files differ", mp.model.source)
        files.update(own)
    if arena == "static":
        values = {"shared": shared, "guard": SHARED_NAME.upper() + "_H",
                  "macro": SHARED_NAME.upper() + "_ARENA_BYTES",
                  "length": c_length(shared.bytes),
                  "models": [{"name": n, "bytes": mp.arena_bytes}
                             for (mp, _), n in zip(models, names, strict=True)]}
        files[f"{SHARED_NAME}.h"] = render("c/shared.h.j2", **values)
        files[f"{SHARED_NAME}.c"] = render("c/shared.c.j2", **values)
    return files
