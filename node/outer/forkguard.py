"""The fork choice's memory of peers: whose heavier states are not downloaded now, and why.

A peer's weight (the totals of its finalized slots) is its own word, so the fork choice guards against a
peer that keeps presenting heavier states:

- **refused**: a vet (a fork's, `node.outer.upkeep.BetweenRounds.vet`, or a joiner's) found a state of the
  peer a worse model. None of its states is downloaded for `ADOPTION_COOLDOWN_WINDOWS` windows of slots,
  doubled with each refusal (`refusal_slots`): a forger's garbage costs a download ever more rarely, and an
  honest heavier side that once evaluated worse is vetted again, so an honest fork ends.
- **adopted**: this process adopted a state of the peer less than `ADOPTION_COOLDOWN_WINDOWS` windows of
  slots ago. A hostile peer could otherwise make a node adopt a state of its each round, each one (within
  the vet's tolerance) setting the model back to its window bottom and dropping the window's updates. The
  hold-off is lifted for a state that a *second* peer vouches for (it signs a manifest of the same slot and
  ledger digest, which covers the whole state: `node.sync.repair`), once per hold-off period, whoever the
  peers: an honest peer whose history forked from ours again that soon has usually adopted a third's
  heavier state, which the third holds too, and colluding keys gain one adoption per period, not one per
  state they forge. Without this, a node that had adopted from both other nodes of a churning run within
  the hold-off stayed forked from both to the end of its run (tests/node_net/test_fork_choice.py,
  BENCHMARKS.md session 31).

The replica owns one guard; its slot is the guard's clock. Used on the trio thread only.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ADOPTION_COOLDOWN_WINDOWS", "ForkGuard", "refusal_slots"]

ADOPTION_COOLDOWN_WINDOWS = 4  # after adopting a state of a peer, none of its for this many windows of slots


def refusal_slots(refusals: int, window: int) -> int:
    """Slots for which a peer's states are not downloaded after the vet refused `refusals` of them."""
    return ADOPTION_COOLDOWN_WINDOWS * window * 2 ** (refusals - 1)


class ForkGuard:
    """Refusals and adoptions per peer (module docstring); `slot()` is the replica's current slot."""

    def __init__(self, window: int, slot: Callable[[], int]) -> None:
        self.window = window
        self._slot = slot
        self.refusals: dict[str, tuple[int, int]] = {}  # peer → (our slot at its last refused state, refusals)
        self.adopted_from: dict[str, int] = {}  # peer → our slot when this process last adopted a state of it
        self.vouched_at: int | None = None  # our slot at the last adoption that a vouch let through

    def refuse(self, peer: str) -> None:
        """A vet refused a state of `peer`: none is downloaded for `refusal_slots`."""
        self.refusals[peer] = (self._slot(), self.refusals.get(peer, (0, 0))[1] + 1)

    def adopted(self, peer: str, *, vouched: bool = False) -> None:
        """This process has just adopted a state of `peer` (`vouched`: one `holds_off` let through for a vouch)."""
        self.adopted_from[peer] = self._slot()
        if vouched:
            self.vouched_at = self._slot()

    def refused_recently(self, peer: str) -> bool:
        """Whether a state of `peer` was refused less than `refusal_slots` slots ago."""
        at, count = self.refusals.get(peer, (0, 0))
        return count > 0 and self._slot() - at < refusal_slots(count, self.window)

    def adopted_recently(self, peer: str) -> bool:
        """Whether this process adopted a state of `peer` less than `ADOPTION_COOLDOWN_WINDOWS` windows ago."""
        at = self.adopted_from.get(peer)
        return at is not None and self._slot() - at < ADOPTION_COOLDOWN_WINDOWS * self.window

    def _vouch_lifts(self) -> bool:
        """Whether a vouch may lift a hold-off now: none did in the last `ADOPTION_COOLDOWN_WINDOWS` windows."""
        return self.vouched_at is None or self._slot() - self.vouched_at >= ADOPTION_COOLDOWN_WINDOWS * self.window

    @property
    def refused_from(self) -> frozenset[str]:
        """The peers whose states are not downloaded now because a vet refused one (`refused_recently`)."""
        return frozenset(peer for peer in self.refusals if self.refused_recently(peer))

    def holds_off(self, peer: str, *, vouched: bool = False) -> str | None:
        """Why a heavier state of `peer` is not downloaded or adopted now, or None if it may be. `vouched`:
        a second peer signs a manifest of the same state (lifts the hold-off after an adoption, once per
        period; never a refusal)."""
        if self.refused_recently(peer):
            return f"a state of it was refused as a worse model at slot {self.refusals[peer][0]}"
        if not self.adopted_recently(peer):
            return None
        if not vouched:
            return (f"a state of it was adopted at slot {self.adopted_from[peer]}, less than "
                    f"{ADOPTION_COOLDOWN_WINDOWS} windows ago, and no second peer vouches for this one")
        if not self._vouch_lifts():
            return (f"a state of it was adopted at slot {self.adopted_from[peer]}, and a vouched state was "
                    f"adopted at slot {self.vouched_at}, less than {ADOPTION_COOLDOWN_WINDOWS} windows ago")
        return None
