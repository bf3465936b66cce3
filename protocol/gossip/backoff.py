"""Reconnect backoff: exponential with jitter, per dial target. Pure; `now` and randomness passed in.

After the n-th consecutive failure a target may be dialled again after
`min(cap, base * 2**(n-1)) * (0.5 + u)` seconds, `u` uniform in [0, 1) ("equal jitter" around the
exponential curve), so peers that lost the same node do not all redial it at the same instant.
A success resets the target.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from protocol.errors import LocalProtocolError


def backoff_delay(failures: int, base: float, cap: float, u: float) -> float:
    """Delay before the next attempt after `failures` consecutive failures (0 means no delay)."""
    if failures < 0 or base <= 0 or cap < base or not 0.0 <= u < 1.0:
        raise LocalProtocolError("need failures >= 0, 0 < base <= cap, 0 <= u < 1")
    if failures == 0:
        return 0.0
    return min(cap, base * 2.0 ** min(failures - 1, 62)) * (0.5 + u)


@dataclass
class _Target:
    failures: int = 0
    next_at: float = 0.0


class DialSchedule:
    """When each dial target (an address, or a peer id) may be tried next."""

    def __init__(self, base: float, cap: float, rng: random.Random, max_targets: int = 10_000) -> None:
        if base <= 0 or cap < base or max_targets < 1:
            raise LocalProtocolError("need 0 < base <= cap and max_targets >= 1")
        self.base = base
        self.cap = cap
        self.max_targets = max_targets
        self._rng = rng
        self._targets: dict[str, _Target] = {}

    def ready(self, target: str, now: float) -> bool:
        t = self._targets.get(target)
        return t is None or t.next_at <= now

    def failures(self, target: str) -> int:
        t = self._targets.get(target)
        return 0 if t is None else t.failures

    def failed(self, target: str, now: float) -> float:
        """Record a failed attempt; returns the delay until the target is ready again."""
        t = self._targets.setdefault(target, _Target())
        if len(self._targets) > self.max_targets:  # bounded: forget the target due soonest
            del self._targets[min((k for k in self._targets if k != target), key=lambda k: self._targets[k].next_at)]
        t.failures += 1
        delay = backoff_delay(t.failures, self.base, self.cap, self._rng.random())
        t.next_at = now + delay
        return delay

    def succeeded(self, target: str) -> None:
        self._targets.pop(target, None)

    def forget(self, target: str) -> None:
        self._targets.pop(target, None)
