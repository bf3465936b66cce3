"""Canonical encoding: round trips, strictness, and that nothing but protocol errors escapes decode."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from protocol_strategies import BY_TYPE, IDENTITIES, RUN_ID, any_messages

from protocol import wire
from protocol.errors import LocalProtocolError, ProtocolError, Reason, RemoteProtocolError
from protocol.messages import (
    MESSAGE_TYPES,
    Goodbye,
    Heartbeat,
    IWant,
    PeerExchange,
    PeerInfo,
    Signed,
    UpdateHeader,
)


@pytest.mark.parametrize("cls", MESSAGE_TYPES, ids=lambda c: c.__name__)
@given(data=st.data())
def test_every_message_type_round_trips_byte_for_byte(cls, data):
    message = data.draw(BY_TYPE[cls])
    assert (type(message.body) if isinstance(message, Signed) else type(message)) is cls
    encoded = wire.encode(message)
    decoded = wire.decode(encoded)
    assert decoded == message
    assert type(decoded) is type(message)
    assert wire.encode(decoded) == encoded


def test_strategies_cover_every_message_type():
    assert set(BY_TYPE) == set(MESSAGE_TYPES)


@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_remote_protocol_errors(data):
    try:
        wire.decode(data)
    except RemoteProtocolError:
        pass


@given(any_messages, st.data())
def test_mutated_encodings_raise_only_protocol_errors(message, data):
    encoded = bytearray(wire.encode(message))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "delete", "insert", "truncate", "set"]))
        pos = data.draw(st.integers(0, max(len(encoded) - 1, 0)))
        if op == "flip" and encoded:
            encoded[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "delete" and encoded:
            del encoded[pos]
        elif op == "insert":
            encoded.insert(pos, data.draw(st.integers(0, 255)))
        elif op == "truncate":
            del encoded[pos:]
        elif encoded:
            encoded[pos] = data.draw(st.sampled_from([0xC0, 0xC1, 0xC2, 0xCA, 0xCB, 0xD3, 0xDF, 0xFF, 0x90]))
    try:
        result = wire.decode(bytes(encoded))
    except RemoteProtocolError:
        return
    assert wire.encode(result) == bytes(encoded)  # whatever is accepted is canonical


def _hb(**kw):
    fields = dict(run_id=RUN_ID, slot=3, round=4, state="train", counter=5)
    fields.update(kw)
    return Heartbeat(**fields)


def _raw(kind, body, *rest):
    return msgpack.packb([kind, body, *rest], use_bin_type=True)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", Reason.TRUNCATED),
        (b"\x92\xa9heartbeat", Reason.TRUNCATED),
        (b"\xc1", Reason.MALFORMED),
        (b"\x91" * 5000, Reason.MALFORMED),  # nesting deeper than the unpacker's stack
        (b"\x91" * 600 + b"\x00", Reason.BAD_SCHEMA),  # deep but parseable nesting
        (b"\xdd\xff\xff\xff\xff", Reason.MALFORMED),  # array32 claiming 4 G items: no allocation
        (b"\xdb\xff\xff\xff\xff" + b"a" * 10, Reason.TRUNCATED),  # str32 longer than the body
        (b"\xc6\x00\x10\x00\x00" + b"a" * 10, Reason.TRUNCATED),  # bin32 longer than the body
        (_raw("heartbeat", [RUN_ID, 3, 4, "train", 5]) + b"\x00", Reason.MALFORMED),  # trailing byte
        (_raw("heartbeat", [RUN_ID, 3.0, 4, "train", 5]), Reason.BAD_SCHEMA),  # float for int
        (_raw("heartbeat", [RUN_ID, True, 4, "train", 5]), Reason.BAD_SCHEMA),  # bool for int
        (_raw("heartbeat", [RUN_ID, -1, 4, "train", 5]), Reason.BAD_SCHEMA),  # negative
        (_raw("heartbeat", [RUN_ID, None, 4, "train", 5]), Reason.BAD_SCHEMA),
        (_raw("heartbeat", [RUN_ID.encode(), 3, 4, "train", 5]), Reason.BAD_SCHEMA),  # bin for str
        (_raw("heartbeat", [RUN_ID, 3, 4, "train"]), Reason.BAD_SCHEMA),  # missing field
        (_raw("heartbeat", [RUN_ID, 3, 4, "train", 5, 6]), Reason.BAD_SCHEMA),  # extra field
        (_raw("heartbeat", [RUN_ID, 3, 4, "x" * 33, 5]), Reason.BAD_SCHEMA),  # too long
        (_raw("heartbeat", {"run_id": RUN_ID}), Reason.BAD_SCHEMA),  # map instead of array
        (_raw("nonsense", []), Reason.BAD_SCHEMA),
        (_raw("heartbeat", [RUN_ID, 3, 4, "train", 5], b"\0" * 64), Reason.BAD_SCHEMA),  # sig on unsigned
        (_raw("goodbye", [RUN_ID, IDENTITIES[0].peer_id, 1, "bye"]), Reason.BAD_SCHEMA),  # unsigned signed
        (_raw("goodbye", [RUN_ID, IDENTITIES[0].peer_id, 1, "bye"], b"\0" * 63), Reason.BAD_SCHEMA),
        (_raw("iwant", [RUN_ID, [b"\0" * 31]]), Reason.BAD_SCHEMA),  # 31-byte id
        (msgpack.packb({"a": 1}), Reason.BAD_SCHEMA),
        (msgpack.packb({1: 1}), Reason.MALFORMED),  # strict_map_key
        (msgpack.packb(msgpack.ExtType(1, b"x")), Reason.BAD_SCHEMA),
    ],
)
def test_decode_refuses_with_a_named_reason(data, reason):
    with pytest.raises(RemoteProtocolError) as info:
        wire.decode(data)
    assert info.value.reason == reason


def test_non_canonical_encodings_are_refused():
    canonical = wire.encode(_hb(slot=3))
    assert wire.decode(canonical) == _hb(slot=3)
    # same value, 3 encoded as uint64 (0xcf) instead of a positive fixint
    long_form = canonical.replace(b"\xa8run-test\x03", b"\xa8run-test\xcf" + (3).to_bytes(8, "big"))
    assert long_form != canonical
    # "train" as str8 (0xd9) instead of fixstr; array16 instead of fixarray for the body
    str8 = canonical.replace(b"\xa5train", b"\xd9\x05train")
    arr16 = canonical.replace(b"\x95\xa8run-test", b"\xdc\x00\x05\xa8run-test")
    for data in (long_form, str8, arr16):
        assert data != canonical
        with pytest.raises(RemoteProtocolError) as info:
            wire.decode(data)
        assert info.value.reason == Reason.MALFORMED


def test_float_that_equals_an_int_is_still_refused():
    with pytest.raises(RemoteProtocolError):
        wire.decode(msgpack.packb(["iwant", [RUN_ID, []]], use_bin_type=True).replace(b"\x90", b"\xcb" + b"\0" * 8))


@pytest.mark.parametrize(
    "message",
    [
        _hb(slot=-1),
        _hb(slot=2**64),
        _hb(slot=1.0),
        _hb(slot=True),
        _hb(run_id=b"run"),
        _hb(state="\ud800"),  # lone surrogate: not UTF-8
        IWant(RUN_ID, [b"\0" * 32]),  # list, not tuple
        IWant(RUN_ID, (b"\0" * 32,) * 5001),
        PeerExchange(RUN_ID, (("a", "b", "c"),)),  # tuple, not PeerInfo
        PeerInfo("a", "b", "c"),  # not a message
        Goodbye(RUN_ID, IDENTITIES[0].peer_id, 1, "bye"),  # signed kind without its signature
        Signed(_hb(), b"\0" * 64),  # unsigned kind wrapped
        Signed(Goodbye(RUN_ID, IDENTITIES[0].peer_id, 1, "bye"), b"\0" * 10),
    ],
)
def test_encode_refuses_invalid_local_messages(message):
    with pytest.raises(LocalProtocolError):
        wire.encode(message)


def test_signing_input_is_domain_separated_by_kind():
    body = UpdateHeader(
        RUN_ID, IDENTITIES[0].peer_id, 1, 0, 0, 1, 1, "fp32", (("w", (2,)),), b"\0" * 32, 8
    )
    assert wire.signing_input(body).startswith(b"diloco/v1:update:")
    assert wire.signing_input(body).endswith(wire.encode_body(body))


def test_decode_errors_are_protocol_errors():
    assert issubclass(RemoteProtocolError, ProtocolError)


def test_optional_fields_are_left_off_at_their_default_and_filled_in_when_absent():
    from protocol.messages import Hello

    body = UpdateHeader(RUN_ID, IDENTITIES[0].peer_id, 1, 0, 0, 1, 1, "fp32", (("w", (2,)),), b"\0" * 32, 8)
    assert len(msgpack.unpackb(wire.encode_body(body))) == 11  # as before `membership` was added
    admitted = dataclasses.replace(body, membership=b"cert")
    assert len(msgpack.unpackb(wire.encode_body(admitted))) == 12
    hello = Hello(RUN_ID, 1, IDENTITIES[0].peer_id, "", "", b"\1" * 32, "x")
    assert len(msgpack.unpackb(wire.encode(hello))[1]) == 7
    assert wire.decode(wire.encode(hello)) == hello  # an older peer's hello: run_config "", no membership
    explicit = msgpack.packb(["hello", [*msgpack.unpackb(wire.encode(hello))[1], "", b""]], use_bin_type=True)
    assert wire.decode(explicit) == hello  # a control message may spell its defaults out


def test_a_signed_body_spelling_its_last_optional_field_at_the_default_is_refused():
    body = UpdateHeader(RUN_ID, IDENTITIES[0].peer_id, 1, 0, 0, 1, 1, "fp32", (("w", (2,)),), b"\0" * 32, 8)
    fields = [*msgpack.unpackb(wire.encode_body(body)), b""]
    frame = msgpack.packb(["update", fields, b"\0" * 64], use_bin_type=True)
    with pytest.raises(RemoteProtocolError) as err:
        wire.decode(frame)  # two encodings of one body would be two message ids for one signature input
    assert err.value.reason is Reason.BAD_SCHEMA
    short = msgpack.packb(["update", fields[:10], b"\0" * 64], use_bin_type=True)
    with pytest.raises(RemoteProtocolError):
        wire.decode(short)  # required fields stay required
