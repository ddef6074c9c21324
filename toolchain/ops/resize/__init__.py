"""The resizes: RESIZE_NEAREST_NEIGHBOR and RESIZE_BILINEAR.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops.resize.emit import emit_bilinear, emit_nearest
from toolchain.ops.resize.prepare import BILINEAR_METHODS, prepare_bilinear, prepare_nearest
from toolchain.ops.spec import OpSpec, kernels

# The output size is a constant int32 second input.
SPECS: tuple[OpSpec, ...] = (
    OpSpec("RESIZE_NEAREST_NEIGHBOR",
           kernels("T, int32 -> T", T=("float32", "int8", "uint8", "int16")),
           prepare_nearest, emit_nearest),
    OpSpec("RESIZE_BILINEAR", kernels("T, int32 -> T", T=BILINEAR_METHODS),
           prepare_bilinear, emit_bilinear),
)
