"""The one signing path, and the handshake proof.

Gossiped messages: `signature = Ed25519(origin key, signing_input)` with

    signing_input = b"diloco/v1:" + KIND + b":" + canonical_encoding(body)     (protocol.wire)
    message_id    = SHA-256(signing_input)

The kind in the prefix separates domains: the same field array can never verify as another kind, and no
other signature this package makes (the handshake transcript below) can be confused with a message.

Handshake (see PROTOCOL.md): each side sends `Hello` with a fresh 32-byte `challenge`, then a
`HelloProof` signing

    b"diloco/v1:hello_proof:" + msgpack([run_id, signer_peer_id, verifier_peer_id,
                                         verifier_challenge, signer_challenge,
                                         signer_gossip_addr, signer_http_addr])

Both peer ids and both challenges in a fixed role order mean a proof cannot be reflected back to its
maker or replayed on another connection; the signer's addresses are thereby authenticated too.
"""

from __future__ import annotations

import secrets

import msgpack

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.identity import Identity, public_key_from_peer_id, verify_signature
from protocol.messages import DOMAIN, PROTOCOL_VERSION, Hello, HelloProof, Signed, SignedBody
from protocol.runconfig import check_config
from protocol.wire import signing_input

CHALLENGE_BYTES = 32


def sign(identity: Identity, body: SignedBody) -> Signed:
    """Sign a gossiped body as its origin. Raises LocalProtocolError if `body.origin` is not
    `identity.peer_id`, if the kind is not a signed one, or if the body violates its schema."""
    if not getattr(type(body), "SIGNED", False):
        raise LocalProtocolError(f"{type(body).__name__} is not a signed message kind")
    if body.origin != identity.peer_id:
        raise LocalProtocolError(f"cannot sign as {body.origin}: this identity is {identity.peer_id}")
    return Signed(body, identity.sign(signing_input(body)))


def verify(signed: Signed) -> None:
    """Check `signed.signature` against the key embedded in `signed.origin`.
    Raises RemoteProtocolError(BAD_IDENTITY or BAD_SIGNATURE); returns None if valid."""
    verify_signature(signed.origin, signed.signature, signed.signing_input)


def new_challenge() -> bytes:
    """32 bytes from the OS CSPRNG, fresh for every connection attempt."""
    return secrets.token_bytes(CHALLENGE_BYTES)


def hello_transcript(signer: Hello, verifier: Hello) -> bytes:
    """The bytes `signer.peer_id` signs to prove key possession to `verifier.peer_id`.
    Both Hellos must carry the same run id (checked by `check_hello` first)."""
    fields = [
        signer.run_id,
        signer.peer_id,
        verifier.peer_id,
        verifier.challenge,
        signer.challenge,
        signer.gossip_addr,
        signer.http_addr,
    ]
    return DOMAIN + b":" + HelloProof.KIND.encode("ascii") + b":" + msgpack.packb(fields, use_bin_type=True)


def check_hello(theirs: Hello, ours: Hello) -> None:
    """Refuse a peer's Hello before answering it: UNSUPPORTED_VERSION, WRONG_RUN_ID, CONFIG_MISMATCH, BAD_IDENTITY
    (malformed peer id), BAD_HANDSHAKE (our own peer id, or our own challenge echoed back — a
    reflection). Call after `protocol.validation` accepted the frame; returns None if acceptable."""
    if theirs.version != PROTOCOL_VERSION:
        raise RemoteProtocolError(Reason.UNSUPPORTED_VERSION, f"peer speaks v{theirs.version}")
    if theirs.run_id != ours.run_id:
        raise RemoteProtocolError(Reason.WRONG_RUN_ID, f"peer is in run {theirs.run_id!r}")
    check_config(ours.run_config, theirs.run_config)
    public_key_from_peer_id(theirs.peer_id)
    if theirs.peer_id == ours.peer_id:
        raise RemoteProtocolError(Reason.BAD_HANDSHAKE, "peer claims our own peer id")
    if theirs.challenge == ours.challenge:
        raise RemoteProtocolError(Reason.BAD_HANDSHAKE, "peer echoed our challenge")


def make_hello_proof(identity: Identity, ours: Hello, theirs: Hello) -> HelloProof:
    """Our answer to their Hello. `ours` must be the Hello we sent on this connection."""
    if ours.peer_id != identity.peer_id:
        raise LocalProtocolError("our Hello names another peer id than this identity")
    return HelloProof(ours.run_id, identity.peer_id, identity.sign(hello_transcript(ours, theirs)))


def verify_hello_proof(proof: HelloProof, ours: Hello, theirs: Hello) -> None:
    """Check the peer's proof against the two Hellos of this connection. Raises RemoteProtocolError:
    WRONG_RUN_ID, BAD_HANDSHAKE (proof names another peer than its Hello), BAD_SIGNATURE."""
    if proof.run_id != ours.run_id:
        raise RemoteProtocolError(Reason.WRONG_RUN_ID, f"proof is for run {proof.run_id!r}")
    if proof.peer_id != theirs.peer_id:
        raise RemoteProtocolError(Reason.BAD_HANDSHAKE, "proof signed by another peer than the Hello named")
    verify_signature(theirs.peer_id, proof.signature, hello_transcript(theirs, ours))
