"""The support matrix, generated from the registry in toolchain.ops.

`python -m toolchain.views.support` prints it as Markdown for docs/runtime_py.md; a test keeps that
copy equal to it.
"""

from __future__ import annotations

from toolchain.ops import REGISTRY, VARIANTS
from toolchain.ops.spec import TFLM, Signature

BEGIN = "<!-- support-matrix:begin -->"
END = "<!-- support-matrix:end -->"


def kernel_lines(kernels: tuple[Signature, ...]) -> list[str]:
    """Each written signature once, with the dtypes its names stand for, and the oracle where
    it is TFLite Micro's interpreter rather than LiteRT's reference kernels."""
    lines = []
    for form in dict.fromkeys(k.form for k in kernels):
        values: dict[str, list[str]] = {}
        for k in kernels:
            if k.form == form:
                for name, dtype in k.bound:
                    values.setdefault(name, []).append(dtype)
        notes = [f"{n}: {', '.join(dict.fromkeys(v))}" for n, v in values.items()]
        each = next(k.each for k in kernels if k.form == form)
        notes += [f"each {n} any of {', '.join(v)}" for n, v in each]
        if any(k.form == form and k.oracle == TFLM for k in kernels):
            notes.append("as TFLite Micro")
        lines.append(f"`{form}`".replace("|", "\\|") + (f" ({'; '.join(notes)})" if notes else ""))
    return lines


def support_matrix_markdown() -> str:
    """One row per op: the operand dtypes its kernels run (inputs -> outputs; `?` an input
    that may be absent, `...` a position that repeats) and the targets they are emitted for;
    then one row per target kernel (toolchain.ops.VARIANTS), which some of those ops bind on
    the targets it names."""
    lines = ["| op | kernels: inputs -> outputs | targets |", "|---|---|---|"]
    for opcode in sorted(REGISTRY):
        kernels = REGISTRY[opcode].kernels
        targets = sorted({t for k in kernels for t in k.targets})
        lines.append(f"| {opcode} | {'<br>'.join(kernel_lines(kernels))} | "
                     f"{', '.join(targets)} |")
    for opcode in sorted(VARIANTS):
        for variant in VARIANTS[opcode]:
            targets = sorted({t for k in variant.kernels for t in k.targets})
            lines.append(f"| {opcode} ({variant.name}) | "
                         f"{'<br>'.join(kernel_lines(variant.kernels))} | {', '.join(targets)} |")
    return "\n".join([BEGIN, *lines, END])


if __name__ == "__main__":
    print(support_matrix_markdown())
