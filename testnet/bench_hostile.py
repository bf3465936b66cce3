"""`python -m testnet.bench hostile`: one hostile peer of four against the honest-only run, and what the
bound costs an honest run (issue "Trust in a running training").

Runs, all the same length, seed and schedule (the preset's), one after the other:

* honest-only: the honest nodes alone (``--nodes − 1``), with the default bound;
* honest-only without the bound (``--norm-clip 0``): the bound's cost is the first ÷ this;
* for each hostile kind (``--kinds``, default all of `node.chaos.Poison.KINDS`): the honest nodes plus one
  node publishing, every round, ``negate`` (−10⁴ × its Δ), ``scale`` (+10⁴ ×), ``random`` (a random
  direction with 10⁴ × the norm), each claiming the most tokens the run allows, or ``tokens`` (−10⁴ ×,
  claiming 2⁴⁰ tokens: refused as ``bad_claim``);
* ``collude`` (``--kinds collude``, not in the default set): the honest nodes plus *two* nodes that publish,
  every round, one payload between them (``--misbehave poison:collude``: a random direction of norm 10⁴
  per tensor drawn from the target slot alone), each claiming a full round: bit-identical deltas from
  two origins count once;
* ``flood`` (``--kinds flood``, not in the default set): the honest nodes plus one that trains honestly and
  publishes, every round, 6 more validly signed updates for the same slot (``--misbehave flood``: random
  directions with its update's norm): the per-origin limit (``max_updates_per_origin``) leaves it out of
  each slot it floods;
* ``forge`` (``--kinds forge``, not in the default set): the honest nodes plus one that trains honestly but
  serves a forged state after every round, claiming 2⁴⁰ more finalized tokens per round with its bottom's
  parameters scaled by −20, and sends every peer a fork hint (``--misbehave forge-state``): the honest nodes
  evaluate a forked state before adopting it (``--fork-tolerance``);
* ``lie`` (``--traffic reduced`` only, in its default set; compared with an honest run of all ``--nodes``,
  since the liar's own updates are honest): the honest nodes plus one whose every
  reduction, as a shard's aggregator, is its honest one negated (``--misbehave lie``): its checker signs a
  fraud proof, every node excludes it and steps with the checker's reduction;
* ``--traffic reduced --rounds R``: every run is a reduced run (``diloco-node --traffic reduced``) of R
  rounds; flood and forge are not built there;
* ``--unbounded-attack``: also the ``negate`` attack against nodes without the bound (the damage the bound
  prevents; the issue measured held-out bpb in the thousands);
* ``--unvetted-forge``: also the ``forge`` attack against nodes that adopt without evaluating
  (``--fork-tolerance inf``: the damage the vet prevents).

Figures: the honest nodes' held-out bits per byte, mean of their evaluations in the last 20% of each run
(same wall time) and around the same token count of the honest nodes (a hostile node's own work is not
the run's progress), each ÷ the honest-only run's. A run in which every node failed (diverged to non-finite parameters) is reported as such.
`--from-runs DIR...` recomputes the table from earlier run directories, given in the order above. On
this shared 2-core machine the hostile node also takes CPU from the honest ones, so at equal
wall time the hostile runs trained fewer honest tokens: the equal-token figure is the fairer one.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.chaos import Poison
from testnet.options import Options
from testnet.outcome import RunFailed

__all__ = ["bench_hostile", "check_kinds", "default_kinds", "plan"]


def plan(a: argparse.Namespace) -> list[tuple[str, Options]]:
    """The runs of one invocation, the honest-only reference first."""
    honest, reduced = a.nodes - 1, a.traffic == "reduced"
    common = dict(minutes=a.minutes, seed=a.seed, baseline=False, solo_seconds=0.0, out=a.out, progress="plain",
                  model=a.model, inner_steps=a.inner_steps, traffic=a.traffic, rounds=a.rounds)
    runs = [("honest only", Options(nodes=honest, **common)),
            ("honest only, no bound (--norm-clip 0)", Options(nodes=honest, node_args=("--norm-clip", "0"), **common))]
    modes = {"flood": "flood", "forge": "forge-state", "lie": "lie"}
    for kind in a.kinds or default_kinds(a.traffic):
        if kind == "collude":  # two colluders beside the same honest nodes
            runs.append((f"2 colluding of {a.nodes + 1}: one payload", Options(
                nodes=a.nodes + 1, misbehave=(f"{honest}:poison:collude", f"{honest + 1}:poison:collude"), **common)))
            continue
        mode = modes.get(kind, f"poison:{kind}")
        if kind == "lie":  # the liar's own updates are honest: its reference is an honest run of as many nodes
            runs.append((all_honest(a.nodes), Options(nodes=a.nodes, **common)))
        runs.append((f"1 hostile of {a.nodes}: {kind}", Options(nodes=a.nodes, misbehave=(f"{honest}:{mode}",), **common)))
    if a.unbounded_attack:
        runs.append((f"1 hostile of {a.nodes}: negate, no bound",
                     Options(nodes=a.nodes, misbehave=(f"{honest}:poison:negate",), node_args=("--norm-clip", "0"),
                             **common)))
    if a.unvetted_forge:
        runs.append((f"1 hostile of {a.nodes}: forge, no vet",
                     Options(nodes=a.nodes, misbehave=(f"{honest}:forge-state",), node_args=("--fork-tolerance", "inf"),
                             **common)))
    return runs


def all_honest(nodes: int) -> str:
    return f"honest, all {nodes} (the liar's reference)"


def reference_of(label: str, nodes: int) -> str:
    """The run a row is compared with: the honest-only one, or for the liar the honest run of all nodes."""
    return all_honest(nodes) if label.endswith(": lie") else "honest only"


def default_kinds(traffic: str) -> list[str]:
    """The attacks run when `--kinds` is not given: the poison kinds but collude, and a reduced run's lie."""
    return [k for k in Poison.KINDS if k != "collude"] + (["lie"] if traffic == "reduced" else [])


def check_kinds(a: argparse.Namespace) -> str | None:
    """Why `--kinds`, `--traffic` and `--rounds` do not go together (None when they do)."""
    kinds = set(a.kinds or default_kinds(a.traffic))
    if a.traffic == "reduced":
        if a.rounds is None:
            return "--traffic reduced needs --rounds R (a reduced run's nodes stop together at its last slot)"
        if kinds & {"flood", "forge"}:
            return f"--traffic reduced: {', '.join(sorted(kinds & {'flood', 'forge'}))} not built there"
    elif "lie" in kinds:
        return "--kinds lie is an aggregator's lie: it needs --traffic reduced"
    return None


def bench_hostile(a: argparse.Namespace, run: Callable[[Options], dict[str, Any]],
                  reload: Callable[[Path], dict[str, Any]],
                  compare: Callable[..., tuple[tuple[Any, Any], tuple[Any, Any], float]]) -> None:
    """Run (or, with `--from-runs`, reload in the order of `plan`) and print the table."""
    runs = plan(a)
    if a.from_runs and len(a.from_runs) != len(runs):
        raise SystemExit(f"--from-runs: {len(runs)} run directories expected ({', '.join(l for l, _ in runs)})")
    results: list[tuple[str, dict[str, Any] | str]] = []
    for i, (label, options) in enumerate(runs):
        try:
            results.append((label, reload(Path(a.from_runs[i])) if a.from_runs else run(options)))
        except RunFailed as exc:  # e.g. every node diverged to non-finite parameters
            results.append((label, f"failed: {exc}"))
    reference = results[0][1]
    if isinstance(reference, str):
        raise SystemExit(f"the honest-only run {reference}")
    length = f"{a.rounds} rounds" if a.rounds is not None else f"{a.minutes:g} min"
    print(f"\n== hostile peer: {a.nodes - 1} honest nodes, {a.traffic}, {length} per run, H={a.inner_steps}, "
          f"seed {a.seed}; honest-only run {reference['run_dir']}")
    print(f"{'run':<40} {'bpb, last 20%':>13} {'÷ honest':>9} {'bpb, eq. tokens':>15} {'÷ honest':>9}  rejected; run")
    by_label = dict(results)
    for label, r in results:
        if isinstance(r, str):
            print(f"{label:<40} {r}")
            continue
        ref = by_label.get(reference_of(label, a.nodes))
        if isinstance(ref, str) or ref is None:
            print(f"{label:<40} no reference: {ref}")
            continue
        (end_ref, end_r), (at_ref, at_r), _ = compare(ref, r, all_tokens=label.endswith(": lie"))
        total = r.get("rejections", {}).get("total") or {}
        rejected = ",".join(f"{k}:{v}" for k, v in sorted(total.items())) or "0"
        print(f"{label:<40} {_fmt(end_r):>13} {_ratio(end_r, end_ref):>9} {_fmt(at_r):>15} {_ratio(at_r, at_ref):>9}"
              f"  {rejected}; {r['run_dir']}")


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _ratio(x: float | None, ref: float | None) -> str:
    return "n/a" if x is None or not ref else f"{x / ref:.4f}"
