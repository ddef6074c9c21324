"""The compiled greedy loop (toolchain/planners/greedy.c) against the Python one it replaces
when there are no declared overlaps: the same offsets, byte for byte, for greedy's and TFLM's
orders, and the same deadline."""

from __future__ import annotations

import random
import shutil

import pytest

from tests.bench import random_buffers as bench_buffers
from tests.conftest import SHARED_MODEL_FILES, needs_shared_models
from tests.test_planners import random_buffers
from toolchain.front.reader import read_model
from toolchain.lower.plan import NO_TECHNIQUES, plan_model
from toolchain.planners import Buffer, Deadline, OutOfTime, make_plan
from toolchain.planners import greedy as greedy_module


@pytest.fixture
def both_loops(monkeypatch):
    """Runs a planning call on the compiled loop, then on the Python one."""

    def run(call):
        results = {}
        for loop in ("compiled", "python"):
            if loop == "python":
                monkeypatch.setenv("ARENAC_PURE_PYTHON", "1")
            greedy_module._core.cache_clear()
            assert (greedy_module._core() is not None) == (loop == "compiled")
            results[loop] = call()
        monkeypatch.delenv("ARENAC_PURE_PYTHON")
        greedy_module._core.cache_clear()
        return results

    assert shutil.which("cc"), "no C compiler: the compiled loop cannot be tested"
    return run


def odd_buffers(seed: int) -> list[Buffer]:
    """Small instances with the corners: empty buffers, one-op lives, lives of the whole
    graph, equal sizes and unaligned ones."""
    rng = random.Random(seed)
    steps = rng.randrange(1, 30)
    buffers = []
    for i in range(rng.randrange(1, 80)):
        first = rng.randrange(steps)
        last = rng.choice([first, steps - 1, min(first + rng.randrange(4), steps - 1)])
        size = rng.choice([0, 1, 16, 17, 48, 48, rng.randrange(1, 5000)])
        buffers.append(Buffer(i, size, first, last))
    return buffers


INSTANCES = {
    **{f"odd_{seed}": (odd_buffers, seed) for seed in range(40)},
    **{f"bench_{n}": (lambda n: bench_buffers(n, seed=n), n) for n in (100, 1_000, 5_000)},
    **{f"short_lives_{seed}": (lambda s: random_buffers(3_000, s), seed) for seed in range(3)},
}


@pytest.mark.parametrize("planner", ["greedy", "tflm"])
@pytest.mark.parametrize("alignment", [1, 16])
@pytest.mark.parametrize("name", INSTANCES)
def test_compiled_loop_places_every_buffer_where_the_python_loop_does(both_loops, name, planner,
                                                                      alignment):
    make, seed = INSTANCES[name]
    buffers = make(seed)
    plans = both_loops(lambda: make_plan(buffers, planner, alignment).offsets)  # verified
    assert plans["compiled"] == plans["python"]


@needs_shared_models
@pytest.mark.parametrize("path", SHARED_MODEL_FILES, ids=lambda p: p.stem)
def test_compiled_loop_plans_the_shared_models_as_the_python_loop(both_loops, path):
    model = read_model(path)
    plans = both_loops(lambda: [plan_model(model, p, techniques=NO_TECHNIQUES).plan.offsets
                                for p in ("greedy", "tflm")])
    assert plans["compiled"] == plans["python"]


def test_compiled_loop_gives_way_at_its_deadline(both_loops):
    buffers = bench_buffers(100_000, seed=1)

    def short():
        with pytest.raises(OutOfTime, match="the greedy planner placed .* of 100000 buffers"):
            make_plan(buffers, "greedy", deadline=Deadline.after(0.05))

    both_loops(short)


def test_far_apart_lives_are_placed_as_their_ranks_are(both_loops):
    """The compiled loop works on lives ranked among their ends: lives stretched over two
    billion steps take the offsets they take squeezed into a few."""
    squeezed = odd_buffers(7)
    stretched = [Buffer(b.id, b.size, b.first * 10**8, b.last * 10**8 + 1000) for b in squeezed]
    plans = both_loops(lambda: [make_plan(buffers, "greedy", 1).offsets
                                for buffers in (squeezed, stretched)])
    assert plans["compiled"] == plans["python"]
    assert plans["compiled"][0] == plans["compiled"][1]
