"""Who may take part in a run: anyone (an open run), or the founder and the peers it admitted (a closed run).

A closed run is named by its founder's peer id (the run configuration's `run.founder`; a node of another
founder, or of an open run, is refused at the handshake: `not_admitted` by a node of the closed run, which
checks memberships before configurations, `config_mismatch` by the other). The founder admits a peer by
signing a `Membership` — (run id, member peer id, founder peer id) — with its key; the member shows it:

- in its `hello` (field 8, PROTOCOL.md §4): a node of a closed run refuses a peer that is neither the founder
  nor shows a valid membership for its own peer id, before answering its Hello (`not_admitted`);
- in every update header it publishes (field 11): a node refuses an update whose origin is not the founder
  and whose own field 11 does not admit it, wherever it comes from and whatever the node saw of that origin
  before (`not_admitted`, in the gossip accept hook, before the payload is fetched or the header forwarded:
  `check_update`, a function of the header and the run, so every replica takes the same updates). So a
  member cannot bring keys of its own into the run by relaying their updates, and the median-based bound
  counts members only;
- other signed messages (goodbyes, state manifests) are taken only from origins already known to be admitted
  (seen in a handshake or an update header).

Encoding: a membership is the canonical msgpack array ``[run_id, member, founder, signature]`` (at most
`MAX_MEMBERSHIP_BYTES`); the signature is Ed25519 by the founder's key over
``b"diloco/v1:membership:" + msgpack([run_id, member, founder])``. A membership file (what
`diloco-admit grant` writes and `--membership` reads) is a JSON object with those four fields, the signature
in hex. There is no expiry and no revocation (docs/threat-model.md).

Pure: no I/O. `Admission` is the one owner of a node's knowledge of who is admitted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import msgpack

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.identity import Identity, public_key_from_peer_id, verify_signature
from protocol.messages import DOMAIN, ReducedRecord, Signed, UpdateHeader

__all__ = ["MAX_MEMBERSHIP_BYTES", "Admission", "Membership", "grant"]

AcceptHook = Callable[[Signed], None]

MAX_MEMBERSHIP_BYTES = 512  # the wire fields' bound (a membership is ~190 bytes)
MAX_KNOWN_MEMBERS = 100_000  # memberships remembered per run (each was signed by the founder)
_PREFIX = DOMAIN + b":membership:"


@dataclass(frozen=True)
class Membership:
    """The founder's word that `member` takes part in run `run_id`."""

    run_id: str
    member: str
    founder: str
    signature: bytes

    def signing_input(self) -> bytes:
        return _PREFIX + msgpack.packb([self.run_id, self.member, self.founder], use_bin_type=True)

    def to_bytes(self) -> bytes:
        return msgpack.packb([self.run_id, self.member, self.founder, self.signature], use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> Membership:
        """Parse the wire form; `RemoteProtocolError(NOT_ADMITTED)` for anything else."""
        if len(data) > MAX_MEMBERSHIP_BYTES:
            raise RemoteProtocolError(Reason.NOT_ADMITTED, f"membership longer than {MAX_MEMBERSHIP_BYTES} bytes")
        try:
            fields = msgpack.unpackb(data, raw=False, use_list=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise RemoteProtocolError(Reason.NOT_ADMITTED, f"membership is not msgpack: {type(exc).__name__}") from None
        if (type(fields) is not tuple or len(fields) != 4 or not all(type(f) is str for f in fields[:3])
                or type(fields[3]) is not bytes):
            raise RemoteProtocolError(Reason.NOT_ADMITTED, "membership is not [run_id, member, founder, signature]")
        return cls(*fields)

    def to_json(self) -> str:
        return json.dumps({"run_id": self.run_id, "member": self.member, "founder": self.founder,
                           "signature": self.signature.hex()}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Membership:
        """Parse a membership file; `ValueError` (saying what is wrong) for anything else."""
        try:
            obj = json.loads(text)
            membership = cls(str(obj["run_id"]), str(obj["member"]), str(obj["founder"]), bytes.fromhex(obj["signature"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a membership file (JSON with run_id, member, founder, signature): {exc}") from None
        try:
            membership.verify(membership.run_id, membership.founder, membership.member)
        except RemoteProtocolError as exc:
            raise ValueError(f"membership does not verify: {exc.detail}") from None
        return membership

    def verify(self, run_id: str, founder: str, member: str) -> None:
        """Check that this admits `member` to `run_id`, signed by `founder`'s key (`NOT_ADMITTED` if not)."""
        if self.run_id != run_id:
            raise RemoteProtocolError(Reason.NOT_ADMITTED, f"membership is for run {self.run_id[:40]!r}")
        if self.founder != founder:
            raise RemoteProtocolError(Reason.NOT_ADMITTED, f"membership was granted by {self.founder[:16]}, not the founder")
        if self.member != member:
            raise RemoteProtocolError(Reason.NOT_ADMITTED, f"membership admits {self.member[:16]}, not {member[:16]}")
        try:
            verify_signature(founder, self.signature, self.signing_input())
        except RemoteProtocolError as exc:
            raise RemoteProtocolError(Reason.NOT_ADMITTED, f"membership signature: {exc.detail}") from None


def grant(founder: Identity, run_id: str, member: str) -> Membership:
    """The founder admits `member` (a peer id) to `run_id`."""
    if not run_id:
        raise LocalProtocolError("a membership needs a run id")
    try:
        public_key_from_peer_id(member)
    except RemoteProtocolError as exc:
        raise LocalProtocolError(f"not a peer id: {member!r} ({exc.detail})") from None
    unsigned = Membership(run_id, member, founder.peer_id, b"")
    return Membership(run_id, member, founder.peer_id, founder.sign(unsigned.signing_input()))


class Admission:
    """A node's admission rule. `founder=""`: an open run (everything passes). Else a closed run: `own` is
    this node's membership (None for the founder itself), shown in its hello and update headers."""

    def __init__(self, run_id: str, founder: str = "", own: Membership | None = None, *, peer_id: str = "") -> None:
        self.run_id, self.founder = run_id, founder
        self.own = own
        self._known: set[str] = {founder} if founder else set()
        if own is not None:
            if not founder:
                raise LocalProtocolError("a membership belongs to a closed run: give its founder")
            own.verify(run_id, founder, peer_id or own.member)
            self._known.add(own.member)
        elif founder and peer_id and peer_id != founder:
            raise LocalProtocolError("a member of a closed run needs its membership (only the founder has none)")

    @property
    def closed(self) -> bool:
        return bool(self.founder)

    @property
    def credential(self) -> bytes:
        """What this node shows (hello field 8, update header field 11): b"" in an open run and for the founder."""
        return self.own.to_bytes() if self.own is not None else b""

    def admitted(self, peer: str) -> bool:
        return not self.closed or peer in self._known

    def check_peer(self, peer: str, credential: bytes) -> None:
        """`peer` shows `credential` (a hello, an update header): pass and remember it, or `NOT_ADMITTED`."""
        if not self.closed or peer in self._known:
            return
        if not credential:
            raise RemoteProtocolError(Reason.NOT_ADMITTED, f"{peer[:16]} shows no membership of this closed run")
        Membership.from_bytes(credential).verify(self.run_id, self.founder, peer)
        if len(self._known) < MAX_KNOWN_MEMBERS:
            self._known.add(peer)

    def check_update(self, origin: str, credential: bytes) -> None:
        """An update header's origin and its field 11 (a reduced record's and its field 7 alike): the founder's, or one whose own membership admits its
        origin, else `NOT_ADMITTED`. A function of the header and the run alone, never of what this node saw
        before (a hello, an earlier update): every replica takes or refuses the same updates."""
        if not self.closed or origin == self.founder:
            return
        if not credential:
            raise RemoteProtocolError(Reason.NOT_ADMITTED, f"update of {origin[:16]} shows no membership of this "
                                                           "closed run")
        Membership.from_bytes(credential).verify(self.run_id, self.founder, origin)
        if len(self._known) < MAX_KNOWN_MEMBERS:
            self._known.add(origin)

    def check_origin(self, peer: str) -> None:
        """A signed message that carries no membership (a goodbye, a manifest): its origin must be known."""
        if not self.admitted(peer):
            raise RemoteProtocolError(Reason.NOT_ADMITTED, f"{peer[:16]} is not known to be admitted to this closed run")

    def accept_hook(self, then: AcceptHook | None = None) -> AcceptHook | None:
        """A gossip accept hook (`HostConfig.accept`) that refuses signed messages of origins outside a closed
        run, then runs `then`. In an open run: `then` itself."""
        if not self.closed:
            return then

        def accept(signed: Signed) -> None:
            if isinstance(signed.body, UpdateHeader | ReducedRecord):  # the message's own word, as §7b asks
                self.check_update(signed.origin, signed.body.membership)
            else:
                self.check_origin(signed.origin)
            if then is not None:
                then(signed)

        return accept
