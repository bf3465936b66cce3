"""Tier (a): memberships of closed runs, and the admission rule every node applies (PROTOCOL.md §7b)."""

from __future__ import annotations

import dataclasses

import pytest
from protocol_strategies import IDENTITIES, RUN_ID

from protocol import signing
from protocol.admission import Admission, Membership, grant
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.messages import Goodbye, ReducedRecord, UpdateHeader

FOUNDER, MEMBER, OUTSIDER, OTHER_FOUNDER = IDENTITIES


def _refused(call, *args) -> str:
    with pytest.raises(RemoteProtocolError) as err:
        call(*args)
    assert err.value.reason is Reason.NOT_ADMITTED
    return err.value.detail


def _update(origin, membership: bytes = b"", seqno: int = 1):
    body = UpdateHeader(RUN_ID, origin.peer_id, seqno, 0, 0, 1, 1, "fp32", (("w", (2,)),), b"\0" * 32, 8, membership)
    return signing.sign(origin, body)


def test_a_membership_admits_its_member_to_its_run_signed_by_its_founder_and_nothing_else() -> None:
    membership = grant(FOUNDER, RUN_ID, MEMBER.peer_id)
    assert Membership.from_bytes(membership.to_bytes()) == membership
    assert Membership.from_json(membership.to_json()) == membership
    assert len(membership.to_bytes()) < 256
    membership.verify(RUN_ID, FOUNDER.peer_id, MEMBER.peer_id)
    assert "not " in _refused(membership.verify, RUN_ID, FOUNDER.peer_id, OUTSIDER.peer_id)
    assert "run" in _refused(membership.verify, "another-run", FOUNDER.peer_id, MEMBER.peer_id)
    assert "founder" in _refused(membership.verify, RUN_ID, OTHER_FOUNDER.peer_id, MEMBER.peer_id)
    forged = dataclasses.replace(membership, member=OUTSIDER.peer_id)  # the founder's signature over another name
    assert "signature" in _refused(forged.verify, RUN_ID, FOUNDER.peer_id, OUTSIDER.peer_id)
    self_made = grant(OUTSIDER, RUN_ID, OUTSIDER.peer_id)  # an outsider signing its own
    _refused(self_made.verify, RUN_ID, FOUNDER.peer_id, OUTSIDER.peer_id)
    for garbage in (b"", b"\xc1", b"\x93\xa1a\xa1b\xa1c", membership.to_bytes()[:-3]):
        _refused(Membership.from_bytes, garbage)
    with pytest.raises(ValueError, match="does not verify"):
        Membership.from_json(forged.to_json())
    with pytest.raises(LocalProtocolError):
        grant(FOUNDER, RUN_ID, "not-a-peer-id")


def test_a_closed_run_admits_the_founder_and_shown_memberships_and_an_open_run_everyone() -> None:
    open_run = Admission(RUN_ID)
    assert not open_run.closed and open_run.credential == b"" and open_run.admitted(OUTSIDER.peer_id)
    open_run.check_peer(OUTSIDER.peer_id, b"")

    membership = grant(FOUNDER, RUN_ID, MEMBER.peer_id)
    founder_side = Admission(RUN_ID, FOUNDER.peer_id, peer_id=FOUNDER.peer_id)
    member_side = Admission(RUN_ID, FOUNDER.peer_id, membership, peer_id=MEMBER.peer_id)
    assert founder_side.credential == b"" and member_side.credential == membership.to_bytes()
    member_side.check_peer(FOUNDER.peer_id, b"")  # the founder needs none
    assert not founder_side.admitted(MEMBER.peer_id)
    founder_side.check_peer(MEMBER.peer_id, member_side.credential)
    assert founder_side.admitted(MEMBER.peer_id)  # remembered
    assert "no membership" in _refused(founder_side.check_peer, OUTSIDER.peer_id, b"")
    _refused(founder_side.check_peer, OUTSIDER.peer_id, member_side.credential)  # another's membership
    with pytest.raises(LocalProtocolError):
        Admission(RUN_ID, FOUNDER.peer_id, peer_id=MEMBER.peer_id)  # a member without its membership
    with pytest.raises(RemoteProtocolError):
        Admission(RUN_ID, FOUNDER.peer_id, membership, peer_id=OUTSIDER.peer_id)  # someone else's


def test_the_accept_hook_refuses_updates_and_messages_of_origins_outside_a_closed_run() -> None:
    membership = grant(FOUNDER, RUN_ID, MEMBER.peer_id)
    seen: list[str] = []
    accept = Admission(RUN_ID, FOUNDER.peer_id, peer_id=FOUNDER.peer_id).accept_hook(lambda s: seen.append(s.origin))
    assert Admission(RUN_ID).accept_hook(None) is None  # an open run adds no check
    goodbye = signing.sign(MEMBER, Goodbye(RUN_ID, MEMBER.peer_id, 2, "bye"))
    _refused(accept, goodbye)  # not yet known to be admitted
    accept(_update(MEMBER, membership.to_bytes()))
    accept(goodbye)  # now it is
    _refused(accept, _update(OUTSIDER))  # a fresh key relayed by a member
    _refused(accept, _update(OUTSIDER, membership.to_bytes()))  # showing a member's membership
    _refused(accept, signing.sign(OUTSIDER, Goodbye(RUN_ID, OUTSIDER.peer_id, 1, "bye")))
    assert seen == [MEMBER.peer_id, MEMBER.peer_id], "the application's hook runs after admission, only for admitted"


def test_whether_an_update_counts_reads_the_header_and_the_run_never_what_a_node_saw() -> None:
    """The fork of issue 45: a member shows its membership in its hello, then publishes an update without
    field 11. A replica that saw the hello and one that did not must decide alike, in every order of the
    control traffic they saw: the update is refused by both, and one with field 11 is taken by both."""
    membership = grant(FOUNDER, RUN_ID, MEMBER.peer_id)
    bare, shown = _update(MEMBER, seqno=5), _update(MEMBER, membership.to_bytes(), seqno=6)
    goodbye_first = signing.sign(MEMBER, Goodbye(RUN_ID, MEMBER.peer_id, 1, "bye"))
    histories = {
        "saw nothing": [],
        "saw the member's hello": [lambda a: a.check_peer(MEMBER.peer_id, membership.to_bytes())],
        "saw an update with field 11 first": [lambda a: a.accept_hook(None)(shown)],
    }
    for name, history in histories.items():
        admission = Admission(RUN_ID, FOUNDER.peer_id, peer_id=FOUNDER.peer_id)
        for event in history:
            event(admission)
        accept = admission.accept_hook(None)
        assert "shows no membership" in _refused(accept, bare), name
        accept(shown)
        accept(goodbye_first)  # known now, whatever the history: a goodbye changes no replica's state


def test_a_reduced_record_is_held_to_its_own_membership_whatever_a_node_saw() -> None:
    membership = grant(FOUNDER, RUN_ID, MEMBER.peer_id)

    def record(origin, shown: bytes = b"", seqno: int = 1):
        return signing.sign(origin, ReducedRecord(RUN_ID, origin.peer_id, seqno, "reduced-seal", b"\x92\x01\x90",
                                                  b"\0" * 64, b"", shown))

    for saw_hello in (False, True):
        admission = Admission(RUN_ID, FOUNDER.peer_id, peer_id=FOUNDER.peer_id)
        if saw_hello:
            admission.check_peer(MEMBER.peer_id, membership.to_bytes())
        accept = admission.accept_hook(None)
        assert "shows no membership" in _refused(accept, record(MEMBER))
        accept(record(MEMBER, membership.to_bytes(), 2))
        _refused(accept, record(OUTSIDER, membership.to_bytes()))  # a member's membership on another key
    accept(record(FOUNDER))  # the founder shows none
