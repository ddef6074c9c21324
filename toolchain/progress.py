"""Progress on stderr for the steps that take seconds (the oracle, compiling, QEMU, a plan
search): a bar, or a ticking clock where the amount of work is unknown, while a person watches.

Off unless the command line turns it on (not --quiet, and stderr a terminal), so the library,
the tests and any pipe see nothing of it. stdout, which carries the results and --json, is
never touched.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DELAY = 1.0  # seconds a step runs before it is shown: quick steps never flicker
TICK = 0.5  # seconds between redraws of a step of unknown length
_enabled = False


def enable(on: bool) -> None:
    global _enabled
    _enabled = on


def wanted(quiet: bool) -> bool:
    """Whether to show progress: not asked to be quiet, and someone is looking at stderr."""
    return not quiet and sys.stderr.isatty()


class _Silent:
    def update(self, n: int = 1) -> None:
        pass


@contextmanager
def step(description: str, total: int | None = None, unit: str = "step") -> Iterator[Any]:
    """A bar of `total` `unit`s while the block runs (the block calls `.update()`), or,
    without a total, the time it has taken so far, redrawn every TICK seconds. The line is
    erased when the block ends."""
    if not _enabled:
        yield _Silent()
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc=description, unit=unit, file=sys.stderr, leave=False,
               dynamic_ncols=True, delay=DELAY,
               bar_format=None if total else "{desc}: {elapsed}")
    done = threading.Event()

    def tick() -> None:
        """Redraws the clock (tqdm draws when the count moves; this count never does)."""
        if done.wait(DELAY):
            return
        while True:
            bar.update(0)
            if done.wait(TICK):
                return

    clock = None if total else threading.Thread(target=tick, daemon=True)
    if clock:
        clock.start()
    try:
        yield bar
    finally:
        done.set()
        if clock:
            clock.join()
        bar.close()
