"""What arenac does to every example and shared model, as digests that survive a move of code:
the arena table of `plan` exactly, and the generated C with its comments and layout normalized
away, on the generic, Cortex-M4 and Cortex-M55 targets.

`python -m tests.behaviour record` writes tests/behaviour.json from the code as it is;
tests/test_behaviour.py checks the code against that record. Record again only when a change
of behaviour is meant, and say which in the commit."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

RECORD = Path(__file__).with_name("behaviour.json")
TARGETS = ("generic", "cortex-m4", "cortex-m55")
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_SPACE = re.compile(r"\s+")
_OFFSET_TABLE = re.compile(r"static const uint32_t (\w+)_offsets\[\d+\] = \{(.*?)\};\n", re.S)
# The offset macros of NAME.c: `#define NAME_T22 512u`, each after a comment line
_OFFSET_MACRO = re.compile(r"^#define ([A-Z][A-Z0-9_]*) (\d+u)$", re.M)
_OFFSET_MACRO_LINE = re.compile(r"^#define [A-Z][A-Z0-9_]* \d+u\n", re.M)


def normalized_c(text: str) -> str:
    """C text with comments gone and every run of white space one blank: what a compiler sees,
    give or take the preprocessor. A buffer's offset is written as its value, whether the C
    names it by a slot of an offset table (NAME_offsets[k], as before the buffers had keys) or
    by a macro of what it holds (#define NAME_T22 512u)."""
    table = _OFFSET_TABLE.search(text)
    if table:
        values = re.findall(r"(\d+u),", table.group(2))
        text = text[:table.start()] + text[table.end():]
        text = re.sub(re.escape(table.group(1)) + r"_offsets\[(\d+)\]",
                      lambda m: values[int(m.group(1))], text)
    macros = dict(_OFFSET_MACRO.findall(text))
    if macros:
        text = _OFFSET_MACRO_LINE.sub("", text)
        text = re.sub(r"\b[A-Z][A-Z0-9_]*\b", lambda m: macros.get(m.group(0), m.group(0)), text)
    return _SPACE.sub(" ", _COMMENT.sub(" ", text)).strip()


def model_paths(folder: Path) -> dict[str, Path]:
    """Every example (written into folder) and every shared model, by a name free of folders."""
    from tests.conftest import SHARED_MODEL_FILES
    from toolchain.front.examples import EXAMPLES

    paths = {}
    for name, build in sorted(EXAMPLES.items()):
        paths[name] = folder / f"{name}.tflite"
        paths[name].write_bytes(build())
    paths.update((p.stem, p) for p in SHARED_MODEL_FILES)
    return paths


def digests(name: str, path: Path, target: str) -> dict[str, str]:
    """The arena table of one model on one target, and a digest per generated C file, from one
    plan made as `gen` makes it (`plan` prints the table of the same plan)."""
    from toolchain.c.generate import generate
    from toolchain.cli import build_parser, planned
    from toolchain.views.report import plan_text

    args = build_parser().parse_args(["gen", str(path), "-o", "unused", "--target", target,
                                      "--name", "m"])
    mp = planned(args)
    table = plan_text(mp).replace(str(path), name) + "\n"
    found = {"plan": hashlib.sha256(table.encode()).hexdigest()}
    files = generate(mp, "m", external_io=args.external_io, arena=args.arena, fragments=True)
    for file_name, text in sorted(files.items()):
        if file_name.endswith(".c"):
            text = normalized_c(text)
        elif file_name.endswith(".h"):
            text = _SPACE.sub(" ", _COMMENT.sub(" ", text)).strip()
        else:
            continue
        found[file_name] = hashlib.sha256(text.encode()).hexdigest()
    return found


def gen_digests(models: list[str], out: str) -> dict[str, str | int]:
    """For each model file and target, the model planned once as `gen` plans it: a digest of
    its `plan --json` data, its arena, and a digest of each file `gen` writes, exactly."""
    from toolchain.c.generate import generate
    from toolchain.cli import build_parser, finite, planned
    from toolchain.views.report import plan_data

    found: dict[str, str | int] = {}
    for model in models:
        for target in ("generic", "cortex-m4"):
            args = build_parser().parse_args(["gen", model, "-o", out, "--target", target])
            plan = planned(args)
            found[f"{model} {target} plan"] = _sha256(json.dumps(finite(plan_data(plan))))
            found[f"{model} {target} arena"] = plan.arena_bytes
            files = generate(plan, Path(model).stem, external_io=args.external_io,
                             arena=args.arena, fragments=True)
            for name, text in sorted(files.items()):
                found[f"{model} {target} {name}"] = _sha256(text)
    return found


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# How much faster than real time the clock of `run_in_child` runs.
CLOCK_SPEED = 1000


def run_in_child(call: str, args: list[str], folder: Path) -> object:
    """`call` (an expression of this module's names and `args`) in a fresh Python whose hash
    seed is not this one's, whose working and temporary folders are `folder` (name it with a
    space), and whose clocks run CLOCK_SPEED times fast, as on a machine that much slower or
    that loaded: a search bounded by the clock would stop early there. Returns its value,
    which must be JSON."""
    code = (f"import json, sys, time\n"
            f"for name in ('monotonic', 'perf_counter', 'time', 'process_time'):\n"
            f"    setattr(time, name, lambda real=getattr(time, name): real() * {CLOCK_SPEED})\n"
            f"for name in ('monotonic_ns', 'perf_counter_ns', 'time_ns', 'process_time_ns'):\n"
            f"    setattr(time, name, lambda real=getattr(time, name): real() * {CLOCK_SPEED})\n"
            f"from tests.behaviour import *\n"
            f"args = sys.argv[1:]\n"
            f"print(json.dumps({call}))\n")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONHASHSEED": "4242", "PYTHONPATH": str(root),
           "TMPDIR": str(folder)}
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def behaviour(names: list[str] | None = None) -> dict[str, dict[str, str]]:
    """`digests` for every model (or those named) on every target, keyed "model target"."""
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        paths = model_paths(folder)
        return {f"{name} {target}": digests(name, path, target)
                for name, path in paths.items() if names is None or name in names
                for target in TARGETS}


if __name__ == "__main__":
    if sys.argv[1:] != ["record"]:
        sys.exit("usage: python -m tests.behaviour record")
    RECORD.write_text(json.dumps(behaviour(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORD}")
