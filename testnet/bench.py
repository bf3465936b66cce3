"""Benchmarks of the issue's claims, each a real testnet run (or two) measured against a baseline taken
in the same invocation:

    python -m testnet.bench goodput   # 6 nodes, one random kill every 30 s, 15 s downtime, vs data-parallel
    python -m testnet.bench slow      # one node 4x slower vs all uniform: fast nodes' tokens/s and the loss

`goodput` targets: goodput >= 0.9 and >= 2x data-parallel's under the same kill schedule (failures stall
every data-parallel worker until the failed one trains again, times measured in the run).
`slow` targets: the fast nodes' tokens/s >= 0.95 of the uniform run's; held-out loss at most 2% above the
uniform run's (the issue's "within 2%": a slow node must not hurt; a lower loss passes), both at the end
of the run (same wall time) and at the same number of tokens (each a mean over a window of evaluations:
single held-out evaluations of a moving replica are noisy).
On a shared CPU a slowed node sleeps and frees cycles for the others, so tokens/s ratios above 1 mean
"not slowed down", not a speed-up a real cluster would see.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import trio

from testnet.cli import Options, run_testnet
from testnet.report import write_report

__all__ = ["bpb_near_tokens", "main"]


def _run(o: Options) -> dict[str, Any]:
    run_dir = trio.run(run_testnet, o)
    return json.loads((run_dir / "report.json").read_text()) | {"run_dir": str(run_dir)}


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _reload(run_dir: Path) -> dict[str, Any]:
    """The report of an earlier run, recomputed from its records."""
    return write_report(run_dir) | {"run_dir": str(run_dir)}


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def bpb_near_tokens(report: dict[str, Any], tokens: float, width: float = 0.2) -> float | None:
    """Mean held-out bpb of the honest nodes' evaluations made when all nodes together had trained
    between (1 - width) x tokens and tokens (a window, since single evaluations are noisy)."""
    values = [p[2] for node in report["run"]["honest_nodes"] for p in report["curves"]["nodes"].get(str(node), [])
              if (1 - width) * tokens <= p[0] <= tokens]
    return float(np.mean(values)) if values else None


def _last_eval_tokens(report: dict[str, Any]) -> float:
    """The token count up to which every honest node has evaluations."""
    lasts = [pts[-1][0] for n in report["run"]["honest_nodes"] if (pts := report["curves"]["nodes"].get(str(n)))]
    return min(lasts) if lasts else 0.0


def bench_goodput(a: argparse.Namespace) -> None:
    o = Options(nodes=a.nodes, minutes=a.minutes, kill_every=30.0, downtime=15.0, seed=a.seed, baseline=a.baseline,
                out=a.out, progress="plain", model=a.model, inner_steps=a.inner_steps, solo_seconds=a.solo_seconds)
    r = _run(o)
    gp, dp = r["goodput"]["value"], r["baseline_goodput"]["same_failures"]
    print(f"\n== goodput: {a.nodes} nodes, {a.minutes:g} min, H={a.inner_steps}, one random kill every 30 s, 15 s "
          f"downtime (seed {a.seed}; {r['run']['restarts']} restarts; run {r['run_dir']})")
    print(f"goodput {gp:.3f} (from launch {r['goodput']['from_launch']:.3f}); data-parallel, same kills "
          f"{dp:.3f} (stalled {r['baseline_goodput']['stalled_s']:.0f} of {r['run']['window_s']:.0f} s)")
    print(f"nodes never killed: goodput {r['goodput']['never_killed']}; overlap (steps/s in the network / alone, "
          f"same machine load) {r['overlap']['value']}; communication ratio {r['communication']['ratio']}x less "
          f"than ring all-reduce")
    shares = r.get("time", {}).get("never_killed", {}).get("fractions")
    if shares:
        print("time of nodes never killed: " + " · ".join(f"{k} {v:.3f}" for k, v in shares.items()))
    joins = [j["join_s"] for j in r["joins"] if j["process"] > 0 and j["join_s"] is not None]
    if joins:
        print(f"restarted processes, start -> first contributed update: median {np.median(joins):.1f} s "
              f"(min {min(joins):.1f}, max {max(joins):.1f}, {len(joins)} processes)")
    print(f"held-out bpb: nodes {r['quality']['mean_final_bpb']}, data-parallel at the same tokens "
          f"{r['quality']['baseline_final_bpb']}")
    print(f"targets:\n  goodput >= 0.9                 {gp:.3f}  {_verdict(gp >= 0.9)}")
    ratio = gp / dp if dp else float("inf")
    print(f"  goodput >= 2x data-parallel    {ratio:.2f}x  {_verdict(ratio >= 2)}")


def bench_slow(a: argparse.Namespace) -> None:
    common = dict(nodes=a.nodes, minutes=a.minutes, seed=a.seed, baseline=False, out=a.out, progress="plain",
                  model=a.model, inner_steps=a.inner_steps)
    slow_node = a.nodes - 1
    if a.from_runs:
        uniform, slowed = (_reload(Path(d)) for d in a.from_runs)
    else:
        uniform = _run(Options(**common))
        slowed = _run(Options(**common, slow=(f"{slow_node}:{a.factor:g}",)))
    fast = [str(n) for n in range(a.nodes) if n != slow_node]
    tps_u = [uniform["throughput"]["tokens_per_s"].get(n) for n in fast]
    tps_s = [slowed["throughput"]["tokens_per_s"].get(n) for n in fast]
    if None in tps_u or None in tps_s:
        raise SystemExit(f"a fast node reported no throughput: uniform {tps_u}, slowed {tps_s}")
    tps_ratio = float(np.mean(tps_s) / np.mean(tps_u))
    end_u, end_s = uniform["quality"]["late_mean_bpb"], slowed["quality"]["late_mean_bpb"]
    tokens = min(_last_eval_tokens(uniform), _last_eval_tokens(slowed))
    at_u, at_s = bpb_near_tokens(uniform, tokens), bpb_near_tokens(slowed, tokens)
    minutes = uniform["run"]["duration_s"] / 60
    print(f"\n== slow node: {a.nodes} nodes, node {slow_node} {a.factor:g}x slower vs uniform, {minutes:.1f} min each "
          f"(runs {uniform['run_dir']}, {slowed['run_dir']})")
    print(f"fast nodes' tokens/s: uniform {np.mean(tps_u):,.0f}, with a slow node {np.mean(tps_s):,.0f} "
          f"-> ratio {tps_ratio:.3f}")
    print(f"tokens trained: uniform {uniform['throughput']['total_tokens']:,}, with a slow node "
          f"{slowed['throughput']['total_tokens']:,}")
    print(f"held-out bpb, mean of the evaluations in the last 20% of the run: uniform {end_u}, with a slow node {end_s}")
    print(f"held-out bpb, mean of the evaluations at {0.8 * tokens:,.0f}..{tokens:,.0f} tokens: uniform "
          f"{_f(at_u)}, with a slow node {_f(at_s)}")
    print("targets:")
    print(f"  fast nodes' tokens/s >= 0.95x uniform    {tps_ratio:.3f}  {_verdict(tps_ratio >= 0.95)}")
    for label, u, s in (("same wall time", end_u, end_s), ("same tokens", at_u, at_s)):
        if u is None or s is None:
            print(f"  loss within 2% ({label})   n/a (no held-out measurements)")
            continue
        rel = s / u - 1  # the target is about harm: a lower loss with the slow node passes
        print(f"  loss at most 2% above uniform ({label}){' ' * (15 - len(label))}{rel:+.2%}  {_verdict(rel <= 0.02)}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.bench", description=__doc__.splitlines()[0])
    p.add_argument("which", choices=("goodput", "slow"))
    p.add_argument("--nodes", type=int, default=6)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--factor", type=float, default=4.0, help="slow node's factor (slow benchmark)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--solo-seconds", type=float, default=45.0, help="solo run for the overlap figure (goodput)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--inner-steps", type=int, default=None,
                   help="inner steps per round (default: 50 for goodput, 20 for slow). Goodput uses 50: a "
                        "round's fixed costs (publish, outer step, grace) weigh 1/H, while a kill loses half a "
                        "round on average; 50 is the better trade at one kill every 30 s (BENCHMARKS.md)")
    p.add_argument("--out", type=Path, default=Path("runs/bench"))
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="goodput: skip the data-parallel training run (its quality figure); the data-parallel "
                        "goodput under the same kills is computed from the schedule either way")
    p.add_argument("--from-runs", nargs=2, metavar=("UNIFORM", "SLOWED"),
                   help="slow: recompute the figures from two earlier run directories instead of running")
    a = p.parse_args(argv)
    if a.inner_steps is None:
        a.inner_steps = 50 if a.which == "goodput" else 20
    (bench_goodput if a.which == "goodput" else bench_slow)(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
