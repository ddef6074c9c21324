"""The activation ops: RELU, RELU6, RELU_N1_TO_1, LOGISTIC, TANH, HARD_SWISH, ELU, LEAKY_RELU,
PRELU, SOFTMAX, LOG_SOFTMAX and L2_NORMALIZATION.

prepare.py turns an operator into its params, what runtime_py and every backend run from;
emit.py writes their portable C. `SPECS` registers the ops (toolchain.ops.REGISTRY).
"""

from __future__ import annotations

from collections.abc import Callable

from toolchain.ir import Graph, Operator
from toolchain.ops import overlaps
from toolchain.ops.activations.emit import activation_kernels, emit_activation
from toolchain.ops.activations.prepare import (
    prepare_elu,
    prepare_hard_swish,
    prepare_l2_normalization,
    prepare_leaky_relu,
    prepare_log_softmax,
    prepare_logistic,
    prepare_prelu,
    prepare_relu,
    prepare_softmax,
    prepare_tanh,
)
from toolchain.ops.spec import OpSpec, kernels

_PREPARE: dict[str, Callable[[Graph, Operator], object]] = {
    "RELU": prepare_relu,
    "RELU6": prepare_relu,
    "RELU_N1_TO_1": prepare_relu,
    "LOGISTIC": prepare_logistic,
    "TANH": prepare_tanh,
    "HARD_SWISH": prepare_hard_swish,
    "ELU": prepare_elu,
    "LEAKY_RELU": prepare_leaky_relu,
    "PRELU": prepare_prelu,
    "SOFTMAX": prepare_softmax,
    "L2_NORMALIZATION": prepare_l2_normalization,
}


SPECS: tuple[OpSpec, ...] = (
    *(OpSpec(opcode, activation_kernels(opcode), prepare, emit_activation,
             overlaps=overlaps.elementwise(0))
      for opcode, prepare in _PREPARE.items()),
    OpSpec("LOG_SOFTMAX", kernels("T -> T", T=("float32", "int8")), prepare_log_softmax,
           emit_activation, overlaps=overlaps.elementwise(0)),
)
