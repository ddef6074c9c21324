"""SVDF: a fully connected layer factored into a feature and a time filter.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops.spec import TFLM, OpSpec, kernels
from toolchain.ops.svdf.emit import emit_svdf
from toolchain.ops.svdf.prepare import prepare_svdf, svdf_scratch, svdf_tflm_scratch

SPECS: tuple[OpSpec, ...] = (
    OpSpec("SVDF",
           (*kernels("float32, float32, float32, float32?, float32 -> float32",
                     "float32, int8, int8, float32?, float32 -> float32",
                     "int8, int8, int16, int32?, int16 -> int8"),
            *kernels("int8, int8, int8, int32, int8 -> int8", oracle=TFLM)),
           prepare_svdf, emit_svdf, scratch=svdf_scratch, tflm_scratch=svdf_tflm_scratch),
)
