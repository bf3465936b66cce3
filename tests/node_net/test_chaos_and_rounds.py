"""Tier (a)/(b): `POST /chaos` on real loopback hosts (no training), and the round-time pieces behind
`--adaptive-steps`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import httpx
import trio

import p2p
from node.chaos import ChaosRoute, Slowdown
from node.outer.peerclock import PeerRoundClock
from node.outer.rounds import ShouldStop
from node_net_helpers import fast_host_config
from waiting import wait_for

RUN = "chaos-test"


def host_config(tmp: Path, name: str, bootstrap: tuple[str, ...] = ()) -> p2p.HostConfig:
    return fast_host_config(tmp, name, RUN, bootstrap)



@pytest.mark.slow
async def test_post_chaos_cuts_a_peer_for_the_given_seconds_then_it_comes_back(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a = await nursery.start(p2p.run, host_config(tmp_path, "a"))
            b = await nursery.start(p2p.run, host_config(tmp_path, "b", (a.gossip_addr,)))
            ChaosRoute(a).mount()
            await wait_for(lambda: b.peer_id in a.connected_peers(), 10, "the connection")
            async with httpx.AsyncClient(verify=False) as client:
                bad = await client.post(f"{a.http_url}/chaos", json={"block_peers": "x", "seconds": 1})
                assert bad.status_code == 400
                ok = await client.post(f"{a.http_url}/chaos", json={"block_peers": [b.peer_id], "seconds": 1.5})
                assert ok.status_code == 200 and ok.json()["blocked"] == [b.peer_id]
                assert (await client.get(f"{a.http_url}/blobs/{'0' * 64}")).status_code == 404  # other routes work
            cut_at = trio.current_time()
            await wait_for(lambda: b.peer_id not in a.connected_peers(), 5, "the cut")
            await wait_for(lambda: b.peer_id in a.connected_peers(), 10, "the reconnection")
            assert trio.current_time() - cut_at >= 1.0, "refused while the block lasted"
            await b.close()
            await a.close()


def test_peer_round_clock_takes_the_median_of_peers_round_times() -> None:
    clock = PeerRoundClock()
    assert clock.target_seconds() is None
    for t in (0.0, 2.0, 4.0):
        clock.observe("fast", t)
    for t in (0.0, 10.0):
        clock.observe("slow", t)
    clock.observe("once", 3.0)
    assert math.isclose(clock.target_seconds(), 6.0)  # median of 2 (fast) and 10 (slow)


def test_a_round_cut_short_counts_as_the_full_round_it_stands_for() -> None:
    clock = PeerRoundClock()
    clock.observe("cut", 0.0, 50, 50)
    clock.observe("cut", 4.0, 40, 50)  # 40 of 50 steps in 4 s: a full round takes about 5 s
    assert math.isclose(clock.target_seconds(), 5.0)
    assert clock.due(7.0, 8.5) == 1, "the next update is due after the measured interval, 4 s, not 5 s"
    clock.observe("cut", 9.0, 50, 50)
    assert math.isclose(clock.target_seconds(), 0.7 * 5.0 + 0.3 * 5.0)


def test_should_stop_honours_the_budget_but_always_allows_one_step() -> None:
    stop = ShouldStop(lambda: False, Slowdown(1.0), budget_s=0.0)
    assert stop() is False, "the first step always runs"
    assert stop() is True, "then the (zero) budget is spent"
    unlimited = ShouldStop(lambda: False, Slowdown(1.0), budget_s=None)
    assert not any(unlimited() for _ in range(100))
    requested = ShouldStop(lambda: True, Slowdown(1.0), budget_s=None)
    assert requested() is True, "a stop request ends the round before the next step"


def test_should_stop_lets_the_budget_end_a_round_only_after_its_minimum_steps() -> None:
    stop = ShouldStop(lambda: False, Slowdown(1.0), budget_s=0.0, min_steps=4)
    assert [stop() for _ in range(5)] == [False] * 4 + [True], "four steps run however small the budget"
    requested = ShouldStop(lambda: True, Slowdown(1.0), budget_s=None, min_steps=4)
    assert requested() is True, "a stop request still ends the round at once"


def test_peer_round_clock_measures_publication_times_so_a_replayed_burst_is_not_a_round() -> None:
    clock = PeerRoundClock()
    for published in (100.0, 110.0, 120.0):  # three updates 10 s apart, all arriving in one burst
        clock.observe("a", published, 50, 50)
    assert math.isclose(clock.target_seconds(), 10.0), "the burst's arrival times do not matter"
    clock.observe("a", 105.0, 50, 50)  # an older one, announced late: not a new round
    assert math.isclose(clock.target_seconds(), 10.0)
