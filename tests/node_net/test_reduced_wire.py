"""Tier (b): reduced slots over the real planes — four hosts on loopback in one trio process, TLS links, every
record gossiped as a ``ReducedRecord`` and every piece, partials record and reduction fetched over HTTP
(node.reduced). The replicas end with the same bits, and the bits the in-process harness
(testnet.reduced_net) computes over the same signed updates; a silent reducer is passed over by the clock;
a lying aggregator is caught by its checker, every node judges the proof from pieces it fetches, and the
replicas hold the harness's bits for the same lie."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np
import trio

from node.reduced.driver import SlotClock, SlotDriver
from p2p.config import HostConfig
from p2p.host import run as run_host
from protocol.compression import encode_tensors
from protocol.errors import Reason
from protocol.gossip import GossipConfig
from protocol.identity import Identity
from protocol.ledger import LedgerConfig
from protocol.ledger.chunks import CHUNK
from protocol.reduced import ShardPlan
from protocol.reduced.participant import ReducedNode
from protocol.reduced import reducers
from testnet.reduced_net import RUN, ReducedNet, _HarnessNode
from waiting import wait_for

N = 4
SHAPES = {"embed": (4 * CHUNK // 256, 256), "layer": (3 * CHUNK // 256 + 1, 256), "bias": (300,)}
CONFIG = LedgerConfig(window=2)


def _updates(rounds: int) -> list[list[bytes]]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(rounds):
        common = {k: 0.01 * rng.standard_normal(v).astype(np.float32) for k, v in SHAPES.items()}
        out.append([encode_tensors({k: (c + 0.005 * rng.standard_normal(c.shape)).astype(np.float32)
                                    for k, c in common.items()}, "int4") for _ in range(N)])
    return out


class _Watched(ReducedNode):
    """A participant that records where its work runs: the trio thread never, two calls at once never."""

    CALLS = ("publish", "offer", "seal", "take_seal", "take_pieces", "take_partials", "take_reduction", "take_fraud",
             "pass_over", "advance", "finish")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.depth, self.owner, self.overlaps, self.on_loop, self.calls = 0, None, 0, [], 0
        for name in self.CALLS:
            setattr(self, name, self._watch(name, getattr(self, name)))

    def _watch(self, name: str, fn):
        def call(*args, **kwargs):
            me = threading.get_ident()
            if threading.current_thread() is threading.main_thread():  # the trio loop's thread
                self.on_loop.append(name)
            if self.depth and self.owner != me:  # another thread is inside (its own nested calls are fine)
                self.overlaps += 1
            self.owner, self.depth, self.calls = me, self.depth + 1, self.calls + 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
        return call


def _identities() -> list[Identity]:  # the harness's, so that headers, ids and roles are the same bits
    return [Identity.from_seed(hashlib.sha256(b"reduced-node-%d" % i).digest()) for i in range(N)]


async def _start(nursery: trio.Nursery, tmp: Path, ids: list[Identity]) -> list:
    gossip = dict(run_id=RUN, heartbeat_s=0.05, heartbeat_timeout_s=2.0, dial_backoff_s=0.05, dial_backoff_max_s=0.5,
                  reduced_records=True)
    hosts = []
    for k, identity in enumerate(ids):
        config = HostConfig(identity=identity, run_id=RUN, data_dir=tmp / f"n{k}", gossip=GossipConfig(**gossip),
                            handshake_timeout_s=2.0, goodbye_flush_s=0.2,
                            bootstrap=(hosts[0].gossip_addr,) if hosts else ())
        hosts.append(await nursery.start(run_host, config))
    await wait_for(lambda: all(len(h.connected_peers()) == N - 1 for h in hosts), timeout=20, what="full peer tables")
    await wait_for(lambda: all(len(h.router.mesh) >= 2 for h in hosts), timeout=20, what="meshes")
    return hosts


async def test_replicas_over_the_wire_hold_the_harness_bits(tmp_path: Path) -> None:
    rounds, ids = 3, _identities()
    params = {k: np.zeros(v, np.float32) for k, v in SHAPES.items()}
    plan, peers = ShardPlan(SHAPES, N), [i.peer_id for i in ids]
    updates = _updates(rounds)

    harness = ReducedNet(N, SHAPES, params, CONFIG)
    for r in range(rounds):
        harness.close([(p, updates[r][k], harness.slot, 1000, 50) for k, p in enumerate(harness.peers)])
    assert harness.agree()

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            hosts = await _start(nursery, tmp_path, ids)
            nodes = [_Watched(i, peers, plan, CONFIG, run_id=RUN, params=params) for i in ids]
            drivers = [SlotDriver(h, node, SlotClock(patience=10.0, xi=2.0)) for h, node in zip(hosts, nodes)]
            for d in drivers:
                await nursery.start(d.run)

            async def one(k: int, d: SlotDriver, found: list) -> None:
                for r in range(rounds):
                    await d.publish(updates[r][k], d.node.slot, 1000, 50)
                    found.append(await d.close(timeout=60))

            slots: list[list] = [[] for _ in drivers]
            async with trio.open_nursery() as inner:
                for k, d in enumerate(drivers):
                    inner.start_soon(one, k, d, slots[k])
            assert {n.digest() for n in nodes} == {harness.replicas[peers[0]].digest()}
            assert all(len(s.seal.ids) == N for found in slots for s in found)
            assert all(d.dropped == {} for d in drivers), [d.dropped for d in drivers]
            assert all(not s.passed for found in slots for s in found)  # every reducer was in time
            assert set(hosts[0].counters.rejections) <= {Reason.DUPLICATE}  # gossip's own repeats only
            # the participant's work ran in worker threads, one call at a time on each node
            assert all(n.on_loop == [] and n.overlaps == 0 and n.calls > 10 for n in nodes), \
                [(n.on_loop[:3], n.overlaps, n.calls) for n in nodes]
            nursery.cancel_scope.cancel()


async def test_a_silent_reducer_is_passed_over_and_the_replicas_agree(tmp_path: Path) -> None:
    ids = _identities()
    params = {k: np.zeros(v, np.float32) for k, v in SHAPES.items()}
    plan, peers = ShardPlan(SHAPES, N), [i.peer_id for i in ids]
    updates = _updates(1)[0]
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            hosts = await _start(nursery, tmp_path, ids)
            nodes = [ReducedNode(i, peers, plan, CONFIG, run_id=RUN, params=params) for i in ids]
            probe = ReducedNode(ids[0], peers, plan, CONFIG, run_id=RUN)
            silent = probe.sealer_order()[-1]  # seals nothing unless every other sealer fails; reduces nothing
            for node in nodes:
                node.takes_roles = node.peer != silent
            drivers = [SlotDriver(h, node, SlotClock(patience=10.0, xi=0.5)) for h, node in zip(hosts, nodes)]
            for d in drivers:
                await nursery.start(d.run)
            found: dict[str, object] = {}

            async def one(k: int, d: SlotDriver) -> None:
                await d.publish(updates[k], 0, 1000, 50)
                found[d.node.peer] = await d.close(timeout=60)

            async with trio.open_nursery() as inner:
                for k, d in enumerate(drivers):
                    inner.start_soon(one, k, d)
            assert len({n.digest() for n in nodes}) == 1
            assert all(s.passed for s in found.values())  # the silent node's shards went to the next in order
            nursery.cancel_scope.cancel()


async def test_a_lying_aggregator_is_caught_and_judged_over_the_wire(tmp_path: Path) -> None:
    ids, updates = _identities(), _updates(1)[0]
    params = {k: np.zeros(v, np.float32) for k, v in SHAPES.items()}
    plan, peers = ShardPlan(SHAPES, N), [i.peer_id for i in ids]
    liar = reducers(1, 0, sorted(peers))[0]  # shard 0's aggregator in slot 1
    harness = ReducedNet(N, SHAPES, params, CONFIG, q=1.0)
    report = harness.close([(p, updates[k], 0, 1000, 50) for k, p in enumerate(harness.peers)], liars={liar: -1.0})
    assert report.caught and harness.excluded == {liar}
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            hosts = await _start(nursery, tmp_path, ids)
            nodes = [_HarnessNode(i, peers, plan, CONFIG, run_id=RUN, params=params, q=1.0) for i in ids]
            for node in nodes:
                node.factor = -1.0 if node.peer == liar else None
            drivers = [SlotDriver(h, node, SlotClock(patience=10.0, xi=2.0)) for h, node in zip(hosts, nodes)]
            for d in drivers:
                await nursery.start(d.run)

            closed: list = []

            async def one(k: int, d: SlotDriver) -> None:
                await d.publish(updates[k], 0, 1000, 50)
                closed.append(await d.close(timeout=60))

            async with trio.open_nursery() as inner:
                for k, d in enumerate(drivers):
                    inner.start_soon(one, k, d)
            assert {n.digest() for n in nodes} == {harness.replicas[peers[0]].digest()}
            assert all(s.caught == [(0, liar)] for s in closed)  # by the proof, judged on every node
            assert all(n.excluded == {liar} for n in nodes)
            nursery.cancel_scope.cancel()
