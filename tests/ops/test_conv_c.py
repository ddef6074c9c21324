"""The generated C of CONV_2D, DEPTHWISE_CONV_2D and TRANSPOSE_CONV beyond tests/ops/test_conv.py
(which already runs it through assert_matches_oracle): sanitized builds of every kernel path,
the stack-limited fallbacks, the order contract the planner relies on (output placed over the
input), left-shift requantization, the requantization formula itself and deterministic text."""

from __future__ import annotations

import dataclasses
import re
import shlex

import numpy as np
import pytest

import toolchain.ops.conv.emit as conv_codegen
from runtime_py.kernels.conv import requantize
from tests.conftest import native_vnni
from tests.ops.test_conv import conv_model, depthwise_model, transpose_conv_model
from toolchain.c.generate import generate
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend, compiler
from toolchain.lab.check import check_plan
from toolchain.lower.plan import ModelPlan, plan_model
from toolchain.ops.conv.prepare import Requantize
from toolchain.ops.emit import LINE_LIMIT


def c_text(model: bytes) -> str:
    return generate(plan_model(parse_model(model, "<built model>"), "greedy"))["model.c"]


def assert_c_matches(
    model: bytes, inputs: int = 2, sanitize: bool = True, mp: ModelPlan | None = None
) -> None:
    """The C (built with ASan and UBSan by default) against TFLite on random inputs."""
    if mp is None:
        mp = plan_model(parse_model(model, "<built model>"), "greedy")
    with CBackend(mp, sanitize=sanitize) as backend:
        report = check_plan(
            mp, model, inputs=inputs, extra=[("c", backend.invoke_many)], runtime_py=False
        )
    bad = [o for o in report.outputs if o.mismatches]
    assert not bad, "; ".join(
        f"{o.name}: {o.mismatches} mismatches, max {o.max_abs_diff}" for o in bad
    )


# -- every kernel path, sanitized ----------------------------------------------------------------

CONV_CASES = [
    # dtype, per-channel, input shape, out channels, kernel, options
    ("int8", True, (1, 6, 7, 16), 22, (1, 1), {}),  # 1x1, int8 filter rows, 4-blocks + 2 single
    ("int8", False, (2, 5, 6, 16), 8, (3, 3), {"stride": (2, 1)}),  # depth 144: int8 rows
    ("int8", True, (1, 9, 8, 3), 8, (3, 3), {"stride": (2, 2)}),  # depth 27: int16 rows
    ("int8", True, (1, 7, 7, 8), 5, (1, 1), {"stride": (2, 2), "padding": "VALID"}),
    ("int8", True, (1, 8, 9, 6), 4, (3, 2), {"dilation": (2, 3), "activation": "RELU6"}),
    ("int8", True, (1, 6, 6, 32), 8, (3, 3), {"groups": 2, "bias": False}),
    ("float32", False, (1, 6, 7, 16), 10, (1, 1), {}),
    ("float32", False, (2, 7, 6, 5), 3, (3, 3), {"dilation": (2, 1), "activation": "RELU"}),
    ("float32", False, (1, 6, 6, 4), 6, (3, 3), {"groups": 2}),
    ("uint8", False, (1, 6, 7, 16), 22, (1, 1), {}),  # the int16 filter copy, rows of 16
    ("uint8", False, (1, 9, 8, 3), 8, (3, 3), {"stride": (2, 2)}),  # depth 27: widened rows
    ("uint8", False, (1, 8, 9, 6), 4, (3, 2), {"dilation": (2, 3), "activation": "RELU6"}),
]


@pytest.mark.parametrize("dtype, per_channel, shape, out_channels, kernel, options", CONV_CASES)
def test_conv_2d_sanitized(dtype, per_channel, shape, out_channels, kernel, options):
    assert_c_matches(conv_model(dtype, per_channel, shape, out_channels, kernel, **options))


# int8 input with zero point -128 (input + 128 is a byte) and depths of whole vectors: the
# column in arenac_col8, which is uint8_t where the compiler has VNNI, else int16_t
BYTE_CASES = [
    conv_model("int8", True, (1, 6, 7, 16), 22, (1, 1), input_zero_point=-128),  # 7: one alone
    conv_model("int8", False, (2, 5, 6, 16), 8, (3, 3), (2, 1), input_zero_point=-128),
    conv_model("int8", True, (1, 7, 8, 32), 16, (3, 3), activation="RELU", input_zero_point=-128),
]


@pytest.mark.parametrize("index", range(len(BYTE_CASES)))
def test_conv_2d_byte_column(index):
    model = BYTE_CASES[index]
    assert "arenac_col8 cols[2][" in c_text(model)
    assert_c_matches(model)
    assert_c_matches(model, mp=overlapped_plan(model))


def test_pairs_of_pixels_are_for_the_host():
    """A Cortex-M's portable kernel keeps one pixel at a time: a pair's sums and pointers would
    not fit its registers."""
    model = BYTE_CASES[0]
    mp = plan_model(parse_model(model, "<built model>"), "greedy", target="cortex-m0plus")
    assert "cols[2][" in c_text(model)
    assert "cols[2][" not in generate(mp)["model.c"]


@pytest.mark.skipif(not native_vnni(), reason="-march=native has no VNNI on this host")
@pytest.mark.parametrize("index", range(len(BYTE_CASES)))
def test_conv_2d_byte_column_with_vnni(index, monkeypatch):
    """The column in uint8_t, which GCC multiplies by the int8 filter with vpdpbusd."""
    monkeypatch.setenv("CC", shlex.join([*compiler(), "-march=native"]))
    model = BYTE_CASES[index]
    assert_c_matches(model)
    assert_c_matches(model, mp=overlapped_plan(model))


DEPTHWISE_CASES = [
    # dtype, per-channel, input shape, kernel, multiplier, options
    ("int8", True, (2, 7, 9, 4), (3, 3), 1, {}),  # 4 pixels per vector; 9 columns: a rest
    ("int8", False, (1, 6, 9, 8), (3, 3), 1, {"bias": False, "activation": "RELU6"}),
    ("int8", True, (1, 9, 10, 8), (3, 3), 1, {"padding": "VALID", "activation": "RELU"}),
    ("int8", False, (1, 8, 8, 2), (3, 3), 1, {"dilation": (2, 2)}),
    ("int8", True, (1, 7, 6, 24), (3, 3), 1, {"stride": (2, 2)}),  # 24: vectors plus a rest
    ("int8", True, (1, 6, 6, 32), (5, 5), 1, {}),
    ("int8", True, (1, 8, 7, 1), (3, 3), 8, {"stride": (2, 2), "activation": "RELU6"}),
    ("int8", True, (1, 6, 6, 3), (7, 7), 1, {"bias": False}),  # 49 taps: no unrolled pass
    ("float32", False, (1, 7, 6, 8), (3, 3), 1, {}),
    ("float32", False, (1, 7, 6, 3), (3, 2), 2, {"stride": (1, 2)}),
    ("uint8", False, (2, 7, 9, 4), (3, 3), 1, {}),  # the span path over the int16 copy
    ("uint8", False, (1, 7, 6, 24), (3, 3), 1, {"stride": (2, 2), "activation": "RELU"}),
    ("uint8", False, (1, 8, 7, 1), (3, 3), 8, {"stride": (2, 2), "bias": False}),
]


@pytest.mark.parametrize("dtype, per_channel, shape, kernel, multiplier, options", DEPTHWISE_CASES)
def test_depthwise_conv_2d_sanitized(dtype, per_channel, shape, kernel, multiplier, options):
    assert_c_matches(depthwise_model(dtype, per_channel, shape, kernel, multiplier, **options))


def test_depthwise_conv_2d_few_channels_fill_a_vector():
    model = depthwise_model("int8", True, (2, 7, 9, 4), (3, 3))
    assert "_span_w" in c_text(model)
    assert "_span_w" not in c_text(depthwise_model("int8", True, (1, 7, 9, 4), (3, 3), 1, (1, 2)))


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_transpose_conv_sanitized(dtype):
    assert_c_matches(transpose_conv_model(dtype, True, (1, 4, 3, 5), 20, (3, 3), (8, 6), (2, 2)))
    assert_c_matches(
        transpose_conv_model(
            dtype, True, (2, 3, 4, 2), 3, (2, 3), (7, 12), (2, 3), "VALID", bias=False
        )
    )


# -- fallbacks for large receptive fields and many channels -----------------------------------


@pytest.fixture
def tiny_stack(monkeypatch):
    """A stack budget so small that every kernel takes its fallback path."""
    monkeypatch.setattr(conv_codegen, "MAX_STACK_BYTES", 48)


@pytest.mark.parametrize("dtype", ["int8", "float32", "uint8"])
def test_conv_2d_direct_fallback(tiny_stack, dtype):
    per_channel = dtype != "uint8"
    model = conv_model(dtype, per_channel, (1, 7, 6, 6), 24, (3, 3), (1, 2), (1, 2), groups=2)
    assert "too large" in c_text(model)
    assert_c_matches(model)
    # uint8 CONV_2D requires its bias (TFLite refuses one without)
    assert_c_matches(conv_model(dtype, False, (1, 5, 5, 8), 36, (1, 1), bias=dtype == "uint8"))


def test_uint8_filters_are_read_minus_their_zero_point_from_one_int16_copy():
    """The kernel reads TFLite's weights offset folded into the filter, not the uint8 filter."""
    text = c_text(conv_model("uint8", False, (1, 6, 7, 16), 22, (1, 1)))
    assert "static const int16_t model_op0_w[" in text
    assert "static const uint8_t" not in text


@pytest.mark.parametrize("dtype", ["int8", "float32", "uint8"])
def test_depthwise_conv_2d_channel_blocks(tiny_stack, dtype):
    per_channel = dtype != "uint8"
    model = depthwise_model(dtype, per_channel, (1, 6, 5, 36), (3, 3), 1, (2, 1))
    assert "c0 += 12" in c_text(model)
    assert_c_matches(model)
    assert_c_matches(depthwise_model(dtype, per_channel, (1, 6, 5, 6), (3, 3), 3, bias=False))


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_transpose_conv_channel_blocks(tiny_stack, dtype):
    assert_c_matches(transpose_conv_model(dtype, True, (1, 3, 3, 4), 24, (3, 3), (6, 6), (2, 2)))


# -- the order contract: the output placed over the input ---------------------------------------


def overlapped_plan(model: bytes) -> ModelPlan:
    """The one-op model's plan with its output starting the declared windowed shift below its
    input, so that the two share every byte the order contract lets them share."""
    mp = plan_model(parse_model(model, "<built model>"), "greedy")
    graph = mp.graph
    op = graph.operators[0]
    (rule,) = [r for r in mp.program.bindings[0].overlaps if r.kind == "windowed"]
    x, out = graph.tensors[op.inputs[0]], graph.tensors[op.outputs[0]]
    place = {op.inputs[0]: rule.shift, op.outputs[0]: 0}
    offsets = tuple(place[key.index] for key in mp.lifetimes.keys)
    assert rule.shift < out.nbytes, "the output would not overlap the input"
    arena = max(rule.shift + x.nbytes, out.nbytes)
    plan = dataclasses.replace(mp.plan, offsets=offsets, arena_bytes=arena, alignment=1)
    return dataclasses.replace(mp, plan=plan)


OVERLAP_CASES = [
    conv_model("int8", True, (1, 8, 9, 8), 16, (1, 1)),
    conv_model("int8", True, (2, 9, 8, 4), 6, (3, 3), activation="RELU"),
    conv_model("int8", False, (1, 9, 9, 16), 16, (3, 3), (2, 2)),
    conv_model("int8", True, (1, 10, 8, 3), 5, (3, 3), dilation=(2, 2)),
    conv_model("float32", False, (1, 8, 7, 5), 7, (3, 3)),
    depthwise_model("int8", True, (1, 9, 10, 4), (3, 3)),
    depthwise_model("int8", True, (2, 8, 8, 32), (3, 3)),
    depthwise_model("int8", True, (1, 9, 9, 16), (3, 3), 1, (2, 2)),
    depthwise_model("int8", True, (1, 8, 7, 2), (3, 3), 3),
    depthwise_model("float32", False, (1, 8, 7, 6), (5, 3)),
]


@pytest.mark.parametrize("index", range(len(OVERLAP_CASES)))
def test_output_over_input(index):
    model = OVERLAP_CASES[index]
    assert_c_matches(model, mp=overlapped_plan(model))


def test_output_over_input_direct_fallback(tiny_stack):
    model = conv_model("int8", True, (1, 7, 7, 6), 8, (3, 3))
    assert_c_matches(model, mp=overlapped_plan(model))


# -- requantization ----------------------------------------------------------------------------


def requantize_like_c(acc: np.ndarray, stage: Requantize) -> np.ndarray:
    """The C output stage, step by step in uint64 (C's unsigned arithmetic wraps alike)."""
    k = conv_codegen.requantize_constants(stage)
    u64 = np.uint64
    left, mult, negative, scale = (
        np.array(a, np.uint64) for a in (k.left, k.mult, k.negative, k.scale)
    )
    low32 = u64(0xFFFFFFFF)
    with np.errstate(over="ignore"):
        x = (acc.astype(np.int64).astype(np.uint64) & low32) * left & low32
        t = ((((x ^ u64(0x80000000)) * mult + u64(1 << 30)) >> u64(31)) - mult) & low32
        v = (t + u64(1 << 31) - ((t >> u64(31)) & negative)) & low32
        r = ((((v * scale + u64(1 << 30)) >> u64(31)) & low32) - scale) & low32
    q = r.astype(np.uint32).view(np.int32).astype(np.int64)
    low, high = stage.clamp
    zp = stage.output_zero_point
    return (np.clip(q, low - zp, high - zp) + zp).astype(np.int8)


def test_requantize_formula_equals_runtime():
    """Every shift from -31 to 31, ties (multiplier 2^30), the largest multiplier, a zero one,
    and accumulators over the whole int32 range."""
    rng = np.random.default_rng(0)
    shifts = np.arange(-31, 32)
    multipliers = rng.integers(1 << 30, 1 << 31, shifts.size)
    multipliers[::5] = 1 << 30
    multipliers[1::7] = (1 << 31) - 1
    multipliers[3] = 0
    magnitudes = 128.0 * 2.0 ** np.maximum(-shifts, 0)
    acc = np.round(rng.uniform(-1, 1, (3000, shifts.size)) * np.minimum(magnitudes, 2.0**31))
    acc = np.clip(acc, -(2**31), 2**31 - 1)
    acc[:12] = [
        [v] * shifts.size
        for v in (
            2**31 - 1,
            -(2**31),
            1,
            -1,
            0,
            3,
            -3,
            2**30,
            -(2**30),
            2**30 - 1,
            12345678,
            -87654321,
        )
    ]
    for zero_point, clamp in [(-3, (-128, 127)), (-128, (-128, 127)), (5, (-20, 90))]:
        stage = Requantize("int8", multipliers.astype(np.int64), shifts.astype(np.int64),
                           zero_point, clamp)
        expected = requantize(acc, stage)
        assert np.unique(expected).size > 100
        np.testing.assert_array_equal(requantize_like_c(acc.astype(np.int64), stage), expected)


def _one_by_one_model(out_scale: float) -> bytes:
    """A 1x1 convolution whose real multiplier is input_scale * 0.01 / out_scale."""
    b = ModelBuilder("int8")
    x = b.input("x", (1, 4, 5, 2), "int8", 0.05, 3)
    filt = b.const(
        "filter",
        np.array([[[[1, -1]]], [[[2, 0]]], [[[-3, 1]]]], np.int8),
        [0.01, 0.01, 0.01],
        0,
        quantized_dimension=0,
    )
    bias = b.const("bias", np.array([5, -7, 0], np.int32), [0.0005] * 3, 0)
    y = b.tensor("y", (1, 4, 5, 3), "int8", out_scale, -4)
    b.op(
        "CONV_2D",
        [x, filt, bias],
        [y],
        {"padding": "VALID", "stride_h": 1, "stride_w": 1},
        version=3,
    )
    b.output(y)
    return b.build()


@pytest.mark.parametrize("out_scale", [1.2e-4, 5e-5])
def test_requantize_with_left_shift(out_scale):
    """Real multipliers of 4 and 10: TFLite shifts the accumulator left first (wrapping)."""
    model = _one_by_one_model(out_scale)
    assert "acc[o] * " in c_text(model)
    assert_c_matches(model, inputs=4)


# -- text ----------------------------------------------------------------------------------------


def test_deterministic_text():
    model = depthwise_model("int8", True, (1, 7, 7, 4), (3, 3))
    assert c_text(model) == c_text(model)
    model = conv_model("int8", True, (1, 7, 7, 3), 5, (3, 3))
    assert c_text(model) == c_text(model)


def test_documents_the_order_contract():
    text = c_text(conv_model("int8", True, (1, 6, 6, 3), 4, (3, 3)))
    assert "ORDER CONTRACT" in text


# A `for` over constant bounds: variable, start, stop and step (empty for ++).
CONSTANT_FOR = re.compile(r"for \((\w+) = (-?\d+); \1 < (-?\d+); (?:\+\+\1|\1 \+= (\d+))\)")


def test_text_reads_like_hand_written_c():
    """Batch 1 and one group: no loop over a batch or group of one (a loop of one trip is its
    body, one of none is not written) and no line past LINE_LIMIT, for every kernel path."""
    models = [
        conv_model("int8", True, (1, 9, 8, 3), 8, (3, 3), (2, 2)),  # widened rows, row copy
        conv_model("int8", True, (1, 6, 7, 16), 22, (1, 1)),  # 1x1, 4-blocks and a single
        conv_model("float32", False, (1, 7, 6, 5), 3, (3, 3), dilation=(2, 1)),
        depthwise_model("int8", True, (1, 7, 9, 4), (3, 3)),  # pixels sharing a vector
        depthwise_model("float32", False, (1, 7, 6, 3), (3, 2), 2, (1, 2)),
        transpose_conv_model("int8", True, (1, 4, 3, 5), 20, (3, 3), (8, 6), (2, 2)),
    ]
    for model in models:
        text = c_text(model)
        long = [line for line in text.splitlines() if len(line) > LINE_LIMIT]
        assert not long, long[0]
        for var, start, stop, step in CONSTANT_FOR.findall(text):
            trips = -(-(int(stop) - int(start)) // int(step or 1))
            assert trips > 1, f"for ({var} = {start}; {var} < {stop}; ...) runs {max(trips, 0)}"
