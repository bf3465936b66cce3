"""Hostile members every round, in one process: the honest learners' held-out at every evaluation against an
honest-only run, and in how many tensors of each slot the hostile direction won.

The outer algorithm on a simulated clock (`testnet.benchmarks.quality`'s `Simulation`, "eager" mode, the
node's), with the ledger settings a `diloco-node` uses (the update bounds included). Learners 0 … N−1 are
honest; the hostile ones train like them but publish, every round, instead of their update:

    negate    −10⁴ × their own update, claiming a full round's tokens (`--misbehave poison:negate`)
    copy      the same, except that a colluder publishing into a slot another colluder published into
              first publishes *that* payload (bit-identical deltas from two origins)
    collude   a random direction of norm 10⁴ per tensor drawn from the target slot alone, so every
              colluder publishing into a slot publishes the same payload (`--misbehave poison:collude`)

The honest-only run has the same honest learners (same shards, seeds and clock) and no hostile ones. Every
`--eval-every` rounds of learner 0, each honest learner's global parameters are evaluated (the same held-out
batches in both runs); the figure is attacked ÷ honest-only at each evaluation, worst and last. At each
slot learner 0 closes, its aggregate is compared, tensor by tensor, with the aggregate of the same slot
without its hostile entries: a tensor whose cosine is below 0 is one the hostile direction won.

    python -m testnet.benchmarks.hostile_quality --honest 3 --attacks negate:1 copy:2 collude:2 --rounds 30

`--json` writes every run's figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from testnet.benchmarks.quality import Learner, Simulation

FACTOR = 1e4
COLLUDE_SEED = 45  # the colluders' shared seed (as `node.chaos.Poison`'s)


class HostileSimulation(Simulation):
    """`Simulation` in which the learners of `hostile` (index → kind) publish hostile updates (see the module
    docstring), honest learner 0's slots are compared with their hostile-free aggregates at each close, and
    the honest learners are evaluated every `eval_every` rounds of learner 0."""

    def __init__(self, *args: Any, hostile: dict[int, str], eval_every: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hostile, self.eval_every = hostile, eval_every
        self.copied: dict[int, dict[str, np.ndarray]] = {}  # target slot → the first colluder's payload
        self.evaluations: list[tuple[int, float]] = []  # (round of learner 0, honest learners' mean held-out)
        self.won: list[tuple[int, int]] = []  # per slot learner 0 closed: (tensors the hostile won, tensors)

    def _honest(self) -> list[Learner]:
        return [ln for ln in self.learners if ln.index not in self.hostile]

    def _publish(self, ln: Learner) -> None:
        if ln.index not in self.hostile:
            super()._publish(ln)
            if ln.index == 0 and ln.rounds % self.eval_every == 0:
                held = [h.loop.evaluate(self.heldout, params=h.ledger.params()) for h in self._honest()]
                self.evaluations.append((ln.rounds, float(np.mean(held))))
            return
        ledger, kind = ln.ledger, self.hostile[ln.index]
        honest_add = ledger.add

        def add_hostile(meta, delta, payload=None):  # what the others and this learner's own ledger get
            hostile = self.copied.get(meta.target_slot) if kind == "copy" else None
            if kind == "collude":
                rng = np.random.default_rng([COLLUDE_SEED, meta.target_slot])
                hostile = {}
                for k in sorted(delta):
                    r = rng.standard_normal(delta[k].shape).astype(np.float32)
                    hostile[k] = (r * np.float32(FACTOR / float(np.linalg.norm(r)))).astype(np.float32)
            elif hostile is None:
                hostile = {k: (v * np.float32(-FACTOR)).astype(np.float32) for k, v in delta.items()}
                if kind == "copy":
                    self.copied[meta.target_slot] = hostile
            full = type(meta)(meta.update_id, meta.origin, meta.base_slot, meta.publish_slot,
                              self.H * self.tokens_per_batch, self.H)
            self._sent = (full, hostile)
            return honest_add(full, hostile, payload)

        ledger.add = add_hostile
        try:
            inbox_before = {k: len(v) for k, v in self.inbox.items()}
            super()._publish(ln)
        finally:
            del ledger.add
        full, hostile = self._sent
        for key, items in self.inbox.items():  # what was queued for the others is the hostile update too
            for k in range(inbox_before.get(key, 0), len(items)):
                items[k] = (full, hostile)

    def _close(self, ln: Learner) -> None:
        slot = ln.ledger.slot + 1
        super()._close(ln)
        if ln.index == 0:
            self.won.append(hostile_won(ln.ledger, slot, {f"worker-{i}" for i in self.hostile}))


def hostile_won(ledger: Any, slot: int, hostile: set[str]) -> tuple[int, int]:
    """(tensors whose aggregate at `slot` has a negative cosine with the same slot's without its hostile
    entries, tensors), from the entries `ledger` holds of that slot; (0, 0) when it holds no hostile one."""
    from protocol.ledger import aggregate

    entries = [e for e in ledger.entries() if e.slot == slot]
    clean = [e for e in entries if e.meta.origin not in hostile]
    if len(clean) == len(entries) or not clean:
        return 0, 0
    shapes = ledger.shapes
    with_them, without = aggregate(entries, shapes, ledger.config), aggregate(clean, shapes, ledger.config)
    won = 0
    for name in shapes:
        a, b = with_them[name].reshape(-1), without[name].reshape(-1)
        denominator = float(np.linalg.norm(a) * np.linalg.norm(b))
        won += denominator > 0.0 and float(a @ b) / denominator < 0.0
    return won, len(shapes)


def run_one(honest: int, hostile: dict[int, str], a: argparse.Namespace) -> dict[str, Any]:
    from node.island.bytelm import byte_lm_task
    from node.island.config import preset
    from testnet.benchmarks.task_quality import node_ledger_config

    cfg = preset(a.model)
    task = byte_lm_task(cfg, 16)
    ledger = node_ledger_config(task, a.inner_steps, None, None)
    defaults = _node_defaults()
    sim = HostileSimulation("eager", workers=honest + len(hostile), inner_steps=a.inner_steps,
                            speeds=[a.speed] * (honest + len(hostile)), latency=a.latency, codec="int4", seed=a.seed,
                            outer_lr=defaults.outer_lr, outer_momentum=defaults.outer_momentum, config=cfg, task=task,
                            ledger_config=ledger, adaptive=a.adaptive, hostile=hostile, eval_every=a.eval_every)
    started = time.perf_counter()
    sim.run(a.rounds)
    won = [w for w, n in sim.won if n]
    return {"hostile": {str(k): v for k, v in hostile.items()}, "evaluations": sim.evaluations,
            "slots_with_hostile": len(won), "tensors": sim.won[0][1] if sim.won else 0,
            "won_per_slot_mean": float(np.mean(won)) if won else 0.0, "won_per_slot_max": max(won, default=0),
            "seconds": time.perf_counter() - started}


def _node_defaults() -> Any:
    from node.settings import NodeSettings

    return NodeSettings(run_id="bench", key_path=Path("unused.key"))


def parse_attack(text: str) -> tuple[str, int]:
    kind, _, count = text.partition(":")
    if kind not in ("negate", "copy", "collude") or not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"an attack is negate:N, copy:N or collude:N (N ≥ 1), got {text!r}")
    return kind, int(count)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.benchmarks.hostile_quality",
                                description=__doc__.splitlines()[0])
    p.add_argument("--honest", type=int, default=3, help="honest learners (default 3)")
    p.add_argument("--attacks", nargs="+", type=parse_attack, default=[("negate", 1), ("copy", 2), ("collude", 2)],
                   help="KIND:COUNT hostile learners per attacked run (default negate:1 copy:2 collude:2)")
    p.add_argument("--rounds", type=int, default=30, help="rounds of the slowest learner (default 30)")
    p.add_argument("--inner-steps", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=3, help="rounds of learner 0 between evaluations (default 3)")
    p.add_argument("--speed", type=float, default=0.9, help="each learner's chance of a step per tick")
    p.add_argument("--latency", type=int, default=2)
    p.add_argument("--adaptive", action="store_true", help="rounds end after H ticks (shorter claims)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    print(f"{a.honest} honest learners, {a.model}, H={a.inner_steps}, int4, {a.rounds} rounds, node defaults; "
          f"held-out every {a.eval_every} rounds of learner 0", flush=True)
    clean = run_one(a.honest, {}, a)
    reference = dict(clean["evaluations"])
    print(f"honest only: held-out {' '.join(f'{v:.3f}' for _, v in clean['evaluations'])} ({clean['seconds']:.0f} s)",
          flush=True)
    rows = [{"run": "honest only", **clean}]
    for kind, count in a.attacks:
        hostile = {a.honest + k: kind for k in range(count)}
        r = run_one(a.honest, hostile, a)
        ratios = [v / reference[k] for k, v in r["evaluations"] if k in reference]
        r.update(worst=max(ratios), last=ratios[-1])
        rows.append({"run": f"{kind} × {count}", **r})
        print(f"{kind} × {count}: attacked ÷ honest-only at each evaluation {' '.join(f'{x:.3f}' for x in ratios)}; "
              f"worst {r['worst']:.3f}, last {r['last']:.3f}; tensors the hostile direction won per slot: mean "
              f"{r['won_per_slot_mean']:.2f}, max {r['won_per_slot_max']} of {r['tensors']} "
              f"({r['slots_with_hostile']} slots; {r['seconds']:.0f} s)", flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
