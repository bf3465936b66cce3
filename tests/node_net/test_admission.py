"""Tier (c): a closed run (PROTOCOL.md §7b) on real processes. The founder (`--closed`) and a member it admitted
(`--membership`, written as `diloco-admit grant` writes it) train together; a key outside the run is refused:
one that copies the run's configuration but shows no membership is refused as `not_admitted` at the
handshake, and so is a node of an open run (before its configuration, which names no founder, is compared).
Both refusals are counted. A
node that would adopt the run's settings (`--peers` without `--no-adopt`) and has no membership stops at once,
saying the run is closed and what to do."""

from __future__ import annotations

import os
import ssl

import httpx
import trio
from node_net_helpers import RUN_ID

from p2p.errors import TransportError
from p2p.tls import Credentials
from p2p.tls import connect as tls_connect
from p2p.tlscert import pem
from protocol import wire
from protocol.admission import grant
from protocol.errors import RemoteProtocolError
from protocol.framing import FrameDecoder, frame
from protocol.gossip import Handshake
from protocol.identity import Identity
from protocol.validation import Validator

COMMON = ["--inner-steps", "5", "--heartbeat", "0.5", "--eval-every", "0", "--sync-timeout", "5", "--slowdown", "20"]
START_S = 180.0


async def _handshake_without_membership(address: str, run_config: str) -> str:
    """Dial `address` with a fresh key, the run's configuration and no membership; how the node answered."""
    identity = Identity.generate()
    stream = await tls_connect(address, Credentials(identity).gossip_client, 10.0)
    try:
        return await _converse(stream, identity, run_config)
    except (trio.BrokenResourceError, OSError, TransportError):
        return "closed"  # reset while we were still sending: the node refused us first


async def _converse(stream: trio.abc.Stream, identity: Identity, run_config: str) -> str:
    async with stream:
        handshake = Handshake(identity, Validator(RUN_ID), gossip_addr="", http_addr="",
                              challenge=os.urandom(32), run_config=run_config)
        await stream.send_all(frame(wire.encode(handshake.hello)))
        decoder = FrameDecoder()
        with trio.fail_after(30):
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return "closed"
                decoder.receive_data(data)
                while (body := decoder.next_frame()) is not None:
                    try:
                        for reply in handshake.receive_frame(body, trio.current_time()):
                            await stream.send_all(frame(wire.encode(reply)))
                    except RemoteProtocolError as exc:
                        return f"refused: {exc.reason.value}"


def _tls_client(pem_file) -> ssl.SSLContext:
    """Python's ssl as curl -k is: no check of the node's self-signed certificate; a client certificate if given."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if pem_file is not None:
        context.load_cert_chain(pem_file)
    return context


def test_a_closed_run_trains_with_its_members_and_refuses_every_other_key(cluster, tmp_path) -> None:
    keys = {}
    for name in ("founder", "member"):
        (tmp_path / name).mkdir()
        keys[name] = Identity.load_or_create(tmp_path / name / "key")  # the key the node will run with
    membership = tmp_path / "member.json"
    membership.write_text(grant(keys["founder"], RUN_ID, keys["member"].peer_id).to_json())

    founder = cluster("founder", *COMMON, "--closed")
    founder.wait_listening(START_S)
    member = cluster("member", *COMMON, "--membership", str(membership), "--peers", founder.gossip)
    outsider = cluster("outsider", *COMMON, "--no-adopt", "--peers", founder.gossip)  # an open run's node
    adopting = cluster("adopting", *COMMON, "--peers", founder.gossip)  # reads the run's settings first
    for node in (member, outsider):
        node.wait_listening(START_S)
    assert adopting.wait_exit(120.0) == 2
    # the founder speaks second, to members only: the joiner learns nothing of the run but to get a membership
    assert "answer only its members" in adopting.log_path.read_text() and "--membership" in adopting.log_path.read_text()
    member.wait_status(lambda s: s["round"] >= 3 and founder.peer_id in s["peers"], START_S, "the member training")
    founder.wait_log(f"fetched blob [0-9a-f]+ \\([0-9]+ bytes\\) from {member.peer_id}", 60.0)  # the member's update
    status = founder.status()
    assert status["admission"] == {"closed": True, "founder": keys["founder"].peer_id}
    assert member.status()["admission"] == status["admission"]
    assert member.status()["run_config_hash"] == status["run_config_hash"]
    # the HTTP plane (PROTOCOL.md section 7b): /health for anyone; the rest only for members' certificates
    stranger = tmp_path / "stranger.pem"
    stranger.write_bytes(pem(Identity.generate()))
    for client in (_tls_client(None), _tls_client(stranger)):  # anonymous (curl -k), a valid certificate
        assert httpx.get(f"https://{founder.http}/health", verify=client, timeout=10).text == "ok\n"
        for path in ("/status", "/state", "/metrics", f"/blobs/{'0' * 64}"):
            refused_read = httpx.get(f"https://{founder.http}{path}", verify=client, timeout=10)
            assert refused_read.status_code == 403 and "members only" in refused_read.text, path
    assert httpx.get(f"https://{founder.http}/state", verify=member.tls_client(), timeout=10).status_code == 200

    founder.wait_status(lambda s: s["updates_rejected"].get("not_admitted", 0) >= 1, 60.0, "the outsider refused")
    refused = founder.status()["updates_rejected"]["not_admitted"]
    assert trio.run(_handshake_without_membership, founder.gossip, status["run_config"]) == "closed"
    founder.wait_status(lambda s: s["updates_rejected"].get("not_admitted", 0) > refused, 30.0, "not_admitted counted")
    assert founder.status()["updates_rejected"].get("config_mismatch", 0) == 0
    assert outsider.peer_id not in founder.status()["peers"]
    assert outsider.peer_id not in member.status()["peers"]


def test_a_members_update_without_its_membership_is_refused_by_every_node_and_no_replica_forks(cluster, tmp_path) -> None:
    """Issue "Trust, second pass": a member whose hello showed its membership publishes, every round, an update
    without field 11 (`--misbehave unproven`). The founder, which saw that hello, and a second member, which
    need not have, both refuse every such update as `not_admitted` (whether an update counts reads only the
    update and the run, PROTOCOL.md §7b), and the two stop at the run's last slot with equal digests."""
    keys = {}
    for name in ("founder", "member", "other"):
        (tmp_path / name).mkdir()
        keys[name] = Identity.load_or_create(tmp_path / name / "key")
    grants = {}
    for name in ("member", "other"):
        grants[name] = tmp_path / f"{name}.json"
        grants[name].write_text(grant(keys["founder"], RUN_ID, keys[name].peer_id).to_json())
    run = [*COMMON, "--max-rounds", "24", "--drain-timeout", "20"]  # long enough for a member that compiles cold
    founder = cluster("founder", *run, "--closed")
    founder.wait_listening(START_S)
    member = cluster("member", *run, "--membership", str(grants["member"]), "--misbehave", "unproven",
                     "--peers", founder.gossip)
    other = cluster("other", *run, "--membership", str(grants["other"]), "--peers", founder.gossip)
    nodes = (founder, member, other)
    stopped = [node.wait_line("STOPPED", START_S) for node in nodes]
    for node in nodes:
        assert node.wait_exit(60.0) == 0, node.log_tail()
    assert stopped[0] == stopped[2], stopped  # the honest replicas: one slot, one ledger digest, one params digest
    assert stopped[1] != stopped[0]  # only the misbehaving member holds its unproven updates (its own ledger takes them)
    assert member.log_path.read_text().count("without its membership") >= 2
    for node in (founder, other):
        log = node.log_path.read_text()
        assert "not_admitted" in log and "shows no membership" in log, node.log_tail()
