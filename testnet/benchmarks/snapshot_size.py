"""Benchmark: ledger snapshot size and speed with payload entries (version 3) vs float32 entries (version 2).

Run: ``python -m testnet.benchmarks.snapshot_size [--model tiny|small] [--nodes 4] [--window 8]
[--codec int4] [--repeats 3]``.

Setup: a real :class:`~protocol.ledger.Ledger` over the preset model's parameter shapes (``node.island.model``),
with the node's embedding split, that has closed ``window + 2`` slots, each holding one update per node,
so its window holds ``window × nodes`` updates (and two slots are finalized). Each node's update is an
AdamW-like pseudo-gradient (``testnet.benchmarks.pseudograd``, one draw per node, scaled per round)
compressed with error feedback by the real codec, exactly as a node publishes it; the ledger gets the
dequantized deltas with their payload. The same snapshot is then encoded twice: as is (entries carry
their payload) and with the payloads stripped (entries as float32, the version 2 layout). Prints both
sizes, their ratio (total and for the entries alone), bytes per parameter, and the median time of
``to_bytes`` and ``from_bytes`` for each, measured in the same run; checks that both load to the same
ledger digest and parameters.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import statistics
import time
from collections.abc import Callable

import numpy as np

from node.island.config import preset
from node.island.model import embedding_names, param_count, param_shapes
from protocol.compression import Codec, ErrorFeedback
from protocol.ledger import Ledger, LedgerConfig, LedgerSnapshot, Payload, UpdateMeta
from testnet.benchmarks.pseudograd import adamw_delta

Shapes = dict[str, tuple[int, ...]]


def build_ledger(shapes: Shapes, embeddings: tuple[str, ...], nodes: int, window: int, codec: Codec) -> Ledger:
    """A ledger whose window holds ``window × nodes`` updates, each added with its encoded payload."""
    rng = np.random.default_rng(0)
    params = {name: rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02) for name, shape in shapes.items()}
    ledger = Ledger(params, LedgerConfig(window=window, embeddings=frozenset(embeddings)))
    draws = [adamw_delta(shapes, seed=node) for node in range(nodes)]
    feedback = [ErrorFeedback(codec) for _ in range(nodes)]
    for slot in range(1, window + 3):
        for node in range(nodes):
            scale = np.float32(rng.lognormal(0.0, 0.3))
            data, deltas = feedback[node].compress({name: x * scale for name, x in draws[node].items()})
            tag = f"node{node}/slot{slot}"
            meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), f"node{node}", slot - 1, slot - 1, 4096, 32)
            ledger.add(meta, deltas, payload=Payload(codec, data))
        ledger.close_slot()
    return ledger


def without_payloads(snap: LedgerSnapshot) -> LedgerSnapshot:
    """The same state with every entry stored as float32 deltas (what version 2 wrote)."""
    return dataclasses.replace(snap, entries=tuple(dataclasses.replace(e, payload=None) for e in snap.entries))


def entries_bytes(snap: LedgerSnapshot, encoded: bytes) -> int:
    """Bytes the entries take in ``encoded`` (the snapshot's encoding)."""
    return len(encoded) - len(dataclasses.replace(snap, entries=()).to_bytes())


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure(name: str, snap: LedgerSnapshot, params: int, repeats: int) -> tuple[bytes, int]:
    """Print size and encode/decode times of ``snap``; return its bytes and the entries' share."""
    encoded = snap.to_bytes()
    entries = entries_bytes(snap, encoded)
    encode = median_seconds(snap.to_bytes, repeats)
    decode = median_seconds(lambda: LedgerSnapshot.from_bytes(encoded), repeats)
    print(f"{name:>16}: {len(encoded) / 2**20:9.2f} MiB ({len(encoded) / params:6.2f} B/param), entries "
          f"{entries / 2**20:9.2f} MiB ({entries / params / len(snap.entries):5.3f} B/param/update); "
          f"to_bytes {encode * 1e3:8.1f} ms, from_bytes {decode * 1e3:8.1f} ms")
    return encoded, entries


def check_same_state(encodings: list[bytes], ledger: Ledger) -> None:
    """Each encoding loads to the ledger's exact state."""
    for encoded in encodings:
        loaded = Ledger.from_snapshot(LedgerSnapshot.from_bytes(encoded), ledger.config, ledger.shapes)
        assert loaded.ledger_digest() == ledger.ledger_digest()
        assert loaded.params_digest() == ledger.params_digest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--codec", default="int4", choices=[c.value for c in Codec])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cfg = preset(args.model).model
    shapes, params = param_shapes(cfg), param_count(cfg)
    ledger = build_ledger(shapes, embedding_names(cfg), args.nodes, args.window, Codec(args.codec))
    snap = ledger.snapshot()
    print(f"model {args.model}: {params:,} parameters in {len(shapes)} tensors; {len(snap.entries)} {args.codec} "
          f"updates in the window ({args.nodes} nodes, window {args.window})")
    payload_bytes, payload_entries = measure(f"{args.codec} payloads", snap, params, args.repeats)
    float_bytes, float_entries = measure("float32 (v2)", without_payloads(snap), params, args.repeats)
    check_same_state([payload_bytes, float_bytes], ledger)
    print(f"ratio float32 / payloads: snapshot {len(float_bytes) / len(payload_bytes):.2f}x, "
          f"entries {float_entries / payload_entries:.2f}x (both load to the same ledger and params digests)")


if __name__ == "__main__":
    main()
