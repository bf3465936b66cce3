"""One node's state in a reduced run: ``θ, v`` stepped with each sealed slot's reduced shards.

Every replica applies the same decoded bytes, so replicas that applied the same reductions hold the same
bits. The window's reductions (in the run's codec: ~0.53 B per parameter and slot under int4) and the
state at its bottom are kept, so that a shard proven wrong after its slot closed (a check that disagrees:
:mod:`protocol.reduced.slot`) is replaced and the window replayed from its bottom, the same on every replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from protocol.errors import LocalProtocolError
from protocol.ledger.config import LedgerConfig
from protocol.ledger.outer import outer_step
from protocol.ledger.rules import outer_rule
from protocol.reduced.plan import ShardPlan

__all__ = ["ReducedReplica"]


class ReducedReplica:
    """``θ, v`` (float32) of a reduced run whose model has ``plan.shapes``; reductions in ``codec``."""

    def __init__(self, params: Mapping[str, np.ndarray], config: LedgerConfig, plan: ShardPlan, codec: str) -> None:
        self.config, self.plan, self.codec, self.rule = config, plan, codec, outer_rule(config)
        self.theta = {n: np.array(params[n], dtype=np.float32) for n in plan.shapes}
        self.v = {n: np.zeros_like(a) for n, a in self.theta.items()}
        self.slot = 0
        self.replaced = 0  # shards replaced after they were applied (a round trained from the θ before is stale)
        self._bottom = (0, {n: a.copy() for n, a in self.theta.items()}, {n: a.copy() for n, a in self.v.items()})
        self._window: dict[int, dict[int, bytes]] = {}

    def aggregate(self, shards: Mapping[int, bytes]) -> dict[str, np.ndarray]:
        """The float64 aggregate the shards' bytes decode to (``RemoteProtocolError`` for bad bytes)."""
        g = {n: np.empty(shape, dtype=np.float64) for n, shape in self.plan.shapes.items()}
        for k in range(self.plan.shards):
            pieces = self.plan.shard(k)
            for p, x in zip(pieces, self.plan.decode(shards[k], pieces, self.codec).values(), strict=True):
                g[p.name].reshape(-1)[p.start:p.stop] = x
        return g

    def _step(self, theta: dict, v: dict, slot: int, shards: Mapping[int, bytes]) -> None:
        outer_step(self.rule, theta, v, self.aggregate(shards), None, self.config.eta(slot))

    def apply(self, slot: int, shards: Mapping[int, bytes]) -> None:
        """Step with slot ``slot``'s reduced shards (every one of the plan's), the next slot."""
        if slot != self.slot + 1 or set(shards) != set(range(self.plan.shards)):
            raise LocalProtocolError(f"slot {slot} needs all {self.plan.shards} shards, after slot {self.slot}")
        self._step(self.theta, self.v, slot, shards)
        self.slot = slot
        self._window[slot] = dict(shards)
        while len(self._window) > self.config.window:
            bottom_slot, theta, v = self._bottom
            oldest = min(self._window)
            self._step(theta, v, oldest, self._window.pop(oldest))
            self._bottom = (oldest, theta, v)

    def replace(self, slot: int, shard: int, data: bytes) -> None:
        """Shard ``shard`` of window slot ``slot`` is ``data`` instead: the window is replayed from its bottom."""
        if slot not in self._window:
            raise LocalProtocolError(f"slot {slot} is not in the window")
        self._window[slot][shard] = data
        self.replaced += 1
        _, theta, v = self._bottom
        self.theta, self.v = {n: a.copy() for n, a in theta.items()}, {n: a.copy() for n, a in v.items()}
        for s in sorted(self._window):
            self._step(self.theta, self.v, s, self._window[s])

    def params(self) -> dict[str, np.ndarray]:
        return {n: a.copy() for n, a in self.theta.items()}

    def params_digest(self) -> bytes:
        """SHA-256 over ``θ``'s tensors in sorted-name order (their float32 bytes)."""
        h = hashlib.sha256()
        for n in sorted(self.theta):
            h.update(self.theta[n].tobytes())
        return h.digest()

    def digest(self) -> bytes:
        """SHA-256 over ``θ`` and ``v``, tensor by tensor in sorted-name order (their float32 bytes)."""
        h = hashlib.sha256()
        for n in sorted(self.theta):
            h.update(self.theta[n].tobytes())
            h.update(self.v[n].tobytes())
        return h.digest()
