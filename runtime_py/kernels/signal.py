"""numpy kernels for TFLite Micro's signal ops (toolchain/ops/signal.py describes each).

Integer arithmetic runs in int64 (or Python ints where uint64 products need more) and is
wrapped where TFLite Micro's C++ stores into a narrower type; a stateful kernel's state view
(the op's slot of the state block) comes after the op's inputs.
"""

from __future__ import annotations

import math

import numpy as np

from toolchain.ops.signal import (
    FRAC_BITS,
    LOG_COEFF,
    LOG_SCALE_LOG2,
    PCAN_OUTPUT_BITS,
    PCAN_SNR_BITS,
    SAMP_MAX,
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
from toolchain.ops.tables import LOG_SEGMENTS_LOG2, log_table

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


# -- the int16 FFT ------------------------------------------------------------------------------

def _round(x):
    return _int16((x + (1 << (FRAC_BITS - 1))) >> FRAC_BITS)


def _mul(ar, ai, br, bi):
    return _round(ar * br - ai * bi), _round(ar * bi + ai * br)


def _div(re, im, k: int):
    """Each part times SAMP_MAX / k (integer), rounded: kiss_fft's division by a radix."""
    return _round(re * (SAMP_MAX // k)), _round(im * (SAMP_MAX // k))


def _stage(re: np.ndarray, im: np.ndarray, radix: int, m: int, stride: int,
           tw: np.ndarray) -> None:
    """One kiss_fft stage over every block at once: re and im are (blocks, radix, m)."""
    k = np.arange(m)
    twr, twi = tw[:, 0], tw[:, 1]
    f = [_div(re[:, q], im[:, q], radix) for q in range(radix)]
    if radix == 2:
        tr, ti = _mul(*f[1], twr[k * stride], twi[k * stride])
        re[:, 1], im[:, 1] = _int16(f[0][0] - tr), _int16(f[0][1] - ti)
        re[:, 0], im[:, 0] = _int16(f[0][0] + tr), _int16(f[0][1] + ti)
    elif radix == 4:
        s0 = _mul(*f[1], twr[k * stride], twi[k * stride])
        s1 = _mul(*f[2], twr[2 * k * stride], twi[2 * k * stride])
        s2 = _mul(*f[3], twr[3 * k * stride], twi[3 * k * stride])
        s5 = [_int16(a - b) for a, b in zip(f[0], s1)]
        a0 = [_int16(a + b) for a, b in zip(f[0], s1)]
        s3 = [_int16(a + b) for a, b in zip(s0, s2)]
        s4 = [_int16(a - b) for a, b in zip(s0, s2)]
        re[:, 2], im[:, 2] = _int16(a0[0] - s3[0]), _int16(a0[1] - s3[1])
        re[:, 0], im[:, 0] = _int16(a0[0] + s3[0]), _int16(a0[1] + s3[1])
        re[:, 1], im[:, 1] = _int16(s5[0] + s4[1]), _int16(s5[1] - s4[0])
        re[:, 3], im[:, 3] = _int16(s5[0] - s4[1]), _int16(s5[1] + s4[0])
    elif radix == 3:
        epi = int(tw[stride * m, 1])
        s1 = _mul(*f[1], twr[k * stride], twi[k * stride])
        s2 = _mul(*f[2], twr[2 * k * stride], twi[2 * k * stride])
        s3 = [_int16(a + b) for a, b in zip(s1, s2)]
        s0 = [_round(_int16(a - b) * epi) for a, b in zip(s1, s2)]
        r1, i1 = _int16(f[0][0] - (s3[0] >> 1)), _int16(f[0][1] - (s3[1] >> 1))
        re[:, 0], im[:, 0] = _int16(f[0][0] + s3[0]), _int16(f[0][1] + s3[1])
        re[:, 2], im[:, 2] = _int16(r1 + s0[1]), _int16(i1 - s0[0])
        re[:, 1], im[:, 1] = _int16(r1 - s0[1]), _int16(i1 + s0[0])
    else:  # radix 5
        yar, yai = (int(v) for v in tw[stride * m])
        ybr, ybi = (int(v) for v in tw[2 * stride * m])
        s = [f[0], *(_mul(*f[q], twr[q * k * stride], twi[q * k * stride]) for q in (1, 2, 3, 4))]
        s7 = [_int16(a + b) for a, b in zip(s[1], s[4])]
        s10 = [_int16(a - b) for a, b in zip(s[1], s[4])]
        s8 = [_int16(a + b) for a, b in zip(s[2], s[3])]
        s9 = [_int16(a - b) for a, b in zip(s[2], s[3])]
        re[:, 0], im[:, 0] = _int16(f[0][0] + s7[0] + s8[0]), _int16(f[0][1] + s7[1] + s8[1])
        s5 = [_int16(s[0][j] + _round(s7[j] * yar) + _round(s8[j] * ybr)) for j in (0, 1)]
        s6 = (_int16(_round(s10[1] * yai) + _round(s9[1] * ybi)),
              _int16(-_round(s10[0] * yai) - _round(s9[0] * ybi)))
        re[:, 1], im[:, 1] = _int16(s5[0] - s6[0]), _int16(s5[1] - s6[1])
        re[:, 4], im[:, 4] = _int16(s5[0] + s6[0]), _int16(s5[1] + s6[1])
        s11 = [_int16(s[0][j] + _round(s7[j] * ybr) + _round(s8[j] * yar)) for j in (0, 1)]
        s12 = (_int16(-_round(s10[1] * ybi) + _round(s9[1] * yai)),
               _int16(_round(s10[0] * ybi) - _round(s9[0] * yai)))
        re[:, 2], im[:, 2] = _int16(s11[0] + s12[0]), _int16(s11[1] + s12[1])
        re[:, 3], im[:, 3] = _int16(s11[0] - s12[0]), _int16(s11[1] - s12[1])


def rfft_frame(p: RfftParams, frame: np.ndarray) -> np.ndarray:
    """One frame's spectrum: fft_length + 2 int16 values, re and im interleaved."""
    padded = np.zeros(p.fft_length, np.int64)
    padded[:p.input_length] = frame
    order = np.asarray(p.order)
    re, im = padded[0::2][order].copy(), padded[1::2][order].copy()
    tw = np.asarray(p.twiddles, np.int64).reshape(-1, 2)
    for s in p.stages:
        shape = (s.blocks, s.radix, s.m)
        block_re, block_im = re.reshape(shape), im.reshape(shape)
        _stage(block_re, block_im, s.radix, s.m, s.stride, tw)
    n = p.points
    out = np.zeros((n + 1, 2), np.int64)
    dr, di = _div(re[0], im[0], 2)
    out[0, 0], out[n, 0] = _int16(dr + di), _int16(dr - di)
    k = np.arange(1, n // 2 + 1)
    pr, pi = _div(re[k], im[k], 2)
    nr, ni = _div(re[n - k], _int16(-im[n - k]), 2)
    f1r, f1i = _int16(pr + nr), _int16(pi + ni)
    f2r, f2i = _int16(pr - nr), _int16(pi - ni)
    supers = np.asarray(p.super_twiddles, np.int64).reshape(-1, 2)
    tr, ti = _mul(f2r, f2i, supers[k - 1, 0], supers[k - 1, 1])
    out[k, 0], out[k, 1] = _int16((f1r + tr) >> 1), _int16((f1i + ti) >> 1)
    out[n - k, 0], out[n - k, 1] = _int16((f1r - tr) >> 1), _int16((ti - f1i) >> 1)
    return out.reshape(-1)


def rfft(p: RfftParams, inputs, outputs) -> None:
    frames = inputs[0].reshape(p.frames, p.input_length).astype(np.int64)
    out = outputs[0].reshape(p.frames, p.output_length)
    for f in range(p.frames):
        out[f] = rfft_frame(p, frames[f])


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
    for start, weight_start, width in zip(p.frequency_starts, p.weight_starts, p.widths):
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
    for value, estimate in zip(x, noise):
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
