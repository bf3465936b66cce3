"""Seen-cache, seqno window and seqno source in isolation (time passed in)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import Reason, RemoteProtocolError
from protocol.seen import MICROS, ReplayWindow, SeenCache, SeqnoSource

NOW = 1_800_000_000.0
ID_A, ID_B = bytes(range(32)), bytes(range(1, 33))  # two message ids


def test_seen_cache_expires_and_is_bounded():
    cache = SeenCache(ttl_s=10, max_entries=3)
    cache.add(b"a", NOW)
    assert cache.contains(b"a", NOW + 9.9)
    assert not cache.contains(b"a", NOW + 10)
    for i, key in enumerate([b"b", b"c", b"d", b"e"]):
        cache.add(key, NOW + 20 + i)
    assert len(cache) == 3 and not cache.contains(b"b", NOW + 24)


@pytest.mark.slow
@settings(max_examples=400)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.sampled_from([0.0, 0.0, 1.0, 5.0])), max_size=40))
def test_seen_cache_matches_a_bounded_insertion_ordered_model(ops):
    """Any mix of adds and lookups at non-decreasing times: an id is seen iff it was (re-)added less
    than ttl_s ago and fewer than max_entries other ids were (re-)added since."""
    cache, model, now = SeenCache(ttl_s=5, max_entries=2), {}, NOW  # model: id -> expiry, oldest first
    for is_add, key, step in ops:
        now += step
        message_id = bytes([key])
        if is_add:
            cache.add(message_id, now)
            model.pop(message_id, None)
            model[message_id] = now + 5
            while len(model) > 2:
                del model[next(iter(model))]
        else:
            assert cache.contains(message_id, now) == (model.get(message_id, now) > now)
        assert len(cache) <= 2


def test_replay_window_refuses_seen_and_old_seqnos():
    w = ReplayWindow(window_s=100)
    s = int(NOW * MICROS)
    w.check("p", s, NOW, ID_A)
    w.record("p", s, NOW, ID_A)
    with pytest.raises(RemoteProtocolError) as info:
        w.check("p", s, NOW + 1, ID_B)
    assert info.value.reason == Reason.REPLAYED
    with pytest.raises(RemoteProtocolError) as info:  # the message it was accepted with, again
        w.check("p", s, NOW + 1, ID_A)
    assert info.value.reason == Reason.DUPLICATE
    w.check("p", s - 50 * MICROS, NOW, ID_B)  # older but inside the window: reordering is fine
    with pytest.raises(RemoteProtocolError) as info:
        w.check("p", s - 101 * MICROS, NOW, ID_B)
    assert info.value.reason == Reason.REPLAYED
    w.check("q", s, NOW, ID_A)  # other origins are independent


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=60))
def test_replay_window_accepts_each_seqno_once_in_any_order(offsets):
    w = ReplayWindow(window_s=3600, max_per_origin=16)
    base = int(NOW * MICROS)
    accepted = set()
    for off in offsets:
        try:
            w.check("p", base + off, NOW, ID_B)
        except RemoteProtocolError:
            assert off in accepted or len(accepted) > 16  # only repeats, or ones pushed below the floor
            continue
        assert off not in accepted
        w.record("p", base + off, NOW, ID_A)
        accepted.add(off)
    for off in accepted:  # nothing accepted can ever be accepted again
        with pytest.raises(RemoteProtocolError):
            w.check("p", base + off, NOW, ID_B)


def test_replay_window_forgets_least_recent_origins_but_keeps_the_time_floor():
    w = ReplayWindow(window_s=100, max_origins=2)
    for i, origin in enumerate("abc"):
        w.record(origin, int(NOW * MICROS) + i, NOW, ID_A)
    assert len(w) == 2
    with pytest.raises(RemoteProtocolError):
        w.check("a", int((NOW - 200) * MICROS), NOW, ID_A)


def test_seqno_source_is_strictly_increasing_even_if_the_clock_steps_back():
    src = SeqnoSource()
    a = src.next(NOW)
    b = src.next(NOW)
    c = src.next(NOW - 5)
    assert a == int(NOW * MICROS) and a < b < c
    assert SeqnoSource(last=c).next(NOW - 10) == c + 1
