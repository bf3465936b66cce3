"""Blob goodput over an emulated WAN: one stream from one holder against byte ranges from several.

    python -m testnet.benchmarks.wan_blobs [--mib 100] [--rate 1gbit] [--rtt-ms 40 80] [--repeats 2] [--json FILE]

Three namespaces behind emulated links (`testnet.wan`: rate by tbf, one-way delay by netem or the delay
line): two holders serve the same blob over the blob plane (`p2p.blobserve`; cleartext by default, which
measures the link and not TLS's CPU, `--tls` for TLS 1.3 as between nodes), the third fetches it
(`p2p.blobfetch.BlobClient`) as the node did before (`fetch_once`: one connection to one holder), in 4 ranges
from one holder, and in 4 ranges from both (what a node now does for a blob of at least
`HostConfig.range_fetch_bytes`). Prints goodput ÷ the link rate for each, per round trip; the
ratio is the figure (1 would be the whole shaped rate as blob bytes; TCP/IP headers take ~3%). Needs root.

Beside it, `cold_tcp_seconds`: the least time any fetch over fresh TCP connections could take, a model and
not a measurement. Each connection costs round trips before its first body byte (handshake, TLS, request),
then starts at the initial window (10 segments) and doubles it each round trip until the windows together
hold the path's bandwidth × delay. At 80 ms and 1 Gbit/s that start-up moves ~15 MB in ~0.8 s, so a
100 MiB blob cannot pass ~0.55 of the rate on cold connections, however many streams; a 1 GiB blob can.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from testnet.wan import LinkSpec, WanNetwork, probe

HOLDER = """
import functools, sys, trio, numpy as np
from pathlib import Path
from p2p.blobserve import BlobService
from p2p.blobstore import BlobStore
from p2p.counters import Counters
from p2p.http import HttpApp, serve_http
from p2p.tls import Credentials
from protocol.identity import Identity

async def main(host, folder, mib, tls):
    store = BlobStore(Path(folder))
    data = np.random.default_rng(7).integers(0, 256, mib << 20, dtype=np.uint8).tobytes()
    name = store.put(data)
    app = HttpApp()
    BlobService(store, Counters()).mount(app)
    identity = Identity.generate()
    serve = functools.partial(serve_http, tls=Credentials(identity).http_server if tls else None)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, app, host, 8700)
        print(name, len(data), identity.peer_id if tls else "A", flush=True)

trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "tls")
"""

FETCHER = """
import json, sys, time, trio
from pathlib import Path
from p2p.blobfetch import BlobClient
from p2p.blobstore import BlobStore
from p2p.counters import Counters

async def main(folder, name, size, sources, modes, repeats, streams, tls):
    from p2p.tls import Credentials
    from protocol.identity import Identity
    credentials = Credentials(Identity.generate()) if tls else None
    out = {}
    for mode in modes:
        times = []
        for r in range(repeats):
            store = BlobStore(Path(folder) / f"{mode}-{r}")
            async with BlobClient(store, Counters(), local_peer="F", credentials=credentials) as client:
                start = time.perf_counter()
                if mode == "one_stream":
                    await client.fetch_once(sources[0][0], sources[0][1], name, size)
                elif mode == "ranges_one_holder":
                    await client.fetch_ranges(sources[:1], name, size, streams)
                else:
                    await client.fetch_ranges(sources, name, size, streams)
                times.append(time.perf_counter() - start)
            store.remove(name)
        out[mode] = times
    print(json.dumps(out), flush=True)

trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5].split(","),
         int(sys.argv[6]), int(sys.argv[7]), sys.argv[8] == "tls")
"""

MODES = ("one_stream", "ranges_one_holder", "ranges_two_holders")
SEGMENT = 1448  # TCP payload bytes per segment at a 1500-byte MTU
INITIAL_WINDOW = 10 * SEGMENT  # RFC 6928


def cold_tcp_seconds(size: int, rate_bps: float, rtt: float, streams: int, tls: bool) -> float:
    """The least time `streams` fresh TCP connections need to move `size` bytes at `rate_bps` over `rtt`
    (module docstring): setup round trips, then slow start until the windows fill the path, then the rate."""
    seconds = rtt * (3 if tls else 2)  # SYN/SYN-ACK, the TLS 1.3 handshake, the request to the first bytes
    window, sent = streams * INITIAL_WINDOW, 0
    while sent < size and window * 8 < rate_bps * rtt:
        step = min(window, size - sent)
        sent += step
        seconds += rtt if sent < size else step * 8 / rate_bps
        window *= 2
    return seconds + (size - sent) * 8 / rate_bps


def measure(spec: LinkSpec, qdisc: str, mib: int, repeats: int, workdir: Path,
            streams: int, tls: bool) -> dict[str, list[float]]:
    net = WanNetwork(3, spec, qdisc)
    net.setup()
    holders = []
    try:
        for i in (0, 1):
            holders.append(subprocess.Popen([*net.exec_prefix(i), sys.executable, "-c", HOLDER, net.host(i),
                                             str(workdir / f"holder-{i}"), str(mib), "tls" if tls else "clear"],
                                            stdout=subprocess.PIPE, text=True))
        scheme = "https" if tls else "http"
        sources = []
        for i, proc in enumerate(holders):
            name, size, peer = proc.stdout.readline().split()
            sources.append([peer if tls else "AB"[i], f"{scheme}://{net.host(i)}:8700"])
        done = subprocess.run([*net.exec_prefix(2), sys.executable, "-c", FETCHER, str(workdir / "fetcher"), name,
                               size, json.dumps(sources), ",".join(MODES), str(repeats), str(streams),
                               "tls" if tls else "clear"],
                              capture_output=True, text=True, timeout=1800)
        if done.returncode:
            raise RuntimeError(f"the fetcher failed: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()
        net.teardown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.benchmarks.wan_blobs", description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=100, help="blob size in MiB (default 100)")
    p.add_argument("--rate", default="1gbit", help="each node's link rate (default 1gbit)")
    p.add_argument("--rtt-ms", type=float, nargs="+", default=[40.0, 80.0], help="round trips to measure")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--streams", type=int, default=4, help="ranges at once (the node's fetch_streams; default 4)")
    p.add_argument("--tls", action="store_true", help="over TLS 1.3, as between nodes (default: cleartext)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/diloco-wan-blobs"))
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    results = []
    for rtt in a.rtt_ms:
        spec = LinkSpec.parse(f"{a.rate},{rtt / 2:g}ms")
        support = probe(spec)
        if not support.available:
            print(f"cannot emulate the link: {support.reason}", file=sys.stderr)
            return 2
        times = measure(spec, support.qdisc or "netem", a.mib, a.repeats, a.workdir / f"rtt{rtt:g}", a.streams, a.tls)
        bits = (a.mib << 20) * 8
        row = {"rtt_ms": rtt, "rate_mbit": spec.rate_mbit, "mib": a.mib, "streams": a.streams, "link": str(spec),
               "emulation": support.reason, "tls": a.tls}
        print(f"{a.mib} MiB blob, {spec} per node, {rtt:g} ms RTT, {a.streams} ranges at once, "
              f"{'TLS 1.3' if a.tls else 'cleartext'} ({support.reason})")
        for mode in MODES:
            best = min(times[mode])
            ratio = bits / best / (spec.rate_mbit * 1e6)
            row[mode] = {"seconds": times[mode], "goodput_mbit": bits / best / 1e6, "goodput_over_rate": ratio}
            print(f"  {mode:<20} {statistics.median(times[mode]):7.2f} s (best {best:.2f}) "
                  f"{bits / best / 1e6:8.1f} Mbit/s  goodput / rate {ratio:.3f}")
        bound = bits / cold_tcp_seconds(a.mib << 20, spec.rate_mbit * 1e6, rtt / 1000, a.streams, a.tls)
        row["cold_tcp_bound_over_rate"] = bound / (spec.rate_mbit * 1e6)
        print(f"  {'cold-TCP bound':<20} goodput / rate {row['cold_tcp_bound_over_rate']:.3f} "
              f"(a model: {a.streams} fresh connections' slow start, no loss)")
        results.append(row)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
