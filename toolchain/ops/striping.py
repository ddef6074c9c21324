"""How a kernel runs on a band of its output rows (or columns): what toolchain.lower.tiling asks
of an op that may run stripe by stripe (its family's OpSpec.striping).

A striped segment runs a chain of ops a few output rows at a time, so that only stripe buffers
of the intermediates exist (toolchain.lower.tiling). Of each op it needs three things: which
input rows each output row reads (a RowMap), the op's params for a band of rows (the same
kernel on fewer rows, its top padding what is left above the band), and whether it reads every
activation input row for row (elementwise) or only its first (windowed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The most MACs column tiles may compute twice unless told (`--max-recompute`), in percent of
# the model's: small, yet room for four tiles of a MobileNet's first eight layers.
DEFAULT_MAX_RECOMPUTE = 10.0


@dataclass(frozen=True)
class RowMap:
    """Output row r of an op reads input rows r * stride - pad + j * dilation (j < taps) that
    lie in [0, rows)."""

    taps: int
    stride: int
    dilation: int
    pad: int
    rows: int

    def first(self, r: int) -> int:
        """The first input row output row r reads."""
        return min(max(0, r * self.stride - self.pad), self.rows)

    def end(self, r: int) -> int:
        """One past the last input row output row r reads."""
        return max(0, min(self.rows, r * self.stride - self.pad + (self.taps - 1) * self.dilation
                          + 1))


ONE_TO_ONE = RowMap(1, 1, 1, 0, 0)


@dataclass(frozen=True)
class Striping:
    """What an op's kernel tells the tiler.

    `rows(params)`: how its output rows read its first input's rows (`rows` of the RowMap is
    filled in by the tiler), or None when these params cannot go by bands (a hybrid
    convolution quantizes each image with its own range). `band(params, out_lo, out_hi, in_lo,
    in_hi)`: the params for output rows [out_lo, out_hi) read from input rows [in_lo, in_hi).
    `every_input`: each activation input is read row for row (ADD's two), not the first only.
    `key(params)`: of a band's params, what makes two bands run the same C (the shapes and
    padding a band changes), so that alike stripes run as one loop.
    `macs(params)`: the multiply-accumulates of the whole op, which striping must not repeat.
    `columns(params)` and `column_band(params, out_lo, out_hi, in_lo, in_hi)`: the same across
    the width, for a segment run in column tiles (toolchain.lower.tiling); None where the op
    cannot be cut into columns.
    `accumulates(params, input_shape)`: the bytes of accumulators with which the op adds up its
    input band by band, when it reduces the whole input to one output row (a global pool), else
    0. Such an op may end a segment: each stripe's new rows of its input go into the
    accumulators, and the last stripe writes its output (band params carry a Reduction).
    """

    rows: Callable[[Any], RowMap | None]
    band: Callable[[Any, int, int, int, int], Any]
    key: Callable[[Any], tuple]
    every_input: bool = False
    macs: Callable[[Any], int] | None = None
    columns: Callable[[Any], RowMap | None] | None = None
    column_band: Callable[[Any, int, int, int, int], Any] | None = None
    accumulates: Callable[[Any, tuple[int, ...]], int] | None = None


@dataclass(frozen=True)
class Reduction:
    """A band of `rows` rows of a reducing op's input (Striping.accumulates): the first band
    `starts` the accumulators, the last `finishes` (writes the output from them)."""

    starts: bool
    finishes: bool
    rows: int


def with_rows(shape: tuple[int, ...], rows: int) -> tuple[int, ...]:
    """An NHWC shape of `rows` rows."""
    return (shape[0], rows, *shape[2:])


def with_columns(shape: tuple[int, ...], columns: int) -> tuple[int, ...]:
    """An NHWC shape of `columns` columns."""
    return (shape[0], shape[1], columns, *shape[3:])
