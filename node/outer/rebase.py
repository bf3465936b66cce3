"""Train through the slot close: a round in progress follows the global parameters as they move.

A node publishes its round's update, then starts its next round at once, while the slot of the update
it just published is still open (waiting for the peers' updates of that slot, see
`node.outer.rounds.Rounds.close_wait`). Until that slot closes, the round trains from the global parameters
θ minus its own published update (its own progress stands in for the slot's aggregate, as in the
"eager" outer step of overlapped DiLoCo); when the slot closes, or a late update is folded in, this
base moves by some s, and the round adds s to its local parameters before its next inner step. Its
pseudo-gradient is taken against the moved base:

    Δ = (base_start + Σ s) − θ_local,   θ_local = base_start + Σ s − (the round's own inner updates)

so Δ is exactly the round's own progress, whatever moved underneath it, and every step after a move
trains from parameters that include every update this node knows of. No node idles while a slot
fills (the grace window costs no compute), which is why the slot can wait for the peers' updates
much longer than one inner step. (Starting from θ alone would make the first steps of each round
re-learn the node's own last update, which the slot's aggregate then adds a second time.)

`BaseShift` is the hand-over between the node's rounds (`post`, on every change of θ, from the trio
thread: it only hands the new base's arrays over, under a lock) and the worker thread running the inner
loop (`take`, polled before each step by `InnerLoop.run`: it computes the move, a pass over every
parameter). Both sides keep their own view: the posting side the
newest base it posted, the inner loop the base it has actually applied. Posted bases are never modified
(the poster hands them over), so a take makes the applied base *the same arrays* as the posted one: the
shift holds one model-sized float32 base (4 bytes per parameter), two only while a move waits, and the
move itself while the inner loop adds it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

__all__ = ["BaseShift"]


class BaseShift:
    """Moves of the global parameters, handed from the trio thread to a round's worker thread."""

    def __init__(self, base: Mapping[str, np.ndarray], base_slot: int) -> None:
        """`base` (float32 arrays, read here, never modified) is handed over: the caller must not modify
        it afterwards."""
        self._lock = threading.Lock()
        self._posted: tuple[dict[str, np.ndarray], int] | None = None  # a base not taken yet, and its slot
        self.applied = dict(base)  # worker side: the base the round trains from (read-only by contract)
        self.applied_slot = base_slot  # slot of the global parameters the round now trains from
        self.moves = 0  # shifts applied

    def post(self, params: Mapping[str, np.ndarray], slot: int) -> None:
        """The base is now `params` (float32, at `slot`); the caller hands them over and must not modify
        them afterwards. Replaces a base posted earlier and not taken yet."""
        with self._lock:
            self._posted = (dict(params), slot)

    def take(self) -> dict[str, np.ndarray] | None:
        """Worker thread, before an inner step: the move to add to the local parameters (new base minus
        the applied one), if a base was posted since the last take. A pass over every parameter."""
        with self._lock:
            posted, self._posted = self._posted, None
        if posted is None:
            return None
        base, slot = posted
        moved = {k: base[k] - self.applied[k] for k in self.applied}
        self.applied, self.applied_slot = base, slot
        self.moves += 1
        return moved
