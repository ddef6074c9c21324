"""A deep chain of alike layers, to bound the hold's replans: its striped segments are alike,
so the cortex-m4 arena peaks in many of them at once, and each must narrow its DSP kernels'
scratch before the arena drops (toolchain.lower.plan.narrowed)."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from contextlib import contextmanager

import toolchain.lower.plan as plan_module
from toolchain.front.builder import ModelBuilder
from toolchain.front.reader import parse_model


def alike_layers(count: int) -> bytes:
    """`count` layers on a 32x32 int8 image: 1x1 convolutions (8 filters, 16 every third)
    between 3x3 depthwise ones, each with RELU6."""
    b = ModelBuilder("int8", seed=1)
    y = b.input("x", (1, 32, 32, 8), "int8", scale=0.05, zero_point=3)
    for i in range(count):
        y = (b.conv_2d(y, 8 + 8 * (i % 3 == 0), 1, activation="RELU6") if i % 2 == 0
             else b.depthwise_conv_2d(y, 3, activation="RELU6"))
    b.output(y)
    return b.build()


@contextmanager
def counted_plans() -> Iterator[list[dict]]:
    """The plans `plan_model` makes meanwhile (the first, the portable one and each replan of
    the hold), each as the options it was made with."""
    made: list[dict] = []
    real = plan_module.planned_model

    @functools.wraps(real)
    def counting(*args, **kwargs):
        made.append(kwargs)
        return real(*args, **kwargs)

    plan_module.planned_model = counting
    try:
        yield made
    finally:
        plan_module.planned_model = real


def held_plan_figures(data: bytes, name: str, target: str = "cortex-m4") -> dict:
    """The held plan of a model on `target`: its arena, the generic arena, how many times the
    model was planned, and the CPU seconds of the whole plan in this process."""
    model = parse_model(data, name)
    generic = plan_module.plan_model(model).arena_bytes
    start = time.process_time()
    with counted_plans() as made:
        held = plan_module.plan_model(model, target=target)
    return {"ops": len(model.main.operators), "generic": generic, "held": held.arena_bytes,
            "plans": len(made), "cpu_s": time.process_time() - start}
