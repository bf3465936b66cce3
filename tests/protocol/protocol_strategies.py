"""Hypothesis strategies for every wire message, and a few fixed identities (key generation is not
what these tests exercise). Values satisfy the wire schema; `valid_*` ones also pass application checks."""

from __future__ import annotations

import hashlib

from hypothesis import strategies as st

from protocol.compression.formats import payload_size
from protocol.identity import Identity
from protocol.messages import (
    PROTOCOL_VERSION,
    Goodbye,
    Graft,
    Heartbeat,
    Hello,
    HelloProof,
    IHave,
    IWant,
    PeerExchange,
    PeerInfo,
    Prune,
    ReducedRecord,
    Signed,
    StateManifest,
    UpdateHeader,
)
from protocol.validation import MAX_PAYLOAD_SIZE

IDENTITIES = tuple(Identity.from_seed(hashlib.sha256(b"test-key-%d" % i).digest()) for i in range(4))
RUN_ID = "run-test"

u64 = st.integers(0, 2**64 - 1)
small = st.integers(0, 2**40)
b32 = st.binary(min_size=32, max_size=32)
b64 = st.binary(min_size=64, max_size=64)
text = st.text(max_size=24)
run_ids = st.one_of(st.just(RUN_ID), st.text(min_size=1, max_size=24))
identities = st.sampled_from(IDENTITIES)
peer_ids = identities.map(lambda i: i.peer_id)
hosts = st.one_of(
    st.sampled_from(["127.0.0.1", "10.0.0.7", "[::1]", "node-3.example.org"]),
    st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
)
addrs = st.one_of(st.just(""), st.builds(lambda h, p: f"{h}:{p}", hosts, st.integers(1, 65535)))
peer_infos = st.builds(PeerInfo, peer_ids, addrs, addrs)
topics = st.sampled_from(["updates", "manifests", "t"])
ids = st.lists(b32, max_size=6).map(tuple)
names = st.text(min_size=1, max_size=12)
shapes = st.lists(
    st.tuples(names, st.lists(st.integers(0, 512), max_size=4).map(tuple)),
    min_size=1,
    max_size=6,
    unique_by=lambda t: t[0],
).map(lambda xs: tuple(sorted(xs)))
codecs = st.sampled_from(["fp32", "bf16", "int8", "int4"])
blobs = st.lists(st.tuples(names, b32, st.integers(0, 2**36)), max_size=5, unique_by=lambda t: t[0]).map(
    lambda xs: tuple(sorted(xs))
)

memberships = st.one_of(st.just(b""), st.binary(min_size=1, max_size=200))  # optional fields: empty is left off
hellos = st.builds(Hello, run_ids, st.just(PROTOCOL_VERSION) | u64, peer_ids, addrs, addrs, b32, text,
                   st.one_of(st.just(""), text), memberships)
hello_proofs = st.builds(HelloProof, run_ids, peer_ids, b64)
peer_exchanges = st.builds(PeerExchange, run_ids, st.lists(peer_infos, max_size=5).map(tuple))
heartbeats = st.builds(Heartbeat, run_ids, u64, u64, st.text(max_size=8), u64)
grafts = st.builds(Graft, run_ids, topics)
prunes = st.builds(Prune, run_ids, topics, st.integers(0, 3600), st.lists(peer_infos, max_size=3).map(tuple))
ihaves = st.builds(IHave, run_ids, topics, ids)
iwants = st.builds(IWant, run_ids, ids)
control_messages = st.one_of(hellos, hello_proofs, peer_exchanges, heartbeats, grafts, prunes, ihaves, iwants)


def _update(origin, run_id=RUN_ID):
    return st.builds(
        lambda seq, base, gap, tokens, steps, codec, shp, sha, membership: UpdateHeader(
            run_id, origin, seq, base, base + gap, tokens, steps, codec, shp, sha,
            payload_size(dict(shp), codec), membership,
        ),
        small, small, small, st.integers(1, 2**32), st.integers(1, 10**6), codecs, shapes, b32, memberships,
    ).filter(lambda u: u.payload_size <= MAX_PAYLOAD_SIZE)  # four dimensions of 512 floats can pass the bound


def _goodbye(origin, run_id=RUN_ID):
    return st.builds(Goodbye, st.just(run_id), st.just(origin), small, text)


def _reduced(origin, run_id=RUN_ID):  # the schema only: the record inside is checked by protocol.reduced.records
    return st.builds(ReducedRecord, st.just(run_id), st.just(origin), small, st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=32),
                     st.binary(min_size=1, max_size=200), b64, st.binary(max_size=200), memberships)


def _manifest(origin, run_id=RUN_ID):
    return st.builds(StateManifest, st.just(run_id), st.just(origin), small, small, b32, b32, blobs)


@st.composite
def valid_bodies(draw, run_id: str = RUN_ID):
    """(identity, body) for a signed kind that passes application checks; seqno is arbitrary."""
    ident = draw(identities)
    maker = draw(st.sampled_from([_update, _goodbye, _manifest]))
    return ident, draw(maker(ident.peer_id, run_id))


@st.composite
def schema_signed(draw):
    """Signed messages that satisfy the schema only (random signature, any run id)."""
    ident, body = draw(valid_bodies(run_id=draw(run_ids)))
    return Signed(body, draw(b64))


def _schema_signed_of(maker):
    return st.builds(
        lambda ident, run_id, data, sig: Signed(data.draw(maker(ident.peer_id, run_id)), sig),
        identities, run_ids, st.data(), b64,
    )


any_messages = st.one_of(control_messages, schema_signed())

# one strategy per message type (signed kinds wrapped in Signed with a random signature)
BY_TYPE = {
    Hello: hellos,
    HelloProof: hello_proofs,
    PeerExchange: peer_exchanges,
    Heartbeat: heartbeats,
    Graft: grafts,
    Prune: prunes,
    IHave: ihaves,
    IWant: iwants,
    UpdateHeader: _schema_signed_of(_update),
    Goodbye: _schema_signed_of(_goodbye),
    StateManifest: _schema_signed_of(_manifest),
    ReducedRecord: _schema_signed_of(_reduced),
}
