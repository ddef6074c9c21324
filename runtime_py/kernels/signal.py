"""numpy kernels for TFLite Micro's signal ops (toolchain/ops/signal/prepare.py describes each).

Integer arithmetic runs in int64 (or Python ints where uint64 products need more) and is
wrapped where TFLite Micro's C++ stores into a narrower type; a stateful kernel's state view
(the op's slot of the state block) comes after the op's inputs.
"""

from __future__ import annotations

import math

import numpy as np

from toolchain.numerics.tables import LOG_SEGMENTS_LOG2, log_table
from toolchain.ops.signal.prepare import (
    LOG_COEFF,
    LOG_SCALE_LOG2,
    PCAN_OUTPUT_BITS,
    PCAN_SNR_BITS,
    AutoScaleParams,
    DelayParams,
    EnergyParams,
    FilterBankParams,
    FramerParams,
    LogParams,
    OverlapAddParams,
    PcanParams,
    RfftParams,
    SpectralSubtractionParams,
    SquareRootParams,
    StackerParams,
    WindowParams,
)

MASK32 = (1 << 32) - 1
MASK64 = (1 << 64) - 1


def _int16(x):
    """A store into int16: modulo 2^16."""
    return ((x + 32768) & 0xFFFF) - 32768


def window(p: WindowParams, inputs, outputs) -> None:
    x, weights = inputs
    raw = (x.reshape(-1, p.window).astype(np.int64) * weights.astype(np.int64)) >> p.shift
    outputs[0][...] = np.clip(raw, -32768, 32767).reshape(outputs[0].shape)


def auto_scale(p: AutoScaleParams, inputs, outputs) -> None:
    largest = 0  # TFLite Micro's scan: -(-32768) stored back into int16 stays -32768
    for value in inputs[0].tolist():
        if value > largest:
            largest = value
        elif -value > largest:
            largest = _int16(-value)
    bits = 0 if largest <= 0 else max(0, 15 - int(largest).bit_length())
    outputs[0][...] = _int16(inputs[0].astype(np.int64) << bits)
    outputs[1][...] = bits


# -- kiss_fft: the int16, int32 and float32 FFTs ---------------------------------------------------

class _Arith:
    """kiss_fft's scalar arithmetic for one type: `store` is an assignment to a scalar (a wrap to
    the integer type, a float32 rounding), `mul` a complex product, `div` the division by a
    radix (fixed point only), `scale` S_MUL, `half` HALF_OF of a stored value and `half_sum`
    HALF_OF of a sum or difference as C evaluates it (int32 sums wrap before the shift)."""

    def __init__(self, dtype: str):
        self.float = dtype == "float32"
        self.bits = {"int16": 16, "int32": 32}.get(dtype, 0)

    def store(self, x):
        if self.float:
            return np.float32(x) if np.ndim(x) == 0 else np.asarray(x, np.float32)
        half = 1 << (self.bits - 1)
        return ((x + half) & ((1 << self.bits) - 1)) - half

    def round(self, x):
        frac = self.bits - 1
        return self.store((x + (1 << (frac - 1))) >> frac)

    def mul(self, ar, ai, br, bi):
        if self.float:
            f = np.float32
            return (self.store(f(ar) * f(br) - f(ai) * f(bi)),
                    self.store(f(ar) * f(bi) + f(ai) * f(br)))
        return self.round(ar * br - ai * bi), self.round(ar * bi + ai * br)

    def div(self, re, im, k: int):
        if self.float:  # copies: the stage writes its inputs' places while it still reads them
            return np.array(re), np.array(im)
        factor = ((1 << (self.bits - 1)) - 1) // k
        return self.round(re * factor), self.round(im * factor)

    def scale(self, a, b):
        return self.store(np.float32(a) * np.float32(b)) if self.float else self.round(a * b)

    def half(self, x):
        return self.store(x * np.float32(0.5)) if self.float else x >> 1

    def half_sum(self, x):
        """HALF_OF(a + b) for x = a + b as C computed it."""
        if self.float:
            return self.store(self.store(x) * np.float32(0.5))
        return (self.store(x) if self.bits == 32 else x) >> 1


def _pairs(arith: _Arith, a, b, op):
    return [arith.store(op(x, y)) for x, y in zip(a, b, strict=True)]


def _stage(arith: _Arith, re: np.ndarray, im: np.ndarray, radix: int, m: int, stride: int,
           tw: np.ndarray, inverse: bool) -> None:
    """One kiss_fft stage over every block at once: re and im are (blocks, radix, m)."""
    add, sub = (lambda a, b: _pairs(arith, a, b, np.add)), (lambda a, b: _pairs(arith, a, b,
                                                                                 np.subtract))
    store, scale = arith.store, arith.scale
    k = np.arange(m)
    twr, twi = tw[:, 0], tw[:, 1]
    f = [arith.div(re[:, q], im[:, q], radix) for q in range(radix)]
    if radix == 2:
        t = arith.mul(*f[1], twr[k * stride], twi[k * stride])
        (re[:, 1], im[:, 1]), (re[:, 0], im[:, 0]) = sub(f[0], t), add(f[0], t)
    elif radix == 4:
        s0 = arith.mul(*f[1], twr[k * stride], twi[k * stride])
        s1 = arith.mul(*f[2], twr[2 * k * stride], twi[2 * k * stride])
        s2 = arith.mul(*f[3], twr[3 * k * stride], twi[3 * k * stride])
        s5, a0 = sub(f[0], s1), add(f[0], s1)
        s3, s4 = add(s0, s2), sub(s0, s2)
        (re[:, 2], im[:, 2]), (re[:, 0], im[:, 0]) = sub(a0, s3), add(a0, s3)
        sign = -1 if inverse else 1
        re[:, 1], im[:, 1] = store(s5[0] + sign * s4[1]), store(s5[1] - sign * s4[0])
        re[:, 3], im[:, 3] = store(s5[0] - sign * s4[1]), store(s5[1] + sign * s4[0])
    elif radix == 3:
        epi = tw[stride * m, 1]
        s1 = arith.mul(*f[1], twr[k * stride], twi[k * stride])
        s2 = arith.mul(*f[2], twr[2 * k * stride], twi[2 * k * stride])
        s3, s0 = add(s1, s2), sub(s1, s2)
        r1, i1 = store(f[0][0] - arith.half(s3[0])), store(f[0][1] - arith.half(s3[1]))
        s0 = [scale(v, epi) for v in s0]
        re[:, 0], im[:, 0] = add(f[0], s3)
        re[:, 2], im[:, 2] = store(r1 + s0[1]), store(i1 - s0[0])
        re[:, 1], im[:, 1] = store(r1 - s0[1]), store(i1 + s0[0])
    else:  # radix 5
        yar, yai = tw[stride * m]
        ybr, ybi = tw[2 * stride * m]
        s = [f[0], *(arith.mul(*f[q], twr[q * k * stride], twi[q * k * stride])
                     for q in (1, 2, 3, 4))]
        s7, s10, s8, s9 = add(s[1], s[4]), sub(s[1], s[4]), add(s[2], s[3]), sub(s[2], s[3])
        re[:, 0] = store(f[0][0] + store(s7[0] + s8[0]) if arith.float else
                         f[0][0] + s7[0] + s8[0])
        im[:, 0] = store(f[0][1] + store(s7[1] + s8[1]) if arith.float else
                         f[0][1] + s7[1] + s8[1])
        s5 = [store(store(s[0][j] + scale(s7[j], yar)) + scale(s8[j], ybr)) for j in (0, 1)]
        s6 = (store(scale(s10[1], yai) + scale(s9[1], ybi)),
              store(-scale(s10[0], yai) - scale(s9[0], ybi)))
        (re[:, 1], im[:, 1]), (re[:, 4], im[:, 4]) = sub(s5, s6), add(s5, s6)
        s11 = [store(store(s[0][j] + scale(s7[j], ybr)) + scale(s8[j], yar)) for j in (0, 1)]
        s12 = (store(-scale(s10[1], ybi) + scale(s9[1], yai)),
               store(scale(s10[0], ybi) - scale(s9[0], yai)))
        (re[:, 2], im[:, 2]), (re[:, 3], im[:, 3]) = add(s11, s12), sub(s11, s12)


def _complex_fft(p: RfftParams, arith: _Arith, re: np.ndarray, im: np.ndarray):
    """kiss_fft of p.points complex points given in natural order: the result, (re, im)."""
    order = np.asarray(p.order)
    re, im = re[order].copy(), im[order].copy()
    tw = np.asarray(p.twiddles, re.dtype).reshape(-1, 2)
    for s in p.stages:
        shape = (s.blocks, s.radix, s.m)
        _stage(arith, re.reshape(shape), im.reshape(shape), s.radix, s.m, s.stride, tw,
               p.inverse)
    return re, im


def _work_dtype(arith: _Arith):
    return np.float32 if arith.float else np.int64


def rfft_frame(p: RfftParams, frame: np.ndarray) -> np.ndarray:
    """One frame's spectrum: fft_length + 2 values, re and im interleaved."""
    arith = _Arith(p.dtype)
    padded = np.zeros(p.fft_length, _work_dtype(arith))
    padded[:p.input_length] = frame
    re, im = _complex_fft(p, arith, padded[0::2], padded[1::2])
    n = p.points
    out = np.zeros((n + 1, 2), _work_dtype(arith))
    dr, di = arith.div(re[0], im[0], 2)
    out[0, 0], out[n, 0] = arith.store(dr + di), arith.store(dr - di)
    k = np.arange(1, n // 2 + 1)
    pr, pi = arith.div(re[k], im[k], 2)
    nr, ni = arith.div(re[n - k], arith.store(-im[n - k]), 2)
    f1r, f1i = arith.store(pr + nr), arith.store(pi + ni)
    f2r, f2i = arith.store(pr - nr), arith.store(pi - ni)
    supers = np.asarray(p.super_twiddles, out.dtype).reshape(-1, 2)
    tr, ti = arith.mul(f2r, f2i, supers[k - 1, 0], supers[k - 1, 1])
    out[k, 0], out[k, 1] = arith.half_sum(f1r + tr), arith.half_sum(f1i + ti)
    out[n - k, 0], out[n - k, 1] = arith.half_sum(f1r - tr), arith.half_sum(ti - f1i)
    return out.reshape(-1)


def irfft_frame(p: RfftParams, spectrum: np.ndarray) -> np.ndarray:
    """One frame of fft_length samples from fft_length / 2 + 1 bins (re, im interleaved)."""
    arith = _Arith(p.dtype)
    n = p.points
    bins = spectrum.astype(_work_dtype(arith)).reshape(-1, 2)
    re, im = np.zeros(n, bins.dtype), np.zeros(n, bins.dtype)
    re[0], im[0] = arith.div(arith.store(bins[0, 0] + bins[n, 0]),
                             arith.store(bins[0, 0] - bins[n, 0]), 2)
    k = np.arange(1, n // 2 + 1)
    fr, fi = arith.div(bins[k, 0], bins[k, 1], 2)
    cr, ci = arith.div(bins[n - k, 0], arith.store(-bins[n - k, 1]), 2)
    er, ei = arith.store(fr + cr), arith.store(fi + ci)
    dr, di = arith.store(fr - cr), arith.store(fi - ci)
    supers = np.asarray(p.super_twiddles, bins.dtype).reshape(-1, 2)
    orr, oi = arith.mul(dr, di, supers[k - 1, 0], supers[k - 1, 1])
    re[k], im[k] = arith.store(er + orr), arith.store(ei + oi)
    re[n - k], im[n - k] = arith.store(er - orr), arith.store(-arith.store(ei - oi))
    re, im = _complex_fft(p, arith, re, im)
    out = np.stack([re, im], axis=1).reshape(-1)
    if arith.float:
        out = (out / np.float32(p.fft_length)).astype(np.float32)
    return out


def rfft(p: RfftParams, inputs, outputs) -> None:
    width = p.output_length if p.inverse else p.input_length
    frames = inputs[0].reshape(p.frames, -1)
    out = outputs[0].reshape(p.frames, -1)
    with np.errstate(all="ignore"):  # IEEE infinities and NaN, as in C
        for f in range(p.frames):
            if p.inverse:
                out[f, :p.fft_length] = irfft_frame(p, frames[f, :p.fft_length + 2])
            else:
                out[f] = rfft_frame(p, frames[f, :width])


# -- energies to features ------------------------------------------------------------------------

def energy(p: EnergyParams, inputs, outputs) -> None:
    bins = inputs[0].reshape(-1)[:2 * p.end].astype(np.int64).reshape(-1, 2)
    out = outputs[0]
    out[...] = 0
    out[p.start:p.end] = (bins[p.start:, 0] ** 2 + bins[p.start:, 1] ** 2) & MASK32


def filter_bank(p: FilterBankParams, inputs, outputs) -> None:
    x, weights, unweights = (v.tolist() for v in inputs[:3])
    weighted = 0
    sums = []
    for start, weight_start, width in zip(p.frequency_starts, p.weight_starts, p.widths,
                                          strict=True):
        unweighted = 0
        for j in range(width):
            weighted += (weights[weight_start + j] & MASK64) * x[start + j]
            unweighted += (unweights[weight_start + j] & MASK64) * x[start + j]
        sums.append(weighted & MASK64)
        weighted = unweighted
    outputs[0][...] = np.array(sums[1:], np.uint64)


def rounded_sqrt(value: int) -> int:
    """TFLite Micro's Sqrt64: the square root rounded to nearest, at most 65535 for values
    below 2^32 (its 32-bit path) and 2^32 - 1 above."""
    root = math.isqrt(value)
    cap = 0xFFFF if value < 1 << 32 else MASK32
    return root + 1 if value - root * root > root and root != cap else root


def square_root(p: SquareRootParams, inputs, outputs) -> None:
    shift = int(inputs[1])
    roots = [rounded_sqrt(v) for v in inputs[0].tolist()]
    outputs[0][...] = [0 if shift >= 32 else r >> max(shift, 0) for r in roots]


def spectral_subtraction(p: SpectralSubtractionParams, inputs, outputs) -> None:
    x, noise = inputs[0].tolist(), inputs[1]
    out, estimate = outputs
    bits = p.spectral_subtraction_bits
    for i, value in enumerate(x):
        smoothing, rest = p.smoothing[i & 1], p.one_minus_smoothing[i & 1]
        scaled = (value << p.smoothing_bits) & MASK32
        new = (((scaled * smoothing + int(noise[i]) * rest) & MASK64) >> bits) & MASK32
        noise[i] = new
        if new > scaled:
            new = scaled
            if p.clamping:
                noise[i] = new
        floor = ((value * p.min_signal_remaining) >> bits) & MASK32
        subtracted = (scaled - new) >> p.smoothing_bits
        out[i] = max(subtracted, floor)
    estimate[...] = noise


def _gain(x: int, lut: list[int]) -> int:
    """WideDynamicFunction: the gain table interpolated at x, as an int16."""
    if x <= 2:
        return lut[x]
    interval = x.bit_length()
    base = 4 * interval - 6
    frac = ((x << (11 - interval)) if interval < 11 else (x >> (interval - 11))) & 0x3FF
    result = (lut[base + 2] * frac) >> 5
    result = _wrap32(result + _wrap32((lut[base + 1] & MASK32) << 5))
    result = _wrap32(result * frac)
    result = _wrap32(result + (1 << 14)) >> 15
    return _int16(result + lut[base])


def _wrap32(x: int) -> int:
    return ((x + (1 << 31)) & MASK32) - (1 << 31)


def _shrink(x: int) -> int:
    if x < 2 << PCAN_SNR_BITS:
        return (x * x) >> (2 + 2 * PCAN_SNR_BITS - PCAN_OUTPUT_BITS)
    return (x >> (PCAN_SNR_BITS - PCAN_OUTPUT_BITS)) - (1 << PCAN_OUTPUT_BITS)


def pcan(p: PcanParams, inputs, outputs) -> None:
    x, noise, lut = (v.tolist() for v in inputs)
    out = []
    for value, estimate in zip(x, noise, strict=True):
        gain = _gain(estimate, lut) & MASK32
        out.append(_shrink(((value * gain) >> p.snr_shift) & MASK32))
    outputs[0][...] = out


_LOG_TABLE = log_table().tolist()


def log32(x: int, scale: int) -> int:
    """TFLite Micro's Log32: ln(x) in 16 fraction bits times `scale` / 65536, in uint32."""
    integer = x.bit_length() - 1
    frac = x - (1 << integer)
    frac = (frac << (LOG_SCALE_LOG2 - integer) if integer < LOG_SCALE_LOG2
            else frac >> (integer - LOG_SCALE_LOG2))
    segment = frac >> (LOG_SCALE_LOG2 - LOG_SEGMENTS_LOG2)
    c0, c1 = _LOG_TABLE[segment], _LOG_TABLE[segment + 1]
    base = ((1 << LOG_SCALE_LOG2) >> LOG_SEGMENTS_LOG2) * segment
    fraction = (frac + c0 + (((c1 - c0) * (frac - base)) >> LOG_SCALE_LOG2)) & MASK32
    log2 = ((integer << LOG_SCALE_LOG2) + fraction) & MASK32
    half = 1 << (LOG_SCALE_LOG2 - 1)
    loge = ((LOG_COEFF * log2 + half) >> LOG_SCALE_LOG2) & MASK32
    return ((((scale & MASK32) * loge) + half) & MASK32) >> LOG_SCALE_LOG2


def log(p: LogParams, inputs, outputs) -> None:
    out = []
    for value in inputs[0].tolist():
        scaled = (value << p.correction_bits) & MASK32
        out.append(min(log32(scaled, p.output_scale), 32767) if scaled > 1 else 0)
    outputs[0][...] = out


# -- streaming ------------------------------------------------------------------------------------

def delay(p: DelayParams, inputs, outputs) -> None:
    x = inputs[0].reshape(p.rows, p.frame)
    out = outputs[0].reshape(p.rows, p.frame)
    if not p.delay:
        out[...] = x
        return
    held = inputs[1]
    line = np.concatenate([held, x], axis=1)
    out[...] = line[:, :p.frame]
    held[...] = line[:, p.frame:]


def framer(p: FramerParams, inputs, outputs) -> None:
    x = inputs[0].reshape(p.rows, p.frames, p.step)
    buffer, filled = inputs[1], inputs[2]
    out = outputs[0].reshape(p.rows, p.frames, p.size)
    valid = True
    for r in range(p.rows):
        n = int(filled[0]) + p.initial
        for f in range(p.frames):
            buffer[r, n:n + p.step] = x[r, f]
            n += p.step
            if n >= p.size:
                out[r, f] = buffer[r, :p.size]
                buffer[r, :n - p.step] = buffer[r, p.step:n].copy()
                n -= p.step
            else:
                out[r, f] = 0
                valid = False
    filled[0] = n - p.initial
    outputs[1][...] = valid


def stacker(p: StackerParams, inputs, outputs) -> None:
    x, buffer, held = inputs
    out, valid = outputs
    n = int(held[0])
    buffer[n:n + p.channels] = x
    n += p.channels
    if not held[1]:
        for _ in range(p.left):
            buffer[n:n + p.channels] = buffer[n - p.channels:n]
            n += p.channels
        held[1] = 1
    step = p.channels * p.step
    if n >= p.size:
        out[...] = buffer[:p.size]
        buffer[:n - step] = buffer[step:n].copy()
        n -= step
        valid[...] = True
    else:
        out[...] = 0
        valid[...] = False
    held[0] = n


def overlap_add(p: OverlapAddParams, inputs, outputs) -> None:
    x = inputs[0].reshape(p.rows, p.frames, p.size)
    sums = inputs[1]
    out = outputs[0].reshape(p.rows, p.frames, p.step)
    for r in range(p.rows):
        for f in range(p.frames):
            if p.dtype == "int16":
                sums[r] = np.clip(sums[r].astype(np.int32) + x[r, f], -32768, 32767)
            else:
                sums[r] = sums[r] + x[r, f]
            out[r, f] = sums[r, :p.step]
            sums[r, :p.size - p.step] = sums[r, p.step:].copy()
            sums[r, p.size - p.step:] = 0


KERNELS = {
    "SignalWindow": window,
    "SignalFftAutoScale": auto_scale,
    "SignalRfft": rfft,
    "SignalIrfft": rfft,
    "SignalEnergy": energy,
    "SignalFilterBank": filter_bank,
    "SignalFilterBankSquareRoot": square_root,
    "SignalFilterBankSpectralSubtraction": spectral_subtraction,
    "SignalPCAN": pcan,
    "SignalFilterBankLog": log,
    "SignalDelay": delay,
    "SignalFramer": framer,
    "SignalStacker": stacker,
    "SignalOverlapAdd": overlap_add,
}
