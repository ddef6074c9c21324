"""Where every tensor and scratch buffer lives, as the C expressions kernels address it by: a
slot of NAME_offsets in the arena or a memory pool, the state block, the pinned weights, the
caller's I/O buffers or a constant array."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolchain.lower.lifetimes import STRIPE, TENSOR, BufferKey
from toolchain.lower.plan import ModelPlan, StateSlot
from toolchain.lower.program import Program
from toolchain.ops.emit import C_TYPES, CTensor, c_length
from toolchain.text import c_text


@dataclass(frozen=True)
class Addresses:
    """The places of one plan's buffers, by the names of one generated file. `used` records the
    tensors some kernel pointed at, as kernels read them (CTensor.ptr): the file defines a
    constant's array only when one did."""

    mp: ModelPlan
    name: str
    arena: str  # the symbol of the arena the activations live in
    slot_of: dict[int, int]  # a planned tensor -> its slot of the offset table
    places: tuple[tuple[int | None, int], ...]  # each slot's pool (None: the arena), offset
    array_of: tuple[str, ...]  # each slot's array
    macros: tuple[str, ...]  # each slot's offset, as the C names it
    scratch_of: dict[int, tuple[str, ...]]  # an op -> `uint8_t *` of its kernel's scratch
    stripe_slot: dict[int, int]  # an intermediate -> the slot of its stripe buffer
    state_at: dict[int, StateSlot]  # a tensor kept in the state block -> its slot there
    external: frozenset[int]  # tensors in the caller's I/O buffers
    weights_at: dict[int, int]  # with weights pinned to a RAM pool, a constant -> its offset
    used: set[int] = field(default_factory=set)

    def constant_name(self, t: int) -> str:
        return f"{self.name}_{self.mp.program.tensor_symbol(t)}"

    def slot_bytes(self, k: int) -> str:
        """The `uint8_t *` expression of slot k of the offset table."""
        return f"{self.array_of[k]} + {self.macros[k]}"

    def state_pointer(self, dtype: str, offset: int) -> str:
        return f"(({C_TYPES[dtype]} *)({self.name}_state + {offset}))"

    def pointer(self, t: int) -> str:
        """A typed pointer at tensor t's first element."""
        graph, name = self.mp.graph, self.name
        tensor = graph.tensors[t]
        if tensor.is_handle:  # a handle is its variable's bytes in the state block
            slot = self.mp.state_of_handle(t)
            if slot is None:
                return "NULL"  # names a variable that nothing assigns or reads
            return self.state_pointer(slot.dtype, slot.offset)
        ctype = C_TYPES[tensor.dtype]
        if t in self.weights_at:
            return f"((const {ctype} *)({name}_weights + {self.weights_at[t]}))"
        if tensor.is_constant:
            return self.constant_name(t)  # kernels read a constant from flash, even an output's
        if t in self.external:
            if t in graph.inputs:
                return f"(({ctype} *){name}_io_in[{graph.inputs.index(t)}])"
            return f"(({ctype} *){name}_io_out[{graph.outputs.index(t)}])"
        if t in self.slot_of:
            return f"(({ctype} *)({self.slot_bytes(self.slot_of[t])}))"
        if t in self.state_at:
            return self.state_pointer(tensor.dtype, self.state_at[t].offset)
        return self.constant_name(t)

    def byte_pointer(self, t: int) -> str:
        """Where a tensor's bytes are, for the copies of IF and WHILE."""
        if t in self.slot_of and t not in self.external:
            return self.slot_bytes(self.slot_of[t])
        self.used.add(t)
        return self.pointer(t)

    def c_tensor(self, t: int) -> CTensor | None:
        """Tensor t as a kernel sees it (None for an absent optional input)."""
        if t < 0:
            return None
        program = self.mp.program
        tensor = self.mp.graph.tensors[t]
        if tensor.is_handle:
            slot = self.mp.state_of_handle(t)
            variable = program.resources[program.handles[t]] if slot else None
            return CTensor(t, c_text(variable.name if variable else tensor.name),
                           slot.dtype if slot else "uint8", slot.shape if slot else (0,),
                           self.pointer(t), None, self.used)
        data = tensor.data if tensor.is_constant else None
        return CTensor(t, c_text(tensor.name), tensor.dtype, tensor.shape, self.pointer(t), data,
                       self.used)

    def kernel_state(self, op: int) -> tuple[str, ...]:
        """Typed pointers to an op's kernel state (Binding.state)."""
        return tuple(self.state_pointer(slot.dtype, slot.offset)
                     for slot in self.mp.state_slots if slot.op == op)


def addresses(mp: ModelPlan, name: str, external_io: bool, arena: str,
              pools: list[dict]) -> Addresses:
    """The places of the plan's buffers in a file whose arena is `arena` and pools `pools`."""
    offsets = mp.offset_of_tensor()
    # Each slot: a planned buffer (tensors, then scratch, in the plan's order), the array it
    # lives in, its offset there and the macro the C names that offset by.
    keys = [*(BufferKey(TENSOR, t) for t in offsets), *(r.key for r in mp.lifetimes.scratch)]
    places = tuple(mp.address(key) for key in keys)
    array_of = tuple(arena if k is None else pools[k]["symbol"] for k, _ in places)
    macros = tuple(offset_macro(mp.program, name, key) for key in keys)
    scratch_of: dict[int, list[str]] = {}
    stripe_slot: dict[int, int] = {}
    for k, (request, _) in enumerate(mp.scratch_offsets(), start=len(offsets)):
        if request.key.kind == STRIPE:
            stripe_slot[request.key.index] = k
        elif request.kernel:  # else held only as TFLite Micro's kernel would hold it
            scratch_of.setdefault(request.op, []).append(f"({array_of[k]} + {macros[k]})")
    graph = mp.graph
    return Addresses(
        mp, name, arena, {t: k for k, t in enumerate(offsets)}, places, array_of, macros,
        {op: tuple(s) for op, s in scratch_of.items()}, stripe_slot,
        {slot.tensor: slot for slot in mp.state_slots if slot.tensor is not None},
        frozenset(graph.inputs) | frozenset(graph.outputs) if external_io else frozenset(),
        mp.weights_layout[0] if mp.weights_pool is not None else {})


def offset_macro(program: Program, name: str, key: BufferKey) -> str:
    """The macro of a buffer's offset, named by what it holds: NAME_T22 (tensor 22),
    NAME_SG1_T0 (tensor 0 of subgraph 1), NAME_OP4_SCRATCH0 (op 4's first scratch buffer),
    NAME_T6_ROWS (the stripe rows of tensor 6), NAME_OP4_TFLM_SCRATCH1."""
    if key.kind == TENSOR:
        what = program.tensor_symbol(key.index)
    elif key.kind == STRIPE:
        what = f"{program.tensor_symbol(key.index)}_rows"
    else:
        what = f"{program.op_symbol(key.index)}_{key.kind.replace(' ', '_')}{key.slot}"
    return f"{name}_{what}".upper()


def pool_arrays(mp: ModelPlan, name: str) -> list[dict]:
    """What the templates say of each memory pool's array (none without pools); a pool that
    holds no buffer gets no array, which nothing would use."""
    return [
        {
            "name": a.pool.name,
            "symbol": f"{name}_{a.pool.name}_arena",
            "macro": f"{name.upper()}_POOL_{a.pool.name.upper()}_BYTES",
            "bytes": a.bytes,
            "length": c_length(a.bytes),
            "capacity": a.pool.capacity,
            "section": a.pool.section,
            "reserved": a.reserved,
            "reserved_for": mp.reserved_in(k),
            "used": any(p == k for p in mp.pool_of) and a.bytes > 0,
        }
        for k, a in enumerate(mp.pools)
    ]
