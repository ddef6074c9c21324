"""The toolchain's graph (IR): what the reader produces and everything after it consumes.

Frozen dataclasses, plain Python values and read-only numpy views; no flatbuffers types leak
past the reader.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

# The int32 range: element counts, accumulators and requantization reach are checked against it.
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

# Bits per element of every IR dtype; 0 where the size is not fixed (strings, resources).
DTYPE_BITS: dict[str, int] = {
    "float64": 64,
    "float32": 32,
    "float16": 16,
    "bfloat16": 16,
    "float8_e4m3fn": 8,
    "float8_e5m2": 8,
    "int64": 64,
    "int32": 32,
    "int16": 16,
    "int8": 8,
    "int4": 4,
    "int2": 2,
    "uint64": 64,
    "uint32": 32,
    "uint16": 16,
    "uint8": 8,
    "uint4": 4,
    "bool": 8,
    "complex64": 64,
    "complex128": 128,
    "string": 0,
    "resource": 0,
    "variant": 0,
}

# Tensors of these types hold no numbers: a resource handle names a resource variable.
HANDLE_DTYPES = frozenset({"resource", "variant"})


@dataclass(frozen=True, eq=False)
class Quantization:
    """Affine quantization: real = scale * (q - zero_point), per tensor or per channel."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    quantized_dimension: int = 0

    @property
    def per_channel(self) -> bool:
        return len(self.scale) > 1


@dataclass(frozen=True, eq=False)
class Tensor:
    """One tensor of a graph; `data` is a read-only view of the file for constants, else None."""

    index: int
    name: str
    dtype: str  # "int8", "float32", ...: numpy's name where numpy has the type
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...] | None
    quantization: Quantization | None
    is_variable: bool
    buffer: int
    data: np.ndarray | None = None

    @property
    def is_constant(self) -> bool:
        """Data in flash. A variable's data is its initial value: state, never a constant, so
        an operator that needs a constant operand refuses a variable in that slot."""
        return self.data is not None and not self.is_variable

    @property
    def is_handle(self) -> bool:
        """A resource handle: it names a variable and has no bytes of its own."""
        return self.dtype in HANDLE_DTYPES

    @cached_property  # asked for per operand by every pass: 100,000-operator graphs feel it
    def num_elements(self) -> int:
        return math.prod(self.shape)

    @cached_property
    def nbytes(self) -> int:
        return (self.num_elements * DTYPE_BITS[self.dtype] + 7) // 8


@dataclass(frozen=True, eq=False)
class Operator:
    """One operator: builtin name (e.g. "CONV_2D"), options as plain values, tensor indices.

    An input index of -1 marks an absent optional input, as in the file.
    """

    index: int
    opcode: str
    version: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: Mapping[str, Any] = field(default_factory=dict)
    custom_code: str | None = None
    intermediates: tuple[int, ...] = ()

    @property
    def kind(self) -> str:
        """What runs it: the builtin name, or a custom op's own code ("SignalRfft"), by which
        the registry knows custom ops."""
        return (self.custom_code or "CUSTOM") if self.opcode == "CUSTOM" else self.opcode


@dataclass(frozen=True, eq=False)
class Graph:
    """A subgraph: its tensors, its operators in file order, and its inputs and outputs."""

    index: int
    name: str
    tensors: tuple[Tensor, ...]
    operators: tuple[Operator, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    def producers(self) -> dict[int, int]:
        """Tensor index -> index of the operator that writes it."""
        return {t: op.index for op in self.operators for t in op.outputs if t >= 0}


@dataclass(frozen=True, eq=False)
class SignatureDef:
    """A named entry point: input and output names mapped to tensor indices of one subgraph."""

    key: str
    subgraph: int
    inputs: Mapping[str, int]
    outputs: Mapping[str, int]


@dataclass(frozen=True, eq=False)
class Model:
    """A whole .tflite file: graphs, metadata (name -> bytes) and signature defs."""

    source: str
    version: int
    description: str
    graphs: tuple[Graph, ...]
    metadata: Mapping[str, bytes]
    signature_defs: tuple[SignatureDef, ...]
    sha256: str  # of the file's bytes: generated files name the model by it, not by its path

    @property
    def main(self) -> Graph:
        return self.graphs[0]
