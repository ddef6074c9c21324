"""Shared test fixtures: the reference models beside the checkout, and built example models."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from toolchain.errors import RuntimeBackendError
from toolchain.lab.c_backend import compiler

SHARED_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"
# Recurrent models from TFLM's examples: their state persists across invokes.
RECURRENT_MODEL_FILES = sorted((SHARED_MODELS / "recurrent").glob("*.tflite"))
# Every shared model, the recurrent ones included.
SHARED_MODEL_FILES = sorted(SHARED_MODELS.glob("*.tflite")) + RECURRENT_MODEL_FILES

# MiniMalloc's published allocation problems, each known to fit its capacity (in the name).
SHARED_ALLOCATION = SHARED_MODELS.parent / "allocation" / "challenging"
ALLOCATION_PROBLEMS = sorted(SHARED_ALLOCATION.glob("*.csv"))
needs_allocation_problems = pytest.mark.skipif(
    not ALLOCATION_PROBLEMS, reason=f"allocation problems not found in {SHARED_ALLOCATION}"
)
needs_shared_models = pytest.mark.skipif(
    not SHARED_MODEL_FILES, reason=f"reference models not found in {SHARED_MODELS}"
)


def tflm_head_figures() -> dict[str, int]:
    """TFLM's head bytes per model, read from the table in ../shared/models/README.md."""
    figures = {}
    for line in (SHARED_MODELS / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].isdigit() and cells[2].isdigit():
            figures[cells[0]] = int(cells[1])
    return figures


@pytest.fixture
def example_path(tmp_path):
    """Write a built-in example model to a temporary file and return its path."""
    from toolchain.front.examples import EXAMPLES

    def write(name: str) -> Path:
        path = tmp_path / f"{name}.tflite"
        path.write_bytes(EXAMPLES[name]())
        return path

    return write


def native_vnni() -> bool:
    """Whether the host compiler's -march=native has a dot product of unsigned by signed bytes
    (the generated C's arenac_col8 is then uint8_t)."""
    try:
        macros = subprocess.run([*compiler(), "-march=native", "-dM", "-E", "-"], input="",
                                capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError, RuntimeBackendError):
        return False
    return "__AVXVNNI__" in macros or "__AVX512VNNI__" in macros
