"""Tier (b): the state plane between real loopback hosts, with small numpy ledgers (no JAX): a joiner's
`sync_state` picks and verifies a peer state, and `pull_missing` repairs a replica that missed updates."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import trio

import p2p
from node.sync.join import StateServer, sync_state
from node.sync.repair import pull_missing
from node.outer.replica import Replica
from protocol.compression import Codec
from protocol.ledger import Ledger, LedgerConfig
from protocol.messages import StateManifest
from protocol.validation import Validator
from node_net_helpers import fast_host_config
from signed_updates import signed_update
from waiting import wait_for

RUN = "state-test"
CONFIG = LedgerConfig(window=4)
SHAPES = {"b": (3,), "w": (4, 4)}


def host_config(tmp: Path, name: str, bootstrap: tuple[str, ...] = ()) -> p2p.HostConfig:
    return fast_host_config(tmp, name, RUN, bootstrap)


def fresh_ledger() -> Ledger:
    return Ledger({n: np.ones(s, np.float32) for n, s in SHAPES.items()}, CONFIG)


def update(seed: int, base: int, publish: int, codec: Codec | None = None):
    """(meta, deltas, payload, proof) of a signed update by origin `seed` (`codec` None: added without its
    payload; else encoded as a node adds it, its deltas the payload's exact decode)."""
    rng = np.random.default_rng(seed)
    deltas = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
    return signed_update(RUN, SHAPES, deltas, seed=seed, base=base, publish=publish, tokens=100 + seed, codec=codec)


async def state_donors(nursery: trio.Nursery, tmp: Path, replicas: dict[str, Replica]) -> list[p2p.Host]:
    """A host per named replica, each serving that replica's state (`StateServer`)."""
    hosts = []
    for name, replica in replicas.items():
        host = await nursery.start(p2p.run, host_config(tmp, name))
        server = StateServer(host)
        server.mount()
        server.replica = replica
        hosts.append(host)
    return hosts


async def test_repair_pulls_missed_updates_and_replicas_converge(tmp_path: Path) -> None:
    placements = [(0, 0), (0, 0), (0, 1), (1, 1), (1, 2)]
    updates = [update(i, base, pub, Codec.INT4) for i, (base, pub) in enumerate(placements)]
    full, partial = Replica(fresh_ledger()), Replica(fresh_ledger())
    for i, (meta, deltas, payload, proof) in enumerate(updates):
        await full.add(meta, {k: v.copy() for k, v in deltas.items()}, payload, proof)
        if i in (0, 3):  # the partial replica missed the others (a partition)
            await partial.add(meta, {k: v.copy() for k, v in deltas.items()}, payload, proof)
    await full.close_open()
    await partial.close_open()
    assert full.set_hash.hex() != partial.set_hash.hex()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            a = await nursery.start(p2p.run, host_config(tmp_path, "a"))
            b = await nursery.start(p2p.run, host_config(tmp_path, "b", (a.gossip_addr,)))
            server = StateServer(a)
            server.mount()
            server.replica = full
            await wait_for(lambda: a.peer_id in b.connected_peers(), 10, "the connection")
            result = await pull_missing(b, partial, RUN, a.peer_id, a.http_addr)
            assert result is not None and (result.added, result.too_stale) == (3, 0)
            assert partial.set_hash.hex() == full.set_hash.hex()
            again = await pull_missing(b, partial, RUN, a.peer_id, a.http_addr)
            assert again is not None and again.added == 0, "nothing left to pull"
            await b.close()
            await a.close()
    await full.close_known()
    await partial.close_known()
    assert partial.slot == full.slot and await partial.digests() == await full.digests()
    payloads = [{e.meta.update_id: e.payload for e in (await r.snapshot())[0].entries} for r in (partial, full)]
    assert len(payloads[0]) == 5 and None not in payloads[0].values() and payloads[0] == payloads[1], \
        "pulled updates keep their payloads"


async def test_a_joiner_takes_the_state_two_peers_confirm_and_verifies_it(tmp_path: Path) -> None:
    replicas = [Replica(fresh_ledger()) for _ in range(3)]
    shared = [update(i, 0, 0) for i in range(2)]
    for r in replicas[:2]:  # two peers at slot 1 with the same updates
        for meta, deltas, _, proof in shared:
            await r.add(meta, {k: v.copy() for k, v in deltas.items()}, proof=proof)
        await r.close_open()
    for meta, deltas, _, proof in [update(9, 0, 0), update(10, 0, 1)]:  # a third one, fresher but alone
        await replicas[2].add(meta, deltas, proof=proof)
    await replicas[2].close_open()
    await replicas[2].close_open()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            donors = await state_donors(nursery, tmp_path, {f"d{i}": replica for i, replica in enumerate(replicas)})
            joiner = await nursery.start(p2p.run, host_config(tmp_path, "j", tuple(h.gossip_addr for h in donors)))
            await wait_for(lambda: len(joiner.connected_peers()) == 3, 10, "three connections")
            async with httpx.AsyncClient(verify=False) as client:
                raw = (await client.get(f"{donors[0].http_url}/state")).content
            signed = Validator(RUN).validate(raw, donors[0].now())
            assert isinstance(signed.body, StateManifest) and signed.origin == donors[0].peer_id
            result = await sync_state(joiner, RUN, CONFIG, SHAPES, own=(0, fresh_ledger().ledger_digest()),
                                      timeout_s=10, retry_s=0.1)
            assert result is not None and result.choice.confirmed
            assert set(result.choice.confirmed_by) == {donors[0].peer_id, donors[1].peer_id}
            assert result.ledger.slot == 1
            assert (result.ledger.ledger_digest(), result.ledger.params_digest()) == await replicas[0].digests()
            mine = await replicas[0].digests()
            kept = await sync_state(joiner, RUN, CONFIG, SHAPES, own=(1, mine[0]), timeout_s=10, retry_s=0.1)
            assert kept is None, "a node whose state is as fresh keeps its own"
            for host in [joiner, *donors]:
                await host.close()


async def test_when_every_peer_is_syncing_too_a_node_starts_from_its_own_state(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            other = await nursery.start(p2p.run, host_config(tmp_path, "other"))
            StateServer(other).mount()  # no replica yet: answers 503
            me = await nursery.start(p2p.run, host_config(tmp_path, "me", (other.gossip_addr,)))
            await wait_for(lambda: other.peer_id in me.connected_peers(), 10, "the connection")
            started = trio.current_time()
            result = await sync_state(me, RUN, CONFIG, SHAPES, own=(0, fresh_ledger().ledger_digest()),
                                      timeout_s=15, retry_s=0.1)
            assert result is None and trio.current_time() - started < 5, "no waiting for the whole timeout"
            await me.close()
            await other.close()


async def test_a_state_holding_an_update_its_origin_never_signed_is_refused_and_counted(tmp_path: Path) -> None:
    """A donor cannot inject updates through the state plane: every entry of a served state is checked against
    its origin's signature (protocol.ledger.proof), so one made up (here: a genuine update's proof on an
    entry that claims more tokens, and one with no proof at all) makes the whole state refused."""
    import dataclasses

    from protocol.ledger import UpdateMeta

    genuine = update(0, 0, 0, Codec.INT4)
    forged_meta = dataclasses.replace(genuine[0], update_id=bytes(32), tokens=10**6)  # inflated claim, same proof
    for label, extra in [("a forged claim", (forged_meta, genuine[1], genuine[2], genuine[3])),
                         ("no signature", (UpdateMeta(b"\x01" * 32, "peer-x", 0, 0, 100, 5), genuine[1], genuine[2],
                                           None))]:
        hostile, honest = Replica(fresh_ledger()), Replica(fresh_ledger())
        await hostile.add(*genuine)
        await hostile.add(*extra)
        await hostile.close_open()
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                a = await nursery.start(p2p.run, host_config(tmp_path / label.replace(" ", "-"), "a"))
                b = await nursery.start(p2p.run, host_config(tmp_path / label.replace(" ", "-"), "b", (a.gossip_addr,)))
                server = StateServer(a)
                server.mount()
                server.replica = hostile
                await wait_for(lambda: a.peer_id in b.connected_peers(), 10, "the connection")
                assert await pull_missing(b, honest, RUN, a.peer_id, a.http_addr) is None, label
                assert b.counters.rejections_by_peer[a.peer_id]["bad_state"] == 1, label
                assert honest.updates_applied == 0, f"{label}: nothing of that state was taken"
                await b.close()
                await a.close()


async def test_two_comparisons_that_would_adopt_the_same_heavier_state_download_it_once(tmp_path: Path,
                                                                                          caplog) -> None:
    """A replica that forked from two peers holding the same heavier state (a partition longer than the
    window) compares with both at once: one whole-state download, the other comparison waits for it and
    finds the proposed state as heavy as its peer's. A later comparison with the peer whose state is
    proposed downloads nothing until that proposal is adopted or refused."""
    heavy, light = Replica(fresh_ledger()), Replica(fresh_ledger())
    for slot in range(CONFIG.window + 2):
        for seed in (1, 2):
            await heavy.add(*update(10 * slot + seed, slot, slot, Codec.INT4))
        await light.add(*update(10 * slot + 3, slot, slot, Codec.INT4))
        await heavy.close_open()
        await light.close_open()
    caplog.set_level("INFO")
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            donors = await state_donors(nursery, tmp_path, {"a": heavy, "c": heavy})
            b = await nursery.start(p2p.run, host_config(tmp_path, "b", tuple(h.gossip_addr for h in donors)))
            await wait_for(lambda: len(b.connected_peers()) == 2, 10, "two connections")
            results = []

            async def compare(donor: p2p.Host) -> None:
                results.append(await pull_missing(b, light, RUN, donor.peer_id, donor.http_addr))

            async with trio.open_nursery() as comparisons:
                for donor in donors:
                    comparisons.start_soon(compare, donor)
            # its donor trains on (a heavier state still) before the proposal is adopted or refused: not
            # downloaded again from that donor (a hostile one would make the node download a state per round)
            proposed = await heavy.digests()
            await heavy.add(*update(999, heavy.slot, heavy.slot, Codec.INT4))
            await heavy.close_open()
            proposer = next(d for d in donors if d.peer_id == light.pending.origin)
            await compare(proposer)
            for host in [b, *donors]:
                await host.close()
    assert [r.fork for r in results] == ["adopt", "adopt", "adopt"]
    assert sum("loaded the state of slot" in r.getMessage() for r in caplog.records) == 1
    assert sum("not downloading it" in r.getMessage() for r in caplog.records) == 1
    assert light.pending is not None
    assert (light.pending.ledger.ledger_digest(), light.pending.ledger.params_digest()) == proposed
