"""Control flow: IF and WHILE, which run subgraphs of the model.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops.control.emit import emit_if, emit_while
from toolchain.ops.control.prepare import OPERAND, prepare_if, prepare_while
from toolchain.ops.spec import OpSpec, kernels

SPECS: tuple[OpSpec, ...] = (
    OpSpec("IF", kernels("bool, V?... ->", "bool, V?... -> V...", each={"V": OPERAND}),
           prepare_if, emit_if, effects=True),
    OpSpec("WHILE", kernels("V... -> V...", each={"V": OPERAND}), prepare_while, emit_while,
           effects=True),
)
