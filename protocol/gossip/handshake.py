"""The connection handshake as a sans-IO state machine: each side proves it holds its key.

Both sides send their `Hello` (fresh 32-byte challenge) at once, then answer the other's Hello with
a `HelloProof` signing the transcript (`protocol.signing.hello_transcript`): both peer ids, both
challenges, the signer's addresses. Run id and version are checked on the Hello, before answering.

    state         frame received   action                                   next
    AWAIT_HELLO   Hello            check_hello and its addresses, send our   AWAIT_PROOF
                                   HelloProof
    AWAIT_PROOF   HelloProof       verify_hello_proof                        DONE
    any           anything else    RemoteProtocolError(BAD_HANDSHAKE)        FAILED
    FAILED/DONE   anything         LocalProtocolError (caller bug)

Any RemoteProtocolError moves to FAILED: the caller counts the reason and closes the connection.

A closed run's node that accepts a connection speaks second (`speaks_first=False`): it sends nothing
until the dialer's Hello shows a membership that admits it (PROTOCOL.md section 7b), so an outsider who
connects learns nothing of the run, not even its configuration. Its Hello then goes out before any other
check of the dialer's Hello (`hello_owed` stays true if such a check refuses the dialer: the caller sends
it before closing, so a member with other settings still reads the run's configuration, `node.adopt`).
"""

from __future__ import annotations

import enum

from protocol import signing
from protocol.admission import Admission
from protocol.addresses import peer_address_problem
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.identity import Identity
from protocol.messages import PROTOCOL_VERSION, Hello, HelloProof, Message, PeerInfo
from protocol.validation import Validator


class State(enum.Enum):
    AWAIT_HELLO = "await_hello"
    AWAIT_PROOF = "await_proof"
    DONE = "done"
    FAILED = "failed"


class Handshake:
    """One connection's handshake. Send `self.hello` first, then feed each received frame body to
    `receive_frame` and send what it returns, until `state is State.DONE` (then `self.peer` is the
    peer's authenticated Hello). `expected_peer` (when dialling a known peer id) must match.
    `remote_host` (the connection's remote address, when known) lets the peer's advertised addresses be
    checked against where it is: `bad_address` for one that cannot reach it. `run_config`
    (`protocol.runconfig`) must equal the peer's: `config_mismatch` names the fields that differ. In a
    closed run (`admission`), the peer must be the founder or show a membership that admits it
    (`not_admitted`); ours is sent in our Hello."""

    def __init__(
        self,
        identity: Identity,
        validator: Validator,
        *,
        gossip_addr: str,
        http_addr: str,
        challenge: bytes,
        expected_peer: str | None = None,
        agent: str = "diloco",
        remote_host: str | None = None,
        run_config: str = "",
        admission: Admission | None = None,
        speaks_first: bool = True,
    ) -> None:
        self.identity = identity
        self.speaks_first = speaks_first
        self.hello_owed = False  # a Hello we must still send (speaking second, once the dialer is admitted)
        self.admission = admission
        self.validator = validator
        self.expected_peer = expected_peer
        self.remote_host = remote_host
        self.hello = Hello(
            run_id=validator.run_id,
            version=PROTOCOL_VERSION,
            peer_id=identity.peer_id,
            gossip_addr=gossip_addr,
            http_addr=http_addr,
            challenge=challenge,
            agent=agent,
            run_config=run_config,
            membership=admission.credential if admission is not None else b"",
        )
        self.state = State.AWAIT_HELLO
        self.peer: Hello | None = None

    @property
    def peer_info(self) -> PeerInfo:
        if self.state is not State.DONE or self.peer is None:
            raise LocalProtocolError("handshake not complete")
        return PeerInfo(self.peer.peer_id, self.peer.gossip_addr, self.peer.http_addr)

    def first_messages(self) -> list[Message]:
        """What to send before anything arrives: our Hello, unless we speak second."""
        return [self.hello] if self.speaks_first else []

    def receive_frame(self, data: bytes, now: float) -> list[Message]:
        """Advance on one frame body; returns the messages to send. Raises RemoteProtocolError."""
        if self.state in (State.DONE, State.FAILED):
            raise LocalProtocolError(f"handshake is {self.state.value}")
        try:
            return self._advance(self.validator.validate(data, now))
        except RemoteProtocolError:
            self.state = State.FAILED
            raise

    def _advance(self, message: object) -> list[Message]:
        if self.state is State.AWAIT_HELLO and type(message) is Hello:
            if self.admission is not None and (message.version, message.run_id) == (self.hello.version, self.hello.run_id):
                # a closed run's outsider is `not_admitted`, before its configuration (which names another
                # founder, or none) would make it a `config_mismatch`
                self.admission.check_peer(message.peer_id, message.membership)
            if not self.speaks_first:  # admitted (or an open run): our Hello is owed, whatever else is checked
                self.hello_owed = (message.version, message.run_id) == (self.hello.version, self.hello.run_id)
            signing.check_hello(message, self.hello)
            if self.expected_peer is not None and message.peer_id != self.expected_peer:
                raise RemoteProtocolError(Reason.BAD_IDENTITY, f"expected {self.expected_peer}, got {message.peer_id}")
            self._check_addresses(message)
            self.peer = message
            self.state = State.AWAIT_PROOF
            owed, self.hello_owed = self.hello_owed, False
            return [*([self.hello] if owed else []), signing.make_hello_proof(self.identity, self.hello, message)]
        if self.state is State.AWAIT_PROOF and type(message) is HelloProof:
            assert self.peer is not None
            signing.verify_hello_proof(message, self.hello, self.peer)
            self.state = State.DONE
            return []
        raise RemoteProtocolError(Reason.BAD_HANDSHAKE, f"{type(message).__name__} during {self.state.value}")

    def _check_addresses(self, hello: Hello) -> None:
        """The peer's advertised addresses must be able to reach it (`protocol.addresses`): a wildcard,
        one of our own, or a loopback address sent from another host would reach us instead."""
        own = frozenset(a for a in (self.hello.gossip_addr, self.hello.http_addr) if a)
        problem = peer_address_problem(hello.gossip_addr, hello.http_addr, remote_host=self.remote_host, own=own)
        if problem:
            raise RemoteProtocolError(Reason.BAD_ADDRESS, f"advertised {problem}")
