"""Where the quality gap comes from: the outer algorithm in one process, without the network or the machine.

Real JAX training (the node's `InnerLoop`, model, data shards and int4 codec with error feedback) and one
real `Ledger` per learner, on a simulated clock counted in inner steps, so the result does not depend on
the load of a shared machine. Held-out bits per byte at equal tokens:

    dp      synchronous data-parallel, M workers' batches per step (`node.island.baseline.run_baseline`)
    sync    synchronous DiLoCo: every slot holds all M updates, every round starts from the full θ
    wait-1  asynchronous slots, a slot closed at most 1 step after the own round ends, learners idle
            while they wait (the node before the "train through the close" change)
    wait-5  the same, waiting up to 5 steps for the due updates
    eager   the node now (`node.outer.rebase`): the next round starts at once from θ minus the own update, the
            slot waits up to H/2 steps for the others' updates, and the round follows θ as it moves

Learner i does a step per tick with probability `speeds[i]`; updates reach the others `latency` ticks
after they are published. Run: `python -m testnet.benchmarks.quality --rounds 20`. `--set KEY=VALUE` overrides
a config field (model, data or inner optimizer) for the learners and data-parallel alike; `--model` picks
another preset; `--aggregation` and `--hold` change the ledger's aggregation and the eager slot wait.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from node.island.config import Config
    from node.island.task import Task
    from protocol.ledger import LedgerConfig

MODES = ("sync", "wait-1", "wait-5", "eager")


@dataclass
class Learner:
    index: int
    loop: object  # node.island.train.InnerLoop
    ledger: object  # protocol.ledger.Ledger
    feedback: object  # protocol.compression.ErrorFeedback
    base: dict = field(default_factory=dict)  # what Δ is taken against
    base_slot: int = 0
    steps: int = 0
    round_ticks: int = 0  # ticks the current round has trained (or tried to)
    rounds: int = 0
    idle: int = 0
    waiting: tuple[int, int] | None = None  # (slot of the own update, tick its round ended)
    own: dict | None = None  # the own dequantized Δ while its slot is open (eager)
    folded: bool = False


def _catch_up(ledger) -> None:
    while ledger.held_future() and max(ledger.held_future()) > ledger.slot + 1:
        ledger.close_slot()


class Simulation:
    """M learners on one simulated clock (see the module docstring)."""

    def __init__(self, mode: str, *, workers: int, inner_steps: int, speeds: Sequence[float], latency: int,
                 codec: str, seed: int, outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 aggregation: str = "radial-directional", hold: int | None = None,
                 adaptive: bool = False, config: Config | None = None, task: Task | None = None,
                 ledger_config: LedgerConfig | None = None) -> None:
        """The learners train `task` (a library `node.island.task.Task`; default: the byte-level model of
        `config`, itself `tiny` by default); learner i reads the shard of key `worker-i`. `ledger_config`
        replaces the one made from `outer_lr`, `outer_momentum` and `aggregation` (e.g. the node's own,
        `node.settings.ledger_config`)."""
        from dataclasses import replace

        from node.island.bytelm import byte_lm_task
        from node.island.config import preset
        from node.island.train import InnerLoop
        from protocol.compression import ErrorFeedback
        from protocol.ledger import Ledger, LedgerConfig

        self.mode, self.H, self.latency, self.adaptive = mode, inner_steps, latency, adaptive
        self.cfg = config if config is not None else preset("tiny")
        self.task = task if task is not None else byte_lm_task(self.cfg, 16)
        self.tokens_per_batch = self.task.tokens_per_batch
        self.speeds = list(speeds)
        if ledger_config is None:
            ledger_config = LedgerConfig(window=8, lr=outer_lr, momentum=outer_momentum, aggregation=aggregation,
                                         embeddings=self.task.model.embeddings)
        else:
            ledger_config = replace(ledger_config, lr=outer_lr, momentum=outer_momentum)
        self.ledger_config = ledger_config
        self.learners = []
        for i in range(workers):
            source, self.heldout = self.task.open(f"worker-{i}")
            loop = InnerLoop(self.task.model, source, seed=self.cfg.inner.init_seed if task is None else seed,
                             tokens_per_batch=self.tokens_per_batch)
            ledger = Ledger(loop.params, ledger_config)
            self.learners.append(Learner(i, loop, ledger, ErrorFeedback(codec), base=ledger.params()))
        self.hold = {"sync": None, "wait-1": 1, "wait-5": 5, "eager": hold or inner_steps // 2}[mode]
        self.rng = np.random.default_rng(seed)
        self.offsets = [0 if mode == "sync" else int(self.rng.integers(0, inner_steps // 2)) for _ in self.learners]
        self.inbox: dict[tuple[int, int], list] = defaultdict(list)
        self.updates, self.tick, self.at_close = 0, 0, []

    # -- one learner's events ----------------------------------------------------------------------
    def _rebase(self, ln: Learner) -> None:
        """Follow θ (eager: minus the own update while its slot is open)."""
        theta = ln.ledger.params()
        if ln.waiting is not None:
            theta = {k: theta[k] - ln.own[k] for k in theta}
        local = ln.loop.params
        ln.loop.set_params({k: local[k] + theta[k] - ln.base[k] for k in local})
        ln.base, ln.base_slot = theta, ln.ledger.slot

    def _close(self, ln: Learner) -> None:
        self.at_close.append(ln.ledger.updates_in_open_slot())
        ln.ledger.close_slot()
        _catch_up(ln.ledger)

    def _publish(self, ln: Learner) -> None:
        from protocol.ledger import UpdateMeta

        if ln.waiting is not None:  # eager: the previous slot must be closed before publishing
            self._close(ln)
            ln.waiting = None
            self._rebase(ln)
        local = ln.loop.params
        _, delta = ln.feedback.compress({k: np.asarray(ln.base[k] - local[k], np.float32) for k in local})
        self.updates += 1
        meta = UpdateMeta(hashlib.sha256(b"%d" % self.updates).digest(), f"worker-{ln.index}", ln.base_slot,
                          ln.ledger.slot, ln.steps * self.tokens_per_batch, ln.steps)
        ln.ledger.add(meta, delta)
        _catch_up(ln.ledger)
        for other in self.learners:
            if other is not ln:
                self.inbox[(self.tick + self.latency, other.index)].append((meta, delta))
        ln.waiting, ln.own, ln.steps, ln.rounds = (meta.target_slot, self.tick), delta, 0, ln.rounds + 1
        ln.round_ticks = 0
        if self.mode == "eager":
            ln.base = local  # go on from the own progress; the slot's aggregate replaces it at close
        else:
            ln.loop.set_params(ln.base)

    def _maybe_close(self, ln: Learner) -> None:
        target, done = ln.waiting
        if ln.ledger.slot >= target:
            ln.waiting = None
        elif self.mode == "sync":
            if ln.ledger.updates_in_open_slot() == len(self.learners):
                self._close(ln)
                ln.waiting = None
        elif ln.ledger.updates_in_open_slot() >= len(self.learners) or self.tick >= done + self.hold:
            self._close(ln)
            ln.waiting = None
        if ln.waiting is None and self.mode != "eager":
            ln.base, ln.base_slot = ln.ledger.params(), ln.ledger.slot
            ln.loop.set_params(ln.base)

    def _tick(self, ln: Learner) -> None:
        for meta, delta in self.inbox.pop((self.tick, ln.index), []):
            ln.folded |= ln.ledger.add(meta, delta).value == "folded-late"
            _catch_up(ln.ledger)
        if ln.waiting is not None:
            self._maybe_close(ln)
        if self.mode == "eager" and (ln.ledger.slot != ln.base_slot or ln.folded):
            self._rebase(ln)
        ln.folded = False
        if self.tick <= self.offsets[ln.index] or (ln.waiting is not None and self.mode != "eager"):
            ln.idle += 1
            return
        ln.round_ticks += 1
        if self.rng.random() < self.speeds[ln.index]:
            ln.loop.run(1)
            ln.steps += 1
        if ln.steps == self.H or (self.adaptive and ln.round_ticks >= self.H and ln.steps):
            self._publish(ln)

    # -- the run -----------------------------------------------------------------------------------
    def run(self, rounds: int) -> dict:
        while min(ln.rounds for ln in self.learners) < rounds:
            self.tick += 1
            for ln in self.learners:
                self._tick(ln)
        for (_, j), items in sorted(self.inbox.items()):  # deliver what is in flight, close what is held
            for meta, delta in items:
                self.learners[j].ledger.add(meta, delta)
                _catch_up(self.learners[j].ledger)
        for ln in self.learners:
            while ln.ledger.updates_in_open_slot() or ln.ledger.held_future():
                ln.ledger.close_slot()
        bpb = [ln.loop.evaluate(self.heldout, params=ln.ledger.params()) for ln in self.learners]
        tokens = sum(ln.loop.step for ln in self.learners) * self.tokens_per_batch
        return {"mode": self.mode, "bpb": float(np.mean(bpb)), "spread": float(np.ptp(bpb)), "ticks": self.tick,
                "tokens": tokens, "idle": float(np.mean([ln.idle for ln in self.learners])) / self.tick,
                "at_close": float(np.mean(self.at_close)) if self.at_close else float("nan")}


def dp_at(tokens: int, workers: int, cfg: Config) -> float:
    """Held-out bpb of synchronous data-parallel over `workers` workers after `tokens` tokens."""
    from node.island.baseline import run_baseline, worker_keys

    steps = round(tokens / (workers * cfg.data.batch_size * cfg.model.seq_len))
    return run_baseline(cfg, steps=steps, shard_keys=worker_keys(workers), eval_every=max(1, steps),
                        eval_batches=16)[-1].bits_per_byte


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.benchmarks.quality", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20, help="rounds of the slowest learner (default 20)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--inner-steps", type=int, default=50)
    p.add_argument("--speeds", default="1,1,1,0.9", help="per learner: chance of a step per tick")
    p.add_argument("--latency", type=int, default=2, help="ticks from publish to arrival (default 2)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--codec", default="int4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--hold", type=int, default=None, help="eager: steps a slot waits for due updates (default H/2)")
    p.add_argument("--adaptive", action="store_true",
                   help="a round ends after H ticks (the node's --adaptive-steps): a slow learner does fewer steps")
    p.add_argument("--aggregation", default="radial-directional", choices=("radial-directional", "mean"))
    p.add_argument("--model", default="tiny", help="model preset (default tiny)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field for both the learners and data-parallel, e.g. total_steps=1000")
    a = p.parse_args(argv)
    from node.island.config import preset

    cfg = preset(a.model).with_overrides_from_strings(a.set)
    speeds = [float(x) for x in a.speeds.split(",")]
    if len(speeds) != a.workers:
        p.error(f"--speeds needs {a.workers} values")
    overrides = f" ({', '.join(a.set)})" if a.set else ""
    print(f"{a.workers} learners, {a.model} model{overrides}, H={a.inner_steps}, {a.codec}, speeds {speeds}, "
          f"latency {a.latency} steps, outer Nesterov lr {a.outer_lr} momentum {a.outer_momentum}, {a.aggregation}, "
          f"{a.rounds} rounds of the slowest learner; held-out bits per byte (16 batches)", flush=True)
    rows = []
    for mode in a.modes.split(","):
        started = time.perf_counter()
        sim = Simulation(mode, workers=a.workers, inner_steps=a.inner_steps,
                         speeds=[1.0] * a.workers if mode == "sync" else speeds, latency=a.latency, codec=a.codec,
                         seed=a.seed, outer_lr=a.outer_lr, outer_momentum=a.outer_momentum,
                         aggregation=a.aggregation, hold=a.hold, adaptive=a.adaptive, config=cfg)
        r = sim.run(a.rounds)
        r["dp"] = dp_at(r["tokens"], a.workers, cfg)
        rows.append(r)
        print(f"{mode:7s} bpb {r['bpb']:.4f}  dp at the same tokens {r['dp']:.4f}  ratio {r['bpb'] / r['dp']:.4f}  "
              f"| ticks {r['ticks']} tokens {r['tokens']:,} idle {r['idle']:.3f} updates/slot at close "
              f"{r['at_close']:.2f} replicas' spread {r['spread']:.1e} ({time.perf_counter() - started:.0f} s)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
