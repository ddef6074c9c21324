"""TFLite_Detection_PostProcess, the custom op that ends TFLite's SSD detection models: boxes
decoded against their anchors, then non-maximum suppression, as LiteRT's kernel computes them.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops.detection.emit import emit_detection_postprocess
from toolchain.ops.detection.prepare import detection_scratch, prepare_detection_postprocess
from toolchain.ops.spec import OpSpec, kernels

SPECS: tuple[OpSpec, ...] = (
    # box encodings and anchors both float32 or both uint8; the scores either
    OpSpec("TFLite_Detection_PostProcess",
           kernels("B, S, B -> float32, float32, float32, float32", B=("float32", "uint8"),
                   S=("float32", "uint8")),
           prepare_detection_postprocess, emit_detection_postprocess,
           scratch=detection_scratch, partial_outputs=True),
)
