"""Same model, same options, same bytes: plans and generated C do not depend on the machine's
load, the folder they are made in or the hash seed, because every search is bounded by work.

Two processes plan and generate every shared model (and a 224x224 MobileNetV2) side by side,
each in a folder of its own and with its own hash seed, while a third spins at the lowest
priority, so no processor is idle even when the test runs alone but the spinner takes no time
the rest of the suite wants: under a clock budget the loaded runs would stop their searches at
different points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import SHARED_MODEL_FILES
from tests.mobilenet import mobilenet_v2

ROOT = Path(__file__).resolve().parents[1]

# One side: for each model and target, the model planned once as `gen` plans it, then a digest
# of its `plan --json` data and of each file `gen` writes, as one JSON line.
SIDE = """
import hashlib, json, sys
from pathlib import Path
from toolchain.c.generate import generate
from toolchain.cli import build_parser, finite, planned
from toolchain.views.report import plan_data

def digest(text):
    return hashlib.sha256(text.encode()).hexdigest()

digests = {}
for model in sys.argv[2:]:
    for target in ("generic", "cortex-m4"):
        args = build_parser().parse_args(["gen", model, "-o", sys.argv[1], "--target", target])
        plan = planned(args)
        digests[f"{model} {target} plan"] = digest(json.dumps(finite(plan_data(plan))))
        digests[f"{model} {target} arena"] = plan.arena_bytes
        files = generate(plan, Path(model).stem, external_io=args.external_io, arena=args.arena,
                         fragments=True)
        for name, text in sorted(files.items()):
            digests[f"{model} {target} {name}"] = digest(text)
print(json.dumps(digests))
"""

HOG = "import os\nos.nice(19)\nwhile True: pass"


def test_plans_and_generated_c_are_the_same_bytes_under_load_in_any_folder(tmp_path):
    models = [str(p) for p in SHARED_MODEL_FILES]
    mobilenet = tmp_path / "mobilenet_v2_224.tflite"
    mobilenet.write_bytes(mobilenet_v2(224))
    models.append(str(mobilenet))
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(1)]
    try:
        sides = []
        for k, seed in enumerate(("1", "4242")):
            folder = tmp_path / f"checkout {k}" / "out"
            folder.mkdir(parents=True)
            env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
            sides.append(subprocess.Popen([sys.executable, "-c", SIDE, str(folder), *models],
                                          cwd=folder.parent, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        results = [side.communicate(timeout=900) for side in sides]
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    for side, (_, err) in zip(sides, results, strict=True):
        assert side.returncode == 0, err[-2000:]
    first, second = (json.loads(out) for out, _ in results)
    assert len(first) >= 7 * 2 * len(models)  # plan, arena and five generated files each
    differing = sorted(key for key in first if first[key] != second.get(key))
    assert differing == [], f"{len(differing)} outputs differ, e.g. {differing[:5]}"
    # a third run, in this process and unloaded, plans the MobileNet to the same arena
    from toolchain.front.reader import read_model
    from toolchain.lower.plan import plan_model

    assert first[f"{mobilenet} generic arena"] == plan_model(read_model(str(mobilenet))).arena_bytes


def test_a_node_budget_is_a_whole_number_an_int64_holds(tmp_path):
    """--nodes reaches the compiled searches as an int64: anything else is one usage line."""
    from toolchain.front.examples import EXAMPLES

    path = tmp_path / "m.tflite"
    path.write_bytes(EXAMPLES["tiny_cnn_int8"]())
    problem = tmp_path / "p.csv"
    problem.write_text("id,lower,upper,size\n0,0,2,10\n1,1,3,20\n")
    for command in (["plan", str(path)], ["solve", str(problem), "--capacity", "30"]):
        for bad in ("-1", "1e6", str(2**63)):
            done = subprocess.run([sys.executable, "-m", "toolchain.cli", *command, "--nodes",
                                   bad], capture_output=True, text=True, cwd=ROOT)
            assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
            assert "--nodes: expected a whole number below 2^63" in done.stderr
        done = subprocess.run([sys.executable, "-m", "toolchain.cli", *command, "--nodes",
                               str(2**63 - 1)], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr
