"""Params for TFLite Micro's signal library: the custom ops of its audio front end
(window, FFT, energy, mel filter bank, noise reduction, gain control, log), which turn raw
audio frames into features.

LiteRT has no kernel for them, so TFLite Micro's are the reference (Signature.oracle): every
kernel here reproduces their integer arithmetic bit for bit, wrapping where their C++ wraps.
Their options are a flexbuffer map that TFLite Micro reads by position in key order, so a map
with other keys than its kernel expects is refused rather than read differently.

- SignalWindow: out = saturate_int16((x * w) >> shift), the window repeated over the input.
- SignalFftAutoScale: the input shifted left by the most bits its largest magnitude allows
  (TFLite Micro's scan, in which -32768 counts as no headroom), and that shift.
- SignalRfft and SignalIrfft (int16, int32, float32): kiss_fft's real FFT and its inverse, as
  TFLite Micro builds them: a complex FFT of half the length (stages of radix 4, 2, 3 and 5;
  in fixed point each divides its inputs by its radix) over the input zero-padded to
  `fft_length`, then the split into fft_length / 2 + 1 bins; the inverse folds the bins into
  half as many complex points first, and float32 divides by fft_length. The twiddles are
  rounded from double cosines at generation time, as kiss_fft_alloc rounds them at init.
- SignalEnergy: re^2 + im^2 of the bins [start_index, end_index), in uint32; the other
  elements are written 0 (TFLite Micro leaves them as the arena held them).
- SignalFilterBank: per channel, sums of weights (and of the complementary unweights, which
  the next channel takes) times the energies, in uint64 wrapping as C's does.
- SignalFilterBankSquareRoot: round-to-nearest integer square roots, shifted right by a
  run-time bit count (a shift outside 0..31, which C leaves undefined, gives 0 or no shift).
- SignalFilterBankSpectralSubtraction: a noise estimate per channel (the kernel's state,
  zeros after a reset, kept across invokes) smoothed toward the signal and subtracted from it,
  down to a floor; the estimate is the second output.
- SignalPCAN: per-channel automatic gain control from the noise estimate through a gain
  table, then a compressing "shrink".
- SignalFilterBankLog: a fixed-point natural log (a 130-entry correction table,
  toolchain.numerics.tables.log_table) scaled and saturated to int16.
- SignalDelay, SignalFramer, SignalStacker, SignalOverlapAdd: delay lines, frames and stacks
  of frames over the samples of past invokes, and the overlap-add of frames; TFLite Micro keeps
  them in circular buffers, here each is a line in the state block, oldest sample first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from toolchain.errors import ModelError, UnsupportedOpError
from toolchain.ir import INT32_MAX, INT32_MIN, Graph, Operator, Tensor
from toolchain.ops.spec import MemoryRequest, StateRequest

# TensorType codes of the element types SignalRfft's option "T" names.
RFFT_TYPES = {7: "int16", 2: "int32", 0: "float32"}
FFT_DTYPES = ("int16", "int32", "float32")
# kiss_fft's fixed-point scalars: the largest value, the scale of its twiddles.
SAMP_MAX = {"int16": 2**15 - 1, "int32": INT32_MAX}
# The largest radix of kiss_fft's own butterflies; a larger prime factor needs a buffer that
# TFLite Micro's build of kiss_fft does not allocate.
MAX_RADIX = 5
# PCAN's fixed constants (pcan_argc_fixed.h): bits of the SNR and of the output.
PCAN_SNR_BITS = 12
PCAN_OUTPUT_BITS = 6
# The gain table WideDynamicFunction indexes: up to 4 * 32 - 6 + 2 for a 32-bit input.
PCAN_LUT_LENGTH = 4 * 32 - 6 + 3
# The fixed-point log: 16 fraction bits, ln(2) in them.
LOG_SCALE_LOG2 = 16
LOG_COEFF = 45426


def _options(op: Operator, *keys: str) -> dict:
    """The op's options, which must be exactly `keys`: TFLite Micro reads them by position."""
    have = sorted(op.options)
    if have != sorted(keys):
        raise ModelError(f"custom options {have or 'none'}, but TFLite Micro's kernel reads "
                         f"exactly {sorted(keys) or 'none'} (by position)")
    return dict(op.options)


def _int_option(options: dict, key: str, low: int, high: int) -> int:
    value = options[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UnsupportedOpError(f"option {key}={value!r} (must be an integer in "
                                 f"{low}..{high})")
    return int(value)


def _arity(op: Operator, inputs: int, outputs: int) -> None:
    if len(op.inputs) != inputs or len(op.outputs) != outputs or -1 in op.inputs:
        raise ModelError(f"{len(op.inputs)} inputs and {len(op.outputs)} outputs (TFLite Micro's "
                         f"kernel takes {inputs} and gives {outputs})")


def _tensors(graph: Graph, op: Operator) -> tuple[list[Tensor], list[Tensor]]:
    return ([graph.tensors[t] for t in op.inputs], [graph.tensors[t] for t in op.outputs])


def _rank(t: Tensor, rank: int, role: str) -> None:
    if len(t.shape) != rank:
        raise UnsupportedOpError(f"{role} of shape {list(t.shape)} (must be {rank}-D)")


def _constant(t: Tensor, role: str) -> np.ndarray:
    if not t.is_constant:
        raise UnsupportedOpError(f"{role} is not a constant")
    return np.asarray(t.data, np.int64).reshape(-1)


# -- SignalWindow ------------------------------------------------------------------------------

@dataclass(frozen=True)
class WindowParams:
    size: int
    window: int
    shift: int


def prepare_window(graph: Graph, op: Operator) -> WindowParams:
    _arity(op, 2, 1)
    (x, weights), (out,) = _tensors(graph, op)
    shift = _int_option(_options(op, "shift"), "shift", 0, 31)
    _rank(weights, 1, "weights")
    if not x.shape or x.shape != out.shape:
        raise UnsupportedOpError(f"input {list(x.shape)} and output {list(out.shape)} differ")
    window = weights.shape[0]
    if window == 0 or x.num_elements % window:
        raise UnsupportedOpError(f"{x.num_elements} elements are not whole windows of {window}")
    return WindowParams(x.num_elements, window, shift)


# -- SignalFftAutoScale ------------------------------------------------------------------------

@dataclass(frozen=True)
class AutoScaleParams:
    size: int


def prepare_auto_scale(graph: Graph, op: Operator) -> AutoScaleParams:
    _arity(op, 1, 2)
    _options(op)
    (x,), (out, scale) = _tensors(graph, op)
    _rank(x, 1, "input")
    if out.shape != x.shape or scale.shape != ():
        raise UnsupportedOpError(f"outputs {list(out.shape)} and {list(scale.shape)} (must be "
                                 f"{list(x.shape)} and a scalar)")
    return AutoScaleParams(x.num_elements)


# -- SignalRfft --------------------------------------------------------------------------------

@dataclass(frozen=True)
class FftStage:
    """One level of kiss_fft's recursion: `blocks` consecutive butterflies of radix `radix`
    over `m` points each, twiddles `stride` apart."""

    radix: int
    m: int
    stride: int
    blocks: int


@dataclass(frozen=True)
class RfftParams:
    """A real FFT (SignalRfft) or its inverse (SignalIrfft) over `frames` frames: forward, each
    frame of `input_length` samples zero-padded to `fft_length`; inverse, each frame of
    fft_length / 2 + 1 bins into fft_length samples (float32 divided by fft_length)."""

    dtype: str
    inverse: bool
    frames: int
    input_length: int  # values per frame of the input
    fft_length: int
    output_length: int  # values per frame of the output
    stages: tuple[FftStage, ...]
    order: tuple[int, ...]  # complex input point each position of the first stage takes
    twiddles: tuple[float, ...]  # re, im interleaved, fft_length / 2 of them
    super_twiddles: tuple[float, ...]  # re, im interleaved, fft_length / 4 of them

    @property
    def points(self) -> int:
        return self.fft_length // 2


def kiss_factors(n: int) -> list[tuple[int, int]]:
    """kiss_fft's factorization: fours, then twos, then odd primes, as (radix, remaining)."""
    factors, p, floor_sqrt = [], 4, math.floor(math.sqrt(n))
    while True:
        while n % p:
            p = {4: 2, 2: 3}.get(p, p + 2)
            if p > floor_sqrt:
                p = n
        n //= p
        factors.append((p, n))
        if n <= 1:
            return factors


def _twiddle(dtype: str, value: float) -> float:
    """A cosine or sine as kiss_fft stores it: rounded to the fixed-point scale, or a float."""
    if dtype == "float32":
        return float(np.float32(value))
    return math.floor(0.5 + SAMP_MAX[dtype] * value)


def prepare_rfft(graph: Graph, op: Operator) -> RfftParams:
    """SignalRfft and SignalIrfft: kiss_fft's tables as its init computes them."""
    inverse = op.kind == "SignalIrfft"
    _arity(op, 1, 1)
    options = _options(op, "T", "fft_length")
    (x,), (out,) = _tensors(graph, op)
    dtype = RFFT_TYPES.get(_int_option(options, "T", 0, 255))
    if dtype is None or x.dtype != dtype or out.dtype != dtype:
        raise UnsupportedOpError(f"option T={options['T']!r} for {x.dtype} -> {out.dtype}")
    fft_length = _int_option(options, "fft_length", 4, 1 << 15)
    if fft_length % 2:
        raise UnsupportedOpError(f"odd fft_length {fft_length} (kiss_fft's real FFT needs an "
                                 "even one)")
    if not x.shape or not out.shape or x.shape[:-1] != out.shape[:-1]:
        raise UnsupportedOpError(f"input {list(x.shape)} and output {list(out.shape)} "
                                 "frames differ")
    length = x.shape[-1]
    if inverse and (length != fft_length + 2 or out.shape[-1] != fft_length):
        raise UnsupportedOpError(f"frames of {length} into {out.shape[-1]} values (must be "
                                 f"{fft_length + 2}, into {fft_length})")
    if not inverse and (not 0 < length <= fft_length or out.shape[-1] != fft_length + 2):
        raise UnsupportedOpError(f"frames of {length} into {out.shape[-1]} values (must be at "
                                 f"most {fft_length}, into {fft_length + 2})")
    points = fft_length // 2
    factors = kiss_factors(points)
    if max(radix for radix, _ in factors) > MAX_RADIX:
        raise UnsupportedOpError(f"fft_length {fft_length}: {points} points have a prime factor "
                                 f"above {MAX_RADIX}, whose butterfly TFLite Micro's kiss_fft "
                                 "cannot allocate")
    stages, stride = [], 1
    for radix, m in factors:
        stages.append(FftStage(radix, m, stride, stride))
        stride *= radix
    sign = -1 if inverse else 1
    twiddles = []
    for i in range(points):
        phase = sign * (-2 * math.pi * i / points)
        twiddles += [_twiddle(dtype, math.cos(phase)), _twiddle(dtype, math.sin(phase))]
    supers = []
    for i in range(points // 2):
        phase = sign * (-3.14159265358979323846264338327 * ((i + 1) / points + 0.5))
        supers += [_twiddle(dtype, math.cos(phase)), _twiddle(dtype, math.sin(phase))]
    return RfftParams(dtype, inverse, x.num_elements // length, length, fft_length,
                      out.shape[-1], tuple(reversed(stages)), tuple(_input_order(factors)),
                      tuple(twiddles), tuple(supers))


def _input_order(factors: list[tuple[int, int]], level: int = 0, base: int = 0,
                 stride: int = 1) -> list[int]:
    """The complex input point kiss_fft's recursion copies into each position before its
    deepest butterflies (a mixed-radix digit reversal)."""
    radix, m = factors[level]
    if m == 1:
        return [base + j * stride for j in range(radix)]
    return [i for j in range(radix)
            for i in _input_order(factors, level + 1, base + j * stride, stride * radix)]


def rfft_scratch(p: RfftParams) -> tuple[MemoryRequest, ...]:
    size = 2 * p.points * np.dtype(p.dtype).itemsize
    return (MemoryRequest(size, "the complex FFT of half the length"),)


# -- SignalEnergy ------------------------------------------------------------------------------

@dataclass(frozen=True)
class EnergyParams:
    size: int
    start: int
    end: int


def prepare_energy(graph: Graph, op: Operator) -> EnergyParams:
    _arity(op, 1, 1)
    options = _options(op, "end_index", "start_index")
    (x,), (out,) = _tensors(graph, op)
    _rank(out, 1, "output")
    size = out.num_elements
    start = _int_option(options, "start_index", 0, size)
    end = _int_option(options, "end_index", start, size)
    if x.num_elements < 2 * end:
        raise UnsupportedOpError(f"{x.num_elements} input values hold fewer than {end} bins")
    return EnergyParams(size, start, end)


# -- SignalFilterBank --------------------------------------------------------------------------

@dataclass(frozen=True)
class FilterBankParams:
    channels: int
    frequency_starts: tuple[int, ...]  # channels + 1 of each: the first is accumulated only
    weight_starts: tuple[int, ...]
    widths: tuple[int, ...]


def prepare_filter_bank(graph: Graph, op: Operator) -> FilterBankParams:
    _arity(op, 6, 1)
    options = _options(op, "num_channels")
    (x, weights, unweights, freq_starts, weight_starts, widths), (out,) = _tensors(graph, op)
    for role, t in (("input", x), ("weights", weights), ("unweights", unweights),
                    ("output", out)):
        _rank(t, 1, role)
    channels = _int_option(options, "num_channels", 1, 1 << 15)
    tables = [_constant(t, role) for role, t in (
        ("channel_frequency_starts", freq_starts), ("channel_weight_starts", weight_starts),
        ("channel_widths", widths))]
    if any(t.size < channels + 1 for t in tables) or out.shape != (channels,):
        raise UnsupportedOpError(f"channel tables or output too short for {channels} channels")
    starts, wstarts, counts = (t[:channels + 1] for t in tables)
    if (starts < 0).any() or (wstarts < 0).any() or (counts < 0).any() \
            or (starts + counts > x.shape[0]).any() \
            or (wstarts + counts > min(weights.shape[0], unweights.shape[0])).any():
        raise UnsupportedOpError("a channel reaches outside the input or the weights")
    return FilterBankParams(channels, tuple(starts.tolist()), tuple(wstarts.tolist()),
                            tuple(counts.tolist()))


# -- SignalFilterBankSquareRoot ----------------------------------------------------------------

@dataclass(frozen=True)
class SquareRootParams:
    channels: int


def prepare_square_root(graph: Graph, op: Operator) -> SquareRootParams:
    _arity(op, 2, 1)
    _options(op)
    (x, bits), (out,) = _tensors(graph, op)
    _rank(x, 1, "input")
    if out.shape != x.shape or bits.shape != ():
        raise UnsupportedOpError(f"output {list(out.shape)} and shift {list(bits.shape)} (must "
                                 f"be {list(x.shape)} and a scalar)")
    return SquareRootParams(x.num_elements)


# -- SignalFilterBankSpectralSubtraction -------------------------------------------------------

SPECTRAL_KEYS = ("alternate_one_minus_smoothing", "alternate_smoothing", "clamping",
                 "min_signal_remaining", "num_channels", "one_minus_smoothing", "smoothing",
                 "smoothing_bits", "spectral_subtraction_bits")


@dataclass(frozen=True)
class SpectralSubtractionParams:
    channels: int
    smoothing: tuple[int, int]  # even channels, odd channels
    one_minus_smoothing: tuple[int, int]
    min_signal_remaining: int
    smoothing_bits: int
    spectral_subtraction_bits: int
    clamping: bool


def prepare_spectral_subtraction(graph: Graph, op: Operator) -> SpectralSubtractionParams:
    _arity(op, 1, 2)
    options = _options(op, *SPECTRAL_KEYS)
    (x,), (out, noise) = _tensors(graph, op)
    channels = _int_option(options, "num_channels", 1, 1 << 20)
    for role, t in (("input", x), ("output", out), ("noise estimate", noise)):
        if t.shape != (channels,):
            raise UnsupportedOpError(f"{role} of shape {list(t.shape)} for {channels} channels")
    factors = {k: _int_option(options, k, 0, INT32_MAX) for k in (
        "alternate_one_minus_smoothing", "alternate_smoothing", "min_signal_remaining",
        "one_minus_smoothing", "smoothing")}
    return SpectralSubtractionParams(
        channels, (factors["smoothing"], factors["alternate_smoothing"]),
        (factors["one_minus_smoothing"], factors["alternate_one_minus_smoothing"]),
        factors["min_signal_remaining"], _int_option(options, "smoothing_bits", 0, 31),
        _int_option(options, "spectral_subtraction_bits", 0, 63), bool(options["clamping"]))


def spectral_subtraction_state(p: SpectralSubtractionParams) -> tuple[StateRequest, ...]:
    return (StateRequest("uint32", (p.channels,), "the noise estimate"),)


# -- SignalPCAN --------------------------------------------------------------------------------

@dataclass(frozen=True)
class PcanParams:
    channels: int
    snr_shift: int


def prepare_pcan(graph: Graph, op: Operator) -> PcanParams:
    _arity(op, 3, 1)
    options = _options(op, "snr_shift")
    (x, noise, lut), (out,) = _tensors(graph, op)
    _rank(x, 1, "input")
    if noise.shape != x.shape or out.shape != x.shape:
        raise UnsupportedOpError(f"noise estimate {list(noise.shape)} and output "
                                 f"{list(out.shape)} (must be {list(x.shape)})")
    if lut.num_elements < PCAN_LUT_LENGTH:
        raise UnsupportedOpError(f"gain table of {lut.num_elements} values (a 32-bit noise "
                                 f"estimate reads {PCAN_LUT_LENGTH})")
    return PcanParams(x.num_elements, _int_option(options, "snr_shift", 0, 63))


# -- SignalFilterBankLog -----------------------------------------------------------------------

@dataclass(frozen=True)
class LogParams:
    channels: int
    correction_bits: int
    output_scale: int


def prepare_log(graph: Graph, op: Operator) -> LogParams:
    _arity(op, 1, 1)
    options = _options(op, "input_correction_bits", "output_scale")
    (x,), (out,) = _tensors(graph, op)
    _rank(x, 1, "input")
    if out.shape != x.shape:
        raise UnsupportedOpError(f"output {list(out.shape)} (must be {list(x.shape)})")
    return LogParams(x.num_elements, _int_option(options, "input_correction_bits", 0, 31),
                     _int_option(options, "output_scale", INT32_MIN, INT32_MAX))


# -- the streaming ops: delay lines and frame buffers kept across invokes ------------------------
# TFLite Micro keeps each in a circular buffer; here each is a line in the state block, oldest
# sample first, and a count where the line's fill varies (Framer, Stacker): zeros after a reset.

@dataclass(frozen=True)
class DelayParams:
    rows: int
    frame: int
    delay: int


def prepare_delay(graph: Graph, op: Operator) -> DelayParams:
    _arity(op, 1, 1)
    options = _options(op, "delay_length")
    (x,), (out,) = _tensors(graph, op)
    if not x.shape or out.shape != x.shape or x.num_elements == 0:
        raise UnsupportedOpError(f"input {list(x.shape)} and output {list(out.shape)} (must be "
                                 "the same, not empty)")
    frame = x.shape[-1]
    return DelayParams(x.num_elements // frame, frame,
                       _int_option(options, "delay_length", 0, 1 << 20))


def delay_state(p: DelayParams) -> tuple[StateRequest, ...]:
    return (StateRequest("int16", (p.rows, p.delay), "the delayed samples"),) if p.delay else ()


@dataclass(frozen=True)
class FramerParams:
    rows: int
    frames: int  # per row and invoke
    size: int
    step: int
    capacity: int
    prefill: bool

    @property
    def initial(self) -> int:
        """Samples a row holds after a reset: zeros, size - step of them with prefill."""
        return self.size - self.step if self.prefill else 0


def prepare_framer(graph: Graph, op: Operator) -> FramerParams:
    _arity(op, 1, 2)
    options = _options(op, "frame_size", "frame_step", "prefill")
    (x,), (out, valid) = _tensors(graph, op)
    size = _int_option(options, "frame_size", 1, 1 << 16)
    step = _int_option(options, "frame_step", 1, size)
    if not x.shape or x.shape[-1] % step or x.shape[-1] < step:
        raise UnsupportedOpError(f"input {list(x.shape)} is not whole steps of {step}")
    frames = x.shape[-1] // step
    if out.shape != (*x.shape[:-1], frames, size) or valid.shape != ():
        raise UnsupportedOpError(f"outputs {list(out.shape)} and {list(valid.shape)} (must be "
                                 f"{[*x.shape[:-1], frames, size]} and a scalar)")
    return FramerParams(x.num_elements // x.shape[-1], frames, size, step,
                        -(-size // step) * step, bool(options["prefill"]))


def framer_state(p: FramerParams) -> tuple[StateRequest, ...]:
    return (StateRequest("int16", (p.rows, p.capacity), "the samples of the frames to come"),
            StateRequest("int32", (1,), "the samples each row holds beyond a reset's"))


STACKER_KEYS = ("num_channels", "stacker_left_context", "stacker_right_context", "stacker_step")


@dataclass(frozen=True)
class StackerParams:
    channels: int
    left: int
    right: int
    step: int

    @property
    def size(self) -> int:
        return self.channels * (self.left + self.right + 1)


def prepare_stacker(graph: Graph, op: Operator) -> StackerParams:
    _arity(op, 1, 2)
    options = _options(op, *STACKER_KEYS)
    (x,), (out, valid) = _tensors(graph, op)
    channels = _int_option(options, "num_channels", 1, 1 << 16)
    left = _int_option(options, "stacker_left_context", 0, 1 << 10)
    right = _int_option(options, "stacker_right_context", 0, 1 << 10)
    step = _int_option(options, "stacker_step", 1, left + right + 1)
    p = StackerParams(channels, left, right, step)
    if x.shape != (channels,) or out.shape != (p.size,) or valid.shape != ():
        raise UnsupportedOpError(f"input {list(x.shape)}, outputs {list(out.shape)} and "
                                 f"{list(valid.shape)} (must be [{channels}], [{p.size}] and a "
                                 "scalar)")
    return p


def stacker_state(p: StackerParams) -> tuple[StateRequest, ...]:
    return (StateRequest("int16", (p.size,), "the stacked frames"),
            StateRequest("int32", (2,), "the values held, and whether a frame came since the "
                         "reset"))


@dataclass(frozen=True)
class OverlapAddParams:
    dtype: str
    rows: int
    frames: int
    size: int
    step: int


def prepare_overlap_add(graph: Graph, op: Operator) -> OverlapAddParams:
    _arity(op, 1, 1)
    options = _options(op, "T", "frame_step")
    (x,), (out,) = _tensors(graph, op)
    dtype = RFFT_TYPES.get(_int_option(options, "T", 0, 255))
    if dtype not in ("int16", "float32") or dtype != x.dtype:
        raise UnsupportedOpError(f"SignalOverlapAdd of type {options['T']} on {x.dtype}")
    if len(x.shape) < 2 or len(out.shape) != len(x.shape) - 1:
        raise UnsupportedOpError(f"input {list(x.shape)} and output {list(out.shape)} (frames "
                                 "in, one dimension fewer out)")
    frames, size = x.shape[-2:]
    step = _int_option(options, "frame_step", 1, max(size, 1))
    if out.shape != (*x.shape[:-2], frames * step):
        raise UnsupportedOpError(f"output {list(out.shape)} (must be "
                                 f"{[*x.shape[:-2], frames * step]})")
    return OverlapAddParams(x.dtype, x.num_elements // max(frames * size, 1), frames, size, step)


def overlap_add_state(p: OverlapAddParams) -> tuple[StateRequest, ...]:
    return (StateRequest(p.dtype, (p.rows, p.size), "the sums of the frames to come"),)
