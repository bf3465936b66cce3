"""Tier (b): several node runtimes in one trio process, on loopback, with the real ledger, inner loop and
p2p host. Two honest nodes, one that also publishes invalid updates (`--misbehave bad-updates`) and one
that also sends malformed frames (`--misbehave garbage`): the bad traffic is refused and counted under
named reasons, nobody crashes, and all four stop with equal digests. `/status` and `/metrics` are read
over HTTP while they train. A fifth node joins mid-run and takes the run's place in the learning-rate
schedule (not step 0), then stops on request. The figures an experiment tracker gets (`--metrics-file`, and
the library's `on_metrics` callback) come once per round and once at the end, the final model evaluated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import httpx
import trio

from node.island.data import Dataset
from node.runtime import NodeRuntime
from node.settings import NodeSettings
from node.island.train import InnerLoop
from protocol.ledger import Ledger, LedgerSnapshot
from waiting import wait_for

SMALL = ("seq_len=32", "d_model=32", "n_heads=2", "d_ff=64", "batch_size=8", "lr=1e-2", "warmup_steps=5")
END = 10  # the run's last slot: room for the late nodes' rounds (their bad updates) before it
CONTRACT_FIELDS = {
    "peer_id", "state", "slot", "round", "inner_steps", "tokens", "loss", "eval_loss", "eval_history", "peers",
    "bytes_sent", "bytes_received", "updates_applied", "updates_rejected", "ledger_digest", "params_digest",
    "steps_per_second", "contributed_step_seconds", "started_at", "first_update_at",
}


def settings(tmp: Path, name: str, peers: tuple[str, ...] = (), **extra) -> NodeSettings:
    # --slowdown 10: rounds of about half a second, so that the late nodes train a round before the run ends
    return NodeSettings(run_id="inproc", key_path=tmp / name / "key", checkpoint_dir=tmp / name / "ckpt",
                        peers=peers, overrides=SMALL, inner_steps=5, max_rounds=END, eval_every=2, eval_batches=1,
                        slowdown=10.0, heartbeat_s=0.2, drain_timeout_s=30.0, **extra)


def compile_once(settings: NodeSettings) -> None:
    """Compile the model's functions once before four nodes start at the same time (they share this
    process's jit caches; four threads compiling the same functions at once is slow)."""
    cfg = settings.ml_config("warm-up")
    dataset = Dataset(cfg.data, seq_len=cfg.model.seq_len, vocab_size=cfg.model.vocab_size)
    loop = InnerLoop.byte_lm(cfg, dataset.batcher())
    loop.run(1)
    loop.evaluate(dataset.heldout_batches(settings.eval_batches))


@pytest.mark.slow
async def test_honest_and_misbehaving_nodes_in_one_process_agree(tmp_path: Path, jax_persistent_cache) -> None:
    await trio.to_thread.run_sync(compile_once, settings(tmp_path, "warm-up"))
    with trio.fail_after(150):
        async with trio.open_nursery() as nursery:
            a = NodeRuntime(settings(tmp_path, "a", metrics_file=tmp_path / "a-metrics.jsonl"))
            await nursery.start(a.run)
            peers = (a.host.gossip_addr,)
            records: list[dict] = []
            others = [NodeRuntime(settings(tmp_path, "b", peers), on_metrics=records.append),
                      NodeRuntime(settings(tmp_path, "c", peers, misbehave="bad-updates")),
                      NodeRuntime(settings(tmp_path, "d", peers, misbehave="garbage"))]
            for node in others:
                await nursery.start(node.run)
            await wait_for(lambda: a.stats.round >= 2 and len(a.host.connected_peers()) == 3, 120, "a at round 2")
            async with httpx.AsyncClient(verify=False) as client:
                status = (await client.get(f"{a.host.http_url}/status")).json()
                metrics = (await client.get(f"{a.host.http_url}/metrics")).text
            assert CONTRACT_FIELDS <= set(status)
            # the honest peer is listed; the misbehaving ones may have been disconnected (banned) since the wait
            assert status["state"] == "training" and status["peer_id"] == a.peer_id and others[0].peer_id in status["peers"]
            assert len(status["ledger_digest"]) == 64 and len(status["params_digest"]) == 64
            assert status["inner_steps"] >= 10 and status["tokens"] == status["inner_steps"] * 8 * 32
            assert status["run_id"] == "inproc" and status["inner_lr"] == 1e-2
            assert status["end_slot"] == END and status["rounds_left"] == END - status["slot"]
            assert status["model"].startswith("tiny, ") and status["model"].endswith(" parameters")
            assert "diloco_node_slot " in metrics and "diloco_node_inner_steps_total " in metrics
            assert 'diloco_node_info{model="' in metrics and f'peer_id="{a.peer_id}"' in metrics
            assert 'diloco_node_state{state="training"} 1.0' in metrics
            assert 'diloco_node_state{state="syncing"} 0.0' in metrics
            assert "diloco_node_round_seconds_bucket" in metrics and "diloco_p2p_blob_fetch_seconds_count" in metrics
            # Every state a joiner may take is then past slot 0 (slots only move forward); once connected,
            # the joiner is waited for by the founders' drain until its goodbye.
            await wait_for(lambda: all(n.replica.slot >= 1 for n in (a, *others)), 60, "slot 1 everywhere")
            joiner = NodeRuntime(settings(tmp_path, "e", peers))
            await nursery.start(joiner.run)
            await wait_for(lambda: joiner.stats.state == "training", 60, "the joiner training")
            joiner.request_stop("joiner checked")
            await wait_for(lambda: joiner.result is not None, 30, "the joiner stopped")
    assert joiner.stats.sync is not None and joiner.stats.sync["slot"] >= 1, "the joiner synced a mid-run state"
    run_step, loop = joiner.stats.sync["slot"] * joiner.settings.inner_steps, joiner.loop
    assert loop.schedule_step == run_step + loop.step, "the schedule went on from slot x H, not from 0"
    assert loop.learning_rate() == float(joiner.task.model.schedule(loop.schedule_step))
    results = {node.peer_id: node.result for node in [a, *others]}
    assert all(r is not None and r.reason == "max-rounds reached" for r in results.values())
    # The bad-updates node is graylisted by the honest ones (no gossip to it, not waited for at the end);
    # the honest nodes, and the one that only sent garbage frames, agree.
    agreeing = [a, others[0], others[2]]
    assert len({node.result.line() for node in agreeing}) == 1, results
    for honest in (a, others[0]):
        refused = honest.stats.rejections
        from_host = {r.value: n for r, n in honest.host.counters.rejections.items()}
        assert refused.get("non_finite", 0) >= 1, "the NaN payload was refused after download"
        assert from_host.get("shape_mismatch", 0) >= 1, "the wrong-shape header was refused before download"
        assert from_host.get("malformed", 0) >= 1, "the garbage frames were refused"
    assert 1 <= a.stats.updates_published <= END and a.stats.contributed_step_seconds > 0
    assert all(r.slot == END for r in results.values()), "every node stopped at the run's last slot"
    lines = [json.loads(line) for line in (tmp_path / "a-metrics.jsonl").read_text().splitlines()]
    for node, got in ((a, lines), (others[0], records)):
        assert [r["event"] for r in got] == ["round"] * node.stats.round + ["stopped"], got
        assert [r["round"] for r in got[:-1]] == list(range(1, node.stats.round + 1))
        final = got[-1]
        assert final["slot"] == END and final["eval_slot"] == END and final["metric"] == "bits/byte"
        assert final["eval_loss"] == node.stats.eval_loss and final["tokens"] == node.stats.tokens
        assert final["bytes_received"] > 0 and final["tokens_per_second"] > 0
    for node in agreeing:  # own and gossiped updates are kept as their int4 payloads, which snapshots store
        snap, ledger_digest, params_digest = await node.replica.snapshot()
        assert snap.entries and all(e.payload is not None and e.payload.codec == "int4" for e in snap.entries)
        loaded = Ledger.from_snapshot(LedgerSnapshot.from_bytes(snap.to_bytes()), node.ledger_config, node.shapes)
        assert (loaded.ledger_digest(), loaded.params_digest()) == (ledger_digest, params_digest)
