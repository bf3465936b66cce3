"""The HTTP plane against the libraries the review proposed for it, measured in the same run.

    python -m testnet.benchmarks.http_libraries [--mib 64] [--repeats 7] [--requests 400]

A second process serves the same random blob three ways over loopback: our `p2p.http.HttpApp` with
`p2p.blobserve.BlobService` (the node's server), a Starlette app with the same route written the
Starlette way (`Route("/blobs/{name}")`, a `StreamingResponse` of the same `os.pread` pieces; both on
hypercorn's trio worker), and a plain trio socket (the baseline testnet.benchmarks.blob_plane uses). This process fetches
it, alternating the order every round after one untimed warm-up of each:

- raw:            the raw socket into a preallocated buffer (what the wire can do here now);
- ours:           `p2p.blobfetch.BlobClient.fetch_once` from our server (the node's path: hashes,
                  writes and verifies into a BlobStore);
- httpx:          httpx streaming, `response.aiter_raw()`, into the same BlobStore writer through the same
                  pipeline (hash and write in a worker thread, 8 pieces queued, verified on commit);
- httpx 1 MiB:    the same with `aiter_raw(1 MiB)` (httpx joins h11's pieces into 1 MiB ones);
- ours@starlette: our client, Starlette serving.

Medians in Gbit/s, each as a ratio against `ours` and against the raw socket, CPU per GiB of the fetching
process and of the serving process (psutil, all threads). Then small requests: `--requests` sequential
`GET /status` (a small JSON answer) over one keep-alive httpx client, our router against Starlette's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import date
from pathlib import Path

import httpx
import psutil
import trio
from starlette.applications import Starlette
from starlette.requests import Request as StarletteRequest
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.responses import Response as StarletteResponse
from starlette.routing import Route

from testnet.benchmarks.blob_plane import TARGET_GBIT, gbit, raw_copy, serve_raw, start_serving_child
from p2p.blobfetch import BlobClient
from p2p.blobserve import BLOB_PREFIX, DEFAULT_CHUNK, BlobService
from p2p.blobstore import BlobStore, BlobWriter, check_hex
from p2p.counters import Counters
from p2p.http import HttpApp, Request, Response, serve_http
from p2p.transport import listener_addr, open_listener
from protocol.errors import LocalProtocolError

STATUS = {"peer_id": "12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3pq", "slot": 41, "round": 7,
          "state": "training", "peers": 15, "mesh": 6}
QUEUE = 8  # pieces in flight between the socket and the hashing thread (BlobClient's default)


def starlette_app(store: BlobStore, chunk_bytes: int = DEFAULT_CHUNK) -> Starlette:
    """`GET /blobs/{name}` and `GET /status` as a Starlette app: what p2p.http + blobserve would become."""

    async def blob(request: StarletteRequest) -> StarletteResponse:
        name = request.path_params["name"]
        try:
            check_hex(name)
            size = store.size(name)
            file = open(store.path(name), "rb", buffering=0)  # noqa: SIM115 - closed by body()
        except LocalProtocolError:
            return PlainTextResponse("bad blob name\n", 400)
        except (KeyError, FileNotFoundError):
            return PlainTextResponse("no such blob\n", 404)

        async def body() -> AsyncIterator[bytes]:
            sent = 0
            try:
                while sent < size:
                    piece = await trio.to_thread.run_sync(os.pread, file.fileno(), min(chunk_bytes, size - sent), sent)
                    if not piece:
                        break
                    sent += len(piece)
                    yield piece
            finally:
                file.close()

        return StreamingResponse(body(), media_type="application/octet-stream", headers={"content-length": str(size)})

    async def status(request: StarletteRequest) -> StarletteResponse:
        return JSONResponse(STATUS)

    return Starlette(routes=[Route(BLOB_PREFIX + "{name}", blob), Route("/status", status)])


async def serve_child(tmp: Path, mib: int) -> None:
    """`--serve` mode (the other process): serve one blob three ways, print where, stop when stdin closes."""
    store = BlobStore(tmp / "store")
    payload = os.urandom(mib << 20)
    name = store.put(payload)
    ours = HttpApp()
    BlobService(store, Counters()).mount(ours)

    async def status(request: Request) -> Response:
        return Response(200, json.dumps(STATUS).encode(), {"content-type": "application/json"})

    ours.route("GET", "/status", status)
    async with trio.open_nursery() as nursery:
        _, ours_port = await nursery.start(serve_http, ours, "127.0.0.1", 0)
        _, star_port = await nursery.start(serve_http, starlette_app(store), "127.0.0.1", 0)  # any ASGI app
        listener = await open_listener("127.0.0.1", 0)
        nursery.start_soon(serve_raw, listener, payload)
        print(json.dumps({"blob": name, "size": len(payload), "ours": ours_port, "starlette": star_port,
                          "raw": listener_addr(listener)[1]}), flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)
        nursery.cancel_scope.cancel()


async def httpx_fetch(client: httpx.AsyncClient, url: str, store: BlobStore, name: str, size: int,
                      piece: int | None) -> None:
    """httpx streaming into the store: the same verify-on-commit writer and hashing thread as BlobClient."""
    writer = store.open_writer(name, size)
    try:
        pieces_in, pieces_out = trio.open_memory_channel[bytes](QUEUE)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_write_pieces, pieces_out, writer)
            async with pieces_in, client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"GET {url}: {response.status_code}")
                async for data in response.aiter_raw(piece):
                    await pieces_in.send(data)
        await trio.to_thread.run_sync(writer.commit)
    finally:
        writer.close()


async def _write_pieces(pieces: trio.MemoryReceiveChannel[bytes], writer: BlobWriter) -> None:
    async with pieces:
        async for first in pieces:
            batch = [first]
            while True:
                try:
                    batch.append(pieces.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            await trio.to_thread.run_sync(lambda: [writer.write(p) for p in batch])


async def start_child(tmp: Path, mib: int) -> tuple[trio.Process, dict[str, int | str]]:
    return await start_serving_child("testnet.benchmarks.http_libraries", tmp, mib)


async def main(args: argparse.Namespace) -> None:
    if args.serve:
        await serve_child(Path(args.serve), args.mib)
        return
    with tempfile.TemporaryDirectory(prefix="http-libs-") as tmp_name:
        tmp = Path(tmp_name)
        child, info = await start_child(tmp, args.mib)
        server = psutil.Process(child.pid)
        name, size = str(info["blob"]), int(info["size"])
        ours_url, star_url = f"http://127.0.0.1:{info['ours']}", f"http://127.0.0.1:{info['starlette']}"
        store = BlobStore(tmp / "fetch")
        load_before = os.getloadavg()[0]
        async with BlobClient(store, Counters(), local_peer="bench") as ours, httpx.AsyncClient(timeout=30) as plain:

            def fresh() -> None:
                if store.has(name):
                    store.remove(name)

            async def raw() -> None:
                await raw_copy(int(info["raw"]), size)

            async def via_ours() -> None:
                fresh()
                await ours.fetch_once("bench", ours_url, name, size)

            async def via_httpx() -> None:
                fresh()
                await httpx_fetch(plain, f"{ours_url}{BLOB_PREFIX}{name}", store, name, size, None)

            async def via_httpx_mib() -> None:
                fresh()
                await httpx_fetch(plain, f"{ours_url}{BLOB_PREFIX}{name}", store, name, size, 1 << 20)

            async def via_starlette() -> None:
                fresh()
                await ours.fetch_once("bench", star_url, name, size)

            ways: dict[str, Callable[[], Awaitable[None]]] = {
                "raw": raw, "ours": via_ours, "httpx": via_httpx, "httpx 1 MiB": via_httpx_mib,
                "ours@starlette": via_starlette,
            }
            seconds: dict[str, list[float]] = {k: [] for k in ways}
            cpu = {k: [0.0, 0.0] for k in ways}  # fetching process, serving process
            for way in ways.values():
                await way()  # warm-up: connections, worker threads, page cache, allocator
            order = list(ways)
            for i in range(args.repeats):
                for key in order[i % len(order):] + order[: i % len(order)]:
                    c0, s0, t0 = time.process_time(), sum(server.cpu_times()[:2]), time.perf_counter()
                    await ways[key]()
                    seconds[key].append(time.perf_counter() - t0)
                    cpu[key][0] += time.process_time() - c0
                    cpu[key][1] += sum(server.cpu_times()[:2]) - s0
                    if key != "raw" and store.size(name) != size:
                        raise RuntimeError(f"{key}: the blob did not arrive whole")
            requests = {}
            for key, base in (("ours", ours_url), ("starlette", star_url)):
                for rep in range(2):  # the first pass warms up
                    t0 = time.perf_counter()
                    for _ in range(args.requests):
                        answer = await plain.get(f"{base}/status")
                        if answer.json() != STATUS:
                            raise RuntimeError(f"{key}: wrong /status answer")
                    requests[key] = args.requests / (time.perf_counter() - t0)
        await child.stdin.aclose()  # type: ignore[union-attr]
        await child.wait()

    n = args.mib << 20
    gib = n * args.repeats / 2**30
    med = {k: statistics.median(v) for k, v in seconds.items()}
    print(f"HTTP plane vs libraries, {date.today()}: {args.mib} MiB x {args.repeats} (+1 warm-up) over loopback,"
          f" serving process apart; httpx {httpx.__version__}; load {load_before:.1f} before,"
          f" {os.getloadavg()[0]:.1f} after, {os.cpu_count()} cores")
    print(f"  {'way':<16} {'median':>9} {'Gbit/s':>7} {'best':>6} {'/ ours':>7} {'/ raw':>6}"
          f" {'CPU ms/GiB fetch':>17} {'serve':>6}")
    for key in ways:
        print(f"  {key:<16} {med[key] * 1e3:7.1f}ms {gbit(n, med[key]):7.2f} {gbit(n, min(seconds[key])):6.2f}"
              f" {med['ours'] / med[key]:7.2f} {med['raw'] / med[key]:6.2f}"
              f" {cpu[key][0] / gib * 1e3:17.0f} {cpu[key][1] / gib * 1e3:6.0f}")
    verdict = {k: "met" if gbit(n, med[k]) >= TARGET_GBIT else "not met" for k in ("ours", "httpx", "httpx 1 MiB")}
    print(f"  target blob median >= {TARGET_GBIT:g} Gbit/s: " + ", ".join(f"{k} {v}" for k, v in verdict.items()))
    print(f"small requests: {args.requests} x GET /status, one keep-alive client: ours {requests['ours']:.0f}/s,"
          f" Starlette {requests['starlette']:.0f}/s, ratio {requests['starlette'] / requests['ours']:.2f}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=64, help="blob size")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--requests", type=int, default=400, help="sequential small requests per server")
    parser.add_argument("--serve", metavar="DIR", help=argparse.SUPPRESS)  # the child process's mode
    trio.run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
