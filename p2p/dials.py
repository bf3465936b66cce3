"""Why dials failed: the last failure per address, until a dial there succeeds. Shown in `/status` and in
what a syncing node says it waits for; each failure is logged, a bootstrap address's as a warning (a typo
in `--peers` must not go unnoticed), others at info level (peers that left are redialled)."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["DialFailure", "DialFailures"]

log = logging.getLogger("p2p.host")


@dataclass(frozen=True)
class DialFailure:
    """Why the last dial of an address failed, how many dials in a row did, and when (host clock)."""

    why: str
    tries: int
    at: float


class DialFailures:
    """Bounded (`limit` addresses, the oldest dropped first). trio thread only."""

    def __init__(self, bootstrap: Collection[str], limit: int = 64) -> None:
        self.bootstrap, self.limit = frozenset(bootstrap), limit
        self._by_address: dict[str, DialFailure] = {}

    def __bool__(self) -> bool:
        return bool(self._by_address)

    def get(self, address: str) -> DialFailure | None:
        return self._by_address.get(address)

    def failed(self, address: str, why: str, now: float) -> None:
        last = self._by_address.pop(address, None)
        self._by_address[address] = DialFailure(why, last.tries + 1 if last else 1, now)
        while len(self._by_address) > self.limit:
            self._by_address.pop(next(iter(self._by_address)))
        bootstrap = address in self.bootstrap
        log.log(logging.WARNING if bootstrap else logging.INFO, "cannot reach %s%s (try %d): %s",
                "bootstrap peer " if bootstrap else "", address, self._by_address[address].tries, why)

    def succeeded(self, address: str) -> None:
        self._by_address.pop(address, None)

    def describe(self) -> dict[str, str]:
        """address -> "why (N tries)", for `/status`."""
        return {a: f"{f.why} ({f.tries} tries)" for a, f in self._by_address.items()}
