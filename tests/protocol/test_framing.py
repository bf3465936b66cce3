"""FrameDecoder: chunk boundaries do not matter, oversized prefixes fail early, truncation never yields."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from protocol_strategies import RUN_ID

from protocol import wire
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.framing import MAX_FRAME_SIZE, FrameDecoder, encode_frame, frame
from protocol.messages import Graft

bodies = st.lists(st.binary(max_size=300), max_size=8)


def _drain(decoder: FrameDecoder) -> list[bytes]:
    out = []
    while (body := decoder.next_frame()) is not None:
        out.append(body)
    return out


@given(bodies, st.data())
def test_any_chunking_yields_the_same_frames(frames, data):
    stream = b"".join(frame(b) for b in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    decoder = FrameDecoder()
    got = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)]):
        decoder.receive_data(stream[a:b]) if b > a else None
        got += _drain(decoder)
    decoder.receive_data(b"")  # end of stream
    got += _drain(decoder)
    assert got == frames
    assert decoder.buffered == 0


@given(bodies, st.integers(1, 2000))
def test_truncated_stream_never_yields_the_partial_frame(frames, cut):
    last = frame(b"last frame body")
    stream = b"".join(frame(b) for b in frames) + last
    cut = 1 + (cut - 1) % (len(last) - 1)  # leave 1..len(last)-1 bytes of the last frame
    decoder = FrameDecoder()
    decoder.receive_data(stream[:-cut])
    assert _drain(decoder) == frames  # complete frames come out, the partial one never does
    decoder.receive_data(b"")
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_frame()
    assert info.value.reason == Reason.TRUNCATED


def test_oversized_prefix_is_refused_before_the_body_arrives():
    decoder = FrameDecoder()
    with pytest.raises(RemoteProtocolError) as info:
        decoder.receive_data((MAX_FRAME_SIZE + 1).to_bytes(4, "big"))
    assert info.value.reason == Reason.OVERSIZED
    assert decoder.buffered == 0
    with pytest.raises(RemoteProtocolError):  # broken for good: the connection must close
        decoder.receive_data(b"\0\0\0\0")


def test_oversized_prefix_split_across_chunks_is_refused_on_its_fourth_byte():
    decoder = FrameDecoder(max_frame_size=100)
    for byte in b"\0\0\0":
        decoder.receive_data(bytes([byte]))
    with pytest.raises(RemoteProtocolError):
        decoder.receive_data(b"\x65")  # 101


def test_oversized_frame_after_a_good_one_in_the_same_chunk():
    decoder = FrameDecoder(max_frame_size=100)
    decoder.receive_data(frame(b"ok") + (101).to_bytes(4, "big"))
    assert decoder.next_frame() == b"ok"
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_frame()
    assert info.value.reason == Reason.OVERSIZED


def test_frame_size_limit_is_inclusive_and_enforced_on_send():
    decoder = FrameDecoder(max_frame_size=10)
    decoder.receive_data(frame(b"x" * 10, 10))
    assert decoder.next_frame() == b"x" * 10
    with pytest.raises(LocalProtocolError):
        frame(b"x" * 11, 10)


def test_encode_frame_round_trips_a_message():
    decoder = FrameDecoder()
    message = Graft(RUN_ID, "updates")
    decoder.receive_data(encode_frame(message) * 3)
    assert [wire.decode(b) for b in _drain(decoder)] == [message] * 3


@given(st.lists(st.binary(max_size=64), max_size=10))
def test_arbitrary_chunks_raise_only_remote_protocol_errors(chunks):
    decoder = FrameDecoder(max_frame_size=1000)
    try:
        for chunk in chunks:
            decoder.receive_data(chunk or b"\0")
            for body in _drain(decoder):
                try:
                    wire.decode(body)
                except RemoteProtocolError:
                    pass
        decoder.receive_data(b"")
        _drain(decoder)
    except RemoteProtocolError:
        pass
