"""Benchmark: folding one late update into a 10M-parameter ledger vs one plain Nesterov outer step.

Run: ``python -m testnet.benchmarks.ledger_fold [--params 10000000] [--window 4] [--per-slot 3] [--builds 2]``.

Setup: four float32 tensors (one an embedding, so both aggregation paths run), a ledger that has closed
``window + 4`` slots with ``per-slot`` updates in each, radial-directional aggregation. The fold is timed
end to end through ``Ledger.add`` (header and shape checks, norm/finiteness pass, copy, canonical
re-aggregation of the slot, closed-form fold into θ and v), once into each window slot, newest to oldest.
The baseline is ``nesterov_step`` — the step ``close_slot`` takes — on the same state, in the same run.
Fold and step are timed alternately. Prints medians and the ratio (target: under 3×), and the cost of a
whole ``close_slot`` for reference.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import numpy as np

from protocol.ledger.config import LedgerConfig, UpdateMeta
from protocol.ledger.ledger import Ledger
from protocol.ledger.outer import nesterov_step


def _shapes(total: int) -> dict[str, tuple[int, ...]]:
    quarter = total // 4
    cols = 1000
    return {
        "embed": (quarter // cols, cols),
        "w_in": (quarter // cols, cols),
        "w_out": (quarter // cols, cols),
        "w_mid": (total - 3 * (quarter // cols) * cols,),
    }


def _update(rng: np.random.Generator, shapes: dict, tag: str, base: int, publish: int) -> tuple[UpdateMeta, dict]:
    meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag, base, publish, 4096, 32)
    return meta, {n: rng.standard_normal(s, dtype=np.float32) for n, s in shapes.items()}


def _build(shapes: dict, window: int, per_slot: int, seed: int) -> tuple[Ledger, np.random.Generator]:
    rng = np.random.default_rng(seed)
    params = {n: rng.standard_normal(s, dtype=np.float32) for n, s in shapes.items()}
    ledger = Ledger(params, LedgerConfig(window=window, embeddings=frozenset({"embed"})))
    for s in range(1, window + 5):
        for k in range(per_slot):
            ledger.add(*_update(rng, shapes, f"{seed}/{s}/{k}", s - 1, s - 1))
        ledger.close_slot()
    return ledger, rng


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=10_000_000)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--per-slot", type=int, default=3)
    ap.add_argument("--builds", type=int, default=2)
    args = ap.parse_args()
    shapes = _shapes(args.params)
    folds: list[float] = []
    steps: list[float] = []
    closes: list[float] = []
    for b in range(args.builds):
        ledger, rng = _build(shapes, args.window, args.per_slot, seed=b)
        # Baseline state of the same size: the ledger's own step with a ready slot aggregate.
        theta, v = ledger.canonical_state()
        g = {name: rng.standard_normal(s) for name, s in shapes.items()}
        nesterov_step(theta, v, g, None, 0.7, 0.9)  # warm-up: touch every page once
        n = ledger.slot
        for r in range(n, n - args.window, -1):  # interleaved, so load changes hit both alike
            meta, deltas = _update(rng, shapes, f"late/{b}/{r}", r - 1, r - 1)
            t0 = time.perf_counter()
            outcome = ledger.add(meta, deltas)
            folds.append(time.perf_counter() - t0)
            assert outcome.value == "folded-late", outcome
            t0 = time.perf_counter()
            nesterov_step(theta, v, g, None, 0.7, 0.9)
            steps.append(time.perf_counter() - t0)
        for c in range(2):  # for the record: a full close (step + window-bottom canonical step + new slot)
            for k in range(args.per_slot):
                ledger.add(*_update(rng, shapes, f"open/{b}/{c}/{k}", ledger.slot, ledger.slot))
            t0 = time.perf_counter()
            ledger.close_slot()
            closes.append(time.perf_counter() - t0)
        del ledger, theta, v, g
    fold, step = statistics.median(folds), statistics.median(steps)
    total = sum(int(np.prod(s)) for s in shapes.values())
    print(
        f"state: {total:,} params in {len(shapes)} tensors, window {args.window}, {args.per_slot} updates per slot"
    )
    print(
        f"fold one late update (Ledger.add): median {fold * 1e3:.1f} ms over {len(folds)} "
        f"(min {min(folds) * 1e3:.1f}, max {max(folds) * 1e3:.1f})"
    )
    print(
        f"plain Nesterov step:               median {step * 1e3:.1f} ms over {len(steps)} "
        f"(min {min(steps) * 1e3:.1f}, max {max(steps) * 1e3:.1f})"
    )
    print(f"ratio fold / step: {fold / step:.2f}x (target < 3x)")
    print(
        f"for reference, close_slot: median {statistics.median(closes) * 1e3:.1f} ms = "
        f"{statistics.median(closes) / step:.2f} steps (its step + the window bottom's canonical step)"
    )


if __name__ == "__main__":
    main()
