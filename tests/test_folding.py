"""Constants folded at generation (toolchain/lower/folding.py): a DEQUANTIZE of float16 weights
becomes their float32 constant in flash, bit for bit what LiteRT's DEQUANTIZE gives."""

from __future__ import annotations

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import three_ways
from toolchain.c.generate import generate
from toolchain.errors import UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab import qemu_backend
from toolchain.lab.check import random_inputs
from toolchain.lower.folding import Fold
from toolchain.lower.plan import plan_model


def float16_model(as_output: bool = False) -> tuple[bytes, int]:
    """x + W with W stored as float16 and widened by DEQUANTIZE, as the converter's float16
    quantization writes weights (an ADD, exact in float32, shows every widened value bit for
    bit); returns the model and the widened tensor's index."""
    rng = np.random.default_rng(7)
    b = ModelBuilder()
    x = b.input("x", (2, 9), "float32")
    # values float16 rounds: the widening must give exactly float16's values, not the originals
    w16 = b.const("w_f16", (rng.standard_normal((2, 9)) / 3).astype(np.float16))
    w = b.tensor("w", (2, 9), "float32")
    b.op("DEQUANTIZE", [w16], [w])
    y = b.tensor("y", (2, 9), "float32")
    b.op("ADD", [x, w], [y])
    b.output(w if as_output else y)
    return b.build(), w


def test_float16_weights_are_folded_into_float32_constants():
    model, widened = float16_model()
    x = np.random.default_rng(1).standard_normal((2, 9)).astype(np.float32)
    out = three_ways(model, [x])
    mp = plan_model(parse_model(model, "f16.tflite"))
    (fold,) = mp.program.folds
    assert fold == Fold(0, widened, 1)
    assert widened not in mp.offset_of_tensor()  # a constant: flash, no arena
    w = mp.graph.tensors[widened]
    source = mp.graph.tensors[1].data
    assert w.data.dtype == np.float32 and np.array_equal(w.data, source.astype(np.float32))
    assert np.array_equal(out, x + source.astype(np.float32))
    c = generate(mp)["model.c"]
    assert "folded: 'w' is the float32 constant it computes from float16 'w_f16'" in c


def test_a_float16_dequantize_whose_output_is_a_graph_output_is_not_folded():
    model, _ = float16_model(as_output=True)
    with pytest.raises(UnsupportedOpError, match="float16"):
        plan_model(parse_model(model, "f16.tflite")).program.params()


def packed_int4(values: np.ndarray) -> np.ndarray:
    """int4 values two to a byte, the low nibble first (an odd count leaves a high nibble 0)."""
    flat = np.append(values.reshape(-1), 0) if values.size % 2 else values.reshape(-1)
    return ((flat[0::2] & 0xF) | ((flat[1::2] & 0xF) << 4)).astype(np.uint8)


def int4_filter(b: ModelBuilder, shape: tuple[int, ...], channels: int, axis: int,
                seed: int) -> tuple[int, np.ndarray]:
    from toolchain.front.builder import _quantization

    values = np.random.default_rng(seed).integers(-8, 8, shape).astype(np.int8)
    scales = np.random.default_rng(seed + 1).uniform(0.01, 0.05, channels)
    buffer = b._add_buffer(packed_int4(values))
    return b._add_tensor("w_int4", shape, "int4", _quantization(scales, 0, axis),
                         buffer=buffer), values


def int4_model(opcode: str) -> tuple[bytes, int, np.ndarray]:
    """A one-op model whose filter is int4: (model, filter tensor, its values)."""
    b = ModelBuilder()
    if opcode == "FULLY_CONNECTED":
        x = b.input("x", (2, 9), "int8", 0.05, 3)
        w, values = int4_filter(b, (5, 9), 5, 0, 1)  # an odd count: the last nibble is padding
        out_shape, options = (2, 5), {}
    elif opcode == "CONV_2D":
        x = b.input("x", (1, 6, 6, 3), "int8", 0.05, 3)
        w, values = int4_filter(b, (4, 3, 3, 3), 4, 0, 2)
        out_shape, options = (1, 4, 4, 4), {"padding": "VALID", "stride_w": 1, "stride_h": 1}
    else:
        x = b.input("x", (1, 6, 6, 4), "int8", 0.05, 3)
        w, values = int4_filter(b, (1, 3, 3, 4), 4, 3, 3)
        out_shape, options = (1, 4, 4, 4), {"padding": "VALID", "depth_multiplier": 1,
                                            "stride_w": 1, "stride_h": 1}
    bias = b.const("bias", np.zeros(out_shape[-1], np.int32), 1e-3, 0)
    y = b.tensor("y", out_shape, "int8", 0.1, -2)
    b.op(opcode, [x, w, bias], [y], options)
    b.output(y)
    return b.build(), w, values


@pytest.mark.parametrize("opcode", ["FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D"])
def test_int4_filters_run_as_the_int8_filters_they_unpack_to(opcode):
    from tests.opcheck import assert_matches_oracle

    model, w, values = int4_model(opcode)
    assert_matches_oracle(model, sanitize=True)
    mp = plan_model(parse_model(model, "int4.tflite"))
    filter_ = mp.graph.tensors[w]
    assert filter_.dtype == "int8" and np.array_equal(filter_.data, values)


@pytest.mark.parametrize("opcode", ["FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D"])
def test_int4_filters_stay_packed_in_flash_and_unpack_into_the_arena(opcode):
    model, w, values = int4_model(opcode)
    mp = plan_model(parse_model(model, "int4.tflite"))
    (unpack,) = mp.program.int4_unpacks.values()
    assert unpack[0] == w and len(unpack[1]) == -(-values.size // 2)
    (request,) = [r for r, _ in mp.scratch_offsets() if "int4" in r.purpose]
    assert request.size == values.size
    c = generate(mp, "m")["m.c"]
    assert f"static const uint8_t m_t{w}_int4[{len(unpack[1])}]" in c
    assert f"m_t{w}[" not in c  # no int8 copy of the filter in flash
    assert "arenac_unpack_int4((int8_t *)" in c


@pytest.mark.parametrize("opcode", ["FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D"])
def test_int4_filters_on_a_cortex_m4(opcode):
    """Under QEMU: the DSP kernels that lay the filter out for their loops keep that layout,
    the others unpack the packed filter; either way runtime_py's values."""
    if qemu_backend.missing():
        pytest.skip("no Cortex-M toolchain or QEMU")
    model, _, _ = int4_model(opcode)
    mp = plan_model(parse_model(model, "int4.tflite"), target="cortex-m4")
    sets = [random_inputs(mp.graph, seed) for seed in range(2)]
    with qemu_backend.QemuBackend(mp) as backend:
        got = backend.invoke_many(sets)
    want = [ArenaInterpreter(mp).invoke(values) for values in sets]
    assert all(np.array_equal(a, b) for w_, g in zip(want, got, strict=True)
               for a, b in zip(w_, g, strict=True))
