"""TFLM_DECODE: TFLite Micro's compressed tensors (lookup table, pruning, Huffman), decoded once
at generation (toolchain.lower.folding); the kernel copies decoded values into a graph output.

prepare.py decodes and holds the params; emit.py writes their portable C. `SPECS` registers
the op (toolchain.ops.REGISTRY) under its custom code; TFLite Micro is its oracle, LiteRT has
no such op.
"""

from __future__ import annotations

from toolchain.ops.decode.emit import emit_decode
from toolchain.ops.decode.prepare import prepare_decode
from toolchain.ops.spec import TFLM, OpSpec, kernels

DECODED = ("bool", "float32", "int8", "int16", "int32", "int64")

SPECS: tuple[OpSpec, ...] = (
    OpSpec("TFLM_DECODE", kernels("uint8|int8... -> T...", oracle=TFLM, each={"T": DECODED}),
           prepare_decode, emit_decode),
)
