"""Benchmark: one origin flooding a closed slot with validly signed updates, with and without the per-origin
limit (``max_updates_per_origin``, ``protocol.ledger.bound``), at real model sizes.

Run: ``python -m testnet.benchmarks.flood --params 1e8 [--peers 4] [--flood 12] [--json FILE]``.

Setup (the scale benchmark's, ``testnet.benchmarks.scale.Peers``: the real ledger, codec and blob store,
pseudo-gradients drawn like real ones at cosine ~0.3): ``--peers`` origins fill slot 1, which closes; then
one of them sends ``--flood`` more updates for slot 1, each with a smaller id than the one before (ids are
hashes a peer can grind): every one arrives late, into the newest closed slot. The same draw and updates
go to two ledgers, one after the other: the run's default limit (K = 2) and none (every update kept, the
smallest id counts: each one displaces the last).

Printed and written (``--json``), per ledger: ``flood_s`` (all the flood's ``Ledger.add`` calls; the check
of each payload excluded), ``slowest_s`` (the dearest one), ``changed`` (adds that changed the slot's
counted set: each a fold over the slot's payloads), the outcomes, and ``slot_payload_bytes_per_param``
(the encoded payloads the slot holds at the end, what every node keeps on disk and a joiner downloads).
``flood_ratio``: the limited ledger's ``flood_s`` ÷ the unlimited one's, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

from node.outer.outer_files import MappedBottom, return_freed_memory
from p2p.blobstore import BlobStore
from protocol.compression import Codec
from protocol.ledger import Ledger, LedgerConfig
from protocol.ledger.bound import counted
from testnet.benchmarks.pseudograd import adamw_delta, transformer_shapes
from testnet.benchmarks.scale import Peers


def flood(draw: dict, peers: int, size: int, limit: int | None, seed: int, work: Path) -> dict[str, float | int]:
    """One ledger: slot 1 filled by ``peers`` origins and closed, then ``size`` late updates of origin 1."""
    store = BlobStore(work / "blobs")
    source = Peers(draw, peers, Codec.INT4, seed, store, cosine=0.3)
    config = LedgerConfig(window=8, embeddings=frozenset({"embed"}), max_updates_per_origin=limit)
    ledger = Ledger({name: x * 0.0 for name, x in draw.items()}, config, bottom=MappedBottom(work / "outer"))
    source.fill_open_slot(ledger)
    ledger.close_slot()
    total = sum(x.size for x in draw.values())
    times, changed, outcomes = [], 0, {}
    for _ in range(size):
        meta, deltas, payload = source.late(ledger, peer=1)  # below the last id of origin 1 in the slot
        slot = [e for e in ledger.entries() if e.slot == 1]
        before = [e.meta.update_id for e in counted(slot, limit)]
        started = time.perf_counter()
        outcome = ledger.add(meta, deltas, payload=payload)
        times.append(time.perf_counter() - started)
        outcomes[outcome.value] = outcomes.get(outcome.value, 0) + 1
        after = [e.meta.update_id for e in counted([e for e in ledger.entries() if e.slot == 1], limit)]
        changed += before != after
    held = sum(len(e.payload.data) for e in ledger.entries() if e.slot == 1 and e.payload is not None)
    return {"flood_s": sum(times), "slowest_s": max(times), "changed": changed, **outcomes,
            "evicted": ledger.counters["evicted"], "slot_payload_bytes_per_param": held / total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=1e7, help="about how many parameters (e.g. 1e8)")
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--flood", type=int, default=12, help="late updates of one origin for the closed slot")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the figures to this file")
    args = ap.parse_args()
    return_freed_memory()  # as the node does at start
    shapes = transformer_shapes(int(args.params))
    total = sum(math.prod(s) for s in shapes.values())
    print(f"{total:,} parameters; {args.peers} peers fill slot 1, then one sends {args.flood} late updates for it, "
          f"each id below the last", flush=True)
    draw = adamw_delta(shapes, steps=16 if total <= 20_000_000 else 2, seed=args.seed)
    figures: dict[str, object] = {"params": total, "peers": args.peers, "flood": args.flood}
    for label, limit in (("limited", LedgerConfig().max_updates_per_origin), ("unlimited", None)):
        work = Path(tempfile.mkdtemp(prefix="flood-"))
        try:
            figures[label] = result = flood(draw, args.peers, args.flood, limit, args.seed, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"  {label} (K = {limit}): {result['flood_s']:.2f} s for the flood, slowest add {result['slowest_s']:.3f} s, "
              f"{result['changed']} changed the counted set; the slot holds "
              f"{result['slot_payload_bytes_per_param']:.2f} B/param of payloads; {result}", flush=True)
    figures["flood_ratio"] = figures["limited"]["flood_s"] / figures["unlimited"]["flood_s"]
    print(f"flood time, limited ÷ unlimited: {figures['flood_ratio']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
