"""Tier (b): one connection's framing, bounded send queue and single writer, over in-memory streams."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from p2p.connection import Connection
from p2p.counters import Counters, Kind
from p2p.errors import TransportError
from protocol.errors import Reason, RemoteProtocolError
from protocol.framing import frame


def make(stream: trio.abc.Stream, counters: Counters, conn_id: int = 1, **kw: int) -> Connection:
    limits = dict(max_frame_size=1024, queue_frames=64, queue_bytes=4096)
    limits.update(kw)
    conn = Connection(stream, conn_id, counters, remote=f"r{conn_id}", outbound=True, **limits)
    conn.authenticated(f"peer{conn_id}")
    return conn


async def read_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = await stream.receive_some(n - len(data))
        assert chunk, "stream closed early"
        data += chunk
    return bytes(data)


async def test_a_slow_peer_fills_its_bounded_queue_and_never_blocks_the_others() -> None:
    counters = Counters()
    slow_end, slow_peer = trio.testing.lockstep_stream_pair()  # the peer never reads
    fast_end, fast_peer = trio.testing.memory_stream_pair()
    slow = make(slow_end, counters, 1)
    fast = make(fast_end, counters, 2)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow.run_writer)
            nursery.start_soon(fast.run_writer)
            body = frame(bytes(496))  # 500 bytes on the wire
            accepted = [slow.enqueue(body, now=10.0) for _ in range(20)]
            assert accepted.count(True) == 8 and accepted[8:] == [False] * 12  # 8 x 500 <= 4096
            assert counters.dropped_frames["peer1"] == 12 and slow.congested_since == 10.0
            assert slow.queued_bytes <= 4096
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(50):  # the fast peer is served while the slow one is stuck
                assert fast.enqueue(body, now=10.0)
                await trio.testing.wait_all_tasks_blocked()
            assert await read_exactly(fast_peer, 50 * 500) == body * 50
            assert counters.traffic("peer2", Kind.CONTROL).sent_frames == 50
            assert counters.dropped_frames["peer2"] == 0
            assert slow.enqueue(body, now=11.0) is False and slow.congested_since == 10.0
            nursery.cancel_scope.cancel()


async def test_the_writer_coalesces_queued_frames_and_flush_waits_for_them() -> None:
    counters = Counters()
    end, peer = trio.testing.memory_stream_pair()
    conn = make(end, counters, queue_bytes=1 << 20)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for i in range(30):
                assert conn.enqueue(frame(bytes([i]) * 10), now=0.0)
            nursery.start_soon(conn.run_writer)
            await conn.flush()
            assert conn.queued_bytes == 0 and conn.congested_since is None
            data = await read_exactly(peer, 30 * 14)
            assert data == b"".join(frame(bytes([i]) * 10) for i in range(30))
            nursery.cancel_scope.cancel()


async def test_reading_frames_and_framing_errors() -> None:
    counters = Counters()
    end, peer = trio.testing.memory_stream_pair()
    conn = make(end, counters)
    with trio.fail_after(5):
        await peer.send_all(frame(b"hello") + (5000).to_bytes(4, "big"))
        assert await conn.next_frame() == b"hello"
        with pytest.raises(RemoteProtocolError) as err:
            await conn.next_frame()
        assert err.value.reason is Reason.OVERSIZED
        assert counters.traffic("peer1", Kind.CONTROL).recv_bytes == 9

        end, peer = trio.testing.memory_stream_pair()
        conn = make(end, counters, 2)
        await peer.send_all((100).to_bytes(4, "big") + b"x" * 40)
        await peer.aclose()
        with pytest.raises(RemoteProtocolError) as err:
            await conn.next_frame()
        assert err.value.reason is Reason.TRUNCATED

        end, peer = trio.testing.memory_stream_pair()
        conn = make(end, counters, 3)
        await peer.aclose()
        with pytest.raises(TransportError):
            await conn.next_frame()


async def test_a_broken_stream_surfaces_as_transport_error() -> None:
    counters = Counters()
    end, _peer = trio.testing.memory_stream_pair()
    conn = make(end, counters)
    await end.aclose()
    assert conn.enqueue(frame(b"x"), now=0.0)
    with trio.fail_after(5), pytest.raises(TransportError):
        await conn.run_writer()
