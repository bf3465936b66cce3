"""Benchmark: a node's state sync and update intake over TLS 1.3 (the default) against cleartext
(`p2p.HostConfig(insecure=True)`), both measured in the same run (issue 47: "within 15%").

    python -m testnet.benchmarks.tls_planes    # w of 16 pieces (a 128 MiB bottom), 16 x 4 MiB updates, 9 repeats
    python -m testnet.benchmarks.tls_planes --pieces 32 --repeats 7 --json tls.json

What it measures, all hosts in this one process over loopback (TLS hosts against TLS hosts, cleartext hosts
against cleartext hosts; the two kinds refuse each other):

1. **State sync**: a donor host serves a replica (`node.outer.replica.Replica`) of a ledger with one tensor
   `w` of `--pieces` pieces of `protocol.ledger.digest.PIECE` (4 MiB) and a non-zero momentum, so the window
   bottom (theta/w and momentum/w) is 2 x `--pieces` pieces, with `node.sync.stateserve.StateServer`. A fresh
   joiner host (its own data directory, removed afterwards) connects to it, and the clock runs over the real
   join path, `node.sync.join.sync_state(..., own=None)`: `GET /state` (the signed manifest), the meta blob,
   every bottom piece (`GET /state/bottom/...`, each verified against its hash) into a part file, and the
   ledger loaded from it (non-finite check, copy into the ledger, digests against the manifest). The joiner's
   connection and TLS handshake to the donor are before the clock starts; the HTTP connections the join opens
   are inside it. Also reported: the time until the last bottom piece was verified (the download alone).
2. **Update intake**: a publisher host publishes `--updates` updates of `--update-mib` MiB of random bytes
   (`Host.publish_update`, codec fp32), one after another; the clock runs until the receiving host has read
   all of them from its inbox (each header verified, the payload fetched over the blob plane, hashed, stored
   and verified). Payloads are drawn before the clock starts. The publisher and receiver stay connected
   across repeats (one pair per kind).

Order: one untimed warm-up of each kind (connections, worker threads, the donor's frozen bottom, page cache),
then `--repeats` rounds of both kinds, the order rotated each round (TLS first on even rounds, cleartext first
on odd ones) so background load hits both alike. Reported: the median seconds of each kind, the throughput of
the median (bytes moved / median seconds), CPU seconds of this process (all threads, user + system; sender
and receiver are both here) per GiB moved, and the ratio TLS / cleartext of the median seconds (1.00: the
same; 1.15: TLS takes 15% longer) and of the throughput. The target: seconds ratio <= 1.15.

Both ends run on this process's one trio thread, so it pays the sender's and the receiver's TLS work (and
the cleartext run both ends' socket copies); in a deployment each machine pays one side.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import trio

import p2p
from node.outer.replica import Replica
from node.sync.join import sync_state
from node.sync.stateserve import StateServer
from p2p import Kind
from protocol.gossip import GossipConfig
from protocol.identity import Identity
from protocol.ledger import Ledger, LedgerConfig
from protocol.ledger.digest import PIECE
from protocol.messages import UpdateHeader

RUN = "tls-planes-bench"
CONFIG = LedgerConfig(window=2)
KINDS = ("tls", "cleartext")
TARGET = 1.15  # the issue's: TLS within 15% of cleartext
GIB = 1 << 30


def host_config(tmp: Path, name: str, kind: str, bootstrap: tuple[str, ...] = ()) -> p2p.HostConfig:
    return p2p.HostConfig(identity=Identity.generate(), run_id=RUN, data_dir=tmp / name,
                          gossip=GossipConfig(run_id=RUN), bootstrap=bootstrap, insecure=kind == "cleartext",
                          goodbye_flush_s=0.2)


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    with trio.move_on_after(timeout_s):
        while not predicate():
            await trio.sleep(0.005)
        return
    raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")


def replica_of(pieces: int, seed: int) -> Replica:
    """A replica whose window bottom is `w` (`pieces` pieces of float32) and its momentum (as many)."""
    rng = np.random.default_rng(seed)
    n = pieces * PIECE // 4
    params = {"w": rng.standard_normal(n, dtype=np.float32)}
    momentum = {"w": rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)}
    return Replica(Ledger(params, CONFIG, momentum))


async def alternate(repeats: int,
                    one: Callable[[str], Awaitable[dict[str, float]]]) -> dict[str, list[dict[str, float]]]:
    """One untimed warm-up of each kind, then `repeats` rounds in rotating order; `one(kind)` measures."""
    for kind in KINDS:
        await one(kind)
    out: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
    for i in range(repeats):
        for kind in KINDS[i % 2:] + KINDS[:i % 2]:
            out[kind].append(await one(kind))
    return out


async def state_sync(tmp: Path, pieces: int, repeats: int, timeout_s: float) -> dict[str, list[dict[str, float]]]:
    shapes = {"w": (pieces * PIECE // 4,)}
    async with trio.open_nursery() as nursery:
        donors: dict[str, p2p.Host] = {}
        digests: dict[str, tuple[bytes, bytes]] = {}
        for k, kind in enumerate(KINDS):
            replica = replica_of(pieces, seed=k)
            donor = await nursery.start(p2p.run, host_config(tmp, f"donor-{kind}", kind))
            server = StateServer(donor)
            server.mount()
            server.replica = replica
            donors[kind], digests[kind] = donor, await replica.digests()
        count = 0

        async def one(kind: str) -> dict[str, float]:
            nonlocal count
            count += 1
            name = f"joiner-{kind}-{count}"
            joiner = await nursery.start(p2p.run, host_config(tmp, name, kind, (donors[kind].gossip_addr,)))
            await until(lambda: donors[kind].peer_id in joiner.connected_peers(), 20, "the joiner's connection")
            last_piece = 0.0
            verified = 0

            def on_piece(peer: str, index: int) -> None:
                nonlocal last_piece, verified
                verified += 1
                last_piece = time.perf_counter()

            before = joiner.counters.total(Kind.BLOB).recv_bytes
            c0, t0 = time.process_time(), time.perf_counter()
            result = await sync_state(joiner, RUN, CONFIG, shapes, own=None, timeout_s=timeout_s, retry_s=0.05,
                                      on_piece=on_piece)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            moved = joiner.counters.total(Kind.BLOB).recv_bytes - before
            if result is None or (result.ledger.ledger_digest(), result.ledger.params_digest()) != digests[kind]:
                raise RuntimeError(f"{kind}: the joined state is not the donor's")
            if verified != 2 * pieces:
                raise RuntimeError(f"{kind}: {verified} pieces verified, expected {2 * pieces}")
            del result
            await joiner.close()
            shutil.rmtree(tmp / name, ignore_errors=True)
            return {"seconds": seconds, "bottom_s": last_piece - t0, "cpu_s": cpu, "bytes": moved}

        out = await alternate(repeats, one)
        for donor in donors.values():
            await donor.close()
        nursery.cancel_scope.cancel()
    return out


async def update_intake(tmp: Path, updates: int, mib: int, repeats: int,
                        timeout_s: float) -> dict[str, list[dict[str, float]]]:
    size = mib << 20
    async with trio.open_nursery() as nursery:
        pairs: dict[str, tuple[p2p.Host, p2p.Host]] = {}
        received = {k: 0 for k in KINDS}
        got_bytes = {k: 0 for k in KINDS}

        async def consume(kind: str, host: p2p.Host) -> None:
            async for delivery in host.inbox:
                if isinstance(delivery.body, UpdateHeader):
                    received[kind] += 1
                    got_bytes[kind] += delivery.body.payload_size
                    if delivery.blob is not None:  # done with it (the node would apply it): free the disk
                        host.store.remove(delivery.body.payload_sha256.hex())

        for kind in KINDS:
            publisher = await nursery.start(p2p.run, host_config(tmp, f"pub-{kind}", kind))
            receiver = await nursery.start(p2p.run, host_config(tmp, f"recv-{kind}", kind, (publisher.gossip_addr,)))
            await until(lambda: publisher.peer_id in receiver.connected_peers()
                        and receiver.peer_id in publisher.connected_peers(), 20, "the pair's connection")
            await until(lambda: publisher.router.mesh and receiver.router.mesh, 20, "the pair's mesh")
            nursery.start_soon(consume, kind, receiver)
            pairs[kind] = (publisher, receiver)

        async def one(kind: str) -> dict[str, float]:
            publisher, receiver = pairs[kind]
            payloads = [os.urandom(size) for _ in range(updates)]
            target = received[kind] + updates
            b0 = got_bytes[kind]
            c0, t0 = time.process_time(), time.perf_counter()
            for payload in payloads:
                await publisher.publish_update(payload, base_slot=0, publish_slot=0, tokens=1, inner_steps=1,
                                               codec="fp32", shapes=(("w", (size // 4,)),))
            await until(lambda: received[kind] >= target, timeout_s, f"{updates} {kind} updates in the inbox")
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            for payload in payloads:  # the publisher's copies
                publisher.store.remove(p2p.blob_hex(payload))
            return {"seconds": seconds, "cpu_s": cpu, "bytes": got_bytes[kind] - b0}

        out = await alternate(repeats, one)
        for publisher, receiver in pairs.values():
            await receiver.close()
            await publisher.close()
        nursery.cancel_scope.cancel()
    return out


def summarize(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, rows in runs.items():
        median = statistics.median(r["seconds"] for r in rows)
        moved = statistics.median(r["bytes"] for r in rows)
        out[kind] = {
            "median_s": median,
            "min_s": min(r["seconds"] for r in rows),
            "max_s": max(r["seconds"] for r in rows),
            "bytes": moved,
            "mb_s": moved / median / 1e6,
            "gbit_s": moved * 8 / median / 1e9,
            "cpu_s_per_gib": sum(r["cpu_s"] for r in rows) / (sum(r["bytes"] for r in rows) / GIB),
            "seconds": [r["seconds"] for r in rows],
        }
        if "bottom_s" in rows[0]:
            out[kind]["bottom_median_s"] = statistics.median(r["bottom_s"] for r in rows)
    out["ratio_seconds"] = out["tls"]["median_s"] / out["cleartext"]["median_s"]
    out["ratio_throughput"] = out["tls"]["mb_s"] / out["cleartext"]["mb_s"]
    out["ratio_cpu_per_gib"] = out["tls"]["cpu_s_per_gib"] / out["cleartext"]["cpu_s_per_gib"]
    if "bottom_median_s" in out["tls"]:
        out["ratio_bottom_seconds"] = out["tls"]["bottom_median_s"] / out["cleartext"]["bottom_median_s"]
    out["target_met"] = out["ratio_seconds"] <= TARGET
    return out


def report(title: str, s: dict[str, Any]) -> None:
    print(title)
    for kind in KINDS:
        k = s[kind]
        extra = f"; last bottom piece at {k['bottom_median_s']:.3f} s" if "bottom_median_s" in k else ""
        print(f"  {kind:9s} median {k['median_s']:7.3f} s (min {k['min_s']:.3f}, max {k['max_s']:.3f}) = "
              f"{k['mb_s']:6.0f} MB/s = {k['gbit_s']:5.2f} Gbit/s; CPU-s/GiB {k['cpu_s_per_gib']:5.2f}{extra}")
    print(f"  ratio TLS / cleartext: seconds {s['ratio_seconds']:.3f}, throughput {s['ratio_throughput']:.3f}, "
          f"CPU per GiB {s['ratio_cpu_per_gib']:.3f}"
          + (f", until the last bottom piece {s['ratio_bottom_seconds']:.3f}" if "ratio_bottom_seconds" in s else "")
          + f"  -> within 15%: {'yes' if s['target_met'] else 'NO'}")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"args": vars(args).copy()}
    load = [os.getloadavg()]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tls-planes-") as tmp:
        if args.pieces > 0:
            runs = await state_sync(Path(tmp) / "sync", args.pieces, args.repeats, args.timeout)
            load.append(os.getloadavg())
            s = figures["state_sync"] = summarize(runs)
            report(f"state sync: sync_state of a {2 * args.pieces}-piece bottom ({2 * args.pieces * PIECE >> 20} MiB; "
                   f"{s['tls']['bytes'] / 1e6:.0f} MB received per join), {args.repeats} repeats (+1 warm-up) of each",
                   s)
        if args.updates > 0:
            runs = await update_intake(Path(tmp) / "intake", args.updates, args.update_mib, args.repeats, args.timeout)
            load.append(os.getloadavg())
            s = figures["update_intake"] = summarize(runs)
            report(f"update intake: {args.updates} x {args.update_mib} MiB updates published until all are in the "
                   f"other host's inbox, {args.repeats} repeats (+1 warm-up) of each", s)
    figures["wall_s"] = time.perf_counter() - t_start
    figures["loadavg"] = [list(x) for x in load]
    print(f"load average (1, 5, 15 min) at start {' '.join(f'{x:.2f}' for x in load[0])}, "
          f"at end {' '.join(f'{x:.2f}' for x in load[-1])}; {os.cpu_count()} CPUs; {figures['wall_s']:.0f} s")
    return figures


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m testnet.benchmarks.tls_planes",
        description="State sync and update intake over TLS against cleartext, in one run (see the module docstring).")
    parser.add_argument("--pieces", type=int, default=16,
                        help="pieces (4 MiB) of the tensor w; the bottom is twice that (theta and momentum); "
                             "0 skips the state sync (default 16: a 128 MiB bottom)")
    parser.add_argument("--updates", type=int, default=16, help="updates per intake repeat; 0 skips it (default 16)")
    parser.add_argument("--update-mib", type=int, default=4, help="MiB per update payload (default 4)")
    parser.add_argument("--repeats", type=int, default=9, help="timed repeats of each kind (default 9)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one repeat may take (default 120)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--verbose", action="store_true", help="log the hosts' info lines")
    return parser.parse_args(argv)


def cli(argv: list[str] | None = None) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    figures = trio.run(main, args)
    if args.json is not None:
        figures["args"]["json"] = str(args.json)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    cli()
