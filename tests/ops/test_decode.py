"""TFLM_DECODE (toolchain/ops/decode), TFLite Micro's compressed tensors, against TFLite Micro
(LiteRT has no such op): models compressed by TFLite Micro's own compressor (lookup tables, per
tensor and per channel, every index width), and pruned and Huffman-coded tensors written here
by the format TFLite Micro's decoders read (its compressor writes lookup tables only). Every
output of runtime_py and the sanitized C equals TFLite Micro's, bit for bit."""

from __future__ import annotations

import heapq
import json
import warnings

import numpy as np
import pytest

from tests.opcheck import refusal
from toolchain.cli import main
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lower.plan import plan_model

compression = pytest.importorskip("tflite_micro.tensorflow.lite.micro.compression.compress")
spec = pytest.importorskip("tflite_micro.tensorflow.lite.micro.compression.spec")

OP = "TFLM_DECODE"


def weights(shape: tuple[int, ...], distinct: int, dtype: str, seed: int) -> np.ndarray:
    """Weights drawn from `distinct` values, as a clustered model's are."""
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        levels = rng.standard_normal(distinct).astype(np.float32)
    else:
        info = np.iinfo(dtype)
        levels = rng.choice(np.arange(info.min, info.max + 1), distinct, replace=False)
    return levels[rng.integers(0, distinct, shape)].astype(dtype)


def fully_connected(dtype: str, per_channel: bool, distinct: int, seed: int = 0) -> tuple:
    """(builder, filter tensor): int8 FC 6 x 8 (per-channel scales if asked), or float."""
    b = ModelBuilder()
    units, depth = 6, 8
    if dtype == "float32":
        x = b.input("x", (1, depth), "float32")
        w = b.const("w", weights((units, depth), distinct, "float32", seed))
        bias = b.const("bias", np.linspace(-1, 1, units).astype(np.float32))
        y = b.tensor("y", (1, units), "float32")
    else:
        x = b.input("x", (1, depth), "int8", 0.05, 3)
        scales = np.linspace(0.01, 0.03, units) if per_channel else 0.02
        w = b.const("w", weights((units, depth), distinct, "int8", seed), scales, 0)
        bias = b.const("bias", np.arange(units, dtype=np.int32) * 40 - 100,
                       0.05 * np.asarray(scales), 0)
        y = b.tensor("y", (1, units), "int8", 0.1, -5)
    b.op("FULLY_CONNECTED", [x, w, bias], [y])
    b.output(y)
    return b, w


def depthwise(distinct: int, seed: int = 0) -> tuple:
    """int8 depthwise 3x3 over 5 channels, per-channel scales along the last dimension."""
    b = ModelBuilder()
    x = b.input("x", (1, 5, 5, 5), "int8", 0.05, 0)
    scales = np.linspace(0.01, 0.02, 5)
    w = b.const("w", weights((1, 3, 3, 5), distinct, "int8", seed), scales, 0, 3)
    bias = b.const("bias", np.zeros(5, np.int32), 0.05 * scales, 0)
    y = b.tensor("y", (1, 5, 5, 5), "int8", 0.1, 0)
    b.op("DEPTHWISE_CONV_2D", [x, w, bias], [y], {"padding": "SAME", "stride_h": 1,
                                                  "stride_w": 1, "depth_multiplier": 1})
    b.output(y)
    return b, w


def compressed(model: bytes, tensor: int, width: int, per_channel_axis: int | None) -> bytes:
    """The model with `tensor` compressed into a lookup table by TFLite Micro's compressor."""
    mode = spec.PerTensor() if per_channel_axis is None else spec.PerChannel(per_channel_axis)
    specs = [spec.Tensor(subgraph=0, tensor=tensor,
                         compression=[spec.LookUpTableCompression(index_bitwidth=width,
                                                                  mode=mode)])]
    with warnings.catch_warnings():  # a small tensor's tables outweigh what they save
        warnings.simplefilter("ignore", UserWarning)
        return bytes(compression.compress(model, specs))


def checks_against_tflm(model: bytes, tmp_path, capsys) -> dict:
    path = tmp_path / "compressed.tflite"
    path.write_bytes(model)
    code = main(["check", str(path), "--sanitize", "--inputs", "3", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err + out
    report = json.loads(out)
    assert report["ok"] and report["backends"][0] == "tflm", report
    return report


def decode_ops(model: bytes) -> list:
    return [op for op in parse_model(model, "m").main.operators if op.kind == OP]


LOOKUP_CASES = {
    "int8 per channel, 2 bits": ("int8", True, 4, 2),
    "int8 per channel, 3 bits": ("int8", True, 7, 3),
    "int8 per tensor, 1 bit": ("int8", False, 2, 1),
    "int8 per tensor, 5 bits": ("int8", False, 20, 5),
    "int8 per tensor, 7 bits": ("int8", False, 90, 7),
    "float per tensor, 4 bits": ("float32", False, 16, 4),
}


@pytest.mark.parametrize("name", LOOKUP_CASES)
def test_lookup_table_compression_matches_tflite_micro(name, tmp_path, capsys):
    dtype, per_channel, distinct, width = LOOKUP_CASES[name]
    b, w = fully_connected(dtype, per_channel, distinct)
    model = compressed(b.build(), w, width, 0 if per_channel else None)
    assert len(decode_ops(model)) == 1
    checks_against_tflm(model, tmp_path, capsys)


def test_depthwise_filter_per_channel_along_the_last_dimension(tmp_path, capsys):
    b, w = depthwise(distinct=6)
    model = compressed(b.build(), w, 3, 3)
    checks_against_tflm(model, tmp_path, capsys)


def test_decoded_filter_is_a_constant_and_the_op_has_no_step():
    b, w = fully_connected("int8", True, 4)
    original = b.build()
    model = compressed(original, w, 2, 0)
    mp = plan_model(parse_model(model, "m"))
    (fold,) = mp.program.folds
    assert fold.kinds == ("lookup table",)
    decoded = mp.graph.tensors[fold.tensors[0]]
    expected = parse_model(original, "m").main.tensors[w].data
    assert np.array_equal(decoded.data, expected)
    assert decoded.is_constant and decoded.index not in mp.offset_of_tensor()


# -- pruning and Huffman, written here as TFLite Micro's decoders read them ------------------

def header(kind: int, parameter5: int = 0, parameter6: int = 0) -> bytes:
    return bytes([kind, 1, 0, 0, 1, parameter5, parameter6]) + bytes(9)


def pruned(values: np.ndarray, zero_points: np.ndarray, channel: np.ndarray) -> tuple:
    """(encoded, ancillary): a bit per value, 1 where it differs from its channel's zero point,
    and the kept values after the header."""
    flat = values.reshape(-1)
    kept = flat != zero_points[channel]
    return (np.packbits(kept.astype(np.uint8)),
            np.frombuffer(header(2) + flat[kept].astype(flat.dtype.newbyteorder("<")).tobytes(),
                          np.uint8))


def huffman_lengths(values: np.ndarray) -> dict[int, int]:
    """Code length per value, from the values' counts (Huffman's merging, ties by value)."""
    symbols, counts = np.unique(values, return_counts=True)
    if len(symbols) == 1:
        return {int(symbols[0]): 1}
    heap = [(int(c), k, (int(s),)) for k, (s, c) in enumerate(zip(symbols, counts, strict=True))]
    heapq.heapify(heap)
    depth = {int(s): 0 for s in symbols}
    order = len(heap)
    while len(heap) > 1:
        c1, _, a = heapq.heappop(heap)
        c2, _, b = heapq.heappop(heap)
        for s in a + b:
            depth[s] += 1
        heapq.heappush(heap, (c1 + c2, order, a + b))
        order += 1
    return depth


def huffman(values: np.ndarray, first: int, wide: bool) -> tuple:
    """(encoded, ancillary): canonical codes, a first-level table of 2^first entries and, for
    codes longer than that, one second-level table per prefix (pointer entries hold the offset
    to it and one less than the bits it reads)."""
    flat = values.reshape(-1).astype(np.int64)
    lengths = huffman_lengths(flat)
    code, previous, codes = 0, 0, {}
    for symbol in sorted(lengths, key=lambda s: (lengths[s], s)):  # canonical order
        code <<= lengths[symbol] - previous
        codes[symbol] = (code, lengths[symbol])
        previous = lengths[symbol]
        code += 1
    found, count_shift, bits = (1 << 31, 27, 32) if wide else (1 << 15, 11, 16)

    def entry(count: int, symbol: int) -> int:
        return found | count << count_shift | (symbol & ((1 << (8 if bits == 16 else 16)) - 1))

    table = [0] * (1 << first)
    longer: dict[int, list[int]] = {}
    for symbol, (code, length) in codes.items():
        if length <= first:
            start = code << (first - length)
            for k in range(1 << (first - length)):
                table[start + k] = entry(length, symbol)
        else:
            longer.setdefault(code >> (length - first), []).append(symbol)
    for prefix, symbols in sorted(longer.items()):
        width = max(codes[s][1] for s in symbols) - first
        base = len(table)
        table[prefix] = (width - 1) << count_shift | (base - prefix)
        table += [0] * (1 << width)
        for symbol in symbols:
            code, length = codes[symbol]
            suffix, own = code & ((1 << (length - first)) - 1), length - first
            start = base + (suffix << (width - own))
            for k in range(1 << (width - own)):
                table[start + k] = entry(own, symbol)
    stream = "".join(format(codes[int(v)][0], f"0{codes[int(v)][1]}b") for v in flat)
    stream += "0" * (-len(stream) % 32 + 32)  # whole words, and one more the decoder may peek
    encoded = np.packbits(np.array([int(c) for c in stream], np.uint8))
    entries = np.array(table, "<u4" if wide else "<u2")
    ancillary = header(1, (first - 1) << 4 | int(wide)) + entries.tobytes()
    return encoded, np.frombuffer(ancillary, np.uint8)


def with_decode(values: np.ndarray, encode, quantized: tuple = (None, None, 0),
                output: bool = False) -> bytes:
    """A model whose FC filter (or, `output`, a graph output) is `values` decoded by
    TFLM_DECODE from what `encode(values)` gives."""
    b = ModelBuilder()
    units, depth = values.shape
    encoded, ancillary = encode(values)
    enc = b.const("w_encoded", np.asarray(encoded, np.uint8))
    anc = b.const("w_ancillary", np.asarray(ancillary, np.uint8))
    w = b.tensor("w", values.shape, str(values.dtype), *quantized[:2])
    if quantized[0] is not None and np.ndim(quantized[0]):
        b._tensors[w].quantization.quantizedDimension = quantized[2]
    if output:
        x = b.input("x", (1,), "float32")
        b.custom(OP, [enc, anc], [w])
        b.output(w)
        b.output(x)
        return b.build()
    b.custom(OP, [enc, anc], [w])
    if values.dtype == np.float32:
        x = b.input("x", (1, depth), "float32")
        y = b.tensor("y", (1, units), "float32")
    else:
        x = b.input("x", (1, depth), "int8", 0.05, 3)
        y = b.tensor("y", (1, units), "int8", 0.1, 0)
    b.op("FULLY_CONNECTED", [x, w, -1], [y])
    b.output(y)
    return b.build()


def channel_of(shape: tuple[int, ...], channels: int) -> np.ndarray:
    count = int(np.prod(shape))
    return np.arange(count) // (count // channels) if channels > 1 else np.zeros(count, int)


@pytest.mark.parametrize("case", ["int8 per tensor", "int8 per channel zero points", "float"])
def test_pruned_tensors_match_tflite_micro(case, tmp_path, capsys):
    rng = np.random.default_rng(3)
    if case == "float":
        values = np.where(rng.random((6, 8)) < 0.5, 0, rng.standard_normal((6, 8))) \
            .astype(np.float32)
        quantized, zero_points, channels = (None, None, 0), np.zeros(1), 1
    elif case == "int8 per tensor":
        values = np.where(rng.random((6, 8)) < 0.6, 0, rng.integers(-127, 128, (6, 8))) \
            .astype(np.int8)
        quantized, zero_points, channels = (0.02, 0, 0), np.zeros(1), 1
    else:  # a per-channel filter's zero points are zeros: this one is a graph output
        zero_points = np.array([0, -3, 5, 0, 2, -1])
        values = rng.integers(-127, 128, (6, 8))
        values = np.where(rng.random((6, 8)) < 0.5, zero_points[:, None], values).astype(np.int8)
        quantized, channels = (np.linspace(0.01, 0.02, 6), zero_points, 0), 6
    channel = channel_of(values.shape, channels)
    model = with_decode(values, lambda v: pruned(v, np.asarray(zero_points), channel),
                        quantized, output=channels > 1)
    checks_against_tflm(model, tmp_path, capsys)


@pytest.mark.parametrize("first, wide, distinct", [(2, False, 5), (3, False, 12), (4, True, 30)])
def test_huffman_tensors_match_tflite_micro(first, wide, distinct, tmp_path, capsys):
    rng = np.random.default_rng(first)
    levels = rng.choice(np.arange(-128, 128), distinct, replace=False)
    skewed = rng.geometric(0.35, (6, 8)) % distinct  # some values far more often than others
    values = levels[skewed].astype(np.int8)
    model = with_decode(values, lambda v: huffman(v, first, wide), (0.02, 0, 0))
    assert max(huffman_lengths(values.reshape(-1)).values()) > first  # two levels of tables
    checks_against_tflm(model, tmp_path, capsys)


def test_a_decoded_graph_output_is_copied_by_the_kernel(tmp_path, capsys):
    values = np.random.default_rng(2).integers(-100, 100, (3, 4)).astype(np.int8)
    model = with_decode(values, lambda v: pruned(v, np.zeros(1), channel_of(v.shape, 1)),
                        (0.02, 0, 0), output=True)
    assert plan_model(parse_model(model, "m")).program.folds == ()
    report = checks_against_tflm(model, tmp_path, capsys)
    assert report["ok"]


@pytest.mark.parametrize("change, reason", [
    (lambda a: a.__setitem__(1, 2), "header version 2"),
    (lambda a: a.__setitem__(0, 9), "decode type 9"),
    (lambda a: a.__setitem__(4, 3), "version 3"),
])
def test_a_header_tflite_micro_would_not_read_is_refused(change, reason):
    values = np.arange(12, dtype=np.int8).reshape(3, 4)

    def encode(v):
        encoded, ancillary = pruned(v, np.zeros(1), channel_of(v.shape, 1))
        ancillary = ancillary.copy()
        change(ancillary)
        return encoded, ancillary

    assert reason in refusal(with_decode(values, encode, (0.02, 0, 0)))


def test_the_compressors_uint8_table_is_refused_as_tflite_micro_refuses_it():
    b = ModelBuilder()
    x = b.input("x", (2, 4), "uint8", 0.1, 128)
    c = b.const("c", np.array([[1, 2, 1, 2], [3, 1, 3, 3]], np.uint8), 0.1, 128)
    y = b.tensor("y", (2, 4), "uint8", 0.1, 128)
    b.op("ADD", [x, c], [y])
    b.output(y)
    model = compressed(b.build(), c, 2, None)
    assert "TFLM_DECODE" in refusal(model) or "uint8" in refusal(model)


def test_the_encoded_tensor_keeps_no_stale_quantization():
    """The compressor leaves the filter's per-channel scales on its encoded bytes: the reader
    drops them instead of refusing the model for a scale count that no longer fits."""
    b, w = fully_connected("int8", True, 4)
    model = compressed(b.build(), w, 2, 0)
    graph = parse_model(model, "m").main
    (op,) = decode_ops(model)
    assert graph.tensors[op.inputs[0]].quantization is None
    assert graph.tensors[op.outputs[0]].quantization is not None
