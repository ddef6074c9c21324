"""One multiply-add and one shift in place of a reference's requantization, proven equal at
generation time.

A requantization q(acc) of an int32 accumulator is a non-decreasing step function of it:
TFLite's FULLY_CONNECTED rounds acc * scale in double (round half away from zero), its
convolutions apply MultiplyByQuantizedMultiplier's two roundings. So is

    f(acc) = floor((acc * M + R) / 2^N)

for M >= 0. The kernel clamps the result to [low, high] (the activation's range less the
output zero point), so clamp(f) == clamp(q) on every accumulator in [acc_lo, acc_hi] (the
values the op can produce) exactly when f and q first reach each value v in (low, high] at the
same accumulator t_v, its threshold: f(t_v) >= v and f(t_v - 1) < v, that is

    v * 2^N - t_v * M  <=  R  <=  v * 2^N - (t_v - 1) * M - 1.

`single_roundings` finds every threshold of q by bisection on q itself (the reference
function, which runtime_py runs), intersects those intervals and returns an R in them, or None
when they do not meet (the kernel then keeps the reference's arithmetic). On a Cortex-M the
rounding is then a 32 x 32 -> 64-bit multiply-accumulate and a shift (SMLAL), where the
double rounding costs a software double multiply and MultiplyByQuantizedMultiplier a dozen
instructions; and where an R of the interval is an offset times M plus a multiple of 2^32
(`high_word`), the offset rides in the accumulator and the multiply-accumulate is the high
word alone (SMMLA).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from toolchain.ir import INT32_MAX, INT32_MIN

# N is at least 32, so the C takes the high word of the 64-bit sum and shifts it by N - 32.
MIN_SHIFT, MAX_SHIFT = 32, 62
# R stays within this, so that acc * M + R cannot overflow int64 (|acc * M| < 2^62).
MAX_ROUNDING = 2**62
# What R drops by below zero where it can: MultiplyByQuantizedMultiplier's first rounding is
# half up for both signs, its second half away from zero, so that acc * M + R over 2^N matches
# it with R one half of its second rounding's step apart between the signs: 2^31 of the
# product. A kernel then needs no select, only (acc < 0) * -2^31 added (one more SMLAL).
SIGN_STEP = 2**31


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's round() on doubles, exactly: x - trunc(x) is exact, so no 0.49999... misrounding.
    Half of FULLY_CONNECTED's double rounding, which runtime_py runs and the DSP kernels prove
    their single rounding against."""
    whole = np.trunc(x)
    return whole + np.where(np.abs(x - whole) >= 0.5, np.sign(x), 0.0)


def double_to_int32(x: np.ndarray) -> np.ndarray:
    """static_cast<int32_t> of a rounded double as x86 executes it: out of range gives INT32_MIN."""
    in_range = np.abs(x) < 2.0**31
    return np.where(in_range, np.where(in_range, x, 0.0).astype(np.int64), INT32_MIN)


@dataclass(frozen=True)
class SingleRounding:
    """f(acc) = (acc * multiplier + rounding) >> shift for one output channel, with
    `negative_rounding` in place of `rounding` for acc < 0: both references round halves away
    from zero, so their thresholds below zero sit one step (of the product) apart from those
    above."""

    multiplier: int
    rounding: int
    negative_rounding: int
    shift: int
    # every R in [least, greatest] serves as well: a shared rounding's R of both signs, a
    # stepped one's negative R (its R of acc >= 0 then SIGN_STEP above); None otherwise
    least: int | None = None
    greatest: int | None = None


def thresholds(q: Callable[[np.ndarray], np.ndarray], values: np.ndarray, lo: np.ndarray,
               hi: np.ndarray) -> np.ndarray:
    """Per channel (rows) and value (columns), the smallest accumulator in [lo, hi] at which
    q reaches the value, or hi + 1 where it never does. `q` maps an int64 array of
    accumulators, one row per channel, to the reference's results."""
    low = np.repeat(lo[:, None], values.size, axis=1).astype(np.int64)
    high = np.repeat(hi[:, None] + 1, values.size, axis=1).astype(np.int64)
    target = np.broadcast_to(values[None, :], low.shape)
    while (low < high).any():
        mid = low + (high - low) // 2
        reached = q(np.minimum(mid, hi[:, None])) >= target
        high = np.where(reached & (low < high), mid, high)
        low = np.where(~reached & (low < high), mid + 1, low)
    return low


def single_roundings(q: Callable[[np.ndarray], np.ndarray], low: int, high: int,
                     acc_lo: np.ndarray, acc_hi: np.ndarray, multipliers: list[int],
                     shifts: list[int]) -> list[SingleRounding] | None:
    """A SingleRounding per channel that equals q after clamping to [low, high] on every
    accumulator in [acc_lo, acc_hi] (per channel), with the given M and N; None if one
    channel has none."""
    acc_lo, acc_hi = np.asarray(acc_lo, np.int64), np.asarray(acc_hi, np.int64)
    values = np.arange(low + 1, high + 1, dtype=np.int64)
    # thresholds among the negative accumulators, then among the others
    below = thresholds(q, values, np.minimum(acc_lo, -1), np.minimum(acc_hi, -1))
    above = thresholds(q, values, np.maximum(acc_lo, 0), np.maximum(acc_hi, 0))
    result = []
    for channel, (m, n) in enumerate(zip(multipliers, shifts, strict=True)):
        if not (0 <= m <= INT32_MAX and MIN_SHIFT <= n <= MAX_SHIFT):
            return None
        first, last = int(acc_lo[channel]), int(acc_hi[channel])
        every = (-MAX_ROUNDING, MAX_ROUNDING)
        negatives = every if first >= 0 else _interval(
            values, below[channel], first, min(last, -1), m, n)
        positives = every if last < 0 else _interval(
            values, above[channel], max(first, 0), last, m, n)
        if negatives is None or positives is None:
            return None
        negative, positive, stepped = _sign_roundings(negatives, positives, n)
        ends = [(first * m + (negative if first < 0 else positive)) >> n,
                (last * m + (negative if last < 0 else positive)) >> n]
        if not all(INT32_MIN <= e <= INT32_MAX for e in ends):
            return None
        result.append(SingleRounding(m, positive, negative, n, *(stepped or (None, None))))
    return result


# M's tried around the reference's scale times 2^N, nearest first.
NEAR = np.array(sorted(range(-16, 17), key=abs), np.int64)


def shared_roundings(q: Callable[[np.ndarray], np.ndarray], low: int, high: int,
                     acc_lo: np.ndarray, acc_hi: np.ndarray,
                     scales: list[float]) -> list[SingleRounding] | None:
    """SingleRoundings with one N for every channel and one R for both signs (rounding ==
    negative_rounding): f is then the high word of acc * M + R shifted by a constant, one
    SMLAL and no select (an SSAT takes the shift for free). N is the largest that keeps every
    channel's M = scale * 2^N below 2^31 (the most precise), each M the nearest to it for
    which some R matches every threshold of q on [acc_lo, acc_hi]; None if a channel has none
    (where the reference rounds halves of both signs and both occur, no R serves both)."""
    acc_lo, acc_hi = np.asarray(acc_lo, np.int64), np.asarray(acc_hi, np.int64)
    largest = max(scales)
    if acc_lo.min() < INT32_MIN or acc_hi.max() > INT32_MAX or not 0.0 < largest < 0.5:
        return None
    n = min(MAX_SHIFT, 30 - int(np.floor(np.log2(largest))))
    while largest * 2.0**n >= INT32_MAX:
        n -= 1
    if n < MIN_SHIFT:
        return None
    values = np.arange(low + 1, high + 1, dtype=np.int64)
    found = thresholds(q, values, acc_lo, acc_hi)
    result = []
    for channel, scale in enumerate(scales):
        t = found[channel]
        reached, left = t <= acc_hi[channel], t > acc_lo[channel]
        m = np.clip(int(round(scale * 2.0**n)) + NEAR, 0, INT32_MAX)[:, None]
        # f(t) >= v and f(t - 1) < v, for each M (rows) and value (columns)
        r_lo = np.where(reached, (values << n) - t * m, -MAX_ROUNDING).max(axis=1)
        r_hi = np.where(left, (values << n) - (t - 1) * m - 1, MAX_ROUNDING).min(axis=1)
        fits = np.flatnonzero(r_lo <= r_hi)
        if fits.size == 0:
            return None
        i = int(fits[0])
        r = min(max(1 << (n - 1), int(r_lo[i])), int(r_hi[i]))
        result.append(SingleRounding(int(m[i, 0]), r, r, n, int(r_lo[i]), int(r_hi[i])))
    return result


def _interval(values: np.ndarray, found: np.ndarray, first: int, last: int, m: int,
              n: int) -> tuple[int, int] | None:
    """The Rs [least, greatest] for which f matches the thresholds `found` of q on
    [first, last], or None."""
    r_lo, r_hi = -MAX_ROUNDING, MAX_ROUNDING
    for v, t in zip(values.tolist(), found.tolist(), strict=True):
        if t <= last:  # f(t) >= v
            r_lo = max(r_lo, (v << n) - t * m)
        if t > first:  # f(t - 1) < v
            r_hi = min(r_hi, (v << n) - (t - 1) * m - 1)
    return (r_lo, r_hi) if r_lo <= r_hi else None


def _sign_roundings(negatives: tuple[int, int], positives: tuple[int, int], n: int
                    ) -> tuple[int, int, tuple[int, int] | None]:
    """The R below zero and the R above, each in its interval, each the usual half where it
    fits: SIGN_STEP apart where both intervals allow it, with the interval of the negative Rs
    that do (else None)."""
    half = 1 << (n - 1)
    lo = max(positives[0] - SIGN_STEP, negatives[0])
    hi = min(positives[1] - SIGN_STEP, negatives[1])
    if lo <= hi:
        negative = min(max(half - SIGN_STEP, lo), hi)
        return negative, negative + SIGN_STEP, (lo, hi)
    return (min(max(half, negatives[0]), negatives[1]),
            min(max(half, positives[0]), positives[1]), None)


@dataclass(frozen=True)
class HighWord:
    """R as offset * M + high * 2^32: the offset added to the accumulator (folded into the
    channel's sum, free), the rounding is then the high word of acc * M + high * 2^32, one
    SMMLA, where a 64-bit R costs an SMLAL and two moves to set up its accumulator."""

    offset: int
    high: int


def high_word(r: SingleRounding, fold: int, acc_lo: int, acc_hi: int) -> HighWord | None:
    """The HighWord with the smallest offset >= 0 whose R, less `fold` (the output zero point
    times 2^N, added to R), lies in r's interval, keeping the shifted accumulators in int32
    and acc * M + high * 2^32 in int64 on [acc_lo, acc_hi]; None if there is none."""
    if r.least is None or r.greatest is None:
        return None
    lo, hi = r.least + fold, r.greatest + fold
    start = lo % 2**32
    if hi - lo >= 2**32 - 1 or start + (hi - lo) >= 2**32:  # a multiple of 2^32 is in reach
        offset = 0
    else:
        offset = first_multiple(r.multiplier, 2**32, start, start + (hi - lo))
        if offset is None:
            return None
    high = -((offset * r.multiplier - lo) // 2**32)  # the least with R >= lo
    ends = (acc_lo + offset, acc_hi + offset)
    if not (offset * r.multiplier + high * 2**32 <= hi and INT32_MIN <= high <= INT32_MAX
            and all(INT32_MIN <= e <= INT32_MAX for e in ends)
            and all(-(2**63) <= e * r.multiplier + high * 2**32 < 2**63 for e in ends)):
        return None
    return HighWord(offset, high)


def first_multiple(a: int, m: int, lo: int, hi: int) -> int | None:
    """The least x >= 0 with lo <= a * x mod m <= hi (0 <= lo <= hi < m), or None: Euclid's
    steps on (m, a), each turning the question into one about the multiples of m mod a."""
    a %= m
    if lo == 0:
        return 0
    if a == 0:
        return None
    x = -(-lo // a)
    if a * x <= hi:  # reached before a * x wraps
        return x
    # [lo, hi] holds no multiple of a, so hi - lo < a: some a * x lands in m * y + [lo, hi]
    # exactly when (m mod a) * y mod a lies in [-hi mod a, -lo mod a]
    y = first_multiple(m % a, a, -hi % a, -lo % a)
    return None if y is None else -(-(m * y + lo) // a)


def fc_multiplier(scale: float) -> tuple[int, int] | None:
    """M in [2^30, 2^31) and N with M / 2^N the nearest to `scale` (None out of reach)."""
    if not 0.0 < scale < 0.5:
        return None
    n = 30 - int(np.floor(np.log2(scale)))
    m = int(round(scale * 2.0**n))
    if m >= 2**31:
        m, n = m >> 1, n - 1
    return (m, n) if MIN_SHIFT <= n <= MAX_SHIFT else None


def accumulator_range(weights: np.ndarray, offset: int, bias: np.ndarray,
                      dtype_range: tuple[int, int] = (-128, 127)) -> tuple[np.ndarray, np.ndarray]:
    """Per output channel (rows of `weights`, one weight per depth), the least and greatest
    bias + sum(w * (x + offset)) over inputs x in `dtype_range`."""
    w = np.asarray(weights, np.int64)
    a, b = dtype_range[0] + offset, dtype_range[1] + offset
    low = np.minimum(w * a, w * b).sum(axis=1) + np.asarray(bias, np.int64)
    high = np.maximum(w * a, w * b).sum(axis=1) + np.asarray(bias, np.int64)
    return low, high
