"""Tier (a): the node's pure parts — drain decisions, state choice, id-set hashes, settings, the CLI."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.cli import build_parser, settings_from_args
from node.island.config import ConfigError
from node.sync.drain import LIMIT_FACTOR, DrainTracker, PeerView, drain_state
from node.sync.join import choose
from node.outer.agreement import IdSetHash
from node.settings import NodeSettings
from protocol.messages import StateManifest

REPO = Path(__file__).resolve().parents[2]
A, B, C = "12D3KooWA", "12D3KooWB", "12D3KooWC"


# ---- drain -----------------------------------------------------------------------------------------
def test_drain_waits_for_training_peers_and_ends_when_all_agree() -> None:
    own = drain_state("ab" * 32)
    t = DrainTracker(started_at=0.0, quiet_s=10.0)
    d = t.update(1.0, own, [PeerView(A, "training", 3, 3), PeerView(B, own, 4, 5)])
    assert not d.done and d.waiting_for == (A,)
    d = t.update(2.0, own, [PeerView(A, drain_state("cd" * 32), 4, 5), PeerView(B, own, 4, 5)])
    assert not d.done and d.waiting_for == (A,), "a peer with another update set is still receiving"
    d = t.update(3.0, own, [PeerView(A, own, 5, 5), PeerView(B, own, 5, 5)])
    assert d.done and d.why == "agreed"


def test_drain_never_waits_for_gone_peers_nor_for_goodbyes() -> None:
    t = DrainTracker(started_at=0.0, quiet_s=10.0)
    d = t.update(0.5, drain_state("00" * 32), [])
    assert d.done and d.why == "alone"


def test_drain_gives_up_after_quiet_seconds_without_progress_only() -> None:
    own = drain_state("11" * 32)
    t = DrainTracker(started_at=0.0, quiet_s=5.0)
    for now in (1.0, 3.0, 4.9):
        assert not t.update(now, own, [PeerView(A, "training", 1, 1)]).done
    assert not t.update(6.0, own, [PeerView(A, "training", 2, 2)]).done, "the peer made progress at 6"
    d = t.update(11.5, own, [PeerView(A, "training", 2, 2)])
    assert d.done and d.why == "quiet-timeout" and d.waiting_for == (A,)


def test_drain_ends_at_its_time_limit_next_to_a_peer_that_never_stops_training() -> None:
    own = drain_state("22" * 32)
    t = DrainTracker(started_at=0.0, quiet_s=5.0)
    assert t.limit_s == LIMIT_FACTOR * 5.0
    now, d = 0.0, None
    for rnd in range(1, 100):  # a peer without --max-rounds: a new round every 2 s, forever
        now = 2.0 * rnd
        d = t.update(now, own, [PeerView(A, "training", rnd, rnd)])
        if d.done:
            break
    assert d.done and d.why == "time-limit" and d.waiting_for == (A,)
    assert now <= t.limit_s + 2.0, "bounded whatever the peer does"


def test_drain_state_fits_a_heartbeat() -> None:
    assert len(drain_state("f" * 64)) <= 32


# ---- state choice ----------------------------------------------------------------------------------
def manifest(origin: str, slot: int, ledger: bytes, params: bytes = b"P" * 32) -> StateManifest:
    return StateManifest("run", origin, 1, slot, ledger, params, ())


def test_choose_prefers_the_freshest_state_two_peers_confirm() -> None:
    ms = [manifest(A, 9, b"x" * 32), manifest(B, 7, b"y" * 32), manifest(C, 7, b"y" * 32)]
    best = choose(ms)[0]
    assert best.manifest.slot == 7 and best.confirmed_by == (B, C) and best.confirmed
    assert [c.manifest.slot for c in choose(ms)] == [7, 9]


def test_choose_falls_back_to_the_freshest_unconfirmed_state() -> None:
    ms = [manifest(A, 5, b"x" * 32), manifest(B, 6, b"y" * 32), manifest(C, 6, b"z" * 32)]
    best = choose(ms)[0]
    assert not best.confirmed and best.manifest.slot == 6
    assert choose([]) == []


def test_choose_takes_a_state_a_bootstrap_peer_vouches_for_before_a_fresher_one_of_fresh_keys() -> None:
    # two fresh keys (B, C) confirm a forged state five slots fresher; the user's bootstrap peer A serves its own
    ms = [manifest(A, 9, b"x" * 32), manifest(B, 14, b"f" * 32), manifest(C, 14, b"f" * 32)]
    assert choose(ms)[0].confirmed_by == (B, C)  # without knowing who the user trusts: the confirmed fresher one
    ranked = choose(ms, bootstrap={A})
    assert ranked[0].confirmed_by == (A,) and ranked[1].confirmed_by == (B, C)  # the forged one only if A's fails


def test_choose_needs_equal_params_digests_too() -> None:
    ms = [manifest(A, 4, b"x" * 32, b"1" * 32), manifest(B, 4, b"x" * 32, b"2" * 32)]
    assert not choose(ms)[0].confirmed


# ---- id-set hash -----------------------------------------------------------------------------------
def test_id_set_hash_is_order_independent_and_set_sensitive() -> None:
    ids = [bytes([i]) * 32 for i in range(5)]
    hashes = {IdSetHash(p).hex() for p in itertools.permutations(ids)}
    assert len(hashes) == 1
    assert IdSetHash(ids[:4]).hex() != IdSetHash(ids).hex() != IdSetHash([]).hex()


# ---- settings and CLI ------------------------------------------------------------------------------
def test_cli_flags_of_the_contract_parse_into_settings(tmp_path: Path) -> None:
    args = build_parser().parse_args([
        "--listen", "127.0.0.1:0", "--http", "127.0.0.1:8080", "--peers", "127.0.0.1:7000,127.0.0.1:7001",
        "--run-id", "r1", "--key", str(tmp_path / "k"), "--data", "a.txt,b.txt", "--model", "tiny",
        "--inner-steps", "7", "--adaptive-steps", "--max-rounds", "3", "--checkpoint-dir", str(tmp_path / "c"),
        "--compression", "int8", "--eval-every", "2", "--seed", "4", "--log-level", "DEBUG", "--slowdown", "2",
        "--misbehave", "garbage", "--allow-chaos", "--set", "batch_size=8", "--outer-lr", "0.5",
        "--outer-momentum", "0.8"])
    s = settings_from_args(args)
    assert s.peers == ("127.0.0.1:7000", "127.0.0.1:7001") and s.data == ("a.txt", "b.txt")
    assert (s.inner_steps, s.max_rounds, s.compression, s.eval_every, s.seed) == (7, 3, "int8", 2, 4)
    assert s.adaptive_steps and s.allow_chaos and s.misbehave == "garbage" and s.slowdown == 2.0
    assert (s.outer_lr, s.outer_momentum) == (0.5, 0.8)
    cfg = s.ml_config("peer")
    assert cfg.data.batch_size == 8 and cfg.inner.init_seed == 4 and cfg.data.shard_key == "peer"
    assert cfg.data.sources == ("a.txt", "b.txt")


def test_defaults_are_int4_adaptive_steps_and_no_round_limit(tmp_path: Path) -> None:
    s = settings_from_args(build_parser().parse_args(["--run-id", "r", "--key", str(tmp_path / "k")]))
    assert s.compression == "int4" and s.max_rounds is None and s.checkpoint_dir is None and s.adaptive_steps
    fixed = build_parser().parse_args(["--run-id", "r", "--key", str(tmp_path / "k"), "--no-adaptive-steps"])
    assert not settings_from_args(fixed).adaptive_steps


@pytest.mark.parametrize("change", [{"run_id": ""}, {"inner_steps": 0}, {"listen": "nohost"}, {"slowdown": 0.5},
                                    {"peers": ("127.0.0.1:0",)}, {"compression": "zip"}, {"misbehave": "x"},
                                    {"outer_lr": 0.0}, {"outer_momentum": 1.0}])
def test_bad_settings_are_config_errors(change: dict, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        NodeSettings(**{"run_id": "r", "key_path": tmp_path / "k", **change})


def test_help_explains_every_flag_with_defaults() -> None:
    out = subprocess.run([sys.executable, "-m", "node.cli", "--help"], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert out.returncode == 0
    for flag in ("--listen", "--http", "--peers", "--run-id", "--key", "--data", "--model", "--inner-steps",
                 "--adaptive-steps", "--max-rounds", "--checkpoint-dir", "--compression", "--eval-every", "--seed",
                 "--log-level", "--slowdown", "--misbehave", "--allow-chaos"):
        assert flag in out.stdout
    text = " ".join(out.stdout.split())
    assert "(default int4" in text and "(default 50)" in text and "STOPPED <slot>" in text


def test_a_bad_key_file_exits_2(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"not a key")
    key.chmod(0o600)
    out = subprocess.run([sys.executable, "-m", "node.cli", "--run-id", "r", "--key", str(key)], capture_output=True,
                         text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.returncode == 2 and "key" in out.stderr and out.stdout == ""


def test_drain_reports_a_lasting_divergence_for_repair_not_a_fresh_one() -> None:
    mine, theirs, newer = drain_state("01" * 32), drain_state("02" * 32), drain_state("03" * 32)
    t = DrainTracker(started_at=0.0, quiet_s=100.0)
    t.update(0.0, mine, [PeerView(A, theirs), PeerView(B, "training")])
    assert t.diverged(1.0, min_s=2.0) == []
    t.update(2.5, mine, [PeerView(A, theirs), PeerView(B, "training")])
    assert t.diverged(2.5, min_s=2.0) == [(A, theirs)], "differed for 2.5 s, nobody changed"
    t.update(3.0, newer, [PeerView(A, theirs), PeerView(B, "training")])  # we just received something
    assert t.diverged(3.0, min_s=2.0) == [], "our own change restarts the clock"
    t.update(4.0, newer, [PeerView(B, "training")])
    assert t.diverged(9.0, min_s=2.0) == [], "gone peers are not reported"
