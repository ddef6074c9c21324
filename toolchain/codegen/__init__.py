"""Generate C from a plan: a static arena, an offset table, const weights and one specialized
function per operator, all laid out by the Jinja templates in templates/c/.

Python computes every value (offsets, shapes, constants, kernel bodies' numbers); the templates
only place them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import import_module

import numpy as np

from toolchain.codegen.context import C_TYPES, CTensor, Emitter, OpContext, c_array, c_float
from toolchain.errors import UnsupportedOpError
from toolchain.ir import Tensor
from toolchain.ops import FAMILY_NAMES, prepare_graph
from toolchain.plan import ModelPlan
from toolchain.render import render

FAMILIES = tuple(import_module(f"toolchain.codegen.{name}") for name in FAMILY_NAMES)

EMITTERS: dict[str, Emitter] = {op: e for family in FAMILIES for op, e in family.EMITTERS.items()}


@dataclass(frozen=True)
class IOInfo:
    """What the header says of one input or output."""

    index: int
    name: str
    ctype: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    scale: str
    zero_point: int
    in_arena: bool


def c_identifier(text: str) -> str:
    name = re.sub(r"\W", "_", text)
    return name if name and not name[0].isdigit() else f"m_{name}"


def generate(mp: ModelPlan, name: str = "model", external_io: bool = False) -> dict[str, str]:
    """File name -> text of NAME.h, NAME.c and the host harness NAME_main.c."""
    name = c_identifier(name)
    graph = mp.graph
    source = mp.model.source
    params = prepare_graph(graph, source)
    missing = sorted({op.opcode for op in graph.operators if op.opcode not in EMITTERS})
    if missing:
        raise UnsupportedOpError(f"no C kernel for {', '.join(missing)}", source)
    offsets = mp.offset_of_tensor()
    slot_of = {t: k for k, t in enumerate(offsets)}
    state_offsets, state_bytes = mp.state_layout()
    external = set(graph.inputs) | set(graph.outputs) if external_io else set()
    if external_io and external & set(offsets):
        raise UnsupportedOpError("external I/O needs a plan made with external_io=True", source)

    def pointer(t: int) -> str:
        tensor = graph.tensors[t]
        ctype = C_TYPES[tensor.dtype]
        if t in external:
            if t in graph.inputs:
                return f"(({ctype} *){name}_io_in[{graph.inputs.index(t)}])"
            return f"(({ctype} *){name}_io_out[{graph.outputs.index(t)}])"
        if t in slot_of:
            return f"(({ctype} *)({name}_arena + {name}_offsets[{slot_of[t]}]))"
        if t in state_offsets:
            return f"(({ctype} *)({name}_state + {state_offsets[t]}))"
        return f"{name}_t{t}"

    def c_tensor(t: int) -> CTensor | None:
        if t < 0:
            return None
        tensor = graph.tensors[t]
        data = tensor.data if tensor.is_constant and not tensor.is_variable else None
        return CTensor(t, tensor.name, tensor.dtype, tensor.shape, pointer(t), data)

    kernels, calls = [], []
    for step, op_index in enumerate(mp.lifetimes.order):
        op = graph.operators[op_index]
        fn = f"{name}_op{op_index}_{op.opcode.lower()}"
        context = OpContext(
            fn,
            f"{name}_op{op_index}",
            op,
            params[op_index],
            tuple(c_tensor(t) for t in op.inputs),
            tuple(c_tensor(t) for t in op.outputs),
        )
        kernels.append(EMITTERS[op.opcode](context))
        calls.append({"fn": fn, "step": step, "comment": f"op {op_index} {op.opcode}"})

    referenced = set(re.findall(r"\b\w+\b", "\n".join(kernels)))
    constants = [
        {
            "name": f"{name}_t{t.index}",
            "ctype": C_TYPES[t.dtype],
            "count": t.num_elements,
            "initializer": c_array(t.data),
            "comment": f"tensor {t.index} '{t.name}' {t.dtype}{list(t.shape)}",
        }
        for t in graph.tensors
        if t.is_constant and not t.is_variable and f"{name}_t{t.index}" in referenced
    ]
    rows = {r.tensor: r for r in mp.rows()}
    offset_rows = [
        {
            "offset": offsets[t],
            "comment": f"t{t} '{rows[t].name}': {rows[t].bytes} bytes, "
            f"ops {rows[t].first_op}-{rows[t].last_op}",
        }
        for t in offsets
    ]
    state = [
        {
            "offset": state_offsets[t],
            "nbytes": graph.tensors[t].nbytes,
            "init": None
            if graph.tensors[t].data is None
            else c_array(np.frombuffer(graph.tensors[t].data.tobytes(), np.uint8)),
            "comment": f"tensor {t} '{graph.tensors[t].name}'",
        }
        for t in mp.lifetimes.variables
    ]
    values = {
        "name": name,
        "guard": name.upper() + "_H",
        "source": source,
        "planner": mp.plan.planner,
        "alignment": mp.plan.alignment,
        "arena_bytes": mp.arena_bytes,
        "lower_bound_bytes": mp.lower_bound_bytes,
        "state_bytes": state_bytes,
        "external_io": external_io,
        "inputs": [
            io_info(graph.tensors[t], i, t not in external) for i, t in enumerate(graph.inputs)
        ],
        "outputs": [
            io_info(graph.tensors[t], i, t not in external) for i, t in enumerate(graph.outputs)
        ],
        "input_ptrs": [pointer(t) for t in graph.inputs],
        "output_ptrs": [pointer(t) for t in graph.outputs],
        "uses_float": any(t.dtype == "float32" for t in graph.tensors),
        "offsets": offset_rows,
        "constants": constants,
        "state": state,
        "kernels": kernels,
        "calls": calls,
    }
    return {
        f"{name}.h": render("c/model.h.j2", **values),
        f"{name}.c": render("c/model.c.j2", **values),
        f"{name}_main.c": render("c/harness.c.j2", **values),
    }


def io_info(t: Tensor, index: int, in_arena: bool) -> IOInfo:
    q = t.quantization
    return IOInfo(
        index,
        t.name,
        C_TYPES[t.dtype],
        t.dtype,
        t.shape,
        t.nbytes,
        c_float(q.scale[0] if q else 0.0),
        q.zero_point[0] if q else 0,
        in_arena,
    )
