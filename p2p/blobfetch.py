"""Fetching one blob from one holder over HTTP, verified on arrival.

Contract of `BlobClient.fetch_once(peer, base_url, name, size)`:
- streams `GET <base_url>/blobs/<name>` into the store's `.part` file while hashing it in a worker
  thread (the network read and the hash/write overlap; at most `queue_chunks` chunks are buffered);
- on success the blob is in the store (verified) and the byte counters say who sent it;
- a holder that sends the wrong bytes raises `RemoteProtocolError` (HASH_MISMATCH, OVERSIZED,
  TRUNCATED), one that cannot be reached or answers non-200 raises `TransportError`. Choosing the
  next holder is the router's decision, not this module's.

httpx reads the socket in 64 KiB pieces by default, which caps a single stream at a few Gbit/s in
Python. `_LargeReadBackend` (an httpcore network backend, a public extension point) makes each read
ask for `read_bytes` instead; h11 is indifferent to how much arrives per read.
"""

from __future__ import annotations

import logging
from typing import Any

import httpcore
import httpx
import trio

from p2p.blobserve import BLOB_PREFIX, PEER_HEADER
from p2p.blobstore import BlobStore, BlobWriter
from p2p.counters import Counters, Kind
from p2p.errors import TransportError
from protocol.errors import Reason, RemoteProtocolError

log = logging.getLogger("p2p.blobs")

DEFAULT_READ = 1 << 20


class _LargeReadStream(httpcore.AsyncNetworkStream):
    def __init__(self, inner: httpcore.AsyncNetworkStream, read_bytes: int) -> None:
        self._inner = inner
        self._read_bytes = read_bytes

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max(max_bytes, self._read_bytes), timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return await self._inner.start_tls(*args, **kwargs)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _LargeReadBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, read_bytes: int) -> None:
        self._inner = httpcore.TrioBackend()
        self._read_bytes = read_bytes

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return _LargeReadStream(await self._inner.connect_tcp(*args, **kwargs), self._read_bytes)

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return _LargeReadStream(await self._inner.connect_unix_socket(*args, **kwargs), self._read_bytes)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _PoolTransport(httpx.AsyncBaseTransport):
    """httpx transport over an httpcore pool that uses `_LargeReadBackend` (public APIs only)."""

    def __init__(self, read_bytes: int, max_connections: int) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            max_connections=max_connections, network_backend=_LargeReadBackend(read_bytes)
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            response = await self._pool.handle_async_request(core_request)
        except httpcore.TimeoutException as exc:
            raise httpx.TimeoutException(str(exc)) from exc
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            raise httpx.TransportError(str(exc)) from exc
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def __aiter__(self) -> Any:
        try:
            async for chunk in self._inner:
                yield chunk
        except httpcore.TimeoutException as exc:
            raise httpx.TimeoutException(str(exc)) from exc
        except (httpcore.NetworkError, httpcore.ProtocolError) as exc:
            raise httpx.TransportError(str(exc)) from exc

    async def aclose(self) -> None:
        await self._inner.aclose()


class BlobClient:
    """HTTP client for blobs; one per host. Use as `async with BlobClient(...) as client`."""

    def __init__(
        self,
        store: BlobStore,
        counters: Counters,
        *,
        local_peer: str,
        read_bytes: int = DEFAULT_READ,
        queue_chunks: int = 8,
        timeout: float = 30.0,
        max_connections: int = 64,
    ) -> None:
        self.store = store
        self.counters = counters
        self.local_peer = local_peer
        self.queue_chunks = queue_chunks
        self._client = httpx.AsyncClient(
            transport=_PoolTransport(read_bytes, max_connections),
            timeout=httpx.Timeout(timeout),
            headers={PEER_HEADER: local_peer},
        )

    async def __aenter__(self) -> BlobClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def fetch_once(self, peer: str, base_url: str, name: str, size: int) -> None:
        """Download blob `name` (`size` bytes) from `peer` at `base_url` into the store, verified."""
        writer = self.store.open_writer(name, size)
        try:
            await self._download(peer, f"{base_url}{BLOB_PREFIX}{name}", writer)
            await trio.to_thread.run_sync(writer.commit)
        finally:
            writer.close()
        self.counters.blob_downloads += 1
        self.counters.traffic(peer, Kind.BLOB).recv_frames += 1

    async def _download(self, peer: str, url: str, writer: BlobWriter) -> None:
        send, receive = trio.open_memory_channel[bytes](self.queue_chunks)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_write_chunks, receive, writer)
                async with send:
                    await self._stream_into(peer, url, writer.size, send)
        except BaseExceptionGroup as group:
            leaf = _single_leaf(group)
            if isinstance(leaf, httpx.HTTPError):
                raise TransportError(f"GET {url}: {type(leaf).__name__}: {leaf}", peer=peer) from leaf
            if isinstance(leaf, RemoteProtocolError | TransportError):
                raise leaf from None
            raise

    async def _stream_into(self, peer: str, url: str, size: int, send: trio.MemorySendChannel[bytes]) -> None:
        async with self._client.stream("GET", url) as response:
            if response.status_code != 200:
                raise TransportError(f"GET {url} answered {response.status_code}", peer=peer)
            announced = response.headers.get("content-length")
            if announced is not None and int(announced) != size:
                reason = Reason.OVERSIZED if int(announced) > size else Reason.TRUNCATED
                raise RemoteProtocolError(reason, f"content-length {announced}, announced size {size}")
            async for chunk in response.aiter_raw():
                self.counters.received(peer, Kind.BLOB, len(chunk), frames=0)
                await send.send(chunk)


def _single_leaf(group: BaseExceptionGroup[Any]) -> BaseException | None:
    """The only leaf exception of a (nested) group, or None if there are several."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        exc = stack.pop()
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 else None


async def _write_chunks(receive: trio.MemoryReceiveChannel[bytes], writer: BlobWriter) -> None:
    """Hash and write chunks in a worker thread, taking everything queued in one thread hop."""
    async with receive:
        async for chunk in receive:
            batch = [chunk]
            while True:
                try:
                    batch.append(receive.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            await trio.to_thread.run_sync(_write_batch, writer, batch)


def _write_batch(writer: BlobWriter, batch: list[bytes]) -> None:
    for chunk in batch:
        writer.write(chunk)


