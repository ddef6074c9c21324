"""Memory planners: place plain buffers with known lives into one arena (or several pools).

They see buffers only (id, size, first and last step, allowed overlaps): no model types. A new
planner is one module with a `Planner` subclass and one line in `PLANNERS`
(toolchain/planners/registry.py).
"""

from __future__ import annotations

from toolchain.planners.base import (
    CLOCK_EVERY,
    NEVER,
    Buffer,
    Deadline,
    OutOfTime,
    Overlap,
    Placement,
    Planner,
    align_up,
    lower_bound,
    lower_bound_with_overlaps,
    naive_sum,
)
from toolchain.planners.pools import (
    Pool,
    PoolArena,
    PooledPlacement,
    PoolsDoNotFit,
    plan_pools,
    verify_pools,
)
from toolchain.planners.registry import FALLBACK, PLANNERS, make_plan, smallest_plan
from toolchain.planners.verify import verify

__all__ = [
    "CLOCK_EVERY",
    "NEVER",
    "FALLBACK",
    "PLANNERS",
    "Buffer",
    "Deadline",
    "OutOfTime",
    "Overlap",
    "Placement",
    "Planner",
    "Pool",
    "PoolArena",
    "PooledPlacement",
    "PoolsDoNotFit",
    "align_up",
    "lower_bound",
    "lower_bound_with_overlaps",
    "make_plan",
    "naive_sum",
    "plan_pools",
    "smallest_plan",
    "verify",
    "verify_pools",
]

