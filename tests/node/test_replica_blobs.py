"""Tier (b), no network: the payload blobs of updates a replica leaves out — an origin's surplus, and a copy of
an update it had seen (a node that synced a state fetched, meanwhile, updates that state had seen) — are
handed to the clean-up (`Replica.take_dropped_blobs`), but never a blob an entry of the ledger still uses."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from node.outer.outer_files import map_blob
from node.outer.replica import Replica
from p2p.blobstore import BlobStore
from protocol.compression import Codec, encode_tensors
from protocol.ledger import Ledger, LedgerConfig, Outcome, Payload, PayloadDeltas, UpdateMeta

SHAPES = {"emb": (16, 4), "w": (8, 8)}


def mapped(store: BlobStore, tag: str) -> tuple[Payload, str]:
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(tag.encode()).digest()[:8], "big"))
    data = encode_tensors({k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}, Codec.INT8)
    blob = store.put(data)
    return Payload(Codec.INT8, map_blob(store.path(blob))), blob


async def test_a_copy_of_a_seen_update_leaves_its_blob_to_the_clean_up_unless_an_entry_uses_it(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    replica = Replica(Ledger({k: np.ones(s, np.float32) for k, s in SHAPES.items()}, LedgerConfig(window=2)))
    applied = UpdateMeta(hashlib.sha256(b"applied").digest(), "peer-a", 0, 0, 64, 4)
    payload, _ = mapped(store, "applied")
    assert (await replica.add(applied, PayloadDeltas.validated(payload, SHAPES), payload))[0] is Outcome.APPLIED_OPEN
    again, _ = await replica.add(applied, PayloadDeltas.validated(payload, SHAPES), payload)
    assert again is Outcome.DUPLICATE and replica.take_dropped_blobs() == [], "its entry still uses that blob"

    # seen and not applied (as the ids a synced state had seen or dropped), then a copy arrives with its payload
    seen = UpdateMeta(hashlib.sha256(b"seen").digest(), "peer-b", 0, 0, 64, 4)
    assert await replica.ignore({seen.update_id}) == 1
    payload, blob = mapped(store, "seen")
    again, _ = await replica.add(seen, PayloadDeltas.validated(payload, SHAPES), payload)
    assert again is Outcome.DUPLICATE and replica.take_dropped_blobs() == [blob]
