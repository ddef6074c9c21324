"""The support matrix, generated from the registry in toolchain.ops, beside the operators
TensorFlow Lite Micro's resolver registers (toolchain.tflm.resolver).

`python -m toolchain.views.support` prints it as Markdown for docs/runtime_py.md (a test keeps
that copy equal to it); `arenac inspect --ops` prints it too, or its rows as JSON.
"""

from __future__ import annotations

from toolchain.ops import OUT_OF_SCOPE, REGISTRY, VARIANTS
from toolchain.ops.spec import TFLM, Signature
from toolchain.tflm.resolver import tflm_operators

BEGIN = "<!-- support-matrix:begin -->"
END = "<!-- support-matrix:end -->"


def kernel_lines(kernels: tuple[Signature, ...]) -> list[str]:
    """Each written signature once, with the dtypes its names stand for in parentheses, and the
    oracle where it is TFLite Micro's interpreter rather than LiteRT's reference kernels."""
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
        lines.append(form + (f" ({'; '.join(notes)})" if notes else ""))
    return lines


def support_rows() -> list[dict]:
    """One row per op: the operand dtypes its kernels run (inputs -> outputs; `?` an input
    that may be absent, `...` a position that repeats), the targets they are emitted for and
    the TFLite Micro resolver method that registers it ("" if TFLite Micro has none); then the
    operators TFLite Micro registers that are refused here by name, with the reason; then one
    row per target kernel (toolchain.ops.VARIANTS), which some of those ops bind on the targets
    it names."""
    methods = {entry.operator: entry.method for entry in tflm_operators()}
    rows = []
    for opcode in sorted(REGISTRY):
        kernels = REGISTRY[opcode].kernels
        rows.append({"op": opcode, "tflm": methods.get(opcode, ""),
                     "kernels": kernel_lines(kernels),
                     "targets": sorted({t for k in kernels for t in k.targets})})
    for opcode in sorted(set(methods) - set(REGISTRY)):
        rows.append({"op": opcode, "tflm": methods[opcode],
                     "kernels": [f"refused: {OUT_OF_SCOPE.get(opcode, 'no kernel')}"],
                     "targets": []})
    for opcode in sorted(VARIANTS):
        for variant in VARIANTS[opcode]:
            rows.append({"op": f"{opcode} ({variant.name})", "tflm": "",
                         "kernels": kernel_lines(variant.kernels),
                         "targets": sorted({t for k in variant.kernels for t in k.targets})})
    return rows


def support_table() -> str:
    """support_rows as a Markdown table (signatures as code, their notes after them)."""
    lines = ["| op | TFLite Micro | kernels: inputs -> outputs | targets |", "|---|---|---|---|"]
    for row in support_rows():
        method = f"`{row['tflm']}`" if row["tflm"] else "-"
        kernels = [_code(line) for line in row["kernels"]]
        lines.append(f"| {row['op']} | {method} | {'<br>'.join(kernels)} | "
                     f"{', '.join(row['targets']) or '-'} |")
    return "\n".join(lines)


def _code(line: str) -> str:
    """A signature line as Markdown: the signature as code, a refusal as it reads."""
    if line.startswith("refused:"):
        return line
    form, _, notes = line.partition(" (")
    return f"`{form}`".replace("|", "\\|") + (f" ({notes}" if notes else "")


def support_matrix_markdown() -> str:
    """The support table between the markers docs/runtime_py.md keeps it in."""
    return "\n".join([BEGIN, support_table(), END])


if __name__ == "__main__":
    print(support_matrix_markdown())
