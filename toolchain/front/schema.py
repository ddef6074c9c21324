"""The generated TFLite schema bindings and the name tables derived from them.

The only module that imports the bindings; the reader and the model builder go through it so
that both speak the same enum names.
"""

from __future__ import annotations

import re

from ai_edge_litert import schema_py_generated as fb

__all__ = [
    "fb",
    "enum_names",
    "OPCODE_NAMES",
    "OPCODE_CODES",
    "DTYPE_NAMES",
    "TENSOR_TYPES",
    "OPTION_ENUMS",
    "snake_case",
]


def enum_names(enum_class: type) -> dict[int, str]:
    """Value -> name of a generated enum class (its upper-case class attributes)."""
    return {
        v: k for k, v in vars(enum_class).items() if not k.startswith("_") and isinstance(v, int)
    }


OPCODE_NAMES: dict[int, str] = enum_names(fb.BuiltinOperator)
OPCODE_CODES: dict[str, int] = {name: code for code, name in OPCODE_NAMES.items()}

# TensorType code <-> the IR's dtype name ("int8", "float32": numpy's where numpy has the type).
DTYPE_NAMES: dict[int, str] = {
    code: name.lower() for code, name in enum_names(fb.TensorType).items()
}
TENSOR_TYPES: dict[str, int] = {name: code for code, name in DTYPE_NAMES.items()}

# Option fields whose integer values are enums worth showing by name.
OPTION_ENUMS: dict[str, dict[int, str]] = {
    "padding": enum_names(fb.Padding),
    "fusedActivationFunction": enum_names(fb.ActivationFunctionType),
    "weightsFormat": enum_names(fb.FullyConnectedOptionsWeightsFormat),
    "mode": enum_names(fb.MirrorPadMode),
    "kernelType": enum_names(fb.LSTMKernelType),
}


def snake_case(camel: str) -> str:
    """`dilationWFactor` -> `dilation_w_factor`: the option keys the rest of the toolchain uses."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()
