"""`--target`: the kernels a target binds, the C it generates (and refuses to compile for
another), its firmware under QEMU, and `arenac bench`'s instruction counts.

The QEMU tests need arm-none-eabi-gcc and qemu-system-arm (skipped without them, failing with
CI set, as in test_mcu.py); the DSP kernels are checked bit-exact against TFLite's reference
kernels and runtime_py on built FULLY_CONNECTED, CONV_2D (1x1, widened rows and im2col),
DEPTHWISE_CONV_2D, pooling, ADD and SUB models and on the shared int8 models that use them; the
Helium kernels likewise on cortex-m55.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.conftest import SHARED_MODELS, needs_shared_models
from tests.ops.test_conv import conv_model, depthwise_model
from tests.ops.test_elementwise import binary_model
from tests.ops.test_fully_connected import fully_connected_model
from tests.ops.test_pooling import pool_model
from tests.test_mcu import mcu_tools, needs_mcu  # noqa: F401 (the fixture needs_mcu uses)
from toolchain import targets as target_table
from toolchain.c.generate import generate
from toolchain.cli import main
from toolchain.errors import ArenacError, RuntimeBackendError
from toolchain.front.reader import parse_model
from toolchain.ir import INT32_MAX
from toolchain.lab.bench import bench
from toolchain.lab.c_backend import compiler
from toolchain.lab.check import check_plan, random_inputs
from toolchain.lab.firmware import mcu_sources
from toolchain.lab.qemu_backend import QemuBackend
from toolchain.lower.plan import ModelPlan, Techniques, plan_model
from toolchain.numerics.fixedpoint import multiply_by_quantized_multiplier
from toolchain.numerics.quant import quantize_multiplier
from toolchain.numerics.rounding import (
    SIGN_STEP,
    double_to_int32,
    fc_multiplier,
    first_multiple,
    high_word,
    round_half_away,
    shared_roundings,
    single_roundings,
)
from toolchain.ops import arm_dsp_common
from toolchain.ops.conv import arm_dsp as conv_dsp
from toolchain.ops.elementwise import arm_dsp as elementwise_dsp
from toolchain.ops.fully_connected import arm_dsp as fully_connected_dsp
from toolchain.targets import TARGETS, get_target

DSP = ("cortex-m4", "cortex-m7", "cortex-m33")


def planned(model: bytes, target: str, **options) -> ModelPlan:
    """The model planned for `target` with its fastest kernels (a limit far above any arena
    here, so that no kernel gives its scratch up for a narrow form, and whole ops), unless
    `options` set max_arena (None: the default plan, held to the generic arena)."""
    options.setdefault("max_arena", 1 << 20)
    return plan_model(parse_model(model, "built.tflite"), "greedy", target=target, **options)


def kernels_bound(mp: ModelPlan) -> list[str]:
    return [b.variant.name if b.variant else "portable" for b in mp.program.bindings]


def pointwise_model(seed: int = 0) -> bytes:
    """1x1 CONV_2D (stride 1), 1x1 CONV_2D (stride 2), FULLY_CONNECTED: odd sizes everywhere."""
    from toolchain.front.builder import ModelBuilder

    rng = np.random.default_rng(seed)
    b = ModelBuilder("int8")
    x = b.input("x", (1, 5, 7, 6), "int8", 0.05, 3)

    def conv(x: int, shape: tuple, channels: int, stride: int, activation: str,
             input_scale: float) -> int:
        depth = shape[-1]
        scales = rng.uniform(0.004, 0.012, channels)
        weights = b.const("w", rng.integers(-127, 128, (channels, 1, 1, depth)).astype(np.int8),
                          list(scales), 0, quantized_dimension=0)
        bias = b.const("b", rng.integers(-400, 400, channels).astype(np.int32),
                       list(input_scale * scales), 0)
        out_shape = (shape[0], -(-shape[1] // stride), -(-shape[2] // stride), channels)
        y = b.tensor("y", out_shape, "int8", 0.08, -5)
        b.op("CONV_2D", [x, weights, bias], [y],
             {"padding": "SAME", "stride_h": stride, "stride_w": stride,
              "dilation_h_factor": 1, "dilation_w_factor": 1,
              "fused_activation_function": activation}, 3)
        return y

    y = conv(x, (1, 5, 7, 6), 9, 1, "NONE", 0.05)
    y = conv(y, (1, 5, 7, 9), 5, 2, "RELU", 0.08)
    flat = b.tensor("flat", (1, 3 * 4 * 5), "int8", 0.08, -5)
    b.op("RESHAPE", [y], [flat], {"new_shape": [1, 60]})
    weights = b.const("fw", rng.integers(-127, 128, (7, 60)).astype(np.int8), 0.01, 0)
    bias = b.const("fb", rng.integers(-3000, 3000, 7).astype(np.int32), 0.0008)
    out = b.tensor("out", (1, 7), "int8", 0.1, 2)
    b.op("FULLY_CONNECTED", [flat, weights, bias], [out], {"fused_activation_function": "NONE"},
         4)
    b.output(out)
    return b.build()


# -- the registry and the plan --------------------------------------------------------------


def test_targets_and_their_guards():
    assert list(TARGETS)[0] == "generic" and TARGETS["generic"].guard is None
    assert set(TARGETS) == {"generic", "cortex-m0plus", "cortex-m4", "cortex-m7", "cortex-m33",
                            "cortex-m55"}
    assert TARGETS["cortex-m4"].guard == "!defined(__ARM_ARCH_7EM__) || !defined(__ARM_FEATURE_DSP)"
    assert "defined(__ARM_FEATURE_MVE)" in TARGETS["cortex-m33"].guard  # refused on an M55
    assert TARGETS["cortex-m0plus"].board.machine == "mps2-an385"
    with pytest.raises(ArenacError, match="unknown target 'cortex-m3'"):
        get_target("cortex-m3")


def test_a_dsp_target_binds_its_kernels_and_others_the_portable_ones():
    model = pointwise_model()
    for target in DSP:
        assert kernels_bound(planned(model, target)) == ["dsp-1x1-staged", "dsp-1x1", "portable",
                                                         "dsp"]
    for target in ("generic", "cortex-m0plus"):
        assert set(kernels_bound(planned(model, target))) == {"portable"}
    assert kernels_bound(planned(model, "cortex-m55")) == ["mve-1x1", "mve-1x1", "portable", "mve"]
    assert set(kernels_bound(planned(model, "cortex-m4", portable=True))) == {"portable"}
    # a 3x3 convolution of few channels runs from widened rows, of more through im2col; a
    # dilated one keeps the portable kernel
    conv3 = conv_model("int8", True, (1, 6, 6, 4), 8, (3, 3))
    assert kernels_bound(planned(conv3, "cortex-m4")) == ["dsp-rows"]
    conv3 = conv_model("int8", True, (1, 6, 6, 16), 8, (3, 3))
    assert kernels_bound(planned(conv3, "cortex-m4")) == ["dsp-im2col"]
    dilated = conv_model("int8", True, (1, 8, 8, 4), 8, (3, 3), dilation=(2, 2))
    assert kernels_bound(planned(dilated, "cortex-m4")) == ["portable"]


def test_target_kernels_bring_their_scratch_and_overlap_into_the_plan():
    model = pointwise_model()
    mp = planned(model, "cortex-m4")
    scratch: dict[tuple[int, int], object] = {}
    for r in mp.program.scratch():
        scratch[r.op, sum(op == r.op for op, _ in scratch)] = r
    # 35 pixels of 6 channels, padded to 8, widened: 35 * 2 groups * 8 bytes; and the filter
    # rows of two channels
    assert scratch[0, 0].size == 35 * 16 and "widened" in scratch[0, 0].purpose
    assert scratch[0, 1].size == 2 * 16
    # three pixels (a Cortex-M4's block over more than one group, the most of any core's) of 9
    # channels, padded to 12: 3 * 2 words * 3 groups * 4 bytes
    assert scratch[1, 0].size == 72 and "widened" in scratch[1, 0].purpose
    assert scratch[3, 0].size == 8 * 15  # one row of 60 values: 15 groups
    # all the input is read before any output is written: any overlap
    assert mp.program.bindings[0].overlaps[0].any_offset
    rule = mp.program.bindings[1].overlaps[0]
    assert rule.kind == "windowed" and not rule.any_offset
    assert mp.program.bindings[1].overlaps != planned(model, "generic").program.bindings[1].overlaps
    ArenaInterpreter(mp).invoke(random_inputs(mp.graph, 0))  # runtime_py checks every claim



def test_a_target_kernel_keeps_its_own_state(monkeypatch):
    """A target kernel says what it keeps across invokes, as a portable kernel does: the plan
    gives it a slot of the state block, and the portable kernel's binding keeps none."""
    import toolchain.ops as ops
    from toolchain.ops.spec import StateRequest, TargetKernel

    dsp_add = ops.VARIANTS["ADD"][0]
    keeping = TargetKernel("ADD", "dsp-add-keeping", dsp_add.kernels, dsp_add.accepts,
                           dsp_add.emit, overlaps=dsp_add.overlaps,
                           state=lambda p: (StateRequest("int16", (3,), "a running sum"),))
    monkeypatch.setitem(ops.VARIANTS, "ADD", (keeping,))
    quant = ((0.05, 3), (0.04, -2), (0.08, 1))
    model = binary_model("ADD", "int8", (1, 2, 2, 4), (1, 2, 2, 4), "NONE", quant)
    mp = planned(model, "cortex-m4")
    assert mp.program.bindings[0].variant is keeping
    slots = [s for s in mp.state_slots if s.kind == "kernel"]
    assert [(s.dtype, s.shape, s.nbytes) for s in slots] == [("int16", (3,), 6)]
    assert "a running sum" in slots[0].name
    assert planned(model, "generic").state_slots == ()

def test_pointwise_overlap_follows_the_write_order():
    """The rule, replayed: every output byte the kernel writes lands on input bytes it no longer
    reads, for outputs placed exactly the declared shift below the input."""
    for shape, channels, stride in [((1, 10, 12, 8), 16, 1), ((2, 5, 6, 8), 4, 2),
                                    ((1, 7, 7, 3), 5, 2), ((3, 6, 6, 12), 12, 1)]:
        for target in ("cortex-m4", "cortex-m7"):  # blocks of three and of two pixels
            mp = planned(conv_model("int8", False, shape, channels, (1, 1), (stride, stride)),
                         target)
            m = conv_dsp.conv_matmul(mp.program.params()[0])
            shift = mp.program.bindings[0].overlaps[0].shift
            blocks = m.blocks(m.block_on(target))
            for index, (first, count) in enumerate(blocks):
                written_end = (first + count) * m.channels - shift  # relative to the input
                later = [m.input_at(p) for b, n in blocks[index + 1:] for p in range(b, b + n)]
                assert all(written_end <= start for start in later)


def test_generated_c_names_its_target_and_generic_c_is_unchanged():
    model = pointwise_model()
    generic = generate(planned(model, "generic"), "net")["net.c"]
    assert "#error" not in generic and "arm_acle" not in generic and "Target:" not in generic
    c = generate(planned(model, "cortex-m4"), "net")["net.c"]
    assert " * Target: cortex-m4 (" in c
    assert "#if !defined(__ARM_ARCH_7EM__) || !defined(__ARM_FEATURE_DSP)\n#error" in c
    assert "#include <arm_acle.h>" in c and "__smlad" in c
    assert c.index("#error") < c.index("#include <arm_acle.h>")
    assert max(len(line) for line in c.splitlines()) <= 120


def test_c_for_a_target_does_not_compile_on_the_host(tmp_path):
    files = generate(planned(pointwise_model(), "cortex-m4"), "net")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = subprocess.run([*compiler(), "-std=c99", "-c", "net.c", "-o", "net.o"],
                            cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode != 0
    assert "net.c was generated for cortex-m4" in result.stderr


# -- requantization in one rounding --------------------------------------------------------


def random_channels(seed: int, count: int, span: int):
    """`count` channels of random scales and accumulator ranges (up to `span` either side of
    0), and both references on them: TFLite's MultiplyByQuantizedMultiplier with the scales
    quantized, and FULLY_CONNECTED's double rounding."""
    rng = np.random.default_rng(seed)
    scales = np.exp(rng.uniform(np.log(2e-4), np.log(0.3), count))
    acc_lo, acc_hi = -rng.integers(1, span, count), rng.integers(1, span, count)
    quantized = [quantize_multiplier(float(s)) for s in scales]
    mult = np.array([m for m, _ in quantized], np.int64)[:, None]
    exp = np.array([e for _, e in quantized], np.int64)[:, None]

    def mbqm(acc):
        return multiply_by_quantized_multiplier(acc, mult, exp)

    def double(acc):
        return double_to_int32(round_half_away(acc.astype(np.float64) * scales[:, None]))

    return scales, quantized, acc_lo, acc_hi, mbqm, double


def test_single_rounding_equals_both_references_exhaustively():
    """Proven by thresholds, checked on every accumulator of small ranges: TFLite's
    MultiplyByQuantizedMultiplier and FULLY_CONNECTED's double rounding."""
    scales, quantized, acc_lo, acc_hi, mbqm, double = random_channels(3, 6, 40000)
    low, high = -128 - 17, 127 - 17
    found = [fc_multiplier(float(s)) for s in scales]
    cases = [(mbqm, [m for m, _ in quantized], [31 - e for _, e in quantized]),
             (double, [f[0] for f in found], [f[1] for f in found])]
    for reference, multipliers, shifts in cases:
        roundings = single_roundings(reference, low, high, acc_lo, acc_hi, multipliers, shifts)
        assert roundings is not None
        if reference is mbqm:  # its M and N: the roundings of the two signs 2^31 apart
            assert {r.rounding - r.negative_rounding for r in roundings} == {SIGN_STEP}
        for c, r in enumerate(roundings):
            acc = np.arange(acc_lo[c], acc_hi[c] + 1, dtype=np.int64)
            want = np.clip(reference(np.broadcast_to(acc, (6, acc.size)))[c], low, high)
            rounding = np.where(acc < 0, r.negative_rounding, r.rounding)
            got = np.clip((acc * r.multiplier + rounding) >> r.shift, low, high)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("low", [0, -60])
def test_shared_rounding_equals_both_references_exhaustively(low):
    """One N and one R for both signs, on every accumulator of random channels: where the
    clamp leaves out the negative outputs (an activation) and where it keeps a few of them."""
    scales, quantized, acc_lo, acc_hi, mbqm, double = random_channels(5, 6, 40000)
    high = 255
    cases = [(mbqm, [m * 2.0 ** (e - 31) for m, e in quantized]), (double, list(scales))]
    for reference, real in cases:
        roundings = shared_roundings(reference, low, high, acc_lo, acc_hi, real)
        if roundings is None:
            assert low < 0  # halves of both signs: no R serves both
            continue
        assert len({r.shift for r in roundings}) == 1
        for c, r in enumerate(roundings):
            assert r.rounding == r.negative_rounding and 0 <= r.multiplier < 2**31
            acc = np.arange(acc_lo[c], acc_hi[c] + 1, dtype=np.int64)
            want = np.clip(reference(np.broadcast_to(acc, (6, acc.size)))[c], low, high)
            got = np.clip((acc * r.multiplier + r.rounding) >> r.shift, low, high)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("zero_point", [0, -128, 37])
def test_high_word_rounding_equals_the_reference_exhaustively(zero_point):
    """Every R in a shared rounding's interval serves, its ends included; and the high-word
    form, the accumulator offset and one SMMLA's high word shifted, equals the reference
    (plus the zero point, folded into R) on every accumulator, wide ranges included."""
    _, quantized, acc_lo, acc_hi, reference, _ = random_channels(11, 8, 300000)
    low, high = -128 - zero_point, 127 - zero_point
    if low < 0 < high:
        low = 0  # an activation: no halves of both signs
    roundings = shared_roundings(reference, low, high, acc_lo, acc_hi,
                                 [m * 2.0 ** (e - 31) for m, e in quantized])
    assert roundings is not None
    offsets = []
    for c, r in enumerate(roundings):
        acc = np.arange(acc_lo[c], acc_hi[c] + 1, dtype=np.int64)
        want = np.clip(reference(np.broadcast_to(acc, (8, acc.size)))[c], low, high)
        for rounding in (r.least, r.greatest):
            np.testing.assert_array_equal(
                np.clip((acc * r.multiplier + rounding) >> r.shift, low, high), want)
        fold = zero_point << r.shift
        found = high_word(r, fold, int(acc_lo[c]), int(acc_hi[c]))
        assert found is not None
        offsets.append(found.offset)
        # SMMLA: the high word of the 64-bit sum; then the shift SSAT takes
        word = ((acc + found.offset) * r.multiplier + (found.high << 32)) >> 32
        got = np.clip(word >> (r.shift - 32), low + zero_point, high + zero_point)
        np.testing.assert_array_equal(got, want + zero_point)
    assert any(offsets)  # the offset is needed, not only zero


@pytest.mark.parametrize("zero_point", [0, -128, 37])
def test_high_word_by_sign_equals_the_reference_exhaustively(zero_point):
    """Outputs of both signs: each channel's negative rounding as an offset in the sum and a
    high word, SMMLA below zero and SMMLAR (2^31 more) from zero on, shifted, equals
    MultiplyByQuantizedMultiplier (plus the zero point) on every accumulator."""
    _, quantized, acc_lo, acc_hi, reference, _ = random_channels(12, 8, 300000)
    low, high = -128 - zero_point, 127 - zero_point
    roundings = single_roundings(reference, low, high, acc_lo, acc_hi,
                                 [m for m, _ in quantized], [31 - e for _, e in quantized])
    assert roundings is not None
    for c, r in enumerate(roundings):
        assert r.rounding - r.negative_rounding == SIGN_STEP and r.least <= r.greatest
        found = high_word(r, zero_point << r.shift, int(acc_lo[c]), int(acc_hi[c]))
        assert found is not None
        acc = np.arange(acc_lo[c], acc_hi[c] + 1, dtype=np.int64)
        want = np.clip(reference(np.broadcast_to(acc, (8, acc.size)))[c], low, high)
        product = (acc + found.offset) * r.multiplier + (found.high << 32)
        word = np.where(acc < 0, product, product + 2**31) >> 32
        got = np.clip(word >> (r.shift - 32), low + zero_point, high + zero_point)
        np.testing.assert_array_equal(got, want + zero_point)


def test_first_multiple_is_the_least_solution():
    rng = np.random.default_rng(3)
    for _ in range(3000):
        m = int(rng.integers(1, 400))
        a, lo = int(rng.integers(0, 500)), int(rng.integers(0, m))
        hi = int(rng.integers(lo, m))
        want = next((x for x in range(m + 1) if lo <= a * x % m <= hi), None)
        assert first_multiple(a, m, lo, hi) == want
    # at full width: the least x with 2^31 + 5 <= x * M mod 2^32 <= 2^31 + 900
    m = 1124042518
    x = first_multiple(m, 2**32, 2**31 + 5, 2**31 + 900)
    assert x is not None and 2**31 + 5 <= x * m % 2**32 <= 2**31 + 900


def test_shared_rounding_refuses_halves_of_both_signs():
    # MultiplyByQuantizedMultiplier rounds -0.5 to -1 and 0.5 to 1: no R does both
    def reference(acc):
        return multiply_by_quantized_multiplier(acc, 2**30, -1)

    assert shared_roundings(reference, -100, 100, np.array([-300]), np.array([300]),
                            [2.0**-2]) is None
    assert shared_roundings(reference, 0, 100, np.array([-300]), np.array([300]),
                            [2.0**-2]) is not None


def test_single_rounding_refuses_what_it_cannot_match():
    # a multiplier far from the reference's scale cannot reproduce its thresholds
    def reference(acc):
        return np.round(acc / 3.0).astype(np.int64)

    assert single_roundings(reference, -100, 100, np.array([-300]), np.array([300]),
                            [2**30], [32]) is None
    assert fc_multiplier(0.5) is None and fc_multiplier(0.0) is None


# -- the command line -------------------------------------------------------------------------


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["gen", "check", "plan", "bench"])
def test_an_unknown_target_is_one_clear_line(capsys, tmp_path, command):
    path = tmp_path / "m.tflite"
    path.write_bytes(pointwise_model())
    extra = ["-o", str(tmp_path / "out")] if command == "gen" else []
    with pytest.raises(SystemExit) as exit_info:
        main([command, str(path), *extra, "--target", "cortex-m3"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "unknown target 'cortex-m3'" in err and "cortex-m4" in err
    assert not (tmp_path / "out").exists()


def test_check_refuses_host_c_for_a_target(capsys, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(pointwise_model())
    code, out, err = run(capsys, "check", str(path), "--target", "cortex-m4", "--backends", "c")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "runs under --backends runtime_py,qemu" in err
    assert str(path) in err


def test_target_kernels_need_word_aligned_plans(capsys, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(pointwise_model())
    code, _, err = run(capsys, "plan", str(path), "--target", "cortex-m4", "--align", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "alignment of at least 4 (not 2)" in err and str(path) in err
    assert run(capsys, "plan", str(path), "--target", "cortex-m0plus", "--align", "2")[0] == 0


def test_gen_writes_target_c(capsys, tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(pointwise_model())
    code, out, _ = run(capsys, "gen", str(path), "-o", str(tmp_path / "c"), "--target",
                       "cortex-m33")
    assert code == 0
    assert "generated for cortex-m33" in (tmp_path / "c" / "m.c").read_text()


# -- under QEMU ------------------------------------------------------------------------------


def assert_qemu_matches_oracle(model: bytes, target: str = "cortex-m4", inputs: int = 2,
                               **options) -> None:
    """The target's C under QEMU, runtime_py and TFLite's reference kernels agree bit for
    bit (the outputs vary: a kernel cannot pass by saturating)."""
    mp = planned(model, target, **options)
    assert set(kernels_bound(mp)) - {"portable"}, "no target kernel to check"
    with QemuBackend(mp) as backend:
        report = check_plan(mp, model, inputs, 0, [("qemu", backend.invoke_many)])
    assert report.ok, report.as_dict()
    outputs = ArenaInterpreter(mp).invoke(random_inputs(mp.graph, 0))
    assert all(np.unique(o).size > 2 for o in outputs)


@needs_mcu
@pytest.mark.parametrize("case", [
    # a small input of stride 1 is widened whole first: depth a multiple of 4, odd pixel count
    dict(input_shape=(1, 5, 7, 8), out_channels=16, kernel="dsp-1x1-staged"),
    dict(input_shape=(2, 4, 3, 6), out_channels=7, per_channel=True,  # batches, odd channels
         kernel="dsp-1x1-staged"),
    dict(input_shape=(1, 3, 3, 21), out_channels=5, per_channel=True, activation="RELU",
         kernel="dsp-1x1-staged"),
    dict(input_shape=(1, 2, 3, 72), out_channels=6, activation="RELU6",  # 18 steps written out
         kernel="dsp-1x1-staged"),
    dict(input_shape=(1, 2, 3, 136), out_channels=6, kernel="dsp-1x1-staged"),  # a loop of steps
    dict(input_shape=(1, 2, 5, 12), out_channels=9,  # three triples of pixels and one more
         kernel="dsp-1x1-staged"),
    dict(input_shape=(1, 10, 11, 5), out_channels=6, activation="RELU", kernel="dsp-1x1"),
    dict(input_shape=(1, 6, 5, 13), out_channels=5, stride=(2, 2), activation="RELU",
         kernel="dsp-1x1"),
    dict(input_shape=(1, 1, 1, 40), out_channels=10, activation="RELU6", bias=False,
         kernel="dsp-1x1"),
    dict(input_shape=(1, 3, 9, 70), out_channels=3, stride=(1, 2), per_channel=True,
         kernel="dsp-1x1"),
    # three pixels a block, the filter widened in flash (120 pixels): 40 triples
    dict(input_shape=(1, 12, 10, 40), out_channels=5, kernel="dsp-1x1"),
])
def test_dsp_1x1_convolution_is_bit_exact(case):
    case = {"per_channel": False, **case}
    kernel = case.pop("kernel")
    model = conv_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                       case.pop("out_channels"), (1, 1), **case)
    assert kernels_bound(planned(model, "cortex-m4")) == [kernel]
    assert_qemu_matches_oracle(model)


@needs_mcu
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 6, 7, 8), out_channels=8, kernel=(3, 3), per_channel=True),
    dict(input_shape=(1, 9, 8, 7), out_channels=5, kernel=(3, 3), stride=(2, 2)),
    # odd stride x depth: windows starting between words, which the rows kernel refuses
    dict(input_shape=(2, 7, 6, 5), out_channels=7, kernel=(3, 2), padding="VALID",
         activation="RELU"),
    dict(input_shape=(1, 5, 1, 9), out_channels=3, kernel=(3, 1), stride=(1, 1), bias=False),
    dict(input_shape=(1, 4, 5, 6), out_channels=4, kernel=(1, 1), padding="SAME",
         stride=(1, 3), per_channel=True),
    # three pixels a block: rows widened straight from the input, and copied first
    dict(input_shape=(1, 8, 9, 6), out_channels=6, kernel=(3, 3), per_channel=True),
    dict(input_shape=(1, 7, 11, 5), out_channels=3, kernel=(3, 3), stride=(1, 1),
         activation="RELU"),
    # widened straight from the input in blocks that run across rows, the image's last block
    # of two whole windows (the int8 copies: two windows, not three), and with no shorter
    # block (one filter row of three)
    dict(input_shape=(1, 5, 7, 8), out_channels=6, kernel=(3, 3), per_channel=True),
    dict(input_shape=(1, 7, 9, 8), out_channels=8, kernel=(3, 3), activation="RELU6"),
    # batches, stride 2: each image's 25 pixels eight blocks across rows and one pixel alone
    dict(input_shape=(2, 9, 10, 8), out_channels=6, kernel=(3, 3), stride=(2, 2),
         input_zero_point=-128),
    # one output column: every block across rows, its pixels' windows one below another
    dict(input_shape=(1, 9, 1, 8), out_channels=6, kernel=(3, 3), stride=(2, 2)),
])
def test_dsp_im2col_convolution_is_bit_exact(case):
    case = {"per_channel": False, **case}
    model = conv_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                       case.pop("out_channels"), case.pop("kernel"), **case)
    assert set(kernels_bound(planned(model, "cortex-m4"))) <= {"dsp-1x1", "dsp-1x1-staged",
                                                              "dsp-im2col"}
    assert_qemu_matches_oracle(model)


ROWS_CASES = [
    # stride 1, SAME: two of three rows kept from the row before, a last pixel alone
    dict(input_shape=(1, 6, 7, 4), out_channels=8, kernel=(3, 3), per_channel=True),
    # the first convolution of an image network: 3 colours, stride 2, an odd channel last
    dict(input_shape=(1, 9, 8, 3), out_channels=5, kernel=(3, 3), stride=(2, 2)),
    # one channel, an odd left padding (the rows widened value by value), 5 filter rows
    dict(input_shape=(1, 12, 6, 1), out_channels=6, kernel=(5, 4), stride=(2, 2),
         per_channel=True, activation="RELU6", input_zero_point=-128),
    # batches, VALID, rows of 32 values widened two words a trip, two pixels left over
    dict(input_shape=(2, 8, 8, 4), out_channels=4, kernel=(3, 3), padding="VALID",
         activation="RELU"),
    # one output row (nothing kept), four words a filter row
    dict(input_shape=(1, 4, 10, 2), out_channels=3, kernel=(4, 4), padding="VALID",
         bias=False),
    # a vertical stride past the filter's height: no row read twice
    dict(input_shape=(1, 9, 7, 2), out_channels=6, kernel=(1, 3), stride=(3, 1)),
    # deep, its 72 steps written out: a row of three blocks of three pixels and one of one,
    # whose steps take four channels, then the odd channel last
    dict(input_shape=(1, 10, 10, 16), out_channels=5, kernel=(3, 3), per_channel=True,
         activation="RELU"),
    # deep, stride 2: one row kept, blocks of three and two pixels, the two four channels a step
    dict(input_shape=(1, 22, 22, 8), out_channels=4, kernel=(3, 3), stride=(2, 2),
         input_zero_point=-128),
    # deep by its 25 steps, written out, batches, VALID; the last two pixels by a channel
    # quad, then a pair
    dict(input_shape=(2, 11, 12, 2), out_channels=6, kernel=(5, 5), padding="VALID"),
    # deep, 48 words a filter row: 144 steps written out, the most
    dict(input_shape=(1, 10, 11, 32), out_channels=2, kernel=(3, 3), bias=False),
    # deep, 96 words a filter row: 288 steps, a loop over the filter rows, two trips of 48
    dict(input_shape=(1, 10, 12, 64), out_channels=3, kernel=(3, 3), activation="RELU"),
    # 72 steps, but lines of 1,056 values: the last filter row's words further than a load's
    # offset reaches from the first's, so a loop of one trip of 24 words a filter row
    dict(input_shape=(1, 3, 64, 16), out_channels=4, kernel=(3, 3), per_channel=True),
    # an image's first layer at stride 1: three colours, each pixel padded by a zero value
    dict(input_shape=(1, 12, 11, 3), out_channels=5, kernel=(3, 3), per_channel=True,
         activation="RELU"),
]


@needs_mcu
@pytest.mark.parametrize("case", ROWS_CASES)
def test_dsp_rows_convolution_is_bit_exact(case):
    case = {"per_channel": False, **case}
    model = conv_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                       case.pop("out_channels"), case.pop("kernel"), **case)
    assert kernels_bound(planned(model, "cortex-m4")) == ["dsp-rows"]
    assert_qemu_matches_oracle(model)


def test_im2col_copies_as_int8_only_what_it_widens_from_a_copy():
    """Windows that widen straight from the input ask for int8 room for one filter row of each
    pixel of a block (the rows outside the image), the image's shorter last block included
    (the blocks run in the output's order, across rows): a stripe of the op asks no more."""
    for shape, pixels, rest in (((1, 5, 7, 8), 35, 2), ((1, 7, 9, 4), 63, 0)):
        model = conv_model("int8", False, shape, 4, (3, 3))
        (binding,) = planned(model, "cortex-m4", given_up={0: ("dsp-rows", "dsp-rows-direct")}
                             ).program.bindings
        d = conv_dsp.im2col_of(binding.params)
        assert binding.variant.name == "dsp-im2col" and conv_dsp.widens_directly(d)
        assert (d.out_h * d.out_w, d.out_h * d.out_w % d.matmul.block) == (pixels, rest)
        assert binding.scratch[1].size == 3 * d.row < 3 * d.window
        c = generate(planned(model, "cortex-m4", given_up={0: ("dsp-rows", "dsp-rows-direct")}),
                     "net")["net.c"]
        assert ("net_op0_widen_last(pairs, windows, xb, 33);" in c) == (rest == 2)


def test_the_rows_kernel_leaves_what_it_does_not_run_to_im2col():
    for shape, kernel, stride in [((1, 6, 6, 3), (3, 3), (1, 1)),  # odd stride x depth, 36
                                  # output pixels, and over 100 but of one value a pixel
                                  ((1, 12, 12, 1), (3, 3), (1, 1)),
                                  # too deep to write out, over fewer than 100 pixels, whose
                                  # int8 filter the im2col kernel keeps
                                  ((1, 6, 6, 8), (3, 3), (1, 1)),  # 12 words a filter row
                                  ((1, 8, 8, 2), (5, 5), (1, 1)),  # 25 steps a block
                                  # 53 words a filter row, 159 steps: a loop
                                  # over its rows, one word a trip at most
                                  ((1, 6, 56, 2), (3, 53), (1, 1))]:
        model = conv_model("int8", True, shape, 4, kernel, stride=stride)
        assert kernels_bound(planned(model, "cortex-m4")) == ["dsp-im2col"]
    # a deep one that gives the rows' scratch up goes to im2col, whose scratch is smaller,
    # before any form without scratch
    model = conv_model("int8", True, (1, 10, 10, 16), 4, (3, 3))
    rows, = planned(model, "cortex-m4").program.bindings
    im2col, = planned(model, "cortex-m4", given_up={0: ("dsp-rows",)}).program.bindings
    assert (rows.variant.name, im2col.variant.name) == ("dsp-rows", "dsp-im2col")
    assert sum(s.size for s in im2col.scratch) < sum(s.size for s in rows.scratch)
    direct, = planned(model, "cortex-m4", given_up={0: ("dsp-rows", "dsp-im2col")}
                      ).program.bindings
    assert direct.variant.name == "dsp-im2col-direct"
    model = conv_model("int8", True, (1, 8, 8, 4), 6, (3, 3), stride=(2, 2))
    scratch = planned(model, "cortex-m4").program.scratch()[0]
    # 3 rows of int16 lines reaching the last window's end: 3 strides of 8 values and its 12,
    # past the 32 values of the row (the padding is on the right only)
    assert scratch.size == 3 * (3 * 8 + 12) * 2 and "widened" in scratch.purpose


@needs_mcu
@pytest.mark.parametrize("target", ["cortex-m7", "cortex-m33"])
def test_dsp_rows_on_the_other_dsp_cores(target):
    """The rows kernel on the Cortex-M7 (its three-pixel blocks one software pipeline) and the
    M33 (runs of loads, as on the M4), an image's first layer and a deep filter written out."""
    for model in (conv_model("int8", True, (1, 9, 10, 3), 7, (3, 3), stride=(2, 2), seed=1),
                  conv_model("int8", False, (1, 10, 10, 16), 5, (3, 3), activation="RELU")):
        mp = planned(model, target)
        assert kernels_bound(mp) == ["dsp-rows"]
        c = generate(mp, "net")["net.c"]
        # a pipeline loads the next step's word into the register the last one read
        assert bool(re.search(r"^ +x0 = arenac_load32\(", c, re.M)) == (target == "cortex-m7")
        assert_qemu_matches_oracle(model, target)


DIRECT_CASES = [
    # the first convolution of an image network: 3 colours, stride 2, an odd channel last; the
    # filter row's ninth value read alone, the last column over the right padding
    dict(input_shape=(1, 9, 8, 3), out_channels=5, kernel=(3, 3), stride=(2, 2),
         given_up=("dsp-rows",)),
    # one channel, padding on both sides (the edge function left and right), rows of padding
    dict(input_shape=(1, 12, 9, 1), out_channels=6, kernel=(5, 4), stride=(2, 2),
         per_channel=True, activation="RELU6", input_zero_point=-128, given_up=("dsp-rows",)),
    # batches, VALID: every column inside, three words a filter row, an odd last column
    dict(input_shape=(2, 8, 9, 4), out_channels=4, kernel=(3, 3), padding="VALID",
         activation="RELU", given_up=("dsp-rows",)),
    # a depthwise convolution of one channel as the audio networks' first layer: ten filter
    # rows written out, two columns of edges each side
    dict(input_shape=(1, 21, 16, 1), out_channels=8, kernel=(10, 8), stride=(2, 2),
         per_channel=True, given_up=("dsp-im2col",), depthwise=True),
    # seven filter rows of four words: a loop over the filter rows, im2col's form (over 99
    # pixels: the rows kernel's loop takes 100 or more)
    dict(input_shape=(1, 9, 11, 2), out_channels=3, kernel=(7, 8), bias=False,
         given_up=("dsp-im2col",)),
    # deep: filter rows of twelve words in a loop four words a trip, an edge each side whose
    # taps over the padding are skipped
    dict(input_shape=(1, 6, 7, 16), out_channels=5, kernel=(3, 3), per_channel=True,
         given_up=("dsp-im2col",)),
    # deep, three words a tap (a trip each), batches, stride 2, the edge on the right only
    dict(input_shape=(2, 9, 8, 12), out_channels=6, kernel=(3, 3), stride=(2, 2),
         activation="RELU6", input_zero_point=-128, given_up=("dsp-im2col",)),
]


@needs_mcu
@pytest.mark.parametrize("case", DIRECT_CASES)
def test_dsp_direct_convolution_is_bit_exact(case):
    """dsp-rows-direct and dsp-im2col-direct, what the rows and im2col kernels give their
    scratch up for: each window's words read from the input and widened in registers."""
    case = {"per_channel": False, **case}
    given_up = {0: case.pop("given_up")}
    if case.pop("depthwise", False):
        model = depthwise_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                                case.pop("kernel"), multiplier=case.pop("out_channels"),
                                **case)
    else:
        model = conv_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                           case.pop("out_channels"), case.pop("kernel"), **case)
    wide = planned(model, "cortex-m4")
    direct = planned(model, "cortex-m4", given_up=given_up)
    (name,) = given_up[0]
    assert kernels_bound(wide) == [name]
    assert kernels_bound(direct) == [f"{name}-direct"] and not direct.lifetimes.scratch
    assert_qemu_matches_oracle(model, given_up=given_up)


@needs_mcu
@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m7"])  # kept in order, scheduled
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 10, 11, 8), out_channels=6, activation="RELU"),  # an odd last pixel
    dict(input_shape=(2, 9, 7, 24), out_channels=7, stride=(2, 2), per_channel=True),
    dict(input_shape=(1, 12, 12, 64), out_channels=5),  # sixteen words: a loop, four a trip
])
def test_dsp_1x1_without_scratch_is_bit_exact(case, target):
    """dsp-1x1-direct, what dsp-1x1 gives its scratch up for: the direct kernel on a 1x1
    filter, each pixel's words widened in registers, two pixels by two channels a step."""
    case = {"per_channel": False, **case}
    model = conv_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                       case.pop("out_channels"), (1, 1), **case)
    given_up = {0: ("dsp-1x1",)}
    direct = planned(model, target, given_up=given_up)
    assert kernels_bound(direct) == ["dsp-1x1-direct"] and not direct.lifetimes.scratch
    assert_qemu_matches_oracle(model, target, given_up=given_up)
    # not at a depth of a partial word (its last pixel's word would read past the row)
    odd = conv_model("int8", False, (1, 9, 7, 6), 3, (1, 1), stride=(2, 2))
    assert kernels_bound(planned(odd, target, given_up=given_up)) == ["dsp-im2col"]


@needs_mcu
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 6, 7, 8), kernel=(3, 3), per_channel=True),  # SAME: an edge each side
    dict(input_shape=(2, 9, 8, 12), kernel=(3, 3), stride=(2, 2), activation="RELU6",
         input_zero_point=-128),  # batches, stride 2: the right edge and the last row padded
    dict(input_shape=(1, 7, 9, 8), kernel=(5, 4), padding="VALID", bias=False),
])
def test_dsp_depthwise_without_scratch_is_bit_exact(case):
    """dsp-depthwise-direct, what the depthwise kernels give their scratch up for: each tap's
    four channels read as a word and widened in registers."""
    case = {"per_channel": False, **case}
    model = depthwise_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                            case.pop("kernel"), **case)
    given_up = {0: ("dsp-depthwise", "dsp-depthwise-narrow")}
    direct = planned(model, "cortex-m4", given_up=given_up)
    assert kernels_bound(direct) == ["dsp-depthwise-direct"] and not direct.lifetimes.scratch
    assert_qemu_matches_oracle(model, given_up=given_up)


def test_the_direct_kernel_leaves_what_it_cannot_read_by_words():
    """A filter row of more than eight words whose taps are not whole words, and windows
    none of whose words lie inside a row, keep the portable kernel where their scratch is given
    up."""
    for shape, kernel in [((1, 6, 6, 14), (3, 3)),  # 42 values: eleven words
                          ((1, 6, 3, 1), (3, 5)),  # five values in rows of three
                          ((1, 6, 9, 4), (1, 3))]:  # one filter row
        model = conv_model("int8", True, shape, 4, kernel)
        (binding,) = planned(model, "cortex-m4", given_up={0: ("dsp-rows", "dsp-im2col")}
                             ).program.bindings
        assert binding.variant is None


@needs_mcu
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 8), units=4),
    dict(input_shape=(3, 21), units=5, activation="RELU", per_channel=True),
    dict(input_shape=(2, 3, 8), units=6, bias=False),
    dict(input_shape=(1, 300), units=9, activation="RELU6"),  # unrolled loop and a rest
    dict(input_shape=(5, 300), units=4),  # three batches a block, then two
])
def test_dsp_fully_connected_is_bit_exact(case):
    model = fully_connected_model("int8", **case)
    assert kernels_bound(planned(model, "cortex-m4")) == ["dsp"]
    assert_qemu_matches_oracle(model)


@needs_mcu
@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m7"])
@pytest.mark.parametrize("case", [
    # dense layers: one batch row, four channels a step (then an odd one); three a block
    dict(model=("fc", (1, 200), 32), step="1x4"),
    dict(model=("fc", (1, 300), 9), step="1x4"),
    dict(model=("fc", (3, 128), 40), step="3x2"),
    # im2col convolutions of an image of one pixel, and of one that ends in a block of two
    dict(model=("conv", (1, 1, 1, 7), 24), step="1x4"),
    dict(model=("conv", (1, 4, 2, 32), 32), step="2x2"),
    # without scratch (dsp-direct): the lift of the int8 inputs, a partial word last
    dict(model=("fc", (1, 203), 18), step="1x4_word", kernel="dsp-direct"),
])
def test_dsp_joint_words_are_bit_exact(case, target):
    """Where joint words pay (many channels, few pixels a block), each channel pair's steps
    read them, the pixels' lifts taken; bit-exact under QEMU."""
    kind, shape, channels = case["model"]
    model = (fully_connected_model("int8", input_shape=shape, units=channels, per_channel=True)
             if kind == "fc" else
             conv_model("int8", True, shape, channels, (3, 1), activation="RELU"))
    kernel = case.get("kernel", "dsp" if kind == "fc" else "dsp-im2col")
    options = {"given_up": {0: ("dsp",)}} if kernel == "dsp-direct" else {}
    mp = planned(model, target, **options)
    assert kernels_bound(mp) == [kernel]
    c = generate(mp, "net")["net.c"]
    lift = "arenac_lift_bytes(" if kernel == "dsp-direct" else "arenac_lift("
    assert f"arenac_mac_{case['step']}_joint(acc" in c and lift in c
    if case["step"] == "3x2":  # half a group a run of single loads on the single-issue core
        assert ("pixels' words in one run of four" in c) == (target == "cortex-m4")
    assert_qemu_matches_oracle(model, target, **options)


def int16_lanes(word: int) -> tuple[int, int]:
    """A word's two int16 lanes, the lower first."""
    low, high = word & 0xFFFF, (word >> 16) & 0xFFFF
    return low - (low >> 15 << 16), high - (high >> 15 << 16)


def smlad(x: int, w: int, acc: int) -> int:
    """__smlad: both lane products added to acc, the sum wrapped to int32 as the core does."""
    (x0, x1), (w0, w1) = int16_lanes(x), int16_lanes(w)
    return (acc + x0 * w0 + x1 * w1 + 2**31) % 2**32 - 2**31


def sxtb16_ror8(word: int) -> int:
    """Bytes 1 and 3 of a word sign-extended to int16 lanes."""
    b1, b3 = (word >> 8) & 0xFF, (word >> 24) & 0xFF
    return ((b1 - (b1 >> 7 << 8)) & 0xFFFF) | ((b3 - (b3 >> 7 << 8)) & 0xFFFF) << 16


def test_joint_words_give_both_channels_sums_exactly_where_the_joint_sum_wraps():
    """The joint words' arithmetic (arenac_mac_1x4_joint, arenac_joint_start and _first), word
    by word as the C does it, on the extremes of int8 over a depth whose joint sums wrap."""
    depth, rng = 2048, np.random.default_rng(3)
    x = rng.choice([-128, 127], depth)
    along = np.where(x < 0, -128, 127)  # second channels whose sums reach 2^25
    weights = rng.integers(-128, 128, (4, depth))
    weights[1], weights[3] = along, -along - 1
    weights[:, ::9] = rng.integers(-128, 128, (4, -(-depth // 9)))
    m = arm_dsp_common.Matmul(1, 1, 1, 0, 0, depth, depth, 4, weights, np.zeros(4, np.int64), 0)
    words = [int(w) & 0xFFFFFFFF
             for w in m.packed(joint=True).astype(np.uint8).view("<u4")]
    quads = [[int(v) & 0xFFFF for v in q] for q in x.reshape(-1, 4)]
    pairs = [(q[0] | q[2] << 16, q[1] | q[3] << 16) for q in quads]  # (x0, x2), (x1, x3)
    lift = 128 * int(x.sum())
    sums = weights @ x
    for pair in range(2):
        joint, second = -lift, 0  # the channels' sums start at zero
        for group in range(m.groups):
            for half in range(2):
                word = words[(pair * m.groups + group) * 2 + half]
                joint = smlad(pairs[group][half], word, joint)
                second = smlad(pairs[group][half], sxtb16_ror8(word), second)
        first = (joint - (second << 8) + 2**31) % 2**32 - 2**31
        assert (first, second) == (sums[2 * pair], sums[2 * pair + 1])
        assert abs(256 * int(sums[2 * pair + 1]) + int(sums[2 * pair])) > 2**31  # it wraps


@needs_mcu
@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m7"])  # kept in order, scheduled
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 8), units=4),
    dict(input_shape=(1, 21), units=5, activation="RELU", per_channel=True),  # a partial word
    dict(input_shape=(1, 2), units=7, bias=False),  # one partial word only
    dict(input_shape=(1, 300), units=9, activation="RELU6"),  # unrolled loop and a rest
])
def test_dsp_fully_connected_without_scratch_is_bit_exact(case, target):
    """dsp-direct, what dsp gives its scratch up for: the input words widened in registers."""
    model = fully_connected_model("int8", **case)
    direct = {"given_up": {0: ("dsp",)}}
    mp = planned(model, target, **direct)
    assert kernels_bound(mp) == ["dsp-direct"] and not mp.lifetimes.scratch
    assert_qemu_matches_oracle(model, target, **direct)


@needs_mcu
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 6, 9, 24), kernel=(3, 3), per_channel=True),  # six groups of four
    dict(input_shape=(2, 7, 6, 20), kernel=(3, 3), stride=(2, 2), padding="VALID",
         activation="RELU6"),  # five groups, batches, stride 2
])
def test_dsp_depthwise_in_narrow_groups_is_bit_exact(case):
    """dsp-depthwise-narrow, what dsp-depthwise gives its scratch up for: the same kernel four
    channels a group, a quarter of the scratch of sixteen or less."""
    case = {"per_channel": False, **case}
    model = depthwise_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                            case.pop("kernel"), **case)
    wide = planned(model, "cortex-m4")
    narrow = planned(model, "cortex-m4", given_up={0: ("dsp-depthwise",)})
    assert kernels_bound(wide) == ["dsp-depthwise"]
    assert kernels_bound(narrow) == ["dsp-depthwise-narrow"]
    sizes = [sum(r.size for r in mp.lifetimes.scratch) for mp in (wide, narrow)]
    assert sizes[1] * 3 <= sizes[0]
    assert_qemu_matches_oracle(model, given_up={0: ("dsp-depthwise",)})


@needs_mcu
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 6, 7, 5), kernel=(3, 3)),  # odd channel count, SAME
    dict(input_shape=(1, 9, 8, 6), kernel=(3, 3), stride=(2, 2), per_channel=True),
    dict(input_shape=(1, 7, 9, 3), kernel=(3, 3), padding="VALID", activation="RELU6"),
    dict(input_shape=(2, 8, 7, 7), kernel=(3, 3), stride=(2, 2), padding="VALID",
         per_channel=True, input_zero_point=-128),
    dict(input_shape=(1, 6, 10, 4), kernel=(5, 4), stride=(1, 2), per_channel=True,
         activation="RELU", bias=False),
    dict(input_shape=(1, 5, 5, 8), kernel=(1, 1), per_channel=True),
    dict(input_shape=(1, 5, 6, 20), kernel=(3, 3), per_channel=True),  # a loop of channels
    # pixel pairs sharing their words: three words a filter row, and a vertical stride
    dict(input_shape=(1, 7, 9, 4), kernel=(3, 5), per_channel=True, activation="RELU"),
    dict(input_shape=(2, 9, 6, 3), kernel=(3, 3), stride=(2, 1), input_zero_point=-128),
    # rows too wide to write out pair by pair: a loop of pairs, and an odd last pixel
    dict(input_shape=(1, 4, 31, 4), kernel=(3, 3), per_channel=True),
    dict(input_shape=(1, 5, 53, 3), kernel=(3, 3), stride=(2, 2), activation="RELU"),
    dict(input_shape=(1, 7, 11, 2), kernel=(3, 5), stride=(2, 2), per_channel=True),
    # channels in groups: two of 16 (batches, VALID, stride 2), three of 12 (SAME, stride 1)
    dict(input_shape=(2, 7, 6, 32), kernel=(3, 3), stride=(2, 2), padding="VALID",
         per_channel=True, activation="RELU6"),
    dict(input_shape=(1, 6, 9, 24), kernel=(3, 3), per_channel=True, input_zero_point=-128),
    # rows of 5, 3 and 29 pixels at stride 1: one block of five, one of three, and a loop of
    # fours before a last block of five
    dict(input_shape=(1, 5, 5, 8), kernel=(3, 3), activation="RELU"),
    dict(input_shape=(1, 4, 3, 8), kernel=(3, 3), per_channel=True),
    dict(input_shape=(1, 3, 29, 4), kernel=(3, 3), per_channel=True),
    # the loop of a row too wide to write out reading each channel's record through a pointer
    # (the output stage of one SMMLA), the input copied two pixels at a time
    dict(input_shape=(1, 4, 29, 8), kernel=(3, 3), per_channel=True, activation="RELU"),
])
def test_dsp_depthwise_convolution_is_bit_exact(case):
    case = {"per_channel": False, **case}
    model = depthwise_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                            case.pop("kernel"), **case)
    assert kernels_bound(planned(model, "cortex-m4")) == ["dsp-depthwise"]
    assert_qemu_matches_oracle(model)


@needs_mcu
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 9, 9, 1), kernel=(3, 3), multiplier=8, stride=(2, 2), padding="VALID",
         per_channel=True, bound="dsp-rows"),
    dict(input_shape=(2, 6, 7, 1), kernel=(3, 2), multiplier=3, activation="RELU",
         bound="dsp-im2col"),  # stride 1 over one value a pixel: windows between words
])
def test_dsp_depthwise_of_one_channel_is_a_convolution(case):
    case = {"per_channel": False, **case}
    kernel = case.pop("bound")
    model = depthwise_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                            case.pop("kernel"), **case)
    assert kernels_bound(planned(model, "cortex-m4")) == [kernel]
    assert_qemu_matches_oracle(model)


@needs_mcu
@pytest.mark.parametrize("target", ["cortex-m7", "cortex-m33"])
@pytest.mark.parametrize("shape, stride, activation", [
    ((1, 7, 6, 9), (2, 2), "NONE"),
    # a row too wide to write out: a loop of blocks reading each channel's record through a
    # pointer (the output stage of one SMMLA), the input copied two pixels at a time after an
    # odd first column
    ((1, 4, 29, 8), (1, 1), "RELU"),
])
def test_dsp_depthwise_on_the_other_dsp_cores(target, shape, stride, activation):
    model = depthwise_model("int8", True, shape, (3, 3), stride=stride, activation=activation,
                            seed=1)
    assert kernels_bound(planned(model, target)) == ["dsp-depthwise"]
    assert_qemu_matches_oracle(model, target)


@needs_mcu
def test_the_overlap_the_dsp_depthwise_kernel_declares_is_used_and_safe():
    model = depthwise_model("int8", True, (1, 10, 10, 8), (3, 3), stride=(2, 2), seed=2)
    mp = planned(model, "cortex-m4")
    assert kernels_bound(mp) == ["dsp-depthwise"]
    assert mp.plan.overlaps, "a stride-2 output may lie over the rows of its input already read"
    assert mp.program.bindings[0].overlaps == planned(model, "generic").program.bindings[0].overlaps
    assert_qemu_matches_oracle(model)


def test_dsp_depthwise_leaves_what_it_does_not_run_to_the_portable_kernel():
    for kwargs in [dict(multiplier=2), dict(dilation=(2, 2))]:
        model = depthwise_model("int8", True, (1, 8, 8, 4), (3, 3), **kwargs)
        assert kernels_bound(planned(model, "cortex-m4")) == ["portable"]
    # more filter words than a core keeps in registers
    wide = depthwise_model("int8", True, (1, 12, 12, 2), (11, 7), padding="VALID")
    assert kernels_bound(planned(wide, "cortex-m4")) == ["portable"]
    model = depthwise_model("int8", True, (1, 8, 8, 4), (3, 3))
    scratch = planned(model, "cortex-m4").program.scratch()[0]
    # 4 channels x 3 filter rows x a line of 12 int16 values: 8 pixels, the last pair of
    # pixels' two words reaching 4 values past the 7th, and one more to keep lines even
    assert scratch.size == 4 * 3 * (7 + 4 + 1) * 2 and "widened" in scratch.purpose
    # 64 channels: the rows of a group of 16 at a time
    model = depthwise_model("int8", True, (1, 8, 8, 64), (3, 3))
    scratch = planned(model, "cortex-m4").program.scratch()[0]
    assert scratch.size == 16 * 3 * (7 + 4 + 1) * 2 and "a group of 16" in scratch.purpose


ADD_CASES = [
    ("ADD", (1, 4, 5, 6), (1, 4, 5, 6), None, ((0.05, 3), (0.03, -7), (0.07, -2))),
    ("ADD", (1, 3, 7, 5), (1, 3, 7, 5), "RELU", ((0.02, -128), (0.11, 20), (0.09, -128))),
    ("SUB", (2, 3, 4, 3), (2, 3, 4, 3), "RELU6", ((0.04, 0), (0.04, 5), (0.05, 1))),
    ("ADD", (1, 5, 5, 4), (1, 1, 1, 4), None, ((0.5, 10), (0.001, -3), (0.3, 7))),  # broadcast
]


@pytest.mark.parametrize("opcode, shape1, shape2, activation, quant", ADD_CASES)
def test_dsp_add_rounding_equals_the_reference_on_every_pair_of_inputs(opcode, shape1, shape2,
                                                                      activation, quant):
    """All 256 x 256 pairs of int8 inputs: the single rounding after the portable kernel's
    tables, and runtime_py's reference output stage. Where the activation clamps every
    negative sum away (RELU, RELU6), the rounding is one SMMLA of the lifted sums; else a
    64-bit one stepped by the sum's sign."""
    from toolchain.ops.elementwise.emit import rescaled_inputs

    model = binary_model(opcode, "int8", shape1, shape2, activation, quant)
    mp = planned(model, "cortex-m4")
    assert kernels_bound(mp) == ["dsp-add"]
    p = mp.program.params()[0]
    first = rescaled_inputs(p, p.input1_offset, p.input1_multiplier, p.input1_shift)
    second = rescaled_inputs(p, p.input2_offset, p.input2_multiplier, p.input2_shift)
    second = second if opcode == "ADD" else -second
    acc = (first[:, None] + second[None, :]).ravel()
    want = np.clip(multiply_by_quantized_multiplier(acc, p.output_multiplier, p.output_shift)
                   + p.output_offset, p.activation_min, p.activation_max)
    word = elementwise_dsp.high_word_add(p)
    c = generate(mp, "net")["net.c"]
    assert (word is not None) == (activation is not None)
    if word is not None:  # what the C computes, SMMLA's high word then the shift
        lifted = (first[:, None] + word.lift + second[None, :]).ravel()
        assert lifted.min() >= 0 and lifted.max() <= INT32_MAX
        high = (lifted * word.multiplier + (word.high << 32)) >> 32
        got = np.clip(high >> word.shift, p.activation_min, p.activation_max)
        assert f"arenac_smmla(acc, {word.multiplier}, {word.high})" in c
        assert "arenac_sign_step" not in c
    else:
        r = elementwise_dsp.add_rounding(p)
        rounding = np.where(acc < 0, r.negative_rounding, r.rounding)
        got = np.clip((acc * r.multiplier + rounding) >> r.shift,
                      p.activation_min - p.output_offset,
                      p.activation_max - p.output_offset) + p.output_offset
        assert "arenac_sign_step" in c
    np.testing.assert_array_equal(got, want)


@needs_mcu
@pytest.mark.parametrize("opcode, shape1, shape2, activation, quant", ADD_CASES)
def test_dsp_add_is_bit_exact(opcode, shape1, shape2, activation, quant):
    model = binary_model(opcode, "int8", shape1, shape2, activation, quant)
    assert kernels_bound(planned(model, "cortex-m4")) == ["dsp-add"]
    assert_qemu_matches_oracle(model)


@needs_mcu
@pytest.mark.parametrize("target", ["cortex-m7", "cortex-m33"])
def test_dsp_kernels_on_the_other_dsp_cores(target):
    assert_qemu_matches_oracle(pointwise_model(1), target)
    assert_qemu_matches_oracle(clang_model(), target)


@needs_mcu
@pytest.mark.parametrize("depth, kernel", [(8, "dsp-im2col"), (4, "dsp-rows")])
def test_the_overlap_the_dsp_convolution_kernels_declare_is_used_and_safe(depth, kernel):
    model = conv_model("int8", True, (1, 10, 10, depth), 8, (3, 3), stride=(2, 2), seed=2)
    mp = planned(model, "cortex-m4")
    assert kernels_bound(mp) == [kernel]
    assert mp.plan.overlaps, "a stride-2 output may lie over the rows of its input already read"
    assert mp.program.bindings[0].overlaps == planned(model, "generic").program.bindings[0].overlaps
    assert_qemu_matches_oracle(model)


@needs_mcu
def test_reference_arithmetic_where_no_single_rounding_matches(monkeypatch):
    """Without a proven single rounding the kernels requantize as the references do (the
    convolution's MultiplyByQuantizedMultiplier, FULLY_CONNECTED's double)."""
    for module in (conv_dsp, fully_connected_dsp, elementwise_dsp):
        monkeypatch.setattr(module, "single_roundings", lambda *args: None)
    for module in (conv_dsp, fully_connected_dsp):
        monkeypatch.setattr(module, "shared_roundings", lambda *args: None)
    model = pointwise_model(2)
    c = generate(planned(model, "cortex-m4"), "net")["net.c"]
    assert "arenac_mbqm(acc" in c and "(double)acc *" in c and "one rounding" not in c
    assert_qemu_matches_oracle(model)


@needs_mcu
def test_a_rounding_by_sign_steps_up_at_zero_without_a_select(monkeypatch):
    """Outputs of both signs (no activation) whose halves round away from zero: per channel
    the high word of one SMMLA below zero, of one SMMLAR (2^31 more) elsewhere, picked by one
    IT block; where no high-word form fits, the 64-bit rounding less 2^31 below zero by the
    sign bit's SMLAL (arenac_sign_step); where the two roundings are not 2^31 apart, the
    select. All three bit-exact, from the rows kernel and the 1x1 kernel."""
    model = conv_model("int8", True, (1, 10, 10, 16), 6, (3, 3))
    forms = []
    for patch in (None, "high_word", "SIGN_STEP"):
        if patch == "high_word":
            monkeypatch.setattr(arm_dsp_common, "high_word", lambda *args: None)
        elif patch == "SIGN_STEP":
            monkeypatch.setattr(arm_dsp_common, "SIGN_STEP", 2**31 - 1)
        c = generate(planned(model, "cortex-m4"), "net")["net.c"]
        forms.append(tuple(name in c for name in ("arenac_smmla_by_sign(acc", "arenac_sign_step(",
                                                  "acc < 0 ?")))
        assert_qemu_matches_oracle(model)
    assert forms == [(True, False, False), (False, True, False), (False, False, True)]


@needs_mcu
def test_the_dual_issue_core_saturates_each_output_beside_another_instruction():
    """On the Cortex-M7 a block's stores put each saturation before an instruction that does
    not read it, the rounding two on or the store of an earlier saturation (the two issue in
    one cycle), in that order against GCC's scheduling (ARENAC_IN_TURN); the single-issue
    cores call the whole output function per store. Both bit-exact."""
    model = pointwise_model()
    m7 = generate(planned(model, "cortex-m7"), "net")["net.c"]
    m4 = generate(planned(model, "cortex-m4"), "net")["net.c"]
    turn = r"\n\s*ARENAC_IN_TURN\(\);\n\s*"
    assert re.search(rf"const int8_t y0 = (net_op\w+)_saturated\(q0\);{turn}"
                     rf"const int32_t q2 = \1_rounded\(", m7)
    late = re.findall(rf"const int8_t y(\d+) = net_op\w+_saturated\(q\d+\);{turn}"
                      r"\w+\[\w+\] = y(\d+);", m7)
    # (a block of one output can only store its saturation straight after it)
    assert late and all(int(stored) < int(saturated) or saturated == stored == "0"
                        for saturated, stored in late)
    assert "_saturated(q" not in m4 and "_output(acc" in m4
    assert_qemu_matches_oracle(model, "cortex-m7")


@needs_mcu
def test_the_dual_issue_core_loads_output_constants_beside_its_last_multiplies():
    """On the Cortex-M7 a two-pixel pipeline of a 1x1 layer of eight input channels copies the
    fields its rounding reads of each channel's record into a local record between its last
    multiply-adds; the last odd channel's block reads its record through kc. Bit-exact."""
    model = conv_model("int8", True, (1, 12, 10, 8), 7, (1, 1), activation="RELU")
    mp = planned(model, "cortex-m7")
    assert kernels_bound(mp) == ["dsp-1x1"]
    c = generate(mp, "net")["net.c"]
    assert re.search(r"acc\[0\] = __smlad\(xw0, wa, acc\[0\]\);\n\s*r0\.multiplier = "
                     r"kc\[0\]\.multiplier;\n\s*acc\[1\] = __smlad", c)
    assert "_rounded_at(acc[0], &r0)" in c and "_rounded_at(acc[0], kc)" in c
    assert_qemu_matches_oracle(model, "cortex-m7")


@needs_mcu
def test_the_64_bit_rounding_where_no_high_word_form_fits(monkeypatch):
    """A rounding with no offset that makes it one SMMLA (or one by sign) keeps its 64-bit
    rounding (an SMLAL), and stays bit-exact; with it, the kernels use the SMMLA."""
    model = pointwise_model(2)
    c = generate(planned(model, "cortex-m4"), "net")["net.c"]
    high = c.count("arenac_smmla(acc") + c.count("arenac_smmla_by_sign(acc")
    wide = c.count("(int64_t)acc *")
    assert high
    monkeypatch.setattr(arm_dsp_common, "high_word", lambda *args: None)
    c = generate(planned(model, "cortex-m4"), "net")["net.c"]
    assert "arenac_smmla" not in c and c.count("(int64_t)acc *") == wide + high
    assert_qemu_matches_oracle(model)


@needs_mcu
@pytest.mark.parametrize("pixels", [1, 10**9])
def test_filters_widened_at_generation_time_or_in_the_loop(monkeypatch, pixels):
    """Every matrix multiply with its filter kept as int16 pairs in flash (pixels=1) or as
    int8 widened by the loop: the same outputs (no kernel staging the whole input)."""
    for module in (arm_dsp_common, conv_dsp):
        monkeypatch.setattr(module, "WIDE_FILTER_PIXELS", pixels)
    monkeypatch.setattr(conv_dsp, "MAX_STAGED_INPUT", 0)
    for model in (pointwise_model(5),
                  conv_model("int8", True, (1, 7, 6, 5), 7, (3, 3), stride=(2, 1), seed=3)):
        c = generate(planned(model, "cortex-m4"), "net")["net.c"]
        calls = set(re.findall(r"(arenac_mac(?:16)?)_\dx\d\(acc", c))
        assert calls == ({"arenac_mac16"} if pixels == 1 else {"arenac_mac"})
        assert_qemu_matches_oracle(model)


@needs_mcu
def test_the_overlap_the_dsp_kernel_declares_is_used_and_safe():
    model = conv_model("int8", False, (1, 10, 10, 16), 16, (1, 1))
    mp = planned(model, "cortex-m4")
    assert kernels_bound(mp) == ["dsp-1x1"]
    assert mp.plan.overlaps, "a 16 -> 16 channel 1x1 output may lie over its input"
    assert mp.arena_bytes < planned(model, "generic").arena_bytes
    assert_qemu_matches_oracle(model)


@needs_mcu
@pytest.mark.parametrize("opcode, shape, size, stride, padding, activation", [
    ("AVERAGE_POOL_2D", (1, 6, 7, 8), (3, 3), (2, 2), "SAME", "NONE"),  # clipped windows
    ("AVERAGE_POOL_2D", (2, 5, 5, 12), (5, 5), (1, 1), "VALID", "RELU6"),
    ("AVERAGE_POOL_2D", (1, 16, 16, 4), (16, 16), (1, 1), "VALID", "NONE"),  # 256 values
    ("MAX_POOL_2D", (1, 6, 7, 8), (3, 3), (2, 2), "SAME", "NONE"),
    ("MAX_POOL_2D", (1, 9, 8, 16), (2, 3), (2, 1), "VALID", "RELU6"),
])
def test_dsp_pooling_is_bit_exact(opcode, shape, size, stride, padding, activation):
    model = pool_model(opcode, "int8", shape, size, stride, padding, activation)
    assert kernels_bound(planned(model, "cortex-m4")) == ["dsp"]
    assert_qemu_matches_oracle(model)


def test_dsp_pooling_leaves_what_it_does_not_run_to_the_portable_kernel():
    for opcode, shape, size in [("MAX_POOL_2D", (1, 4, 4, 6), (2, 2)),  # 6 channels
                                ("AVERAGE_POOL_2D", (1, 17, 16, 4), (17, 16))]:  # 272 values
        model = pool_model(opcode, "int8", shape, size, (1, 1), "VALID")
        assert kernels_bound(planned(model, "cortex-m4")) == ["portable"]


@needs_mcu
def test_the_staged_kernel_may_write_over_all_its_input():
    """It widens the whole input before writing: the output may take the input's place."""
    model = conv_model("int8", False, (1, 4, 4, 24), 24, (1, 1))
    mp = planned(model, "cortex-m4")
    assert kernels_bound(mp) == ["dsp-1x1-staged"]
    assert mp.program.bindings[0].overlaps[0].any_offset and mp.plan.overlaps
    assert_qemu_matches_oracle(model)


@needs_mcu
@pytest.mark.parametrize("target", ["cortex-m0plus", "cortex-m55"])
def test_every_target_runs_on_its_machine(target):
    model = pointwise_model(3)
    mp = planned(model, target)
    with QemuBackend(mp) as backend:
        assert backend.machine == TARGETS[target].board.machine
        report = check_plan(mp, model, 1, 0, [("qemu", backend.invoke_many)], runtime_py=False)
    assert report.ok


@needs_mcu
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 5, 7, 8), out_channels=16),
    dict(input_shape=(2, 4, 3, 21), out_channels=7, per_channel=True),  # batches, odd channels
    dict(input_shape=(1, 6, 5, 40), out_channels=5, stride=(2, 2), activation="RELU"),
    dict(input_shape=(1, 3, 9, 70), out_channels=3, stride=(1, 2), per_channel=True,
         activation="RELU6", input_zero_point=-128),
])
def test_helium_1x1_convolution_is_bit_exact(case):
    case = {"per_channel": False, **case}
    model = conv_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                       case.pop("out_channels"), (1, 1), **case)
    assert kernels_bound(planned(model, "cortex-m55")) == ["mve-1x1"]
    assert_qemu_matches_oracle(model, "cortex-m55")


@needs_mcu
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 8), units=4),
    dict(input_shape=(3, 21), units=5, activation="RELU", per_channel=True),
    dict(input_shape=(1, 300), units=9, activation="RELU6"),
])
def test_helium_fully_connected_is_bit_exact(case):
    model = fully_connected_model("int8", **case)
    assert kernels_bound(planned(model, "cortex-m55")) == ["mve"]
    assert_qemu_matches_oracle(model, "cortex-m55")


@needs_mcu
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 6, 7, 4), out_channels=8, kernel=(3, 3), per_channel=True),
    dict(input_shape=(1, 9, 8, 3), out_channels=5, kernel=(3, 3), stride=(2, 2)),
    dict(input_shape=(2, 7, 6, 5), out_channels=7, kernel=(3, 2), padding="VALID",
         activation="RELU"),
    dict(input_shape=(1, 12, 6, 1), out_channels=6, kernel=(5, 4), stride=(2, 2),
         per_channel=True, activation="RELU6", input_zero_point=-128),
    dict(input_shape=(1, 6, 6, 20), out_channels=3, kernel=(3, 3), bias=False),
])
def test_helium_im2col_convolution_is_bit_exact(case):
    case = {"per_channel": False, **case}
    model = conv_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                       case.pop("out_channels"), case.pop("kernel"), **case)
    assert kernels_bound(planned(model, "cortex-m55")) == ["mve-im2col"]
    assert_qemu_matches_oracle(model, "cortex-m55")


@needs_mcu
def test_helium_depthwise_of_one_channel_is_an_im2col_convolution():
    model = depthwise_model("int8", True, (1, 9, 9, 1), (3, 3), multiplier=8, stride=(2, 2),
                            padding="VALID")
    assert kernels_bound(planned(model, "cortex-m55")) == ["mve-im2col"]
    assert_qemu_matches_oracle(model, "cortex-m55")


@needs_mcu
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 6, 7, 5), kernel=(3, 3)),  # channels not a multiple of 4, SAME
    dict(input_shape=(1, 9, 8, 8), kernel=(3, 3), stride=(2, 2), per_channel=True),
    dict(input_shape=(2, 8, 7, 12), kernel=(3, 3), stride=(2, 2), padding="VALID",
         per_channel=True, input_zero_point=-128, activation="RELU6"),
    dict(input_shape=(1, 6, 10, 6), kernel=(5, 4), stride=(1, 2), activation="RELU",
         bias=False),
])
def test_helium_depthwise_convolution_is_bit_exact(case):
    case = {"per_channel": False, **case}
    model = depthwise_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                            case.pop("kernel"), **case)
    assert kernels_bound(planned(model, "cortex-m55")) == ["mve-depthwise"]
    assert_qemu_matches_oracle(model, "cortex-m55")


def test_helium_overlap_follows_the_write_order():
    """Every output byte the kernel writes, pixel after pixel (reading the pixel's inputs
    meanwhile), lands on input bytes it no longer reads, for outputs placed exactly the
    declared shift below the input."""
    for shape, channels, stride in [((1, 6, 5, 8), 16, 1), ((2, 5, 6, 8), 4, 2)]:
        mp = planned(conv_model("int8", False, shape, channels, (1, 1), (stride, stride)),
                     "cortex-m55")
        m = conv_dsp.conv_matmul(mp.program.params()[0])
        shift = mp.program.bindings[0].overlaps[0].shift
        pixels = m.batches * m.rows * m.pixels
        for p in range(pixels):
            written_end = (p + 1) * m.channels - shift
            assert all(written_end <= m.input_at(q) for q in range(p, pixels))


@needs_mcu
@pytest.mark.parametrize("built, compiled", [("cortex-m4", "cortex-m0plus"),
                                             ("cortex-m33", "cortex-m4"),
                                             ("cortex-m0plus", "cortex-m33"),
                                             ("cortex-m55", "cortex-m33")])
def test_c_for_one_target_refuses_another(tmp_path, built, compiled):
    files = mcu_sources(planned(pointwise_model(), built), "net")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    flags = TARGETS[compiled].flags
    result = subprocess.run([shutil.which("arm-none-eabi-gcc"), *flags, "-std=c99", "-c",
                             "net.c", "-o", "net.o"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode != 0
    assert f"net.c was generated for {built}" in result.stderr
    ok = subprocess.run([shutil.which("arm-none-eabi-gcc"), *TARGETS[built].flags, "-std=c99",
                         "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-O2", "-c", "net.c",
                         "-o", "net.o"], cwd=tmp_path, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


CLANG = shutil.which("clang") or shutil.which("clang-14")


def clang_model() -> bytes:
    """Every DSP kernel: the pointwise model's, then a 3x3 convolution from widened rows, a
    depthwise one and a 3x3 convolution through im2col."""
    from toolchain.front.builder import ModelBuilder

    rng = np.random.default_rng(7)
    b = ModelBuilder("int8")
    x = b.input("x", (1, 6, 6, 4), "int8", 0.05, 3)
    w = b.const("w", rng.integers(-127, 128, (8, 3, 3, 4)).astype(np.int8), 0.01, 0)
    bias = b.const("b", rng.integers(-400, 400, 8).astype(np.int32), 0.0005, 0)
    y = b.tensor("y", (1, 6, 6, 8), "int8", 0.08, -5)
    b.op("CONV_2D", [x, w, bias], [y], {"padding": "SAME", "stride_h": 1, "stride_w": 1,
                                      "dilation_h_factor": 1, "dilation_w_factor": 1,
                                      "fused_activation_function": "RELU"}, 3)
    dw = b.const("dw", rng.integers(-127, 128, (1, 3, 3, 8)).astype(np.int8), 0.01, 0)
    dbias = b.const("db", rng.integers(-400, 400, 8).astype(np.int32), 0.0008, 0)
    z = b.tensor("z", (1, 6, 6, 8), "int8", 0.08, -5)
    b.op("DEPTHWISE_CONV_2D", [y, dw, dbias], [z],
         {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1,
          "dilation_h_factor": 1, "dilation_w_factor": 1, "fused_activation_function": "NONE"},
         3)
    w2 = b.const("w2", rng.integers(-127, 128, (4, 3, 3, 8)).astype(np.int8), 0.01, 0)
    bias2 = b.const("b2", rng.integers(-400, 400, 4).astype(np.int32), 0.0008, 0)
    out = b.tensor("out", (1, 6, 6, 4), "int8", 0.1, 2)
    b.op("CONV_2D", [z, w2, bias2], [out], {"padding": "SAME", "stride_h": 1, "stride_w": 1,
                                           "dilation_h_factor": 1, "dilation_w_factor": 1,
                                           "fused_activation_function": "NONE"}, 3)
    b.output(out)
    return b.build()


def one_channel_model() -> bytes:
    """The rows kernel widening value by value (an odd left padding of one channel)."""
    return conv_model("int8", True, (1, 12, 6, 1), 6, (5, 4), stride=(2, 2))


def relu_add_model() -> bytes:
    """The DSP ADD in its SMMLA form, its loop unrolled four times (ARENAC_UNROLL4)."""
    opcode, shape1, shape2, activation, quant = ADD_CASES[1]
    return binary_model(opcode, "int8", shape1, shape2, activation, quant)


def add_model() -> bytes:
    """The DSP ADD rounding in 64 bits with the step by the sum's sign (arenac_sign_step)."""
    opcode, shape1, shape2, activation, quant = ADD_CASES[0]
    return binary_model(opcode, "int8", shape1, shape2, activation, quant)


@needs_mcu
@pytest.mark.parametrize("target", [*DSP, "cortex-m55"])
@pytest.mark.parametrize("model", [pointwise_model, clang_model, one_channel_model,
                                   relu_add_model, add_model])
@pytest.mark.parametrize("wide", [1, 10**9])
def test_clang_builds_the_dsp_kernels(tmp_path, monkeypatch, target, model, wide):
    """ACLE intrinsics: Clang builds the same C, strict flags, with the rotation fused (and the
    Helium kernels, with their vector dot products)."""
    if CLANG is None:
        if os.environ.get("CI"):
            pytest.fail("clang is not on PATH (Debian: clang-14); CI is set, so it must run")
        pytest.skip("clang is not installed")
    for module in (arm_dsp_common, conv_dsp):
        monkeypatch.setattr(module, "WIDE_FILTER_PIXELS", wide)
    files = mcu_sources(planned(model(), target), "net")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    # newlib's headers, from the cross GCC's own search list
    listing = subprocess.run([shutil.which("arm-none-eabi-gcc"), "-E", "-Wp,-v", "-x", "c",
                              os.devnull], capture_output=True, text=True).stderr
    include = next(line.strip() for line in listing.splitlines()
                   if line.strip().endswith("arm-none-eabi/include"))
    result = subprocess.run([CLANG, "--target=arm-none-eabi", *TARGETS[target].flags,
                             "-isystem", include, "-std=c99", "-O2",
                             "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-S", "net.c", "-o",
                             "net.s"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assembly = (tmp_path / "net.s").read_text()
    if model in (relu_add_model, add_model):  # portable on cortex-m55
        if target != "cortex-m55":
            assert ("smmla" if model is relu_add_model else "smlal") in assembly
    elif target == "cortex-m55":  # VMLADAVA, which Clang spells by its alias VMLAVA
        assert re.search(r"\bvml(ad)?ava\.s8", assembly)
    else:
        # the rows kernel widens its filter at generation time, and its input value by value
        widened_int8 = wide > 1 and model is not one_channel_model
        assert "smlad" in assembly and ("ror #8" in assembly or not widened_int8)


# -- bench -------------------------------------------------------------------------------------


@needs_mcu
def test_bench_counts_are_deterministic_and_the_dsp_kernels_execute_fewer():
    model = pointwise_model(4)
    whole = Techniques(tiling="off")  # the same steps for both kernels
    own = bench(planned(model, "cortex-m4", techniques=whole))
    again = bench(planned(model, "cortex-m4", techniques=whole))
    portable = bench(planned(model, "cortex-m4", portable=True, techniques=whole))
    assert own.outputs_match and portable.outputs_match
    assert own.instructions == again.instructions
    assert [s.instructions for s in own.steps] == [s.instructions for s in again.steps]
    assert [s.kernel for s in own.steps] == ["dsp-1x1-staged", "dsp-1x1", "portable", "dsp"]
    for mine, theirs in zip(own.steps, portable.steps, strict=True):
        if mine.kernel != "portable":
            assert mine.instructions < theirs.instructions
    # the whole invoke: its steps and the calls between them
    assert sum(s.instructions for s in own.steps) <= own.instructions
    assert own.counter_overhead > 0 and own.board == "mps2-an386"


@needs_mcu
def test_bench_checks_the_counter_it_reads(monkeypatch):
    board = target_table.BOARDS["mps2-an386"]
    wrong = target_table.Board(**{**board.__dict__, "counter_hz": board.counter_hz * 2})
    monkeypatch.setitem(TARGETS, "cortex-m4",
                        target_table.Target(**{**TARGETS["cortex-m4"].__dict__, "board": wrong}))
    with pytest.raises(RuntimeBackendError, match="does not count instructions as expected"):
        bench(planned(pointwise_model(), "cortex-m4"))


@needs_mcu
def test_bench_command_json(capsys, tmp_path):
    import json

    path = tmp_path / "m.tflite"
    path.write_bytes(pointwise_model())
    code, out, _ = run(capsys, "bench", str(path), "--json", "--optimize", "Os")
    data = json.loads(out)
    assert code == 0 and data["target"] == "cortex-m4" and data["optimization"] == "-Os"
    assert data["outputs_match"] is True and data["instructions_per_inference"] > 0
    # the two convolutions run striped, their kernels taking turns in one scratch buffer
    assert [s["opcode"] for s in data["steps"]] == ["STRIPED", "RESHAPE", "FULLY_CONNECTED"]
    code, out, _ = run(capsys, "bench", str(path), "--portable")
    assert code == 0 and "(portable kernels)" in out and "instructions per inference:" in out


# -- the shared models -------------------------------------------------------------------------

SHARED_INT8 = ["vww_96_int8", "kws_ref_model", "ad01_int8", "pretrainedResnet_quant",
               "person_detect", "micro_speech_quantized", "hello_world_int8"]


@needs_mcu
@needs_shared_models
@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m55"])
@pytest.mark.parametrize("name", SHARED_INT8)
def test_shared_models_are_bit_exact_with_the_dsp_kernels(name, target):
    path = SHARED_MODELS / f"{name}.tflite"
    data = path.read_bytes()
    mp = plan_model(parse_model(data, str(path)), target=target)
    assert set(kernels_bound(mp)) - {"portable"}
    with QemuBackend(mp) as backend:  # three inputs: what the cycle counts are checked on
        report = check_plan(mp, data, 3, 0, [("qemu", backend.invoke_many)])
    assert report.ok, report.as_dict()



def test_load_runs_stay_in_order_on_the_single_issue_cores_only():
    """The kernels built from runs of single loads keep GCC's scheduling after register
    allocation off on the Cortex-M4 and M33 (a load in a run costs one cycle there), and on on
    the dual-issue Cortex-M7, where it places each load beside a multiply."""
    model = fully_connected_model("int8", input_shape=(1, 40), units=12)
    for target, in_order in (("cortex-m4", True), ("cortex-m33", True), ("cortex-m7", False)):
        c = generate(planned(model, target), "net")["net.c"]
        assert "arenac_mac_1x4_joint(" in c, target
        assert ("#define ARENAC_DSP_IN_ORDER" in c) == in_order, target
        attribute = "ARENAC_DSP_IN_ORDER" if in_order else "ARENAC_DSP_KERNEL"
        assert re.search(rf"^{attribute} static void net_op0_fully_connected", c, re.M), target
        assert ("On the dual-issue Cortex-M7" in c) != in_order, target
        # the inputs widened word by word there, in STRD pairs on the Cortex-M7
        assert ("arenac_widen_1 for the single-issue cores" in c) == in_order, target


@needs_mcu
@pytest.mark.parametrize("target", ["cortex-m4", "cortex-m7"])
def test_the_int8_three_pixel_step_reads_single_loads_on_the_dual_issue_core(target):
    """im2col's step of three pixels by two channels over an int8 filter: its input words by
    LDRD on the single-issue cores, by single loads on the Cortex-M7 (each issues beside a
    multiply-add there); bit-exact under QEMU on both."""
    model = conv_model("int8", True, (1, 6, 7, 16), 5, (3, 3), seed=2)
    c = generate(planned(model, target), "net")["net.c"]
    assert "arenac_mac_3x2(acc" in c
    assert ("an int8 pointer: no LDRD" in c) == (target == "cortex-m7")
    assert_qemu_matches_oracle(model, target)

@needs_mcu
@pytest.mark.parametrize("case", [
    dict(input_shape=(1, 11, 11, 40), out_channels=7),  # ten groups written out, 3 + 3 + 3 + 2
    dict(input_shape=(1, 10, 11, 72), out_channels=6, per_channel=True),  # a loop and a rest
    dict(input_shape=(1, 12, 12, 32), out_channels=5, activation="RELU"),  # pixel pairs
    dict(input_shape=(1, 5, 5, 64), out_channels=9),  # the staged kernel, an odd channel
])
def test_the_dual_issue_cores_pipelined_steps_are_bit_exact(case):
    """The Cortex-M7's int16 steps of three and two pixels written out as one pipeline (each
    load between the multiply-adds, the kernel kept in that order): bit-exact under QEMU."""
    case = {"per_channel": False, **case}
    model = conv_model("int8", case.pop("per_channel"), case.pop("input_shape"),
                       case.pop("out_channels"), (1, 1), **case)
    c = generate(planned(model, "cortex-m7"), "net")["net.c"]
    assert "written out in the kernels as" in c
    assert re.search(r"^ARENAC_DSP_IN_ORDER static void net_op0_conv_2d", c, re.M)
    assert_qemu_matches_oracle(model, "cortex-m7")

@needs_mcu
@needs_shared_models
@pytest.mark.parametrize("name", ["kws_ref_model", "ad01_int8"])
def test_the_dual_issue_cores_scheduled_kernels_are_bit_exact(name):
    """The Cortex-M7's kernels of load runs, scheduled by GCC (depthwise, the staged 1x1 and
    fully connected steps), on the shared models at their fastest, three inputs under QEMU."""
    path = SHARED_MODELS / f"{name}.tflite"
    data = path.read_bytes()
    mp = plan_model(parse_model(data, str(path)), target="cortex-m7", max_arena=1 << 30)
    with QemuBackend(mp) as backend:
        report = check_plan(mp, data, 3, 0, [("qemu", backend.invoke_many)])
    assert report.ok, report.as_dict()


@needs_mcu
@needs_shared_models
@pytest.mark.parametrize("name, target", [("pretrainedResnet_quant", "cortex-m4"),
                                          ("pretrainedResnet_quant", "cortex-m7"),
                                          ("vww_96_int8", "cortex-m4"),
                                          ("vww_96_int8", "cortex-m7")])
def test_the_fastest_plans_are_bit_exact(name, target):
    """The plans `bench` counts the MLPerf cycles of (--max-arena above any arena: whole ops,
    every kernel keeping its scratch; pretrainedResnet_quant's 3x3 layers from rows written out
    and from im2col blocks across rows, the 1x1 layers' depth loops 16 groups a trip, on the
    Cortex-M7 the rows' pipeline), three inputs under QEMU."""
    path = SHARED_MODELS / f"{name}.tflite"
    data = path.read_bytes()
    mp = plan_model(parse_model(data, str(path)), target=target, max_arena=1 << 30)
    assert not mp.tiling.segments and "dsp-rows" in kernels_bound(mp)
    with QemuBackend(mp) as backend:
        report = check_plan(mp, data, 3, 0, [("qemu", backend.invoke_many)])
    assert report.ok, report.as_dict()


def test_a_limit_whole_ops_fit_in_runs_them_whole_on_the_dsp_cores():
    """--max-arena: on a DSP core, whose kernels run whole ops faster than stripes of them, a
    limit whole ops fit in plans them whole with every kernel's scratch, one just below stripes
    them with every kernel's scratch still; on cortex-m55, whose depthwise kernel runs faster a
    few rows at a time, a limit above any arena stripes as the default plan does."""
    from tests.test_tiling import mobilenet_stem

    model = parse_model(mobilenet_stem(), "stem.tflite")
    whole = plan_model(model, target="cortex-m4", techniques=Techniques(tiling="off"),
                       max_arena=1 << 20)
    fast = plan_model(model, target="cortex-m4", max_arena=whole.arena_bytes)
    assert not fast.tiling.segments and not fast.program.given_up
    assert fast.arena_bytes == whole.arena_bytes
    tight = plan_model(model, target="cortex-m4", max_arena=whole.arena_bytes - 1)
    assert tight.tiling.segments and not tight.program.given_up
    assert plan_model(model, target="cortex-m55", max_arena=1 << 20).tiling.segments


@needs_mcu
def test_a_segments_target_kernels_take_turns_in_one_scratch_buffer():
    """The striped segment's DSP kernels share one scratch buffer, as large as the most one
    of them asks for, and run bit-exact under QEMU from it."""
    from tests.test_tiling import mobilenet_stem

    data = mobilenet_stem()
    model = parse_model(data, "stem.tflite")
    # every kernel keeping its scratch, the arena limited below whole ops': striped
    whole = plan_model(model, target="cortex-m4", techniques=Techniques(tiling="off"),
                       max_arena=1 << 20)
    mp = plan_model(model, target="cortex-m4", max_arena=whole.arena_bytes - 1)
    assert mp.tiling.segments and not mp.program.given_up
    lives = mp.lifetimes
    (shared,) = lives.shared
    held = [r for r in lives.scratch if r.key in lives.within]
    assert {r.op for r in held} == {2, 3} and shared.size == max(r.size for r in held)
    top = mp.plan.offsets[lives.buffer_of[shared.key]] + shared.size
    assert all(offset + r.size <= top for r, offset in mp.scratch_offsets() if r in held)
    with QemuBackend(mp) as backend:
        report = check_plan(mp, data, 2, 0, [("qemu", backend.invoke_many)])
    assert report.ok, report.as_dict()


@needs_mcu
@needs_shared_models
def test_every_layer_of_vww_under_qemu_equals_the_oracle(capsys):
    """`check --per-layer` on the DSP kernels: every intermediate tensor of vww_96_int8 under
    QEMU equals the oracle's (a striped segment's at the op after it)."""
    import json

    code, out, err = run(capsys, "check", str(SHARED_MODELS / "vww_96_int8.tflite"), "--target",
                         "cortex-m4", "--backends", "qemu", "--per-layer", "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"], err
    assert report["first_divergence"] == {"qemu": None} and len(report["layers"]) > 20


# -- the arena as the constraint: --max-arena -----------------------------------------------


def test_a_narrow_kernel_follows_the_kernel_it_narrows_on_the_same_targets():
    """target_kernel binds the first kernel that takes an op, so a narrow form must come after
    the kernel it narrows, for the same op and cores, or it would be bound in its place."""
    from toolchain.ops import VARIANTS

    narrow = [(opcode, k, v) for opcode, variants in VARIANTS.items()
              for k, v in enumerate(variants) if v.narrows]
    assert {v.name for _, _, v in narrow} >= {
        "dsp-depthwise-narrow", "dsp-direct", "dsp-rows-direct", "dsp-im2col-direct",
        "dsp-1x1-direct", "dsp-depthwise-direct", "dsp-1x1"}
    for opcode, k, v in narrow:
        wide = [w for w in VARIANTS[opcode][:k] if w.name in v.narrows]
        assert len(wide) == len(v.narrows)
        for w in wide:
            assert {t for s in v.kernels for t in s.targets} <= {
                t for s in w.kernels for t in s.targets}


def test_a_target_plan_is_held_to_the_generic_arena_through_narrow_kernels():
    """One batch row of FULLY_CONNECTED: the dsp kernel's widened input makes the cortex-m4
    arena larger than the generic one, so by default the op runs dsp-direct (no scratch) and
    the arena is the generic one; a limit above it (--max-arena) keeps dsp."""
    model = fully_connected_model("int8", (1, 300), 9)
    generic = planned(model, "generic").arena_bytes
    held = planned(model, "cortex-m4", max_arena=None)
    assert kernels_bound(held) == ["dsp-direct"] and held.program.given_up == {0: ("dsp",)}
    assert held.arena_bytes <= generic and held.portable_arena == generic
    fast = planned(model, "cortex-m4")
    assert kernels_bound(fast) == ["dsp"] and fast.arena_bytes > generic
    assert fast.portable_arena is None
    # a --time-limit bounds one planning: the hold, which plans again, is skipped
    timed = planned(model, "cortex-m4", max_arena=None, time_limit=60.0)
    assert kernels_bound(timed) == ["dsp"] and timed.portable_arena is None


def test_the_hold_runs_convolutions_without_scratch_where_their_scratch_sets_the_arena():
    """The first convolution of an image network (3 colours, stride 2) and a 3x3 convolution
    of 16 channels behind it: the second's widened rows, then its widened windows, make the
    cortex-m4 arena larger than the generic one, so by default it runs im2col's form without
    scratch, which reads each window's words from the input, and the arena is the generic one;
    the first keeps its widened rows, which are not at the peak."""
    from toolchain.front.builder import ModelBuilder

    rng = np.random.default_rng(3)
    b = ModelBuilder("int8")
    x = b.input("x", (1, 24, 24, 3), "int8", 0.05, 3)
    for depth, channels, stride in ((3, 16, 2), (16, 16, 1)):
        w = b.const("w", rng.integers(-127, 128, (channels, 3, 3, depth)).astype(np.int8),
                    0.01, 0)
        bias = b.const("b", rng.integers(-400, 400, channels).astype(np.int32), 0.0005)
        size = 24 // 2 if stride == 2 else 12
        y = b.tensor("y", (1, size, size, channels), "int8", 0.08, -5)
        b.op("CONV_2D", [x, w, bias], [y],
             {"padding": "SAME", "stride_h": stride, "stride_w": stride,
              "dilation_h_factor": 1, "dilation_w_factor": 1,
              "fused_activation_function": "RELU"})
        x = y
    b.output(x)
    model = b.build()
    generic = planned(model, "generic").arena_bytes
    fast = planned(model, "cortex-m4")
    assert kernels_bound(fast) == ["dsp-rows", "dsp-rows"] and fast.arena_bytes > generic
    held = planned(model, "cortex-m4", max_arena=None)
    assert held.arena_bytes <= generic and held.portable_arena == generic
    assert kernels_bound(held) == ["dsp-rows", "dsp-im2col-direct"]


def test_plan_says_whether_the_hold_reached_the_portable_arena(capsys, tmp_path):
    path = tmp_path / "fc.tflite"
    path.write_bytes(fully_connected_model("int8", (1, 300), 9))
    code, out, _ = run(capsys, "plan", str(path), "--target", "cortex-m4")
    generic = plan_model(parse_model(path.read_bytes(), str(path))).arena_bytes
    assert code == 0 and re.search(
        rf"^held +to the portable kernels' arena, {generic} bytes, through narrow kernels: "
        "reached$", out, re.M)
    assert "op 0 FULLY_CONNECTED dsp-direct (not dsp)" in " ".join(out.split())


def test_the_hold_takes_narrow_kernels_only_and_only_where_they_lower_the_arena():
    """A stem whose DSP kernels' scratch makes the cortex-m4 arena larger than the generic one:
    the default plan gives up no target kernel for a portable one, runs a depthwise in narrow
    groups only where that lowers the arena, and is no larger than with every kernel wide."""
    from tests.test_tiling import mobilenet_stem

    model = parse_model(mobilenet_stem(), "stem.tflite")
    fast = plan_model(model, target="cortex-m4", max_arena=1 << 20)
    held = plan_model(model, target="cortex-m4")
    assert held.arena_bytes <= fast.arena_bytes
    for op, names in held.program.given_up.items():
        binding = held.program.bindings[op]
        assert binding.variant is not None and names[-1] in binding.variant.narrows
    for op in held.program.given_up:  # each narrow kernel is needed: wide again, it is larger
        given_up = {o: n for o, n in held.program.given_up.items() if o != op}
        assert plan_model(model, target="cortex-m4",
                          given_up=given_up).arena_bytes >= held.arena_bytes


def replans_leaving_the_arena(narrowing, limit: int = 20) -> tuple[object, list, set[int]]:
    """Runs `narrowing(first, generic, replan)` on a chain of alike layers on cortex-m4 with
    replans that never lower the arena (each the first plan again), at most `limit` of them:
    the first plan, the replans' given-up ops, and the ops with target scratch at its peak."""
    import toolchain.lower.plan as plan_module
    from tests.deep import alike_layers

    model = parse_model(alike_layers(12), "alike.tflite")
    first = plan_model(model, target="cortex-m4", max_arena=1 << 20)
    generic = plan_model(model).arena_bytes
    assert first.arena_bytes > generic
    replans = []

    def replan(given_up):
        replans.append(given_up)
        if len(replans) > limit:
            raise StopIteration("too many replans")
        return first

    try:
        narrowing(first, generic, replan)
    except StopIteration:
        pass
    return first, replans, plan_module.scratch_at_peak(first)


def test_the_hold_ends_after_a_run_of_replans_that_do_not_lower_the_arena():
    """Replans that never lower the arena (as on a model of many alike layers, where every
    segment at the peak must narrow before the arena drops): the hold plans STALE_REPLANS of
    them one op at a time, then one that gives up every narrow form's scratch at the peak, and
    ends on the first plan; before, it planned again for each narrow op, without end when the
    replans change nothing."""
    import toolchain.lower.plan as plan_module

    held = []
    first, replans, at_peak = replans_leaving_the_arena(
        lambda first, generic, replan: held.append(
            (plan_module.narrowed(first, lambda: generic, replan), generic)))
    assert held, "the hold does not end"
    (plan, generic), = held
    assert plan.arena_bytes == first.arena_bytes and plan.portable_arena == generic
    assert len(replans) == plan_module.STALE_REPLANS + 1
    assert len(at_peak) > 1 and all(len(r) == 1 for r in replans[:-1])
    assert set(replans[-1]) >= at_peak


def test_max_arena_gives_up_the_scratch_at_the_peak_at_once_after_a_run_of_replans():
    """--max-arena with the same replans: after STALE_REPLANS of them, one op at a time, every
    op with a target kernel's scratch at the peak gives it up in the next replan."""
    import toolchain.lower.plan as plan_module

    _, replans, at_peak = replans_leaving_the_arena(
        plan_module.within_arena, limit=plan_module.STALE_REPLANS + 1)
    assert len(replans) == plan_module.STALE_REPLANS + 2
    assert len(at_peak) > 1 and all(len(r) == 1 for r in replans[:-2])
    assert set(replans[-2]) >= at_peak


def test_max_arena_gives_up_target_kernels_until_the_arena_fits():
    """A stem whose DSP kernels' scratch makes the cortex-m4 arena larger than the generic one:
    held to the generic arena, some ops give up their target kernels and the arena fits; the
    others keep theirs."""
    from tests.test_tiling import mobilenet_stem

    model = parse_model(mobilenet_stem(), "stem.tflite")
    generic = plan_model(model).arena_bytes
    fast = plan_model(model, target="cortex-m4", max_arena=1 << 20)
    assert fast.arena_bytes > generic and not fast.program.given_up
    fitted = plan_model(model, target="cortex-m4", max_arena=generic)
    assert fitted.arena_bytes <= generic
    given_up = fitted.program.given_up
    assert given_up and all(fitted.program.bindings[op].kernel_name not in names
                            for op, names in given_up.items())
    assert any(b is not None and b.variant is not None for b in fitted.program.bindings)
    assert plan_model(model, target="cortex-m4", max_arena=fast.arena_bytes) \
        .program.given_up == {}


def test_max_arena_steps_down_to_the_next_target_kernel_first():
    """The rows kernel's widened rows are the larger scratch: held below its arena, the
    convolution runs the rows kernel's form without scratch, which makes the arena the
    portable kernel's; past it come im2col, its own form without scratch, then the portable
    kernel."""
    model = parse_model(conv_model("int8", True, (1, 24, 24, 4), 8, (3, 3), stride=(2, 2)),
                        "conv.tflite")
    rows = plan_model(model, target="cortex-m4", max_arena=1 << 20)
    portable = plan_model(model, target="cortex-m4", portable=True)
    assert rows.program.bindings[0].kernel_name == "dsp-rows"
    assert rows.arena_bytes > portable.arena_bytes
    fitted = plan_model(model, target="cortex-m4", max_arena=portable.arena_bytes)
    assert fitted.program.bindings[0].kernel_name == "dsp-rows-direct"
    assert fitted.program.given_up == {0: ("dsp-rows",)}
    assert fitted.arena_bytes == portable.arena_bytes and not fitted.lifetimes.scratch
    given_up: tuple[str, ...] = ()
    for name in ("dsp-rows", "dsp-rows-direct", "dsp-im2col", "dsp-im2col-direct", "portable"):
        binding = plan_model(model, target="cortex-m4", given_up={0: given_up}
                             ).program.bindings[0]
        assert binding.kernel_name == name
        given_up = (*given_up, name)


@needs_mcu
def test_a_plan_held_to_max_arena_runs_bit_exact_under_qemu():
    from tests.test_tiling import residual_block

    data = residual_block()
    model = parse_model(data, "residual.tflite")
    mp = plan_model(model, target="cortex-m4", max_arena=plan_model(model).arena_bytes)
    assert mp.program.given_up
    with QemuBackend(mp) as backend:
        report = check_plan(mp, data, 2, 0, [("qemu", backend.invoke_many)])
    assert report.ok, report.as_dict()


def test_max_arena_too_small_is_one_line(capsys, tmp_path):
    from tests.test_tiling import mobilenet_stem

    path = tmp_path / "stem.tflite"
    path.write_bytes(mobilenet_stem())
    code, out, err = run(capsys, "plan", str(path), "--target", "cortex-m4", "--max-arena", "64")
    assert code == 2 and not out and len(err.strip().splitlines()) == 1
    assert "over the limit of 64 (--max-arena)" in err and "without the kernels op" in err
    code, out, err = run(capsys, "plan", str(path), "--max-arena", "64", "--pool", "a:64K")
    assert code == 2 and "--max-arena" in err and len(err.strip().splitlines()) == 1
    code, out, _ = run(capsys, "plan", str(path), "--target", "cortex-m4", "--max-arena", "1920")
    assert code == 0 and "gave up cortex-m4 kernels for the arena to fit" in out
    assert int(re.search(r"^arena +(\d+) bytes", out, re.M)[1]) <= 1920
