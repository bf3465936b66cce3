"""Tier (b): the chunked, verified, multi-donor state download between real loopback hosts (HTTP over TCP),
with numpy ledgers whose window bottom is several 4 MiB pieces (no JAX):

- the first donor is killed mid-download (after it served verified pieces), and the join completes from
  the other donor, every piece verified, no piece fetched twice;
- a donor that serves corrupted pieces is refused (`bad_chunk`, counted against it) and the join completes
  from the honest donor;
- a download cut short keeps its verified pieces, and the retry fetches only the rest.

Progress is observed through the joiner's `on_piece` hook and the donors' piece counters, never a sleep.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import httpx
import numpy as np
import trio

import p2p
from node.sync.join import bootstrap_peers, choose, fetch_manifests, sync_state
from node.outer.agreement import IdSetHash
from node.outer.replica import Replica
from node.sync.statefetch import download_state
from node.sync.stateserve import BOTTOM_PREFIX, StateServer
from p2p import Request, Response, TransportError
from protocol.errors import Reason
from protocol.ledger import Ledger, LedgerConfig, Payload, UpdateMeta
from protocol.ledger.digest import PIECE
from protocol.ledger.proof import UpdateProof
from node_net_helpers import fast_host_config
from signed_updates import signed_update
from waiting import wait_for

RUN = "state-sync-test"
CONFIG = LedgerConfig(window=2)
SHAPES = {"b": (3,), "w": (3 * PIECE // 4,)}  # theta/w and momentum/w: 3 pieces each as float32, 6 as float64


def fresh_ledger() -> Ledger:
    return Ledger({n: np.linspace(-1, 1, s[0], dtype=np.float32) for n, s in SHAPES.items()}, CONFIG)


def updates() -> list[tuple[UpdateMeta, dict[str, np.ndarray], Payload | None, UpdateProof]]:
    out = []
    shared = {n: np.random.default_rng(99).standard_normal(s) for n, s in SHAPES.items()}
    for i, (base, publish) in enumerate([(0, 0), (0, 0), (0, 1), (1, 2), (2, 3)]):
        rng = np.random.default_rng(i)
        # pseudo-gradients of one model agree (a shared direction): independent random ones would be screened
        # out of two-update slots (protocol.ledger.aggregate), leaving the window bottom's momentum zero
        deltas = {n: (shared[n] + rng.standard_normal(s)).astype(np.float32) for n, s in SHAPES.items()}
        out.append(signed_update(RUN, SHAPES, deltas, seed=i, base=base, publish=publish, tokens=100 + i))
    return out


async def same_replicas(n: int) -> list[Replica]:
    """`n` replicas of one state past its first window (the bottom moved: momentum is not zero)."""
    replicas = [Replica(fresh_ledger()) for _ in range(n)]
    for r in replicas:
        for k, (meta, deltas, payload, proof) in enumerate(updates()):
            if k in (2, 3, 4):
                await r.close_open()
            await r.add(meta, deltas, payload, proof)
    assert len({await r.digests() for r in replicas}) == 1 and replicas[0].base_slot >= 1
    return replicas


class Cluster:
    def __init__(self, nursery: trio.Nursery, tmp: Path) -> None:
        self.nursery, self.tmp = nursery, tmp
        self.donors: list[p2p.Host] = []
        self.servers: list[StateServer] = []

    async def donor(self, name: str, replica: Replica) -> p2p.Host:
        host = await self.nursery.start(p2p.run, fast_host_config(self.tmp, name, RUN))
        server = StateServer(host)
        server.mount()
        server.replica = replica
        self.donors.append(host)
        self.servers.append(server)
        return host

    async def joiner(self) -> p2p.Host:
        host = await self.nursery.start(
            p2p.run, fast_host_config(self.tmp, "joiner", RUN, tuple(d.gossip_addr for d in self.donors)))
        await wait_for(lambda: len(host.connected_peers()) == len(self.donors), 10, "connections to every donor")
        return host


def gate(host: p2p.Host, server: StateServer) -> trio.Event:
    """Hold `host`'s bottom pieces back until the returned event is set (its other routes answer)."""
    opened = trio.Event()

    async def gated(request: Request) -> Response:
        await opened.wait()
        return await server.handle_piece(request)

    host.http.route("GET", BOTTOM_PREFIX, gated)
    return opened


@pytest.mark.slow
async def test_the_first_donor_dies_mid_download_and_the_join_completes_from_another(tmp_path: Path) -> None:
    replicas = await same_replicas(2)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            cluster = Cluster(nursery, tmp_path)
            first, second = [await cluster.donor(f"d{i}", r) for i, r in enumerate(replicas)]
            second_pieces = gate(second, cluster.servers[1])  # the first donor serves alone at first
            joiner = await cluster.joiner()
            verified: list[tuple[str, int]] = []

            def on_piece(peer: str, index: int) -> None:
                verified.append((peer, index))
                if sum(p == first.peer_id for p, _ in verified) == 2:
                    first.abort()  # killed: no goodbye, its HTTP server gone with its in-flight pieces
                    second_pieces.set()

            told: list[str | None] = []  # what /status's waiting_for says meanwhile
            result = await sync_state(joiner, RUN, CONFIG, SHAPES, own=(0, fresh_ledger().ledger_digest()),
                                      timeout_s=30, retry_s=0.1, on_piece=on_piece, waiting=told.append)
            assert result is not None and set(result.choice.confirmed_by) == {first.peer_id, second.peer_id}
            progress = [w for w in told if w and "pieces of its parameters verified" in w]
            assert len(progress) == len(verified) and progress[-1].endswith(f"{len(verified)} pieces of its "
                                                                            "parameters verified")
            assert (result.ledger.ledger_digest(), result.ledger.params_digest()) == await replicas[0].digests()
            assert result.ledger.slot == replicas[0].slot and IdSetHash(result.seen).hex() == replicas[0].set_hash.hex()
            by_donor = Counter(p for p, _ in verified)
            total = len(set(i for _, i in verified))
            assert total >= 6 and len(verified) == total, "every piece verified exactly once"
            assert by_donor[first.peer_id] >= 2 and by_donor[second.peer_id] == total - by_donor[first.peer_id] > 0
            assert cluster.servers[1].pieces_served == by_donor[second.peer_id]
            for host in (joiner, second):
                await host.close()


@pytest.mark.slow
async def test_a_corrupted_piece_is_refused_and_counted_and_the_honest_donor_serves_it(tmp_path: Path) -> None:
    replicas = await same_replicas(2)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            cluster = Cluster(nursery, tmp_path)
            bad, honest = [await cluster.donor(f"d{i}", r) for i, r in enumerate(replicas)]
            async with httpx.AsyncClient(verify=False) as client:
                assert (await client.get(f"{bad.http_url}/state")).status_code == 200  # its bottom is frozen now
            [frozen] = list(cluster.servers[0].bottoms.directory.glob("*.bottom"))
            size = frozen.stat().st_size
            with open(frozen, "r+b") as f:  # one flipped byte in every piece it will serve
                for at in range(0, size, PIECE):
                    f.seek(at + 7)
                    byte = f.read(1)
                    f.seek(at + 7)
                    f.write(bytes([byte[0] ^ 0x40]))
            honest_pieces = gate(honest, cluster.servers[1])
            joiner = await cluster.joiner()
            verified: list[tuple[str, int]] = []

            def on_piece(peer: str, index: int) -> None:
                verified.append((peer, index))

            async def open_when_refused() -> None:
                await wait_for(lambda: joiner.counters.rejections[Reason.BAD_CHUNK] >= 1, 20, "a refused piece")
                honest_pieces.set()

            nursery.start_soon(open_when_refused)
            result = await sync_state(joiner, RUN, CONFIG, SHAPES, own=(0, fresh_ledger().ledger_digest()),
                                      timeout_s=30, retry_s=0.1, on_piece=on_piece)
            assert result is not None
            assert (result.ledger.ledger_digest(), result.ledger.params_digest()) == await replicas[0].digests()
            assert joiner.counters.rejections_by_peer[bad.peer_id][Reason.BAD_CHUNK] >= 1
            assert Reason.BAD_CHUNK not in joiner.counters.rejections_by_peer.get(honest.peer_id, {})
            assert verified and {p for p, _ in verified} == {honest.peer_id}, "no piece of the bad donor was kept"
            assert len(verified) == len({i for _, i in verified})
            for host in (joiner, bad, honest):
                await host.close()


@pytest.mark.slow
async def test_a_download_cut_short_is_resumed_without_fetching_verified_pieces_again(tmp_path: Path) -> None:
    replicas = await same_replicas(2)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            cluster = Cluster(nursery, tmp_path)
            first, second = [await cluster.donor(f"d{i}", r) for i, r in enumerate(replicas)]
            joiner = await cluster.joiner()
            async with httpx.AsyncClient(verify=False) as client:
                manifests, _ = await fetch_manifests(client, joiner, RUN)
            [choice] = choose(manifests)
            by_origin = {m.origin: m for m in choice.manifests}
            verified: list[int] = []

            def cut(peer: str, index: int) -> None:
                verified.append(index)
                if len(verified) == 3:
                    first.abort()

            try:
                await download_state(joiner, [by_origin[first.peer_id]], CONFIG, SHAPES, None, on_piece=cut,
                                     per_donor=1)
            except TransportError as exc:
                assert "no donor left" in str(exc)
            else:
                raise AssertionError("the only donor died: the download cannot complete")
            kept = len(verified)
            loaded = await download_state(joiner, [by_origin[second.peer_id]], CONFIG, SHAPES, None,
                                          on_piece=lambda peer, index: verified.append(index))
            assert (loaded.ledger.ledger_digest(), loaded.ledger.params_digest()) == await replicas[1].digests()
            pieces = len(loaded.meta.bottom.pieces())
            assert kept >= 3 and sorted(verified) == list(range(pieces)), "each piece verified once, across both"
            assert cluster.servers[1].pieces_served == pieces - kept
            assert not list((tmp_path / "joiner" / "state" / "download").glob("*.part")), "the part file is gone"
            for host in (joiner, second):
                await host.close()


@pytest.mark.slow
async def test_piece_urls_answer_400_for_a_malformed_path_and_404_for_what_is_not_held(tmp_path: Path) -> None:
    [replica] = await same_replicas(1)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            cluster = Cluster(nursery, tmp_path)
            donor = await cluster.donor("d", replica)
            async with httpx.AsyncClient(base_url=donor.http_url, verify=False) as client:
                assert (await client.get("/state")).status_code == 200
                [frozen] = [p.stem for p in cluster.servers[0].bottoms.directory.glob("*.bottom")]
                assert (await client.get(f"/state/bottom/{frozen}/0")).status_code == 200
                for path, status in [(f"/state/bottom/{frozen}/x", 400), (f"/state/bottom/{frozen}/\u00b2", 400),
                                     (f"/state/bottom/{frozen[:-1]}/0", 400), (f"/state/bottom/{frozen}/0/1", 400),
                                     (f"/state/bottom/{frozen}/99", 404), (f"/state/bottom/{'0' * 64}/0", 404)]:
                    assert (await client.get(path)).status_code == status, path
            assert cluster.servers[0].pieces_served == 1
            await donor.close()


@pytest.mark.slow
async def test_a_joiner_takes_its_bootstrap_peers_state_before_a_fresher_one_two_fresh_keys_confirm(tmp_path: Path) -> None:
    """Two fresh keys serve one state two slots fresher than the state of the joiner's bootstrap peer (the one
    address it was given): confirmed by two, it comes first by the freshest-confirmed rule, but the joiner
    takes what its bootstrap peer vouches for (`node.sync.join.choose`, PROTOCOL.md §11b)."""
    honest_replica, *sybil_replicas = await same_replicas(3)
    for r in sybil_replicas:  # the same two more closes on each: equal digests, a fresher slot
        await r.close_open()
        await r.close_open()
    assert len({await r.digests() for r in sybil_replicas}) == 1 and sybil_replicas[0].slot == honest_replica.slot + 2
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            cluster = Cluster(nursery, tmp_path)
            honest = await cluster.donor("honest", honest_replica)
            joiner = await nursery.start(p2p.run, fast_host_config(tmp_path, "joiner", RUN, (honest.gossip_addr,)))
            sybils = []
            for i, r in enumerate(sybil_replicas):  # they find the joiner themselves
                host = await nursery.start(p2p.run, fast_host_config(tmp_path, f"sybil{i}", RUN, (joiner.gossip_addr,)))
                server = StateServer(host)
                server.mount()
                server.replica = r
                sybils.append(host)
            await wait_for(lambda: len(joiner.connected_peers()) == 3, 10, "the joiner connected to all three")
            async with httpx.AsyncClient(verify=False) as client:
                manifests, _ = await fetch_manifests(client, joiner, RUN)
            assert set(choose(manifests)[0].confirmed_by) == {s.peer_id for s in sybils}  # what it would take
            assert bootstrap_peers(joiner) == {honest.peer_id}
            result = await sync_state(joiner, RUN, CONFIG, SHAPES, own=(0, fresh_ledger().ledger_digest()),
                                      timeout_s=30, retry_s=0.1, bootstrap=lambda: bootstrap_peers(joiner))
            assert result is not None and result.choice.confirmed_by == (honest.peer_id,)
            assert (result.ledger.ledger_digest(), result.ledger.params_digest()) == await honest_replica.digests()
            for host in (joiner, honest, *sybils):
                await host.close()
