"""A node's ledger from its own checkpoint (`node.checkpoint`): the restore half of a restart.

The checkpoint's snapshot is decoded (every payload checked, as any snapshot), its payloads moved into the
node's blob store and memory-mapped from there (`payloads_to_blobs`), and the ledger rebuilt around the
working state the checkpoint holds beside the snapshot (version 3: no replay of the window; a version 2
file replays it). Blocking: run it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping

from node.checkpoint import Checkpoint
from node.outer.outer_files import BlobPut, payloads_to_blobs
from protocol.ledger import BottomStore, Ledger, LedgerConfig, LedgerSnapshot

__all__ = ["restore_ledger"]


def restore_ledger(ckpt: Checkpoint, config: LedgerConfig, shapes: Mapping[str, tuple[int, ...]],
                   bottom: BottomStore, blobs: BlobPut) -> tuple[Ledger, LedgerSnapshot, list[tuple[int, str]]]:
    """(the ledger, the snapshot it was built from, the (target slot, blob) pairs of the payloads now in
    `blobs`). Raises `RemoteProtocolError` / `LocalProtocolError` (a snapshot that does not load under this
    config and these shapes) or `CheckpointError` (an `outer` section that is not a working state)."""
    working = ckpt.working_state()
    snap, rehomed = payloads_to_blobs(LedgerSnapshot.from_bytes(ckpt.ledger), blobs)
    ledger = Ledger.from_snapshot(snap, config, shapes, bottom=bottom, working=working)
    return ledger, snap, rehomed
