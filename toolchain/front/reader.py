"""Reader: .tflite bytes -> the toolchain's IR. The only code that touches flatbuffers.

The Python flatbuffers runtime has no verifier, so every count and offset read from the file is
checked against the file's size before it is used: a corrupt file must end in one ModelError,
never a traceback, a hang or a huge allocation. Nor may references shared between slots
multiply the work: every vector and string read is charged against the file's size (the
parser's `charge`), and a custom op's flexbuffer options against theirs (_Flexbuffer), so the
work stays proportional to the file. A model that parses is then validated
(toolchain.front.validate), so every command receives one that means something.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
from flatbuffers import flexbuffers
from flatbuffers import number_types as fbn
from flatbuffers.table import Table

from toolchain.errors import ArenacError, ModelError
from toolchain.files import read_bounded
from toolchain.front.schema import DTYPE_NAMES, OPCODE_NAMES, OPTION_ENUMS, fb, snake_case
from toolchain.front.validate import DEFAULT_MAX_BYTES, validate_model
from toolchain.ir import DTYPE_BITS, Graph, Model, Operator, Quantization, SignatureDef, Tensor

T = TypeVar("T")

MAX_TENSOR_ELEMENTS = 1 << 32  # larger than any microcontroller could hold: the file is corrupt
PLACEHOLDER_FOR_GREATER_OP_CODES = 127
# SparseIndexVector's union members: (table, bytes a value)
SPARSE_VECTORS = {1: (fb.Int32Vector, 4), 2: (fb.Uint16Vector, 2), 3: (fb.Uint8Vector, 1)}
MAX_OPTIONS_DEPTH = 16  # custom options are a flat map; deeper than this is a crafted file


def read_model(path: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES) -> Model:
    """Read a .tflite file; every problem becomes a ModelError naming the file.

    `max_bytes` caps the file, any single tensor, and a graph's activations and state; the
    read stops there, so a device or a pipe that never ends cannot exhaust memory.
    """
    source = os.fspath(path)
    try:
        data = read_bounded(source, max_bytes)
    except ArenacError as e:  # the same words, as the model's error
        raise ModelError(e.message, source) from None
    return parse_model(data, source, max_bytes)


def parse_model(
    data: bytes, source: str = "<bytes>", max_bytes: int = DEFAULT_MAX_BYTES
) -> Model:
    """Parse .tflite bytes into a semantically valid model (toolchain.front.validate); constant
    tensors become read-only views of `data`."""
    if len(data) > max_bytes:
        raise _too_large(max_bytes, source)
    data = bytes(data)  # immutable, so numpy views of it are read-only
    if len(data) < 8 or not fb.Model.ModelBufferHasIdentifier(data, 0):
        raise ModelError("not a TFLite model (no 'TFL3' file identifier)", source)
    try:
        model = _Parser(data, source).model()
    except ModelError:
        raise
    except RecursionError:
        raise ModelError("corrupt flatbuffer (cyclic offsets)", source) from None
    except Exception as e:  # the generated bindings fail in many ways on corrupt bytes
        raise ModelError(f"corrupt or truncated flatbuffer ({type(e).__name__})", source) from None
    validate_model(model, max_bytes)
    return model


def _too_large(max_bytes: int, source: str) -> ModelError:
    return ModelError(f"file is larger than the limit of {max_bytes} bytes", source)


class _FastTable(Table):
    """The bindings' Table, reading the same values with less Python per field.

    Every accessor the bindings generate asks `Offset` for its field's slot, which reads the
    table's vtable afresh through three checked reads; a converter writes one vtable for
    thousands of alike tables, so here each vtable's slots are looked up once per file
    (`slots`, shared by the file's tables) and each value is one struct read. A 100,000-operator
    graph reads in under half the time. An offset outside the file still fails: struct's error
    below the end, and the same check as the bindings' (`enforce_number`) below zero, where
    struct would count from the end.
    """

    __slots__ = ("slots", "vtable")

    def __init__(self, buf: bytes, pos: int, slots: dict[tuple[int, int], int]):
        self.Bytes = buf
        self.Pos = pos
        self.slots = slots
        self.vtable = pos - self.Get(fbn.SOffsetTFlags, pos)

    def Offset(self, vtableOffset: int) -> int:  # the names are the bindings'
        key = (self.vtable, vtableOffset)
        slot = self.slots.get(key)
        if slot is None:
            end = self.Get(fbn.VOffsetTFlags, self.vtable)
            slot = self.Get(fbn.VOffsetTFlags, self.vtable + vtableOffset) if (
                vtableOffset < end) else 0
            self.slots[key] = slot
        return slot

    def Get(self, flags: Any, off: int) -> Any:
        if off < 0:
            raise TypeError("negative offset")
        return flags.packer_type.unpack_from(self.Bytes, off)[0]  # already of its py_type

    def Indirect(self, off: int) -> int:
        return off + self.Get(fbn.UOffsetTFlags, off)

    def String(self, off: int) -> bytes:
        string = self.Indirect(off)  # its length, then its bytes
        start = string + fbn.UOffsetTFlags.bytewidth
        return self.Bytes[start:start + self.Get(fbn.UOffsetTFlags, string)]

    def VectorLen(self, off: int) -> int:
        return self.Get(fbn.UOffsetTFlags, self.Indirect(off + self.Pos))

    def GetVectorAsNumpy(self, flags: Any, off: int) -> np.ndarray:
        vector = self.Indirect(off + self.Pos)  # its length, then its elements
        return np.frombuffer(self.Bytes, _numpy_type(flags), self.Get(fbn.UOffsetTFlags, vector),
                             vector + fbn.UOffsetTFlags.bytewidth)


_numpy_type = functools.cache(fbn.to_numpy_type)


class _Parser:
    def __init__(self, data: bytes, source: str):
        self.data = data
        self.source = source
        self.slots: dict[tuple[int, int], int] = {}  # (vtable, slot) -> field offset: _FastTable
        self.views: dict[int, np.ndarray | None] = {}  # buffer -> its bytes: buffer_view
        self.root = self.fast(fb.Model.GetRootAs(data, 0))
        self.unread = len(data)  # bytes the parse may still read: see `charge`

    def fail(self, message: str) -> ModelError:
        return ModelError(message, self.source)

    def fast(self, table: T) -> T:
        """`table` (a bindings object, or None) reading through _FastTable."""
        if table is not None:
            table._tab = _FastTable(table._tab.Bytes, table._tab.Pos, self.slots)
        return table

    def charge(self, nbytes: int, what: str) -> None:
        """Count `nbytes` of vector or string read against the file's size.

        In a file whose slots share nothing (as a converter writes it) every vector and string
        read lies in bytes of its own, so the reads add up to less than the file. Slots that
        point at one table multiply them instead: N subgraph entries at one subgraph whose N
        tensor entries point at one tensor cost N * N reads from a few kilobytes.
        """
        if nbytes < 0 or nbytes > len(self.data):
            raise self.fail(f"corrupt flatbuffer ({what}: {nbytes} bytes cannot fit in the file)")
        if nbytes > self.unread:
            raise self.fail(
                f"corrupt flatbuffer (entries share their tables: with {what}, the parts read "
                f"add up to more than the file's {len(self.data)} bytes)"
            )
        self.unread -= nbytes

    def items(self, length: int, get: Callable[[int], T], bytes_each: int, what: str) -> list[T]:
        """Read a flatbuffer vector after charging its length."""
        self.charge(length * bytes_each, what)
        return [get(i) for i in range(length)]

    def tables(self, length: int, get: Callable[[int], T], what: str) -> list[T]:
        """Read a flatbuffer vector of tables after charging its length."""
        self.charge(length * 4, what)
        return [self.fast(get(i)) for i in range(length)]

    def ints(self, vector: Callable[[], Any], what: str) -> tuple[int, ...]:
        """A vector of int32 read whole (the bindings' AsNumpy: a bounds-checked view, 0 when
        the vector is absent) and charged before it is copied: element by element, 100,000
        operators' lists take seconds."""
        values = vector()
        if isinstance(values, int):
            return ()
        self.charge(values.size * 4, what)
        return tuple(values.tolist())

    # --- model -------------------------------------------------------------------------
    def model(self) -> Model:
        root = self.root
        self.buffers = self.tables(root.BuffersLength(), root.Buffers, "buffers")
        # `embed` reads the whole file through the object API, which copies every buffer and
        # the fields this reader skips: they are charged too, so shared ones end here
        for buffer in self.buffers:
            self.charge(int(buffer.DataLength()), "buffers")
        self.charge(4 * int(root.MetadataBufferLength()), "the metadata buffer list")
        self.opcodes = [
            self.opcode(c, i)
            for i, c in enumerate(
                self.tables(root.OperatorCodesLength(), root.OperatorCodes, "operator codes")
            )
        ]
        graphs = tuple(
            self.graph(g, i)
            for i, g in enumerate(
                self.tables(root.SubgraphsLength(), root.Subgraphs, "subgraphs")
            )
        )
        if not graphs:
            raise self.fail("model has no subgraphs")
        metadata = {
            self.text(m.Name()): self.buffer_bytes(m.Buffer(), f"metadata {self.text(m.Name())!r}")
            for m in self.tables(root.MetadataLength(), root.Metadata, "metadata")
        }
        signatures = tuple(
            self.signature(s, graphs)
            for s in self.tables(root.SignatureDefsLength(), root.SignatureDefs, "signature defs")
        )
        return Model(
            source=self.source,
            version=int(root.Version()),
            description=self.text(root.Description()),
            graphs=graphs,
            metadata=metadata,
            signature_defs=signatures,
            sha256=hashlib.sha256(self.data).hexdigest(),
        )

    def text(self, raw: bytes | None) -> str:
        if not raw:
            return ""
        self.charge(len(raw), "a name")
        return raw.decode("utf-8", errors="replace")

    def opcode(self, code: Any, index: int) -> tuple[str, int, str | None]:
        """(builtin name, version, custom code); the larger code field wins, as in TFLite."""
        value = max(int(code.BuiltinCode()), int(code.DeprecatedBuiltinCode()))
        if value not in OPCODE_NAMES:
            raise self.fail(f"unknown builtin operator code {value} (operator code {index})")
        name = OPCODE_NAMES[value]
        custom = self.text(code.CustomCode()) if name == "CUSTOM" else None
        return name, int(code.Version()), custom

    # --- buffers -----------------------------------------------------------------------
    def buffer_bytes(self, index: int, what: str) -> bytes:
        """A copy of buffer `index`, charged: entries sharing a buffer would copy it each."""
        view = self.buffer_view(index, what)
        if view is None:
            return b""
        self.charge(view.size, what)
        return view.tobytes()

    def buffer_view(self, index: int, what: str) -> np.ndarray | None:
        """The bytes of buffer `index` as a read-only uint8 view, or None when it is empty;
        found once per buffer (every tensor without data names buffer 0).

        Buffers of models over 2 GB live after the flatbuffer and are addressed by offset and
        size from the start of the file.
        """
        if index not in self.views:
            self.views[index] = self.find_buffer(index, what)
        return self.views[index]

    def find_buffer(self, index: int, what: str) -> np.ndarray | None:
        if index == 0 and not self.buffers:
            return None  # buffer 0 is the empty one by convention, even when none is listed
        if not 0 <= index < len(self.buffers):
            raise self.fail(
                f"{what} refers to buffer {index}, but the model has {len(self.buffers)}"
            )
        buffer = self.buffers[index]
        offset, size = int(buffer.Offset()), int(buffer.Size())
        if offset > 1:
            if offset + size > len(self.data):
                raise self.fail(
                    f"buffer {index} lies outside the file (offset {offset}, size {size}, "
                    f"file {len(self.data)} bytes)"
                )
            return np.frombuffer(self.data, np.uint8, size, offset)
        if buffer.DataLength() == 0:
            return None
        try:
            return buffer.DataAsNumpy()  # np.frombuffer over the file: a view, bounds-checked
        except ValueError:
            raise self.fail(f"buffer {index} lies outside the file") from None

    # --- graphs ------------------------------------------------------------------------
    def graph(self, g: Any, index: int) -> Graph:
        tensors = tuple(
            self.tensor(t, i)
            for i, t in enumerate(self.tables(g.TensorsLength(), g.Tensors, "tensors"))
        )
        where = f"subgraph {index}"
        count = len(tensors)
        inputs = self.tensor_refs(g.InputsAsNumpy, count, f"{where} inputs")
        outputs = self.tensor_refs(g.OutputsAsNumpy, count, f"{where} outputs")
        operators = tuple(
            self.operator(op, i, len(tensors), where)
            for i, op in enumerate(self.tables(g.OperatorsLength(), g.Operators, "operators"))
        )
        tensors = _empty_constants(tensors, operators, inputs)
        tensors = _encoded_without_quantization(tensors, operators)
        return Graph(index, self.text(g.Name()), tensors, operators, inputs, outputs)

    def tensor_refs(
        self, vector: Callable[[], Any], count: int, what: str, optional: bool = False,
    ) -> tuple[int, ...]:
        refs = self.ints(vector, what)
        lowest = -1 if optional else 0
        for r in refs:
            if not lowest <= r < count:
                raise self.fail(f"{what} name tensor {r}, but the subgraph has {count} tensors")
        return refs

    def tensor(self, t: Any, index: int) -> Tensor:
        name = self.text(t.Name())
        what = f"tensor {index} ({name!r})"
        dtype = DTYPE_NAMES.get(int(t.Type()))
        if dtype is None:
            raise self.fail(f"{what} has unknown type code {t.Type()}")
        shape = self.ints(t.ShapeAsNumpy, f"{what} shape")
        if any(d < 0 for d in shape):
            raise self.fail(f"{what} has a negative dimension in shape {list(shape)}")
        if math.prod(shape) > MAX_TENSOR_ELEMENTS:  # Python ints: no overflow
            raise self.fail(f"{what} has an absurd shape {list(shape)}")
        signature = (
            None
            if t.ShapeSignatureIsNone()
            else self.ints(t.ShapeSignatureAsNumpy, f"{what} shape signature")
        )
        q = self.fast(t.Quantization())
        self.charge_skipped(t, q, what)
        tensor = Tensor(
            index=index,
            name=name,
            dtype=dtype,
            shape=shape,
            shape_signature=signature,
            quantization=self.quantization(q, what),
            is_variable=bool(t.IsVariable()),
            buffer=int(t.Buffer()),
        )
        raw = self.buffer_view(tensor.buffer, what)
        if raw is None:
            return tensor
        if raw.size != tensor.nbytes and DTYPE_BITS[dtype] > 0:
            raise self.fail(
                f"{what} holds {raw.size} bytes of data, but shape {list(shape)} of {dtype} "
                f"needs {tensor.nbytes}"
            )
        return _with_data(tensor, raw)

    def charge_skipped(self, t: Any, q: Any, what: str) -> None:
        """What the object API reads of a tensor beyond what the IR keeps: quantization (`q`)
        min, max and details, sparsity's vectors, variant tensors (see `model`)."""
        if q is not None:
            self.charge(4 * (int(q.MinLength()) + int(q.MaxLength())), f"{what} min and max")
            if int(q.DetailsType()) == fb.QuantizationDetails.CustomQuantization:
                custom = fb.CustomQuantization()
                custom.Init(q.Details().Bytes, q.Details().Pos)
                self.charge(int(custom.CustomLength()), f"{what} custom quantization")
        sparsity = t.Sparsity()
        if sparsity is not None:
            self.charge(4 * (int(sparsity.TraversalOrderLength()) + int(sparsity.BlockMapLength())
                             + int(sparsity.DimMetadataLength())), f"{what} sparsity")
            for k in range(int(sparsity.DimMetadataLength())):
                dim = sparsity.DimMetadata(k)
                for kind, table in ((dim.ArraySegmentsType(), dim.ArraySegments()),
                                    (dim.ArrayIndicesType(), dim.ArrayIndices())):
                    vector = SPARSE_VECTORS.get(int(kind))
                    if vector is not None and table is not None:
                        values = vector[0]()
                        values.Init(table.Bytes, table.Pos)
                        self.charge(vector[1] * int(values.ValuesLength()), f"{what} sparsity")
        self.charge(4 * int(t.VariantTensorsLength()), f"{what} variant tensors")

    def quantization(self, q: Any, what: str) -> Quantization | None:
        if q is None or q.ScaleLength() == 0:
            return None
        scale = tuple(float(s) for s in self.items(q.ScaleLength(), q.Scale, 4, f"{what} scales"))
        zero_point = tuple(
            int(z) for z in self.items(q.ZeroPointLength(), q.ZeroPoint, 8, f"{what} zero points")
        )
        if len(zero_point) not in (0, len(scale)):
            raise self.fail(f"{what} has {len(scale)} scales but {len(zero_point)} zero points")
        return Quantization(scale, zero_point or (0,) * len(scale), int(q.QuantizedDimension()))

    def operator(self, op: Any, index: int, tensor_count: int, where: str) -> Operator:
        code = int(op.OpcodeIndex())
        if not 0 <= code < len(self.opcodes):
            raise self.fail(
                f"{where} operator {index} uses operator code {code}, "
                f"but the model has {len(self.opcodes)}"
            )
        name, version, custom = self.opcodes[code]
        what = f"{where} operator {index} ({name})"
        inputs = self.tensor_refs(op.InputsAsNumpy, tensor_count, f"{what} inputs", True)
        outputs = self.tensor_refs(op.OutputsAsNumpy, tensor_count, f"{what} outputs")
        self.charge(int(op.MutatingVariableInputsLength()), f"{what} mutating inputs")
        intermediates = self.tensor_refs(op.IntermediatesAsNumpy, tensor_count,
                                         f"{what} intermediates")
        return Operator(
            index=index,
            opcode=name,
            version=version,
            inputs=inputs,
            outputs=outputs,
            options=self.custom_options(op, what) if name == "CUSTOM" else self.options(op, what),
            custom_code=custom,
            intermediates=intermediates,
        )

    def options(self, op: Any, what: str) -> dict[str, Any]:
        """Builtin options as plain values: snake_case keys, enums by name, vectors as tuples
        (charged, as operators sharing one options table would copy its vectors each)."""
        kind, decoded = op.BuiltinOptionsType(), None
        if kind:  # NONE, as most ops of a large graph have: nothing to decode
            decoded = fb.BuiltinOptionsCreator(kind, op.BuiltinOptions())
        if decoded is None and (kind := op.BuiltinOptions2Type()):
            decoded = fb.BuiltinOptions2Creator(kind, op.BuiltinOptions2())
        if decoded is None:
            return {}
        fields = sorted(vars(decoded).items())
        for _, value in fields:
            if isinstance(value, np.ndarray):
                self.charge(value.nbytes, f"{what} options")
            elif isinstance(value, list | bytes | str):
                self.charge(len(value), f"{what} options")
        return {snake_case(k): _plain(k, v) for k, v in fields}

    def custom_options(self, op: Any, what: str) -> dict[str, Any]:
        """A custom op's options, when they are a flexbuffer map (as TFLite Micro's signal ops
        write them): plain values by key. Other bytes are the op's own business and read as no
        options, so that the op is refused by name rather than the file as unreadable; a
        flexbuffer that expands past its own size is refused (_Flexbuffer)."""
        length = int(op.CustomOptionsLength())
        if length <= 0 or op.CustomOptionsFormat() != 0:
            return {}
        self.charge(length, f"{what} custom options")
        raw = op.CustomOptionsAsNumpy().tobytes()
        value = _Flexbuffer(raw, lambda problem: self.fail(f"{what} custom options: {problem}"))
        return {k: _plain(k, v) for k, v in value.top_map().items()}

    def signature(self, s: Any, graphs: tuple[Graph, ...]) -> SignatureDef:
        key = self.text(s.SignatureKey())
        index = int(s.SubgraphIndex())
        if not 0 <= index < len(graphs):
            raise self.fail(
                f"signature {key!r} names subgraph {index}, but there are {len(graphs)}"
            )
        count = len(graphs[index].tensors)

        def names(length: int, get: Callable[[int], Any]) -> dict[str, int]:
            maps = self.tables(length, get, f"signature {key!r}")
            refs = {self.text(m.Name()): int(m.TensorIndex()) for m in maps}
            if any(not 0 <= r < count for r in refs.values()):
                raise self.fail(f"signature {key!r} names a tensor outside subgraph {index}")
            return refs

        return SignatureDef(
            key, index, names(s.InputsLength(), s.Inputs), names(s.OutputsLength(), s.Outputs)
        )


class _Flexbuffer:
    """A flexbuffer read value by value, each charged against the buffer's size.

    flexbuffers.Loads expands every reference it meets: a vector of 4 references to the
    previous vector, 13 levels deep, is 4**13 values from a few hundred bytes. Here each value
    costs one unit, each container its length and each string, key or blob its bytes; a
    flexbuffer that shares nothing spans at least that many bytes, so reading more than its
    size means shared references or false lengths, and the read stops there. (Maps nested in
    a vector of maps that share long keys are charged the keys each time: no TFLite op writes
    them.) Nesting is limited too, so that the walk never meets Python's recursion limit.
    """

    def __init__(self, raw: bytes, fail: Callable[[str], ModelError]):
        self.raw = raw
        self.fail = fail
        self.unread = len(raw)

    def top_map(self) -> dict[str, Any]:
        """The root map by key; bytes that are no flexbuffer map read as no options."""
        try:
            root = flexbuffers.GetRoot(self.raw)
            return self.map(root.AsMap, 1) if root.IsMap else {}
        except ModelError:
            raise
        except Exception:  # not a flexbuffer: no options this toolchain can read
            return {}

    def charge(self, units: int) -> None:
        self.unread -= units
        if self.unread < 0:
            raise self.fail(f"the {len(self.raw)}-byte flexbuffer declares more values than it "
                            "holds (shared references or false lengths)")

    def map(self, entries: flexbuffers.Map, depth: int) -> dict[str, Any]:
        self.charge(len(entries))
        keys, values = entries.Keys, entries.Values
        return {self.text(keys[i]): self.value(values[i], depth) for i in range(len(entries))}

    def value(self, ref: flexbuffers.Ref, depth: int) -> Any:
        self.charge(1)
        if ref.IsVector or ref.IsTypedVector or ref.IsFixedTypedVector:  # IsVector: maps too
            if depth >= MAX_OPTIONS_DEPTH:
                raise self.fail(f"the flexbuffer nests deeper than {MAX_OPTIONS_DEPTH} levels")
            if ref.IsMap:
                return self.map(ref.AsMap, depth + 1)
            return self.vector(ref, depth + 1)
        if ref.IsBlob:
            blob = ref.AsBlob
            self.charge(len(blob))
            return blob
        if ref.IsString or ref.IsKey:
            return self.text(ref)
        return ref.Value  # an inline scalar: null, bool, int or float

    def vector(self, ref: flexbuffers.Ref, depth: int) -> tuple[Any, ...]:
        if ref.IsVector:
            elements = ref.AsVector
        elif ref.IsTypedVector:
            elements = ref.AsTypedVector
        else:
            elements = ref.AsFixedTypedVector
        self.charge(len(elements))
        if not ref.IsVector and elements.ElementType is not flexbuffers.Type.KEY:
            return tuple(elements.Value)  # numbers, unpacked at once (strings read as keys)
        return tuple(self.value(elements[i], depth) for i in range(len(elements)))

    def text(self, ref: flexbuffers.Ref) -> str:
        """A string or key; a key ends at its first zero, found by a scan of at most the
        buffer, which the charge after it then stops."""
        raw = ref.AsStringBytes
        self.charge(len(raw))
        return raw.decode("utf-8", errors="replace")


def _plain(field: str, value: Any) -> Any:
    if field in OPTION_ENUMS and isinstance(value, int):
        return OPTION_ENUMS[field].get(value, value)
    if isinstance(value, np.ndarray):
        return tuple(value.tolist())
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def _empty_constants(tensors: tuple[Tensor, ...], operators: tuple[Operator, ...],
                     inputs: tuple[int, ...]) -> tuple[Tensor, ...]:
    """A tensor of no elements that no operator writes and no caller fills is a constant with
    no bytes (the converter writes such shape operands, e.g. a RESHAPE to a scalar): its
    buffer is empty because there is nothing to hold, not because it is computed."""
    written = {t for op in operators for t in op.outputs} | set(inputs)
    nothing = np.zeros(0, np.uint8)
    nothing.flags.writeable = False  # read-only like every other constant's view
    return tuple(
        _with_data(t, nothing)
        if t.data is None and t.num_elements == 0 and not t.is_variable and not t.is_handle
        and t.index not in written and DTYPE_BITS[t.dtype] > 0
        else t
        for t in tensors
    )


# TFLite Micro's compressed-tensor decoding: inputs (encoded bytes, ancillary data) in pairs.
TFLM_DECODE = "TFLM_DECODE"


def _encoded_without_quantization(tensors: tuple[Tensor, ...],
                                  operators: tuple[Operator, ...]) -> tuple[Tensor, ...]:
    """TFLite Micro's compressor rewrites a tensor as its encoded bytes (uint8, one dimension)
    and leaves it the original's quantization, which TFLM_DECODE never reads (the decoded
    tensor carries its own): dropped here, since its per-channel scales no longer fit."""
    encoded = {op.inputs[k] for op in operators if op.kind == TFLM_DECODE
               for k in range(0, len(op.inputs), 2) if op.inputs[k] >= 0}
    return tuple(replace(t, quantization=None) if t.index in encoded and t.dtype == "uint8"
                 else t for t in tensors)


def _with_data(tensor: Tensor, raw: np.ndarray) -> Tensor:
    """Attach constant data as a read-only view in the tensor's own dtype and shape."""
    if DTYPE_BITS[tensor.dtype] % 8 or tensor.dtype not in np.sctypeDict:
        return replace(tensor, data=raw)  # packed or non-numpy types stay raw bytes
    view = raw.view(np.dtype(tensor.dtype).newbyteorder("<")).reshape(tensor.shape)
    return replace(tensor, data=view)
