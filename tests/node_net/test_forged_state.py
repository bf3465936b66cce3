"""Tier (b): a peer that serves a forged state — a history of its own (another chain), a claim of 2⁴⁰ more
finalized tokens than the run trained, and garbage parameters — beside two training node runtimes, in one
trio process. Every part of that state checks out: its entries are signed (it has none), its parameters
hash to the digest in its manifest, which its server signs; only the finalized totals are its word, and
they win the fork choice: the node is told to adopt it, and without the vet its model would become those
garbage parameters (`Replica.adopt_pending` installs the proposal's ledger).

The node evaluates the state before adopting it and refuses it: counted (`fork-refused`), its held-out
loss unharmed, the forger's states not downloaded for a while. A joiner, with no trained model, vets the state
it downloaded against its starting model the same way (`state-refused`).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import httpx
import p2p
import trio

from node.chaos import forged_replica
from node.outer.forkguard import ADOPTION_COOLDOWN_WINDOWS
from node.runtime import NodeRuntime
from node.settings import NodeSettings
from node.sync.repair import pull_missing
from node.sync.stateserve import StateServer
from node_net_helpers import fast_host_config
from waiting import wait_for

SMALL = ("seq_len=32", "d_model=32", "n_heads=2", "d_ff=64", "batch_size=8", "lr=1e-2", "warmup_steps=5")
RUN = "forged"


def settings(tmp: Path, name: str, peers: tuple[str, ...] = (), **extra) -> NodeSettings:
    return NodeSettings(run_id=RUN, key_path=tmp / name / "key", checkpoint_dir=tmp / name / "ckpt",
                        peers=peers, overrides=SMALL, inner_steps=5, max_rounds=60, eval_every=1, eval_budget=1.0,
                        heartbeat_s=0.2, **extra)


def evaluations_after(node: NodeRuntime, tokens: int) -> list[float]:
    return [loss for at, _, loss in node.stats.eval_history if at > tokens]


async def stop(nursery: trio.Nursery, nodes: list[NodeRuntime]) -> None:
    """Stop the nodes as a signal would (each ends its round and writes its checkpoint), then the forger."""
    for node in nodes:
        node.request_stop("the test is done")
    await wait_for(lambda: all(node.result is not None for node in nodes), 60, "the nodes stopped")
    nursery.cancel_scope.cancel()


async def serving_host(nursery: trio.Nursery, tmp_path: Path, name: str,
                       a: NodeRuntime) -> tuple[p2p.Host, StateServer]:
    """A host of the run connected to `a` that serves whatever state the test gives its `StateServer`."""
    config = dataclasses.replace(fast_host_config(tmp_path, name, RUN, (a.host.gossip_addr,)),
                                 run_config=a.host.config.run_config)  # a peer of the run
    host = await nursery.start(p2p.run, config)
    await wait_for(lambda: host.peer_id in a.host.connected_peers(), 10, f"{name} connected")
    server = StateServer(host)
    server.mount()
    return host, server


async def run_with_forger(nursery: trio.Nursery, tmp_path: Path,
                          **a_settings) -> tuple[list[NodeRuntime], p2p.Host, StateServer]:
    """Nodes `a` and its peer `c`, training, once `a` has three evaluations, and a forger (`serving_host`)."""
    a = NodeRuntime(settings(tmp_path, "a", **a_settings))
    await nursery.start(a.run)
    c = NodeRuntime(settings(tmp_path, "c", (a.host.gossip_addr,)))
    await nursery.start(c.run)
    await wait_for(lambda: len(a.stats.eval_history) >= 3, 120, "a trained")
    forger, server = await serving_host(nursery, tmp_path, "forger", a)
    return [a, c], forger, server


@pytest.mark.slow
async def test_a_forged_heavier_state_is_refused_by_the_vet(tmp_path: Path, jax_persistent_cache) -> None:
    with trio.fail_after(180):
        async with trio.open_nursery() as nursery:
            nodes, forger, server = await run_with_forger(nursery, tmp_path)
            a = nodes[0]
            forged = await forged_replica(a.replica, 2**40)
            server.serve(forged)
            tokens, best = a.stats.tokens, min(p[2] for p in a.stats.eval_history)

            result = await pull_missing(a.host, a.replica, RUN, forger.peer_id, forger.http_addr)
            assert result is not None and result.fork == "adopt", result  # the forged state wins the fork choice
            ours, theirs = await a.replica.params(), await forged.params()
            garbage = await trio.to_thread.run_sync(functools.partial(a.loop.evaluate, a.heldout, params=theirs))
            assert garbage > 5 * await trio.to_thread.run_sync(
                functools.partial(a.loop.evaluate, a.heldout, params=ours)), "what adopting it would give"

            await wait_for(lambda: a.replica.outcomes["fork-refused"] == 1, 60, "a's vet refused it")
            again = await pull_missing(a.host, a.replica, RUN, forger.peer_id, forger.http_addr)
            assert again is not None and again.fork == "refused", again  # not downloaded again so soon
            await wait_for(lambda: len(evaluations_after(a, tokens)) >= 3, 60, "a trained on")
            async with httpx.AsyncClient(verify=False) as client:
                status = (await client.get(f"https://{a.host.http_addr}/status")).json()
            await stop(nursery, nodes)
    assert status["fork_refused_from"] == [forger.peer_id] and status["ledger_outcomes"]["fork-refused"] == 1

    assert a.replica.outcomes["fork-adopted"] == 0
    after = evaluations_after(a, tokens)
    # a trains on, not on the forgery (which evaluates more than 5x worse, above): its own evaluations wander
    # (one at 1.34x its best was seen on a loaded machine), so the bound is 1.5x, far under the forgery's
    assert max(after) <= best * 1.5, (best, after)


@pytest.mark.slow
async def test_a_forged_state_that_passes_is_adopted_once_then_none_of_its_for_four_windows_unless_vouched_for(
        tmp_path: Path, jax_persistent_cache) -> None:
    """A forgery whose model passes the vet (the node's own parameters, the window's updates dropped: later in
    a run, a forged state of the window bottom, a model W slots old, is within the tolerance too) is adopted.
    Every next forgery of that peer (each heavier than the last) would drop the node's window again: none is
    downloaded for `ADOPTION_COOLDOWN_WINDOWS` windows of slots — unless a second peer signs a manifest of the
    same state (as an honest peer that adopted a third's heavier state is backed by the third): then it is
    adopted again, but a vouch does that once per period, so the next vouched forgery is held off too. The
    node here adopts without evaluating (`--fork-tolerance inf`), so that its fast early training does not
    make the vet refuse the forgery."""
    with trio.fail_after(300):  # its waits for adoptions took over a minute with the whole suite on 2 cores
        async with trio.open_nursery() as nursery:
            nodes, forger, server = await run_with_forger(nursery, tmp_path, fork_tolerance=float("inf"))
            a = nodes[0]
            server.serve(await forged_replica(a.replica, 2**40, scale=1.0, base=await a.replica.params()))
            result = await pull_missing(a.host, a.replica, RUN, forger.peer_id, forger.http_addr)
            assert result is not None and result.fork == "adopt", result
            await wait_for(lambda: a.replica.outcomes["fork-adopted"] == 1, 120, "a adopted it")
            heavier = await forged_replica(a.replica, 2**41, scale=1.0, base=await a.replica.params())
            server.serve(heavier)
            again = await pull_missing(a.host, a.replica, RUN, forger.peer_id, forger.http_addr)
            assert again is not None and again.fork == "refused", again
            guard = a.replica.guard
            assert guard.adopted_recently(forger.peer_id) and a.replica.slot < guard.adopted_from[
                forger.peer_id] + ADOPTION_COOLDOWN_WINDOWS * a.replica.config.window

            _, witness = await serving_host(nursery, tmp_path, "witness", a)
            witness.serve(heavier)  # a second key signs a manifest of the same slot and ledger digest
            vouched = await pull_missing(a.host, a.replica, RUN, forger.peer_id, forger.http_addr)
            assert vouched is not None and vouched.fork == "adopt", vouched
            await wait_for(lambda: a.replica.outcomes["fork-adopted"] == 2, 120, "a adopted the vouched state")
            heaviest = await forged_replica(a.replica, 2**42, scale=1.0, base=await a.replica.params())
            server.serve(heaviest)
            witness.serve(heaviest)
            third = await pull_missing(a.host, a.replica, RUN, forger.peer_id, forger.http_addr)
            assert third is not None and third.fork == "refused", third  # one vouch per period
            await stop(nursery, nodes)
    assert not a.replica.outcomes["fork-refused"]


@pytest.mark.slow
async def test_a_joiner_refuses_a_forged_fresher_state_and_joins_from_an_honest_peer(tmp_path: Path,
                                                                                   jax_persistent_cache) -> None:
    """A joiner prefers the freshest state when no two peers agree; the forger claims one 50 slots ahead
    with garbage parameters. The joiner evaluates it against its own starting model, refuses it, takes the
    honest peer's state, and does not download the forger's again for a while."""
    with trio.fail_after(180):
        async with trio.open_nursery() as nursery:
            a = NodeRuntime(settings(tmp_path, "a"))
            await nursery.start(a.run)
            await wait_for(lambda: len(a.stats.eval_history) >= 3, 120, "a trained")
            config = dataclasses.replace(fast_host_config(tmp_path, "forger", RUN, (a.host.gossip_addr,)),
                                         run_config=a.host.config.run_config)
            forger = await nursery.start(p2p.run, config)
            server = StateServer(forger)
            server.mount()
            server.serve(await forged_replica(a.replica, 2**40, slots_ahead=50))
            joiner = NodeRuntime(settings(tmp_path, "j", (forger.gossip_addr, a.host.gossip_addr)))
            await nursery.start(joiner.run)
            await wait_for(lambda: joiner.stats.eval_history, 120, "the joiner evaluated")
            assert joiner.stats.sync["confirmed_by"] == [a.peer_id], joiner.stats.sync
            assert joiner.replica.outcomes["state-refused"] == 1
            assert forger.peer_id in joiner.replica.guard.refused_from
            best = min(p[2] for p in a.stats.eval_history)
            assert joiner.stats.eval_history[0][2] < 1.5 * best, (joiner.stats.eval_history, best)
            await stop(nursery, [a, joiner])
