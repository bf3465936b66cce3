"""Where a node process starts from: the inner loop and the ledger, restored from the newest checkpoint of
this node (`node.outer.resume`: the ledger from its part, the inner loop from its parameters, without
running the initialisers, and the error-feedback residual), or built from the seed's initial parameters
when there is none or it is unusable (logged, the residual reset, and the payload blobs it referred to
removed: nothing will refer to them). Blocking: run it in a worker thread.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping

from node.checkpoint import Checkpoint, CheckpointError
from node.island.config import MeshShape
from node.island.task import Task
from node.island.train import InnerLoop
from node.outer.resume import restore_ledger
from p2p.blobstore import BlobStore
from protocol.compression import ErrorFeedback
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.ledger import BottomStore, Ledger, LedgerConfig, LedgerSnapshot

__all__ = ["Start", "start_state"]

log = logging.getLogger("node.runtime")


@dataclasses.dataclass(frozen=True)
class Start:
    """The state a process starts from. `checkpoint` is the one resumed from (its ledger and outer parts
    dropped: the payloads are mapped blob files now), None when it started from the seed; `blobs` are the
    (slot, blob) of the payloads the restored window refers to, for the blob clean-up."""

    loop: InnerLoop
    ledger: Ledger
    snapshot: LedgerSnapshot | None = None
    checkpoint: Checkpoint | None = None
    blobs: tuple[tuple[int, str], ...] = ()


def start_state(task: Task, batches: Iterable, seed: int, checkpoint: Checkpoint | None, config: LedgerConfig,
                shapes: Mapping[str, tuple[int, ...]], bottom: BottomStore, store: BlobStore,
                feedback: ErrorFeedback, refers: Iterable[str] = (), *, mesh: MeshShape | None = None,
                remat: bool = False) -> Start:
    """Restore from `checkpoint` (restoring `feedback` too; `refers`: the payload blobs it refers to), else
    start from the seed. `mesh` and `remat`: the island's layout (`node.island.train.InnerLoop`)."""
    model, tokens = task.model, task.tokens_per_batch
    layout = {"mesh": mesh, "remat": remat}
    if checkpoint is not None:
        try:
            ledger, snap, blobs = restore_ledger(checkpoint, config, shapes, bottom, store)
            checkpoint = dataclasses.replace(checkpoint, ledger=b"", outer={})
            params = {k[len("params/"):]: v for k, v in checkpoint.inner.items() if k.startswith("params/")}
            loop = InnerLoop(model, batches, seed=seed, tokens_per_batch=tokens, params=params, **layout)
            loop.load_state_dict(checkpoint.inner)
            feedback.load_state_dict(checkpoint.feedback)
            return Start(loop, ledger, snap, checkpoint, tuple(blobs))
        except (RemoteProtocolError, LocalProtocolError, CheckpointError) as exc:
            log.warning("checkpoint of round %d unusable (%s): starting fresh", checkpoint.round, exc)
            feedback.reset()
            for blob in refers:
                store.remove(blob)
    loop = InnerLoop(model, batches, seed=seed, tokens_per_batch=tokens, **layout)
    return Start(loop, Ledger(loop.params, config, bottom=bottom))
