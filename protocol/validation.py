"""Validation of everything a peer sends: one ordered function, cheapest check first.

    1. size            frame body <= max_frame_size                      OVERSIZED
    2. decode          canonical msgpack                                 TRUNCATED, MALFORMED
    3. schema          known kind, field types and lengths               BAD_SCHEMA
    4. run id          body.run_id == ours                               WRONG_RUN_ID
    5. seen / replay   (signed) seen-cache, per-origin seqno window      DUPLICATE, REPLAYED
    6. signature       (signed) Ed25519 by the origin's key              BAD_IDENTITY, BAD_SIGNATURE
    7. application     slots, counts, codec, shapes, payload size,       BAD_SLOT, BAD_CODEC, ...
                       addresses
    8. mark seen       (signed) message id and seqno recorded

Every refusal raises `RemoteProtocolError(reason)` and is counted in `Validator.counters`. DUPLICATE is
normal gossip (do not penalize); every other reason is the sender's fault. Peer scores and bans are the
router's business (it checks PEER_BANNED before calling this).
"""

from __future__ import annotations

import math
from collections import Counter

from protocol import signing, wire
from protocol.compression.formats import codec_names, payload_size
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.framing import MAX_FRAME_SIZE
from protocol.identity import public_key_from_peer_id
from protocol.messages import (
    AnyMessage,
    Goodbye,
    Hello,
    PeerExchange,
    PeerInfo,
    Prune,
    ReducedRecord,
    Signed,
    StateManifest,
    UpdateHeader,
    split_addr,
)
from protocol.reduced.records import COMMITMENT, RECORD_KINDS
from protocol.seen import ReplayWindow, SeenCache

MAX_PAYLOAD_SIZE = 1 << 36  # 64 GiB: a sanity bound, not a policy
MAX_ELEMENTS = 1 << 40
MAX_DIM = 1 << 32
MAX_BACKOFF_S = 24 * 3600


class RejectCounters:
    """How many messages were accepted and how many refused, per reason. Expose via /metrics."""

    def __init__(self) -> None:
        self.accepted = 0
        self.rejected: Counter[Reason] = Counter()

    def snapshot(self) -> dict[str, int]:
        """{"accepted": n, "<reason>": n, ...} with every reason present (zeros included)."""
        return {"accepted": self.accepted, **{r.value: self.rejected[r] for r in Reason}}


class Validator:
    """Owns the freshness state (seen-cache, replay window) of one node for one run."""

    def __init__(
        self,
        run_id: str,
        *,
        max_frame_size: int = MAX_FRAME_SIZE,
        max_payload_size: int = MAX_PAYLOAD_SIZE,
        seen: SeenCache | None = None,
        replay: ReplayWindow | None = None,
    ) -> None:
        if not run_id:
            raise LocalProtocolError("run_id must be non-empty")
        self.run_id = run_id
        self.max_frame_size = max_frame_size
        self.max_payload_size = max_payload_size
        self.seen = seen if seen is not None else SeenCache()
        self.replay = replay if replay is not None else ReplayWindow()
        self.counters = RejectCounters()

    def validate(self, data: bytes, now: float) -> AnyMessage:
        """Validate one frame body received at Unix time `now`; return the message if accepted.

        Raises RemoteProtocolError(reason) otherwise (counted). Nothing else escapes, whatever `data`
        holds. For signed messages, acceptance marks them seen: the same message again is DUPLICATE."""
        try:
            message = self._validate(data, now)
        except RemoteProtocolError as exc:
            self.counters.rejected[exc.reason] += 1
            raise
        self.counters.accepted += 1
        return message

    def mark_seen(self, signed: Signed, now: float) -> None:
        """Record a message as seen without validating it: call for every message this node publishes,
        so its own messages echoed back by gossip are DUPLICATE."""
        self.seen.add(signed.message_id, now)
        self.replay.record(signed.origin, signed.seqno, now, signed.message_id)

    def _validate(self, data: bytes, now: float) -> AnyMessage:
        if len(data) > self.max_frame_size:  # 1. size
            raise RemoteProtocolError(Reason.OVERSIZED, f"{len(data)}-byte frame body")
        message = wire.decode(data)  # 2. decode + 3. schema
        body = message.body if isinstance(message, Signed) else message
        if body.run_id != self.run_id:  # 4. run id
            raise RemoteProtocolError(Reason.WRONG_RUN_ID, f"{body.KIND} for run {body.run_id[:64]!r}")
        if isinstance(message, Signed):
            if self.seen.contains(message.message_id, now):  # 5. seen / replay
                raise RemoteProtocolError(Reason.DUPLICATE, message.message_id.hex())
            try:
                self.replay.check(message.origin, message.seqno, now, message.message_id)
            except RemoteProtocolError as exc:
                if exc.reason is Reason.DUPLICATE:  # a copy that outlived its seen-cache entry: remember
                    self.seen.add(message.message_id, now)  # it again (no IWANT for it on the next IHAVE)
                raise
            signing.verify(message)  # 6. signature
        _APPLICATION_CHECKS.get(type(body), _no_checks)(self, body)  # 7. application
        if isinstance(message, Signed):
            self.mark_seen(message, now)  # 8. mark seen
        return message


def _no_checks(validator: Validator, body: object) -> None:
    return None


def _check_addr(addr: str, what: str) -> None:
    if addr == "":
        return
    try:
        split_addr(addr)
    except ValueError as exc:
        raise RemoteProtocolError(Reason.BAD_SCHEMA, f"{what}: {exc}") from None


def _check_peer_info(info: PeerInfo) -> None:
    public_key_from_peer_id(info.peer_id)
    _check_addr(info.gossip_addr, "gossip_addr")
    _check_addr(info.http_addr, "http_addr")


def _check_hello(validator: Validator, hello: Hello) -> None:
    _check_peer_info(PeerInfo(hello.peer_id, hello.gossip_addr, hello.http_addr))


def _check_peer_exchange(validator: Validator, px: PeerExchange) -> None:
    for info in px.peers:
        _check_peer_info(info)


def _check_prune(validator: Validator, prune: Prune) -> None:
    if prune.backoff_s > MAX_BACKOFF_S:
        raise RemoteProtocolError(Reason.BAD_SCHEMA, f"backoff of {prune.backoff_s} s")
    for info in prune.peers:
        _check_peer_info(info)


def _check_update(validator: Validator, u: UpdateHeader) -> None:
    if u.codec not in codec_names():  # the built-ins (messages.KNOWN_CODECS) and any registered codec
        raise RemoteProtocolError(Reason.BAD_CODEC, f"codec {u.codec!r}")
    if u.base_slot > u.publish_slot:
        raise RemoteProtocolError(Reason.BAD_SLOT, f"base slot {u.base_slot} > publish slot {u.publish_slot}")
    if u.tokens == 0 or u.inner_steps == 0:
        raise RemoteProtocolError(Reason.BAD_SCHEMA, "tokens and inner_steps must be positive")
    if u.payload_size > validator.max_payload_size:
        raise RemoteProtocolError(Reason.OVERSIZED, f"payload of {u.payload_size} bytes")
    names = [name for name, _ in u.shapes]
    if not names or any(a >= b for a, b in zip(names, names[1:])):
        raise RemoteProtocolError(Reason.SHAPE_MISMATCH, "shapes must be non-empty, sorted by name, unique")
    total = 0
    for name, shape in u.shapes:
        if any(dim > MAX_DIM for dim in shape):
            raise RemoteProtocolError(Reason.SHAPE_MISMATCH, f"{name}: dimension above {MAX_DIM}")
        total += math.prod(shape)
    if total > MAX_ELEMENTS:
        raise RemoteProtocolError(Reason.SHAPE_MISMATCH, f"{total} elements")
    expected = payload_size(dict(u.shapes), u.codec)  # docs/payload-format.md: no header, exact length
    if u.payload_size != expected:
        raise RemoteProtocolError(
            Reason.SHAPE_MISMATCH, f"payload_size {u.payload_size} != {expected} for these shapes and codec"
        )


def _check_manifest(validator: Validator, m: StateManifest) -> None:
    names = [name for name, _, _ in m.blobs]
    if any(a >= b for a, b in zip(names, names[1:])):
        raise RemoteProtocolError(Reason.BAD_STATE, "blobs must be sorted by name, unique")
    for name, _, size in m.blobs:
        if size > validator.max_payload_size:
            raise RemoteProtocolError(Reason.OVERSIZED, f"blob {name} of {size} bytes")


def _check_goodbye(validator: Validator, g: Goodbye) -> None:
    return None


def _check_reduced(validator: Validator, r: ReducedRecord) -> None:
    if r.record_kind.encode() not in RECORD_KINDS:
        raise RemoteProtocolError(Reason.BAD_SCHEMA, f"record kind {r.record_kind[:32]!r}")
    if bool(r.header) != (r.record_kind.encode() == COMMITMENT):
        raise RemoteProtocolError(Reason.BAD_SCHEMA, "a commitment carries its update's header, no other record does")


_APPLICATION_CHECKS = {
    Hello: _check_hello,
    PeerExchange: _check_peer_exchange,
    Prune: _check_prune,
    UpdateHeader: _check_update,
    StateManifest: _check_manifest,
    Goodbye: _check_goodbye,
    ReducedRecord: _check_reduced,
}
