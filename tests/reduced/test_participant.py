"""One node's part in a reduced slot (protocol.reduced.participant), handed messages directly: a seal that
comes before some of its headers is taken once they come, and forged or misplaced records are refused by
name, change nothing, and leave the slot to close with the honest bits; a reducer one node's clock passed over
is taken when it comes late; an update from outside the run's roster is refused."""

import hashlib

import numpy as np
import pytest

from protocol.compression import encode_tensors
from protocol.errors import Reason, RemoteProtocolError
from protocol.identity import Identity
from protocol.ledger import LedgerConfig
from protocol.ledger.chunks import CHUNK
from protocol.reduced.participant import ReducedNode
from protocol.reduced.records import PARTIALS, REDUCTION, pack_floats, sign_record
from testnet.reduced_net import RUN, ReducedNet, SlotNetwork, SlotReport

SHAPES = {"embed": (2 * CHUNK // 256, 256), "bias": (300,)}


def _net(n=4):
    return ReducedNet(n, SHAPES, {k: np.zeros(v, np.float32) for k, v in SHAPES.items()}, LedgerConfig(window=2))


def _updates(net, seed=0):
    rng = np.random.default_rng(seed)
    common = {k: 0.01 * rng.standard_normal(v).astype(np.float32) for k, v in SHAPES.items()}
    return [(p, encode_tensors({k: c + 0.005 * rng.standard_normal(c.shape).astype(np.float32)
                                for k, c in common.items()}, "int4"), 0, 1000, 50) for p in net.peers]


def test_a_seal_that_comes_before_its_headers_is_taken_when_they_come():
    net = _net()
    updates = _updates(net)
    a, b, c, d = (net.nodes[p] for p in net.peers)
    published = [net.nodes[p].publish(data, base, t, s) for p, data, base, t, s in updates]
    for node in (b, c, d):  # everyone but a has every header
        for (peer, *_), (signed, record) in zip(updates, published, strict=True):
            if peer != node.peer:
                node.offer(signed, record)
    seal = b.seal().record
    a.take_seal(seal)
    assert a.open.seal is None and a.open.unheard is seal  # three of its headers have not come
    for (peer, *_), (signed, record) in zip(updates, published, strict=True):
        if peer != a.peer:
            a.offer(signed, record)
    assert a.open.seal is not None and len(a.open.sealed) == 4 and not a.pool


def test_forged_and_misplaced_records_are_refused_by_name_and_change_nothing():
    honest, net = _net(), _net()
    honest.close(_updates(honest))
    updates = _updates(net)
    slot = SlotNetwork(net.nodes, SlotReport(1, 0), None)
    for u in updates:
        slot.publish(*u)
    first = net.nodes[net.peers[0]]
    slot.seal(first.sealer_order()[0])
    s = first.open
    target = next(node for node in net.nodes.values() if node is not first)
    aggregator, other = s.roles[0][0], s.roles[0][2]
    seal_id = s.seal.record.id

    def reduction(author, data, place=0, digest=None):
        return sign_record(net.nodes[author].identity, REDUCTION,
                           [1, 0, place, seal_id, digest or hashlib.sha256(data).digest()])

    data = b"\x00" * 64
    target.take_reduction(reduction(aggregator, data, digest=b"\x01" * 32), data)  # bytes it did not sign
    target.take_reduction(reduction(other, data), data)  # claims the aggregator's place
    forged = reduction(aggregator, data)
    target.take_reduction(type(forged)(forged.kind, forged.fields, aggregator, b"\x00" * 64), data)  # bad signature
    bias = next(p.index for p in net.plan.pieces if p.name == "bias")  # in shard 0
    partials = sign_record(net.nodes[other].identity, PARTIALS, [1, "bias", b"\x00" * 32, [bias],
                                                                 pack_floats([1.0] * 6)])
    target.take_partials(partials)  # by a node that does not reduce that piece
    reasons = target.open.rejected
    assert len(reasons) == 4 and not target.open.standing and not target.open.partials
    assert any("not the ones its author signed" in r for r in reasons)
    assert any("place it names" in r for r in reasons)
    assert any("bad_signature" in r for r in reasons)
    assert any("does not reduce those pieces" in r for r in reasons)
    slot.run()
    for node in net.nodes.values():
        node.finish()
    assert net.agree() and not net.excluded
    assert next(iter(net.replicas.values())).digest() == next(iter(honest.replicas.values())).digest()


def test_a_reducer_passed_over_by_one_clock_is_taken_when_it_comes_late():
    honest, net = _net(), _net()
    honest.close(_updates(honest))
    slot = SlotNetwork(net.nodes, SlotReport(1, 0), None)
    for u in _updates(net):
        slot.publish(*u)
    first = net.nodes[net.peers[0]]
    slot.seal(first.sealer_order()[0])
    roles = first.open.roles[0]
    target = next(node for node in net.nodes.values() if node.peer not in roles[:2])
    target.pass_over(0)  # its clock ran out before the aggregator's reduction reached it
    assert target.open.at[0] == 1
    slot.run()
    s = target.open
    assert s.standing[0][0] == 0 and s.standing[0][2].author == roles[0]  # the aggregator's, as everyone's
    assert not any("expects no reduction" in r for r in s.rejected)
    for node in net.nodes.values():
        node.finish()
    assert net.agree()
    assert next(iter(net.replicas.values())).digest() == next(iter(honest.replicas.values())).digest()


def test_an_update_from_outside_the_roster_is_refused():
    net = _net()
    outsider = ReducedNode(Identity.from_seed(b"\x07" * 32), net.peers, net.plan, LedgerConfig(window=2), run_id=RUN)
    signed, record = outsider.publish(_updates(net)[0][1], 0, 1000, 50)
    node = net.nodes[net.peers[0]]
    with pytest.raises(RemoteProtocolError) as refused:
        node.offer(signed, record)
    assert refused.value.reason is Reason.NOT_ADMITTED and not node.pool


def test_a_claim_past_the_runs_work_is_refused_and_so_is_a_seal_of_it():
    """A contributor claiming more tokens than its inner steps allow would outweigh every honest update (the
    weight is by tokens): its commitment is refused as ``bad_claim``, as the all-to-all ledger refuses it, and
    a seal that names it (a hostile sealer's) is refused too, by every node that read the header."""
    config = LedgerConfig(window=2, tokens_per_step=20, max_inner_steps=50)
    net = ReducedNet(4, SHAPES, {k: np.zeros(v, np.float32) for k, v in SHAPES.items()}, config)
    updates = _updates(net)
    a, b, c, d = (net.nodes[p] for p in net.peers)
    honest = [node.publish(data, base, t, s) for node, (_, data, base, t, s) in zip((a, b, c), updates)]
    d.config = LedgerConfig(window=2)  # the hostile node does not hold itself to the run's bound
    inflated = d.publish(updates[3][1], 0, 2**40, 50)
    d_seal = d.seal().record  # d holds its own update: its seal names it
    for signed, record in honest:
        for node in (a, b, c):
            if node.peer != signed.origin:
                node.offer(signed, record)
    a.take_seal(d_seal)
    assert a.open.unheard is d_seal  # it waits for d's header
    with pytest.raises(RemoteProtocolError) as refused:
        a.offer(*inflated)
    assert refused.value.reason is Reason.BAD_CLAIM and inflated[0].message_id not in a.pool
    assert a.refused_origins == {d.peer: 0}  # a sealer's clock counts d as heard for slot 1, not waited for
    assert a.open.unheard is None and a.open.seal is None and any("refuses" in r for r in a.open.rejected)
    with pytest.raises(RemoteProtocolError) as again:
        a.take_seal(d_seal)
    assert again.value.reason is Reason.BAD_STATE
    a.take_seal(b.seal().record)  # an honest seal of the three honest updates is taken
    assert a.open.seal is not None and len(a.open.sealed) == 3
