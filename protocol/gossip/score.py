"""Peer scores and bans. A small pure class; `now` is an argument.

Contract:
- `penalize(peer, reason)` returns True when the peer just crossed the disconnect threshold: the
  caller disconnects it, and `ban(peer, now)` keeps it out for `ban_s`.
- `reward(peer)` is called once per message that peer was the first to deliver to us.
- `decay()` is called once per heartbeat. Records of peers near 0 that are not connected are
  forgotten there, so memory follows the set of recently active peers.
"""

from __future__ import annotations

from protocol.errors import Reason
from protocol.gossip.config import ScoreConfig


class PeerScores:
    def __init__(self, config: ScoreConfig) -> None:
        self.config = config
        self._scores: dict[str, float] = {}
        self._banned_until: dict[str, float] = {}

    def score(self, peer: str) -> float:
        return self._scores.get(peer, 0.0)

    def penalize(self, peer: str, reason: Reason) -> bool:
        """Subtract the reason's penalty. True if the peer is now below the disconnect threshold."""
        penalty = self.config.penalties[reason]
        if penalty:
            self._scores[peer] = self.score(peer) - penalty
        return self.score(peer) < self.config.disconnect

    def reward(self, peer: str) -> None:
        self._scores[peer] = min(self.config.reward_cap, self.score(peer) + self.config.reward)

    def graylisted(self, peer: str) -> bool:
        return self.score(peer) < self.config.graylist

    def below_disconnect(self, peer: str) -> bool:
        return self.score(peer) < self.config.disconnect

    def ban(self, peer: str, now: float) -> None:
        self._banned_until[peer] = now + self.config.ban_s

    def banned(self, peer: str, now: float) -> bool:
        until = self._banned_until.get(peer)
        if until is None:
            return False
        if until <= now:
            del self._banned_until[peer]
            self._scores.pop(peer, None)  # a served ban starts again from a clean score
            return False
        return True

    def decay(self, connected: set[str]) -> None:
        for peer in list(self._scores):
            value = self._scores[peer] * self.config.decay
            if abs(value) < 0.01 and peer not in connected:
                del self._scores[peer]
            else:
                self._scores[peer] = value

    def snapshot(self) -> dict[str, float]:
        return dict(sorted(self._scores.items()))
