"""TFLite Micro's signal ops (the audio front end's custom ops), each alone over several sizes and
options and in a chain from raw audio to log filter-bank energies: bit-exact with the TFLite
Micro interpreter, in runtime_py and the compiled C, over sequences of invokes (the spectral
subtraction's noise estimate carries over, and a reset clears it); and clean refusals."""

from __future__ import annotations

import numpy as np
import pytest

from runtime_py.interpreter import ArenaInterpreter
from tests.opcheck import assert_matches_oracle, refusal
from tests.test_codegen import style_problems
from toolchain.c.generate import generate
from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model
from toolchain.lab.c_backend import CBackend
from toolchain.lab.check import random_inputs
from toolchain.lab.oracle import TFLMOracle
from toolchain.lower.plan import plan_model
from toolchain.numerics.tables import log_table
from toolchain.ops import bind, oracle_of, prepare_graph
from toolchain.ops.spec import TFLM

SEQUENCE = 4  # invokes a state is kept over


def custom_model(code: str, inputs: list, outputs: list, options: dict,
                 consts: dict | None = None) -> bytes:
    """One custom op: `inputs` and `outputs` as (shape, dtype), `consts` (input position ->
    array) as constant inputs; every output is a graph output."""
    b = ModelBuilder("int8")
    refs = []
    for k, (shape, dtype) in enumerate(inputs):
        if consts and k in consts:
            refs.append(b.const(f"c{k}", consts[k]))
        else:
            refs.append(b.input(f"in{k}", shape, dtype))
    outs = [b.tensor(f"out{k}", shape, dtype) for k, (shape, dtype) in enumerate(outputs)]
    b.custom(code, refs, outs, options)
    for t in outs:
        b.output(t)
    return b.build()


def hann(n: int) -> np.ndarray:
    return np.round(4096 * (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n))).astype(np.int16)


@pytest.mark.parametrize("shape, window, shift", [((1, 48), 48, 12), ((3, 16), 16, 4),
                                                 ((40,), 8, 0)])
def test_window(shape, window, shift):
    rng = np.random.default_rng(window)
    weights = rng.integers(-32768, 32768, window).astype(np.int16)
    assert_matches_oracle(custom_model("SignalWindow", [(shape, "int16"), ((window,), "int16")],
                                       [(shape, "int16")], {"shift": shift}, {1: weights}))


@pytest.mark.parametrize("size", [1, 37, 480])
def test_fft_auto_scale(size):
    assert_matches_oracle(custom_model("SignalFftAutoScale", [((size,), "int16")],
                                       [((size,), "int16"), ((), "int32")], {}))


def test_fft_auto_scale_edge_inputs():
    """Zeros, a lone -32768 (TFLite Micro's scan finds no headroom) and small values."""
    model = custom_model("SignalFftAutoScale", [((4,), "int16")],
                         [((4,), "int16"), ((), "int32")], {})
    mp = plan_model(parse_model(model))
    oracle, runtime = TFLMOracle(model, 2), ArenaInterpreter(mp)
    for values in ([0, 0, 0, 0], [3, -32768, 5, 1], [1, -2, 0, 3], [-32768, 0, 0, 0],
                   [100, -7, 12, 0]):
        x = np.array(values, np.int16)
        for expected, actual in zip(oracle.invoke([x]), runtime.invoke([x]), strict=True):
            np.testing.assert_array_equal(expected, actual)


FFT_SIZES = [
    (480, 512, 1),  # 256 points: radix 4 x 4 x 4 x 4
    (48, 48, 1),    # 24 points: radix 4 x 2 x 3
    (30, 40, 2),    # 20 points: radix 4 x 5, two frames
    (18, 18, 1),    # 9 points: radix 3 x 3
    (64, 64, 1),    # 32 points: radix 4 x 4 x 2
    (60, 60, 1),    # 30 points: radix 2 x 3 x 5
]
FFT_TYPES = {"int16": 7, "int32": 2, "float32": 0}


def fft_model(code: str, dtype: str, length: int, fft_length: int, frames: int) -> bytes:
    inverse = code == "SignalIrfft"
    inner = (fft_length + 2, fft_length) if inverse else (length, fft_length + 2)
    shapes = [(frames, n) if frames > 1 else (n,) for n in inner]
    return custom_model(code, [(shapes[0], dtype)], [(shapes[1], dtype)],
                        {"T": FFT_TYPES[dtype], "fft_length": fft_length})


def assert_fft_matches_bit_for_bit(model: bytes, sanitize: bool = False) -> None:
    """runtime_py and the C against TFLite Micro, bit for bit also in float (kiss_fft's order of
    operations is reproduced, not approximated)."""
    mp = plan_model(parse_model(model))
    input_sets = []
    for seed in range(3):
        values = random_inputs(mp.graph, seed)
        if values[0].dtype == np.float32:
            values = [v * np.float32(1000) for v in values]
        input_sets.append(values)
    c = CBackend(mp, sanitize=sanitize)
    try:
        compiled = c.invoke_many(input_sets)
    finally:
        c.close()
    oracle, runtime = TFLMOracle(model, 1), ArenaInterpreter(mp)
    for values, from_c in zip(input_sets, compiled, strict=True):
        (expected,) = oracle.invoke(values)
        for (actual,) in (runtime.invoke(values), from_c):
            assert actual.tobytes() == expected.tobytes()
    assert np.unique(expected).size > 4


@pytest.mark.parametrize("dtype", FFT_TYPES)
@pytest.mark.parametrize("length, fft_length, frames", FFT_SIZES)
def test_rfft(dtype, length, fft_length, frames):
    assert_fft_matches_bit_for_bit(fft_model("SignalRfft", dtype, length, fft_length, frames))


@pytest.mark.parametrize("dtype", FFT_TYPES)
@pytest.mark.parametrize("fft_length, frames", [(512, 1), (48, 1), (40, 2), (18, 1), (60, 1)])
def test_irfft(dtype, fft_length, frames):
    assert_fft_matches_bit_for_bit(fft_model("SignalIrfft", dtype, 0, fft_length, frames))


@pytest.mark.parametrize("code", ["SignalRfft", "SignalIrfft"])
def test_int32_fft_has_no_undefined_behaviour(code):
    """Full-range int32 values overflow kiss_fft's int32 sums: the C wraps them without
    undefined behaviour (under UBSan), as TFLite Micro's build does."""
    assert_fft_matches_bit_for_bit(fft_model(code, "int32", 60, 60, 1), sanitize=True)


@pytest.mark.parametrize("bins, start, end", [(257, 0, 257), (33, 0, 33)])
def test_energy(bins, start, end):
    assert_matches_oracle(custom_model("SignalEnergy", [((2 * bins,), "int16")],
                                       [((bins,), "uint32")],
                                       {"end_index": end, "start_index": start}))


def filter_bank_tables(bins: int, channels: int, seed: int = 0) -> dict:
    """Triangular mel-like channels over `bins` energies: starts, weights and unweights."""
    rng = np.random.default_rng(seed)
    edges = np.linspace(1, bins - 1, channels + 2).astype(int)
    starts, weight_starts, widths = [], [], []
    for c in range(channels + 1):
        starts.append(edges[c])
        weight_starts.append(sum(widths))
        widths.append(max(1, edges[c + 1] - edges[c]))
    total = sum(widths)
    weights = rng.integers(0, 4096, total).astype(np.int16)
    weights[::7] = -weights[::7]  # negative weights wrap through uint64, as in C
    return {1: weights, 2: (4096 - weights).astype(np.int16),
            3: np.array(starts, np.int16), 4: np.array(weight_starts, np.int16),
            5: np.array(widths, np.int16)}


@pytest.mark.parametrize("bins, channels", [(257, 40), (33, 6)])
def test_filter_bank(bins, channels):
    tables = filter_bank_tables(bins, channels)
    inputs = [((bins,), "uint32"), *((t.shape, "int16") for t in tables.values())]
    assert_matches_oracle(custom_model("SignalFilterBank", inputs, [((channels,), "uint64")],
                                       {"num_channels": channels}, tables))


@pytest.mark.parametrize("bits", [0, 3, 15])
def test_filter_bank_square_root(bits):
    assert_matches_oracle(custom_model("SignalFilterBankSquareRoot",
                                       [((40,), "uint64"), ((), "int32")], [((40,), "uint32")],
                                       {}, {1: np.array(bits, np.int32)}))


def test_filter_bank_square_root_edges():
    """Squares, halves and the largest values of both of TFLite Micro's paths."""
    model = custom_model("SignalFilterBankSquareRoot", [((12,), "uint64"), ((), "int32")],
                         [((12,), "uint32")], {}, {1: np.array(0, np.int32)})
    x = np.array([0, 1, 2, 3, 4, 2**32 - 1, 2**32, 65535**2 + 65535, 65535**2 + 65536,
                  2**64 - 1, 10**18, 12345678901], np.uint64)
    expected = TFLMOracle(model, 1).invoke([x])[0]
    np.testing.assert_array_equal(ArenaInterpreter(plan_model(parse_model(model))).invoke([x])[0],
                                  expected)
    assert_matches_oracle(model)


SPECTRAL = {"alternate_one_minus_smoothing": 15401, "alternate_smoothing": 983,
            "clamping": False, "min_signal_remaining": 819, "num_channels": 40,
            "one_minus_smoothing": 15975, "smoothing": 409, "smoothing_bits": 10,
            "spectral_subtraction_bits": 14}


@pytest.mark.parametrize("options", [SPECTRAL, {**SPECTRAL, "clamping": True},
                                     {**SPECTRAL, "num_channels": 7, "smoothing_bits": 3,
                                      "alternate_smoothing": 409,
                                      "alternate_one_minus_smoothing": 15975}])
def test_spectral_subtraction_keeps_its_noise_estimate(options):
    n = options["num_channels"]
    model = custom_model("SignalFilterBankSpectralSubtraction", [((n,), "uint32")],
                         [((n,), "uint32"), ((n,), "uint32")], options)
    mp = plan_model(parse_model(model))
    assert [s.kind for s in mp.state_slots] == ["kernel"] and mp.state_bytes >= 4 * n
    assert_matches_oracle(model, sequence=SEQUENCE)


def test_spectral_subtraction_state_persists_and_resets():
    """The noise estimate output changes from invoke to invoke on the same input, and a reset
    brings back the first invoke's outputs."""
    model = custom_model("SignalFilterBankSpectralSubtraction", [((40,), "uint32")],
                         [((40,), "uint32"), ((40,), "uint32")], SPECTRAL)
    runtime = ArenaInterpreter(plan_model(parse_model(model)))
    x = np.random.default_rng(1).integers(0, 1 << 20, 40).astype(np.uint32)
    first = runtime.invoke([x])
    second = runtime.invoke([x])
    assert not np.array_equal(first[1], second[1])
    runtime.reset()
    for a, b in zip(first, runtime.invoke([x]), strict=True):
        np.testing.assert_array_equal(a, b)


def pcan_lut(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-32768, 32768, 125).astype(np.int16)


@pytest.mark.parametrize("channels, snr_shift", [(40, 6), (9, 0), (5, 20)])
def test_pcan(channels, snr_shift):
    assert_matches_oracle(custom_model("SignalPCAN", [((channels,), "uint32")] * 2
                                       + [((125,), "int16")], [((channels,), "uint32")],
                                       {"snr_shift": snr_shift}, {2: pcan_lut(channels)}))


def test_pcan_small_noise_estimates():
    """Noise estimates 0..2 read the table directly; small ones take the left shift."""
    model = custom_model("SignalPCAN", [((8,), "uint32")] * 2 + [((125,), "int16")],
                         [((8,), "uint32")], {"snr_shift": 6}, {2: pcan_lut()})
    x = np.array([5, 1 << 20, 77, 2**32 - 1, 0, 1000, 9, 123456], np.uint32)
    noise = np.array([0, 1, 2, 3, 100, 2047, 2048, 2**31], np.uint32)
    expected = TFLMOracle(model, 1).invoke([x, noise])[0]
    actual = ArenaInterpreter(plan_model(parse_model(model))).invoke([x, noise])[0]
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("bits, scale", [(3, 64), (0, 1 << 12), (12, -7)])
def test_filter_bank_log(bits, scale):
    assert_matches_oracle(custom_model("SignalFilterBankLog", [((40,), "uint32")],
                                       [((40,), "int16")],
                                       {"input_correction_bits": bits, "output_scale": scale}))


def front_end(frame: int = 64, fft_length: int = 64, channels: int = 8) -> bytes:
    """Raw audio to log filter-bank energies, the micro_speech front end's chain of signal ops
    (its energies feed the filter bank directly)."""
    bins = fft_length // 2 + 1
    b = ModelBuilder("int8")
    audio = b.input("audio", (frame,), "int16")
    windowed = b.tensor("windowed", (frame,), "int16")
    b.custom("SignalWindow", [audio, b.const("window", hann(frame))], [windowed], {"shift": 12})
    scaled, bits = b.tensor("scaled", (frame,), "int16"), b.tensor("bits", (), "int32")
    b.custom("SignalFftAutoScale", [windowed], [scaled, bits], {})
    spectrum = b.tensor("spectrum", (fft_length + 2,), "int16")
    b.custom("SignalRfft", [scaled], [spectrum], {"T": 7, "fft_length": fft_length})
    energy = b.tensor("energy", (bins,), "uint32")
    b.custom("SignalEnergy", [spectrum], [energy], {"end_index": bins, "start_index": 0})
    tables = filter_bank_tables(bins, channels)
    banks = b.tensor("banks", (channels,), "uint64")
    b.custom("SignalFilterBank", [energy, *(b.const(f"fb{k}", t) for k, t in tables.items())],
             [banks], {"num_channels": channels})
    roots = b.tensor("roots", (channels,), "uint32")
    b.custom("SignalFilterBankSquareRoot", [banks, bits], [roots], {})
    clean, noise = (b.tensor(n, (channels,), "uint32") for n in ("clean", "noise"))
    b.custom("SignalFilterBankSpectralSubtraction", [roots], [clean, noise],
             {**SPECTRAL, "num_channels": channels})
    gained = b.tensor("gained", (channels,), "uint32")
    b.custom("SignalPCAN", [clean, noise, b.const("lut", pcan_lut())], [gained],
             {"snr_shift": 6})
    features = b.tensor("features", (channels,), "int16")
    b.custom("SignalFilterBankLog", [gained], [features],
             {"input_correction_bits": 3, "output_scale": 64})
    b.output(features)
    b.output(noise)
    return b.build()


def test_front_end_chain():
    model = front_end()
    assert oracle_of(plan_model(parse_model(model)).program.bindings)[0] == TFLM
    assert_matches_oracle(model, sequence=SEQUENCE)


def test_front_end_chain_on_a_tone():
    """A quiet tone rather than full-range noise: nothing saturates, the features vary."""
    model = front_end(frame=48, fft_length=64)
    mp = plan_model(parse_model(model))
    oracle, runtime = TFLMOracle(model, 2), ArenaInterpreter(mp)
    t = np.arange(48)
    outputs = []
    for k in range(5):
        x = (900 * np.sin(t * 0.3 * (k + 1)) + 40 * np.cos(t * 1.7)).astype(np.int16)
        expected = oracle.invoke([x])
        actual = runtime.invoke([x])
        for e, a in zip(expected, actual, strict=True):
            np.testing.assert_array_equal(e, a)
        outputs.append(expected[0])
    assert np.unique(np.concatenate(outputs)).size > 8


def test_random_inputs_reach_uint64():
    graph = parse_model(custom_model("SignalFilterBankSquareRoot",
                                     [((40,), "uint64"), ((), "int32")],
                                     [((40,), "uint32")], {}, {1: np.array(0, np.int32)})).main
    (x,) = random_inputs(graph, 0)
    assert x.dtype == np.uint64 and int(x.max()) > 2**62


# -- refusals ---------------------------------------------------------------------------------


def test_an_unknown_custom_op_is_refused_by_name():
    model = custom_model("SignalMystery", [((4,), "int16")], [((4,), "int16")], {"x": 1})
    with pytest.raises(UnsupportedOpError, match="op 0 SignalMystery: no kernel"):
        prepare_graph(parse_model(model).main)


def test_options_other_than_the_kernels_are_refused():
    model = custom_model("SignalWindow", [((8,), "int16"), ((8,), "int16")], [((8,), "int16")],
                         {"shift": 3, "extra": 1}, {1: hann(8)})
    graph = parse_model(model).main
    with pytest.raises(ModelError, match="reads exactly"):
        bind(graph, graph.operators[0])


@pytest.mark.parametrize("options, why", [
    ({"T": 7, "fft_length": 28}, "prime factor above 5"),
    ({"T": 1, "fft_length": 32}, "option T=1"),
])
def test_rfft_refusals(options, why):
    model = custom_model("SignalRfft", [((16,), "int16")], [((options["fft_length"] + 2,),
                                                               "int16")], options)
    assert why in refusal(model)


def test_custom_options_that_are_not_a_flexbuffer_read_as_none():
    b = ModelBuilder("int8")
    x = b.input("x", (4,), "int16")
    y = b.tensor("y", (4,), "int16")
    b.custom("Opaque", [x], [y], b"\x01\x02\x03")
    b.output(y)
    op = parse_model(b.build()).main.operators[0]
    assert op.kind == "Opaque" and dict(op.options) == {}


def test_log_table_is_tflm_s():
    table = log_table()
    assert table.size == 130 and table[0] == 0 and table[1] == 224 and table[64] == 5568
    assert table[-2] == 0 and table[-1] == 0


@pytest.mark.parametrize("source, target", [("uint32", "int32"), ("int32", "uint32")])
def test_cast_between_uint32_and_int32(source, target):
    """The front end's energies go through int32 for STRIDED_SLICE and CONCATENATION: C's
    modular conversion, as LiteRT's CAST."""
    b = ModelBuilder("int8")
    x = b.input("x", (64,), source)
    y = b.tensor("y", (64,), target)
    b.op("CAST", [x], [y])
    b.output(y)
    assert_matches_oracle(b.build(), inputs=4)


# -- the streaming ops --------------------------------------------------------------------------


@pytest.mark.parametrize("shape, delay", [((16,), 5), ((2, 6), 9), ((8,), 8), ((3,), 0)])
def test_delay(shape, delay):
    assert_matches_oracle(custom_model("SignalDelay", [(shape, "int16")], [(shape, "int16")],
                                       {"delay_length": delay}), sequence=SEQUENCE)


@pytest.mark.parametrize("shape, size, step", [((16,), 24, 8), ((2, 10), 7, 5), ((4,), 4, 4),
                                               ((1, 12), 10, 3)])
def test_framer_with_prefill(shape, size, step):
    frames = shape[-1] // step
    model = custom_model("SignalFramer", [(shape, "int16")],
                         [((*shape[:-1], frames, size), "int16"), ((), "bool")],
                         {"frame_size": size, "frame_step": step, "prefill": True})
    assert_matches_oracle(model, sequence=SEQUENCE)


def assert_valid_frames_match(model: bytes, invokes: int = 6) -> None:
    """The valid flag after every invoke, and the frames whenever it is set, as TFLite Micro's
    (which leaves a frame it cannot fill unwritten, runtime_py and the C zeros), in runtime_py
    and the compiled C."""
    mp = plan_model(parse_model(model))
    oracle, runtime, c = TFLMOracle(model, 2), ArenaInterpreter(mp), CBackend(mp)
    input_sets = [random_inputs(mp.graph, k) for k in range(invokes)]
    try:
        compiled = c.invoke_many(input_sets)
    finally:
        c.close()
    flags = []
    for inputs, from_c in zip(input_sets, compiled, strict=True):
        expected, expected_valid = oracle.invoke(inputs)
        for actual, actual_valid in (runtime.invoke(inputs), from_c):
            assert bool(expected_valid) == bool(actual_valid)
            if expected_valid:
                np.testing.assert_array_equal(expected, actual)
        flags.append(bool(expected_valid))
    assert not all(flags) and any(flags)


def test_framer_without_prefill():
    assert_valid_frames_match(custom_model(
        "SignalFramer", [((8,), "int16")], [((1, 20), "int16"), ((), "bool")],
        {"frame_size": 20, "frame_step": 8, "prefill": False}))


@pytest.mark.parametrize("channels, left, step", [(5, 2, 1), (3, 0, 1), (8, 3, 1)])
def test_stacker_every_frame(channels, left, step):
    size = channels * (left + 1)
    assert_matches_oracle(custom_model(
        "SignalStacker", [((channels,), "int16")], [((size,), "int16"), ((), "bool")],
        {"num_channels": channels, "stacker_left_context": left, "stacker_right_context": 0,
         "stacker_step": step}), sequence=SEQUENCE)


def test_stacker_with_right_context_and_steps():
    channels, left, right = 4, 1, 2
    assert_valid_frames_match(custom_model(
        "SignalStacker", [((channels,), "int16")],
        [((channels * (left + right + 1),), "int16"), ((), "bool")],
        {"num_channels": channels, "stacker_left_context": left,
         "stacker_right_context": right, "stacker_step": 2}), invokes=8)


@pytest.mark.parametrize("dtype, code, shape, step", [("int16", 7, (3, 8), 4),
                                                      ("int16", 7, (2, 2, 6), 6),
                                                      ("float32", 0, (4, 10), 3)])
def test_overlap_add(dtype, code, shape, step):
    frames = shape[-2]
    model = custom_model("SignalOverlapAdd", [(shape, dtype)],
                         [((*shape[:-2], frames * step), dtype)], {"T": code, "frame_step": step})
    assert_matches_oracle(model, sequence=SEQUENCE)


@pytest.mark.parametrize("model", [
    front_end(),
    custom_model("SignalFftAutoScale", [((1,), "int16")], [((1,), "int16"), ((), "int32")], {}),
    custom_model("SignalDelay", [((1, 6), "int16")], [((1, 6), "int16")], {"delay_length": 2}),
    custom_model("SignalOverlapAdd", [((1, 4), "int16")], [((4,), "int16")],
                 {"T": 7, "frame_step": 4}),
    custom_model("SignalFramer", [((1, 5), "int16")], [((1, 1, 5), "int16"), ((), "bool")],
                 {"frame_size": 5, "frame_step": 5, "prefill": True}),
], ids=["front_end", "auto_scale_1", "delay_row", "overlap_add_1", "framer_1"])
def test_generated_c_reads_like_hand_written_c(model):
    source = generate(plan_model(parse_model(model)), "m")["m.c"]
    assert not style_problems(source)


@pytest.mark.parametrize("code, inputs, outputs, options", [
    ("SignalRfft", [(16,)], [(34,)], {"T": [7], "fft_length": 32}),
    ("SignalRfft", [(16,)], [(34,)], {"T": 7, "fft_length": "32"}),
    ("SignalWindow", [(16,), (16,)], [(16,)], {"shift": 99}),
    ("SignalEnergy", [(16,)], [(8,)], {"end_index": 3, "start_index": 9}),
    ("SignalFramer", [(16,)], [(4, 4), ()], {"frame_size": 4, "frame_step": 0,
                                             "prefill": True}),
])
def test_bad_options_are_one_clean_line(code, inputs, outputs, options):
    out_types = ["uint32" if code == "SignalEnergy" else "int16", "bool"]
    model = custom_model(code, [(shape, "int16") for shape in inputs],
                         [(shape, dtype) for shape, dtype in zip(outputs, out_types,
                                                                 strict=False)], options)
    with pytest.raises(UnsupportedOpError) as error:
        prepare_graph(parse_model(model).main)
    assert code in error.value.message and "cannot prepare" not in error.value.message
