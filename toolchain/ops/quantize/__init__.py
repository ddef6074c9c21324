"""The conversions: QUANTIZE, DEQUANTIZE and CAST.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops import overlaps
from toolchain.ops.quantize.emit import emit_cast, emit_dequantize, emit_quantize
from toolchain.ops.quantize.prepare import (
    CAST_DTYPES,
    CAST_UINT32,
    DEQUANTIZE_INPUTS,
    QUANTIZE_OUTPUTS,
    prepare_cast,
    prepare_dequantize,
    prepare_quantize,
)
from toolchain.ops.spec import OpSpec, kernels

SPECS: tuple[OpSpec, ...] = (
    OpSpec("QUANTIZE",
           tuple(s for source, targets in QUANTIZE_OUTPUTS.items()
                 for s in kernels(f"{source} -> T", T=targets)),
           prepare_quantize, emit_quantize, overlaps=overlaps.elementwise(0)),
    OpSpec("DEQUANTIZE", kernels("T -> float32", T=DEQUANTIZE_INPUTS),
           prepare_dequantize, emit_dequantize, overlaps=overlaps.elementwise(0)),
    OpSpec("CAST", (*kernels("S -> T", S=CAST_DTYPES, T=CAST_DTYPES),
                    *kernels(*(f"{s} -> {t}" for s, t in sorted(CAST_UINT32)))),
           prepare_cast, emit_cast, overlaps=overlaps.elementwise(0)),
)
