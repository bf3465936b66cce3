"""`diloco-node --traffic reduced` against all-to-all, N real node processes on loopback (issue 49).

The same N nodes (keys, model, data shards, `--inner-steps H`, `--max-rounds R`, TLS) run twice: all-to-all
(every node fetches every update) and reduced (`--traffic reduced --roster FILE`: slots sealed, each shard
reduced by one aggregator and checked). Printed for each, from the nodes' last `/status`
(`node.status.LAST_STATUS`): bytes received and sent per node per round ÷ one update's bytes (U, the int4
payload of the model), split into gossip and HTTP; the final held-out loss (each node's evaluation of its
final model), the tokens trained, the wall time from the first start to the last `STOPPED`; and whether the
nodes' `STOPPED` lines agree. Then reduced ÷ all-to-all for bytes in, held-out and wall time.

    python -m testnet.benchmarks.reduced_nodes --nodes 8 --rounds 8 --inner-steps 20 --json FILE
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from node.status import LAST_STATUS
from protocol.compression import payload_size
from protocol.identity import Identity
from testnet.benchmarks.task_nodes import _line, _start
from testnet.benchmarks.task_quality import REPO
from testnet.procs import free_port

MODES = ("all-to-all", "reduced")
CLI = REPO / "node" / "cli.py"


def _run(mode: str, work: Path, a: argparse.Namespace) -> dict:
    work.mkdir(parents=True)
    names = [f"n{k}" for k in range(a.nodes)]
    for k, name in enumerate(names):  # the same keys in both modes (so the same data shards)
        shutil.copy(a.keys / f"{name}.key", work / f"{name}.key")
    args = ["--model", a.model, "--inner-steps", str(a.inner_steps), "--max-rounds", str(a.rounds),
            "--eval-every", str(a.rounds), "--eval-batches", "4", "--eval-budget", "1", *a.node_args]
    if mode == "reduced":
        args += ["--traffic", "reduced", "--roster", str(a.keys / "roster.txt"), "--slot-patience",
                 str(a.patience), "--slot-step", str(a.xi)]
    # every node started at once on a port chosen here, each with a peer (node 0 with node 1): a node with
    # --peers waits for one before it trains, so none closes slots alone while the others start up
    ports = [free_port() for _ in names]
    started = time.perf_counter()
    procs = [_start(CLI, work, n, [*args, "--listen", f"127.0.0.1:{ports[k]}",
                                   "--peers", f"127.0.0.1:{ports[1 if k == 0 else 0]}"]) for k, n in enumerate(names)]
    lines = [_line(p, "STOPPED ", log, a.timeout) for p, log in procs]
    for p, _ in procs:
        p.wait(timeout=60)
    wall = time.perf_counter() - started
    last = [json.loads((work / n / LAST_STATUS).read_text()) for n in names]
    rounds = [max(1, s["round"]) for s in last]

    def per_round(plane: str, way: str) -> list[float]:
        return [s["bytes_by_plane"][plane][way] / (a.update * r) for s, r in zip(last, rounds)]

    gossip_in, http_in = per_round("gossip", "received"), per_round("http", "received")
    total_in = [g + h for g, h in zip(gossip_in, http_in)]
    total_out = [g + h for g, h in zip(per_round("gossip", "sent"), per_round("http", "sent"))]
    return {"mode": mode, "agree": len(set(lines)) == 1, "stopped": lines[0], "wall_s": round(wall, 1),
            "in_per_round": round(float(np.mean(total_in)), 3), "in_per_round_max": round(max(total_in), 3),
            "out_per_round": round(float(np.mean(total_out)), 3), "out_per_round_max": round(max(total_out), 3),
            "gossip_in_per_round": round(float(np.mean(gossip_in)), 3),
            "http_in_per_round": round(float(np.mean(http_in)), 3),
            "heldout": float(np.mean([s["eval_loss"] for s in last])), "tokens": sum(s["tokens"] for s in last),
            "rounds": rounds, "slot": last[0]["slot"]}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.benchmarks.reduced_nodes", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--inner-steps", type=int, default=20)
    p.add_argument("--model", default="tiny")
    p.add_argument("--patience", type=float, default=30.0, help="--slot-patience of the reduced nodes (s)")
    p.add_argument("--xi", type=float, default=3.0, help="--slot-step of the reduced nodes (s)")
    p.add_argument("--timeout", type=float, default=1800.0, help="a node's limit to print STOPPED (s)")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("node_args", nargs="*", help="after --: passed to every node")
    a = p.parse_args(argv)
    from node.island.bytelm import byte_lm_task
    from node.island.config import preset

    a.update = payload_size(byte_lm_task(preset(a.model), 1).model.shapes, "int4")
    with tempfile.TemporaryDirectory(prefix="reduced-nodes-") as tmp:
        a.keys = Path(tmp) / "keys"
        a.keys.mkdir()
        ids = [Identity.load_or_create(a.keys / f"n{k}.key").peer_id for k in range(a.nodes)]
        (a.keys / "roster.txt").write_text("".join(f"{i}\n" for i in ids))
        rows = {}
        for mode in MODES:
            print(f"{mode}: {a.nodes} diloco-node processes, {a.rounds} rounds of {a.inner_steps} steps ...", flush=True)
            rows[mode] = r = _run(mode, Path(tmp) / mode, a)
            print(f"  bytes per node and round ÷ U ({a.update:,} B): in {r['in_per_round']:.2f} (largest "
                  f"{r['in_per_round_max']:.2f}; gossip {r['gossip_in_per_round']:.2f}, HTTP {r['http_in_per_round']:.2f}),"
                  f" out {r['out_per_round']:.2f} (largest {r['out_per_round_max']:.2f}); held-out {r['heldout']:.4f} at "
                  f"{r['tokens']:,} tokens; {r['wall_s']:.0f} s; nodes agree {r['agree']}", flush=True)
    red, full = rows["reduced"], rows["all-to-all"]
    ratios = {"bytes_in": round(red["in_per_round"] / full["in_per_round"], 3),
              "heldout": round(red["heldout"] / full["heldout"], 4), "wall": round(red["wall_s"] / full["wall_s"], 3)}
    print(f"reduced ÷ all-to-all: bytes in {ratios['bytes_in']:.3f}, held-out {ratios['heldout']:.4f}, wall time "
          f"{ratios['wall']:.3f}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"nodes": a.nodes, "rounds": a.rounds, "inner_steps": a.inner_steps,
                                            "model": a.model, "update_bytes": a.update, "modes": rows,
                                            "ratios": ratios, "date": time.strftime("%Y-%m-%d")}, indent=2))
    return 0 if all(r["agree"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
