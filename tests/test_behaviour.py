"""A move of code changes no behaviour: every example and shared model plans to the same arena
table and generates the same C, comments and layout aside, as tests/behaviour.json records."""

from __future__ import annotations

import json

from tests.behaviour import RECORD, behaviour


def test_every_model_plans_and_generates_as_recorded():
    recorded = json.loads(RECORD.read_text())
    found = behaviour(sorted({key.split()[0] for key in recorded}))
    # the shared models are absent on a machine without ../shared: the examples always run
    assert set(found) <= set(recorded), sorted(set(found) - set(recorded))
    differing = sorted(f"{key} {file}" for key in found for file in recorded[key] | found[key]
                       if recorded[key].get(file) != found[key].get(file))
    assert differing == [], f"{len(differing)} outputs differ from the record: {differing[:8]}"
    assert len(found) >= 11 * 3
