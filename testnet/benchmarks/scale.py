"""Benchmark: the outer machinery at real model sizes — memory per parameter and the time of each outer step.

Run: ``python -m testnet.benchmarks.scale --params 10000000 [--peers 4] [--window 8] [--codec int4]
[--json FILE]``.

Setup (real code throughout: the ledger, the codec with error feedback, snapshots, digests; payloads and
the window bottom kept in memory-mapped files as the node keeps them): a transformer's
tensor shapes of about ``--params`` parameters (``testnet.benchmarks.pseudograd``), one AdamW-like
pseudo-gradient drawn over them (the codec benchmark's generator, with fewer steps at large sizes: the
draw's values matter for compression, not for the costs measured here), and ``--peers`` senders whose
updates are that draw times a per-update lognormal scale: all of a slot's updates point the same way.
``--cosine ρ`` (below 1) adds to each update its own Gaussian noise, sized so that two updates of a slot
are at cosine ~ρ, as pseudo-gradients of different islands are: what the direction screen's decisions (and
a late fold's certificate, ``protocol.ledger.screen_bounds``) see in a run. Sender 0 is *this* node: its updates go through
:class:`~protocol.compression.ErrorFeedback` (whose residual is node state); the others' are encoded, and
checked as a receiving node checks them (every tensor decoded once, the ledger then reads the payload). The ledger closes ``window + 2`` slots with one update per peer in
each, so its window is full and two slots are final.

Printed and written (``--json``):

* ``outer_bytes_per_param``: the peak resident memory of the process while the outer machinery runs (adds,
  closes, folds, a digest), minus the resident memory before the ledger was built (with the draw already
  held), divided by the parameter count. Sampled every 10 ms from ``/proc/self/statm`` by a thread;
  includes every temporary (compressing the own update, a tensor per core being decoded or summed).
  ``steady_bytes_per_param``: the same growth between operations (no temporaries).
  ``outer_anon_bytes_per_param``: the peak growth of the anonymous resident memory (the process's own,
  without the pages of the blob and bottom files it maps, which the kernel reclaims as page cache).
* ``peak_rss_bytes``: the process's peak resident set (``ru_maxrss``), draw included.
* ``close_s``: ``Ledger.close_slot`` with ``peers`` updates in the open slot (median of 2): the outer step
  of the working state, after which a node posts the new parameters to its round.
* ``bottom_s``: ``Ledger.advance_bottom`` right after such a close: the window bottom's arrays stepped with
  the slot that left the window, and hashed (median of 2). A node runs it after the close, as an
  operation of its own (``node.outer.replica``); ``close_s + bottom_s`` is the whole CPU of a slot's close.
* ``bottom_two_s``: the same after two closes (a catch-up): both slots stepped in one sweep over the bottom.
* ``fold_s``: ``Ledger.add`` of one late update into the last closed slot (median of 2; the check of its
  payload excluded) from an origin that already has one there, with the smaller id: it displaces that one
  (an origin's larger id counts for nothing and costs nothing; until 2026-11-27, session 19, the ids were
  left to chance, and a median of 2 could be half a no-op).
* ``fold_new_origin_s``: the same for a late update of an origin that has none in that slot, the common
  case in a run (a slow or restarted node's round): the slot's counted set grows, so the direction screen
  takes its sums again, one pass over the slot's payloads, before the fold (median of 2).
* ``decode_s``: checking one received payload (every tensor decoded, its norm kept).
* ``digest_s``: ``Ledger.params_digest`` right after a change (what a status request costs).
* ``encode_s``: compressing this node's own update with error feedback.
* ``snapshot_bytes_per_param``, ``snapshot_build_bytes_per_param`` (the peak RSS while writing one, above
  the steady state before), ``snapshot_write_s`` (snapshot, encode piece by piece into a file, fsync),
  ``snapshot_load_s`` (as a node restores from a checkpoint: the file memory-mapped and decoded, the
  window's payloads moved to blob files, a ledger rebuilt by replaying the window, its digest checked; the
  first ledger is dropped before, as a restarting node has none): how a restart restored before checkpoint
  version 3, and what a snapshot without a working state costs.
* ``checkpoint_bytes_per_param``, ``checkpoint_write_s``, ``restore_s``: the node's own checkpoint (version 3,
  ``node.checkpoint``: the ledger part of ``node.outer.resume`` with the window bottom and the ledger's
  working state, written by ``CheckpointDir.save``) and
  the restore a restarting node does from it (``node.outer.resume.restore_ledger``: the payloads checked
  in the blob store by size and SHA-256, not decoded; no replay), its digest checked. No inner-loop state
  (the benchmark has no model), so the bytes are the outer part's: the window's payloads stay in the blob
  store, not in the checkpoint.

A size that does not fit in this machine's memory fails with MemoryError or is killed; the JSON then has
nothing for it (the caller records why).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import mmap
import os
import resource
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from node.checkpoint import Checkpoint, CheckpointDir
from node.outer.outer_files import MappedBottom, drop_pages, map_blob, payloads_to_blobs, return_freed_memory
from node.outer.resume import encode_ledger_part, restore_ledger
from p2p.blobstore import BlobStore
from protocol import kernels
from protocol.compression import Codec, ErrorFeedback, encode_tensors
from protocol.ledger import Ledger, LedgerConfig, LedgerSnapshot, Payload, PayloadDeltas, UpdateMeta
from testnet.benchmarks.pseudograd import adamw_delta, transformer_shapes

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(anonymous: bool = False) -> int:
    """Resident set size of this process now; ``anonymous``: without the resident pages of mapped files
    (``statm``'s resident minus shared: what the process itself holds, not the page cache's)."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - (int(fields[2]) if anonymous else 0)) * _PAGE


class PeakSampler:
    """The highest RSS (``peak``) and anonymous RSS (``peak_anon``) seen since the last :meth:`reset`,
    sampled every 10 ms by a daemon thread."""

    def __init__(self) -> None:
        self.reset()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_bytes())
            self.peak_anon = max(self.peak_anon, rss_bytes(anonymous=True))

    def reset(self) -> None:
        self.peak, self.peak_anon = rss_bytes(), rss_bytes(anonymous=True)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss_bytes())


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


class Peers:
    """``peers`` senders of updates drawn from one pseudo-gradient; sender 0 is this node."""

    def __init__(self, draw: dict[str, np.ndarray], peers: int, codec: Codec, seed: int, blobs: BlobStore,
                 cosine: float = 1.0) -> None:
        self.draw = draw
        # each update's own noise, per tensor: σ² = 1/ρ − 1 times the draw's mean square puts two updates at ~ρ
        spread = math.sqrt(1.0 / cosine - 1.0)
        self.noise = {name: np.float32(spread * math.sqrt(float(np.mean(np.square(x, dtype=np.float64)))))
                      for name, x in draw.items()} if cosine < 1.0 else {}
        self.blobs = blobs  # the node's blob store keeps every payload on disk
        self.shapes = {name: x.shape for name, x in draw.items()}
        self.peers = peers
        self.codec = codec
        self.own = ErrorFeedback(codec)
        self.rng = np.random.default_rng(seed)
        self.count = 0
        self.ids: dict[tuple[int, int], bytes] = {}  # (peer, publish slot) → the id of its last update there
        self.encode_s: list[float] = []
        self.decode_s: list[float] = []

    def update(self, peer: int, base: int, publish: int,
               below: bytes | None = None) -> tuple[UpdateMeta, Mapping[str, np.ndarray], Payload]:
        """One update of ``peer`` (header, the deltas a receiver hands the ledger, the payload), as a node
        makes them: its own Δ compressed with error feedback (``ErrorFeedback.compress_payload``: Δ becomes
        the residual), a peer's encoded; either is checked tensor by tensor from its mapped blob
        (``node.outer.updates.decode_update``; the node's rounds do the same for its own). ``below``: its id
        is smaller than this one."""
        scale = np.float32(self.rng.lognormal(0.0, 0.3))
        scaled = {name: x * scale for name, x in self.draw.items()}
        for name, sigma in self.noise.items():
            scaled[name] += self.rng.standard_normal(scaled[name].shape, dtype=np.float32) * (sigma * scale)
        self.count += 1
        while below is not None and hashlib.sha256(f"peer{peer}/{self.count}".encode()).digest() >= below:
            self.count += 1
        tag = f"peer{peer}/{self.count}"
        meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), f"peer{peer}", base, publish, 4096, 32)
        self.ids[(peer, publish)] = meta.update_id
        if peer == 0:
            took, data = timed(lambda: self.own.compress_payload(scaled))
            self.encode_s.append(took)
        else:
            data = encode_tensors(scaled, self.codec)
        del scaled
        path = self.blobs.path(self.blobs.put(data))
        del data
        payload = Payload(self.codec, map_blob(path))
        took, deltas = timed(lambda: PayloadDeltas.validated(payload, self.shapes))
        if peer:
            self.decode_s.append(took)
        drop_pages(payload.data)
        return meta, deltas, payload

    def fill_open_slot(self, ledger: Ledger) -> None:
        for peer in range(self.peers):
            ledger.add(*self.update(peer, ledger.slot, ledger.slot))

    def late(self, ledger: Ledger, peer: int) -> tuple[UpdateMeta, Mapping[str, np.ndarray], Payload]:
        """An update of ``peer`` for the last closed slot (it published knowing one slot less). If ``peer``
        has an update there, this one's id is the smaller: it displaces that one (the one that counts)."""
        publish = ledger.slot - 1
        return self.update(peer, publish, publish, below=self.ids.get((peer, publish)))


def measure(params: int, peers: int, window: int, codec: Codec, seed: int, cosine: float = 1.0) -> dict[str, float | int]:
    shapes = transformer_shapes(params)
    total = sum(math.prod(s) for s in shapes.values())
    steps = 16 if total <= 20_000_000 else 2
    print(f"{total:,} parameters in {len(shapes)} tensors; {peers} peers, window {window}, {codec.value}; "
          f"drawing one pseudo-gradient ({steps} AdamW steps)…", flush=True)
    draw = adamw_delta(shapes, steps=steps, seed=seed)
    compiled = total >= kernels.COMPILED_FROM_PARAMS  # as a node of this size does (node.runtime)
    loaded = rss_bytes()
    kernels.use_compiled(compiled)  # numba's fixed cost per process, before the outer machinery is measured
    print(f"outer passes: {'compiled (numba: +' if compiled else 'numpy ('}{(rss_bytes() - loaded) / 1e6:.0f} MB resident)",
          flush=True)
    blobs = Path(tempfile.mkdtemp(prefix="scale-blobs-"))
    store = BlobStore(blobs / "blobs")
    source = Peers(draw, peers, codec, seed, store, cosine)
    params0 = {name: np.full(shape, 0.0, dtype=np.float32) for name, shape in shapes.items()}  # resident
    held = sum(x.nbytes for x in params0.values())  # the initial params are the caller's
    before, before_anon = rss_bytes() - held, rss_bytes(anonymous=True) - held
    ledger = Ledger(params0, LedgerConfig(window=window, embeddings=frozenset({"embed"})),
                    bottom=MappedBottom(blobs / "outer"))
    del params0
    sampler = PeakSampler()
    started = time.perf_counter()
    for slot in range(window + 2):
        source.fill_open_slot(ledger)
        ledger.close_slot()
        ledger.advance_bottom()
        print(f"  slot {ledger.slot}/{window + 2} closed ({time.perf_counter() - started:.0f} s)", flush=True)
    closes, bottoms, folds, new_origin_folds = [], [], [], []
    for _ in range(2):
        source.fill_open_slot(ledger)
        closes.append(timed(ledger.close_slot)[0])
        bottoms.append(timed(ledger.advance_bottom)[0])
        for peer, times in ((1, folds), (peers, new_origin_folds)):  # peer `peers` published nothing yet
            meta, deltas, payload = source.late(ledger, peer=peer)
            took, outcome = timed(lambda: ledger.add(meta, deltas, payload=payload))
            assert outcome.value == "folded-late", outcome
            times.append(took)
            del deltas
    for _ in range(2):
        source.fill_open_slot(ledger)
        ledger.close_slot()
    bottom_two_s, stepped = timed(ledger.advance_bottom)
    assert stepped == 2, stepped
    digest_s, digest = timed(ledger.params_digest)
    outer_peak, outer_peak_anon = sampler.peak, sampler.peak_anon
    print(f"  outer: {(outer_peak - before) / total:.1f} B/param at peak; close {statistics.median(closes):.3f} s "
          f"+ bottom {statistics.median(bottoms):.3f} s (two slots in one sweep {bottom_two_s:.3f} s), "
          f"fold {statistics.median(folds):.3f} s (new origin {statistics.median(new_origin_folds):.3f} s), "
          f"digest {digest_s:.3f} s", flush=True)
    sampler.reset()
    steady = rss_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "snapshot.bin"

        def write() -> int:
            size = 0
            with open(path, "wb") as f:  # streamed piece by piece, as a checkpoint is written
                for piece in ledger.snapshot().to_pieces():
                    size += f.write(piece)
                    drop_pages(piece)  # as node.checkpoint does: a written payload's pages may go
                f.flush()
                os.fsync(f.fileno())
            return size

        write_s, size = timed(write)
        snapshot_peak = sampler.peak
        print(f"  snapshot: {size / total:.1f} B/param written in {write_s:.2f} s", flush=True)
        checkpoints = CheckpointDir(Path(tmp) / "checkpoints", keep=1)

        def write_checkpoint() -> int:
            """As `node.outer.upkeep` does: the ledger part (payloads referred to in the blob store), written."""
            part = encode_ledger_part(ledger.snapshot(), ledger.working_state(), ledger.bottom_rows(), store)
            saved = checkpoints.save(Checkpoint({"round": 1}, part.data, {}, {}, part.outer))
            assert saved is not None, checkpoints.last_error
            return saved.stat().st_size

        checkpoint_write_s, checkpoint_size = timed(write_checkpoint)
        print(f"  checkpoint: {checkpoint_size / total:.1f} B/param written in {checkpoint_write_s:.2f} s", flush=True)

        config, shapes, bottom_store = ledger.config, ledger.shapes, ledger.bottom_store
        del ledger  # a joiner loads a snapshot with no ledger of its own yet (and RAM is the limit here)

        def load() -> Ledger:
            """As a node restores from a checkpoint: the file mapped (`node.checkpoint`), decoded, the
            window's payloads moved to blob files (`payloads_to_blobs`), the ledger built."""
            with open(path, "rb") as f:
                mapped = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
            snap, _ = payloads_to_blobs(LedgerSnapshot.from_bytes(mapped), BlobStore(Path(tmp) / "blobs"))
            del mapped
            loaded = Ledger.from_snapshot(snap, config, shapes, bottom=bottom_store)
            assert loaded.params_digest() == digest, "the snapshot loads to another state"
            return loaded

        def restore() -> Ledger:
            """As a restarting node does (`node.runtime`): the newest checkpoint, then `restore_ledger`."""
            ckpt = checkpoints.latest()
            assert ckpt is not None, "the checkpoint does not load"
            loaded, _, _ = restore_ledger(ckpt, config, shapes, bottom_store, store)
            assert loaded.params_digest() == digest, "the checkpoint restores another state"
            return loaded

        load_s = timed(lambda: load() and None)[0]  # the loaded ledger dropped before the next one
        restore_s = timed(lambda: restore() and None)[0]
        print(f"  snapshot load (replay) {load_s:.2f} s, restore from the checkpoint {restore_s:.2f} s", flush=True)
    sampler.stop()
    shutil.rmtree(blobs, ignore_errors=True)
    return {
        "params": total,
        "peers": peers,
        "window": window,
        "codec": codec.value,
        "compiled": compiled,
        "outer_bytes_per_param": (outer_peak - before) / total,
        "outer_anon_bytes_per_param": (outer_peak_anon - before_anon) / total,
        "steady_bytes_per_param": (steady - before) / total,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "close_s": statistics.median(closes),
        "bottom_s": statistics.median(bottoms),
        "bottom_two_s": bottom_two_s,
        "fold_s": statistics.median(folds),
        "fold_new_origin_s": statistics.median(new_origin_folds),
        "decode_s": statistics.median(source.decode_s),
        "digest_s": digest_s,
        "encode_s": statistics.median(source.encode_s),
        "snapshot_bytes_per_param": size / total,
        "snapshot_build_bytes_per_param": (snapshot_peak - steady) / total,
        "snapshot_write_s": write_s,
        "snapshot_load_s": load_s,
        "checkpoint_bytes_per_param": checkpoint_size / total,
        "checkpoint_write_s": checkpoint_write_s,
        "restore_s": restore_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=1e7, help="about how many parameters (e.g. 1e8)")
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--codec", default="int4", choices=[c.value for c in Codec])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cosine", type=float, default=1.0,
                    help="about the cosine between two updates of a slot (default 1: one direction, scaled)")
    ap.add_argument("--json", type=Path, help="write the figures to this file")
    args = ap.parse_args()
    return_freed_memory()  # as the node does at start
    if not 0.0 < args.cosine <= 1.0:
        ap.error(f"--cosine must be in (0, 1], got {args.cosine}")
    figures = measure(int(args.params), args.peers, args.window, Codec(args.codec), args.seed, args.cosine)
    width = max(map(len, figures))
    for key, value in figures.items():
        print(f"{key:>{width}}: {value:.3f}" if isinstance(value, float) else f"{key:>{width}}: {value}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
