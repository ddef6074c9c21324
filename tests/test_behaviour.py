"""A move of code changes no behaviour, and neither do the hash seed, the folder or the
machine's speed: every example and shared model plans to the same arena table and generates
the same C, comments and layout aside, as tests/behaviour.json records, in a process whose
hash seed and folders are not the recording's and whose clock runs a thousand times fast."""

from __future__ import annotations

import json

import pytest

from tests.behaviour import RECORD, run_in_child
from toolchain.front.examples import EXAMPLES

# The models are checked in this many shards, each in a process of its own, so that the test
# runners share them out.
SHARDS = 6


@pytest.mark.parametrize("shard", range(SHARDS))
def test_every_model_plans_and_generates_as_recorded(tmp_path, shard):
    recorded = json.loads(RECORD.read_text())
    names = sorted({key.split()[0] for key in recorded})[shard::SHARDS]
    folder = tmp_path / "another checkout"
    folder.mkdir()
    found = run_in_child("behaviour(args)", names, folder)
    wanted = {key for key in recorded if key.split()[0] in names}
    # the shared models are absent on a machine without ../shared: the examples always run
    assert set(found) <= wanted, sorted(set(found) - wanted)
    examples = {key for key in wanted if key.split()[0] in EXAMPLES}
    assert examples <= set(found), sorted(examples - set(found))
    differing = sorted(f"{key} {file}" for key in found for file in recorded[key] | found[key]
                       if recorded[key].get(file) != found[key].get(file))
    assert differing == [], f"{len(differing)} outputs differ from the record: {differing[:8]}"
