"""numpy kernel of CUMSUM (toolchain.ops.scan): LiteRT's sum from 0 along the axis, element by
element in the tensor's type (numpy's int32 and int64 wrap as the C's unsigned sums)."""

from __future__ import annotations

import numpy as np

from toolchain.ops.scan.prepare import CumSumParams


def cumsum(p: CumSumParams, inputs, outputs) -> None:
    x = inputs[0].reshape(p.outer, p.depth, p.inner)
    out = outputs[0].reshape(p.outer, p.depth, p.inner)
    total = np.zeros((p.outer, p.inner), x.dtype)
    order = range(p.depth - 1, -1, -1) if p.reverse else range(p.depth)
    with np.errstate(all="ignore"):
        for d in order:
            if p.exclusive:
                out[:, d, :] = total
            total = total + x[:, d, :]
            if not p.exclusive:
                out[:, d, :] = total


KERNELS = {"CUMSUM": cumsum}
