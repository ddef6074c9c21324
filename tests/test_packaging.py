"""Packaging: ranges in pyproject.toml, exact pins in constraints.txt (what make and CI install
from), both oracles in the `check` extra, the license, and what a user without an optional
tool sees: one short line naming what to install (a missing TFLite Micro), one line skipping
the Cortex-M part of `make bench` (no Arm toolchain)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import SHARED_MODELS
from tests.ops.test_svdf import svdf_model
from toolchain.front.builder import ModelBuilder

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

ROOT = Path(__file__).resolve().parents[1]


def project() -> dict:
    if tomllib is None:
        pytest.skip("reading pyproject.toml needs tomllib (Python 3.11)")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins() -> dict[str, Version]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            found[canonical(name)] = Version(version)
    return found


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements() -> list[Requirement]:
    p = project()
    listed = p["dependencies"] + [r for extra in p["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in listed if not r.startswith(p["name"] + "[")]


def test_pyproject_states_ranges_and_constraints_pin_each_within_them():
    pinned = pins()
    for r in requirements():
        assert all(s.operator == ">=" for s in r.specifier) and r.specifier, r
        version = pinned[canonical(r.name)]  # every dependency is pinned
        assert r.specifier.contains(version, prereleases=True), (r, version)


def test_the_environment_is_the_pinned_one():
    for name, version in pins().items():
        assert Version(metadata.version(name)) == version, name


def test_both_oracles_come_with_the_check_extra():
    p = project()
    base = {canonical(Requirement(r).name) for r in p["dependencies"]}
    check = {canonical(Requirement(r).name) for r in p["optional-dependencies"]["check"]}
    assert "ai-edge-litert" in base and "tflite-micro" in check
    assert f"{p['name']}[check]" in p["optional-dependencies"]["dev"]


def test_make_and_ci_install_from_the_constraints():
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet -c constraints.txt -e '.[dev]'" in makefile
    assert re.search(r"^\$\(STAMP\): .*constraints\.txt", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()  # CI goes through the Makefile


def test_license_is_apache_2_as_declared():
    text = (ROOT / "LICENSE").read_text()
    assert project()["license"] == {"text": "Apache-2.0"}
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply" in text
    assert len(text.splitlines()) == 202


@pytest.fixture
def without_tflm(tmp_path):
    """An environment in which `import tflite_micro` fails, as after a plain install."""
    blocker = tmp_path / "blocked" / "tflite_micro"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named tflite_micro')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(blocker.parent), str(ROOT)])
    return env


def check_without(env, model: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolchain.cli", "check", str(model),
                           "--inputs", "1"], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def assert_names_the_install(result: subprocess.CompletedProcess, model: Path) -> None:
    assert result.returncode == 2 and result.stdout == "", result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"arenac: {model}: ") and len(line) < 250, line
    assert line.endswith("TFLite Micro as its oracle, which is not installed: "
                         "pip install 'arenac[check]'"), line


def test_a_model_only_tflm_checks_says_what_to_install(tmp_path, without_tflm):
    model = tmp_path / "svdf.tflite"
    model.write_bytes(svdf_model("int8", state_zero_point=4))
    result = check_without(without_tflm, model)
    assert_names_the_install(result, model)
    assert "checking op 0 SVDF" in result.stderr


@pytest.mark.skipif(not (SHARED_MODELS / "person_detect.tflite").exists(),
                    reason="person_detect.tflite not in ../shared/models")
def test_a_model_litert_refuses_says_what_to_install(without_tflm):
    """Regression: person_detect after a plain install ended in a 1,500-character line."""
    model = SHARED_MODELS / "person_detect.tflite"
    result = check_without(without_tflm, model)
    assert_names_the_install(result, model)
    assert "LiteRT refuses the model (quantized_dimension" in result.stderr


def test_a_model_litert_runs_needs_no_tflm(tmp_path, without_tflm):
    b = ModelBuilder("int8", seed=3)
    x = b.input("x", (1, 4, 4, 2), "int8", scale=0.1, zero_point=0)
    b.output(b.max_pool_2d(x, 2, 2, "VALID"))
    model = tmp_path / "pool.tflite"
    model.write_bytes(b.build())
    result = check_without(without_tflm, model)
    assert result.returncode == 0 and "all backends agree" in result.stdout, result.stderr


def test_bench_skips_the_cortex_m_parts_without_the_arm_toolchain(tmp_path):
    """Regression: `make bench` ended in a traceback without arm-none-eabi-gcc."""
    b = ModelBuilder("int8", seed=4)
    x = b.input("x", (1, 6, 6, 2), "int8", scale=0.1, zero_point=0)
    b.output(b.average_pool_2d(x, 2, 2, "VALID"))
    model = tmp_path / "pool.tflite"
    model.write_bytes(b.build())
    empty = tmp_path / "bin"
    empty.mkdir()
    result = subprocess.run([sys.executable, "-m", "tests.bench", "mcu", "speed", str(model)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={**os.environ, "PATH": str(empty)})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    skipped = [line for line in result.stdout.splitlines() if "skipped" in line]
    assert skipped == [
        "Cortex-M4 footprint: skipped, the Arm toolchain is not on PATH (arm-none-eabi-gcc, "
        "arm-none-eabi-size, arm-none-eabi-nm, arm-none-eabi-objdump)",
        "speed: skipped, not on PATH: arm-none-eabi-gcc, arm-none-eabi-size, arm-none-eabi-nm, "
        "arm-none-eabi-objdump, qemu-system-arm",
    ]
