"""Handshake proofs: key possession, no reflection, no replay onto another connection."""

from __future__ import annotations

import dataclasses

import pytest
from protocol_strategies import IDENTITIES, RUN_ID

from protocol import signing, wire
from protocol.errors import Reason, RemoteProtocolError
from protocol.framing import FrameDecoder, encode_frame
from protocol.messages import PROTOCOL_VERSION, Hello
from protocol.validation import Validator

ALICE, BOB, MALLORY = IDENTITIES[:3]
NOW = 1_800_000_000.0


def _hello(ident, challenge=None, run_id=RUN_ID, addr="127.0.0.1:4001"):
    return Hello(run_id, PROTOCOL_VERSION, ident.peer_id, addr, "127.0.0.1:8001",
                 challenge or signing.new_challenge(), "diloco-test")


def _reason(fn, *args):
    with pytest.raises(RemoteProtocolError) as info:
        fn(*args)
    return info.value.reason


def test_handshake_over_frames_in_memory():
    """Both sides send Hello, check the other's, answer with a proof, verify the other's proof."""
    hellos = {ALICE: _hello(ALICE), BOB: _hello(BOB, addr="[::1]:4002")}
    inbox = {ALICE: FrameDecoder(), BOB: FrameDecoder()}
    peer = {ALICE: BOB, BOB: ALICE}
    for me in (ALICE, BOB):
        inbox[peer[me]].receive_data(encode_frame(hellos[me]))
    for me in (ALICE, BOB):
        theirs = Validator(RUN_ID).validate(inbox[me].next_frame(), NOW)
        signing.check_hello(theirs, hellos[me])
        inbox[peer[me]].receive_data(encode_frame(signing.make_hello_proof(me, hellos[me], theirs)))
    for me in (ALICE, BOB):
        proof = Validator(RUN_ID).validate(inbox[me].next_frame(), NOW)
        signing.verify_hello_proof(proof, hellos[me], hellos[peer[me]])


def test_check_hello_refusals():
    ours = _hello(ALICE)
    assert _reason(signing.check_hello, dataclasses.replace(_hello(BOB), version=2), ours) == Reason.UNSUPPORTED_VERSION
    assert _reason(signing.check_hello, _hello(BOB, run_id="other"), ours) == Reason.WRONG_RUN_ID
    assert _reason(signing.check_hello, ours, ours) == Reason.BAD_HANDSHAKE  # our own Hello reflected
    echoed = _hello(MALLORY, challenge=ours.challenge)
    assert _reason(signing.check_hello, echoed, ours) == Reason.BAD_HANDSHAKE
    bad_id = dataclasses.replace(_hello(BOB), peer_id="12D3KooWfake")
    assert _reason(signing.check_hello, bad_id, ours) == Reason.BAD_IDENTITY


def test_proofs_do_not_transfer():
    a, b = _hello(ALICE), _hello(BOB)
    proof_b = signing.make_hello_proof(BOB, b, a)
    signing.verify_hello_proof(proof_b, a, b)
    # replayed on a new connection (Alice picked a fresh challenge)
    a2 = _hello(ALICE)
    assert _reason(signing.verify_hello_proof, proof_b, a2, b) == Reason.BAD_SIGNATURE
    # reflection: Alice's own proof sent back to her, claiming to be Bob's
    proof_a = signing.make_hello_proof(ALICE, a, b)
    reflected = dataclasses.replace(proof_a, peer_id=BOB.peer_id)
    assert _reason(signing.verify_hello_proof, reflected, a, b) == Reason.BAD_SIGNATURE
    # Mallory relays Bob's proof while claiming Bob's id but advertising her own address
    mallory_as_bob = dataclasses.replace(b, gossip_addr="6.6.6.6:1")
    assert _reason(signing.verify_hello_proof, proof_b, a, mallory_as_bob) == Reason.BAD_SIGNATURE
    # proof names another peer than the Hello
    assert _reason(signing.verify_hello_proof, proof_a, a, b) == Reason.BAD_HANDSHAKE
    assert _reason(signing.verify_hello_proof, dataclasses.replace(proof_b, run_id="x"), a, b) == Reason.WRONG_RUN_ID


def test_transcript_is_role_ordered():
    a, b = _hello(ALICE), _hello(BOB)
    assert signing.hello_transcript(a, b) != signing.hello_transcript(b, a)
    assert signing.hello_transcript(a, b).startswith(b"diloco/v1:hello_proof:")
    assert wire.decode(wire.encode(signing.make_hello_proof(ALICE, a, b))).peer_id == ALICE.peer_id


def test_a_peer_with_another_run_configuration_is_refused_with_the_fields_named():
    from protocol.runconfig import config_hash, encode_config

    ours_cfg = encode_config({"inner.lr": 0.003, "outer.window": 8, "model.d_model": 64, "outer.embeddings": ("e",)})
    theirs_cfg = encode_config({"inner.lr": 0.5, "outer.window": 8, "model.d_model": 64, "outer.embeddings": ("e",)})
    assert ours_cfg == "inner.lr=0.003\nmodel.d_model=64\nouter.embeddings=[\"e\"]\nouter.window=8\n"  # canonical
    ours = dataclasses.replace(_hello(ALICE), run_config=ours_cfg)
    same = dataclasses.replace(_hello(BOB), run_config=ours_cfg)
    signing.check_hello(same, ours)
    with pytest.raises(RemoteProtocolError) as info:
        signing.check_hello(dataclasses.replace(_hello(BOB), run_config=theirs_cfg), ours)
    assert info.value.reason is Reason.CONFIG_MISMATCH
    assert "inner.lr: ours 0.003, theirs 0.5" in info.value.detail and "window" not in info.value.detail
    missing = encode_config({"inner.lr": 0.003})
    with pytest.raises(RemoteProtocolError) as info:
        signing.check_hello(dataclasses.replace(_hello(BOB), run_config=missing), ours)
    assert "model.d_model: ours 64, theirs absent" in info.value.detail
    assert _reason(signing.check_hello, dataclasses.replace(_hello(BOB), run_config="garbage"), ours) == Reason.BAD_SCHEMA
    assert _reason(signing.check_hello, _hello(BOB), ours) == Reason.CONFIG_MISMATCH  # none declared
    # the field travels in the frame and its hash is stable
    wire_hello = Validator(RUN_ID).validate(encode_frame(ours)[4:], NOW)
    assert wire_hello.run_config == ours_cfg
    assert config_hash(ours_cfg) == config_hash(encode_config(dict(reversed(list({
        "inner.lr": 0.003, "outer.window": 8, "model.d_model": 64, "outer.embeddings": ("e",)}.items())))))
