"""numpy kernels of ZEROS_LIKE, FILL, SHAPE and BROADCAST_ARGS (toolchain.ops.fill)."""

from __future__ import annotations

import numpy as np

from toolchain.errors import RuntimeBackendError
from toolchain.ops.fill.prepare import BroadcastArgsParams, FillParams, ShapeParams, ZerosLikeParams


def zeros_like(p: ZerosLikeParams, inputs, outputs) -> None:
    outputs[0][...] = 0


def fill(p: FillParams, inputs, outputs) -> None:
    outputs[0][...] = inputs[1].reshape(())


def shape(p: ShapeParams, inputs, outputs) -> None:
    outputs[0][...] = np.array(p.dims, outputs[0].dtype)


def broadcast_args(p: BroadcastArgsParams, inputs, outputs) -> None:
    """TFLite's reference: each dimension read as an int (int64 ones wrap to 32 bits), from
    the last; a missing one is 1."""
    n = p.out
    dims = [np.concatenate([np.ones(n - len(s), np.int64), s.astype(np.int64)])
            .astype(np.uint32).view(np.int32).astype(np.int64) for s in inputs[:2]]
    x, y = dims
    if ((x != 1) & (y != 1) & (x != y)).any():
        raise RuntimeBackendError(f"BROADCAST_ARGS: shapes {inputs[0].tolist()} and "
                                  f"{inputs[1].tolist()} do not broadcast")
    outputs[0][...] = np.where(x == 1, y, x).astype(outputs[0].dtype)


KERNELS = {"ZEROS_LIKE": zeros_like, "FILL": fill, "SHAPE": shape,
           "BROADCAST_ARGS": broadcast_args}
