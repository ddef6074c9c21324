"""One table, op name -> numpy kernel, merged from one module per op family.

A kernel is called as kernel(params, inputs, outputs): params from toolchain.ops, inputs as
numpy arrays (None for an absent optional input), outputs as writable views into the arena that
the kernel fills in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from runtime_py.kernels import (
    activations,
    circular_buffer,
    comparisons,
    control,
    conv,
    decode,
    detection,
    elementwise,
    fill,
    fully_connected,
    lookup,
    lstm,
    pooling,
    quantize,
    reductions,
    resize,
    scan,
    shape,
    signal,
    svdf,
    unary,
    variables,
)

Kernel = Callable[[Any, list[np.ndarray | None], list[np.ndarray]], None]

FAMILIES = (conv, fully_connected, pooling, elementwise, activations, quantize, shape, reductions,
            resize, svdf, lstm, variables, control, signal, comparisons, unary, fill, scan, lookup,
            detection, decode, circular_buffer)

KERNELS: dict[str, Kernel] = {name: k for family in FAMILIES for name, k in family.KERNELS.items()}
