"""The support matrix (op x dtype), generated from the one list in toolchain.ops.

`python -m toolchain.support` prints it as Markdown for the README; a test keeps the README's
copy equal to it.
"""

from __future__ import annotations

from toolchain.codegen import EMITTERS
from toolchain.ops import SUPPORTED

DTYPE_COLUMNS = ("int8", "float32", "int32")
BEGIN = "<!-- support-matrix:begin -->"
END = "<!-- support-matrix:end -->"


def support_matrix_markdown() -> str:
    """One row per op: which first-input dtypes runtime_py runs and codegen emits."""
    ops = sorted({op for op, _ in SUPPORTED})
    others = sorted({d for _, d in SUPPORTED} - set(DTYPE_COLUMNS))
    columns = [*DTYPE_COLUMNS, *others]
    lines = [
        "| op | " + " | ".join(columns) + " | C |",
        "|---|" + "|".join(":-:" for _ in columns) + "|:-:|",
    ]
    for op in ops:
        cells = ["yes" if (op, d) in SUPPORTED else "" for d in columns]
        lines.append(f"| {op} | " + " | ".join(cells) + f" | {'yes' if op in EMITTERS else ''} |")
    return "\n".join([BEGIN, *lines, END])


if __name__ == "__main__":
    print(support_matrix_markdown())
