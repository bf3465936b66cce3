"""Tier (a): the router's small pure parts, one by one."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import signing, wire
from protocol.admission import Admission, Membership, grant
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.gossip import (
    DialSchedule,
    GossipConfig,
    Handshake,
    MessageCache,
    PeerScores,
    PeerTable,
    ScoreConfig,
    State,
    backoff_delay,
    plan_mesh,
)
from protocol.gossip.mesh import gossip_targets
from protocol.identity import Identity
from protocol.messages import Goodbye, HelloProof, PeerInfo
from protocol.validation import Validator

RUN = "parts"


def test_importing_the_router_pulls_in_no_io() -> None:
    code = (
        "import sys, protocol.gossip, protocol.gossip.router, protocol.gossip.handshake\n"
        "bad = [m for m in ('trio', 'socket', 'httpx', 'httpcore', 'jax', 'asyncio', 'selectors') if m in sys.modules]\n"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# ---- backoff ------------------------------------------------------------------------------------


@given(st.integers(1, 80), st.floats(0, 0.999))
def test_backoff_is_exponential_jittered_and_capped(failures: int, u: float) -> None:
    d = backoff_delay(failures, 0.5, 30.0, u)
    nominal = min(30.0, 0.5 * 2 ** (failures - 1))
    assert 0.5 * nominal <= d < 1.5 * nominal
    assert backoff_delay(0, 0.5, 30.0, u) == 0.0


def test_dial_schedule_backs_off_and_resets_on_success() -> None:
    s = DialSchedule(1.0, 8.0, random.Random(1))
    assert s.ready("a", 0.0)
    delays = [s.failed("a", 0.0) for _ in range(6)]
    assert delays[0] < 1.5 and delays[-1] >= 4.0  # grows, then sits at the cap (+-50%)
    assert not s.ready("a", 0.0) and s.ready("a", 12.0)
    s.succeeded("a")
    assert s.ready("a", 0.0) and s.failures("a") == 0
    with pytest.raises(LocalProtocolError):
        DialSchedule(0.0, 1.0, random.Random())


# ---- scores -------------------------------------------------------------------------------------


def test_scores_penalize_decay_ban_and_forget() -> None:
    scores = PeerScores(ScoreConfig(decay=0.5))
    assert not scores.penalize("p", Reason.DUPLICATE) and scores.score("p") == 0
    assert not scores.penalize("p", Reason.BAD_SIGNATURE)
    assert scores.graylisted("p")
    crossed = [scores.penalize("p", Reason.BAD_SIGNATURE) for _ in range(2)]
    assert crossed == [False, True]  # -120 < -100
    scores.ban("p", now=10.0)
    assert scores.banned("p", 11.0) and not scores.banned("p", 10.0 + 600.0)
    assert scores.score("p") == 0.0  # a served ban starts clean
    for _ in range(30):
        scores.reward("q")
    assert scores.score("q") == 20.0  # capped
    for _ in range(20):
        scores.decay(connected=set())
    assert "q" not in scores.snapshot()


def test_score_config_needs_every_reason() -> None:
    with pytest.raises(LocalProtocolError):
        ScoreConfig(penalties={Reason.MALFORMED: 1.0})


# ---- mesh ---------------------------------------------------------------------------------------


@given(
    st.sets(st.integers(0, 30), max_size=31),
    st.sets(st.integers(0, 30), max_size=31),
    st.dictionaries(st.integers(0, 30), st.floats(-50, 50)),
    st.integers(0, 2**32),
)
def test_plan_mesh_keeps_degree_in_bounds_and_drops_negative_scores(
    mesh: set[int], others: set[int], scores: dict[int, float], seed: int
) -> None:
    mesh_ids = {f"p{i}" for i in mesh}
    connected = mesh_ids | {f"p{i}" for i in others}
    score = lambda p: scores.get(int(p[1:]), 0.0)  # noqa: E731
    plan = plan_mesh(mesh_ids, connected, score, lambda p: True, d=4, d_lo=3, d_hi=6, d_score=2, rng=random.Random(seed))
    after = (mesh_ids - set(plan.prune)) | set(plan.graft)
    assert all(score(p) >= 0 for p in after)
    assert set(plan.graft) <= connected - mesh_ids and set(plan.prune) <= mesh_ids
    eligible = sum(score(p) >= 0 for p in connected)
    assert len(after) <= 6
    assert len(after) >= min(3, eligible)
    if len(mesh_ids - set(plan.prune)) > 6:  # shrinking keeps the two best
        best = sorted((p for p in mesh_ids if score(p) >= 0), key=lambda p: (-score(p), p))[:2]
        assert set(best) <= after


def test_gossip_targets_are_outside_the_mesh() -> None:
    targets = gossip_targets({"a", "b", "c", "d"}, {"a"}, lambda p: p != "d", 5, random.Random(0))
    assert targets == ["b", "c"]


# ---- message cache ------------------------------------------------------------------------------


def _goodbye(ident: Identity, seqno: int) -> object:
    return signing.sign(ident, Goodbye(RUN, ident.peer_id, seqno, ""))


def test_mcache_announces_recent_windows_and_forgets_old_ones() -> None:
    ident = Identity.from_seed(b"\x01" * 32)
    cache = MessageCache(windows=3, gossip_windows=2)
    first = _goodbye(ident, 1)
    cache.put(first, {"x"})
    cache.shift()
    second = _goodbye(ident, 2)
    cache.put(second, set())
    assert cache.gossip_ids() == [second.message_id, first.message_id]
    cache.shift()
    assert cache.gossip_ids() == [second.message_id]
    assert first.message_id in cache  # still answerable to IWANT
    cache.shift()
    assert first.message_id not in cache and second.message_id in cache
    cache.put(second, {"y"})
    assert cache.get(second.message_id).known_by == {"y"}
    with pytest.raises(LocalProtocolError):
        MessageCache(2, 3)


# ---- peer table ---------------------------------------------------------------------------------


def test_peer_table_prefers_first_hand_addresses_skips_leavers_and_cannot_be_flooded_out() -> None:
    table = PeerTable("me", max_entries=3)
    assert not table.learn(PeerInfo("me", "h:1", ""), 0.0)
    assert table.learn(PeerInfo("a", "h:2", ""), 1.0)
    table.connected(PeerInfo("a", "h:3", ""), 2.0)
    assert not table.learn(PeerInfo("a", "evil:9", ""), 3.0)
    assert table.get("a").info.gossip_addr == "h:3"
    table.learn(PeerInfo("b", "h:4", ""), 4.0)
    table.left("b")
    assert [i.peer_id for i in table.dial_candidates(set())] == ["a"]
    for k, name in enumerate("cdefgh"):  # a flood of fresh hearsay (an eclipse attempt)
        table.learn(PeerInfo(name, f"h:{k + 10}", ""), 10.0 + k)
    assert len(table) == 3 and "a" in table  # bounded: the oldest hearsay goes, never a first-hand entry for it
    assert [i.peer_id for i in table.dial_candidates(set())] == ["a", "h", "g"]  # first-hand before hearsay
    table.connected(PeerInfo("x", "h:30", ""), 20.0)
    table.connected(PeerInfo("y", "h:31", ""), 21.0)
    table.connected(PeerInfo("z", "h:32", ""), 22.0)
    assert {i.peer_id for i in table.dial_candidates(set())} == {"x", "y", "z"}  # first-hand only: the oldest left


# ---- handshake ----------------------------------------------------------------------------------


def _pair(run_a: str = RUN, run_b: str = RUN, expected: str | None = None) -> tuple[Handshake, Handshake]:
    a = Handshake(Identity.from_seed(b"\x0a" * 32), Validator(run_a), gossip_addr="h:1", http_addr="h:2",
                  challenge=b"\x01" * 32, expected_peer=expected)
    b = Handshake(Identity.from_seed(b"\x0b" * 32), Validator(run_b), gossip_addr="h:3", http_addr="h:4",
                  challenge=b"\x02" * 32)
    return a, b


def test_handshake_completes_and_authenticates_both_sides() -> None:
    a, b = _pair()
    to_b = a.receive_frame(wire.encode(b.hello), 0.0)
    to_a = b.receive_frame(wire.encode(a.hello), 0.0)
    assert a.state is b.state is State.AWAIT_PROOF
    assert a.receive_frame(wire.encode(to_a[0]), 0.0) == [] and b.receive_frame(wire.encode(to_b[0]), 0.0) == []
    assert a.state is b.state is State.DONE
    assert a.peer_info.peer_id == b.identity.peer_id and b.peer_info.http_addr == "h:2"
    with pytest.raises(LocalProtocolError):
        a.receive_frame(wire.encode(b.hello), 0.0)


def test_handshake_refuses_wrong_run_bad_proof_wrong_peer_and_out_of_order() -> None:
    a, b = _pair(run_b="other-run")
    with pytest.raises(RemoteProtocolError) as err:
        a.receive_frame(wire.encode(b.hello), 0.0)
    assert err.value.reason is Reason.WRONG_RUN_ID and a.state is State.FAILED

    a, b = _pair()
    a.receive_frame(wire.encode(b.hello), 0.0)
    forged = HelloProof(RUN, b.identity.peer_id, bytes(64))
    with pytest.raises(RemoteProtocolError) as err:
        a.receive_frame(wire.encode(forged), 0.0)
    assert err.value.reason is Reason.BAD_SIGNATURE

    a, b = _pair(expected=Identity.from_seed(b"\x0c" * 32).peer_id)
    with pytest.raises(RemoteProtocolError) as err:
        a.receive_frame(wire.encode(b.hello), 0.0)
    assert err.value.reason is Reason.BAD_IDENTITY

    a, b = _pair()
    proof = b.receive_frame(wire.encode(a.hello), 0.0)[0]
    with pytest.raises(RemoteProtocolError) as err:
        a.receive_frame(wire.encode(proof), 0.0)  # proof before hello
    assert err.value.reason is Reason.BAD_HANDSHAKE

    a, _ = _pair()
    with pytest.raises(RemoteProtocolError) as err:
        a.receive_frame(b"\xc1garbage", 0.0)
    assert err.value.reason is Reason.MALFORMED


def test_a_closed_runs_accepting_node_speaks_second_and_only_to_a_member() -> None:
    founder, member, outsider = (Identity.from_seed(bytes([k]) * 32) for k in (1, 2, 3))
    founder_rule = Admission(RUN, founder.peer_id, peer_id=founder.peer_id)

    def accepting() -> Handshake:
        return Handshake(founder, Validator(RUN), gossip_addr="h:1", http_addr="h:2", challenge=b"\x01" * 32,
                         admission=founder_rule, speaks_first=False, run_config="a=1")

    def dialling(who: Identity, credential: Membership | None, run_config: str = "a=1") -> Handshake:
        rule = Admission(RUN, founder.peer_id, credential, peer_id=who.peer_id) if credential else None
        return Handshake(who, Validator(RUN), gossip_addr="h:3", http_addr="h:4", challenge=b"\x02" * 32,
                         admission=rule, run_config=run_config)

    server = accepting()
    assert server.first_messages() == []  # nothing before the dialer's hello
    with pytest.raises(RemoteProtocolError) as err:
        server.receive_frame(wire.encode(dialling(outsider, None).hello), 0.0)
    assert err.value.reason is Reason.NOT_ADMITTED and not server.hello_owed  # the outsider gets no byte
    membership = grant(founder, RUN, member.peer_id)
    server, client = accepting(), dialling(member, membership)
    out = server.receive_frame(wire.encode(client.hello), 0.0)
    assert [type(m).__name__ for m in out] == ["Hello", "HelloProof"] and out[0] == server.hello
    proof = client.receive_frame(wire.encode(out[0]), 0.0)
    client.receive_frame(wire.encode(out[1]), 0.0)
    server.receive_frame(wire.encode(proof[0]), 0.0)
    assert server.state is client.state is State.DONE
    server = accepting()  # a member with other settings is refused, but is owed the run's hello first
    with pytest.raises(RemoteProtocolError) as err:
        server.receive_frame(wire.encode(dialling(member, membership, "a=2").hello), 0.0)
    assert err.value.reason is Reason.CONFIG_MISMATCH and server.hello_owed


def test_handshake_refuses_a_reflected_hello() -> None:
    a, _ = _pair()
    with pytest.raises(RemoteProtocolError) as err:
        a.receive_frame(wire.encode(a.hello), 0.0)
    assert err.value.reason is Reason.BAD_HANDSHAKE


def test_gossip_config_defaults_are_consistent() -> None:
    cfg = GossipConfig(run_id=RUN)
    assert cfg.d_lo <= cfg.d <= cfg.d_hi and cfg.gossip_windows <= cfg.mcache_windows


# ---- pending blobs ------------------------------------------------------------------------------


def test_pending_blobs_fetch_one_holder_at_a_time_and_skip_bad_ones() -> None:
    from protocol.gossip import Fetch, PendingBlobs

    message = _goodbye(Identity.from_seed(b"\x02" * 32), 1)  # any signed message will do
    pending = PendingBlobs()
    pending.add(message, "b1", 10, now=0.0)
    connected = {"p", "q", "r"}
    assert pending.holder("b1", "p", connected) == [Fetch("p", "b1", 10)]
    assert pending.holder("b1", "q", connected) == []  # one in flight
    assert pending.failed("b1", "q", bad=False, connected=connected) == []  # late report, not current
    assert pending.failed("b1", "p", bad=True, connected=connected) == [Fetch("q", "b1", 10)]
    assert pending.holder("b1", "p", connected) == []  # a bad holder is never taken back
    assert pending.failed("b1", "q", bad=False, connected=connected) == []  # nobody left for now
    assert pending.retry(now=1.0, ttl=100.0, connected=connected) == [Fetch("q", "b1", 10)]
    pending.drop_peer("q")  # its fetch (over its own connection) is still in flight: nobody else is asked
    assert pending.get("b1").fetching == "q" and pending.get("b1").holders == []
    assert pending.holder_of_message(message.message_id, "r", connected) == []
    assert pending.failed("b1", "q", bad=False, connected=connected) == [Fetch("r", "b1", 10)]
    assert pending.done("b1", set())[0].blob == "b1" and "b1" not in pending
    pending.add(message, "b2", 5, now=0.0)
    assert pending.retry(now=200.0, ttl=100.0, connected=connected) == [] and len(pending) == 0


def test_pending_blobs_take_at_most_per_holder_fetches_from_one_peer_and_start_the_waiting_ones_later() -> None:
    from protocol.gossip import Fetch, PendingBlobs

    message = _goodbye(Identity.from_seed(b"\x02" * 32), 1)
    pending = PendingBlobs(per_holder=2)
    connected = {"slow", "fast"}
    for blob in ("b1", "b2", "b3"):
        pending.add(message, blob, 10, now=0.0)
    assert pending.holder("b1", "slow", connected) == [Fetch("slow", "b1", 10)]
    assert pending.holder("b2", "slow", connected) == [Fetch("slow", "b2", 10)]
    assert pending.holder("b3", "slow", connected) == []  # "slow" is busy with two: b3 waits
    assert pending.holder("b3", "fast", connected) == [Fetch("fast", "b3", 10)]  # another holder is not
    pending.add(message, "b4", 10, now=0.0)
    assert pending.holder("b4", "slow", connected) == []
    # b1's fetch from "slow" fails as too slow: "slow" is never asked for b1 again, b4 takes its room
    assert pending.failed("b1", "slow", bad=True, connected=connected) == [Fetch("slow", "b4", 10)]
    assert pending.holder("b1", "fast", connected) == [Fetch("fast", "b1", 10)]
    pending.add(message, "b5", 10, now=0.0)
    assert pending.holder("b5", "slow", connected) == []
    entry, started = pending.done("b2", connected)
    assert entry.blob == "b2" and started == [Fetch("slow", "b5", 10)]
    pending.drop_peer("slow")  # its running fetches stay in flight until they report; nobody else holds b4, b5
    assert pending.failed("b4", "slow", bad=False, connected=connected) == []
    assert pending.get("b4").fetching is None and pending.get("b5").fetching == "slow"


def test_a_fetch_from_a_peer_that_disconnects_mid_download_is_the_only_one_until_it_ends() -> None:
    """The gossip connection to the holder being fetched from drops (silence, congestion) while its blob
    still comes over HTTP: another holder is not asked meanwhile (the blob would come twice), and the
    download that finishes ends the wait; one that fails hands over to the next holder."""
    from protocol.gossip import Fetch, PendingBlobs

    message = _goodbye(Identity.from_seed(b"\x02" * 32), 1)
    pending = PendingBlobs()
    for blob in ("b1", "b2"):
        pending.add(message, blob, 10, now=0.0)
        assert pending.holder(blob, "p", {"p", "q"}) == [Fetch("p", blob, 10)]
        assert pending.holder(blob, "q", {"p", "q"}) == []
    pending.drop_peer("p")
    assert pending.retry(now=1.0, ttl=100.0, connected={"q"}) == []  # still in flight from "p"
    entry, started = pending.done("b1", {"q"})
    assert entry.blob == "b1" and started == []  # it came, once
    assert pending.failed("b2", "p", bad=False, connected={"q"}) == [Fetch("q", "b2", 10)]


def test_pending_blobs_try_a_holder_that_was_too_slow_after_every_other_one_until_its_mark_expires() -> None:
    from protocol.gossip import Fetch, PendingBlobs

    message = _goodbye(Identity.from_seed(b"\x02" * 32), 1)
    pending = PendingBlobs(per_holder=2)
    connected = {"tarpit", "honest"}
    pending.add(message, "b1", 10, now=0.0)
    assert pending.holder("b1", "tarpit", connected) == [Fetch("tarpit", "b1", 10)]
    assert pending.failed("b1", "tarpit", bad=True, connected=connected, slow_until=100.0) == []
    for blob in ("b2", "b3"):  # heard from the tarpit first: the honest holder is still asked first
        pending.add(message, blob, 10, now=0.0)
        pending.holder(blob, "tarpit", connected)
    assert pending.get("b2").fetching == "tarpit" and pending.get("b3").fetching is None  # one at a time
    assert pending.holder("b3", "honest", connected) == [Fetch("honest", "b3", 10)]
    pending.add(message, "b4", 10, now=0.0)
    pending.holder("b4", "honest", connected)
    assert pending.holder("b4", "tarpit", connected) == []
    pending.retry(now=200.0, ttl=1000.0, connected=connected)  # the mark expired: two in flight again
    pending.add(message, "b5", 10, now=200.0)
    assert pending.holder("b5", "tarpit", connected) == [Fetch("tarpit", "b5", 10)]
