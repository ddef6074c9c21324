"""Execute a planned graph inside ONE arena laid out exactly as its plan says.

Every activation is a numpy view into a single uint8 buffer of `arena_bytes` at its planned
offset, so two live tensors that a wrong plan lets overlap really do overwrite each other; and
the bytes of every tensor whose life has ended are poisoned right after its last reader runs, so
a plan that reuses memory too early gives wrong outputs instead of lucky ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from runtime_py.kernels import KERNELS
from toolchain.errors import RuntimeBackendError
from toolchain.ir import Tensor
from toolchain.ops import prepare_graph
from toolchain.plan import ModelPlan

POISON = 0xA5

Observer = Callable[[int, list[np.ndarray]], None]


class ArenaInterpreter:
    """runtime_py: runs a ModelPlan; it never plans."""

    def __init__(self, model_plan: ModelPlan):
        self.model_plan = model_plan
        self.graph = graph = model_plan.graph
        self.source = model_plan.model.source
        self.params = prepare_graph(graph, self.source)  # fails before anything runs
        self.arena = np.full(model_plan.arena_bytes, POISON, dtype=np.uint8)
        state_offsets, state_bytes = model_plan.state_layout()
        self.state = np.zeros(state_bytes, dtype=np.uint8)
        self.views: dict[int, np.ndarray] = {}
        for tensor, offset in model_plan.offset_of_tensor().items():
            self.views[tensor] = self._view(self.arena, offset, graph.tensors[tensor])
        for tensor, offset in state_offsets.items():
            self.views[tensor] = self._view(self.state, offset, graph.tensors[tensor])
        for t in graph.tensors:
            if t.is_constant and not t.is_variable:
                self.views[t.index] = t.data
        self.reset()
        self.poison_after = poison_ranges(model_plan)

    @staticmethod
    def _view(block: np.ndarray, offset: int, tensor: Tensor) -> np.ndarray:
        return (
            block[offset : offset + tensor.nbytes]
            .view(np.dtype(tensor.dtype))
            .reshape(tensor.shape)
        )

    def reset(self) -> None:
        """Return every variable tensor to its initial value (zero where the file gives none)."""
        for t in self.model_plan.lifetimes.variables:
            tensor = self.graph.tensors[t]
            self.views[t][...] = tensor.data if tensor.data is not None else 0

    def invoke(
        self, inputs: Sequence[np.ndarray], observe: Observer | None = None
    ) -> list[np.ndarray]:
        """Run once; `observe(op_index, outputs)` sees each op's outputs right after it runs."""
        graph = self.graph
        if len(inputs) != len(graph.inputs):
            raise RuntimeBackendError(
                f"model takes {len(graph.inputs)} inputs, got {len(inputs)}", self.source
            )
        for i, (t, value) in enumerate(zip(graph.inputs, inputs)):
            expected = graph.tensors[t]
            value = np.asarray(value)
            if value.dtype != np.dtype(expected.dtype) or tuple(value.shape) != expected.shape:
                raise RuntimeBackendError(
                    f"input {i} ({expected.name!r}) must be "
                    f"{expected.dtype}{list(expected.shape)}, "
                    f"got {value.dtype}{list(value.shape)}",
                    self.source,
                )
            self.views[t][...] = value
        for step, op_index in enumerate(self.model_plan.lifetimes.order):
            op = graph.operators[op_index]
            ins = [self.views[t] if t >= 0 else None for t in op.inputs]
            outs = [self.views[t] for t in op.outputs]
            KERNELS[op.opcode](self.params[op_index], ins, outs)
            if observe is not None:
                observe(op_index, [o.copy() for o in outs])
            for start, end in self.poison_after[step]:
                self.arena[start:end] = POISON
        return [self.views[t].copy() for t in graph.outputs]


def poison_ranges(model_plan: ModelPlan) -> list[list[tuple[int, int]]]:
    """Per step, the byte ranges to poison after it: what dies there and nothing still holds.

    A tensor dies after its last reader's step; bytes it shares with a tensor that lives on
    (an output placed over its dying input) are left alone.
    """
    plan, lifetimes = model_plan.plan, model_plan.lifetimes
    outputs = set(model_plan.graph.outputs)
    last = [
        len(lifetimes.order) if tensor in outputs else buf.last
        for buf, tensor in zip(plan.buffers, lifetimes.tensor_of)
    ]
    ranges: list[list[tuple[int, int]]] = [[] for _ in lifetimes.order]
    for i, (buf, offset) in enumerate(zip(plan.buffers, plan.offsets)):
        if last[i] >= len(lifetimes.order):
            continue
        step = last[i]
        pieces = [(offset, offset + buf.size)]
        for j, (other, other_offset) in enumerate(zip(plan.buffers, plan.offsets)):
            holds = other.first <= step + 1 <= last[j] or other.first == step
            if j != i and holds:
                pieces = subtract(pieces, other_offset, other_offset + other.size)
        ranges[step] += pieces
    return ranges


def subtract(pieces: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of `pieces` outside [start, end)."""
    kept = []
    for a, b in pieces:
        if end <= a or b <= start:
            kept.append((a, b))
            continue
        if a < start:
            kept.append((a, start))
        if end < b:
            kept.append((end, b))
    return kept
