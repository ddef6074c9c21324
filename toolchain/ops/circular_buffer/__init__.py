"""CIRCULAR_BUFFER: TFLite Micro's streaming buffer, which shifts a frame into its output every
invoke and lets the model run past it once every few invokes.

prepare.py turns the operator into its params, emit.py writes its portable C. `SPECS` registers
the op (toolchain.ops.REGISTRY) under its custom code; TFLite Micro is its oracle, LiteRT has no
such op.
"""

from __future__ import annotations

from toolchain.ops.circular_buffer.emit import emit_circular_buffer
from toolchain.ops.circular_buffer.prepare import OP, prepare_circular_buffer, state_of
from toolchain.ops.spec import TFLM, OpSpec, kernels

SPECS: tuple[OpSpec, ...] = (
    OpSpec(OP, kernels("int8 -> int8", oracle=TFLM), prepare_circular_buffer,
           emit_circular_buffer, state=state_of, effects=True, stops=True),
)
