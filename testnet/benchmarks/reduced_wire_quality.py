"""Held-out loss of reduced slots between real processes against all-to-all at equal tokens (issue 49).

N processes, each one learner and one ``p2p`` host (TLS, gossip, HTTP), train the node's inner loop on the
embedded text (``testnet.benchmarks.quality``'s learners: model, data shard ``worker-k``, int4 codec with
error feedback) on the synchronous schedule. Every round each trains H steps from its replica's θ, publishes
its update through ``node.reduced`` (a commitment gossiped, pieces, partials and reductions over HTTP, the slot
clock) and steps its ``ReducedReplica`` with the reduced shards. The baseline is the all-to-all ``sync`` run of
the same learners, seeds and rounds in this process (``Simulation("sync")``: every learner holds every update
in a real ``Ledger``). Printed: the learners' mean held-out bits per byte for both, their ratio, whether the
replicas agree bit for bit, and each node's bytes in per round ÷ one update.

Run: ``python -m testnet.benchmarks.reduced_wire_quality --nodes 8 --rounds 12 --json FILE``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import trio

from testnet.benchmarks.reduced_wire import _traffic, barrier, identities, open_host, spawn, worker
from testnet.reduced_net import RUN


def _learner(a: argparse.Namespace, k: int):
    """Learner ``k`` as ``Simulation`` builds it: the model's task, its loop on shard ``worker-k``, error feedback,
    and the ledger configuration of ``Simulation``'s defaults."""
    from node.island.bytelm import byte_lm_task
    from node.island.config import preset
    from node.island.train import InnerLoop
    from protocol.compression import ErrorFeedback
    from protocol.ledger import LedgerConfig

    cfg = preset(a.model)
    task = byte_lm_task(cfg, 16)
    source, heldout = task.open(f"worker-{k}")
    loop = InnerLoop(task.model, source, seed=cfg.inner.init_seed, tokens_per_batch=task.tokens_per_batch)
    config = LedgerConfig(window=8, lr=0.7, momentum=0.9, aggregation="radial-directional",
                          embeddings=task.model.embeddings)
    return loop, ErrorFeedback("int4"), heldout, config, task.tokens_per_batch


def _common(a: argparse.Namespace, workers: int) -> dict:
    from node.island.config import preset

    return dict(workers=workers, inner_steps=a.inner_steps, speeds=[1.0] * workers, latency=2, codec="int4",
                seed=0, config=preset(a.model))


async def _node(a: argparse.Namespace) -> dict:
    from node.reduced.driver import SlotClock, SlotDriver
    from protocol.reduced import ShardPlan
    from protocol.reduced.participant import ReducedNode

    folder, k, n = Path(a.dir), a.worker, a.nodes
    loop, feedback, heldout, ledger_config, tokens_per_batch = _learner(a, k)
    params = loop.params
    shapes = {name: np.shape(v) for name, v in params.items()}
    ids = identities(n)
    out: dict = {"node": k, "rounds": []}
    async with trio.open_nursery() as nursery:
        host = await open_host(nursery, folder, k, n, reduced=True)
        node = ReducedNode(ids[k], [i.peer_id for i in ids], ShardPlan(shapes, n), ledger_config, run_id=RUN,
                           q=a.q, params={name: np.asarray(v, np.float32) for name, v in params.items()})
        driver = SlotDriver(host, node, SlotClock(patience=a.patience, xi=a.xi))
        await nursery.start(driver.run)
        for _ in range(a.rounds):
            theta = node.replica.params()
            loop.set_params(theta)
            started = trio.current_time()
            await trio.to_thread.run_sync(loop.run, a.inner_steps)  # the host keeps serving meanwhile
            trained = trio.current_time() - started
            local = loop.params
            delta = {name: np.asarray(theta[name] - local[name], np.float32) for name in local}
            payload, _ = await trio.to_thread.run_sync(feedback.compress, delta)
            out["update_bytes"] = len(payload)
            await driver.publish(payload, node.slot, a.inner_steps * tokens_per_batch, a.inner_steps)
            s = await driver.close(timeout=a.timeout)
            out["rounds"].append({"train_s": round(trained, 2), "slot_s": round(trio.current_time() - started - trained, 2),
                                  "sealed": len(s.seal.ids), "passed": len(s.passed)})
        await barrier(folder, "done", k, n)
        out.update(_traffic(host))
        out["digest"] = node.digest().hex()
        out["bpb"] = float(await trio.to_thread.run_sync(lambda: loop.evaluate(heldout, params=node.replica.params())))
        out["tokens"] = loop.step * tokens_per_batch
        nursery.cancel_scope.cancel()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.benchmarks.reduced_wire_quality",
                                description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=8, help="processes, one learner each (default 8)")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--inner-steps", type=int, default=50)
    p.add_argument("--model", default="tiny", help="model preset (default tiny)")
    p.add_argument("--q", type=float, default=0.5, help="a checker's chance to draw each piece (default 0.5)")
    p.add_argument("--patience", type=float, default=30.0, help="a sealer's wait for every update (s, default 30)")
    p.add_argument("--xi", type=float, default=5.0, help="the slot clock's step (s, default 5)")
    p.add_argument("--timeout", type=float, default=300.0, help="a slot's limit (s, default 300)")
    p.add_argument("--json", metavar="FILE", help="write the figures here")
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker is not None:
        return worker(a, _node)
    from testnet.benchmarks.quality import Simulation

    started = time.perf_counter()
    print(f"reduced: {a.nodes} processes, {a.rounds} rounds of {a.inner_steps} steps ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="reduced-quality-") as tmp:
        argv_ = ["--nodes", str(a.nodes), "--rounds", str(a.rounds), "--inner-steps", str(a.inner_steps), "--model",
                 a.model, "--q", str(a.q), "--patience", str(a.patience), "--xi", str(a.xi), "--timeout", str(a.timeout)]
        found = spawn("testnet.benchmarks.reduced_wire_quality", argv_, a.nodes, Path(tmp) / "reduced",
                      a.timeout * (a.rounds + 2))
    reduced_s = time.perf_counter() - started
    print(f"all-to-all: the same {a.nodes} learners in this process ...", flush=True)
    started = time.perf_counter()
    baseline = Simulation("sync", **_common(a, a.nodes)).run(a.rounds)
    u = found[0]["update_bytes"]
    bpb = float(np.mean([r["bpb"] for r in found]))
    row = {"nodes": a.nodes, "rounds": a.rounds, "inner_steps": a.inner_steps, "model": a.model,
           "reduced_bpb": bpb, "all_to_all_bpb": baseline["bpb"], "ratio": bpb / baseline["bpb"],
           "tokens": sum(r["tokens"] for r in found), "all_to_all_tokens": baseline["tokens"],
           "replicas_agree": len({r["digest"] for r in found}) == 1,
           "in_per_round": round(float(np.mean([r["received"] for r in found])) / (u * a.rounds), 3),
           "in_per_round_max": round(max(r["received"] for r in found) / (u * a.rounds), 3),
           "gossip_in_per_round": round(float(np.mean([r["gossip_received"] for r in found])) / (u * a.rounds), 3),
           "passed_over": sum(s["passed"] for r in found for s in r["rounds"]),
           "slot_s": round(float(np.mean([s["slot_s"] for r in found for s in r["rounds"]])), 2),
           "train_s": round(float(np.mean([s["train_s"] for r in found for s in r["rounds"]])), 2),
           "seconds": {"reduced": round(reduced_s), "all_to_all": round(time.perf_counter() - started)},
           "date": time.strftime("%Y-%m-%d")}
    print(f"held-out after {a.rounds} rounds: reduced {bpb:.4f} bits/byte at {row['tokens']:,} tokens, all-to-all "
          f"{baseline['bpb']:.4f} at {baseline['tokens']:,}: reduced ÷ all-to-all {row['ratio']:.4f}; replicas "
          f"agree {row['replicas_agree']}; bytes in per node and round {row['in_per_round']:.2f} U (largest "
          f"{row['in_per_round_max']:.2f}, gossip {row['gossip_in_per_round']:.2f} of it; U {u:,} B); a round trained {row['train_s']:.1f} s and closed its slot in "
          f"{row['slot_s']:.1f} s; shards passed over {row['passed_over']}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(row, indent=2))
    return 0 if row["replicas_agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
