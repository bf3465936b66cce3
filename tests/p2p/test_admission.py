"""Tier (b): a closed run on loopback (PROTOCOL.md §7b). The founder's host takes a member that shows its
membership, refuses a key without one at the handshake, and refuses an update of a key outside the run
even when an admitted peer relays it; every refusal is counted as `not_admitted`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import trio
from p2p_helpers import RUN, RawPeer, fast_gossip, host_config, start, update_header, wait_for
from test_bad_input import still_delivers

from protocol import signing
from protocol.admission import Admission, grant
from protocol.errors import Reason
from protocol.gossip import Handshake
from protocol.identity import Identity
from protocol.validation import Validator

PATIENT = fast_gossip(heartbeat_timeout_s=10.0)  # raw peers send no heartbeats


def _member(founder: Identity, identity: Identity) -> Admission:
    return Admission(RUN, founder.peer_id, grant(founder, RUN, identity.peer_id), peer_id=identity.peer_id)


async def test_a_closed_run_admits_members_and_refuses_other_keys_at_the_handshake_and_in_relayed_updates(
        tmp_path: Path) -> None:
    founder, member = Identity.generate(), Identity.generate()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            node = await start(nursery, host_config(tmp_path, "founder", founder, gossip=PATIENT,
                                                    admission=Admission(RUN, founder.peer_id, peer_id=founder.peer_id)))
            witness = await start(nursery, host_config(tmp_path, "member", member, gossip=PATIENT,
                                                       bootstrap=(node.gossip_addr,), admission=_member(founder, member)))
            await wait_for(lambda: witness.peer_id in node.connected_peers(), what="the member")
            await still_delivers(node, witness)  # its updates carry its membership

            outsider = await start(nursery, host_config(tmp_path, "outsider", gossip=PATIENT, bootstrap=(node.gossip_addr,)))
            await wait_for(lambda: node.counters.rejections[Reason.NOT_ADMITTED] >= 1, what="the outsider refused")
            assert outsider.peer_id not in node.connected_peers()
            await outsider.close()  # its redials would be refused too, and the count below must be exact

            # an admitted peer relays updates of a fresh key of its own: with no membership, and with its own
            relay_key, sybil = Identity.generate(), Identity.generate()
            raw = await RawPeer.connect(node.gossip_addr, relay_key)
            await raw.handshake(node.now(), admission=_member(founder, relay_key))
            await wait_for(lambda: relay_key.peer_id in node.connected_peers(), what="the admitted relay")
            refused = node.counters.rejections[Reason.NOT_ADMITTED]
            body = update_header(sybil, os.urandom(64), raw.seqnos.next(node.now()))
            await raw.send(signing.sign(sybil, body))
            borrowed = dataclasses.replace(body, seqno=raw.seqnos.next(node.now()),
                                           membership=grant(founder, RUN, relay_key.peer_id).to_bytes())
            await raw.send(signing.sign(sybil, borrowed))
            await wait_for(lambda: node.counters.rejections[Reason.NOT_ADMITTED] == refused + 2, what="both refused")
            assert node.inbox.statistics().current_buffer_used == 0, "nothing of the outsider was delivered"
            await still_delivers(node, witness)
            nursery.cancel_scope.cancel()


async def test_a_member_of_another_founder_is_refused(tmp_path: Path) -> None:
    founder, other_founder, member = Identity.generate(), Identity.generate(), Identity.generate()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            node = await start(nursery, host_config(tmp_path, "founder", founder, gossip=PATIENT,
                                                    admission=Admission(RUN, founder.peer_id, peer_id=founder.peer_id)))
            raw = await RawPeer.connect(node.gossip_addr, member)
            # admitted by someone else: its hello shows a membership the node does not take
            handshake = Handshake(member, Validator(RUN), gossip_addr="", http_addr="", challenge=os.urandom(32),
                                  admission=_member(other_founder, member))
            await raw.send(handshake.hello)
            await raw.wait_closed()
            assert node.counters.rejections[Reason.NOT_ADMITTED] == 1
            nursery.cancel_scope.cancel()
