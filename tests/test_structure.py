"""The house keeps its shape: small functions, and packages that say what they hold. (The
layers and the import cycles are checked by `make lint`, with the contracts in pyproject.)"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "toolchain", ROOT / "runtime_py")
LONGEST_FUNCTION = 100  # lines


def long_functions(folder: Path) -> list[str]:
    """Every function of the .py files under `folder` longer than LONGEST_FUNCTION lines."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    found.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_over_a_hundred_lines():
    assert [f for folder in PACKAGES for f in long_functions(folder)] == []


def test_the_length_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x = {k}" for k in range(LONGEST_FUNCTION))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n")
    assert long_functions(tmp_path) == [f"long.py:1 long ({LONGEST_FUNCTION + 1} lines)"]


def test_every_package_says_what_it_holds():
    """`ls toolchain` reads as the pipeline: each package's docstring says its part."""
    quiet = [str(init.relative_to(ROOT)) for folder in PACKAGES for init in folder.rglob(
        "__init__.py") if not ast.get_docstring(ast.parse(init.read_text()))]
    assert quiet == []
    stages = {p.name for p in (ROOT / "toolchain").iterdir() if (p / "__init__.py").exists()}
    assert {"front", "lower", "planners", "ops", "numerics", "c", "tflm", "lab",
            "views"} <= stages
