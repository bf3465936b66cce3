"""Every message of the overlay, as a frozen dataclass. Field order here *is* the wire order.

Each message has a `KIND` (its wire tag, also the signing domain) and a `run_id` as its first field, so
every message is bound to one training run and signatures cover the run. Messages with `SIGNED = True`
are gossiped (forwarded by others), travel as `Signed(body, signature)` and carry their `origin` peer id
and a per-origin `seqno`; the others are per-connection control messages and travel bare.

Field types are the schema (read by `protocol.wire`): `int` is an unsigned 64-bit integer, `str` UTF-8
text, `bytes` binary, `tuple[X, ...]` an array; `Annotated[..., Size(lo, hi)]` bounds a length (bytes of
UTF-8 for str, items for tuples). Unbounded `str`/`bytes`/`tuple` get `DEFAULT_MAX_LEN`.

Seqnos (signed messages): the origin picks a strictly increasing integer per origin, across all kinds,
that also survives restarts: microseconds since the Unix epoch at creation, bumped past the last one
issued (`protocol.seen.SeqnoSource`). Receivers refuse seqnos older than their replay window.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Annotated, ClassVar, Generic, TypeVar

PROTOCOL_VERSION = 1
DOMAIN = b"diloco/v1"
DEFAULT_MAX_LEN = 1024
KNOWN_CODECS = frozenset({"fp32", "bf16", "int8", "int4"})


@dataclass(frozen=True)
class Size:
    """Length bound for a str (UTF-8 bytes), bytes or tuple field: lo <= len <= hi."""

    lo: int
    hi: int


Bytes32 = Annotated[bytes, Size(32, 32)]
Signature = Annotated[bytes, Size(64, 64)]
PeerId = Annotated[str, Size(1, 64)]  # validated further by protocol.identity (BAD_IDENTITY)
Addr = Annotated[str, Size(0, 300)]  # "host:port", "[v6]:port"; "" = none
RunId = Annotated[str, Size(1, 128)]
Name = Annotated[str, Size(1, 256)]
Topic = Annotated[str, Size(1, 64)]
MessageIds = Annotated[tuple[Bytes32, ...], Size(0, 5000)]


@dataclass(frozen=True)
class PeerInfo:
    """Where to reach a peer. Not a message by itself (no KIND): nested in PeerExchange and Prune."""

    peer_id: PeerId
    gossip_addr: Addr
    http_addr: Addr


PeerInfos = Annotated[tuple[PeerInfo, ...], Size(0, 1000)]


class Message:
    """Base of every wire message. `KIND` is the wire tag; `SIGNED` says it travels as `Signed`."""

    KIND: ClassVar[str]
    SIGNED: ClassVar[bool] = False
    run_id: str


# ---- handshake (per connection, unsigned framing; HelloProof carries its own signature) ------------


@dataclass(frozen=True)
class Hello(Message):
    """First frame each side sends. `challenge` is 32 fresh random bytes the other side must sign."""

    KIND: ClassVar[str] = "hello"
    run_id: RunId
    version: int
    peer_id: PeerId
    gossip_addr: Addr
    http_addr: Addr
    challenge: Bytes32
    agent: Annotated[str, Size(0, 128)]
    run_config: Annotated[str, Size(0, 8192)] = ""  # protocol.runconfig: what every node of the run agrees on
    membership: Annotated[bytes, Size(0, 512)] = b""  # protocol.admission: the founder's word (closed runs)


@dataclass(frozen=True)
class HelloProof(Message):
    """Second frame each side sends: Ed25519 signature by `peer_id` over the handshake transcript
    (`protocol.signing.hello_transcript`), proving key possession for this connection."""

    KIND: ClassVar[str] = "hello_proof"
    run_id: RunId
    peer_id: PeerId
    signature: Signature


# ---- per-connection control -------------------------------------------------------------------------


@dataclass(frozen=True)
class PeerExchange(Message):
    """Peers the sender knows (itself not required). Sent after the handshake and on request."""

    KIND: ClassVar[str] = "peer_exchange"
    run_id: RunId
    peers: PeerInfos


@dataclass(frozen=True)
class Heartbeat(Message):
    """Liveness and progress of the sender. `counter` increases by one per heartbeat on a connection."""

    KIND: ClassVar[str] = "heartbeat"
    run_id: RunId
    slot: int
    round: int
    state: Annotated[str, Size(0, 32)]
    counter: int


@dataclass(frozen=True)
class Graft(Message):
    """Ask the receiver to add the sender to its mesh for `topic`."""

    KIND: ClassVar[str] = "graft"
    run_id: RunId
    topic: Topic


@dataclass(frozen=True)
class Prune(Message):
    """Sender removed the receiver from its `topic` mesh; do not graft back for `backoff_s` seconds.
    `peers` are suggestions to connect to instead."""

    KIND: ClassVar[str] = "prune"
    run_id: RunId
    topic: Topic
    backoff_s: int
    peers: PeerInfos


@dataclass(frozen=True)
class IHave(Message):
    """Lazy gossip: the sender holds these signed messages (ids = `Signed.message_id`)."""

    KIND: ClassVar[str] = "ihave"
    run_id: RunId
    topic: Topic
    ids: MessageIds


@dataclass(frozen=True)
class IWant(Message):
    """Request the signed messages with these ids; the answer is the messages themselves."""

    KIND: ClassVar[str] = "iwant"
    run_id: RunId
    ids: MessageIds


# ---- signed, gossiped -------------------------------------------------------------------------------

Shapes = Annotated[tuple[tuple[Name, Annotated[tuple[int, ...], Size(0, 8)]], ...], Size(0, 4096)]
BlobRefs = Annotated[tuple[tuple[Name, Bytes32, int], ...], Size(0, 4096)]


@dataclass(frozen=True)
class UpdateHeader(Message):
    """A pseudo-gradient announcement. The payload (layout: docs/payload-format.md) is the blob with
    SHA-256 `payload_sha256` and `payload_size` bytes. `shapes` lists (tensor name, shape) in sorted
    name order. Slot semantics: PROTOCOL.md section 11c."""

    KIND: ClassVar[str] = "update"
    SIGNED: ClassVar[bool] = True
    run_id: RunId
    origin: PeerId
    seqno: int
    base_slot: int
    publish_slot: int
    tokens: int
    inner_steps: int
    codec: Annotated[str, Size(1, 16)]
    shapes: Shapes
    payload_sha256: Bytes32
    payload_size: int
    membership: Annotated[bytes, Size(0, 512)] = b""  # protocol.admission: the origin's (closed runs)


@dataclass(frozen=True)
class Goodbye(Message):
    """The origin leaves the run; nobody should wait for it."""

    KIND: ClassVar[str] = "goodbye"
    SIGNED: ClassVar[bool] = True
    run_id: RunId
    origin: PeerId
    seqno: int
    reason: Annotated[str, Size(0, 256)]


@dataclass(frozen=True)
class StateManifest(Message):
    """The origin's state at `slot`: digests to compare, and the blobs (name, sha256, size), sorted by
    name, that a joiner downloads over HTTP."""

    KIND: ClassVar[str] = "manifest"
    SIGNED: ClassVar[bool] = True
    run_id: RunId
    origin: PeerId
    seqno: int
    slot: int
    ledger_digest: Bytes32
    params_digest: Bytes32
    blobs: BlobRefs


@dataclass(frozen=True)
class ReducedRecord(Message):
    """A record of a reduced run (PROTOCOL.md §15) gossiped by its author, the origin: `record_kind` and
    `fields` (the msgpack array) exactly as the record was signed, `record_signature` the record's own
    signature. A commitment carries its update's signed header (its wire encoding) in `header`; in a closed run
    `membership` is the author's, as an update header's field 11 is."""

    KIND: ClassVar[str] = "reduced"
    SIGNED: ClassVar[bool] = True
    run_id: RunId
    origin: PeerId
    seqno: int
    record_kind: Annotated[str, Size(1, 32)]
    fields: Annotated[bytes, Size(1, 768 << 10)]
    record_signature: Signature
    header: Annotated[bytes, Size(0, 192 << 10)] = b""
    membership: Annotated[bytes, Size(0, 512)] = b""  # protocol.admission: the author's (closed runs)


SignedBody = UpdateHeader | Goodbye | StateManifest | ReducedRecord
B = TypeVar("B", UpdateHeader, Goodbye, StateManifest, ReducedRecord)


@dataclass(frozen=True)
class Signed(Generic[B]):
    """A signed body as it travels and is forwarded. Build with `protocol.signing.sign`; check with
    `protocol.signing.verify` (or the validator). `message_id` identifies the content (not the
    signature): SHA-256 of the signing input, see `signing_input`."""

    body: B
    signature: Signature

    @property
    def kind(self) -> str:
        return self.body.KIND

    @property
    def origin(self) -> str:
        return self.body.origin

    @property
    def seqno(self) -> int:
        return self.body.seqno

    @functools.cached_property
    def signing_input(self) -> bytes:
        """`b"diloco/v1:" + KIND + b":" + canonical_encoding(body)` — the exact bytes signed."""
        from protocol.wire import signing_input  # wire imports this module; resolve lazily

        return signing_input(self.body)

    @functools.cached_property
    def message_id(self) -> bytes:
        """32-byte id used by the seen-cache, IHAVE/IWANT and the ledger."""
        return hashlib.sha256(self.signing_input).digest()


MESSAGE_TYPES: tuple[type[Message], ...] = (
    Hello,
    HelloProof,
    PeerExchange,
    Heartbeat,
    Graft,
    Prune,
    IHave,
    IWant,
    UpdateHeader,
    Goodbye,
    StateManifest,
    ReducedRecord,
)
KINDS: dict[str, type[Message]] = {cls.KIND: cls for cls in MESSAGE_TYPES}

AnyMessage = Hello | HelloProof | PeerExchange | Heartbeat | Graft | Prune | IHave | IWant | Signed


def split_addr(addr: str) -> tuple[str, int]:
    """Parse "host:port" or "[v6addr]:port". Raises ValueError if malformed (port must be 1..65535)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or len(port) > 5:
        raise ValueError(f"address {addr!r} is not host:port")
    if host.startswith("[") != host.endswith("]"):
        raise ValueError(f"address {addr!r}: unbalanced brackets")
    if host.startswith("["):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"address {addr!r}: IPv6 hosts must be in brackets")
    if not host or any(c.isspace() or c in "/?#@[]" for c in host):
        raise ValueError(f"address {addr!r} is not host:port")
    if not 0 < int(port) < 65536:
        raise ValueError(f"address {addr!r}: port {int(port)} is outside 1-65535")
    return host, int(port)
