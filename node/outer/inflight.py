"""The round in flight, kept on disk while it trains, so that a crash costs seconds of work, not half a round.

A node publishes once per round (H inner steps, minutes at real model sizes): until then its work exists
only in the process. Without this journal a kill loses everything since the round started (measured on the
goodput benchmark: about half a round per kill). While a round trains, the worker thread writes the round's
pseudo-gradient so far, Δ = θ_base (moved) − θ_local, with the header fields it would be published with
(base slot, steps, tokens), to `inflight.dlc` in the checkpoint directory; a round that ends normally
removes the file *before* its update is published, so a round is never published twice (a kill between the
removal and the publication loses that round, as before). The next start of the node publishes what the
file holds as a late update of its own (`Rounds.recover`), after its state sync, then trains its first round
from the run's current parameters as usual. A graceful stop does not need the file: it publishes the round
as it stands (`Rounds.run_round`).

The update is honest and ordinary: `inner_steps` and `tokens` are the steps it really took, its `base_slot`
the slot it last followed, so every replica weights it by its tokens and its staleness like any late
update (PROTOCOL.md §11c); nothing on the wire changes. It is dropped, with a log line, when it is of
another run or peer, has fewer steps than a round's minimum (`MIN_ROUND_FRACTION` of H: an update stands
for real work), its base has left the window (too stale to help), or the run already holds an update
this node published after the journaled round started (an update's seqno is its publication time): the
journal then comes from a restored copy of the directory, and its round was published, or superseded,
by the process that went on (a round is never published twice). A round whose base slot the new process's
replica has not closed yet (the killed process closed it after its last checkpoint) waits: it is published
before the first round that starts once the replica has closed that slot (`Rounds.recover_deferred`).

Cost: one write of 4 bytes per parameter (plus the device-to-host copy) at most every `every_s` seconds
and, measured on the write itself, never more than 5% of the round's time (`JournalCadence`). The file
format is the checkpoint's (docs/checkpoint-format.md): `meta` below, the Δ tensors as `inner` arrays.
Writes are atomic (temp file, fsync, rename, fsync of the directory): a kill leaves the previous journal or
the new one.

Threads: `write` and `clear` run in the round's worker thread, `load` before training starts; one round at
a time owns the file.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import numpy as np

from node.checkpoint import Checkpoint, CheckpointError, read_checkpoint, write_checkpoint

__all__ = ["InflightJournal", "InflightRound", "JournalCadence", "unpublishable", "waits_for_base"]

log = logging.getLogger("node.outer.inflight")

FILE_NAME = "inflight.dlc"
_TMP_PREFIX = ".tmp-"  # `CheckpointDir` deletes leftovers with this prefix when it opens the directory
OVERHEAD = 0.05  # the largest share of a round's time the journal's writes may take


@dataclasses.dataclass(frozen=True)
class InflightRound:
    """A round's progress as journaled: what its update would be published with."""

    run_id: str
    peer_id: str
    round: int  # the node's round number the update stands for
    base_slot: int  # the slot of the global parameters the round last followed
    steps: int
    tokens: int
    seconds: float  # inner-step time of those steps
    mean_loss: float
    data_position: int  # batches drawn when it was written (a restart does not train on them again)
    started_at: float  # when the round started (Unix seconds, the host's clock)
    delta: Mapping[str, np.ndarray]  # Δ = θ_base − θ_local, float32

    @property
    def meta(self) -> dict:
        return {"round": self.round, "kind": "inflight", "run_id": self.run_id, "peer_id": self.peer_id,
                "base_slot": self.base_slot, "steps": self.steps, "tokens": self.tokens, "seconds": self.seconds,
                "mean_loss": self.mean_loss, "data_position": self.data_position,
                "started_at": self.started_at, "written_at": time.time()}


class JournalCadence:
    """When a round writes its journal: `every_s` seconds after the last write (or the round's start), and
    never before the previous write's duration is under `OVERHEAD` of the time since it (so a model whose
    write takes 2 s writes at most every 40 s). Worker thread only."""

    def __init__(self, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self.last_at = clock()
        self.last_cost = 0.0

    def due(self) -> bool:
        since = self.clock() - self.last_at
        return since >= self.every_s and self.last_cost <= OVERHEAD * since

    def wrote(self, started: float) -> None:
        """A write that began at `started` (of `clock`) just ended."""
        self.last_at = self.clock()
        self.last_cost = self.last_at - started


class InflightJournal:
    """`inflight.dlc` in a node's checkpoint directory."""

    def __init__(self, directory: Path, *, every_s: float) -> None:
        if not every_s > 0 or math.isinf(every_s):
            raise ValueError(f"every_s must be a positive number of seconds, got {every_s}")
        self.directory = Path(directory)
        self.path = self.directory / FILE_NAME
        self.every_s = every_s
        self.last_error: str | None = None  # the last failed write, None after a success

    def cadence(self) -> JournalCadence:
        """A fresh cadence for one round."""
        return JournalCadence(self.every_s)

    def write(self, inflight: InflightRound) -> bool:
        """Replace the journal with `inflight`, atomically. An I/O error (a full disk) is logged once per
        kind, kept in `last_error`, and the previous journal is left (or none): training goes on."""
        tmp = self.directory / f"{_TMP_PREFIX}inflight-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            with open(tmp, "xb") as f:
                write_checkpoint(f, Checkpoint(inflight.meta, b"", dict(inflight.delta)))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            _fsync_dir(self.directory)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            error = f"round in flight not journaled: {exc}"
            if error != self.last_error:
                log.error("%s (its work is lost if the node is killed before the round ends)", error)
            self.last_error = error
            return False
        self.last_error = None
        return True

    def clear(self) -> None:
        """Remove the journal (the round it held is published, or dropped)."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove %s: %s", self.path, exc)

    def load(self, *, run_id: str, peer_id: str, shapes: Mapping[str, tuple[int, ...]]) -> InflightRound | None:
        """The journaled round, if there is one and it is this run's and this peer's and fits the model;
        a file that does not is logged with the reason and removed."""
        if not self.path.exists():
            return None
        try:
            with open(self.path, "rb") as f:
                ckpt = read_checkpoint(f, os.fstat(f.fileno()).st_size)
            inflight = _from_checkpoint(ckpt)
            if (inflight.run_id, inflight.peer_id) != (run_id, peer_id):
                raise CheckpointError(f"it is {inflight.peer_id[:16]}'s of run {inflight.run_id!r}, not ours")
            got = {k: tuple(v.shape) for k, v in inflight.delta.items()}
            if got != {k: tuple(v) for k, v in shapes.items()}:
                raise CheckpointError("its tensors are not this model's")
            if not all(np.isfinite(v).all() for v in inflight.delta.values()):
                raise CheckpointError("it holds non-finite values")
        except (OSError, CheckpointError, KeyError, TypeError, ValueError) as exc:
            log.warning("dropping the journal of a round in flight (%s): %s", self.path.name, exc)
            self.clear()
            return None
        return inflight


def unpublishable(inflight: InflightRound, *, slot: int, window: int, own_seqnos: Iterable[int],
                  min_steps: int) -> str | None:
    """Why a journaled round must not be published by a node whose replica has closed `slot` slots (window
    `window`) and holds updates of its own with these seqnos; None when it may (now, or once the replica
    reaches its base: `waits_for_base`). In this order: the run holds an update this node published after
    the round started (a seqno is at least its publication time in microseconds: the journal comes from a
    restored copy of the directory, the round was published or superseded by the process that went on);
    fewer steps than a round's minimum; a base below the window."""
    since = int(inflight.started_at * 1e6)
    later = sum(seqno >= since for seqno in own_seqnos)
    if later:
        return (f"the run holds {later} update(s) this node published after that round started: it was published "
                f"or superseded (a restored copy of the directory?)")
    if inflight.steps < min_steps:
        return f"{inflight.steps} steps, fewer than a round's minimum of {min_steps}"
    if inflight.base_slot < (bottom := max(0, slot - window)):
        return f"its base slot {inflight.base_slot} has left the window (bottom {bottom})"
    return None


def waits_for_base(inflight: InflightRound, slot: int) -> bool:
    """Whether a journaled round's base is ahead of a replica that has closed `slot` slots, so it cannot be
    published yet (an update's base is a slot its sender has closed). It happens when the killed process
    had closed the round's base slot after its last checkpoint and the peers had not: the new process
    resumes one slot behind and publishes the round once its replica closes that slot too."""
    return inflight.base_slot > slot


def _from_checkpoint(ckpt: Checkpoint) -> InflightRound:
    m = ckpt.meta
    if m.get("kind") != "inflight":
        raise CheckpointError(f"not a journal of a round in flight (kind {m.get('kind')!r})")
    ints = {k: int(m[k]) for k in ("round", "base_slot", "steps", "tokens", "data_position")}
    if min(ints.values()) < 0 or ints["steps"] < 1:
        raise CheckpointError(f"impossible counts {ints}")
    delta = {k: np.asarray(v, np.float32) for k, v in ckpt.inner.items()}
    return InflightRound(run_id=str(m["run_id"]), peer_id=str(m["peer_id"]), seconds=float(m["seconds"]),
                         mean_loss=float(m["mean_loss"]), started_at=float(m["started_at"]), delta=delta,
                         **ints)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
