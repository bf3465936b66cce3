"""Held-out loss of reduced slots against all-to-all at equal tokens (issue 49), in one process.

Both train the same learners (``testnet.benchmarks.quality.Simulation``: the node's inner loop, model, data
shards and int4 codec with error feedback) on the synchronous schedule: every round each of N learners trains
H steps from the current θ and publishes, and the slot holds all N updates. All-to-all is the ``sync`` mode
(one real ``Ledger`` per learner). Reduced slots run the same rounds through ``testnet.reduced_net.ReducedNet``:
sealed, sharded, screened and reduced from the committed pieces, each learner stepping its own
``ReducedReplica`` with the reduced shards in ``--reduction-codec`` (default int4: the update's own codec,
the one that keeps a node's bytes near 2.5 updates a round; its second quantization is the one thing that
differs from all-to-all, since the coefficients and scales are the same bits).

With an attack the run is compared with the honest learners alone (reduced slots both): ``--liar -1``:
learner 0 negates every shard it reduces, until a checker catches it (then it is excluded from the roles,
and the shards it lied in are replaced on every replica); ``--negate K``: the last K learners publish
−10⁴ × their update every round (the hostile-peer table's attack), against the other learners alone.
``--late 0.25``: a quarter of the updates miss each seal and count in the next slot, one slot staler (the
all-to-all run's are all on time, so the ratio bounds what lateness costs a reduced run from above).

Run: ``python -m testnet.benchmarks.reduced_quality --workers 16 --rounds 12``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import numpy as np

from protocol.compression import encode_tensors
from testnet.benchmarks.quality import Simulation
from testnet.reduced_net import ReducedNet


class ReducedSimulation(Simulation):
    """The ``sync`` schedule with reduced slots instead of each learner's ledger."""

    def __init__(self, *, reduction_codec: str | None = None, shards: int | None = None, q: float = 0.5,
                 liar: float | None = None, negate: int = 0, late: float = 0.0, **kw) -> None:
        """``liar``: learner 0 publishes every shard it reduces times this factor (its checker may catch it);
        ``negate``: the last ``negate`` learners publish −10⁴ × their update every round; ``late``: the share
        of learners whose update misses each seal (drawn every round), carried into the next slot."""
        super().__init__("sync", **kw)
        self.codec = kw["codec"]
        first = self.learners[0]
        params = first.ledger.params()
        shapes = {k: v.shape for k, v in params.items()}
        self.net = ReducedNet(len(self.learners), shapes, params, self.ledger_config, codec=self.codec,
                              reduction_codec=reduction_codec, shards=shards, q=q, seed=kw.get("seed", 0))
        self.liars = {self.net.peers[0]: liar} if liar is not None else None
        self.hostile = set(range(len(self.learners) - negate, len(self.learners)))
        self.reports = []
        self.late = round(late * len(self.learners))
        self.draw = np.random.default_rng(kw.get("seed", 0))

    def run(self, rounds: int) -> dict:
        for _ in range(rounds):
            updates = []
            for ln, peer in zip(self.learners, self.net.peers, strict=True):
                theta = self.net.replicas[peer].params()
                ln.loop.set_params(theta)
                ln.loop.run(self.H)
                local = ln.loop.params
                delta = {k: np.asarray(theta[k] - local[k], np.float32) for k in local}
                if ln.index in self.hostile:
                    payload = encode_tensors({k: np.float32(-1e4) * d for k, d in delta.items()}, self.codec)
                else:
                    payload, _ = ln.feedback.compress(delta)
                updates.append((peer, payload, self.net.slot, self.H * self.tokens_per_batch, self.H))
            late = [self.net.peers[i] for i in self.draw.choice(len(self.learners), self.late, replace=False)]
            self.reports.append(self.net.close(updates, liars=self.liars, late=late))
        if not self.net.agree():
            raise AssertionError("reduced replicas disagree")
        bpb = [ln.loop.evaluate(self.heldout, params=self.net.replicas[p].params())
               for ln, p in zip(self.learners, self.net.peers, strict=True) if ln.index not in self.hostile]
        tokens = sum(ln.loop.step for ln in self.learners) * self.tokens_per_batch
        return {"mode": "reduced", "bpb": float(np.mean(bpb)), "spread": float(np.ptp(bpb)), "tokens": tokens,
                "caught": [slot for slot, rep in enumerate(self.reports, 1) if rep.caught],
                "carried": sum(rep.carried for rep in self.reports[:-1])}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.benchmarks.reduced_quality", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--inner-steps", type=int, default=50)
    p.add_argument("--reduction-codec", default="int4", choices=("int4", "int8", "bf16", "fp32"))
    p.add_argument("--shards", type=int, default=None, help="shards (default: one per learner, at most the pieces)")
    p.add_argument("--q", type=float, default=0.5, help="a checker's share of a shard's pieces (default 0.5)")
    p.add_argument("--liar", type=float, default=None, metavar="FACTOR",
                   help="learner 0 publishes the shards it reduces times FACTOR (e.g. -1) until it is caught")
    p.add_argument("--negate", type=int, default=0, metavar="K",
                   help="the last K learners publish -10^4 x their update every round; compared with the others alone")
    p.add_argument("--late", type=float, default=0.0, metavar="SHARE",
                   help="the share of learners whose update misses each seal, carried into the next slot one slot "
                        "staler (all-to-all's updates all on time: an upper bound on what lateness costs)")
    p.add_argument("--model", default="tiny", help="model preset (default tiny)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. data.data_seed=1")
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args(argv)
    from node.island.config import preset

    common = dict(workers=a.workers, inner_steps=a.inner_steps, speeds=[1.0] * a.workers, latency=2, codec="int4",
                  seed=0, config=preset(a.model).with_overrides_from_strings(a.set))
    rows = {}
    attacked = a.liar is not None or a.negate > 0
    runs = ("reduced", "attacked") if attacked else ("all-to-all", "reduced")
    for name in runs:
        started = time.perf_counter()
        if name == "all-to-all":
            sim = Simulation("sync", **common)
        elif name == "reduced":  # with an attack: the honest learners alone
            honest = dict(common, workers=a.workers - a.negate, speeds=[1.0] * (a.workers - a.negate))
            sim = ReducedSimulation(reduction_codec=a.reduction_codec, shards=a.shards, q=a.q, late=a.late, **honest)
        else:
            sim = ReducedSimulation(reduction_codec=a.reduction_codec, shards=a.shards, q=a.q, liar=a.liar,
                                    negate=a.negate, late=a.late, **common)
        r = sim.run(a.rounds)
        rows[name] = {"bpb": r["bpb"], "tokens": r["tokens"], "spread": r["spread"], "caught": r.get("caught"),
                      "carried": r.get("carried"),
                      "seconds": round(time.perf_counter() - started)}
        print(f"{name:10s} held-out {r['bpb']:.4f} bits/byte at {r['tokens']:,} tokens "
              f"(replicas' spread {r['spread']:.1e}, {rows[name]['seconds']} s)", flush=True)
    first, second = runs[1], runs[0]
    ratio = rows[first]["bpb"] / rows[second]["bpb"]
    what = f"{first} ÷ {'honest only' if attacked else second}"
    print(f"{what}, the honest learners' held-out after equal rounds: {ratio:.4f} ({a.workers} learners, "
          f"H={a.inner_steps}, {a.rounds} rounds, reductions in {a.reduction_codec}"
          + (f", an aggregator ×{a.liar} caught at slots {rows['attacked']['caught']}" if a.liar is not None else "")
          + (f", {a.negate} negating" if a.negate else "")
          + (f", {a.late:.0%} of updates late each slot, carried" if a.late else "") + ")", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "ratio": ratio, "workers": a.workers, "rounds": a.rounds, "liar": a.liar,
                       "negate": a.negate, "late": a.late,
                       "reduction_codec": a.reduction_codec}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
