"""Convergence scenario: asynchronous learners through per-node ledger replicas vs synchronous averaging.

Run: ``python -m testnet.benchmarks.ledger_demo [--seeds 3]``. (Until session 39 it was `protocol.ledger.demo`, which still runs it.)

Objective: least squares on synthetic data, ``y = x·w* + σε`` with ``x ~ N(0, diag(λ))`` (λ log-spaced),
so the expected loss of ``w`` is exact: ``½ (w−w*)ᵀ diag(λ) (w−w*) + σ²/2`` (we report the excess part,
the term the optimizer controls, and the total). Every learner runs ``H`` plain SGD steps (batch ``B``)
from its base parameters and publishes ``Δ = θ_base − θ_local`` as float32.

* ``sync``: all four learners start every round from the same ``θ_n``; the slowest sets the pace; their
  four updates form slot ``n+1`` of one ledger (same aggregation and outer Nesterov as the async runs).
* ``async``: learners with step times 1, 1, 2, 4 each own a :class:`Ledger` replica and a
  :class:`SlotClosePolicy`. A tiny event loop delivers every update to every other replica after a
  latency. A learner whose round is done closes its open slot when its policy says so, then starts its
  next round from its replica's parameters. A replica that holds an update for a later slot closes its
  open slot at once (a peer has closed it: follow the frontier), so slow learners publish with
  ``publish_slot > base_slot`` and carry staleness. ``async-weighted`` uses ``(1+staleness)^-0.5``;
  ``async-unweighted`` gives every update the same weight.

All runs stop at the same number of published samples; in-flight rounds are discarded; the async replicas
then receive everything, close the same number of slots, and must agree.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
from dataclasses import dataclass, field

import numpy as np

from protocol.ledger.config import LedgerConfig, UpdateMeta
from protocol.ledger.ledger import Ledger
from protocol.ledger.policy import ClosePolicyConfig, SlotClosePolicy

__all__ = ["Problem", "ScenarioResult", "run_async", "run_sync"]

MODES = ("sync", "async-weighted", "async-unweighted")


@dataclass(frozen=True)
class Problem:
    """Synthetic least squares and the learners' hyper-parameters."""

    dim: int = 32
    noise: float = 0.1
    inner_lr: float = 0.05
    inner_steps: int = 16
    batch: int = 32
    rounds_equivalent: int = 60  # budget = rounds × 4 learners × H × B samples
    speeds: tuple[float, ...] = (1.0, 1.0, 2.0, 4.0)  # seconds per inner step
    latency: float = 0.5  # publish → delivered at a peer

    def eigenvalues(self) -> np.ndarray:
        return np.logspace(-1.5, 0.0, self.dim)

    def w_star(self, seed: int) -> np.ndarray:
        return np.random.default_rng(10_000 + seed).standard_normal(self.dim)

    def budget(self) -> int:
        return self.rounds_equivalent * len(self.speeds) * self.inner_steps * self.batch

    def excess_loss(self, w: np.ndarray, seed: int) -> float:
        diff = w - self.w_star(seed)
        return 0.5 * float(np.sum(self.eigenvalues() * diff * diff))

    def local_round(self, w: np.ndarray, rng: np.random.Generator, seed: int) -> np.ndarray:
        """``H`` SGD steps from ``w``; returns the float32 pseudo-gradient ``w − w_local``."""
        scale, w_star, local = np.sqrt(self.eigenvalues()), self.w_star(seed), w.copy()
        for _ in range(self.inner_steps):
            x = rng.standard_normal((self.batch, self.dim)) * scale
            y = x @ w_star + self.noise * rng.standard_normal(self.batch)
            local -= self.inner_lr * (x.T @ (x @ local - y)) / self.batch
        return (w - local).astype(np.float32)


@dataclass
class ScenarioResult:
    mode: str
    excess_loss: float
    total_loss: float
    samples: int
    slots: int
    counters: dict[str, int] = field(default_factory=dict)
    replica_gap: float = 0.0  # max |θ_a − θ_b| / max |θ_a| of the working states at the end (async)
    canonical_agree: bool = True  # every replica ends with the same params digest (async)


def _meta(tag: str, base: int, publish: int, p: Problem) -> UpdateMeta:
    return UpdateMeta(
        hashlib.sha256(tag.encode()).digest(),
        tag.split("/")[0],
        base,
        publish,
        p.inner_steps * p.batch,
        p.inner_steps,
    )


def _result(mode: str, p: Problem, seed: int, ledger: Ledger, samples: int, **kw: object) -> ScenarioResult:
    excess = p.excess_loss(ledger.params(np.float64)["w"], seed)
    return ScenarioResult(mode, excess, excess + 0.5 * p.noise**2, samples, ledger.slot, ledger.counters, **kw)


def run_sync(p: Problem, seed: int, config: LedgerConfig | None = None) -> ScenarioResult:
    """Synchronous DiLoCo: every round, all learners from ``θ_n``; their updates form slot ``n+1``."""
    ledger = Ledger({"w": np.zeros(p.dim, np.float32)}, config or LedgerConfig())
    rngs = [np.random.default_rng([seed, i]) for i in range(len(p.speeds))]
    samples = 0
    while samples < p.budget():
        w, n = ledger.params(np.float64)["w"], ledger.slot
        for i, rng in enumerate(rngs):
            ledger.add(_meta(f"{i}/{n}", n, n, p), {"w": p.local_round(w, rng, seed)})
            samples += p.inner_steps * p.batch
        ledger.close_slot()
    return _result("sync", p, seed, ledger, samples)


@dataclass
class _Learner:
    ledger: Ledger
    policy: SlotClosePolicy
    rng: np.random.Generator
    base: int = 0
    rounds: int = 0
    done_at: float | None = None  # set while the round is done and the slot not yet closed
    result: np.ndarray | None = None


class _AsyncRun:
    """The event loop of one async scenario (times in seconds of simulated time)."""

    def __init__(self, p: Problem, seed: int, config: LedgerConfig) -> None:
        self.p, self.seed, self.samples = p, seed, 0
        self.events: list[tuple[float, int, str, int, object]] = []
        self.seq = 0
        self.learners = []
        for i, speed in enumerate(p.speeds):
            policy = SlotClosePolicy(ClosePolicyConfig())
            policy.observe_step(speed)
            policy.observe_transfer(p.latency)
            self.learners.append(
                _Learner(
                    Ledger({"w": np.zeros(p.dim, np.float32)}, config), policy, np.random.default_rng([seed, i])
                )
            )

    def push(self, t: float, kind: str, i: int, payload: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, i, payload))

    def start_round(self, i: int, now: float) -> None:
        me = self.learners[i]
        if self.samples >= self.p.budget():
            return
        me.base, me.done_at = me.ledger.slot, None
        me.result = self.p.local_round(me.ledger.params(np.float64)["w"], me.rng, self.seed)
        self.push(now + self.p.inner_steps * self.p.speeds[i], "done", i)

    def catch_up(self, i: int) -> None:
        ledger = self.learners[i].ledger
        while ledger.held_future():
            ledger.close_slot()

    def try_close(self, i: int, now: float) -> None:
        me = self.learners[i]
        d = me.policy.decide(
            now=now,
            round_done_at=me.done_at,
            updates_in_slot=me.ledger.updates_in_open_slot(),
            inner_steps=self.p.inner_steps,
        )
        if not d.close:
            self.push(d.wake_at, "wake", i)
            return
        me.ledger.close_slot()
        self.catch_up(i)
        self.start_round(i, now)

    def on_done(self, i: int, now: float) -> None:
        me = self.learners[i]
        if self.samples >= self.p.budget():
            return  # budget spent while this round ran: its work is discarded
        self.samples += self.p.inner_steps * self.p.batch
        update = (_meta(f"{i}/{me.rounds}", me.base, me.ledger.slot, self.p), {"w": me.result})
        me.rounds += 1
        me.ledger.add(*update)
        for j in range(len(self.learners)):
            if j != i:
                self.push(now + self.p.latency, "deliver", j, update)
        me.done_at = now
        self.try_close(i, now)

    def run(self) -> list[Ledger]:
        for i in range(len(self.learners)):
            self.start_round(i, 0.0)
        while self.events:
            now, _, kind, i, payload = heapq.heappop(self.events)
            me = self.learners[i]
            if kind == "done":
                self.on_done(i, now)
            elif kind == "deliver":
                me.ledger.add(*payload)
                self.catch_up(i)
                if me.done_at is not None:
                    self.try_close(i, now)
            elif kind == "wake" and me.done_at is not None:
                self.try_close(i, now)
        ledgers = [me.ledger for me in self.learners]
        for ledger in ledgers:  # everything is delivered: apply what is still open
            while ledger.updates_in_open_slot() or ledger.held_future():
                ledger.close_slot()
        final = max(ledger.slot for ledger in ledgers)
        for ledger in ledgers:
            while ledger.slot < final:
                ledger.close_slot()
        return ledgers


def run_async(p: Problem, seed: int, config: LedgerConfig) -> ScenarioResult:
    """Asynchronous learners (speeds ``p.speeds``) through per-node ledger replicas."""
    run = _AsyncRun(p, seed, config)
    ledgers = run.run()
    ws = [ledger.params(np.float64)["w"] for ledger in ledgers]
    gap = max(float(np.max(np.abs(w - ws[0]))) for w in ws) / float(np.max(np.abs(ws[0])))
    agree = len({ledger.params_digest() for ledger in ledgers}) == 1
    mode = "async-weighted" if config.staleness_alpha > 0 else "async-unweighted"
    return _result(mode, p, seed, ledgers[0], run.samples, replica_gap=gap, canonical_agree=agree)


def run_mode(mode: str, p: Problem, seed: int) -> ScenarioResult:
    """One of ``MODES`` with the default ledger config (``async-unweighted``: ``staleness_alpha=0``)."""
    if mode == "sync":
        return run_sync(p, seed)
    if mode == "async-weighted":
        return run_async(p, seed, LedgerConfig())
    if mode == "async-unweighted":
        return run_async(p, seed, LedgerConfig(staleness_alpha=0.0))
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def compare(p: Problem, seeds: int) -> dict[str, list[ScenarioResult]]:
    """Every mode on seeds ``0..seeds-1`` of problem ``p``."""
    return {mode: [run_mode(mode, p, seed) for seed in range(seeds)] for mode in MODES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 24, 32, 64], help="rounds-equivalent")
    args = ap.parse_args()
    p = Problem()
    per_round = len(p.speeds) * p.inner_steps * p.batch
    print(
        f"least squares d={p.dim}, σ={p.noise}, H={p.inner_steps}, B={p.batch}, speeds {p.speeds}, "
        f"latency {p.latency}, {args.seeds} seeds; budget = rounds × {per_round} samples"
    )
    row = "{:>6} {:>7} {:>9} | {:>9} {:>9} {:>9} | {:>7} {:>7} {:>6} | {:>9} {:>9} | {:>7}"
    print(
        row.format(
            "rounds",
            "samples",
            "slots s/a",
            "sync",
            "weighted",
            "unweightd",
            "w/sync",
            "u/sync",
            "u/w",
            "tot w/s",
            "tot u/s",
            "gap",
        )
    )
    for rounds in args.budgets:
        q = Problem(rounds_equivalent=rounds)
        res = compare(q, args.seeds)
        ex = {m: float(np.mean([r.excess_loss for r in rs])) for m, rs in res.items()}
        tot = {m: float(np.mean([r.total_loss for r in rs])) for m, rs in res.items()}
        gap = max(r.replica_gap for m in MODES[1:] for r in res[m])
        s, w, u = ex["sync"], ex["async-weighted"], ex["async-unweighted"]
        slots = f"{res['sync'][0].slots}/{res['async-weighted'][0].slots}"
        t_w, t_u = tot["async-weighted"] / tot["sync"], tot["async-unweighted"] / tot["sync"]
        print(
            row.format(
                rounds,
                q.budget(),
                slots,
                f"{s:.5f}",
                f"{w:.5f}",
                f"{u:.5f}",
                f"{w / s:.3f}",
                f"{u / s:.3f}",
                f"{u / w:.3f}",
                f"{t_w:.3f}",
                f"{t_u:.3f}",
                f"{gap:.0e}",
            )
        )
    print("excess = ½(w−w*)ᵀΛ(w−w*) (exact expectation); tot = excess + σ²/2; gap = max replica disagreement")


if __name__ == "__main__":
    main()
