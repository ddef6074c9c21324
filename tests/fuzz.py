"""A fuzzer for the whole pipeline: hostile .tflite files through parse, plan, runtime_py,
generate, an ASan+UBSan build of the generated C and a run of it.

A model file is hostile input. Each example starts from a seed model (the built-in examples
and, in campaigns, ../shared/models when present), applies semantic mutations through the
generated object API (shapes, dtypes, options, quantization, operator and graph
inputs/outputs, names, buffers, opcodes), packs the model again, sometimes edits bytes of the
file, and plans it with the default options or others. Every stage runs in a worker process,
so a hang, a crash or a runaway allocation is recorded instead of taking the run down.

An example ends `ok`, `refused` (one printable ArenacError line naming the file) or as a
finding: a traceback, an unclean refusal, a hang, a crash, C that does not compile, a
sanitizer report (or any other failure of the compiled harness), or runtime_py and the C
disagreeing.

    python -m tests.fuzz --examples N [--seed S] [--out DIR]     a campaign; exit 1 on findings
    python -m tests.fuzz ... --files N     also N hostile .npy/.npz, memory and solve files
    python -m tests.fuzz --replay FILE...                        one file at a time, again

A campaign writes one shrunk reproducer per distinct finding into DIR (default build/fuzz):
the mutated model and a text file with its stage, kind, mutations and message.
tests/test_fuzz.py runs a few hundred examples in the normal suite.
"""

from __future__ import annotations

import argparse
import inspect
import io
import json
import os
import queue
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import cache
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path

import flatbuffers
import numpy as np
from flatbuffers import flexbuffers
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from runtime_py.interpreter import ArenaInterpreter
from runtime_py.kernels import KERNELS
from toolchain.c.generate import generate
from toolchain.errors import ArenacError, RuntimeBackendError
from toolchain.front.builder import ModelBuilder
from toolchain.front.examples import EXAMPLES
from toolchain.front.reader import parse_model
from toolchain.front.schema import DTYPE_NAMES, OPCODE_CODES, fb
from toolchain.ir import Model
from toolchain.lab.c_backend import SANITIZE_FLAGS, compile_files, split_outputs, write_files
from toolchain.lab.check import difference, edge_inputs, random_inputs
from toolchain.lower.plan import ModelPlan, Techniques, plan_model
from toolchain.ops import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "fuzz.tflite"  # every refusal must name it
PLAN_NODES = 20_000  # the exact planner's work budget per plan: small, and the same on replay
STATEFUL_SETS = 3  # invokes in a row, state kept, for a model with state
STARTUP_SECONDS = 120  # imports on a loaded machine; not counted against any stage
WORKER_MEMORY_BYTES = 4 << 30  # the Python stages; an absurd allocation fails, not the machine
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:allocator_may_return_null=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}
STAGES = ("start", "parse", "plan", "runtime_py", "generate", "compile", "run_c", "compare")
FINDING_KINDS = (
    "traceback",
    "unclean-refusal",
    "hang",
    "crash",
    "compile-error",
    "harness-failure",
    "mismatch",
)


# --- seeds -----------------------------------------------------------------------------------


def _elementwise_int8() -> bytes:
    """int8 elementwise, activation, concatenation and reduction ops over a broadcast."""
    b = ModelBuilder("int8", seed=1)
    x = b.input("x", (1, 4, 4, 8), "int8", 0.05, -3)
    bias = b.const("bias", np.arange(-4, 4, dtype=np.int8).reshape(1, 1, 1, 8), 0.02, 1)
    total = b.tensor("sum", (1, 4, 4, 8), "int8", 0.06, -2)
    b.op("ADD", [x, bias], [total], {"fused_activation_function": "RELU"}, version=2)
    product = b.tensor("product", (1, 4, 4, 8), "int8", 0.1, 0)
    b.op("MUL", [total, x], [product], version=2)
    squashed = b.tensor("squashed", (1, 4, 4, 8), "int8", 1.0 / 256, -128)
    b.op("LOGISTIC", [product], [squashed], version=2)
    joined = b.tensor("joined", (1, 4, 4, 16), "int8", 0.05, -3)
    b.op("CONCATENATION", [x, x], [joined], {"axis": 3}, version=2)
    mean = b.tensor("mean", (1, 16), "int8", 0.05, -3)
    axes = b.const("axes", np.asarray([1, 2], np.int32))
    b.op("MEAN", [joined, axes], [mean], {"keep_dims": False}, version=2)
    b.output(squashed)
    b.output(mean)
    return b.build()


def _moves_float() -> bytes:
    """The data-movement family: pad, transpose, strided slice, split, gather, reshape."""
    b = ModelBuilder("float32", seed=2)
    x = b.input("x", (1, 5, 6, 4), "float32")
    padded = b.tensor("padded", (1, 7, 6, 4), "float32")
    b.op("PAD", [x, b.const("pads", np.asarray([[0, 0], [1, 1], [0, 0], [0, 0]], np.int32))],
         [padded])
    moved = b.tensor("moved", (1, 4, 7, 6), "float32")
    b.op("TRANSPOSE", [padded, b.const("perm", np.asarray([0, 3, 1, 2], np.int32))], [moved])
    cut = b.tensor("cut", (1, 4, 3, 6), "float32")
    b.op(
        "STRIDED_SLICE",
        [
            moved,
            b.const("begin", np.asarray([0, 0, 1, 0], np.int32)),
            b.const("end", np.asarray([1, 4, 7, 6], np.int32)),
            b.const("strides", np.asarray([1, 1, 2, 1], np.int32)),
        ],
        [cut],
    )
    halves = [b.tensor(f"half{i}", (1, 2, 3, 6), "float32") for i in range(2)]
    b.op("SPLIT", [b.const("axis", np.asarray(1, np.int32)), cut], halves, {"num_splits": 2})
    picked = b.tensor("picked", (1, 2, 3, 3), "float32")
    b.op("GATHER", [halves[1], b.const("indices", np.asarray([5, 0, 5], np.int32))], [picked],
         {"axis": 3})
    flat = b.tensor("flat", (1, 18), "float32")
    b.op("RESHAPE", [picked], [flat], {"new_shape": [1, 18]})
    b.output(halves[0])
    b.output(flat)
    return b.build()


def _dense_float() -> bytes:
    """Fully connected without bias, batch matmul, bilinear resize and arg max."""
    b = ModelBuilder("float32", seed=3)
    x = b.input("x", (2, 3, 4), "float32")
    rhs = b.const("rhs", b.rng.standard_normal((2, 4, 5)).astype(np.float32))
    product = b.tensor("product", (2, 3, 5), "float32")
    b.op("BATCH_MATMUL", [x, rhs], [product])
    weights = b.const("weights", b.rng.standard_normal((6, 5)).astype(np.float32))
    dense = b.tensor("dense", (2, 3, 6), "float32")
    b.op("FULLY_CONNECTED", [product, weights, -1], [dense], {"keep_num_dims": True})
    image = b.tensor("image", (2, 3, 6, 1), "float32")
    b.op("RESHAPE", [dense], [image], {"new_shape": [2, 3, 6, 1]})
    resized = b.tensor("resized", (2, 5, 4, 1), "float32")
    b.op("RESIZE_BILINEAR", [image, b.const("size", np.asarray([5, 4], np.int32))], [resized])
    best = b.tensor("best", (2, 5, 1), "int32")
    b.op("ARG_MAX", [resized, b.const("dim", np.asarray([2], np.int32))], [best],
         {"output_type": "INT32"})
    b.output(resized)
    b.output(best)
    return b.build()


def _padded_int8() -> bytes:
    """PADs a convolution and a max pool apply themselves (toolchain.lower.fusion): the pads, the
    pad values and the windows are what mutations then change."""
    b = ModelBuilder("int8", seed=4)
    x = b.input("x", (1, 7, 6, 3), "int8", 0.05, -3)
    padded = b.tensor("padded", (1, 8, 7, 3), "int8", 0.05, -3)
    b.op("PAD", [x, b.const("pads", np.asarray([[0, 0], [0, 1], [1, 0], [0, 0]], np.int32))],
         [padded])
    weights = b.const("w", b.rng.integers(-127, 128, (5, 3, 3, 3)).astype(np.int8), 0.02, 0)
    bias = b.const("b", b.rng.integers(-300, 300, 5).astype(np.int32), 0.001, 0)
    conv = b.tensor("conv", (1, 3, 3, 5), "int8", 0.1, 2)
    b.op("CONV_2D", [padded, weights, bias], [conv],
         {"padding": "VALID", "stride_h": 2, "stride_w": 2, "dilation_h_factor": 1,
          "dilation_w_factor": 1, "fused_activation_function": "RELU"}, version=3)
    border = b.tensor("border", (1, 5, 5, 5), "int8", 0.1, 2)
    b.op("PADV2", [conv, b.const("pads2", np.asarray([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32)),
                   b.const("lowest", np.asarray([-128], np.int8), 0.1, 2)], [border])
    pooled = b.tensor("pooled", (1, 2, 2, 5), "int8", 0.1, 2)
    b.op("MAX_POOL_2D", [border], [pooled],
         {"padding": "VALID", "stride_h": 2, "stride_w": 2, "filter_height": 2,
          "filter_width": 2, "fused_activation_function": "NONE"}, version=2)
    b.output(pooled)
    return b.build()


def _signal_int16() -> bytes:
    """The start of an audio front end in TFLite Micro's signal library, custom ops whose
    options are flexbuffer maps: a window, a real FFT and the energies of its bins."""
    b = ModelBuilder("int8", seed=5)
    x = b.input("x", (16,), "int16")
    window = b.const("window", (b.rng.integers(0, 4096, 16)).astype(np.int16))
    windowed = b.tensor("windowed", (16,), "int16")
    b.custom("SignalWindow", [x, window], [windowed], {"shift": 12})
    bins = b.tensor("bins", (18,), "int16")
    b.custom("SignalRfft", [windowed], [bins], {"T": 7, "fft_length": 16})
    energy = b.tensor("energy", (9,), "uint32")
    b.custom("SignalEnergy", [bins], [energy], {"end_index": 8, "start_index": 1})
    b.output(energy)
    return b.build()


EXTRA_SEEDS: dict[str, Callable[[], bytes]] = {
    "elementwise_int8": _elementwise_int8,
    "padded_int8": _padded_int8,
    "moves_float32": _moves_float,
    "dense_float32": _dense_float,
    "signal_int16": _signal_int16,
    "if_in_while": lambda: _control_flow("if_in_while"),
    "variable_in_loop": lambda: _control_flow("variable_in_loop"),
    "hybrid_fc": lambda: _hybrid("fully_connected"),
    "hybrid_conv": lambda: _hybrid("conv"),
}


def _control_flow(name: str) -> bytes:
    """A WHILE around an IF, and a resource variable a loop body updates."""
    from tests.test_control_flow import MODELS

    return MODELS[name]()


def _hybrid(kind: str) -> bytes:
    """float32 activations with int8 weights: the input quantized at run time."""
    if kind == "conv":
        from tests.ops.test_conv_hybrid import conv_model

        return conv_model((1, 5, 5, 3), 4, activation="RELU")
    from tests.ops.test_fully_connected import hybrid_fully_connected_model

    return hybrid_fully_connected_model((2, 10), 3, asymmetric=True)


def builtin_seeds() -> dict[str, bytes]:
    """The examples of toolchain/front/examples.py and a few models of the other op families."""
    return {name: build() for name, build in {**EXAMPLES, **EXTRA_SEEDS}.items()}


def shared_seeds() -> dict[str, bytes]:
    """The reference models beside the checkout, when present."""
    from tests.conftest import SHARED_MODEL_FILES

    return {path.stem: path.read_bytes() for path in SHARED_MODEL_FILES}


# --- mutations -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutation:
    """One edit: `kind` names an entry of SEMANTIC or BYTE_EDITS and `args` its raw choices.
    Indices are taken modulo what the model has, so every draw applies to every seed."""

    kind: str
    args: tuple

    def __str__(self) -> str:
        return f"{self.kind}{self.args!r}"


@dataclass(frozen=True)
class Planning:
    """The planning options of `plan`, `gen` and `check` an example runs with."""

    planner: str = "best"
    inplace: bool = True
    overlap: bool = True
    schedule: str = "auto"
    external_io: bool = False

    def plan(self, model: Model, external_io: bool = False) -> ModelPlan:
        """runtime_py runs the plan without external I/O; the C gets `external_io`'s."""
        techniques = Techniques(self.inplace, self.overlap, self.schedule)
        return plan_model(model, self.planner, techniques=techniques, external_io=external_io,
                          nodes=PLAN_NODES)

    def flags(self) -> list[str]:
        """The arenac options that plan the same way."""
        return [
            *(["--planner", self.planner] if self.planner != "best" else []),
            *(["--no-inplace"] if not self.inplace else []),
            *(["--no-overlap"] if not self.overlap else []),
            *(["--schedule", self.schedule] if self.schedule != "auto" else []),
            *(["--external-io"] if self.external_io else []),
        ]

    @classmethod
    def from_flags(cls, flags: Sequence[str]) -> Planning:
        parser = argparse.ArgumentParser(add_help=False)
        parser.add_argument("--planner", default="best")
        parser.add_argument("--no-inplace", action="store_true")
        parser.add_argument("--no-overlap", action="store_true")
        parser.add_argument("--schedule", default="auto")
        parser.add_argument("--external-io", action="store_true")
        parser.add_argument("--nodes")  # always PLAN_NODES here; a reproducer's note gives it
        a = parser.parse_args(flags)
        return cls(a.planner, not a.no_inplace, not a.no_overlap, a.schedule, a.external_io)

    def __str__(self) -> str:
        return " ".join(self.flags()) or "defaults"


DEFAULT = Planning()


@dataclass(frozen=True)
class Example:
    """A seed, what to do to it and how to plan it; `compile_c` says whether the C is built
    and run."""

    seed: str
    edits: tuple[Mutation, ...]
    byte_edits: tuple[Mutation, ...] = ()
    planning: Planning = DEFAULT
    compile_c: bool = True


@dataclass(frozen=True)
class Mutant:
    """A mutated file and what each mutation did to it, in words."""

    data: bytes
    notes: tuple[str, ...]


class Inapplicable(Exception):
    """A mutation could not be applied or the edited model not packed: a defect of the fuzzer,
    not of arenac."""


NAN, INF = float("nan"), float("inf")
DIMS = (0, 1, 2, 3, 7, 16, 255, 65536, 1 << 20, 2**31 - 1, -1, -(2**31))
SCALES = (NAN, INF, -INF, 0.0, -0.5, 1e-45, 1e-38, 3.4e38, 1e-10, 1e10)
ZERO_POINTS = (
    -129, 128, 255, 256, 1000, -1000, -32769, 32768, 2**31, -(2**31) - 1, 2**40,
    -(2**63), 2**63 - 1,
)
QUANTIZED_DIMENSIONS = (-1, 1, 2, 3, 4, 7, 2**31 - 1, -(2**31))
TYPE_CODES = (*sorted(DTYPE_NAMES), 99)
VERSIONS = (0, 1, 2, 7, 100, -1, 2**31 - 1)
HOSTILE_NAMES = (
    b"*/ int injected = 1; /*",
    b"/* nested",
    b"line\nbreak",
    b"nul\x00byte",
    "\u202eevil\u202c".encode(),
    b"{{ name }}{% if x %}",
    b"<script>alert(1)</script>&amp;",
    b"back\\slash\\",
    b"tri??/graph",
    b'"quoted" \'name\'',
    b"#define int float\n",
    b"\r\n\t\x0c",
    b"",
    b"\xff\xfe not utf-8 \x80",
    "\u00e9\u4e2d\U0001f642".encode(),
    b"x" * 5000,
)
FILLS = (  # 4-byte patterns written over constant data
    struct.pack("<f", NAN),
    struct.pack("<f", INF),
    struct.pack("<f", -INF),
    struct.pack("<f", 3.4e38),
    struct.pack("<I", 1),  # the smallest denormal
    struct.pack("<i", 2**31 - 1),
    struct.pack("<i", -(2**31)),
    b"\x80\x80\x80\x80",
    b"\x7f\x7f\x7f\x7f",
    b"\xff\xff\xff\xff",
    b"\x00\x00\x00\x00",
)
SLOT_VALUES = {  # edge values per options field type, as the generated Pack writes them
    "Bool": (True, False),
    "Int8": (0, -1, 1, 2, 3, 4, 5, 6, 7, 127, -128),
    "Uint8": (0, 1, 2, 255),
    "Int32": (0, -1, 1, 2, 3, 4, 5, 1000, 65536, 2**31 - 1, -(2**31)),
    "Uint32": (0, 1, 2**31, 2**32 - 1),
    "Int64": (0, -1, 2**63 - 1, -(2**63)),
    "Uint64": (0, 2**64 - 1),
    "Float32": (0.0, -1.0, NAN, INF, -INF, 1e-45, 3.4e38),
}
VECTOR_VALUES = ([], [0], [-1], [2**31 - 1], [1, 1, 1, 1, 1], [1, -1], [0, 0])
OPTION_TYPE_COUNT = max(v for k, v in vars(fb.BuiltinOptions).items() if k.isupper())


# Every builtin code arenac runs (custom ops are known by their custom code, which CUSTOM
# stands for), some it does not (recurrent, control flow) and some unknown.
OPCODE_CHOICES = (
    *sorted(OPCODE_CODES[name] for name in set(REGISTRY) | set(KERNELS) if name in OPCODE_CODES),
    *(OPCODE_CODES[name] for name in ("CUSTOM", "LSTM", "WHILE", "STABLEHLO_ADD")),
    500,
    4000,
    -1,
)


def _graph(model: fb.ModelT) -> fb.SubGraphT:
    return model.subgraphs[0]


def _pick(items: Sequence, raw: int):
    return items[raw % len(items)] if len(items) else None


def _ints(values) -> list[int]:
    return [] if values is None else [int(v) for v in values]


def _data(model: fb.ModelT, tensor: fb.TensorT) -> bytes | None:
    if not 0 <= tensor.buffer < len(model.buffers):
        return None
    data = model.buffers[tensor.buffer].data
    return None if data is None or len(data) == 0 else bytes(bytearray(data))


def _constants(model: fb.ModelT) -> list[int]:
    return [i for i, t in enumerate(_graph(model).tensors) if _data(model, t) is not None]


def _activations(model: fb.ModelT) -> list[int]:
    constants = set(_constants(model))
    return [i for i in range(len(_graph(model).tensors)) if i not in constants]


def _produced(model: fb.ModelT) -> list[int]:
    return sorted({t for op in _graph(model).operators for t in _ints(op.outputs) if t >= 0})


def _label(model: fb.ModelT, index: int) -> str:
    tensors = _graph(model).tensors
    if not 0 <= index < len(tensors):
        return f"tensor {index}"
    return f"tensor {index} ({(tensors[index].name or b'')[:40]!r})"


def _op_label(model: fb.ModelT, index: int) -> str:
    op = _graph(model).operators[index]
    codes = model.operatorCodes
    code = codes[op.opcodeIndex].builtinCode if 0 <= op.opcodeIndex < len(codes) else "?"
    return f"op {index} (code {code})"


def _fresh_tensor(model: fb.ModelT, like: int | None) -> int:
    """A new activation tensor nobody writes, shaped and typed like tensor `like`."""
    graph = _graph(model)
    template = graph.tensors[like] if like is not None else None
    tensor = fb.TensorT()
    tensor.name = b"fresh"
    tensor.shape = _ints(template.shape) if template is not None else [1, 4]
    tensor.type = template.type if template is not None else fb.TensorType.FLOAT32
    tensor.quantization = template.quantization if template is not None else None
    tensor.buffer = 0
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def edit_dim(model: fb.ModelT, tensor: int, axis: int, value: int) -> str:
    index = tensor % len(_graph(model).tensors)
    t = _graph(model).tensors[index]
    shape = _ints(t.shape)
    old = list(shape)
    if shape:
        shape[axis % len(shape)] = value
    else:
        shape = [value]
    t.shape = shape
    return f"{_label(model, index)} shape {old} -> {shape}"


def edit_rank(model: fb.ModelT, tensor: int, how: int, value: int) -> str:
    index = tensor % len(_graph(model).tensors)
    t = _graph(model).tensors[index]
    old = _ints(t.shape)
    shape = [old[:-1], [value, *old], [*old, value], []][how % 4]
    t.shape = shape
    return f"{_label(model, index)} shape {old} -> {shape}"


def edit_shape_signature(model: fb.ModelT, tensor: int, axis: int) -> str:
    index = tensor % len(_graph(model).tensors)
    t = _graph(model).tensors[index]
    signature = _ints(t.shape) or [1]
    signature[axis % len(signature)] = -1
    t.shapeSignature = signature
    return f"{_label(model, index)} shape signature -> {signature}"


def edit_dtype(model: fb.ModelT, tensor: int, code: int) -> str:
    index = tensor % len(_graph(model).tensors)
    t = _graph(model).tensors[index]
    old, t.type = t.type, code
    return f"{_label(model, index)} type {DTYPE_NAMES.get(old)} -> {DTYPE_NAMES.get(code, code)}"


def edit_drop_options(model: fb.ModelT, op: int) -> str:
    index = op % len(_graph(model).operators)
    o = _graph(model).operators[index]
    o.builtinOptionsType, o.builtinOptions = 0, None
    return f"{_op_label(model, index)} loses its builtin options"


@cache
def _field_type(options_class: type, field_name: str) -> tuple[str, str | None]:
    """How the generated Pack writes a field: ("Int8", None) for a scalar, ("Vector", "Int32")
    for a vector of scalars, ("Offset", None) for strings and tables."""
    table = options_class.__name__.removesuffix("T")
    adder = getattr(fb, f"{table}Add{field_name[0].upper()}{field_name[1:]}")
    slot = re.search(r"Prepend(\w+?)Slot", inspect.getsource(adder)).group(1)
    if slot != "UOffsetTRelative":
        return slot, None
    element = re.search(
        rf"Prepend(\w+)\(self\.{field_name}\[i\]\)", inspect.getsource(options_class.Pack)
    )
    return ("Vector", element.group(1)) if element else ("Offset", None)


def _clamped(value: int, kind: str) -> int:
    """`value` within the range of a scalar type of the schema ("Int8", "Uint32", ...)."""
    values = SLOT_VALUES[kind]
    return max(min(values), min(value, max(values)))


def edit_option(model: fb.ModelT, op: int, which: int, choice: int) -> str:
    index = op % len(_graph(model).operators)
    options = _graph(model).operators[index].builtinOptions
    if options is None or not vars(options):
        return f"{_op_label(model, index)} has no options to change"
    name = _pick(sorted(vars(options)), which)
    kind, element = _field_type(type(options), name)
    old = getattr(options, name)
    if kind == "Vector":
        value = [_clamped(v, element) for v in _pick(VECTOR_VALUES, choice)]
    elif kind == "Offset":
        value = None
    else:
        value = _pick(SLOT_VALUES[kind], choice)
    setattr(options, name, value)
    shown = old.tolist() if isinstance(old, np.ndarray) else old
    return f"{_op_label(model, index)} option {name} {shown!r} -> {value!r}"


def edit_options_type(model: fb.ModelT, op: int, code: int) -> str:
    index = op % len(_graph(model).operators)
    o = _graph(model).operators[index]
    old, o.builtinOptionsType = o.builtinOptionsType, code % (OPTION_TYPE_COUNT + 1)
    return f"{_op_label(model, index)} options type {old} -> {o.builtinOptionsType}"


def _quantized(model: fb.ModelT) -> list[int]:
    tensors = _graph(model).tensors
    found = [i for i, t in enumerate(tensors) if t.quantization is not None]
    return found or list(range(len(tensors)))


def _quantization_of(model: fb.ModelT, tensor: int) -> tuple[int, fb.QuantizationParametersT]:
    """A tensor with quantization (one is added where the model has none)."""
    index = _pick(_quantized(model), tensor)
    t = _graph(model).tensors[index]
    if t.quantization is None or t.quantization.scale is None:
        q = fb.QuantizationParametersT()
        q.scale, q.zeroPoint = [0.5], [0]
        t.quantization = q
    return index, t.quantization


def edit_scale(model: fb.ModelT, tensor: int, channel: int, value: float) -> str:
    index, q = _quantization_of(model, tensor)
    scale = [float(s) for s in q.scale]
    position = channel % len(scale)
    scale[position] = value
    q.scale = scale
    return f"{_label(model, index)} scale[{position}] -> {value!r}"


def edit_zero_point(model: fb.ModelT, tensor: int, channel: int, value: int) -> str:
    index, q = _quantization_of(model, tensor)
    zero_point = _ints(q.zeroPoint) or [0] * len(q.scale)
    position = channel % len(zero_point)
    zero_point[position] = value
    q.zeroPoint = zero_point
    return f"{_label(model, index)} zero_point[{position}] -> {value}"


def edit_channels(model: fb.ModelT, tensor: int, how: int) -> str:
    index, q = _quantization_of(model, tensor)
    scale, zero_point = [float(s) for s in q.scale], _ints(q.zeroPoint)
    change = how % 5
    if change == 0:
        scale, zero_point = scale[:1], zero_point[:1]
    elif change == 1:
        scale, zero_point = [*scale, scale[-1]], [*zero_point, 0]
    elif change == 2:
        zero_point = [*zero_point, 0]
    elif change == 3:
        zero_point = []
    else:
        scale = scale * 3
    q.scale, q.zeroPoint = scale, zero_point
    return f"{_label(model, index)} has {len(scale)} scales and {len(zero_point)} zero points"


def edit_quantized_dimension(model: fb.ModelT, tensor: int, value: int) -> str:
    index, q = _quantization_of(model, tensor)
    q.quantizedDimension = value
    return f"{_label(model, index)} quantized_dimension -> {value}"


def edit_drop_quantization(model: fb.ModelT, tensor: int) -> str:
    index = _pick(_quantized(model), tensor)
    _graph(model).tensors[index].quantization = None
    return f"{_label(model, index)} loses its quantization"


def _target(model: fb.ModelT, op_index: int, raw: int) -> tuple[int, str]:
    """A tensor for an operator slot: the category is raw % 7, the member raw // 7."""
    graph = _graph(model)
    op = graph.operators[op_index]
    which = raw // 7
    categories = (
        ("absent", [-1]),
        ("a constant", _constants(model)),
        ("the op's own output", _ints(op.outputs)),
        ("a graph input", _ints(graph.inputs)),
        ("an activation", _activations(model)),
        ("the op's first input", _ints(op.inputs)[:1]),
        ("a tensor past the end", [len(graph.tensors)]),
    )
    what, members = categories[raw % len(categories)]
    if not members:
        what, members = categories[0]
    return _pick(members, which), what


def edit_op_input(model: fb.ModelT, op: int, slot: int, target: int) -> str:
    index = op % len(_graph(model).operators)
    o = _graph(model).operators[index]
    inputs = _ints(o.inputs)
    tensor, what = _target(model, index, target)
    position = slot % len(inputs) if inputs else 0
    if inputs:
        inputs[position] = tensor
    else:
        inputs = [tensor]
    o.inputs = inputs
    return f"{_op_label(model, index)} input {position} -> {what}, {_label(model, tensor)}"


def edit_op_output(model: fb.ModelT, op: int, slot: int, target: int) -> str:
    graph = _graph(model)
    index = op % len(graph.operators)
    o = graph.operators[index]
    outputs = _ints(o.outputs) or [0]
    position = slot % len(outputs)
    others = [t for t in _produced(model) if t not in outputs]
    categories = (
        ("a constant", _constants(model)),
        ("a graph input", _ints(graph.inputs)),
        ("another op's output", others),
        ("its own input", [t for t in _ints(o.inputs) if t >= 0]),
        ("a fresh tensor", [None]),
    )
    what, members = categories[target % len(categories)]
    members = members or [None]
    tensor = _pick(members, target // len(categories))
    if tensor is None:
        what, tensor = "a fresh tensor", _fresh_tensor(model, outputs[position])
    outputs[position] = tensor
    o.outputs = outputs
    return f"{_op_label(model, index)} output {position} -> {what}, {_label(model, tensor)}"


def edit_op_arity(model: fb.ModelT, op: int, how: int, extra: int) -> str:
    index = op % len(_graph(model).operators)
    o = _graph(model).operators[index]
    inputs, outputs = _ints(o.inputs), _ints(o.outputs)
    change = how % 6
    if change == 0:
        inputs, what = inputs[:-1], "drops its last input"
    elif change == 1:
        tensor = _pick(_activations(model), extra)
        inputs, what = [*inputs, tensor], f"takes {_label(model, tensor)} as an extra input"
    elif change == 2:
        inputs, what = [], "has no inputs"
    elif change == 3:
        outputs, what = [], "has no outputs"
    elif change == 4:
        tensor = _fresh_tensor(model, outputs[0] if outputs else None)
        outputs, what = [*outputs, tensor], "writes an extra output"
    else:
        inputs, what = inputs[1::-1] + inputs[2:], "swaps its first two inputs"
    o.inputs, o.outputs = inputs, outputs
    return f"{_op_label(model, index)} {what}"


def edit_op_list(model: fb.ModelT, op: int, how: int, other: int) -> str:
    operators = _graph(model).operators
    index = op % len(operators)
    label = _op_label(model, index)
    change = how % 3
    if change == 0:
        if len(operators) == 1:
            return f"{label} is the only op and stays"
        del operators[index]
        return f"{label} deleted"
    if change == 1:
        copy = fb.OperatorT.InitFromObj(_as_table(operators[index]))
        operators.insert(index + 1, copy)
        return f"{label} duplicated (two writers of its outputs)"
    partner = other % len(operators)
    operators[index], operators[partner] = operators[partner], operators[index]
    return f"{label} and op {partner} swap places in the file"


def _as_table(op: fb.OperatorT) -> fb.Operator:
    """An operator packed alone and read back: the object API's only way to copy one."""
    builder = flatbuffers.Builder(256)
    builder.Finish(op.Pack(builder))
    return fb.Operator.GetRootAs(builder.Output(), 0)


def edit_graph_inputs(model: fb.ModelT, how: int, which: int) -> str:
    graph = _graph(model)
    inputs = _ints(graph.inputs)
    change = how % 6
    if change == 0:
        inputs, what = [], "no graph inputs"
    elif change == 1:
        tensor = _pick(_constants(model), which)
        inputs = inputs if tensor is None else [*inputs, tensor]
        what = f"graph input + a constant, {_label(model, tensor or 0)}"
    elif change == 2:
        tensor = _fresh_tensor(model, _pick(inputs, 0))
        inputs, what = [*inputs, tensor], "graph input + a fresh tensor nobody reads"
    elif change == 3:
        tensor = _pick(_produced(model), which)
        inputs = inputs if tensor is None else [*inputs, tensor]
        what = f"graph input + an op's output, {_label(model, tensor or 0)}"
    elif change == 4:
        inputs, what = inputs + inputs[:1], "the first graph input twice"
    else:
        inputs, what = inputs[1:], "the first graph input dropped"
    graph.inputs = inputs
    return what


def edit_graph_outputs(model: fb.ModelT, how: int, which: int) -> str:
    graph = _graph(model)
    outputs = _ints(graph.outputs)
    change = how % 7
    if change == 0:
        outputs, what = [], "no graph outputs"
    elif change == 1:
        tensor = _pick(_constants(model), which)
        outputs = outputs if tensor is None else [*outputs, tensor]
        what = f"graph output + a constant, {_label(model, tensor or 0)}"
    elif change == 2:
        tensor = _fresh_tensor(model, _pick(outputs, 0))
        outputs, what = [*outputs, tensor], "graph output + a tensor nobody writes"
    elif change == 3:
        outputs, what = outputs + _ints(graph.inputs)[:1], "graph output + the graph input"
    elif change == 4:
        outputs, what = outputs + outputs[:1], "the first graph output twice"
    elif change == 5:
        tensor = _pick(_produced(model), which)
        outputs = [tensor] if tensor is not None else outputs
        what = f"the only graph output is {_label(model, tensor or 0)}"
    else:
        outputs, what = outputs[1:], "the first graph output dropped"
    graph.outputs = outputs
    return what


def edit_name(model: fb.ModelT, tensor: int, name: bytes) -> str:
    index = tensor % len(_graph(model).tensors)
    _graph(model).tensors[index].name = name
    return f"{_label(model, index)} renamed"


def edit_text(model: fb.ModelT, where: int, text: bytes) -> str:
    place = where % 4
    if place == 0:
        model.description = text
        return f"model description -> {text[:40]!r}"
    if place == 1:
        _graph(model).name = text
        return f"subgraph name -> {text[:40]!r}"
    if place == 2 and model.signatureDefs:
        model.signatureDefs[0].signatureKey = text
        return f"signature key -> {text[:40]!r}"
    model.operatorCodes[0].customCode = text
    return f"custom code of operator code 0 -> {text[:40]!r}"


def edit_buffer(model: fb.ModelT, tensor: int, how: int, fill: int) -> str:
    constants = _constants(model)
    if not constants:
        return "no constant data to change"
    index = _pick(constants, tensor)
    t = _graph(model).tensors[index]
    data = _data(model, t) or b""
    change = how % 6
    if change == 0:
        new, what = data[: len(data) // 2], "truncated to half"
    elif change == 1:
        new, what = data + b"\x00" * 4, "4 bytes longer"
    elif change == 2:
        new, what = None, "without data"
    elif change == 3:
        pattern = _pick(FILLS, fill)
        new, what = (pattern * (len(data) // 4 + 1))[: len(data)], f"filled with {pattern!r}"
    elif change == 4:
        new = data[:-4] + _pick(FILLS, fill) if len(data) >= 4 else data
        what = f"last 4 bytes {_pick(FILLS, fill)!r}"
    else:
        new = np.random.default_rng(fill).bytes(len(data))
        what = f"random bytes (seed {fill})"
    buffer = fb.BufferT()
    buffer.data = None if new is None else np.frombuffer(new, np.uint8)
    model.buffers.append(buffer)
    t.buffer = len(model.buffers) - 1  # its own buffer: other tensors sharing it keep theirs
    return f"{_label(model, index)} data {what}"


def edit_buffer_index(model: fb.ModelT, tensor: int, target: int) -> str:
    index = tensor % len(_graph(model).tensors)
    t = _graph(model).tensors[index]
    sources = [_graph(model).tensors[c].buffer for c in _constants(model)]
    choice = target % 4
    t.buffer = (0, len(model.buffers), 2**32 - 1, _pick(sources, target // 4) or 0)[choice]
    return f"{_label(model, index)} buffer -> {t.buffer}"


def edit_variable(model: fb.ModelT, tensor: int) -> str:
    index = tensor % len(_graph(model).tensors)
    t = _graph(model).tensors[index]
    t.isVariable = not t.isVariable
    return f"{_label(model, index)} is_variable -> {t.isVariable}"


def edit_opcode(model: fb.ModelT, which: int, code: int) -> str:
    index = which % len(model.operatorCodes)
    opcode = model.operatorCodes[index]
    old = opcode.builtinCode
    opcode.builtinCode = code
    opcode.deprecatedBuiltinCode = max(-128, min(code, 127))
    return f"operator code {index}: builtin {old} -> {code}"


def edit_opcode_version(model: fb.ModelT, which: int, version: int) -> str:
    index = which % len(model.operatorCodes)
    model.operatorCodes[index].version = version
    return f"operator code {index}: version -> {version}"


CALL_FIELDS = ("initSubgraphIndex", "thenSubgraphIndex", "elseSubgraphIndex",
               "condSubgraphIndex", "bodySubgraphIndex")


def edit_called_subgraph(model: fb.ModelT, which: int, target: int) -> str:
    """Point a CALL_ONCE, IF or WHILE of any subgraph at another subgraph (itself, its caller,
    one past the last): nesting, cycles and mismatched operands."""
    calls = [(g, k, op) for g, graph in enumerate(model.subgraphs)
             for k, op in enumerate(graph.operators or [])
             if any(hasattr(op.builtinOptions, f) for f in CALL_FIELDS)]
    if not calls:
        return "called subgraph: no operator runs one, nothing changed"
    g, k, op = _pick(calls, which)
    field_name = _pick([f for f in CALL_FIELDS if hasattr(op.builtinOptions, f)], target)
    index = target % (len(model.subgraphs) + 1)
    setattr(op.builtinOptions, field_name, index)
    return f"subgraph {g} op {k}: {field_name} -> {index}"


class FlexWriter:
    """Flexbuffer bytes written by hand, every field `width` bytes wide: flexbuffers.Builder
    writes each value once and counts truly, so it cannot write what the reader must survive
    in custom options (references shared between vectors, deep nesting, false lengths)."""

    def __init__(self, width: int = 1):
        self.out = bytearray()
        self.width = width

    def _packed(self, kind: flexbuffers.Type) -> int:
        return int(kind) << 2 | (self.width.bit_length() - 1)

    def _uint(self, value: int) -> None:
        self.out += (value % (1 << 8 * self.width)).to_bytes(self.width, "little")

    def _sized(self, size: int) -> int:
        """Pad to the width and write a size; the address of the elements that follow."""
        self.out += bytes(-len(self.out) % self.width)
        self._uint(size)
        return len(self.out)

    def ints(self, values: Sequence[int]) -> int:
        """An untyped vector of inline ints; its address."""
        address = self._sized(len(values))
        for value in values:
            self._uint(value)
        self.out += bytes([self._packed(flexbuffers.Type.INT)] * len(values))
        return address

    def vector(self, targets: Sequence[int], size: int | None = None) -> int:
        """An untyped vector of references to the vectors at `targets` (earlier addresses),
        declaring `size` elements; its address."""
        address = self._sized(len(targets) if size is None else size)
        for i, target in enumerate(targets):
            self._uint(address + i * self.width - target)
        self.out += bytes([self._packed(flexbuffers.Type.VECTOR)] * len(targets))
        return address

    def finish(self, key: bytes, target: int, size: int = 1) -> bytes:
        """The root: a map declaring `size` entries, of which the first, `key`, is the vector
        at `target`."""
        key_at = len(self.out)
        self.out += key + b"\0"
        keys = self._sized(1)
        self._uint(keys - key_at)
        self.out += bytes(-len(self.out) % self.width)
        self._uint(len(self.out) - keys)  # the map's keys, 3 widths before its address
        self._uint(self.width)
        self._uint(size)
        address = len(self.out)
        self._uint(address - target)
        self.out.append(self._packed(flexbuffers.Type.VECTOR))
        self.out += bytes(-len(self.out) % self.width)
        self._uint(len(self.out) - address)  # the root slot, then its type and width
        self.out += bytes([self._packed(flexbuffers.Type.MAP), self.width])
        return bytes(self.out)


def shared_flexbuffer(references: int, depth: int) -> bytes:
    """{"shift": v}: v a vector of `references` references to one vector of as many, `depth`
    levels down to a vector of ints; written out it is references**depth values."""
    flex = FlexWriter()
    level = flex.ints([0] * references)
    for _ in range(depth):
        level = flex.vector([level] * references)
    return flex.finish(b"shift", level)


def deep_flexbuffer(depth: int) -> bytes:
    """{"shift": [[[...[0]...]]]}, `depth` vectors deep."""
    flex = FlexWriter()
    level = flex.ints([0])
    for _ in range(depth):
        level = flex.vector([level])
    return flex.finish(b"shift", level)


def long_flexbuffer(declared: int, in_map: bool) -> bytes:
    """{"shift": [0]} with 4-byte fields, the vector or the map declaring `declared` entries."""
    flex = FlexWriter(4)
    leaf = flex.ints([0])
    if in_map:
        return flex.finish(b"shift", flex.vector([leaf]), declared)
    return flex.finish(b"shift", flex.vector([leaf], declared))


FLEX_SHAPES = ("shared", "deep", "long vector", "long map")
FLEX_SIZES = (0, 1, 2, 13, 16, 17, 255, 5000, 2**31 - 1)


def hostile_flexbuffer(shape: str, size: int) -> bytes:
    if shape == "shared":
        return shared_flexbuffer(4, min(size, 24))
    if shape == "deep":
        return deep_flexbuffer(min(size, 5000))
    return long_flexbuffer(size, shape == "long map")


def edit_custom_options(model: fb.ModelT, op: int, shape: str, size: int) -> str:
    """An operator's custom options become a hostile flexbuffer; a builtin operator becomes
    a SignalWindow, whose kernel reads its option "shift"."""
    operators = _graph(model).operators
    if not operators:
        return "no operator to give custom options"
    index = op % len(operators)
    operator, codes = operators[index], model.operatorCodes
    code = codes[operator.opcodeIndex] if 0 <= operator.opcodeIndex < len(codes) else None
    if code is None or code.builtinCode != fb.BuiltinOperator.CUSTOM:
        codes.append(fb.OperatorCodeT())
        codes[-1].builtinCode = codes[-1].deprecatedBuiltinCode = fb.BuiltinOperator.CUSTOM
        codes[-1].customCode, codes[-1].version = b"SignalWindow", 1
        operator.opcodeIndex = len(codes) - 1
    operator.builtinOptionsType, operator.builtinOptions = 0, None
    operator.customOptions = list(hostile_flexbuffer(shape, size))
    operator.customOptionsFormat = 0
    return f"{_op_label(model, index)} custom options: {shape} flexbuffer of size {size}"


def flip_bit(data: bytes, position: int, bit: int) -> tuple[bytes, str]:
    at = position % len(data)
    edited = bytearray(data)
    edited[at] ^= 1 << (bit % 8)
    return bytes(edited), f"byte {at}: bit {bit % 8} flipped"


def overwrite(data: bytes, position: int, payload: bytes) -> tuple[bytes, str]:
    at = position % len(data)
    edited = bytearray(data)
    edited[at : at + len(payload)] = payload
    return bytes(edited[: len(data)]), f"bytes {at}..: {payload!r}"


def truncate(data: bytes, position: int) -> tuple[bytes, str]:
    at = position % len(data)
    return data[:at], f"truncated to {at} bytes"


def table_vectors(data: bytes) -> list[tuple[str, int, int]]:
    """(what, position of the first slot, length) of the file's vectors of tables: subgraphs,
    buffers, operator codes and the first subgraphs' tensors and operators."""
    root = fb.Model.GetRootAs(data, 0)
    fields = [("subgraph", root._tab, 8), ("buffer", root._tab, 12),
              ("operator code", root._tab, 6)]
    for i in range(min(root.SubgraphsLength(), 4)):
        graph = root.Subgraphs(i)._tab
        fields += [(f"subgraph {i} tensor", graph, 4), (f"subgraph {i} operator", graph, 10)]
    found = []
    for what, table, vtable_slot in fields:
        offset = table.Offset(vtable_slot)
        if offset:
            found.append((what, table.Vector(offset), table.VectorLen(offset)))
    return found


def point_slots_at_first(data: bytes, start: int, count: int) -> bytes:
    """Slots 1..count-1 of the vector of tables whose first slot is at `start` point at the
    first slot's table (a flatbuffer slot holds the distance forward to its table)."""
    edited = bytearray(data)
    first = start + struct.unpack_from("<I", data, start)[0]
    for slot in range(start + 4, start + 4 * count, 4):
        struct.pack_into("<I", edited, slot, (first - slot) % (1 << 32))
    return bytes(edited)


def share_tables(data: bytes, which: int, count: int) -> tuple[bytes, str]:
    """Several slots of one vector of tables point at one table, which no converter writes."""
    try:
        vectors = [v for v in table_vectors(data) if v[2] >= 2]
    except Exception:  # an earlier byte edit left no readable vectors
        vectors = []
    if not vectors:
        return data, "no vector of tables to share"
    what, start, length = _pick(vectors, which)
    slots = 2 + count % (min(length, (len(data) - start) // 4) - 1)
    if slots > length or start + 4 * slots > len(data):
        return data, f"{what} slots lie outside the file"
    return point_slots_at_first(data, start, slots), f"{what}s 1..{slots - 1} -> the first's table"


INDEX = st.integers(0, 1 << 12)
NAMES = st.sampled_from(HOSTILE_NAMES)
SEMANTIC: dict[str, tuple[Callable[..., str], tuple[st.SearchStrategy, ...]]] = {
    "dim": (edit_dim, (INDEX, INDEX, st.sampled_from(DIMS))),
    "rank": (edit_rank, (INDEX, INDEX, st.sampled_from(DIMS))),
    "shape_signature": (edit_shape_signature, (INDEX, INDEX)),
    "dtype": (edit_dtype, (INDEX, st.sampled_from(TYPE_CODES))),
    "drop_options": (edit_drop_options, (INDEX,)),
    "option": (edit_option, (INDEX, INDEX, INDEX)),
    "options_type": (edit_options_type, (INDEX, INDEX)),
    "scale": (edit_scale, (INDEX, INDEX, st.sampled_from(SCALES))),
    "zero_point": (edit_zero_point, (INDEX, INDEX, st.sampled_from(ZERO_POINTS))),
    "channels": (edit_channels, (INDEX, INDEX)),
    "quantized_dimension": (
        edit_quantized_dimension, (INDEX, st.sampled_from(QUANTIZED_DIMENSIONS))
    ),
    "drop_quantization": (edit_drop_quantization, (INDEX,)),
    "op_input": (edit_op_input, (INDEX, INDEX, INDEX)),
    "op_output": (edit_op_output, (INDEX, INDEX, INDEX)),
    "op_arity": (edit_op_arity, (INDEX, INDEX, INDEX)),
    "op_list": (edit_op_list, (INDEX, INDEX, INDEX)),
    "graph_inputs": (edit_graph_inputs, (INDEX, INDEX)),
    "graph_outputs": (edit_graph_outputs, (INDEX, INDEX)),
    "name": (edit_name, (INDEX, NAMES)),
    "text": (edit_text, (INDEX, NAMES)),
    "buffer": (edit_buffer, (INDEX, INDEX, INDEX)),
    "buffer_index": (edit_buffer_index, (INDEX, INDEX)),
    "variable": (edit_variable, (INDEX,)),
    "opcode": (edit_opcode, (INDEX, st.sampled_from(OPCODE_CHOICES))),
    "opcode_version": (edit_opcode_version, (INDEX, st.sampled_from(VERSIONS))),
    "called_subgraph": (edit_called_subgraph, (INDEX, INDEX)),
    "custom_options": (
        edit_custom_options, (INDEX, st.sampled_from(FLEX_SHAPES), st.sampled_from(FLEX_SIZES))
    ),
}
BYTE_EDITS: dict[str, tuple[Callable[..., tuple[bytes, str]], tuple[st.SearchStrategy, ...]]] = {
    "flip": (flip_bit, (st.integers(0, 1 << 24), st.integers(0, 7))),
    "overwrite": (overwrite, (st.integers(0, 1 << 24), st.binary(min_size=1, max_size=8))),
    "truncate": (truncate, (st.integers(0, 1 << 24),)),
    "share_tables": (share_tables, (INDEX, INDEX)),
}


def _mutations(table: Mapping[str, tuple]) -> st.SearchStrategy[Mutation]:
    """Each kind about equally often (`one_of` would favour the first ones)."""
    return st.sampled_from(tuple(table)).flatmap(
        lambda kind: st.builds(Mutation, st.just(kind), st.tuples(*table[kind][1]))
    )


# Mostly the defaults (what users run), each option shrinking back to its default.
PLANNINGS = st.sampled_from((False, False, True)).flatmap(
    lambda vary: st.builds(
        Planning,
        st.sampled_from(("best", "greedy", "freelist", "naive", "optimal", "tflm")),
        st.booleans().map(lambda off: not off),
        st.booleans().map(lambda off: not off),
        st.sampled_from(("auto", "model")),
        st.booleans(),
    ) if vary else st.just(DEFAULT)
)


@st.composite
def examples(draw, seed_names: Sequence[str], compile_share: int = 1) -> Example:
    """A seed, one to four semantic mutations, sometimes byte edits, sometimes planning
    options other than the defaults. The C is built for all examples, or with `compile_share`
    N for about one in N (more among the simple examples hypothesis tries first: it favours
    the first choice, which also keeps a shrunk finding built)."""
    seed = draw(st.sampled_from(tuple(seed_names)))
    edits = tuple(draw(st.lists(_mutations(SEMANTIC), min_size=1, max_size=4)))
    with_bytes = draw(st.sampled_from((False, False, False, True)))
    byte_edits = tuple(draw(st.lists(_mutations(BYTE_EDITS), min_size=1, max_size=2))) if (
        with_bytes
    ) else ()
    planning = draw(PLANNINGS)
    compile_c = draw(st.sampled_from((True,) + (False,) * (compile_share - 1)))
    return Example(seed, edits, byte_edits, planning, compile_c)


def pack(model: fb.ModelT) -> bytes:
    builder = flatbuffers.Builder(1 << 16)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def mutate(seeds: Mapping[str, bytes], example: Example) -> Mutant:
    """Apply the example's semantic edits through the object API, then its byte edits."""
    model = fb.ModelT.InitFromPackedBuf(seeds[example.seed], 0)
    try:
        notes = [SEMANTIC[m.kind][0](model, *m.args) for m in example.edits]
        data = pack(model)
    except Exception as e:  # a mutation the fuzzer cannot carry out on this seed
        raise Inapplicable(f"{example}: {type(e).__name__}: {e}") from e
    for m in example.byte_edits:
        if data:
            data, note = BYTE_EDITS[m.kind][0](data, *m.args)
        else:  # an earlier truncation left no byte
            note = f"{m.kind}: no byte left to edit"
        notes.append(note)
    return Mutant(data, tuple(notes))


# --- the pipeline, run in a worker -----------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """How an example ended: `verdict` is "ok", "refused" or one of FINDING_KINDS; `stage` is
    where it ended; `key` says which findings are the same defect."""

    verdict: str
    stage: str
    message: str = ""
    key: str = ""
    compiled: bool = False

    @property
    def is_finding(self) -> bool:
        return self.verdict in FINDING_KINDS

    @property
    def signature(self) -> str:
        return f"{self.stage} {self.verdict}: {self.key or self.message}"


def _normalized(text: str) -> str:
    """A message with its numbers and quoted names blanked, so one defect is one key."""
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    return re.sub(r"(?<!\w)\d+(\.\d+)?(e[-+]?\d+)?", "N", text)[:200]


def refusal(stage: str, error: Exception) -> Outcome:
    """A clean refusal is one printable line naming the model file."""
    text = str(error)
    problems = []
    if SOURCE not in text:
        problems.append("does not name the file")
    if len(text.splitlines()) != 1:
        problems.append("is not one line")
    elif not text.isprintable():
        problems.append("has non-printable characters")
    if not problems:
        return Outcome("refused", stage, text, _normalized(text))
    return Outcome(
        "unclean-refusal",
        stage,
        f"{type(error).__name__} {' and '.join(problems)}: {text!r}"[:2000],
        f"{type(error).__name__} {problems[0]}: {_normalized(text)}",
    )


def crashed(stage: str, error: BaseException) -> Outcome:
    """A traceback: keyed by the exception type and the deepest frame of the project."""
    frames = traceback.extract_tb(error.__traceback__)
    own = [
        f for f in frames
        if f.filename.startswith(str(ROOT)) and "/tests/" not in f.filename
    ]
    where = own[-1] if own else (frames[-1] if frames else None)
    place = (
        f" in {os.path.relpath(where.filename, ROOT)}:{where.name}" if where is not None else ""
    )
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    return Outcome(
        "traceback", stage, "".join(lines[-12:]).strip()[-3000:], f"{type(error).__name__}{place}"
    )


def _harness_limits(output_bytes: int) -> Callable[[], None]:
    """ASan needs the address space the worker gave up; a harness that writes more than its
    outputs is stopped by the file size limit."""

    def apply() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        limit = output_bytes + (1 << 20)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def _sanitizer_key(report: str) -> str:
    for pattern in (r"runtime error: (.*)", r"ERROR: AddressSanitizer: ([\w-]+)", r"^(.*)$"):
        found = re.search(pattern, report, re.MULTILINE)
        if found:
            function = re.search(r"#0 0x[0-9a-f]+ in (\w+)", report)
            where = f" in {_normalized(function.group(1))}" if function else ""
            return _normalized(found.group(1)) + where
    return "no report"


def run_pipeline(
    stage: Callable[[str], None],
    data: bytes,
    planning: Planning,
    compile_c: bool,
    workdir: str,
    run_timeout: float,
) -> Outcome:
    """parse -> plan -> runtime_py -> generate -> compile under ASan+UBSan -> run -> compare.
    ArenacErrors and other exceptions are classified by the worker (see `serve`)."""
    stage("parse")
    model = parse_model(data, SOURCE)
    stage("plan")
    model_plan = planning.plan(model)
    c_plan = planning.plan(model, external_io=True) if planning.external_io else model_plan
    graph = model_plan.graph
    stage("runtime_py")
    # a model with state runs a short sequence, state kept, as the harness runs its sets
    sets = [random_inputs(graph, k) for k in range(STATEFUL_SETS if model_plan.state_bytes else 1)]
    sets += [values for _, values in edge_inputs(graph)]  # NaN, +-inf, denormals, +-max
    overflowed: list[bool] = []
    runtime = ArenaInterpreter(model_plan)
    expected = [
        [np.array(v, copy=True)
         for v in runtime.invoke(
             inputs, observe=lambda _, outs: overflowed.append(any(map(float_overflow, outs))))]
        for inputs in sets
    ]
    stage("generate")
    files = generate(c_plan, "model", external_io=planning.external_io)
    if not compile_c:
        return Outcome("ok", "generate")
    stage("compile")
    write_files(files, workdir)
    try:
        binary = compile_files(workdir, "model", ("-O1", *SANITIZE_FLAGS))
    except RuntimeBackendError as e:
        text = str(e).replace(workdir + os.sep, "")
        return Outcome("compile-error", "compile", text, _normalized(text))
    stage("run_c")
    output_bytes = len(sets) * sum(graph.tensors[t].nbytes for t in graph.outputs)
    out_path = os.path.join(workdir, "outputs.bin")
    stdin = b"".join(np.ascontiguousarray(v).tobytes() for inputs in sets for v in inputs)
    try:
        with open(out_path, "wb") as out:
            result = subprocess.run(
                [binary], input=stdin, stdout=out, stderr=subprocess.PIPE, timeout=run_timeout,
                env={**os.environ, **SANITIZER_ENV}, preexec_fn=_harness_limits(output_bytes),
            )
    except subprocess.TimeoutExpired:
        return Outcome("hang", "run_c", f"the compiled harness ran over {run_timeout:g} s",
                       compiled=True)
    report = result.stderr.decode(errors="replace")
    if result.returncode != 0:
        status = (
            f"killed by {signal.Signals(-result.returncode).name}"
            if result.returncode < 0 else f"exit {result.returncode}"
        )
        key = "wrote more than its outputs" if result.returncode == -signal.SIGXFSZ else (
            _sanitizer_key(report)
        )
        return Outcome("harness-failure", "run_c", f"{status}\n{report[-3000:]}",
                       f"{status}: {key}", compiled=True)
    raw = Path(out_path).read_bytes()
    stage("compare")
    if len(raw) != output_bytes:
        return Outcome("mismatch", "compare",
                       f"the harness wrote {len(raw)} bytes, expected {output_bytes}",
                       "output size", compiled=True)
    for k, actual in enumerate(split_outputs(raw, graph, len(sets))):
        for i, (want, got) in enumerate(zip(expected[k], actual, strict=True)):
            d = difference(want, got)
            if d.mismatches and not (want.dtype.kind == "f" and any(overflowed)):
                t = graph.tensors[graph.outputs[i]]
                return Outcome(
                    "mismatch", "compare",
                    f"output {i} ({t.dtype}{list(t.shape)}) of invoke {k}: {d.mismatches} "
                    f"elements differ, max |diff| {d.max_abs_diff}",
                    f"{t.dtype} output differs", compiled=True,
                )
    return Outcome("ok", "compare", compiled=True)


def float_overflow(value: np.ndarray) -> bool:
    """A float tensor that left float32's finite range: from there on, results depend on the
    order of summation (TFLite's own float kernels differ), so float outputs are not compared."""
    if value.dtype.kind != "f" or value.size == 0:
        return False
    return not bool(np.all(np.abs(value) < np.finfo(np.float32).max))


def serve(fd: int, memory_bytes: int) -> None:
    """The worker's loop: run (function, args) requests, report each stage as it starts."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, hard))
    connection = Connection(fd)
    current = {"stage": "start"}
    connection.send(("ready", None))

    def stage(name: str) -> None:
        current["stage"] = name
        connection.send(("stage", name))

    while True:
        try:
            function, args = connection.recv()
        except EOFError:
            return
        current["stage"] = "start"
        try:
            outcome = function(stage, *args)
        except ArenacError as e:
            outcome = refusal(current["stage"], e)
        except BaseException as e:  # everything else is a finding
            outcome = crashed(current["stage"], e)
        connection.send(("done", outcome))


@dataclass(frozen=True)
class Timeouts:
    """Seconds each stage may take before the example counts as a hang."""

    python: float = 20.0  # start-up, parse, plan, runtime_py, generate: each on its own
    compile: float = 120.0
    run: float = 20.0

    def of(self, stage: str) -> float:
        if stage == "compile":
            return self.compile
        if stage == "run_c":
            return self.run + 10.0  # the harness has its own timeout; this is the backstop
        return self.python


class Worker:
    """One child process running requests. A crash, or a stage over its time limit, is
    recorded as the outcome, and the process (with its process group) is replaced."""

    def __init__(self, timeouts: Timeouts = Timeouts()):
        self.timeouts = timeouts
        self.directory = tempfile.mkdtemp(prefix="arenac-fuzz-")
        self.log_path = os.path.join(self.directory, "worker.log")
        self.process: subprocess.Popen | None = None
        self.connection: Connection | None = None

    def _start(self) -> None:
        ours, theirs = Pipe()
        code = f"from tests.fuzz import serve; serve({theirs.fileno()}, {WORKER_MEMORY_BYTES})"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", code],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=ROOT,
                start_new_session=True,
            )
        theirs.close()
        self.connection = ours
        if not ours.poll(STARTUP_SECONDS):
            self._stop()
            raise RuntimeError(f"the fuzz worker did not start in {STARTUP_SECONDS} s")
        ours.recv()

    def _stop(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()
            self.connection.close()
        self.process = self.connection = None

    def _log_since(self, offset: int) -> list[str]:
        """The worker's stderr since `offset`: what a dying extension or Python printed."""
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace").strip().splitlines()

    def call(self, function: Callable[..., Outcome], *args) -> Outcome:
        """`function(stage, *args)` in the worker; hangs and crashes come back as outcomes."""
        if self.process is None:
            self._start()
        log_offset = os.path.getsize(self.log_path)
        self.connection.send((function, args))
        stage = "start"
        while True:
            limit = self.timeouts.of(stage)
            if not self.connection.poll(limit):
                self._stop()
                return Outcome("hang", stage, f"no progress in {limit:g} s")
            try:
                kind, value = self.connection.recv()
            except (EOFError, OSError):
                status = self.process.wait()
                how = f"signal {signal.Signals(-status).name}" if status < 0 else f"exit {status}"
                said = self._log_since(log_offset)
                self._stop()
                last = f": {_normalized(said[-1])}" if said else ""
                return Outcome("crash", stage, "\n".join([f"the worker died ({how})", *said[-20:]]),
                               how + last)
            if kind == "stage":
                stage = value
            else:
                return value

    def run(self, data: bytes, compile_c: bool, planning: Planning = DEFAULT) -> Outcome:
        """The pipeline on one file, its C built in a folder of its own."""
        workdir = tempfile.mkdtemp(dir=self.directory)
        try:
            return self.call(
                run_pipeline, data, planning, compile_c, workdir, self.timeouts.run
            )
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def close(self) -> None:
        self._stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- campaigns -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    example: Example
    mutant: Mutant | None  # None: the fuzzer could not apply the mutations (not arenac's fault)
    outcome: Outcome


@dataclass
class Finding:
    """One distinct finding: how often it was seen and its smallest known example."""

    first: Result
    count: int = 1
    shrunk: Result | None = None


def draw_examples(count: int, seed: int, seed_names: Sequence[str]) -> list[Example]:
    """`count` examples from hypothesis' own generation, repeatable for a given seed."""
    drawn: list[Example] = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(examples(seed_names))
    def collect(example: Example) -> None:
        drawn.append(example)

    collect()
    return drawn


class Pool:
    """Workers shared by threads: each call takes a free worker for one example."""

    def __init__(self, jobs: int, timeouts: Timeouts):
        self.idle: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        self.workers = [Worker(timeouts) for _ in range(jobs)]
        for worker in self.workers:
            self.idle.put(worker)

    def evaluate(self, seeds: Mapping[str, bytes], example: Example) -> Result:
        try:
            mutant = mutate(seeds, example)
        except Inapplicable as e:
            return Result(example, None, Outcome("skipped", "mutate", str(e)))
        worker = self.idle.get()
        try:
            outcome = worker.run(mutant.data, example.compile_c, example.planning)
            return Result(example, mutant, outcome)
        finally:
            self.idle.put(worker)

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


def _smaller(example: Example) -> Iterator[Example]:
    """The example without one run of consecutive mutations (longest runs first), then with
    the default planning options. The seed alone may remain: its planning flags can be all
    it takes."""
    for name in ("edits", "byte_edits"):
        edits = getattr(example, name)
        for size in range(len(edits), 0, -1):
            for start in range(len(edits) - size + 1):
                yield replace(example, **{name: edits[:start] + edits[start + size :]})
    if example.planning != DEFAULT:
        yield replace(example, planning=DEFAULT)


def shrink(pool: Pool, seeds: Mapping[str, bytes], result: Result) -> Result:
    """The smallest example found by dropping what `_smaller` drops while the finding stays."""
    target = result.outcome.signature
    while True:
        for candidate in _smaller(result.example):
            attempt = pool.evaluate(seeds, candidate)
            if attempt.outcome.signature == target:
                result = attempt
                break
        else:
            return result


def describe(result: Result) -> str:
    """What a reproducer's text file says: enough to route the defect without the fuzzer."""
    example, outcome = result.example, result.outcome
    notes = result.mutant.notes if result.mutant else ()
    lines = [
        f"kind:  {outcome.verdict}",
        f"stage: {outcome.stage}",
        f"key:   {outcome.key}",
        f"seed:  {example.seed}",
        f"flags: {' '.join([*example.planning.flags(), '--nodes', str(PLAN_NODES)])}",
        "mutations:",
        *(
            f"  {m}  # {note}"
            for m, note in zip((*example.edits, *example.byte_edits), notes, strict=True)
        ),
        "message:",
        *(f"  {line}" for line in outcome.message.splitlines()),
    ]
    return "\n".join(lines) + "\n"


@dataclass
class Tally:
    """Counts of a campaign, and its distinct findings by signature."""

    examples: int = 0
    ok: int = 0
    compiled: int = 0
    skipped: int = 0
    refused: Counter = field(default_factory=Counter)  # by stage
    kinds: Counter = field(default_factory=Counter)  # findings by kind
    findings: dict[str, Finding] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, result: Result) -> None:
        outcome = result.outcome
        with self.lock:
            self.examples += 1
            if outcome.verdict == "skipped":
                self.skipped += 1
            elif outcome.verdict == "ok":
                self.ok += 1
                self.compiled += outcome.compiled
            elif outcome.verdict == "refused":
                self.refused[outcome.stage] += 1
            else:
                self.kinds[outcome.verdict] += 1
                known = self.findings.get(outcome.signature)
                if known is None:
                    self.findings[outcome.signature] = Finding(result)
                else:
                    known.count += 1

    @property
    def finding_count(self) -> int:
        return sum(self.kinds.values())


def write_reproducers(tally: Tally, out: Path) -> list[tuple[Path, Finding]]:
    """finding-NNN.tflite and finding-NNN.txt per distinct finding, in stage order."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("finding-*"):
        old.unlink()
    order = sorted(
        tally.findings.values(),
        key=lambda f: (STAGES.index(f.first.outcome.stage), f.first.outcome.signature),
    )
    written = []
    for number, finding in enumerate(order, 1):
        best = finding.shrunk or finding.first
        path = out / f"finding-{number:03d}.tflite"
        path.write_bytes(best.mutant.data)
        original = len(finding.first.example.edits) + len(finding.first.example.byte_edits)
        shrunk = len(best.example.edits) + len(best.example.byte_edits)
        header = f"seen {finding.count} times; mutations shrunk from {original} to {shrunk}\n"
        path.with_suffix(".txt").write_text(header + describe(best))
        written.append((path, finding))
    return written


def summary(tally: Tally, seconds: float, jobs: int, written: Sequence[tuple[Path, Finding]]
            ) -> str:
    rate = tally.examples / seconds if seconds > 0 else 0.0
    refused = ", ".join(f"{s} {n}" for s, n in sorted(tally.refused.items(),
                                                       key=lambda kv: STAGES.index(kv[0])))
    lines = [
        f"fuzz: {tally.examples} examples in {seconds:.1f} s ({rate:.2f} per second, "
        f"{jobs} workers)",
        f"  ok        {tally.ok:6d}  (C built and run for {tally.compiled})",
        f"  refused   {sum(tally.refused.values()):6d}  ({refused or 'none'})",
        f"  findings  {tally.finding_count:6d}  ({len(tally.findings)} distinct)",
    ]
    if tally.skipped:
        lines.append(f"  skipped   {tally.skipped:6d}  (the fuzzer could not apply the mutations)")
    for kind in FINDING_KINDS:
        if tally.kinds[kind]:
            lines.append(f"    {kind:16s} {tally.kinds[kind]:6d}")
    for path, finding in written:
        outcome = finding.first.outcome
        lines.append(
            f"  {path}  x{finding.count}  [{outcome.stage}] {outcome.verdict}: "
            f"{(outcome.key or outcome.message)[:120]}"
        )
    return "\n".join(lines)


def campaign(
    count: int,
    seed: int,
    seeds: Mapping[str, bytes],
    out: Path,
    jobs: int,
    timeouts: Timeouts,
    progress: Callable[[str], None] = lambda line: None,
) -> Tally:
    """Run `count` examples, shrink one example of each distinct finding, write reproducers."""
    started = time.monotonic()
    tally = Tally()
    pool = Pool(jobs, timeouts)
    step = max(1, count // 20)
    try:
        drawn = draw_examples(count, seed, sorted(seeds))
        with ThreadPoolExecutor(jobs) as threads:
            for result in threads.map(lambda e: pool.evaluate(seeds, e), drawn):
                tally.add(result)
                if tally.examples % step == 0:
                    progress(f"fuzz: {tally.examples}/{len(drawn)} examples, "
                             f"{tally.finding_count} findings ({len(tally.findings)} distinct)")
            elapsed = time.monotonic() - started
            findings = list(tally.findings.values())
            shrunk = threads.map(lambda f: shrink(pool, seeds, f.first), findings)
            for finding, best in zip(findings, shrunk, strict=True):
                finding.shrunk = best
    finally:
        pool.close()
    written = write_reproducers(tally, out)
    print(summary(tally, elapsed, jobs, written))
    return tally


def replay(paths: Iterable[str], timeouts: Timeouts) -> int:
    """Each file through the pipeline again (C included), planned with the flags its
    reproducer text names: one line per file."""
    bad = 0
    with Worker(timeouts) as worker:
        for path in map(Path, paths):
            text = path.with_suffix(".txt")
            flags = re.search(r"^flags:(.*)$", text.read_text(), re.MULTILINE) if (
                text.exists()
            ) else None
            planning = Planning.from_flags(flags.group(1).split()) if flags else DEFAULT
            outcome = worker.run(path.read_bytes(), True, planning)
            bad += outcome.is_finding
            print(f"{path} ({planning}): [{outcome.stage}] {outcome.verdict}: "
                  f"{(outcome.key or outcome.message)[:160]}")
    return 1 if bad else 0


# --- the user's other files -------------------------------------------------------------------
# Data files (.npy, .npz), memory descriptions and `solve` problems are hostile input too: each
# case is one file through the command that reads it, in a process of its own, and must end in
# a result or in one line naming the file (exit 2), within USER_FILE_SECONDS.
USER_FILE_SECONDS = 60
EDGE_INTS = (0, 1, -1, 7, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63))
DESCRS = ("|i1", "<f4", "|O", "<i8", ">f4", "|V8", "<U3", "|b1", "<f2", "bogus")


@dataclass(frozen=True)
class UserFile:
    """One hostile user file: the command reading it, the file's name and bytes, what was done."""

    command: str
    name: str
    data: bytes
    note: str


def _npy(rng: np.random.Generator, valid: np.ndarray) -> tuple[bytes, str]:
    stream = io.BytesIO()
    np.save(stream, valid)
    data = stream.getvalue()
    how = int(rng.integers(5))
    if how == 0:
        shape = tuple(int(rng.choice(DIMS[:8])) for _ in range(int(rng.integers(0, 4))))
        header = {"descr": str(rng.choice(DESCRS)), "fortran_order": bool(rng.integers(2)),
                  "shape": shape}
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(head, header)
        return head.getvalue() + data[128:], f"header {header}"
    if how == 1:
        cut = int(rng.integers(len(data)))
        return data[:cut], f"truncated at {cut}"
    if how == 2:
        return data[:6] + bytes([int(rng.integers(256))]) + data[7:], "version byte"
    if how == 3:
        return data[:8] + struct.pack("<H", int(rng.integers(1 << 16))) + data[10:], "length"
    position = int(rng.integers(10, len(data)))
    return (data[:position] + bytes([int(rng.integers(256))]) + data[position + 1:],
            f"byte {position}")


def _memory(rng: np.random.Generator) -> tuple[bytes, str]:
    values = [*EDGE_INTS, "64K", "8M", "", "x", 1.5, None, True, [], {}, -5]
    names = [*(n.decode(errors="replace") for n in HOSTILE_NAMES[:4]), "fast", "FAST",
             "a" * 40, 5, None]
    how = int(rng.integers(4))
    if how == 0:
        depth = int(rng.choice((10, 1000, 100_000)))
        return ('{"pools": ' + "[" * depth + "]" * depth + "}").encode(), f"nested {depth}"
    pools = [{"name": names[int(rng.integers(len(names)))],
              "size": values[int(rng.integers(len(values)))],
              **({"section": values[int(rng.integers(len(values)))]} if rng.integers(2) else {})}
             for _ in range(int(rng.integers(0, 4)))]
    text = {"pools": pools, **({"pins": values[int(rng.integers(len(values)))]}
                               if how == 2 else {})}
    if how == 3:
        text = [text] if rng.integers(2) else pools
    return json.dumps(text).encode(), f"memory {text!r:.120}"


def _problem(rng: np.random.Generator) -> tuple[bytes, str]:
    rows = ["id,lower,upper,size"]
    for k in range(int(rng.integers(0, 6))):
        cells = [str(k), str(int(rng.integers(0, 8))), str(int(rng.integers(1, 12))),
                 str(int(rng.integers(1, 64)))]
        if rng.integers(3) == 0:
            cells[int(rng.integers(4))] = str(EDGE_INTS[int(rng.integers(len(EDGE_INTS)))])
        if rng.integers(8) == 0:
            cells = cells[:int(rng.integers(4))] + ["x"]
        rows.append(",".join(cells))
    return ("\n".join(rows) + "\n").encode(), f"{len(rows) - 1} buffers"


def user_files(count: int, seed: int = 0) -> Iterator[UserFile]:
    """`count` hostile user files, the same for the same seed."""
    rng = np.random.default_rng(seed)
    valid = np.zeros((1, 4), np.int8)
    for k in range(count):
        kind = k % 4
        if kind == 0:
            data, note = _npy(rng, valid)
            yield UserFile("run", "x.npy", data, note)
        elif kind == 1:
            member, note = _npy(rng, valid)
            archive = io.BytesIO()
            with zipfile.ZipFile(archive, "w") as z:
                z.writestr(str(rng.choice(["x.npy", "0.npy", "arr_0.npy", "y.npy"])), member)
            data = archive.getvalue()
            cut = len(data) if rng.integers(3) else int(rng.integers(len(data)))
            yield UserFile("check", "x.npz", data[:cut], f"archive: {note}, cut at {cut}")
        elif kind == 2:
            data, note = _memory(rng)
            yield UserFile("plan", "memory.json", data, note)
        else:
            data, note = _problem(rng)
            yield UserFile("solve", "problem.csv", data, note)


def _user_file_model() -> bytes:
    b = ModelBuilder("int8", seed=2)
    x = b.input("x", (1, 4), "int8", scale=0.05, zero_point=0)
    b.output(b.fully_connected(x, 3))
    return b.build()


def run_user_file(case: UserFile, directory: str) -> str | None:
    """None when the command ended with a result or one line naming the file; else what
    went wrong (a traceback, an unclean refusal, a hang)."""
    model, path = os.path.join(directory, "m.tflite"), os.path.join(directory, case.name)
    Path(model).write_bytes(_user_file_model())
    Path(path).write_bytes(case.data)
    args = {
        "run": ["run", model, "--input", path, "--output-dir", os.path.join(directory, "out")],
        "check": ["check", model, "--input", path, "--backends", "runtime_py", "--quiet"],
        "plan": ["plan", model, "--memory", path, "--quiet"],
        "solve": ["solve", path, "--quiet"],
    }[case.command]
    try:
        result = subprocess.run([sys.executable, "-m", "toolchain.cli", *args],
                                capture_output=True, text=True, timeout=USER_FILE_SECONDS,
                                cwd=ROOT)
    except subprocess.TimeoutExpired:
        return f"hang: over {USER_FILE_SECONDS} s"
    if result.returncode in (0, 1) and "Traceback" not in result.stderr:
        return None
    lines = result.stderr.strip().splitlines()
    # one line naming the file, or the model where the file is sound but the model does not
    # fit what it describes (pools too small: "does not fit the pools", as docs/cortex-m.md says)
    if result.returncode == 2 and len(lines) == 1 and "Traceback" not in lines[0] and (
            path in lines[0] or lines[0].startswith("arenac: error:")
            or lines[0].startswith(f"arenac: {model}: does not fit the pools")):
        return None
    return f"exit {result.returncode}: {result.stderr.strip()[-2000:]}"


def user_file_campaign(count: int, seed: int, jobs: int) -> int:
    """Every case of user_files(count, seed); prints each finding, returns how many."""
    def one(case: UserFile) -> str | None:
        with tempfile.TemporaryDirectory(prefix="arenac-fuzz-") as directory:
            return run_user_file(case, directory)

    cases = list(user_files(count, seed))
    with ThreadPoolExecutor(jobs) as threads:
        found = [(case, problem) for case, problem in zip(cases, threads.map(one, cases),
                                                          strict=True)
                 if problem]
    for case, problem in found:
        print(f"user file {case.command} {case.name} ({case.note}): {problem}", file=sys.stderr)
    print(f"fuzz: {count} user files, {len(found)} findings", file=sys.stderr)
    return len(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fuzz",
        description="Fuzz parse, plan, runtime_py, generate and the sanitized C with mutated "
        "models; exit 1 if anything other than a clean refusal or success happens.",
    )
    parser.add_argument("--examples", type=int, default=200, help="examples to run (200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the example stream (0)")
    parser.add_argument("--out", default="build/fuzz", help="reproducers go here (build/fuzz)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                        help="worker processes (one per core)")
    parser.add_argument("--timeout", type=float, default=Timeouts.python,
                        help="seconds a Python stage may take before it counts as a hang")
    parser.add_argument("--no-shared", action="store_true",
                        help="only the built-in seeds, not ../shared/models")
    parser.add_argument("--replay", nargs="+", metavar="FILE",
                        help="run these files through the pipeline instead of a campaign")
    parser.add_argument("--files", type=int, default=0, metavar="N",
                        help="also N hostile data files, memory descriptions and solve "
                             "problems, each through the command that reads it (0)")
    args = parser.parse_args(argv)
    timeouts = Timeouts(python=args.timeout)
    if args.replay:
        return replay(args.replay, timeouts)
    file_findings = user_file_campaign(args.files, args.seed, args.jobs) if args.files else 0
    if args.examples < 1 or args.jobs < 1:
        parser.error("--examples and --jobs must be positive")
    seeds = builtin_seeds() if args.no_shared else {**builtin_seeds(), **shared_seeds()}
    tally = campaign(
        args.examples, args.seed, seeds, Path(args.out), args.jobs, timeouts,
        lambda line: print(line, file=sys.stderr, flush=True),
    )
    return 1 if tally.finding_count or file_findings else 0


if __name__ == "__main__":
    from tests.fuzz import main as fuzz_main  # the module's own objects, picklable by name

    sys.exit(fuzz_main())
