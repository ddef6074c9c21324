"""CUMSUM, the running sum along an axis.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes its portable C. `SPECS` registers the op (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from toolchain.ops.scan.emit import emit_cumsum
from toolchain.ops.scan.prepare import prepare_cumsum
from toolchain.ops.spec import OpSpec, kernels

# No overlap rule: along an axis the sums walk the tensor out of address order.
SPECS: tuple[OpSpec, ...] = (
    OpSpec("CUMSUM", kernels("T, int32 -> T", T=("float32", "int32", "int64")), prepare_cumsum,
           emit_cumsum),
)
