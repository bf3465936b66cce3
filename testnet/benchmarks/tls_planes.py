"""Benchmark: a node's state sync and update intake over TLS 1.3 (the default) against cleartext
(`p2p.HostConfig(insecure=True)`), both measured in the same run (issue 47: "within 15%").

    python -m testnet.benchmarks.tls_planes    # w of 16 pieces (a 128 MiB bottom), 16 x 4 MiB updates, 9 repeats
    python -m testnet.benchmarks.tls_planes --pieces 32 --repeats 7 --json tls.json
    python -m testnet.benchmarks.tls_planes --split              # the serving side in a child process
    python -m testnet.benchmarks.tls_planes --link 1gbit,20ms    # ... and the two over an emulated link (root)

Three modes, the same measurement in each (TLS hosts against TLS hosts, cleartext hosts against cleartext hosts;
the two kinds refuse each other):

- **in-process** (the default): every host in this one process, on its one trio thread, over loopback. It pays
  the sender's and the receiver's TLS work (and, for cleartext, both ends' socket copies) on one core, so it
  overstates what TLS costs a deployment, where each machine pays one side.
- **`--split`**: the serving side (the donors, the publishers) in a child process
  (`testnet.benchmarks.tls_planes_remote`, driven by line commands over its stdin/stdout), the measuring side
  (the joiners, the receivers) here; still over loopback, but each end on its own core. Each process counts
  its own CPU time over the timed part (`time.process_time()`, the child reporting its own): CPU-s/GiB per side.
- **`--link RATE,DELAY`** (implies `--split`): the child in namespace 0 and this process in namespace 1 of a
  two-node `testnet.wan.WanNetwork` (this process enters it with setns(2)), the hosts listening on their
  namespace's address, so every byte crosses the emulated link (`RATE` per side, `DELAY` one-way: the round
  trip is twice it), as between two datacenters. The figures say how it was emulated (`testnet.wan.probe`'s
  reason: tc netem, or the user-space delay line, whose own CPU then shows in the machine's figure) and what
  the link carried.

What it measures:

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
the median (bytes moved / median seconds), CPU seconds per GiB moved of both sides together (in-process: this
process, all threads, user + system; split: the two processes' sum, and each side's: `receiver` the joiner's
or the receiving host's process, `sender` the donor's or the publisher's), the whole machine's busy CPU per
GiB (psutil; the delay line, the kernel's network work where it is not charged to a process, anything else
running), and the ratio TLS / cleartext of the median seconds (1.00: the same; 1.15: TLS takes 15% longer), of
the throughput and of the CPU. The target: seconds ratio <= 1.15.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import trio

import p2p
from node.sync.join import sync_state
from node.sync.stateserve import StateServer
from p2p import Kind
from protocol.ledger.digest import PIECE
from protocol.messages import UpdateHeader
from testnet.benchmarks.tls_planes_remote import CONFIG, KINDS, RUN, ServingChild, host_config, replica_of, until
from testnet.wan import LinkSpec, WanNetwork, probe

TARGET = 1.15  # the issue's: TLS within 15% of cleartext
GIB = 1 << 30
CLONE_NEWNET = 0x40000000  # setns(2)


@dataclasses.dataclass(frozen=True)
class Split:
    """The serving side in a child process started under `prefix` (`ip netns exec NS` over a link), its hosts
    listening on `remote_host`; this process's hosts on `local_host`."""

    prefix: tuple[str, ...] = ()
    local_host: str = "127.0.0.1"
    remote_host: str = "127.0.0.1"
    verbose: bool = False
    carried: Callable[[], dict[str, dict[str, int]]] = dict  # the link's counts (`WanNetwork.link_stats`)

    def child(self) -> contextlib.AbstractAsyncContextManager[ServingChild]:
        return ServingChild.open(self.prefix, self.verbose)

    def link_counts(self) -> tuple[int, int]:
        """(packets, bytes) the link has carried so far, all devices' sent counts (0, 0 without a delay line)."""
        counts = self.carried().values()
        return sum(c["sent_packets"] for c in counts), sum(c["sent_bytes"] for c in counts)


def machine_busy_s() -> float:
    """CPU seconds every process on this machine has used (psutil's cpu_times, all but idle, iowait, steal)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - t.iowait - t.steal


@contextlib.contextmanager
def inside(namespace: str) -> Iterator[None]:
    """This thread, and the threads it starts meanwhile (trio's workers), in `ip netns`'s network namespace
    `namespace`; back in this thread's own on leaving. Call it outside `trio.run`."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET):
            raise OSError(ctypes.get_errno(), f"setns into {namespace}: {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET):
                raise OSError(ctypes.get_errno(), f"setns back: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(home)
        os.close(target)


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


async def state_sync(tmp: Path, pieces: int, repeats: int, timeout_s: float,
                     split: Split | None = None) -> dict[str, list[dict[str, float]]]:
    """The joins (module doc); the donors in this process, or in a child with `split`."""
    shapes = {"w": (pieces * PIECE // 4,)}
    local = "127.0.0.1" if split is None else split.local_host
    async with (contextlib.nullcontext() if split is None else split.child()) as child, \
            trio.open_nursery() as nursery:
        donors: dict[str, p2p.Host] = {}
        peers: dict[str, tuple[str, str]] = {}  # kind -> the donor's (gossip address, peer id)
        digests: dict[str, tuple[bytes, bytes]] = {}
        if child is None:
            for k, kind in enumerate(KINDS):
                replica = replica_of(pieces, seed=k)
                donor = await nursery.start(p2p.run, host_config(tmp, f"donor-{kind}", kind))
                server = StateServer(donor)
                server.mount()
                server.replica = replica
                donors[kind], digests[kind] = donor, await replica.digests()
                peers[kind] = (donor.gossip_addr, donor.peer_id)
        else:
            answer = await child.ask("donors", split.remote_host, tmp / "remote", pieces, timeout_s=600)
            for kind in KINDS:
                peers[kind] = (answer[kind]["addr"], answer[kind]["peer"])
                ledger, params = (bytes.fromhex(h) for h in answer[kind]["digests"])
                digests[kind] = (ledger, params)
        count = 0

        async def one(kind: str) -> dict[str, float]:
            nonlocal count
            count += 1
            name = f"joiner-{kind}-{count}"
            address, peer = peers[kind]
            joiner = await nursery.start(p2p.run, host_config(tmp, name, kind, (address,), local))
            await until(lambda: peer in joiner.connected_peers(), 20, "the joiner's connection")
            last_piece = 0.0
            verified = 0

            def on_piece(peer: str, index: int) -> None:
                nonlocal last_piece, verified
                verified += 1
                last_piece = time.perf_counter()

            before = joiner.counters.total(Kind.BLOB).recv_bytes
            if child is not None:
                link0 = split.link_counts()
                await child.ask("mark")
            m0, c0, t0 = machine_busy_s(), time.process_time(), time.perf_counter()
            result = await sync_state(joiner, RUN, CONFIG, shapes, own=None, timeout_s=timeout_s, retry_s=0.05,
                                      on_piece=on_piece)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            row = {"seconds": seconds, "bottom_s": last_piece - t0, "cpu_s": cpu}
            if child is not None:
                row["cpu_remote_s"] = (await child.ask("cpu"))["cpu_s"]
            row["machine_cpu_s"] = machine_busy_s() - m0
            if child is not None:
                row["link_packets"], row["link_bytes"] = (b - a for a, b in zip(link0, split.link_counts()))
            row["bytes"] = joiner.counters.total(Kind.BLOB).recv_bytes - before
            if result is None or (result.ledger.ledger_digest(), result.ledger.params_digest()) != digests[kind]:
                raise RuntimeError(f"{kind}: the joined state is not the donor's")
            if verified != 2 * pieces:
                raise RuntimeError(f"{kind}: {verified} pieces verified, expected {2 * pieces}")
            del result
            await joiner.close()
            shutil.rmtree(tmp / name, ignore_errors=True)
            return row

        out = await alternate(repeats, one)
        for donor in donors.values():
            await donor.close()
        nursery.cancel_scope.cancel()
    return out


async def update_intake(tmp: Path, updates: int, mib: int, repeats: int, timeout_s: float,
                        split: Split | None = None) -> dict[str, list[dict[str, float]]]:
    """The intake (module doc); the publishers in this process, or in a child with `split`."""
    size = mib << 20
    local = "127.0.0.1" if split is None else split.local_host
    async with (contextlib.nullcontext() if split is None else split.child()) as child, \
            trio.open_nursery() as nursery:
        pairs: dict[str, tuple[p2p.Host | None, p2p.Host]] = {}  # kind -> (publisher here or None, receiver)
        received = {k: 0 for k in KINDS}
        got_bytes = {k: 0 for k in KINDS}

        async def consume(kind: str, host: p2p.Host) -> None:
            async for delivery in host.inbox:
                if isinstance(delivery.body, UpdateHeader):
                    received[kind] += 1
                    got_bytes[kind] += delivery.body.payload_size
                    if delivery.blob is not None:  # done with it (the node would apply it): free the disk
                        host.remove_blob(delivery.body.payload_sha256.hex())

        remote = {} if child is None else await child.ask("publishers", split.remote_host, tmp / "remote")
        for kind in KINDS:
            if child is None:
                publisher = await nursery.start(p2p.run, host_config(tmp, f"pub-{kind}", kind))
                address, peer = publisher.gossip_addr, publisher.peer_id
            else:
                publisher, address, peer = None, remote[kind]["addr"], remote[kind]["peer"]
            receiver = await nursery.start(p2p.run, host_config(tmp, f"recv-{kind}", kind, (address,), local))
            if publisher is None:
                await until(lambda: peer in receiver.connected_peers() and bool(receiver.router.mesh), 20,
                            "the pair's connection and mesh")
                await child.ask("meshed", kind, receiver.peer_id, 20)
            else:
                await until(lambda: publisher.peer_id in receiver.connected_peers()
                            and receiver.peer_id in publisher.connected_peers(), 20, "the pair's connection")
                await until(lambda: publisher.router.mesh and receiver.router.mesh, 20, "the pair's mesh")
            nursery.start_soon(consume, kind, receiver)
            pairs[kind] = (publisher, receiver)

        async def one(kind: str) -> dict[str, float]:
            publisher, receiver = pairs[kind]
            if publisher is None:
                await child.ask("draw", kind, updates, size)
                link0 = split.link_counts()
                await child.ask("mark")
            else:
                payloads = [os.urandom(size) for _ in range(updates)]
            target = received[kind] + updates
            b0 = got_bytes[kind]
            m0, c0, t0 = machine_busy_s(), time.process_time(), time.perf_counter()
            if publisher is None:
                await child.ask("publish", kind, timeout_s=timeout_s)
            else:
                for payload in payloads:
                    await publisher.publish_update(payload, base_slot=0, publish_slot=0, tokens=1, inner_steps=1,
                                                   codec="fp32", shapes=(("w", (size // 4,)),))
            await until(lambda: received[kind] >= target, timeout_s, f"{updates} {kind} updates in the inbox")
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
            row = {"seconds": seconds, "cpu_s": cpu}
            if publisher is None:
                row["cpu_remote_s"] = (await child.ask("cpu"))["cpu_s"]
                row["machine_cpu_s"] = machine_busy_s() - m0
                row["link_packets"], row["link_bytes"] = (b - a for a, b in zip(link0, split.link_counts()))
                await child.ask("forget", kind)
            else:
                row["machine_cpu_s"] = machine_busy_s() - m0
                for payload in payloads:  # the publisher's copies
                    publisher.store.remove(p2p.blob_hex(payload))
            row["bytes"] = got_bytes[kind] - b0
            return row

        out = await alternate(repeats, one)
        for publisher, receiver in pairs.values():
            await receiver.close()
            if publisher is not None:
                await publisher.close()
        nursery.cancel_scope.cancel()
    return out


def summarize(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Per kind: the median seconds, its throughput, CPU-s per GiB (both sides; with a child, also each side
    and the machine's); the ratios TLS / cleartext."""
    out: dict[str, Any] = {}
    for kind, rows in runs.items():
        median = statistics.median(r["seconds"] for r in rows)
        moved = statistics.median(r["bytes"] for r in rows)
        gib = sum(r["bytes"] for r in rows) / GIB
        receiver = sum(r["cpu_s"] for r in rows)
        sender = sum(r.get("cpu_remote_s", 0.0) for r in rows)
        out[kind] = {
            "median_s": median,
            "min_s": min(r["seconds"] for r in rows),
            "max_s": max(r["seconds"] for r in rows),
            "bytes": moved,
            "mb_s": moved / median / 1e6,
            "gbit_s": moved * 8 / median / 1e9,
            "cpu_s_per_gib": (receiver + sender) / gib,
            "cpu_s_per_gib_machine": sum(r["machine_cpu_s"] for r in rows) / gib,
            "seconds": [r["seconds"] for r in rows],
        }
        if "cpu_remote_s" in rows[0]:
            out[kind]["cpu_s_per_gib_receiver"] = receiver / gib
            out[kind]["cpu_s_per_gib_sender"] = sender / gib
        if rows[0].get("link_packets"):
            packets, carried = sum(r["link_packets"] for r in rows), sum(r["link_bytes"] for r in rows)
            out[kind]["link_bytes_per_packet"] = carried / packets
            out[kind]["link_bytes_per_payload_byte"] = carried / sum(r["bytes"] for r in rows)
        if "bottom_s" in rows[0]:
            out[kind]["bottom_median_s"] = statistics.median(r["bottom_s"] for r in rows)
    out["ratio_seconds"] = out["tls"]["median_s"] / out["cleartext"]["median_s"]
    out["ratio_throughput"] = out["tls"]["mb_s"] / out["cleartext"]["mb_s"]
    out["ratio_cpu_per_gib"] = out["tls"]["cpu_s_per_gib"] / out["cleartext"]["cpu_s_per_gib"]
    for side in ("receiver", "sender"):
        if f"cpu_s_per_gib_{side}" in out["tls"]:
            out[f"ratio_cpu_per_gib_{side}"] = (out["tls"][f"cpu_s_per_gib_{side}"]
                                                / out["cleartext"][f"cpu_s_per_gib_{side}"])
    if "bottom_median_s" in out["tls"]:
        out["ratio_bottom_seconds"] = out["tls"]["bottom_median_s"] / out["cleartext"]["bottom_median_s"]
    out["target_met"] = out["ratio_seconds"] <= TARGET
    return out


def report(title: str, s: dict[str, Any]) -> None:
    print(title)
    for kind in KINDS:
        k = s[kind]
        extra = f"; last bottom piece at {k['bottom_median_s']:.3f} s" if "bottom_median_s" in k else ""
        sides = (f" (receiver {k['cpu_s_per_gib_receiver']:.2f} + sender {k['cpu_s_per_gib_sender']:.2f}; "
                 f"machine {k['cpu_s_per_gib_machine']:.2f})" if "cpu_s_per_gib_sender" in k else "")
        if "link_bytes_per_packet" in k:
            extra += (f"; link {k['link_bytes_per_payload_byte']:.3f} bytes per payload byte, "
                      f"{k['link_bytes_per_packet']:.0f} per packet")
        print(f"  {kind:9s} median {k['median_s']:7.3f} s (min {k['min_s']:.3f}, max {k['max_s']:.3f}) = "
              f"{k['mb_s']:6.0f} MB/s = {k['gbit_s']:5.2f} Gbit/s; CPU-s/GiB {k['cpu_s_per_gib']:5.2f}{sides}{extra}")
    print(f"  ratio TLS / cleartext: seconds {s['ratio_seconds']:.3f}, throughput {s['ratio_throughput']:.3f}, "
          f"CPU per GiB {s['ratio_cpu_per_gib']:.3f}"
          + (f" (receiver {s['ratio_cpu_per_gib_receiver']:.3f}, sender {s['ratio_cpu_per_gib_sender']:.3f})"
             if "ratio_cpu_per_gib_sender" in s else "")
          + (f", until the last bottom piece {s['ratio_bottom_seconds']:.3f}" if "ratio_bottom_seconds" in s else "")
          + f"  -> within 15%: {'yes' if s['target_met'] else 'NO'}")


async def main(args: argparse.Namespace, split: Split | None = None) -> dict[str, Any]:
    """Both parts (module doc); the serving side in this process, or in a child with `split`."""
    figures: dict[str, Any] = {"args": vars(args).copy(),
                               "mode": "in-process" if split is None else "split" if args.link is None else "link"}
    load = [os.getloadavg()]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tls-planes-") as tmp:
        if args.pieces > 0:
            runs = await state_sync(Path(tmp) / "sync", args.pieces, args.repeats, args.timeout, split)
            load.append(os.getloadavg())
            s = figures["state_sync"] = summarize(runs)
            report(f"state sync: sync_state of a {2 * args.pieces}-piece bottom ({2 * args.pieces * PIECE >> 20} MiB; "
                   f"{s['tls']['bytes'] / 1e6:.0f} MB received per join), {args.repeats} repeats (+1 warm-up) of each",
                   s)
        if args.updates > 0:
            runs = await update_intake(Path(tmp) / "intake", args.updates, args.update_mib, args.repeats, args.timeout,
                                       split)
            load.append(os.getloadavg())
            s = figures["update_intake"] = summarize(runs)
            report(f"update intake: {args.updates} x {args.update_mib} MiB updates published until all are in the "
                   f"other host's inbox, {args.repeats} repeats (+1 warm-up) of each", s)
    figures["wall_s"] = time.perf_counter() - t_start
    figures["loadavg"] = [list(x) for x in load]
    print(f"load average (1, 5, 15 min) at start {' '.join(f'{x:.2f}' for x in load[0])}, "
          f"at end {' '.join(f'{x:.2f}' for x in load[-1])}; {os.cpu_count()} CPUs; {figures['wall_s']:.0f} s")
    return figures


def over_link(args: argparse.Namespace) -> dict[str, Any]:
    """`main` with the serving side in namespace 0 of a two-node `WanNetwork` and this process in namespace 1,
    so every byte crosses the emulated link. Raises SystemExit when the link cannot be emulated here."""
    spec = LinkSpec.parse(args.link)
    support = probe(spec)
    if not support.available:
        raise SystemExit(f"cannot emulate the link: {support.reason}")
    net = WanNetwork(2, spec, support.qdisc or "netem")
    net.setup()
    try:
        print(f"link: {spec} per side, {2 * spec.delay_ms:g} ms round trip ({support.reason}); serving side at "
              f"{net.host(0)} ({net.namespace(0)}), measuring side at {net.host(1)} ({net.namespace(1)})")
        split = Split(tuple(net.exec_prefix(0)), net.host(1), net.host(0), args.verbose, net.link_stats)
        with inside(net.namespace(1)):
            figures = trio.run(main, args, split)
        figures["link"] = {"spec": str(spec), "rate_mbit": spec.rate_mbit, "delay_ms": spec.delay_ms,
                           "loss_pct": spec.loss_pct, "rtt_ms": 2 * spec.delay_ms, "emulation": support.reason,
                           "qdisc": support.qdisc, "carried": net.link_stats()}
    finally:
        net.teardown()
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
    parser.add_argument("--split", action="store_true",
                        help="the serving side (donors, publishers) in a child process; CPU reported per side")
    parser.add_argument("--link", metavar="RATE,DELAY",
                        help="both processes in namespaces joined by this emulated link (testnet.wan.LinkSpec, "
                             "e.g. 1gbit,20ms: the rate per side, the delay one-way); implies --split; needs root")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--verbose", action="store_true", help="log the hosts' info lines")
    args = parser.parse_args(argv)
    if args.link is not None:
        try:
            LinkSpec.parse(args.link)
        except ValueError as e:
            parser.error(f"--link: {e}")
        args.split = True
    return args


def cli(argv: list[str] | None = None) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.link is not None:
        figures = over_link(args)
    else:
        figures = trio.run(main, args, Split(verbose=args.verbose) if args.split else None)
        figures["link"] = None
    if args.json is not None:
        figures["args"]["json"] = str(args.json)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    cli()
