"""The float32 math functions: ABS, NEG, SQUARE, SQRT, RSQRT, FLOOR, CEIL and ROUND; NEG also
on int32 and int64.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops import overlaps
from toolchain.ops.spec import OpSpec, kernels
from toolchain.ops.unary.emit import emit_unary_math
from toolchain.ops.unary.prepare import FUNCTIONS, prepare_unary_math

# the functions LiteRT's kernels also run on integers (NEG wraps: -INT32_MIN is INT32_MIN)
INTEGER_KERNELS = {"NEG": kernels("T -> T", T=("int32", "int64"))}

SPECS: tuple[OpSpec, ...] = tuple(
    OpSpec(opcode, (*kernels("float32 -> float32"), *INTEGER_KERNELS.get(opcode, ())),
           prepare_unary_math, emit_unary_math, overlaps=overlaps.elementwise(0))
    for opcode in FUNCTIONS
)
