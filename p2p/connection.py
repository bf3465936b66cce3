"""One gossip connection: length-prefixed frames over a trio stream, a bounded send queue drained by
one writer task, and frame reading for the one reader task.

Contract:
- During the handshake the owner calls `send_direct` and `next_frame` itself; afterwards exactly one
  task runs `run_writer()` and exactly one calls `next_frame()` in a loop.
- `enqueue` never blocks and never grows memory without bound: when `queue_frames` frames or
  `queue_bytes` bytes are already waiting, the frame is dropped and counted (gossip repairs losses
  through IHAVE/IWANT), and `congested_since` records when the queue first overflowed; the owner
  disconnects a peer that stays congested. A slow peer therefore never blocks the others.
- Every I/O failure surfaces as `TransportError`; a peer that breaks the framing raises
  `RemoteProtocolError` (OVERSIZED, TRUNCATED) from `next_frame`.
- `close(reason)` cancels everything running inside `cancel_scope` (the owner's per-connection scope).
- `opened_at` and `last_recv` are trio times (when it was accepted or dialled, when its last frame arrived):
  `choose_eviction` picks the connection a newcomer may replace when every slot is taken.
"""

from __future__ import annotations

import logging
from collections import deque
from collections import Counter
from collections.abc import Iterable

import trio

from p2p.counters import UNKNOWN_PEER, Counters, Kind
from p2p.errors import TransportError
from protocol.framing import FrameDecoder, encode_frame
from protocol.messages import AnyMessage

log = logging.getLogger("p2p.conn")

READ_BYTES = 1 << 16
COALESCE_BYTES = 1 << 18


class Connection:
    def __init__(
        self,
        stream: trio.abc.Stream,
        conn_id: int,
        counters: Counters,
        *,
        remote: str,
        outbound: bool,
        max_frame_size: int,
        queue_frames: int,
        queue_bytes: int,
    ) -> None:
        self.stream = stream
        self.id = conn_id
        self.counters = counters
        self.remote = remote
        self.outbound = outbound
        self.peer = UNKNOWN_PEER
        self.max_frame_size = max_frame_size
        self.queue_frames = queue_frames
        self.queue_bytes = queue_bytes
        self.cancel_scope = trio.CancelScope()
        self.close_reason = ""
        self.congested_since: float | None = None
        self._decoder = FrameDecoder(max_frame_size)
        self._queue: deque[bytes] = deque()
        self._queued_bytes = 0
        self._wakeup = trio.Event()
        self._drained = trio.Event()
        self._sending = False
        self._handshake_traffic = [0, 0]  # bytes sent, received while the peer was unknown
        self._handshake_frames = [0, 0]
        self.opened_at = trio.current_time()
        self.last_recv = self.opened_at
        self._first_bytes = b""  # the first bytes received (a TLS record where a frame should be: `tls_peer`)

    # ---- sending ----------------------------------------------------------------------------------

    def encode(self, message: AnyMessage) -> bytes:
        return encode_frame(message, self.max_frame_size)

    async def send_direct(self, message: AnyMessage) -> None:
        """Write one frame now (handshake only: before `run_writer` starts)."""
        data = self.encode(message)
        await self._send_all(data)
        self.counters.sent(self.peer, Kind.CONTROL, len(data))
        if self.peer == UNKNOWN_PEER:
            self._handshake_traffic[0] += len(data)
            self._handshake_frames[0] += 1

    def authenticated(self, peer: str) -> None:
        """The handshake proved `peer`: its handshake bytes move from `unknown` to it."""
        sent, recv, frames_sent, frames_recv = (
            self._handshake_traffic[0], self._handshake_traffic[1], self._handshake_frames[0], self._handshake_frames[1]
        )
        self.counters.sent(UNKNOWN_PEER, Kind.CONTROL, -sent, frames=-frames_sent)
        self.counters.received(UNKNOWN_PEER, Kind.CONTROL, -recv, frames=-frames_recv)
        self.counters.sent(peer, Kind.CONTROL, sent, frames=frames_sent)
        self.counters.received(peer, Kind.CONTROL, recv, frames=frames_recv)
        self.peer = peer

    def enqueue(self, data: bytes, now: float) -> bool:
        """Queue an encoded frame. False (and counted) if the queue is full."""
        if len(self._queue) >= self.queue_frames or self._queued_bytes + len(data) > self.queue_bytes:
            self.counters.dropped(self.peer)
            if self.congested_since is None:
                self.congested_since = now
            return False
        self._queue.append(data)
        self._queued_bytes += len(data)
        self._wakeup.set()
        return True

    @property
    def handshaking(self) -> bool:
        """It dialled in and has not finished its handshake."""
        return not self.outbound and self.peer == UNKNOWN_PEER

    @property
    def closing(self) -> bool:
        return self.cancel_scope.cancel_called

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    async def run_writer(self) -> None:
        """Drain the queue forever, coalescing small frames into one write. Raises TransportError."""
        while True:
            if not self._queue:
                self.congested_since = None
                self._wakeup = trio.Event()
                await self._wakeup.wait()
            batch: list[bytes] = []
            size = 0
            while self._queue and (not batch or size + len(self._queue[0]) <= COALESCE_BYTES):
                frame = self._queue.popleft()
                batch.append(frame)
                size += len(frame)
            self._sending = True
            try:
                await self._send_all(batch[0] if len(batch) == 1 else b"".join(batch))
            finally:
                self._sending = False
            self._queued_bytes -= size
            self.counters.sent(self.peer, Kind.CONTROL, size, frames=len(batch))
            if not self._queue:
                self._drained.set()

    async def write_queued(self) -> None:
        """Write what is queued, directly: the last frames of a connection whose writer never ran (a peer
        refused for room gets a `peer_exchange` before the close). The caller bounds it with a deadline."""
        while self._queue:
            data = self._queue.popleft()
            self._queued_bytes -= len(data)
            await self._send_all(data)
            self.counters.sent(self.peer, Kind.CONTROL, len(data))

    async def flush(self) -> None:
        """Wait until everything queued was written (used before a goodbye closes the connection)."""
        while self._queue or self._sending:
            self._drained = trio.Event()
            await self._drained.wait()

    async def _send_all(self, data: bytes) -> None:
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise TransportError(f"send to {self.remote}: {exc!r}", peer=self.peer) from exc

    # ---- receiving --------------------------------------------------------------------------------

    async def next_frame(self) -> bytes:
        """The next frame body. Raises TransportError at end of stream or on a socket error, and
        RemoteProtocolError if the peer broke the framing."""
        while True:
            body = self._decoder.next_frame()
            if body is not None:
                self._count_received(len(body) + 4)
                return body
            try:
                data = await self.stream.receive_some(READ_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise TransportError(f"receive from {self.remote}: {exc!r}", peer=self.peer) from exc
            if len(self._first_bytes) < 2:
                self._first_bytes = (self._first_bytes + bytes(data[:2]))[:2]
            self._decoder.receive_data(data)
            if not data:
                body = self._decoder.next_frame()  # raises TRUNCATED if a partial frame was left
                if body is not None:
                    self._count_received(len(body) + 4)
                    return body
                raise TransportError(f"{self.remote} closed the connection", peer=self.peer)

    def first_bytes_look_like_tls(self) -> bool:
        """The peer's first bytes are a TLS record header (handshake or alert, version 3.x), not a frame."""
        return len(self._first_bytes) == 2 and self._first_bytes[0] in (0x15, 0x16) and self._first_bytes[1] == 0x03

    def _count_received(self, nbytes: int) -> None:
        self.last_recv = trio.current_time()
        self.counters.received(self.peer, Kind.CONTROL, nbytes)
        if self.peer == UNKNOWN_PEER:
            self._handshake_traffic[1] += nbytes
            self._handshake_frames[1] += 1

    # ---- closing ----------------------------------------------------------------------------------

    def close(self, reason: str) -> None:
        if not self.close_reason:
            self.close_reason = reason
        self.cancel_scope.cancel()

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.debug("close %s: %r", self.remote, exc)


def handshaking_from(conns: Iterable[Connection], remote: str) -> int:
    """Inbound connections from `remote`'s host that have not finished their handshake (one host holding
    many idle sockets must not take every connection slot from joiners elsewhere)."""
    host = remote.rpartition(":")[0]
    return sum(1 for c in conns if not c.outbound and c.peer == UNKNOWN_PEER and c.remote.rpartition(":")[0] == host)


def _host(remote: str) -> str:
    return remote.rpartition(":")[0]


def choose_eviction(
    conns: Iterable[Connection], remote: str, now: float, silent_after: float
) -> tuple[Connection, str] | None:
    """Every connection slot is taken and a newcomer from `remote` ("host:port"; "" for our own dial) arrives:
    the connection it may replace, and why (PROTOCOL.md section 7), or None (the newcomer is refused).

    1. A connection still in its handshake that dialled in, from the host holding the most of them, if that
       host holds at least two more than the newcomer's host (so one host's idle sockets give way to another
       host's newcomer, never to its own, and two hosts do not trade sockets forever): that host's oldest.
       Ties between hosts: the one whose oldest is oldest.
    2. Else the established connection silent the longest (no frame), if silent more than `silent_after` s.

    Connections already closing are not candidates; our own dials in their handshake never are; an
    established connection that is not silent never gives way to a newcomer here (the gossip router's
    places rules decide between peers, `protocol.gossip.places`)."""
    live = [c for c in conns if not c.closing]
    handshaking = [c for c in live if c.handshaking]
    if handshaking:
        counts = Counter(_host(c.remote) for c in handshaking)
        oldest: dict[str, Connection] = {}
        for c in sorted(handshaking, key=lambda c: (c.opened_at, c.id)):
            oldest.setdefault(_host(c.remote), c)
        host = min(counts, key=lambda h: (-counts[h], oldest[h].opened_at, oldest[h].id))
        newcomer = counts[_host(remote)] if remote else 0
        if counts[host] >= newcomer + 2:
            return oldest[host], f"evicted: {counts[host]} handshakes from {host}"
    established = [c for c in live if not c.handshaking and c.peer != UNKNOWN_PEER]
    if established:
        quiet = min(established, key=lambda c: (c.last_recv, c.id))
        if now - quiet.last_recv > silent_after:
            return quiet, f"evicted: silent for {now - quiet.last_recv:.1f} s"
    return None
