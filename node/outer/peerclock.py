"""Peers' round durations as a node sees them: when is a peer's next update due (the slot close waits for
those only), and how long a full round of the run takes (the adaptive round budget). Trio thread only."""

from __future__ import annotations

import statistics

__all__ = ["PeerRoundClock"]


def _smoothed(old: float | None, new: float) -> float:
    return new if old is None else 0.7 * old + 0.3 * new


class PeerRoundClock:
    """Peers' round durations, measured as the time between two updates of the same origin: as they are
    (when is a peer's next update due) and scaled to a full round of H steps (how long a round takes).

    Times are *publication* times (a header's seqno: its sender's clock, microseconds), not arrival
    times: updates that arrive together — the history a (re)connecting peer announces, a backlog after a
    partition — would otherwise measure rounds of ~0 s, and a node that just restarted would cut its own
    rounds to one step each (measured: a burst of 1-step rounds, one slot each). An update published
    before the newest one seen from its origin is not a new round and is ignored."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._interval: dict[str, float] = {}
        self._full_round: dict[str, float] = {}

    def observe(self, origin: str, published_at: float, steps: int | None = None,
                full_steps: int | None = None) -> None:
        """An update of `origin` published at `published_at` (Unix seconds) came in; its round did `steps`
        of the run's `full_steps` (H)."""
        last = self._last.get(origin)
        if last is not None and published_at <= last:
            return
        self._last[origin] = published_at
        if last is not None:
            interval = published_at - last
            self._interval[origin] = _smoothed(self._interval.get(origin), interval)
            scale = full_steps / steps if steps and full_steps and 0 < steps < full_steps else 1.0
            self._full_round[origin] = _smoothed(self._full_round.get(origin), interval * scale)

    def target_seconds(self) -> float | None:
        """Median of the peers' round durations scaled to H steps (None before two updates of one peer).
        Scaled, because a round that the adaptive budget cut short would otherwise shorten the budgets of
        the peers that measure it, and theirs ours: a ratchet towards ever shorter rounds (measured: 42 of
        50 steps per round on average in a 3-minute testnet, so more bytes per step)."""
        return statistics.median(self._full_round.values()) if self._full_round else None

    def due(self, now: float, until: float) -> int:
        """How many peers may publish between `now` and `until`: those whose next update (the last one
        plus their round time) falls in [now − half a round, until] — one overdue by more is late or
        gone —, and those seen once, recently (their round time is not known yet)."""
        typical = self.target_seconds()
        n = 0
        for origin, last in self._last.items():
            interval = self._interval.get(origin)
            if interval is None:
                n += typical is None or now - last <= 2 * typical
            elif now - 0.5 * interval <= last + interval <= until:
                n += 1
        return n
