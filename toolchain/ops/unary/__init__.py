"""The float32 math functions: ABS, NEG, SQUARE, SQRT, RSQRT, FLOOR, CEIL, ROUND, EXP, LOG, SIN
and COS; NEG also on int32 and int64.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops import overlaps
from toolchain.ops.spec import LITERT_REF, TFLM, OpSpec, kernels
from toolchain.ops.unary.emit import emit_unary_math
from toolchain.ops.unary.prepare import FUNCTIONS, prepare_unary_math

# the functions LiteRT's kernels also run on integers (NEG wraps: -INT32_MIN is INT32_MIN)
INTEGER_KERNELS = {"NEG": kernels("T -> T", T=("int32", "int64"))}

# what LiteRT's reference resolver has no kernel for: `check` compares them with TFLite Micro
TFLM_ONLY = frozenset({"CEIL", "ROUND"})

SPECS: tuple[OpSpec, ...] = tuple(
    OpSpec(opcode, (*kernels("float32 -> float32",
                             oracle=TFLM if opcode in TFLM_ONLY else LITERT_REF),
                    *INTEGER_KERNELS.get(opcode, ())),
           prepare_unary_math, emit_unary_math, overlaps=overlaps.elementwise(0))
    for opcode in FUNCTIONS
)
