"""FULLY_CONNECTED and BATCH_MATMUL against TFLite's reference kernels: bit-exact for integers,
and bit for bit for the float32 outputs of the hybrid (dynamic-range) kernels. int16
BATCH_MATMUL is in test_batch_matmul_int16.py."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from runtime_py.kernels import KERNELS
from tests.conftest import SHARED_MODELS
from tests.opcheck import assert_matches_oracle, assert_varied, oracle_outputs
from toolchain.errors import UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.check import difference, random_inputs
from toolchain.lab.oracle import LiteRTOracle
from toolchain.numerics.quant import ACTIVATION_FLOAT_RANGE
from toolchain.ops import REGISTRY, prepare_graph

ACTIVATIONS = ("NONE", "RELU", "RELU6", "RELU_N1_TO_1")
# int8 test inputs: uniform over the full range, so their real values have this deviation.
INT8_STD = 256 / math.sqrt(12)
# Output ranges span this many deviations of the (estimated) float result.
SPREAD = 4.0


def output_quantization(std: float, activation: str = "NONE") -> tuple[float, int]:
    """int8 scale and zero point covering +-SPREAD deviations, cut to the activation's range."""
    low, high = ACTIVATION_FLOAT_RANGE[activation]
    low, high = max(-SPREAD * std, low), min(SPREAD * std, high)
    scale = (high - low) / 255
    return scale, round(-128 - low / scale)


def assert_matches_and_varies(model: bytes) -> None:
    """Bit-exact with TFLite, on outputs that take more values than the two clamps, so that the
    comparison can fail."""
    assert_matches_oracle(model)
    for output in oracle_outputs(model):
        assert len(np.unique(output)) > 2, "outputs (nearly) constant: too coarse a scale"


def assert_refused(model: bytes, reason: str) -> None:
    with pytest.raises(UnsupportedOpError, match=reason):
        prepare_graph(parse_model(model, "<built model>").main)


# -- FULLY_CONNECTED -------------------------------------------------------------------------


def fully_connected_model(
    dtype: str,
    input_shape: Sequence[int],
    units: int,
    depth: int | None = None,
    activation: str = "NONE",
    bias: bool = True,
    keep_num_dims: bool = False,
    per_channel: bool = False,
    filter_zero_point: int = 0,
    seed: int = 0,
) -> bytes:
    """One FULLY_CONNECTED; `depth` (default: the input's last dimension) sets the filter rows."""
    rng = np.random.default_rng(seed)
    depth = depth or input_shape[-1]
    batches = math.prod(input_shape) // depth
    out_shape = (*input_shape[:-1], units) if keep_num_dims else (batches, units)
    b = ModelBuilder("float32" if dtype == "uint8" else dtype)
    options = {"fused_activation_function": activation, "keep_num_dims": keep_num_dims}
    if dtype == "float32":
        x = b.input("x", input_shape, "float32")
        weights = b.const("w", rng.normal(0, 1 / math.sqrt(depth), (units, depth)).astype("f4"))
        bias_index = b.const("b", rng.normal(0, 0.5, units).astype("f4")) if bias else -1
        out = b.tensor("y", out_shape, "float32")
    else:
        # uint8 stores the same values 128 higher (the filter's zero point too)
        shift = 128 if dtype == "uint8" else 0
        input_scale, input_zp = 0.05, 7 + shift
        x = b.input("x", input_shape, dtype, input_scale, input_zp)
        q_weights = (rng.integers(-127, 128, (units, depth)) + shift).astype(dtype)
        scale = rng.uniform(0.002, 0.02, units) if per_channel else 0.01
        weights = b.const("w", q_weights, scale, filter_zero_point + shift)
        bias_scale = input_scale * np.asarray(scale)
        q_bias = rng.integers(-3000, 3000, units).astype(np.int32)
        bias_index = b.const("b", q_bias, bias_scale) if bias else -1
        # The accumulator's real deviation: sqrt(depth) input * weight deviations.
        weight_std = float(np.mean(scale)) * INT8_STD
        std = math.sqrt(depth) * input_scale * INT8_STD * weight_std
        out_scale, out_zp = output_quantization(std, activation)
        out = b.tensor("y", out_shape, dtype, out_scale, out_zp + shift)
    b.op(
        "FULLY_CONNECTED",
        [x, weights, bias_index],
        [out],
        options,
        version=4 if dtype == "int8" else 1,
    )
    b.output(out)
    return b.build()


@pytest.mark.parametrize("dtype", ["float32", "int8", "uint8"])
@pytest.mark.parametrize(
    "input_shape, units, depth, keep_num_dims",
    [
        ((1, 8), 4, None, False),
        ((3, 16), 5, None, False),
        ((2, 3, 8), 6, None, False),  # rank 3: batches 2 * 3
        ((2, 3, 8), 6, None, True),  # rank 3, output keeps (2, 3, units)
        ((2, 3, 4), 3, 12, False),  # depth spans dimensions: TFLite flattens to (2, 12)
        ((1, 5, 4, 2), 7, 40, False),  # rank 4 flattened entirely, like micro_speech
    ],
)
def test_fully_connected_shapes(dtype, input_shape, units, depth, keep_num_dims):
    assert_matches_and_varies(
        fully_connected_model(dtype, input_shape, units, depth, keep_num_dims=keep_num_dims)
    )


@pytest.mark.parametrize("dtype", ["float32", "int8", "uint8"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("bias", [True, False])
def test_fully_connected_activations(dtype, activation, bias):
    assert_matches_and_varies(
        fully_connected_model(dtype, (4, 24), 8, activation=activation, bias=bias, seed=1)
    )


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("input_shape, keep_num_dims", [((5, 32), False), ((2, 2, 16), True)])
def test_fully_connected_int8_per_channel(activation, input_shape, keep_num_dims):
    assert_matches_and_varies(
        fully_connected_model(
            "int8",
            input_shape,
            12,
            activation=activation,
            keep_num_dims=keep_num_dims,
            per_channel=True,
            seed=2,
        )
    )


def test_fully_connected_int8_filter_zero_point():
    """Per-tensor filters may be asymmetric: TFLite subtracts their zero point."""
    assert_matches_and_varies(fully_connected_model("int8", (3, 20), 6, filter_zero_point=5))


def test_fully_connected_uint8_filter_zero_point_and_large_depth():
    """Legacy uint8: asymmetric filters, and sums near the double requantization's edges."""
    assert_matches_and_varies(fully_connected_model("uint8", (3, 20), 6, filter_zero_point=-9))
    assert_matches_and_varies(fully_connected_model("uint8", (16, 300), 40, seed=3))


def test_fully_connected_int8_large_depth_rounding():
    """Many sums landing near rounding boundaries of the double-precision requantization."""
    assert_matches_and_varies(fully_connected_model("int8", (16, 300), 40, seed=3))


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_fully_connected_runtime_weights(dtype):
    """Weights that are a model input rather than a constant."""
    b = ModelBuilder(dtype)
    quant = {"float32": ((), (), ()), "int8": ((0.05, 2), (0.01, 0), (0.5, -3))}[dtype]
    x = b.input("x", (3, 10), dtype, *quant[0])
    w = b.input("w", (4, 10), dtype, *quant[1])
    y = b.tensor("y", (3, 4), dtype, *quant[2])
    b.op("FULLY_CONNECTED", [x, w, -1], [y], version=4 if dtype == "int8" else 1)
    b.output(y)
    assert_matches_and_varies(b.build())


def test_fully_connected_refuses_hybrid_with_runtime_weights():
    """Hybrid weights are constants: TFLite quantizes only the input as it runs."""
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    w = b.input("w", (2, 4), "int8", 0.1, 0)
    y = b.tensor("y", (1, 2), "float32")
    b.op("FULLY_CONNECTED", [x, w, -1], [y])
    b.output(y)
    assert_refused(b.build(), "quantized constant")


def test_fully_connected_refuses_non_clamping_activation():
    assert_refused(fully_connected_model("float32", (1, 4), 2, activation="TANH"), "TANH")


def test_fully_connected_refuses_mismatched_bias_scale():
    b = ModelBuilder("int8")
    x = b.input("x", (1, 4), "int8", 0.05, 0)
    w = b.const("w", np.ones((2, 4), np.int8), 0.01, 0)
    bias = b.const("b", np.zeros(2, np.int32), 0.5)  # should be 0.05 * 0.01
    y = b.tensor("y", (1, 2), "int8", 0.01, 0)
    b.op("FULLY_CONNECTED", [x, w, bias], [y], version=4)
    b.output(y)
    assert_refused(b.build(), "bias scale")


# -- BATCH_MATMUL ----------------------------------------------------------------------------


def batch_matmul_model(
    dtype: str,
    lhs_shape: Sequence[int],
    rhs_shape: Sequence[int],
    adj_x: bool = False,
    adj_y: bool = False,
    out_dtype: str | None = None,
    constant_rhs: bool = False,
) -> bytes:
    """One BATCH_MATMUL; int8 operands carry nonzero zero points."""
    out_dtype = out_dtype or dtype
    rows = lhs_shape[-1] if adj_x else lhs_shape[-2]
    depth = lhs_shape[-2] if adj_x else lhs_shape[-1]
    cols = rhs_shape[-2] if adj_y else rhs_shape[-1]
    out_shape = (*np.broadcast_shapes(tuple(lhs_shape[:-2]), tuple(rhs_shape[:-2])), rows, cols)
    b = ModelBuilder("int8" if dtype == "int8" else "float32")
    lhs_quant = (0.04, -9) if dtype == "int8" else ()
    rhs_quant = (0.03, 4) if dtype == "int8" else ()
    lhs = b.input("lhs", lhs_shape, dtype, *lhs_quant)
    if constant_rhs:
        rng = np.random.default_rng(5)
        values = (
            rng.integers(-128, 128, rhs_shape).astype(np.int8)
            if dtype == "int8"
            else rng.standard_normal(rhs_shape).astype(np.float32)
        )
        rhs = b.const("rhs", values, *rhs_quant)
    else:
        rhs = b.input("rhs", rhs_shape, dtype, *rhs_quant)
    if out_dtype == "int8":
        std = math.sqrt(depth) * 0.04 * INT8_STD * 0.03 * INT8_STD
        out = b.tensor("out", out_shape, "int8", *output_quantization(std))
    else:
        out = b.tensor("out", out_shape, out_dtype)
    b.op("BATCH_MATMUL", [lhs, rhs], [out], {"adj_x": adj_x, "adj_y": adj_y})
    b.output(out)
    return b.build()


MATMUL_SHAPES = [
    ((3, 5), (5, 4)),
    ((2, 3, 5), (2, 5, 4)),
    ((2, 3, 5), (1, 5, 4)),  # rhs batch of 1, which TFLite folds into the lhs rows
    ((3, 5), (2, 5, 4)),  # lhs of lower rank broadcasts
    ((2, 1, 3, 5), (4, 5, 2)),  # batch dimensions broadcast both ways
    ((1, 2, 1, 3, 5), (2, 1, 3, 5, 4)),  # rank 5
]


def _adjusted(shape: Sequence[int], adjoint: bool) -> tuple[int, ...]:
    """The stored shape of an operand that the op transposes back to `shape`."""
    return (*shape[:-2], shape[-1], shape[-2]) if adjoint else tuple(shape)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("lhs_shape, rhs_shape", MATMUL_SHAPES)
@pytest.mark.parametrize(
    "adj_x, adj_y", [(False, False), (True, False), (False, True), (True, True)]
)
def test_batch_matmul(dtype, lhs_shape, rhs_shape, adj_x, adj_y):
    model = batch_matmul_model(
        dtype, _adjusted(lhs_shape, adj_x), _adjusted(rhs_shape, adj_y), adj_x, adj_y
    )
    assert_matches_and_varies(model)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_batch_matmul_constant_rhs(dtype):
    assert_matches_and_varies(batch_matmul_model(dtype, (2, 3, 6), (6, 5), constant_rhs=True))


@pytest.mark.parametrize("adj_y", [False, True])
def test_batch_matmul_int8_to_int32(adj_y):
    """int8 operands with an int32 output: TFLite sums raw products, ignoring zero points."""
    model = batch_matmul_model(
        "int8", (2, 3, 7), _adjusted((7, 4), adj_y), adj_y=adj_y, out_dtype="int32"
    )
    assert_matches_and_varies(model)


def test_batch_matmul_refuses_float_lhs_with_int8_output():
    b = ModelBuilder("float32")
    lhs = b.input("lhs", (2, 3), "float32")
    rhs = b.const("rhs", np.ones((3, 2), np.int8), 0.1, 0)
    out = b.tensor("out", (2, 2), "int8", 0.1, 0)
    b.op("BATCH_MATMUL", [lhs, rhs], [out])
    b.output(out)
    assert_refused(b.build(), "no kernel for float32, int8 -> int8")


# -- real models -----------------------------------------------------------------------------

REAL_MODELS = (
    "hello_world_float",
    "hello_world_int8",
    "ad01_fp32",
    "ad01_int8",
    "kws_ref_model",
    "micro_speech_quantized",
    "vww_96_int8",
    "pretrainedResnet_quant",
)


def check_ops_on_oracle_tensors(path: Path, opcodes: Sequence[str], seed: int = 0) -> int:
    """Run each op of `opcodes` in the model on TFLite's own input tensors; its output must
    match TFLite's (bit-exact for integers). Returns how many ops were checked."""
    if not path.exists():
        pytest.skip(f"{path} is absent")
    model = path.read_bytes()
    graph = parse_model(model, str(path)).main
    oracle = LiteRTOracle(model, preserve_all_tensors=True)
    oracle.invoke(random_inputs(graph, seed))
    checked = 0
    for op in graph.operators:
        if op.opcode not in opcodes:
            continue
        params = REGISTRY[op.opcode].prepare(graph, op)
        inputs = [oracle.tensor(t) if t >= 0 else None for t in op.inputs]
        expected = [oracle.tensor(t) for t in op.outputs]
        outputs = [np.zeros_like(e) for e in expected]
        KERNELS[op.opcode](params, inputs, outputs)
        for e, a in zip(expected, outputs, strict=True):
            d = difference(e, a)
            assert d.mismatches == 0, f"op {op.index} {op.opcode}: {d}"
        checked += 1
    return checked


@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_models_fully_connected(name):
    checked = 0
    for seed in range(2):
        checked += check_ops_on_oracle_tensors(
            SHARED_MODELS / f"{name}.tflite", ("FULLY_CONNECTED", "BATCH_MATMUL"), seed
        )
    assert checked > 0


@pytest.mark.parametrize(
    "name", ["hello_world_float", "hello_world_int8", "ad01_fp32", "ad01_int8"]
)
def test_real_models_made_of_fully_connected_run_whole(name):
    """These models hold nothing but FULLY_CONNECTED: the whole planned model must match."""
    path = SHARED_MODELS / f"{name}.tflite"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    assert_matches_oracle(path.read_bytes(), inputs=5)


# -- int16 (16x8): int16 activations with zero point 0, int8 weights, int64 bias ---------------


def int16_fully_connected_model(input_shape: Sequence[int], units: int, activation: str = "NONE",
                                bias: bool = True, per_channel: bool = False,
                                seed: int = 0, bias_type: str | None = None,
                                filter_zero_point: int = 0,
                                runtime_weights: bool = False) -> bytes:
    """`bias_type` sets the options' quantized_bias_type (INT32: an int32 bias and sums)."""
    rng = np.random.default_rng(seed)
    depth = input_shape[-1]
    batches = math.prod(input_shape) // depth
    b = ModelBuilder("float32")
    input_scale = 1 / 4096
    x = b.input("x", input_shape, "int16", input_scale, 0)
    scale = rng.uniform(0.002, 0.02, units) if per_channel else 0.01
    zero_point = [0] * units if per_channel else filter_zero_point
    if runtime_weights:
        weights = b.input("w", (units, depth), "int8", scale, zero_point)
    else:
        weights = b.const("w", rng.integers(-127, 128, (units, depth)).astype(np.int8), scale,
                          zero_point)
    bias_dtype = np.int32 if bias_type == "INT32" else np.int64
    bias_index = (b.const("b", rng.integers(-300000, 300000, units).astype(bias_dtype),
                          input_scale * np.asarray(scale), 0) if bias else -1)
    # int16 values are about 0.58 * 32768 in magnitude: the sums' real deviation
    std = math.sqrt(depth) * input_scale * 0.58 * 32768 * float(np.mean(scale)) * INT8_STD
    low, high = ACTIVATION_FLOAT_RANGE[activation]
    reach = max(min(SPREAD * std, high), -max(-SPREAD * std, low), 1e-3)
    out = b.tensor("y", (batches, units), "int16", reach / 32767, 0)
    options = {"fused_activation_function": activation}
    if bias_type is not None:
        options["quantized_bias_type"] = bias_type
    b.op("FULLY_CONNECTED", [x, weights, bias_index], [out], options, version=7)
    b.output(out)
    return b.build()


@pytest.mark.parametrize("input_shape, units", [((1, 8), 4), ((3, 40), 7), ((2, 300), 16)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_fully_connected_int16(input_shape, units, per_channel):
    assert_matches_and_varies(int16_fully_connected_model(input_shape, units,
                                                          per_channel=per_channel))


@pytest.mark.parametrize("activation", ["RELU", "RELU6", "RELU_N1_TO_1"])
@pytest.mark.parametrize("bias", [True, False])
def test_fully_connected_int16_activations(activation, bias):
    assert_matches_and_varies(int16_fully_connected_model((4, 24), 8, activation, bias, seed=1))


# -- hybrid (dynamic range): float32 activations, int8 constant weights -------------------------


def hybrid_fully_connected_model(input_shape: Sequence[int], units: int, activation: str = "NONE",
                                 bias: bool = True, per_channel: bool = False,
                                 asymmetric: bool = False, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    depth = input_shape[-1]
    batches = math.prod(input_shape) // depth
    b = ModelBuilder("float32")
    x = b.input("x", input_shape, "float32")
    scale = rng.uniform(0.002, 0.02, units) if per_channel else 0.01
    weights = b.const("w", rng.integers(-127, 128, (units, depth)).astype(np.int8), scale, 0)
    bias_index = b.const("b", rng.normal(0, 0.5, units).astype("f4")) if bias else -1
    out = b.tensor("y", (batches, units), "float32")
    b.op("FULLY_CONNECTED", [x, weights, bias_index], [out],
         {"fused_activation_function": activation, "asymmetric_quantize_inputs": asymmetric})
    b.output(out)
    return b.build()


HYBRID_SHAPES = [((1, 8), 4), ((3, 16), 5), ((4, 13), 6), ((2, 3, 24), 7), ((2, 100), 9)]


@pytest.mark.parametrize("asymmetric", [False, True])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("input_shape, units", HYBRID_SHAPES)
def test_fully_connected_hybrid(input_shape, units, per_channel, asymmetric):
    """Bit for bit: the float32 results compare with no tolerance (see assert_bit_exact)."""
    model = hybrid_fully_connected_model(input_shape, units, per_channel=per_channel,
                                         asymmetric=asymmetric)
    assert_bit_exact(model)


@pytest.mark.parametrize("activation", ["RELU", "RELU6", "RELU_N1_TO_1"])
@pytest.mark.parametrize("bias", [True, False])
def test_fully_connected_hybrid_activations(activation, bias):
    assert_bit_exact(hybrid_fully_connected_model((4, 24), 8, activation, bias, seed=1))


def test_fully_connected_hybrid_refuses_weights_of_minus_128():
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "float32")
    w = b.const("w", np.array([[-128, 1, 2, 3]], np.int8), 0.01, 0)
    out = b.tensor("y", (1, 1), "float32")
    b.op("FULLY_CONNECTED", [x, w, -1], [out], {})
    b.output(out)
    assert_refused(b.build(), "-128")


def assert_bit_exact(model: bytes, inputs: list[list[np.ndarray]] | None = None) -> None:
    """runtime_py and the C against LiteRT with every float32 output bit equal, on random
    input sets or the given ones."""
    from runtime_py.interpreter import ArenaInterpreter
    from toolchain.front.reader import parse_model
    from toolchain.lab.c_backend import CBackend
    from toolchain.lab.check import random_inputs
    from toolchain.lab.oracle import LiteRTOracle
    from toolchain.lower.plan import plan_model

    mp = plan_model(parse_model(model, "<built model>"), "greedy")
    inputs = inputs or [random_inputs(mp.graph, seed) for seed in range(3)]
    oracle = LiteRTOracle(model)
    with CBackend(mp) as c:
        c_outputs = c.invoke_many(inputs)
    for values, from_c in zip(inputs, c_outputs, strict=True):
        want = oracle.invoke(values)[0]
        for got in (ArenaInterpreter(mp).invoke(values)[0], from_c[0]):
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# -- hybrid BATCH_MATMUL: float32 lhs, int8 constant rhs ---------------------------------------


def hybrid_batch_matmul_model(lhs_shape: Sequence[int], rhs_shape: Sequence[int],
                              adj_x: bool = False, adj_y: bool = False,
                              per_channel: bool = False, asymmetric: bool = False,
                              values: np.ndarray | None = None, seed: int = 0) -> bytes:
    """One hybrid BATCH_MATMUL; per-channel scales run along the rhs columns."""
    rng = np.random.default_rng(seed)
    rows = lhs_shape[-1] if adj_x else lhs_shape[-2]
    cols = rhs_shape[-2] if adj_y else rhs_shape[-1]
    out_shape = (*np.broadcast_shapes(tuple(lhs_shape[:-2]), tuple(rhs_shape[:-2])), rows, cols)
    b = ModelBuilder("float32")
    lhs = b.input("lhs", lhs_shape, "float32")
    values = rng.integers(-127, 128, rhs_shape).astype(np.int8) if values is None else values
    scale = rng.uniform(0.002, 0.02, cols) if per_channel else 0.01
    axis = len(rhs_shape) - (2 if adj_y else 1)
    rhs = b.const("rhs", values, scale, [0] * cols if per_channel else 0, quantized_dimension=axis)
    out = b.tensor("out", out_shape, "float32")
    b.op("BATCH_MATMUL", [lhs, rhs], [out],
         {"adj_x": adj_x, "adj_y": adj_y, "asymmetric_quantize_inputs": asymmetric})
    b.output(out)
    return b.build()


HYBRID_MATMUL_SHAPES = [
    ((3, 5), (5, 4)),
    ((2, 3, 16), (16, 7)),  # a batched lhs, one rhs matrix
    ((2, 3, 13), (1, 13, 6)),  # rhs batch of 1, which TFLite folds into the lhs rows
    ((3, 9), (2, 9, 4)),  # the lhs rows reused for each rhs matrix
    ((2, 1, 3, 20), (4, 20, 5)),  # batch dimensions broadcast both ways
    ((1, 2, 1, 3, 9), (2, 1, 1, 9, 4)),  # rank 5
]


@pytest.mark.parametrize("lhs_shape, rhs_shape", HYBRID_MATMUL_SHAPES)
@pytest.mark.parametrize(
    "adj_x, adj_y", [(False, False), (True, False), (False, True), (True, True)]
)
def test_batch_matmul_hybrid(lhs_shape, rhs_shape, adj_x, adj_y):
    """Bit for bit, per-tensor and symmetric: each broadcast and adjoint pair."""
    model = hybrid_batch_matmul_model(_adjusted(lhs_shape, adj_x), _adjusted(rhs_shape, adj_y),
                                      adj_x, adj_y)
    assert_bit_exact(model)
    assert_varied(model, min_distinct=8)


@pytest.mark.parametrize("asymmetric", [False, True])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("lhs_shape, rhs_shape, adj_x, adj_y", [
    ((2, 3, 16), (16, 7), False, False),
    ((2, 13, 3), (1, 6, 13), True, True),
    ((2, 1, 3, 20), (4, 5, 20), False, True),
    ((2, 3, 4, 5), (2, 1, 5, 6), False, False),  # TFLite folds lhs batch 3 into the rows
])
def test_batch_matmul_hybrid_quantization(lhs_shape, rhs_shape, adj_x, adj_y, per_channel,
                                          asymmetric):
    """Per-channel rhs scales and asymmetric lhs rows, whose zero point TFLite takes off in
    float."""
    model = hybrid_batch_matmul_model(lhs_shape, rhs_shape, adj_x, adj_y, per_channel,
                                      asymmetric, seed=1)
    assert_bit_exact(model)
    assert_varied(model, min_distinct=8)


@pytest.mark.parametrize("asymmetric", [False, True])
def test_batch_matmul_hybrid_sums_rounded_in_float(asymmetric):
    """Sums beyond 2^24 (positive rows, large weights of one sign per column, depth 2048) round
    as TFLite passes them through float, with the zero point correction when asymmetric."""
    rng = np.random.default_rng(6)
    values = (rng.integers(90, 128, (2048, 8)) * np.array([1, -1] * 4)).astype(np.int8)
    model = hybrid_batch_matmul_model((4, 2048), (2048, 8), asymmetric=asymmetric,
                                      values=values)
    inputs = []
    for _ in range(3):
        x = rng.uniform(0.9, 1.0, (4, 2048)).astype(np.float32)
        x[:, 0] = -0.5  # a zero point near -43: a large correction
        inputs.append([x])
    assert_bit_exact(model, inputs)


def test_batch_matmul_hybrid_rhs_of_minus_128():
    """TFLite's batch matmul multiplies in plain C: -128 weights are exact (unlike its
    FULLY_CONNECTED's x86 kernel)."""
    values = np.random.default_rng(3).choice([-128, -1, 1, 127], (24, 5)).astype(np.int8)
    assert_bit_exact(hybrid_batch_matmul_model((3, 24), (24, 5), values=values))


def test_batch_matmul_hybrid_zero_rows():
    """A zero lhs row quantizes with scale 1, and its outputs are +0.0."""
    from runtime_py.interpreter import ArenaInterpreter
    from toolchain.lab.c_backend import CBackend
    from toolchain.lower.plan import plan_model

    for asymmetric in (False, True):
        model = hybrid_batch_matmul_model((3, 12), (12, 4), asymmetric=asymmetric)
        x = np.random.default_rng(2).standard_normal((3, 12)).astype(np.float32)
        x[1] = 0.0
        x[2, :5] = -0.0
        want = LiteRTOracle(model).invoke([x])[0]
        mp = plan_model(parse_model(model, "<built model>"), "greedy")
        with CBackend(mp) as c:
            from_c = c.invoke([x])[0]
        for got in (ArenaInterpreter(mp).invoke([x])[0], from_c):
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_batch_matmul_hybrid_refuses_runtime_rhs():
    b = ModelBuilder("float32")
    lhs = b.input("lhs", (2, 3), "float32")
    rhs = b.input("rhs", (3, 2), "int8", 0.1, 0)
    out = b.tensor("out", (2, 2), "float32")
    b.op("BATCH_MATMUL", [lhs, rhs], [out])
    b.output(out)
    assert_refused(b.build(), "quantized constant")


@pytest.mark.parametrize("lhs_shape, rhs_shape, adj_x", [
    ((2, 3, 4, 5), (5, 6), False),
    ((2, 3, 5, 4), (5, 6), True),
    ((2, 3, 4, 5), (2, 3, 5, 6), False),
])
def test_batch_matmul_hybrid_refuses_two_lhs_batch_dimensions(lhs_shape, rhs_shape, adj_x):
    """TFLite's kernel indexes the row scales by the sum of the batch indices."""
    assert_refused(hybrid_batch_matmul_model(lhs_shape, rhs_shape, adj_x), "other rows' scales")


@pytest.mark.parametrize("lhs_shape, rhs_shape, adj_x", [
    ((4, 5), (2, 3, 5, 6), False),
    ((1, 2, 1, 5, 3), (2, 1, 1, 5, 4), True),
])
def test_batch_matmul_hybrid_refuses_asymmetric_rhs_batches(lhs_shape, rhs_shape, adj_x):
    """With asymmetric rows, TFLite's kernel reads the wrong matrix's column sums here; the
    same shapes are fine when symmetric."""
    for asymmetric in (True, False):
        model = hybrid_batch_matmul_model(lhs_shape, rhs_shape, adj_x, asymmetric=asymmetric)
        if asymmetric:
            assert_refused(model, "column sums")
        else:
            assert_bit_exact(model)


def test_batch_matmul_hybrid_refuses_per_channel_along_the_depth():
    b = ModelBuilder("float32")
    lhs = b.input("lhs", (2, 3), "float32")
    rhs = b.const("rhs", np.ones((3, 2), np.int8), [0.1, 0.2, 0.3], [0, 0, 0],
                  quantized_dimension=0)
    out = b.tensor("out", (2, 2), "float32")
    b.op("BATCH_MATMUL", [lhs, rhs], [out])
    b.output(out)
    assert_refused(b.build(), "per-channel scales must run along")


def test_batch_matmul_hybrid_refuses_depth_beyond_int32_sums():
    values = np.ones((70000, 2), np.int8)
    assert_refused(hybrid_batch_matmul_model((1, 70000), (70000, 2), values=values),
                   "int32 sums could overflow")


# -- int16 FULLY_CONNECTED with an int32 bias (quantized_bias_type INT32) ----------------------


@pytest.mark.parametrize("input_shape, units", [((1, 8), 4), ((3, 40), 7), ((2, 600), 16)])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_fully_connected_int16_int32_bias(input_shape, units, per_channel, bias):
    """The options ask for an int32 bias: TFLite then sums in int32 (which wraps)."""
    model = int16_fully_connected_model(input_shape, units, bias=bias, per_channel=per_channel,
                                        bias_type="INT32")
    assert_matches_oracle(model)
    assert_varied(model, min_distinct=3)


@pytest.mark.parametrize("activation", ["RELU", "RELU6", "RELU_N1_TO_1"])
def test_fully_connected_int16_int32_bias_activations(activation):
    model = int16_fully_connected_model((4, 24), 8, activation, bias_type="INT32", seed=1)
    assert_matches_oracle(model)
    assert_varied(model, min_distinct=3)


@pytest.mark.parametrize("bias_type", [None, "INT64", "INT32"])
@pytest.mark.parametrize("runtime_weights", [False, True])
def test_fully_connected_int16_filter_zero_point(bias_type, runtime_weights):
    """A per-tensor filter may be asymmetric: TFLite subtracts its zero point, in int64 or
    int32 sums."""
    model = int16_fully_connected_model((3, 40), 6, bias_type=bias_type, filter_zero_point=7,
                                        runtime_weights=runtime_weights)
    assert_matches_oracle(model)
    assert_varied(model, min_distinct=8)


def test_fully_connected_int16_int32_bias_wraps():
    """600 products of 2^22 overflow int32: TFLite's int32 sums wrap, its int64 ones do not."""
    from runtime_py.interpreter import ArenaInterpreter
    from toolchain.lab.c_backend import CBackend
    from toolchain.lower.plan import plan_model

    results = {}
    for bias_type in ("INT32", "INT64"):
        b = ModelBuilder("float32")
        x = b.input("x", (1, 600), "int16", 1.0, 0)
        w = b.const("w", np.full((2, 600), -128, np.int8), 1.0, 0)
        y = b.tensor("y", (1, 2), "int16", 2.0**20, 0)
        b.op("FULLY_CONNECTED", [x, w, -1], [y], {"quantized_bias_type": bias_type}, version=7)
        b.output(y)
        model = b.build()
        values = [np.full((1, 600), -32768, np.int16)]
        want = LiteRTOracle(model).invoke(values)[0]
        mp = plan_model(parse_model(model, "<built model>"), "greedy")
        with CBackend(mp, sanitize=True) as c:
            from_c = c.invoke(values)[0]
        for got in (ArenaInterpreter(mp).invoke(values)[0], from_c):
            np.testing.assert_array_equal(got, want)
        results[bias_type] = want
    assert (results["INT32"] != results["INT64"]).all()


@pytest.mark.parametrize("bias_dtype, bias_type, reason", [
    ("int32", None, "int32 bias without quantized_bias_type INT32"),
    ("int32", "INT64", "bias of type int32 with quantized_bias_type INT64"),
    ("int64", "INT32", "bias of type int64 with quantized_bias_type INT32"),
    ("int64", "INT8", "quantized_bias_type int8"),
])
def test_fully_connected_int16_refuses_bias_types(bias_dtype, bias_type, reason):
    b = ModelBuilder("float32")
    x = b.input("x", (1, 4), "int16", 1 / 4096, 0)
    w = b.const("w", np.ones((2, 4), np.int8), 0.01, 0)
    bias = b.const("b", np.zeros(2, bias_dtype), 0.01 / 4096, 0)
    y = b.tensor("y", (1, 2), "int16", 0.001, 0)
    options = {} if bias_type is None else {"quantized_bias_type": bias_type}
    b.op("FULLY_CONNECTED", [x, w, bias], [y], options, version=7)
    b.output(y)
    assert_refused(b.build(), reason)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_fully_connected_bias_of_shape_units_by_one(dtype):
    """A bias of shape [units, 1] holds one value per unit, as TFLite reads it (it checks the
    element count only), not a [units, units] broadcast."""
    from tests.test_control_flow import edited

    def column_bias(model):
        bias = next(t for t in model.subgraphs[0].tensors if t.name == b"b")
        bias.shape = [bias.shape[0], 1]

    model = edited(fully_connected_model(dtype, (16, 8), 16), column_bias)
    assert parse_model(model).main.tensors[2].shape == (16, 1)
    assert_matches_and_varies(model)


@pytest.mark.parametrize("asymmetric", [False, True])
def test_fully_connected_hybrid_non_finite_inputs_agree_sanitized(asymmetric):
    """NaN, +-inf, denormal and +-FLT_MAX rows, undefined in TFLite's quantizer: runtime_py and
    the C (float-to-int overflow trapped) give the same bits."""
    from runtime_py.interpreter import ArenaInterpreter
    from toolchain.front.reader import parse_model
    from toolchain.lab.c_backend import CBackend
    from toolchain.lower.plan import plan_model

    big = np.finfo(np.float32).max
    rows = [[np.nan] * 10, [1, np.nan, 2, -3, 0.5, 0.2, 0.1, 4, np.nan, 2],
            [1, np.inf, 2, -3, 0.5, 0.2, 0.1, 4, -np.inf, 2], [1e-40] * 10, [-1e-40] * 10,
            [big, -big] * 5, [1e-45, 0] * 5]
    model = hybrid_fully_connected_model((1, 10), 3, asymmetric=asymmetric)
    mp = plan_model(parse_model(model, "<built model>"), "greedy")
    inputs = [[np.array([row], np.float32)] for row in rows]
    with CBackend(mp) as plain:  # the unsanitized build must agree too
        c_outputs = plain.invoke_many(inputs)
    with CBackend(mp, sanitize=True) as c:  # float-to-int overflow trapped
        sanitized = c.invoke_many(inputs)
    for values, a, b in zip(inputs, c_outputs, sanitized, strict=True):
        want = ArenaInterpreter(mp).invoke(values)[0].view(np.uint32)
        np.testing.assert_array_equal(a[0].view(np.uint32), want)
        np.testing.assert_array_equal(b[0].view(np.uint32), want)


@pytest.mark.parametrize("activation", ["NONE", "RELU", "RELU6", "RELU_N1_TO_1"])
def test_fully_connected_hybrid_overflow_is_tflites_activation_of_inf(activation):
    """Finite inputs near FLT_MAX whose scaled sums overflow: TFLite applies the activation to
    the vector as it is (NONE keeps +-inf, RELU keeps +inf), not the float kernels' clamp to
    the finite floats; runtime_py and the C give LiteRT's bits."""
    big = np.finfo(np.float32).max
    rows = [[big] * 10, [-big] * 10, [big, -big] * 5, [big / 3] * 10]
    model = hybrid_fully_connected_model((1, 10), 3, activation, seed=4)
    assert_bit_exact(model, [[np.array([row], np.float32)] for row in rows])
