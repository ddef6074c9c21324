"""Same model, same options, same bytes: plans and generated C do not depend on the machine's
speed or load, the folder they are made in or the hash seed, because every search is bounded by
work. test_behaviour shows it for every example and shared model against a record, C comments
aside; here it is shown to the byte of every file `gen` writes for a 224x224 MobileNetV2 (the
longest search), planned in this process and in one whose clock runs a thousand times fast (a
search bounded by the clock would stop early there, as it did under load), whose hash seed
differs and whose folders have other names. The shared models (vww_96_int8 among them) are
planned in such a process by test_behaviour, against its record."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.behaviour import gen_digests, run_in_child
from tests.mobilenet import mobilenet_v2

ROOT = Path(__file__).resolve().parents[1]


def test_plans_and_generated_c_are_the_same_bytes_at_any_speed_in_any_folder(tmp_path):
    path = tmp_path / "mobilenet_v2_224.tflite"
    path.write_bytes(mobilenet_v2(224))
    models = [str(path)]
    folder = tmp_path / "another checkout"
    folder.mkdir()
    with ThreadPoolExecutor(1) as child:  # the fast-clock process runs while this one plans
        fast = child.submit(run_in_child, "gen_digests(args, 'out')", models, folder)
        here = gen_digests(models, str(tmp_path / "out"))
        fast = fast.result()
    assert len(here) >= 7 * 2 * len(models)  # plan, arena and five generated files each
    differing = sorted(key for key in here if here[key] != fast.get(key))
    assert differing == [], f"{len(differing)} outputs differ, e.g. {differing[:5]}"


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
