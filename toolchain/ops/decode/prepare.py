"""TFLM_DECODE, TFLite Micro's compressed tensors: each pair of inputs (encoded bytes, ancillary
data) decodes into one output, as TFLite Micro's decode kernel computes it every invoke.

The ancillary data starts with a 16-byte header: byte 0 the decode type (0 lookup table,
1 Huffman, 2 pruning), byte 1 the header's version (1), byte 4 the type's version (1), bytes
5-15 the type's parameters; its tables follow from byte 16, little-endian, in the output's
element type.

- Lookup table: byte 5's low three bits are the index width w (1-7), byte 6 the values per
  channel's table. The encoded bytes are one stream of w-bit indices, the most significant bit
  first; value i is its channel's table at index i.
- Pruning: the encoded bytes hold one bit per value (most significant first), 1 where a value
  is kept; the kept values follow the header in order, the others are the zero point (per
  channel for an int8 tensor with several, else the first, or 0 unquantized).
- Huffman: byte 5's bit 0 says 32-bit table entries (else 16-bit), its high four bits are one
  less than the first-level table's width in bits. Codes are read most significant bit first; an
  entry with its top bit set is a value (its low bits) and says how many of the bits just read
  belong to its code; one without points to a further table (its offset from the entry, and one
  less than the bits to read there).

Channels follow the output's quantization alone, as TFLite Micro's: one per scale, along
dimension 0, or along the last dimension when the quantized dimension is that one.

The inputs are constants, so every output is decoded here, once: toolchain.lower.folding
makes each decoded tensor a constant for its readers (whose prepares need constant weights),
and the op then has no work. An output the graph returns is written by the invoke: the op's
kernel copies its decoded values there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import Graph, Operator, Tensor

HEADER_BYTES = 16
LOOKUP_TABLE, HUFFMAN, PRUNE = 0, 1, 2
# Output types each decoder writes (TFLite Micro's `unsupported tensor type` for others).
DECODED_DTYPES = {
    LOOKUP_TABLE: ("bool", "float32", "int8", "int16", "int32", "int64"),
    PRUNE: ("bool", "float32", "int8", "int16", "int32", "int64"),
    HUFFMAN: ("int8", "int16"),
}
NAMES = {LOOKUP_TABLE: "lookup table", HUFFMAN: "Huffman", PRUNE: "pruning"}


@dataclass(frozen=True)
class DecodeParams:
    """The decoded value of each output, and how each was compressed: what the kernel writes
    when an output is the graph's (toolchain.lower.folding folds every other)."""

    values: tuple[np.ndarray, ...]
    kinds: tuple[str, ...]


def decode_pairs(graph: Graph, op: Operator) -> tuple[tuple[np.ndarray, str], ...]:
    """Each output's decoded values (in its dtype and shape) and its decode type's name."""
    if not op.outputs or len(op.inputs) != 2 * len(op.outputs):
        raise ModelError(f"has {len(op.inputs)} inputs for {len(op.outputs)} outputs "
                         "(TFLM_DECODE takes an encoded and an ancillary tensor per output)")
    decoded = []
    for k, t in enumerate(op.outputs):
        encoded, ancillary = (graph.tensors[i] if i >= 0 else None
                              for i in op.inputs[2 * k:2 * k + 2])
        out = graph.tensors[t]
        for role, tensor in (("encoded", encoded), ("ancillary", ancillary)):
            if tensor is None or not tensor.is_constant or tensor.dtype not in ("uint8", "int8"):
                raise ModelError(f"output {k}: the {role} input is not a constant of bytes "
                                 "(TFLite Micro requires one)")
        decoded.append(_decode(_bytes(encoded), _bytes(ancillary), out, f"output {k} "
                                                                         f"({out.name!r})"))
    return tuple(decoded)


def prepare_decode(graph: Graph, op: Operator) -> DecodeParams:
    pairs = decode_pairs(graph, op)
    return DecodeParams(tuple(values for values, _ in pairs), tuple(kind for _, kind in pairs))


def _bytes(t: Tensor) -> np.ndarray:
    return np.asarray(t.data).reshape(-1).view(np.uint8)


def _decode(encoded: np.ndarray, ancillary: np.ndarray, out: Tensor,
            what: str) -> tuple[np.ndarray, str]:
    if ancillary.size < HEADER_BYTES:
        raise ModelError(f"{what}: the ancillary data holds {ancillary.size} bytes, less than "
                         f"its {HEADER_BYTES}-byte header")
    kind, version, kind_version = int(ancillary[0]), int(ancillary[1]), int(ancillary[4])
    if version != 1:
        raise UnsupportedOpError(f"{what}: decode header version {version} (TFLite Micro reads 1)")
    if kind not in DECODED_DTYPES:
        raise UnsupportedOpError(f"{what}: decode type {kind} (TFLite Micro decodes 0 lookup "
                                 "table, 1 Huffman, 2 pruning)")
    if kind_version != 1:
        raise UnsupportedOpError(f"{what}: {NAMES[kind]} version {kind_version} (TFLite Micro "
                                 "reads 1)")
    if out.dtype not in DECODED_DTYPES[kind]:
        raise UnsupportedOpError(f"{what}: {NAMES[kind]} decoding into {out.dtype} (TFLite "
                                 f"Micro decodes into {', '.join(DECODED_DTYPES[kind])})")
    dtype = np.dtype(out.dtype).newbyteorder("<")
    tables = ancillary[HEADER_BYTES:]
    count = out.num_elements
    decoder = {LOOKUP_TABLE: _lookup_table, PRUNE: _pruned, HUFFMAN: _huffman}[kind]
    values = decoder(encoded, ancillary, tables, out, dtype, count, what)
    values = values.astype(np.dtype(out.dtype)).reshape(out.shape)
    values.flags.writeable = False
    return values, NAMES[kind]


def _channels(out: Tensor, count: int, what: str) -> np.ndarray:
    """The channel of each flat element, as TFLite Micro's decoders find it."""
    q = out.quantization
    channels = len(q.scale) if q is not None else 1
    if channels <= 1:
        return np.zeros(count, np.int64)
    rank = len(out.shape)
    if q.quantized_dimension == rank - 1:
        return np.arange(count) % channels
    if q.quantized_dimension != 0:
        raise UnsupportedOpError(f"{what}: channels along dimension {q.quantized_dimension} "
                                 "(TFLite Micro decodes along the first or the last)")
    return np.arange(count) // (count // channels)


def _bits(encoded: np.ndarray, width: int, count: int, what: str) -> np.ndarray:
    """`count` unsigned fields of `width` bits, most significant bit first."""
    if encoded.size * 8 < width * count:
        raise ModelError(f"{what}: {encoded.size} encoded bytes hold fewer than {count} "
                         f"{width}-bit fields")
    bits = np.unpackbits(encoded)[:width * count].reshape(count, width).astype(np.int64)
    return bits @ (1 << np.arange(width - 1, -1, -1, dtype=np.int64))


def _table(tables: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    usable = tables.size - tables.size % dtype.itemsize
    return tables[:usable].view(dtype)


def _lookup_table(encoded, ancillary, tables, out, dtype, count, what) -> np.ndarray:
    width, stride = int(ancillary[5]) & 7, int(ancillary[6])
    if not 1 <= width <= 7:
        raise ModelError(f"{what}: lookup table index width {width} (1 to 7)")
    table = _table(tables, dtype, what)
    positions = _channels(out, count, what) * stride + _bits(encoded, width, count, what)
    if positions.size and positions.max() >= table.size:
        raise ModelError(f"{what}: an index reaches past the {table.size} values of its tables")
    return table[positions]


def _pruned(encoded, ancillary, tables, out, dtype, count, what) -> np.ndarray:
    kept = _bits(encoded, 1, count, what).astype(bool)
    values = _table(tables, dtype, what)
    if values.size < kept.sum():
        raise ModelError(f"{what}: {int(kept.sum())} values kept, {values.size} given")
    q = out.quantization
    zero_points = np.asarray(q.zero_point if q is not None and q.zero_point else (0,), np.int64)
    if out.dtype == "int8" and len(zero_points) > 1 and zero_points.any():
        fill = zero_points[_channels(out, count, what)]
    elif out.dtype != "int8" and zero_points.any():
        raise UnsupportedOpError(f"{what}: pruned {out.dtype} with nonzero zero points "
                                 "(TFLite Micro requires zeros)")
    else:
        fill = np.full(count, zero_points[0])
    result = fill.astype(dtype) if dtype.kind != "b" else fill.astype(bool)
    result[kept] = values[:int(kept.sum())]
    return result


def _huffman(encoded, ancillary, tables, out, dtype, count, what) -> np.ndarray:
    wide = bool(ancillary[5] & 1)
    first = (int(ancillary[5]) >> 4) + 1
    if out.dtype == "int16" and not wide:
        raise UnsupportedOpError(f"{what}: int16 Huffman with 16-bit table entries (TFLite "
                                 "Micro requires 32-bit ones)")
    entries = _table(tables, np.dtype("<u4" if wide else "<u2"), what).astype(np.int64)
    found, count_shift, value_mask = ((1 << 31, 27, (1 << 27) - 1) if wide
                                      else (1 << 15, 11, (1 << 11) - 1))
    stream = np.unpackbits(encoded)
    position = 0

    def take(n: int) -> int:
        nonlocal position
        field = stream[position:position + n]
        position += n
        value = 0
        for bit in field:
            value = value << 1 | int(bit)
        return value << (n - len(field))  # past the end reads zeros, as its padding

    symbols = np.empty(count, np.int64)
    for i in range(count):
        used = first
        offset = take(first)
        while True:
            if offset >= entries.size:
                raise ModelError(f"{what}: a code points past the {entries.size} table entries")
            entry = int(entries[offset])
            if entry & found:
                break
            used = ((entry >> count_shift) & 15) + 1
            offset += (entry & value_mask) + take(used)
        length = (entry >> count_shift) & 15
        position -= used - length if used > length else 0
        if position > stream.size:
            raise ModelError(f"{what}: the encoded bits end before value {i} of {count}")
        symbols[i] = entry
    bits = 8 * dtype.itemsize
    low = symbols & ((1 << bits) - 1)
    return np.where(low >= 1 << (bits - 1), low - (1 << bits), low)
