"""numpy kernels of ZEROS_LIKE, FILL and SHAPE (toolchain.ops.fill)."""

from __future__ import annotations

import numpy as np

from toolchain.ops.fill.prepare import FillParams, ShapeParams, ZerosLikeParams


def zeros_like(p: ZerosLikeParams, inputs, outputs) -> None:
    outputs[0][...] = 0


def fill(p: FillParams, inputs, outputs) -> None:
    outputs[0][...] = inputs[1].reshape(())


def shape(p: ShapeParams, inputs, outputs) -> None:
    outputs[0][...] = np.array(p.dims, outputs[0].dtype)


KERNELS = {"ZEROS_LIKE": zeros_like, "FILL": fill, "SHAPE": shape}
