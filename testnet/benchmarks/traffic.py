"""Bytes per node and round, reduced slots against all-to-all, at N nodes (issue 49).

Each N runs ``--rounds`` slots of ``testnet.reduced_net.ReducedNet`` among N in-process nodes: real signed
headers, commitments, seals, partials and reductions, real int4 payloads cut into shards and checked against
their commitments, real screens and reductions, replicas stepped with the reduced shards. The model has
``--pieces`` × N pieces of 65,536 values (so every node reduces about one shard: a real model has many more
pieces than nodes), and its updates share a direction plus noise. Printed per N: the mean and the largest
bytes a node receives and sends per round ÷ one update's bytes, for reduced slots and for all-to-all over
the same updates, what the bytes were, and whether the replicas agree bit for bit.

``--dead K``: in the last round the first K aggregators are down (their successors reduce); ``--liar``: in
the last round one aggregator publishes its shard negated (its checker catches it with probability 1 − (1 − q)^pieces
per shard; every node then judges the fraud proof from the shard's raw pieces and replaces it); ``--accuser``:
in the last round one checker accuses an honest aggregator (every node judges, and the accuser is excluded).

Run: ``python -m testnet.benchmarks.traffic --nodes 8 16 64 --json traffic.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np

from protocol.compression import encode_tensors
from protocol.ledger import LedgerConfig
from protocol.ledger.chunks import CHUNK
from protocol.reduced import reducers
from testnet.reduced_net import ReducedNet, per_update


def model_shapes(pieces: int) -> dict[str, tuple[int, ...]]:
    """A model of ``pieces`` pieces: an embedding of half of them and two layers of a quarter each."""
    embed, layer = max(1, pieces // 2), max(1, pieces // 4)
    width = 256
    return {"embed": (embed * CHUNK // width, width), "layer.0": (layer * CHUNK // width, width),
            "layer.1": ((pieces - embed - layer) * CHUNK // width or 1, width)}


def run(n: int, *, rounds: int, pieces: int, q: float, replicas: int, dead: int, liar: bool, seed: int,
        accuser: bool = False) -> dict:
    shapes = model_shapes(pieces * n)
    rng = np.random.default_rng(seed)
    params = {k: np.zeros(v, np.float32) for k, v in shapes.items()}
    net = ReducedNet(n, shapes, params, LedgerConfig(window=4), q=q, replicas=replicas, seed=seed)
    size = max(int(np.prod(v)) for v in shapes.values())
    pool = rng.standard_normal(size + 4096).astype(np.float32)
    started = time.perf_counter()
    reports = []
    for r in range(rounds):
        last = r == rounds - 1
        common = {k: rng.standard_normal(v).astype(np.float32) * 0.01 for k, v in shapes.items()}

        def updates():
            for i, peer in enumerate(net.peers):
                shift = int(rng.integers(0, 4096))
                deltas = {k: c + 0.005 * pool[shift:shift + c.size].reshape(c.shape) for k, c in common.items()}
                yield peer, encode_tensors(deltas, "int4"), net.slot, 1000, 50

        eligible = sorted(net.eligible - net.excluded)
        down = [reducers(net.slot + 1, net.plan.shards - 1 - k, eligible)[0] for k in range(dead)] if last else []
        lying = {reducers(net.slot + 1, 0, eligible)[0]: -1.0} if liar and last else None
        accusing = [reducers(net.slot + 1, 1, eligible)[1]] if accuser and last else []  # shard 1's checker
        reports.append(net.close(updates(), dead=down, liars=lying, false_checkers=accusing))
    seconds = time.perf_counter() - started
    u = reports[0].update_bytes
    totals = {key: Counter() for key in ("received", "sent", "all_to_all_in", "all_to_all_out")}
    kinds = Counter()
    for rep in reports:
        for key, c in totals.items():
            c.update(getattr(rep, key))
        kinds.update(rep.by_kind)

    def ratio(key: str) -> dict:
        mean, most = per_update(totals[key], net.peers, u * rounds)
        return {"mean": round(mean, 3), "max": round(most, 3)}

    return {"nodes": n, "rounds": rounds, "update_bytes": u, "params": sum(int(np.prod(v)) for v in shapes.values()),
            "shards": net.plan.shards, "reduced": {"in": ratio("received"), "out": ratio("sent")},
            "all_to_all": {"in": ratio("all_to_all_in"), "out": ratio("all_to_all_out")},
            "in_by_kind": {k: round(v / (u * rounds * n), 4) for k, v in sorted(kinds.items())},
            "sealed": [r.sealed for r in reports], "fall_backs": sum(r.fall_backs for r in reports),
            "caught": [c for r in reports for c in r.caught],
            "false_accusations": [c for r in reports for c in r.false_accusations], "replicas": len(net.replicas), "agree": net.agree(),
            "seconds": round(seconds, 1)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.benchmarks.traffic", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 64], help="N of each run (default 8 16 64)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--pieces", type=int, default=1, help="pieces of 65,536 values per node in the model (default 1)")
    p.add_argument("--q", type=float, default=0.5, help="a checker's chance to draw each piece (default 0.5)")
    p.add_argument("--replicas", type=int, default=4, help="nodes that keep a full replica (default 4)")
    p.add_argument("--dead", type=int, default=0, help="aggregators down in the last round")
    p.add_argument("--liar", action="store_true", help="one aggregator negates its shard in the last round")
    p.add_argument("--accuser", action="store_true",
                   help="one checker signs a fraud proof against an honest aggregator in the last round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="write the rows here")
    a = p.parse_args(argv)
    rows = []
    print("per node and round, ÷ one update's bytes: reduced slots (mean / largest) against all-to-all", flush=True)
    for n in a.nodes:
        row = run(n, rounds=a.rounds, pieces=a.pieces, q=a.q, replicas=a.replicas, dead=a.dead, liar=a.liar, seed=a.seed,
                  accuser=a.accuser)
        rows.append(row)
        red, a2a = row["reduced"], row["all_to_all"]
        print(f"N={n:4d}  in {red['in']['mean']:.2f} / {red['in']['max']:.2f}  out {red['out']['mean']:.2f} / "
              f"{red['out']['max']:.2f}   all-to-all in {a2a['in']['mean']:.2f} out {a2a['out']['max']:.2f}   "
              f"({row['params']:,} params, U {row['update_bytes']:,} B, {row['shards']} shards, "
              f"fall-backs {row['fall_backs']}, caught {len(row['caught'])}, "
              f"false accusations {len(row['false_accusations'])}, replicas agree {row['agree']}, "
              f"{row['seconds']:.0f} s)", flush=True)
        print("        in by kind ÷ U: " + ", ".join(f"{k} {v:.3f}" for k, v in row["in_by_kind"].items()), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if all(r["agree"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
