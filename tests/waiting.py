"""The one way tests wait: poll a condition under a deadline, never sleep and hope (STYLE.md #10)."""

from __future__ import annotations

from collections.abc import Callable

import trio


async def wait_for(
    predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition", *, interval: float = 0.01
) -> float:
    """Poll `predicate` every `interval` seconds until it is true; fail after `timeout` seconds.
    Returns the time it took (trio's clock, so a MockClock's virtual seconds)."""
    start = trio.current_time()
    with trio.move_on_after(timeout):
        while not predicate():
            await trio.sleep(interval)
        return trio.current_time() - start
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
