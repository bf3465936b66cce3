"""Length-prefixed frames on a byte stream: `u32 big-endian length || body`, body <= `MAX_FRAME_SIZE`.

Frames carry control messages and signed headers only. Blobs (pseudo-gradient payloads, checkpoints)
never travel in frames: they are fetched over HTTP by SHA-256 (`GET /blobs/<hex>`), so a frame limit of
1 MiB is generous and a peer announcing more is misbehaving.

`FrameDecoder` is sans-IO (h11 style): feed it whatever the socket returned with `receive_data`, then
call `next_frame` until it returns None. It refuses an oversized length prefix as soon as the four
prefix bytes are in, before buffering any of the body.
"""

from __future__ import annotations

from protocol import wire
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.messages import AnyMessage

MAX_FRAME_SIZE = 1 << 20
PREFIX_BYTES = 4


def frame(body: bytes, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
    """Prefix an already-encoded frame body with its length. Raises LocalProtocolError if too big."""
    if len(body) > max_frame_size:
        raise LocalProtocolError(f"frame body of {len(body)} bytes exceeds the {max_frame_size}-byte limit")
    return len(body).to_bytes(PREFIX_BYTES, "big") + body


def encode_frame(message: AnyMessage, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
    """`frame(wire.encode(message))`: the bytes to write to the stream for one message."""
    return frame(wire.encode(message), max_frame_size)


class FrameDecoder:
    """Splits a byte stream into frame bodies.

    Contract: `receive_data(b"")` signals end of stream; after it, `next_frame` drains what is complete
    and then raises `RemoteProtocolError(TRUNCATED)` if a partial frame was left. Once a
    `RemoteProtocolError` was raised the decoder is broken: every later call raises it again (the
    connection must be closed). A truncated frame is never returned.
    """

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE) -> None:
        if not 0 < max_frame_size < 1 << 32:
            raise LocalProtocolError("max_frame_size must be in [1, 2**32)")
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._eof = False
        self._error: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buffer)

    def receive_data(self, data: bytes) -> None:
        """Append bytes from the stream (b"" = end of stream). Raises RemoteProtocolError(OVERSIZED) at
        once if the next frame's length prefix exceeds the limit."""
        self._raise_if_broken()
        if self._eof and data:
            raise LocalProtocolError("receive_data after end of stream")
        if not data:
            self._eof = True
        self._buffer += data
        self._check_prefix()

    def next_frame(self) -> bytes | None:
        """The next complete frame body, or None if more bytes are needed."""
        self._raise_if_broken()
        self._check_prefix()
        if len(self._buffer) >= PREFIX_BYTES:
            size = int.from_bytes(self._buffer[:PREFIX_BYTES], "big")
            end = PREFIX_BYTES + size
            if len(self._buffer) >= end:
                body = bytes(self._buffer[PREFIX_BYTES:end])
                del self._buffer[:end]
                return body
        if self._eof and self._buffer:
            self._fail(Reason.TRUNCATED, f"stream ended inside a frame ({len(self._buffer)} bytes left)")
        return None

    def _check_prefix(self) -> None:
        if len(self._buffer) >= PREFIX_BYTES:
            size = int.from_bytes(self._buffer[:PREFIX_BYTES], "big")
            if size > self.max_frame_size:
                if bytes(self._buffer[:PREFIX_BYTES]) == b"HTTP":
                    self._fail(Reason.OVERSIZED, "the peer answered in HTTP: that address is a node's HTTP port "
                                                 "(--http), not its gossip port (--listen)")
                self._fail(Reason.OVERSIZED, f"frame of {size} bytes exceeds the {self.max_frame_size}-byte limit")

    def _fail(self, reason: Reason, detail: str) -> None:
        self._error = RemoteProtocolError(reason, detail)
        self._buffer.clear()
        raise self._error

    def _raise_if_broken(self) -> None:
        if self._error is not None:
            raise RemoteProtocolError(self._error.reason, self._error.detail)
