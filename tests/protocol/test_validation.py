"""The ordered validator: signatures, run binding, replay protection, application checks, counters."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_strategies import IDENTITIES, RUN_ID, any_messages, valid_bodies

from protocol import signing, wire
from protocol.compression.formats import payload_size
from protocol.errors import LocalProtocolError, ProtocolError, Reason, RemoteProtocolError
from protocol.messages import Goodbye, Hello, PeerExchange, PeerInfo, Prune, StateManifest, UpdateHeader
from protocol.seen import ReplayWindow, SeenCache, SeqnoSource
from protocol.validation import Validator

NOW = 1_800_000_000.0  # Unix seconds; tests pass time in, never read a clock
ALICE, BOB = IDENTITIES[0], IDENTITIES[1]


def _update(ident=ALICE, seqno=None, **kw):
    fields = dict(
        run_id=RUN_ID, origin=ident.peer_id, seqno=int(NOW * 1e6) if seqno is None else seqno, base_slot=3,
        publish_slot=5, tokens=4096, inner_steps=50, codec="int4", shapes=(("b", (4,)), ("w", (2, 3))),
        payload_sha256=b"\x11" * 32,
    )
    fields.update(kw)
    if "payload_size" not in fields:
        fields["payload_size"] = payload_size(dict(fields["shapes"]), fields["codec"])
    return UpdateHeader(**fields)


def _reject(validator, data, now=NOW):
    with pytest.raises(RemoteProtocolError) as info:
        validator.validate(data, now)
    return info.value.reason


@pytest.mark.slow
@settings(max_examples=6)  # each example flips every bit of the message (~2000 validations)
@given(valid_bodies())
def test_signed_messages_validate_and_bit_flips_anywhere_are_refused(pair):
    ident, body = pair
    body = dataclasses.replace(body, seqno=int(NOW * 1e6))
    data = wire.encode(signing.sign(ident, body))
    assert Validator(RUN_ID).validate(data, NOW).body == body
    for bit in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(RemoteProtocolError):
            Validator(RUN_ID).validate(bytes(flipped), NOW)


def test_signature_by_another_key_is_refused():
    forged = signing.sign(ALICE, _update(ALICE))
    impostor = dataclasses.replace(forged, body=_update(BOB))
    assert _reject(Validator(RUN_ID), wire.encode(impostor)) == Reason.BAD_SIGNATURE
    with pytest.raises(LocalProtocolError):
        signing.sign(ALICE, _update(BOB))  # cannot sign as somebody else


def test_same_fields_cannot_verify_as_another_kind():
    """Domain separation: a Goodbye signature does not verify over the same bytes as another kind."""
    bye = signing.sign(ALICE, Goodbye(RUN_ID, ALICE.peer_id, int(NOW * 1e6), "x"))
    raw = wire.encode(bye).replace(b"\xa7goodbye", b"\xa8manifest")
    with pytest.raises(RemoteProtocolError):
        Validator(RUN_ID).validate(raw, NOW)


def test_malformed_origin_is_bad_identity():
    msg = signing.sign(ALICE, _update())
    bad = dataclasses.replace(msg, body=dataclasses.replace(msg.body, origin="12D3KooWnotapeerid"))
    assert _reject(Validator(RUN_ID), wire.encode(bad)) == Reason.BAD_IDENTITY


def test_other_run_id_is_refused_for_every_kind():
    v = Validator(RUN_ID)
    other = "another-run"
    signed = signing.sign(ALICE, _update(run_id=other))
    assert _reject(v, wire.encode(signed)) == Reason.WRONG_RUN_ID
    hello = Hello(other, 1, ALICE.peer_id, "127.0.0.1:1", "", b"\0" * 32, "t")
    assert _reject(v, wire.encode(hello)) == Reason.WRONG_RUN_ID
    assert v.counters.rejected[Reason.WRONG_RUN_ID] == 2


def test_a_copy_after_seen_cache_expiry_is_a_duplicate_another_message_under_its_seqno_a_replay():
    v = Validator(RUN_ID, seen=SeenCache(ttl_s=10), replay=ReplayWindow(window_s=600))
    update = _update()
    data = wire.encode(signing.sign(ALICE, update))
    v.validate(data, NOW)
    assert _reject(v, data, NOW + 5) == Reason.DUPLICATE  # normal gossip duplicate
    # the seen-cache forgot it; the seqno window knows this very message: an honest late forward
    assert _reject(v, data, NOW + 60) == Reason.DUPLICATE
    assert v.seen.contains(signing.sign(ALICE, update).message_id, NOW + 61)  # remembered again
    other = wire.encode(signing.sign(ALICE, dataclasses.replace(update, tokens=update.tokens + 1)))
    assert _reject(v, other, NOW + 60) == Reason.REPLAYED  # another message under an accepted seqno
    assert _reject(v, data, NOW + 6000) == Reason.REPLAYED  # older than the window altogether
    assert v.counters.snapshot()["accepted"] == 1
    assert v.counters.snapshot()["duplicate"] == 2
    assert v.counters.snapshot()["replayed"] == 2


def test_old_capture_is_refused_by_a_node_that_never_saw_the_origin():
    data = wire.encode(signing.sign(ALICE, _update(seqno=int((NOW - 7200) * 1e6))))
    assert _reject(Validator(RUN_ID, replay=ReplayWindow(window_s=3600)), data) == Reason.REPLAYED


def test_out_of_order_seqnos_inside_the_window_are_accepted():
    v = Validator(RUN_ID)
    src = SeqnoSource()
    msgs = [signing.sign(ALICE, _update(seqno=src.next(NOW + i))) for i in range(5)]
    for i in (3, 0, 4, 1, 2):
        v.validate(wire.encode(msgs[i]), NOW + 10)


def test_restarted_node_is_not_refused():
    v = Validator(RUN_ID)
    before = SeqnoSource()
    for t in range(3):
        v.validate(wire.encode(signing.sign(ALICE, _update(seqno=before.next(NOW + t)))), NOW + t)
    after_restart = SeqnoSource()  # fresh process, nothing persisted
    fresh = signing.sign(ALICE, Goodbye(RUN_ID, ALICE.peer_id, after_restart.next(NOW + 30), "restart"))
    assert v.validate(wire.encode(fresh), NOW + 30) == fresh


def test_forged_copy_does_not_poison_the_caches():
    """A forgery with a real message's seqno must not block the real message (mark after verify)."""
    v = Validator(RUN_ID)
    real = signing.sign(ALICE, _update())
    forged = dataclasses.replace(real, signature=bytes(64))
    assert _reject(v, wire.encode(forged)) == Reason.BAD_SIGNATURE
    assert v.validate(wire.encode(real), NOW) == real


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        (dict(codec="fp8", payload_size=9), Reason.BAD_CODEC),
        (dict(base_slot=6, publish_slot=5), Reason.BAD_SLOT),
        (dict(tokens=0), Reason.BAD_SCHEMA),
        (dict(inner_steps=0), Reason.BAD_SCHEMA),
        (dict(payload_size=8), Reason.SHAPE_MISMATCH),  # int4 of b(4,), w(2, 3) is 4 + 5 bytes
        (dict(payload_size=10), Reason.SHAPE_MISMATCH),
        (dict(codec="fp32", payload_size=9), Reason.SHAPE_MISMATCH),
        (dict(payload_size=1 << 40), Reason.OVERSIZED),
        (dict(shapes=()), Reason.SHAPE_MISMATCH),
        (dict(shapes=(("w", (2,)), ("b", (2,)))), Reason.SHAPE_MISMATCH),  # unsorted
        (dict(shapes=(("w", (2,)), ("w", (2,)))), Reason.SHAPE_MISMATCH),  # duplicate
        (dict(shapes=(("w", (2**33, 3)),), payload_size=9), Reason.SHAPE_MISMATCH),
        (dict(shapes=(("w", (2**21,) * 3),), payload_size=9), Reason.SHAPE_MISMATCH),  # 2**63 elements
    ],
)
def test_update_application_checks(changes, reason):
    data = wire.encode(signing.sign(ALICE, _update(**changes)))
    assert _reject(Validator(RUN_ID), data) == reason


def test_manifest_and_control_application_checks():
    unsorted = StateManifest(RUN_ID, ALICE.peer_id, int(NOW * 1e6), 7, b"\0" * 32, b"\1" * 32,
                             (("params", b"\2" * 32, 10), ("momentum", b"\3" * 32, 10)))
    assert _reject(Validator(RUN_ID), wire.encode(signing.sign(ALICE, unsorted))) == Reason.BAD_STATE
    v = Validator(RUN_ID)
    good = PeerInfo(BOB.peer_id, "10.0.0.2:4001", "[::1]:8000")
    assert v.validate(wire.encode(PeerExchange(RUN_ID, (good,))), NOW)
    for bad, reason in [
        (PeerInfo("12D3KooWx", "10.0.0.2:4001", ""), Reason.BAD_IDENTITY),
        (PeerInfo(BOB.peer_id, "10.0.0.2", ""), Reason.BAD_SCHEMA),
        (PeerInfo(BOB.peer_id, "::1:80", ""), Reason.BAD_SCHEMA),
        (PeerInfo(BOB.peer_id, "h:99999", ""), Reason.BAD_SCHEMA),
    ]:
        assert _reject(v, wire.encode(PeerExchange(RUN_ID, (good, bad)))) == reason
    assert _reject(v, wire.encode(Prune(RUN_ID, "updates", 10**6, ()))) == Reason.BAD_SCHEMA


def test_update_payload_size_follows_the_payload_format():
    v = Validator(RUN_ID)
    empty = _update(shapes=(("e", (0, 5)), ("s", ())), codec="fp32")  # empty tensor and a scalar
    assert empty.payload_size == 4
    assert v.validate(wire.encode(signing.sign(ALICE, empty)), NOW).body == empty


def test_oversized_body_is_refused_before_decoding():
    v = Validator(RUN_ID, max_frame_size=64)
    assert _reject(v, b"\xc1" * 65) == Reason.OVERSIZED


@given(st.binary(max_size=400))
def test_arbitrary_bytes_into_the_validator_raise_only_protocol_errors(data):
    try:
        Validator(RUN_ID).validate(data, NOW)
    except RemoteProtocolError:
        pass


@given(any_messages, st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_valid_frames_into_the_validator_raise_only_protocol_errors(message, edits):
    data = bytearray(wire.encode(message))
    for pos, value in edits:
        data[pos % len(data)] = value
    try:
        Validator(RUN_ID).validate(bytes(data), NOW)
    except ProtocolError:
        pass


def test_counters_snapshot_lists_every_reason():
    snap = Validator(RUN_ID).counters.snapshot()
    assert set(snap) == {"accepted", *(r.value for r in Reason)}
    assert not any(snap.values())
