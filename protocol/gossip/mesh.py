"""Mesh maintenance and gossip target selection: pure functions, decided once per heartbeat.

`plan_mesh` returns which peers to graft and which to prune so that the mesh ends with between
`d_lo` and `d_hi` peers (repairing toward `d`), never holds a peer with a negative score, and, when
it must shrink, keeps the `d_score` best-scored peers and a random rest (so an attacker cannot
buy its way into every mesh by good behaviour alone). Randomness comes from the `rng` passed in.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class MeshPlan:
    graft: tuple[str, ...]
    prune: tuple[str, ...]


def plan_mesh(
    mesh: Collection[str],
    connected: Iterable[str],
    score: Callable[[str], float],
    may_graft: Callable[[str], bool],
    *,
    d: int,
    d_lo: int,
    d_hi: int,
    d_score: int,
    rng: random.Random,
) -> MeshPlan:
    """Decide grafts and prunes. `may_graft(peer)` is False for peers in prune backoff or graylisted.

    Sorted inputs keep the result a deterministic function of the rng state."""
    prune = sorted(p for p in mesh if score(p) < 0)
    keep = sorted(p for p in mesh if score(p) >= 0)
    graft: list[str] = []
    if len(keep) < d_lo:
        candidates = sorted(p for p in set(connected) if p not in mesh and score(p) >= 0 and may_graft(p))
        graft = rng.sample(candidates, min(d - len(keep), len(candidates)))
    elif len(keep) > d_hi:
        by_score = sorted(keep, key=lambda p: (-score(p), p))
        best = by_score[:d_score]
        rest = by_score[d_score:]
        chosen = set(best) | set(rng.sample(rest, d - len(best)))
        prune += sorted(p for p in keep if p not in chosen)
    return MeshPlan(tuple(sorted(graft)), tuple(sorted(prune)))


def gossip_targets(
    connected: Iterable[str], mesh: Collection[str], eligible: Callable[[str], bool], d_lazy: int, rng: random.Random
) -> list[str]:
    """Up to `d_lazy` random non-mesh peers that may receive IHAVE announcements."""
    candidates = sorted(p for p in set(connected) if p not in mesh and eligible(p))
    return sorted(rng.sample(candidates, min(d_lazy, len(candidates))))
