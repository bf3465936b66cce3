"""Helpers for the loopback p2p tests: fast gossip settings, starting N hosts, waiting for a
condition (never a fixed sleep), and a raw peer that speaks the wire protocol by hand."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import trio

from p2p.config import HostConfig
from p2p.errors import TransportError
from p2p.host import Host, run
from p2p.tls import Credentials
from p2p.tls import connect as tls_connect
from protocol import wire
from protocol.admission import Admission
from protocol.framing import FrameDecoder, frame
from protocol.gossip import GossipConfig, Handshake, State
from protocol.identity import Identity
from protocol.messages import AnyMessage, Signed, UpdateHeader
from protocol.seen import SeqnoSource
from protocol.validation import Validator
from waiting import wait_for  # noqa: F401  (re-exported)

RUN = "test-run"
POLL_S = 0.01


def fast_gossip(**overrides: object) -> GossipConfig:
    """Heartbeats every 50 ms, a peer is dead after 1 s of silence."""
    settings: dict[str, object] = dict(run_id=RUN, heartbeat_s=0.05, heartbeat_timeout_s=1.0, dial_backoff_s=0.05,
                                       dial_backoff_max_s=0.5)
    settings.update(overrides)
    return GossipConfig(**settings)  # type: ignore[arg-type]


def host_config(tmp: Path, name: str, identity: Identity | None = None, **overrides: object) -> HostConfig:
    settings: dict[str, object] = dict(
        identity=identity or Identity.generate(), run_id=RUN, data_dir=tmp / name, gossip=fast_gossip(),
        handshake_timeout_s=2.0, goodbye_flush_s=0.5,
    )
    settings.update(overrides)
    return HostConfig(**settings)  # type: ignore[arg-type]


async def start(nursery: trio.Nursery, config: HostConfig) -> Host:
    """Start a host in `nursery`; `host.abort()` crashes it, `host.close()` says goodbye."""
    return await nursery.start(run, config)


def update_header(identity: Identity, payload: bytes, seqno: int) -> UpdateHeader:
    return UpdateHeader(
        run_id=RUN, origin=identity.peer_id, seqno=seqno, base_slot=0, publish_slot=0, tokens=64, inner_steps=4,
        codec="fp32", shapes=(("w", (max(1, len(payload) // 4),)),),
        payload_sha256=hashlib.sha256(payload).digest(), payload_size=len(payload),
    )


def publish_kwargs(payload: bytes) -> dict[str, object]:
    return dict(base_slot=0, publish_slot=0, tokens=64, inner_steps=4, codec="fp32", shapes=(("w", (len(payload) // 4,)),))


class RawPeer:
    """A hand-driven peer over TLS with its own certificate (cleartext with `insecure=True`): it can complete
    a real handshake, then send any bytes at all inside the link."""

    def __init__(self, stream: trio.abc.Stream, identity: Identity, run_id: str = RUN) -> None:
        self.stream = stream
        self.identity = identity
        self.run_id = run_id
        self.decoder = FrameDecoder()
        self.seqnos = SeqnoSource()
        self.http_addr = ""

    @classmethod
    async def connect(cls, address: str, identity: Identity | None = None, run_id: str = RUN, *,
                      insecure: bool = False) -> RawPeer:
        identity = identity or Identity.generate()
        if insecure:
            host, port = address.rsplit(":", 1)
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, int(port))
        else:
            stream = await tls_connect(address, Credentials(identity).gossip_client, 5.0)
        return cls(stream, identity, run_id)

    async def handshake(self, now: float, http_addr: str = "", admission: Admission | None = None) -> Handshake:
        hs = Handshake(self.identity, Validator(self.run_id), gossip_addr="", http_addr=http_addr,
                       challenge=os.urandom(32), admission=admission)
        await self.send(hs.hello)
        while hs.state is not State.DONE:
            for message in hs.receive_frame(await self.next_frame(), now):
                await self.send(message)
        return hs

    async def send(self, message: AnyMessage) -> None:
        await self.stream.send_all(frame(wire.encode(message)))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def next_frame(self) -> bytes:
        while True:
            body = self.decoder.next_frame()
            if body is not None:
                return body
            data = await self.stream.receive_some(65536)
            self.decoder.receive_data(data)
            if not data:
                body = self.decoder.next_frame()
                if body is None:
                    raise EOFError("closed")
                return body

    async def wait_closed(self) -> None:
        """Read (and discard) until the node closes the connection."""
        while True:
            try:
                await self.next_frame()
            except (EOFError, trio.BrokenResourceError, TransportError):
                return

    async def next_message(self, kind: type) -> AnyMessage:
        while True:
            message = wire.decode(await self.next_frame())
            if isinstance(message, kind) or (isinstance(message, Signed) and isinstance(message.body, kind)):
                return message
