"""Reduced slots among in-process nodes (testnet.reduced_net): replicas agree, a dead aggregator's successor
and a caught liar leave the same bits as an honest slot, a flood is capped, and a node's bytes stay near
2.5 updates a round while all-to-all's are N − 1."""

import json

import numpy as np
import pytest

from protocol.compression import encode_tensors
from protocol.ledger import LedgerConfig
from protocol.ledger.chunks import CHUNK
from protocol.reduced import reducers
from testnet.benchmarks import reduced_quality, traffic
from testnet.reduced_net import ReducedNet, per_update

SHAPES = {"embed": (4 * CHUNK // 256, 256), "layer": (3 * CHUNK // 256 + 1, 256), "bias": (300,)}


def _updates(net, rounds, seed=0, extra=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rounds):
        common = {k: 0.01 * rng.standard_normal(v).astype(np.float32) for k, v in SHAPES.items()}
        one = []
        for peer in net.peers + [net.peers[0]] * extra:
            deltas = {k: (c + 0.005 * rng.standard_normal(c.shape)).astype(np.float32) for k, c in common.items()}
            one.append((peer, encode_tensors(deltas, "int4"), 0, 1000, 50))
        out.append(one)
    return out


def _net(n=6, **kw):
    params = {k: np.zeros(v, np.float32) for k, v in SHAPES.items()}
    return ReducedNet(n, SHAPES, params, LedgerConfig(window=2), **kw)


def _run(rounds=3, dead_at=None, liar_at=None, factor=-1.0, accuser_at=None, **kw):
    net = _net(**kw)
    reports = []
    for r, updates in enumerate(_updates(net, rounds)):
        eligible = sorted(net.eligible - net.excluded)
        dead = [reducers(net.slot + 1, 1, eligible)[0]] if r == dead_at else []
        liars = {reducers(net.slot + 1, 2, eligible)[0]: factor} if r == liar_at else None
        accusers = [reducers(net.slot + 1, 0, eligible)[1]] if r == accuser_at else []  # shard 0's checker
        updates = [(p, data, net.slot, t, s) for p, data, _, t, s in updates]
        reports.append(net.close(updates, dead=dead, liars=liars, false_checkers=accusers))
    return net, reports


def test_replicas_agree_and_bytes_stay_near_two_and_a_half_updates():
    net, reports = _run()
    assert net.agree() and len(net.replicas) == 6
    u = reports[0].update_bytes
    for rep in reports:
        mean_in, _ = per_update(rep.received, net.peers, u)
        a2a_in, _ = per_update(rep.all_to_all_in, net.peers, u)
        assert 1.5 < mean_in < 3.0
        assert a2a_in == 5.0  # N − 1 payloads
    assert not any(rep.caught for rep in reports) and all(rep.sealed == 6 for rep in reports)


def test_a_dead_aggregators_successor_and_a_caught_liar_leave_the_honest_bits():
    honest, _ = _run()
    dead, reports = _run(dead_at=1)
    assert reports[1].fall_backs == 1
    lied, reports = _run(liar_at=1, q=1.0)  # a checker that draws every piece catches any lie
    assert reports[1].caught and lied.excluded == {reports[1].caught[0][1]}
    assert dead.agree() and lied.agree()
    digests = {next(iter(n.replicas.values())).digest() for n in (honest, dead, lied)}
    assert len(digests) == 1


def test_a_lying_checkers_replacement_is_checked_in_turn():
    honest, _ = _run()
    net = _net(q=1.0)
    reports = []
    for r, updates in enumerate(_updates(net, 3)):
        liars = None
        if r == 1:  # shard 2's aggregator and its checker lie in every shard they reduce
            order = reducers(net.slot + 1, 2, sorted(net.eligible - net.excluded))
            liars = {order[0]: -1.0, order[1]: -1.0}
        reports.append(net.close([(p, d, net.slot, t, s) for p, d, _, t, s in updates], liars=liars))
    caught = [who for shard, who in reports[1].caught if shard == 2]
    assert caught == [order[0], order[1]] and net.agree()
    assert next(iter(net.replicas.values())).digest() == next(iter(honest.replicas.values())).digest()


def test_a_false_accusation_is_judged_by_every_node_and_costs_the_accuser_its_roles():
    honest, _ = _run()
    accused, reports = _run(accuser_at=1)
    assert reports[1].false_accusations and not reports[1].caught
    accuser = reports[1].false_accusations[0][1]
    assert accused.excluded == {accuser} and accused.agree()
    assert reports[1].by_kind["fraud proofs"] > 0 and not reports[0].by_kind["fraud proofs"]
    assert next(iter(accused.replicas.values())).digest() == next(iter(honest.replicas.values())).digest()


def test_a_shard_past_the_headers_norm_bound_is_refused_by_every_node():
    honest, _ = _run()
    lied, reports = _run(liar_at=1, factor=100.0, q=0.0)  # no check: the bound alone refuses it
    assert reports[1].refused and not reports[1].caught and lied.excluded == {reports[1].refused[0][1]}
    assert next(iter(lied.replicas.values())).digest() == next(iter(honest.replicas.values())).digest()


def test_an_uncaught_liar_moves_the_model_and_the_replicas_still_agree():
    honest, _ = _run()
    lied, reports = _run(liar_at=1, q=0.0)
    assert not reports[1].caught and lied.agree()
    assert next(iter(lied.replicas.values())).digest() != next(iter(honest.replicas.values())).digest()


@pytest.mark.parametrize("shuffle", [1, 2, 3])
def test_gossip_that_comes_late_and_out_of_order_leaves_the_same_bits(shuffle):
    """Each node takes reductions and fraud proofs in its own order, some only passes later: a replacement
    before the judgement that calls for it, a fraud proof before the reduction it accuses."""
    in_order, _ = _run(rounds=3, liar_at=1, dead_at=2, accuser_at=0, q=1.0)
    shuffled, reports = _run(rounds=3, liar_at=1, dead_at=2, accuser_at=0, q=1.0, shuffle=shuffle)
    assert reports[0].false_accusations and reports[1].caught and reports[2].fall_backs  # the dead one reduces 2 of 6
    assert shuffled.agree() and shuffled.excluded == in_order.excluded
    assert next(iter(shuffled.replicas.values())).digest() == next(iter(in_order.replicas.values())).digest()


def test_a_flood_of_contributors_is_capped_by_the_seal():
    net = _net(cap=4)
    updates = _updates(net, 1, extra=0)[0]
    rep = net.close(updates)
    assert rep.sealed == 4 and net.agree()


def test_late_and_capped_updates_are_carried_into_the_next_slot_one_slot_staler():
    on_time, late = _net(cap=5), _net(cap=5)
    first, second = _updates(on_time, 2)
    reports = []
    for net, behind in ((on_time, []), (late, late.peers[:2])):
        reports.append(net.close(first, late=behind))
        reports.append(net.close([(p, d, 1, t, s) for p, d, _, t, s in second]))
        assert net.agree()
    assert [(r.sealed, r.carried) for r in reports] == [(5, 1), (5, 2), (4, 2), (5, 3)]
    digests = {next(iter(net.replicas.values())).digest() for net in (on_time, late)}
    assert len(digests) == 2  # the carried updates count, one slot staler


def test_the_traffic_benchmark_writes_its_rows(tmp_path, capsys):
    out = tmp_path / "traffic.json"
    assert traffic.main(["--nodes", "4", "8", "--rounds", "2", "--pieces", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["nodes"] for r in rows] == [4, 8]
    for r in rows:
        assert r["all_to_all"]["in"]["mean"] == r["nodes"] - 1
        assert r["reduced"]["in"]["mean"] < 3.0 and r["agree"]
    assert "reduced slots" in capsys.readouterr().out


@pytest.mark.slow
def test_the_quality_benchmark_catches_a_lying_aggregator_and_carries_late_updates(tmp_path):
    out = tmp_path / "quality.json"
    argv = ["--workers", "3", "--rounds", "2", "--inner-steps", "2", "--liar", "-1", "--q", "1", "--late", "0.34",
            "--json", str(out)]
    assert reduced_quality.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["rows"]["attacked"]["caught"] == [1]  # a checker drawing every piece catches the first lie
    assert result["rows"]["reduced"]["carried"] == result["rows"]["attacked"]["carried"] == 1
    assert 0.5 < result["ratio"] < 2.0
