"""What a C kernel emitter receives: the op's params and C expressions for its tensors.

Emitters (one module per op family under toolchain/codegen/) turn these into the text of one
specialized C function per op by rendering a macro of the family's template; every value they
hand the template is computed here in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from toolchain.ir import Operator
from toolchain.render import environment

C_TYPES: dict[str, str] = {
    "float32": "float",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "int16": "int16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "bool": "uint8_t",
}


@dataclass(frozen=True)
class CTensor:
    """A tensor as C sees it: `ptr` is an expression pointing at its first element. `name` is
    already spelled for a comment (toolchain.text.c_text): emitters paste it as it is."""

    index: int
    name: str
    dtype: str
    shape: tuple[int, ...]
    ptr: str
    data: np.ndarray | None = None  # a constant's values, for emitters that fold them

    @property
    def ctype(self) -> str:
        return C_TYPES[self.dtype]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


@dataclass(frozen=True)
class OpContext:
    """One operator to emit: `fn` is the name of the `static void fn(void)` to define and
    `prefix` a unique prefix for any file-scope constants the emitter adds."""

    fn: str
    prefix: str
    op: Operator
    params: Any
    inputs: tuple[CTensor | None, ...]
    outputs: tuple[CTensor, ...]


Emitter = Callable[[OpContext], str]


def family_macro(template: str, macro: str) -> Callable[..., str]:
    """A macro of a family template (templates/c/<family>.c.j2), callable from Python."""
    return getattr(environment().get_template(template).module, macro)


def c_array(values: Sequence | np.ndarray, per_line: int = 16) -> str:
    """Comma-separated C initializer text, `per_line` values a line (floats round-trip)."""
    array = np.asarray(values)
    if array.dtype.kind == "f":
        items = [c_float(v) for v in array.ravel().tolist()]
    else:
        items = [str(int(v)) for v in array.ravel().tolist()]
    lines = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
    return ",\n  ".join(lines) if lines else "0"


def c_float(value: float) -> str:
    """A float32 literal that parses back to the same float32. NaN and infinity have no
    literal: they are <math.h>'s NAN and INFINITY, constant expressions C99 allows in static
    initializers (a file using them includes <math.h>; see `needs_math_h`). A NaN keeps its
    sign but not its payload bits, which no kernel's result depends on."""
    value = np.float32(value)
    sign = "-" if np.signbit(value) else ""
    if np.isnan(value):
        return f"{sign}NAN"
    if np.isinf(value):
        return f"{sign}INFINITY"
    return np.format_float_scientific(value, unique=True) + "f"


MATH_H_CONSTANTS = frozenset({"NAN", "INFINITY"})


def needs_math_h(words: set[str]) -> bool:
    """Whether C text made of `words` names a constant of <math.h>."""
    return not MATH_H_CONSTANTS.isdisjoint(words)


def c_int32(value: int) -> str:
    """INT32_MIN cannot be written as a plain literal in C."""
    return "INT32_MIN" if value == -(2**31) else str(int(value))


def c_int64(value: int) -> str:
    """An integer literal of any int64 value: plain within int32, else INT64_C (a bare
    9223372036854775808 has no signed type) and INT64_MIN for the one value no literal spells."""
    value = int(value)
    if -(2**31) <= value < 2**31:
        return c_int32(value)
    return "INT64_MIN" if value == -(2**63) else f"INT64_C({value})"


def c_length(count: int) -> int:
    """The length to declare an array of `count` elements with: C99 has no zero-length arrays,
    so an empty one gets a single element nothing reads."""
    return max(int(count), 1)
