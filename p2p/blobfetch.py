"""Fetching one blob from one holder over HTTP, verified on arrival.

`BlobClient.fetch_ranges(sources, name, size, streams)` fetches one blob as `streams` contiguous byte ranges
at once (`Range` requests, `p2p.blobserve`), each over its own connection and, with several holders, from
different ones; a range whose source fails is resumed from the next source at the byte it reached. Over a
path of large bandwidth × delay one TCP stream is held to its socket buffer's worth per round trip (4 MiB
of send buffer at 80 ms: ~400 Mbit/s), so several streams fill the link. The ranges go into one part file
(`PieceWriter`), which is hashed once whole before the blob becomes visible.

Contract of `BlobClient.fetch_once(peer, base_url, name, size)`:
- streams `GET <base_url>/blobs/<name>` into the store's `.part` file; a worker thread hashes and
  writes the bytes while the next ones arrive, and the blob becomes visible only after its SHA-256
  matched (`BlobWriter.commit`);
- on success the blob is in the store (verified) and the byte counters say who sent it;
- a holder that sends the wrong bytes raises `RemoteProtocolError` (HASH_MISMATCH, OVERSIZED,
  TRUNCATED, or MALFORMED for a body without a Content-Length), one that cannot be reached, resets or
  closes the connection mid-body, sends no body bytes for `timeout` seconds or answers non-200 raises
  `TransportError` (404, the holder removed the blob: `BlobGone`), and so does a local file error;
- a holder that sends slower than `min_rate` bytes per second, counted from `grace` seconds after the
  request (the response head included; time spent waiting on our own disk does not count), raises
  `RemoteProtocolError(TOO_SLOW)`: a tarpit that trickles a byte now and then cannot hold a download
  slot for longer than `grace` plus the blob's size at `min_rate`. Nothing else
  escapes but cancellation (and bugs): never an exception group (`_one_exception`). Choosing the next
  holder is the router's decision, not this module's.

The body moves through `queue_chunks` reused buffers of `read_bytes` each, so nothing is allocated
per chunk and at most `queue_chunks` buffers of one download are in memory:

    socket --recv_into--> free buffer --> sha256 + file write (worker thread) --> free again

Why not iterate the body through httpx (measured with `python -m testnet.benchmarks.blob_plane` on the 2-core development
VM): h11 and httpcore copy each body byte four times through freshly allocated ~1 MiB objects, and
glibc returns such blocks to the kernel and faults them in again (130k-220k page faults per GiB);
that cost about as much CPU as the SHA-256. So the request and the response head go through httpx,
httpcore and h11 as usual, a `LinkStream` that stops at the head (`p2p.httpclient`) makes sure h11 gets no byte past it, and
`_Body.readinto` reads the Content-Length body straight from the link (the socket, or the TLS object
into the buffer). The price:
httpcore closes that connection instead of reusing it (h11 never saw the end of the body), so each
download opens its own TCP connection, one more round trip per blob.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import httpcore
import httpx
import trio

from p2p.blobserve import BLOB_PREFIX, PEER_HEADER
from p2p.blobstore import BlobStore, BlobWriter, Section
from p2p.counters import Counters, Kind
from p2p.errors import BlobGone, LocalStoreError, TransportError
from p2p.httpclient import CoreBody, LinkStream, LinkTransport, membership_headers
from p2p.tls import Credentials
from protocol.errors import Reason, RemoteProtocolError

log = logging.getLogger("p2p.blobs")

DEFAULT_READ = 1 << 20
_BODY = "diloco.body"  # the response extension that carries the `_Body`


class _PoolTransport(LinkTransport):
    """The blob client's transport: links that stop at the response head (`LinkStream.stop_at_head`), and each
    response carries its `_Body` in `response.extensions[_BODY]`."""

    def __init__(self, credentials: Credentials | None, max_connections: int) -> None:
        super().__init__(credentials, max_connections=max_connections, stop_at_head=True)

    def respond(self, response: httpcore.Response) -> httpx.Response:
        network = response.extensions["network_stream"]
        if not isinstance(network, LinkStream):
            raise httpx.TransportError(f"unexpected network stream {type(network).__name__}")
        body = _Body(response.stream, network, _content_length(response.headers))
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=body,
            extensions={**response.extensions, _BODY: body},
        )


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    values = {v.strip() for k, v in headers if k.lower() == b"content-length"}
    if len(values) != 1 or not next(iter(values)).isdigit():
        return None  # absent or ambiguous: h11 rejects the ambiguous ones anyway
    return int(next(iter(values)))


class _Body(CoreBody):
    """One response body. Iterating it yields the chunks h11 parses (any response).

    `readinto(view)` is the fast path for a Content-Length body, for one reader that uses nothing
    else: it receives body bytes straight from the socket into the caller's buffer, never past the
    Content-Length (the `LinkStream` left them all there). `readinto` has no timeout of its own: the
    caller bounds it. Afterwards httpcore closes the connection (h11 never saw the end of the body).
    """

    def __init__(self, inner: Any, network: LinkStream, length: int | None) -> None:
        super().__init__(inner)
        self._network = network
        self._remaining = length

    async def readinto(self, view: memoryview) -> int:
        """Fill at most `len(view)` bytes of `view` with body bytes; 0 once the body is complete.
        A connection that ends or fails early raises httpx.TransportError."""
        if self._remaining is None:
            raise RemoteProtocolError(Reason.MALFORMED, "a blob body needs one Content-Length")
        if not self._remaining or not view:
            return 0
        try:
            n = await self._network.recv_into(view[: self._remaining])
        except (OSError, trio.ClosedResourceError, TransportError) as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from exc
        if n == 0:
            raise httpx.RemoteProtocolError(f"connection closed with {self._remaining} body bytes to come")
        self._remaining -= n
        return n


class BlobClient:
    """HTTP client for blobs; one per host. Use as `async with BlobClient(...) as client`.

    `read_bytes`: the size of one download buffer; `queue_chunks`: buffers per download; `timeout`:
    bounds connecting, the response head and any silence of the holder while the body arrives;
    `min_rate` (bytes/s, 0: none) and `grace` (s): the slowest a holder may send (module docstring).
    Buffers are kept for the next download (at most two downloads' worth).
    """

    def __init__(
        self,
        store: BlobStore,
        counters: Counters,
        *,
        local_peer: str,
        read_bytes: int = DEFAULT_READ,
        queue_chunks: int = 8,
        timeout: float = 30.0,
        min_rate: float = 0.0,
        grace: float = 10.0,
        max_connections: int = 64,
        credentials: Credentials | None = None,
        membership: bytes = b"",
    ) -> None:
        self.store = store
        self.counters = counters
        self.local_peer = local_peer
        self.read_bytes = read_bytes
        self.queue_chunks = max(2, queue_chunks)
        self.timeout = timeout
        self.min_rate = min_rate
        self.grace = grace
        self.credentials = credentials
        self._spare: list[bytearray] = []
        self._client = httpx.AsyncClient(
            transport=_PoolTransport(credentials, max_connections),
            timeout=httpx.Timeout(timeout),
            headers={PEER_HEADER: local_peer, **membership_headers(membership)},
        )

    async def __aenter__(self) -> BlobClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def fetch_once(self, peer: str, base_url: str, name: str, size: int) -> None:
        """Download blob `name` (`size` bytes) from `peer` at `base_url` into the store, verified."""
        started = trio.current_time()
        try:
            writer = self.store.open_writer(name, size)
            try:
                await self._download(peer, f"{base_url}{BLOB_PREFIX}{name}", writer)
                await trio.to_thread.run_sync(writer.commit)
            finally:
                writer.close()
        except OSError as exc:  # the local part file (disk full, store directory gone)
            raise LocalStoreError(f"blob {name[:12]}: local store: {exc}", peer=peer) from exc
        self.counters.blob_downloads += 1
        self.counters.traffic(peer, Kind.BLOB).recv_frames += 1
        if self.counters.on_fetch is not None:
            self.counters.on_fetch(trio.current_time() - started)

    async def fetch_ranges(self, sources: Sequence[tuple[str, str]], name: str, size: int,
                           streams: int) -> dict[str, Exception]:
        """Download blob `name` (`size` bytes) as `streams` contiguous byte ranges at once, each over its own
        connection: range i from `sources[i % len(sources)]` ((peer, base_url) pairs), resumed from the next
        source where it stopped if that one fails. Verified whole once every range is in (`PieceWriter`).
        Raises as `fetch_once`: when every source failed a range, that range's first failure; a wrong blob is
        `HASH_MISMATCH` without knowing which source sent the wrong bytes (fetch it from one to find out).
        Returns the sources that failed a range, with their errors."""
        if not sources or streams < 1:
            raise ValueError("fetch_ranges needs sources and at least one stream")
        started = trio.current_time()
        failed: dict[str, Exception] = {}
        try:
            writer = self.store.open_piece_writer(name, size)
            try:
                cuts = [size * i // streams for i in range(streams + 1)]
                try:
                    async with trio.open_nursery() as nursery:
                        for i in range(streams):
                            nursery.start_soon(self._fetch_range, sources, i, writer.section(cuts[i], cuts[i + 1]),
                                               name, failed)
                except BaseExceptionGroup as group:
                    error = _one_exception(group, name, sources[0][0])
                    raise error from error.__cause__
                await trio.to_thread.run_sync(writer.commit)
            finally:
                writer.close()
        except OSError as exc:
            raise LocalStoreError(f"blob {name[:12]}: local store: {exc}", peer=sources[0][0]) from exc
        self.counters.blob_downloads += 1
        self.counters.traffic(sources[0][0], Kind.BLOB).recv_frames += 1
        if self.counters.on_fetch is not None:
            self.counters.on_fetch(trio.current_time() - started)
        return failed

    async def _fetch_range(self, sources: Sequence[tuple[str, str]], i: int, section: Section, name: str,
                           failed: dict[str, Exception]) -> None:
        order = [sources[(i + k) % len(sources)] for k in range(len(sources))]
        first: Exception | None = None
        for peer, base_url in order:
            if section.size == 0:
                return
            if peer in failed:
                continue
            try:
                await self._download(peer, f"{base_url}{BLOB_PREFIX}{name}", section, start=section.at,
                                     end=section.end)
                return
            except (RemoteProtocolError, TransportError) as exc:
                failed.setdefault(peer, exc)
                first = first or exc
                log.info("range %d-%d of blob %s from %s failed (%s); the next source goes on", section.at,
                         section.end, name[:12], peer[:16], exc)
        if section.size:
            raise first or TransportError(f"blob {name[:12]}: no source served bytes {section.at}-{section.end}")

    async def _download(self, peer: str, url: str, sink: BlobWriter | Section, *, start: int = 0,
                        end: int | None = None) -> None:
        n = self.queue_chunks
        buffers = [self._spare.pop() if self._spare else bytearray(self.read_bytes) for _ in range(n)]
        free_in, free_out = trio.open_memory_channel[bytearray](n)
        filled_in, filled_out = trio.open_memory_channel[tuple[bytearray, int]](n)
        for buffer in buffers:
            free_in.send_nowait(buffer)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_hash_and_write, filled_out, sink, free_in)
                async with filled_in:
                    await self._receive(peer, url, sink.size, free_out, filled_in,
                                        None if end is None else (start, end))
        except BaseExceptionGroup as group:
            error = _one_exception(group, url, peer)
            raise error from error.__cause__
        finally:
            self._spare.extend(buffers[: 2 * n - len(self._spare)])

    async def _receive(
        self,
        peer: str,
        url: str,
        size: int,
        free: trio.MemoryReceiveChannel[bytearray],
        filled: trio.MemorySendChannel[tuple[bytearray, int]],
        byte_range: tuple[int, int] | None = None,
    ) -> None:
        progress = _Progress(trio.current_time())
        headers = {} if byte_range is None else {"range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"}
        async with trio.open_nursery() as guard:
            guard.start_soon(self._stall_guard, progress, url, peer)
            async with self._client.stream("GET", url, headers=headers) as response:
                if response.status_code != (200 if byte_range is None else 206):
                    kind = BlobGone if response.status_code == 404 else TransportError
                    raise kind(f"GET {url} answered {response.status_code}", peer=peer)
                if byte_range is not None and not response.headers.get("content-range", "").startswith(
                        f"bytes {byte_range[0]}-{byte_range[1] - 1}/"):
                    raise RemoteProtocolError(Reason.MALFORMED, f"{url}: content-range "
                                              f"{response.headers.get('content-range')!r} for bytes {byte_range}")
                announced = response.headers.get("content-length")
                if announced is not None and int(announced) != size:
                    reason = Reason.OVERSIZED if int(announced) > size else Reason.TRUNCATED
                    raise RemoteProtocolError(reason, f"content-length {announced}, announced size {size}")
                proven = response.extensions["network_stream"].get_extra_info("peer_id")
                if self.credentials is not None and proven != peer:
                    raise RemoteProtocolError(Reason.BAD_IDENTITY, f"{url}: the TLS certificate is of {proven}, not {peer}")
                body: _Body = response.extensions[_BODY]
                while progress.got < size:
                    waiting = trio.current_time()
                    buffer = await free.receive()
                    progress.at = trio.current_time()  # waiting for a free buffer is not the holder's fault
                    progress.ours += progress.at - waiting
                    want = min(len(buffer), size - progress.got)
                    fill = 0
                    with memoryview(buffer) as view:
                        while fill < want:
                            n = await body.readinto(view[fill:want])
                            fill += n
                            progress.got += n
                            progress.at = trio.current_time()
                    self.counters.received(peer, Kind.BLOB, fill, frames=0)
                    await filled.send((buffer, fill))
            guard.cancel_scope.cancel()

    async def _stall_guard(self, progress: _Progress, url: str, peer: str) -> None:
        """Fail the download once no body bytes arrived for `timeout` seconds (`TransportError`), or once
        the holder is behind `min_rate` after `grace` (`TOO_SLOW`). One sleeping task per download, woken
        at the nearer of the two deadlines (a deadline moved on every read costs ~30 us of trio
        bookkeeping per read)."""
        while True:
            silent_at = progress.at + self.timeout
            slow_at = progress.behind_at(self.grace, self.min_rate)
            now = trio.current_time()
            if now >= silent_at:
                raise TransportError(f"GET {url}: ReadTimeout: no body bytes for {self.timeout} s", peer=peer)
            if now >= slow_at:
                raise RemoteProtocolError(
                    Reason.TOO_SLOW, f"GET {url}: {progress.got} bytes in {now - progress.start:.1f} s, "
                    f"under {self.min_rate:.0f} B/s after a grace of {self.grace} s")
            await trio.sleep_until(min(silent_at, slow_at))


class _Progress:
    """How far one download is: when it started and last made progress (trio time), the bytes received,
    and the seconds spent waiting on our own side (a free buffer), which do not count against the holder."""

    __slots__ = ("at", "got", "ours", "start")

    def __init__(self, at: float) -> None:
        self.start = self.at = at
        self.got = 0
        self.ours = 0.0

    def behind_at(self, grace: float, min_rate: float) -> float:
        """When the holder falls behind `min_rate` unless more bytes arrive (inf without a floor)."""
        return self.start + self.ours + grace + self.got / min_rate if min_rate > 0 else math.inf


async def _hash_and_write(
    filled: trio.MemoryReceiveChannel[tuple[bytearray, int]],
    writer: BlobWriter | Section,
    free: trio.MemorySendChannel[bytearray],
) -> None:
    """Hash and write filled buffers in order in a worker thread (everything queued in one thread
    hop: a hop costs ~0.25 ms of CPU on the development VM), then hand the buffers back."""
    async with filled:
        async for item in filled:
            batch = [item]
            while True:
                try:
                    batch.append(filled.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            await trio.to_thread.run_sync(_write_batch, writer, batch)
            for buffer, _ in batch:
                free.send_nowait(buffer)


def _write_batch(writer: BlobWriter | Section, batch: list[tuple[bytearray, int]]) -> None:
    for buffer, filled in batch:
        with memoryview(buffer) as whole, whole[:filled] as view:
            writer.write(view)


def _one_exception(group: BaseExceptionGroup[Any], url: str, peer: str) -> BaseException:
    """The one exception a download raises for what its tasks raised (`group`, nested or not).

    - A leaf that is neither a failure of the holder or the transfer nor cancellation is a bug: the
      group itself.
    - Else cancellation wins: the first leaf that is not an `Exception` (trio.Cancelled,
      KeyboardInterrupt), so the cancel scope that asked for it catches it. (A holder that answered 404
      while the host was closing raised `TransportError` next to the writer task's `Cancelled`;
      re-raising that group let the cancel scope strip the `Cancelled` and the `TransportError` escape,
      still wrapped, and crash the host.)
    - Else the first failure as the domain exception: `RemoteProtocolError` and `TransportError` as
      they are, an httpx error or an `OSError` (socket, or the local part file) as `TransportError`.
    """
    leaves = _leaves(group)
    domain: list[Exception] = []
    for leaf in leaves:
        if isinstance(leaf, RemoteProtocolError | TransportError):
            domain.append(leaf)
        elif isinstance(leaf, httpx.HTTPError | OSError):
            error = TransportError(f"GET {url}: {type(leaf).__name__}: {leaf}", peer=peer)
            error.__cause__ = leaf
            domain.append(error)
        elif isinstance(leaf, Exception):
            return group
    cancelled = [leaf for leaf in leaves if not isinstance(leaf, Exception)]
    return cancelled[0] if cancelled else domain[0]


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    """The leaf exceptions of a (nested) group, depth first, in order."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


class LocalBackoff:
    """How long fetches wait after the local store failed to write a blob: `FIRST` seconds, doubling with each
    failure in a row up to `LAST`; a stored blob ends the wait. (A full disk otherwise made every holder of
    every pending blob fail at once, again at every heartbeat: 1,606 failed fetches in one measured minute.)"""

    FIRST, LAST = 1.0, 30.0

    def __init__(self) -> None:
        self.until = -math.inf
        self._wait = 0.0

    def failed(self, now: float) -> float:
        """A local write failed at `now`: the wait from now (also set as `until`)."""
        self._wait = self.FIRST if self._wait == 0.0 else min(self.LAST, 2.0 * self._wait)
        self.until = now + self._wait
        return self._wait

    def succeeded(self) -> None:
        self._wait, self.until = 0.0, -math.inf
