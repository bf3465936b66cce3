"""The end-of-run report: goodput, communication ratio, overlap, replica agreement, rejections, join
times and held-out loss, for the testnet and for the synchronous data-parallel baseline.

`compute(record)` is pure (a `RunRecord` in, a JSON-ready dict out); `write_report(run_dir)` loads
the run directory and writes `report.json`, `report.md` and `loss.png`. Definitions (docs/design.md, "Figures"):

- goodput: Σ over nodes and processes of `contributed_step_seconds` earned inside the window ÷
  (nodes × window), the window running from when every node first reported `training` (start-up of
  the job is excluded, for both systems) to the stop. Downtime and restarts count as allocated.
  `from_launch` counts from each node's first launch instead.
- data-parallel goodput under the same plan: every failure stalls all workers from the kill until the
  failed node trains again (times measured in this run), a partition stalls everyone, and a step lasts
  as long as the slowest worker's: (1 − stalled/window) × Σ factor / (N × max factor). This is an upper
  bound for data-parallel (no start-up, lost work, or all-reduce time).
- communication ratio: ring all-reduce bytes per step `2 (N−1)/N · 4 · params` ÷ the honest nodes'
  bytes sent per inner step (transport counters). Higher is better. `steady_ratio` counts only from the
  moment every node trains, leaving out the start-up state downloads (paid once per join).
- overlap: honest, not-slowed nodes' inner steps/s while training in the network ÷ the same nodes
  training alone (`solo` run, same machine load); absent without a solo run.
- replica agreement, by digest (the node does not expose its parameters): no ledger digest was ever
  seen with two different parameter digests, and either every honest node finished its `--max-rounds`
  (drained) with the same STOPPED digests (`finished_equal`, exact quiescence), or, in a run that ends
  by SIGTERM while training, every pair of honest nodes was seen holding the same ledger digest after
  the last fault.
- join time: `first_update_at − started_at` per process; recovery: first update after a restart − kill.
- recovered rounds: rounds in flight at a kill that the node's next process published (`recovered_rounds`,
  `recovered_step_seconds` of `/status`; `node.outer.inflight`); their seconds count in goodput.
- time breakdown: where the processes' wall time went, from each process's last `/status` `time_s`
  (seconds per phase: inner steps, compress, publish, slot-close wait, evaluation, checkpoint, ...), as
  fractions of the processes' wall time from start to last sample; `other` is the rest (start-up
  before the node's clock began, thread hops, the loop between rounds); phases ending in `_bg` ran in
  the background, alongside the others, and are not subtracted.
- slot fill (`slots`): of the peers' updates each node added, the share that arrived after the slot they
  were made for had closed there (`folded-late`, or `applied-stale` when that slot had left the window),
  from each process's last `/status` `ledger_outcomes` (per process; the node's own updates, always in
  their slot, left out: `applied-open` + `held-future` − `updates_published`). A late update is folded in
  exactly, but each one costs every node a pass over the model, and until it lands the slot's outer step
  lacks it.
- forks (`forks`): forked states each node adopted (`fork-adopted`) and refused as a worse model
  (`fork-refused`, `--fork-tolerance`), summed over its processes' last `/status` `ledger_outcomes`.
- outcome: the verdict of `testnet.outcome` (did the run fail, which nodes failed and why).
- held-out loss against data-parallel (`quality.at_equal_tokens`, `quality.at_equal_wall_time`; see
  `testnet.quality`): at equal tokens against the measured baseline; at equal wall time against
  data-parallel under this run's failures, modelled from the baseline (it stalls whenever a worker is
  down, like the goodput model above), over the honest nodes' evaluations in the last 20% of the run.
- loss jumps after restarts (`loss_after_restarts`, `testnet.loss_jumps`): evaluations of never-killed
  nodes more than 5% above their previous one shortly after a restart; when there is one, `alerts` says
  so, first in `report.md` and last in `diloco-testnet`'s output.

A figure that was not measured is `null` in the JSON and "n/a" in the table, never a value: with no
`/status` answer at all, goodput, rejections, byte and token counts; agreement without any digest seen; "restarted
nodes rejoined" without a restarted process that could join; loss jumps without a restart or without an
evaluation to compare. The data-parallel goodput figures, and its loss at equal wall time, are a model, not
a measurement: the table (`testnet.report_md`) marks them "(modelled)" and "(assumed)", the JSON says so in
`basis`. An interrupted baseline (`baseline_run`) counts as far as it trained.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from testnet.loss_jumps import loss_after_restarts
from testnet.outcome import assess
from testnet.quality import at_equal_tokens, at_equal_wall_time, dp_curve, stretch
from testnet.record import RunRecord, load_run
from testnet.report_md import alerts, to_markdown
from testnet.timeline import Timeline, clip_length

__all__ = ["alerts", "compute", "dp_bytes_per_step", "main", "stretch", "to_markdown", "write_report"]


def dp_bytes_per_step(nodes: int, params: int) -> float:
    """Bytes each worker sends per step in a ring all-reduce of fp32 gradients."""
    return 2 * (nodes - 1) / nodes * 4 * params


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def _goodput(tl: Timeline, start: float) -> tuple[float, list[float]]:
    end, per_node = tl.t_end, []
    for node in range(tl.meta.nodes):
        earned = 0.0
        for inc in tl.of(node):
            earned += inc.value("contributed_step_seconds") - inc.value_at("contributed_step_seconds", start)
        per_node.append(earned / (end - start) if end > start else 0.0)
    return (sum(per_node) / len(per_node) if per_node else 0.0), per_node


def _node_rates(tl: Timeline, key: str, nodes: tuple[int, ...]) -> dict[int, float]:
    rates = {}
    for node in nodes:
        pairs = [inc.rate(key) for inc in tl.of(node)]
        amount, seconds = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        if seconds > 0:
            rates[node] = amount / seconds
    return rates


def _agreement(tl: Timeline, honest: tuple[int, ...]) -> dict[str, Any]:
    params_of: dict[str, set[str]] = {}
    holders: dict[str, set[int]] = {}
    restarted_ready = [inc.ready_at for inc in tl.incs.values() if inc.inc > 0 and inc.ready_at is not None]
    quiet = max([tl.t_plan + tl.plan.all_up_after()] + restarted_ready)
    for (node, _), inc in tl.incs.items():
        if node not in honest:
            continue
        for t, status in inc.samples:
            ledger, params = status.get("ledger_digest"), status.get("params_digest")
            if not (isinstance(ledger, str) and isinstance(params, str)):
                continue
            params_of.setdefault(ledger, set()).add(params)
            if t >= quiet:
                holders.setdefault(ledger, set()).add(node)
    conflicts = sum(len(p) > 1 for p in params_of.values())
    pairs = list(itertools.combinations(honest, 2))
    met = [p for p in pairs if any(p[0] in h and p[1] in h for h in holders.values())]
    final_slots = {}
    for node in honest:
        incs = [inc for inc in tl.of(node) if inc.samples]
        slot = incs[-1].last.get("slot") if incs else None
        final_slots[node] = slot if isinstance(slot, int) else None
    # Nodes that finished their rounds drained first (node.sync.drain): their STOPPED digests must be equal.
    lasts = [tl.of(node)[-1] for node in honest if tl.of(node)]
    finished = len(lasts) == len(honest) and all(inc.finished and inc.stopped for inc in lasts)
    stopped_equal = len({inc.stopped[1:] for inc in lasts if inc.stopped}) == 1 if finished else None
    consistent = conflicts == 0 if params_of else None  # None: no digest seen, nothing to compare
    together = stopped_equal if stopped_equal is not None else len(met) == len(pairs)
    return {"method": "digests (parameters are not exposed by the node)", "ledgers_seen": len(params_of),
            "conflicts": conflicts, "consistent": consistent,
            "quiet_from_s": _round(quiet - tl.t_launch, 2), "pairs": len(pairs), "pairs_met_after_quiet": len(met),
            "finished_equal": stopped_equal,
            "ok": None if consistent is None else consistent and together,
            "final_slots": final_slots}


def _memory(tl: Timeline) -> dict[str, Any]:
    """Each node's peak resident memory (bytes): the largest its processes reported in `/status`."""
    peaks: dict[str, int] = {}
    for (node, _), inc in tl.incs.items():
        for _, status in inc.samples:
            peak = status.get("peak_rss_bytes")
            if isinstance(peak, int) and peak > peaks.get(str(node), -1):
                peaks[str(node)] = peak
    return {"peak_rss_bytes": dict(sorted(peaks.items(), key=lambda kv: int(kv[0]))),
            "basis": "each process's ru_maxrss at its last /status poll (a peak after it is not seen)"}


def _slot_fill(tl: Timeline) -> dict[str, Any]:
    """Peers' updates that missed their slot at each node (module doc, "slot fill"); each figure None when no
    process reported its ledger outcomes."""
    on_time: Counter[int] = Counter()
    late: Counter[int] = Counter()
    for (node, _), inc in tl.incs.items():
        outcomes = inc.last.get("ledger_outcomes")
        if not isinstance(outcomes, dict):
            continue
        count = Counter({str(k): int(v) for k, v in outcomes.items() if isinstance(v, int)})
        own = int(inc.last.get("updates_published") or 0)
        on_time[node] += max(0, count["applied-open"] + count["held-future"] - own)
        late[node] += count["folded-late"] + count["applied-stale"]
    nodes = sorted(set(on_time) | set(late))
    share = {str(n): _round(late[n] / (late[n] + on_time[n])) if late[n] + on_time[n] else None for n in nodes}
    total = sum(late.values()) + sum(on_time.values())
    return {"late_share": _round(sum(late.values()) / total) if total else None, "late_share_per_node": share,
            "late": sum(late.values()) if nodes else None, "peer_updates": total if nodes else None}


def _joins(tl: Timeline) -> tuple[list[dict[str, Any]], bool | None]:
    """Join and recovery times per process; rejoined = every restarted process that was not itself
    killed published an update (one killed again before it could join is listed with join_s None);
    None when there was no such process (no restart, or every restarted process was killed again)."""
    rows, candidates, joined = [], 0, 0
    for (node, i), inc in tl.incs.items():
        started, first = inc.last.get("started_at"), inc.last.get("first_update_at")
        ok = isinstance(first, (int, float)) and isinstance(started, (int, float))
        prev = tl.incs.get((node, i - 1))
        recovery = (first - prev.killed_at) if ok and prev is not None and prev.killed_at is not None else None
        rows.append({"node": node, "process": i, "join_s": _round(first - started, 2) if ok else None,
                     "recovery_s": _round(recovery, 2), "killed": inc.killed_at is not None})
        if i > 0 and inc.killed_at is None:
            candidates += 1
            joined += ok
    return rows, (joined == candidates if candidates else None)


def _forks(tl: Timeline) -> dict[str, Any]:
    """Forked states adopted and refused per node (module doc, "forks"); None without any outcomes."""
    adopted: Counter[int] = Counter()
    refused: Counter[int] = Counter()
    seen = False
    for (node, _), inc in tl.incs.items():
        outcomes = inc.last.get("ledger_outcomes")
        if isinstance(outcomes, dict):
            seen = True
            adopted[node] += int(outcomes.get("fork-adopted") or 0)
            refused[node] += int(outcomes.get("fork-refused") or 0)
    if not seen:
        return {"adopted": None, "refused": None}
    return {"adopted": {str(n): adopted[n] for n in sorted(adopted)},
            "refused": {str(n): refused[n] for n in sorted(refused)}}


def _recovered(tl: Timeline) -> dict[str, Any]:
    """Rounds a process had in flight when it ended, published by the node's next process (`node.outer.inflight`),
    and their inner-step seconds (part of goodput's contributed time); None without any /status answer."""
    if not any(inc.samples for inc in tl.incs.values()):
        return {"rounds": None, "step_seconds": None}
    return {"rounds": sum(int(inc.last.get("recovered_rounds") or 0) for inc in tl.incs.values()),
            "step_seconds": _round(sum(float(inc.last.get("recovered_step_seconds") or 0.0)
                                       for inc in tl.incs.values()), 2)}


def _time_breakdown(tl: Timeline, nodes: set[int] | None = None) -> dict[str, Any]:
    """Fractions of the processes' wall time per phase (see the module docstring); None if no process
    reported `time_s`. `nodes`: only these nodes' processes."""
    totals: Counter[str] = Counter()
    wall = 0.0
    for (node, _), inc in tl.incs.items():
        if nodes is not None and node not in nodes or not inc.samples:
            continue
        phases, started = inc.last.get("time_s"), inc.last.get("started_at")
        if not isinstance(phases, dict) or not isinstance(started, (int, float)):
            continue
        wall += max(0.0, inc.samples[-1][0] - started)
        totals.update({str(k): float(v) for k, v in phases.items() if isinstance(v, (int, float))})
    if wall <= 0:
        return {"fractions": None, "wall_s": 0.0}
    fractions = {k: _round(v / wall) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
    inline = sum(v for k, v in totals.items() if not k.endswith("_bg"))  # "_bg": alongside the others
    fractions["other"] = _round(max(0.0, 1 - inline / wall))
    return {"fractions": fractions, "wall_s": _round(wall, 2)}


def _rejections(tl: Timeline) -> tuple[dict[str, int], dict[int, dict[str, int]]]:
    """Rejected updates by reason, in total and per node (from each process's last `/status`)."""
    total: Counter[str] = Counter()
    per_node: dict[int, Counter[str]] = {}
    for (node, _), inc in tl.incs.items():
        rejected = inc.last.get("updates_rejected")
        if isinstance(rejected, dict):
            counts = Counter({str(k): int(v) for k, v in rejected.items() if isinstance(v, int)})
            total += counts
            per_node.setdefault(node, Counter()).update(counts)
    return dict(sorted(total.items())), {n: dict(sorted(c.items())) for n, c in sorted(per_node.items())}


def _curves(tl: Timeline, honest: tuple[int, ...], start: float, step_s: float | None,
            stalls: list[tuple[float, float]]) -> dict[str, Any]:
    nodes, honest_tokens = {}, {}
    for node in range(tl.meta.nodes):
        nodes[str(node)] = [[tl.total_at("tokens", t), t - tl.t_launch, bpb] for t, bpb in tl.eval_points(node)]
        honest_tokens[str(node)] = [tl.total_at("tokens", t, honest) for t, _ in tl.eval_points(node)]
    baseline = []
    points = (tl.record.baseline or {}).get("points", [])
    for step, tokens, bpb in points:
        row = [tokens, None, None, bpb]
        if step_s is not None:
            work = step * step_s
            row[1] = _round(start + work - tl.t_launch, 3)
            row[2] = _round(stretch(work, start, stalls) - tl.t_launch, 3)
        baseline.append(row)
    restarts = [[tl.total_at("tokens", tl.started(inc)), _round(tl.started(inc) - tl.t_launch, 2), inc.node]
                for inc in tl.restarts()]
    model = dp_curve(points, start, stalls, step_s) if step_s is not None and points else []
    return {"nodes": nodes, "honest_tokens": honest_tokens, "baseline": baseline, "restarts": restarts,
            "duration_s": _round(tl.t_end - tl.t_launch, 2),
            "dp_same_failures": [[_round(t - tl.t_launch, 3), _round(bpb)] for t, bpb in model],
            "columns": {"nodes": ["tokens_all_nodes", "seconds", "bpb"], "honest_tokens": "tokens_honest_nodes of each point of nodes",
                        "baseline": ["tokens", "seconds_no_failures", "seconds_same_failures", "bpb"],
                        "restarts": ["tokens_all_nodes", "seconds", "node"], "dp_same_failures": ["seconds", "bpb"]}}


def compute(record: RunRecord) -> dict[str, Any]:
    """All figures of one run (see module doc), JSON-ready."""
    tl = Timeline(record)
    plan, meta = tl.plan, tl.meta
    honest = plan.honest_nodes
    fast = tuple(n for n in honest if plan.slow_factor(n) == 1.0) or honest
    t_ready = tl.t_ready
    start = t_ready if t_ready is not None else tl.t_launch
    window = max(tl.t_end - start, 0.0)
    answered = any(inc.samples for inc in tl.incs.values())  # else nothing was measured

    goodput, per_node = _goodput(tl, start) if answered and window > 0 else (None, [None] * meta.nodes)
    killed = {inc.node for inc in tl.incs.values() if inc.killed_at is not None}
    unkilled = [g for n, g in enumerate(per_node) if n not in killed and g is not None]
    launch_alloc = sum(tl.t_end - (tl.of(n)[0].launched_at or tl.t_launch) for n in range(meta.nodes) if tl.of(n))
    from_launch = sum(inc.value("contributed_step_seconds") for inc in tl.incs.values()) / launch_alloc \
        if answered and launch_alloc > 0 else None
    # contributed seconds read after the stop (the rounds the stop published), and how many processes had some
    at_stop = [inc.value("contributed_step_seconds") - inc.value_at("contributed_step_seconds", tl.t_end)
               for inc in tl.incs.values()]

    stalls = tl.outages() + tl.partitions()
    stalled = clip_length(stalls, start, tl.t_end)
    factors = [plan.slow_factor(n) for n in range(meta.nodes)]
    slow_eff = sum(factors) / (len(factors) * max(factors))
    dp_same = slow_eff * (1 - stalled / window) if window > 0 else None

    params = int(meta.extra.get("param_count", 0))
    sent = sum(inc.value("bytes_sent") for inc in tl.incs.values() if inc.node in honest)
    steps = sum(inc.value("inner_steps") for inc in tl.incs.values() if inc.node in honest)
    ours = sent / steps if steps else None
    dp = dp_bytes_per_step(meta.nodes, params) if params else None
    # the same once every node trains: without the start-up state downloads (a cost paid once per join)
    steady_sent = sent - tl.total_at("bytes_sent", start, honest)
    steady_steps = steps - tl.total_at("inner_steps", start, honest)
    steady = steady_sent / steady_steps if steady_steps else None

    step_rates = _node_rates(tl, "inner_steps", fast)
    # a solo run that measured no pace (no node finished a round in it) gives no overlap figure
    solo_rates = [float(r) for r in (record.solo or {}).get("steps_per_second", []) if float(r) > 0.0]
    net_rate = statistics.mean(step_rates.values()) if step_rates else None
    overlap = net_rate / statistics.mean(solo_rates) if net_rate and solo_rates else None
    step_s = 1.0 / net_rate if net_rate else None
    dp_step_s = None if step_s is None else step_s * max(factors)  # data-parallel: the slowest worker's pace

    total, per_reason_node = _rejections(tl) if answered else (None, {})
    joins, rejoined = _joins(tl)
    finals = {n: pts[-1][1] for n in honest if (pts := tl.eval_points(n))}
    late_from = tl.t_launch + 0.8 * (tl.t_end - tl.t_launch)  # single evaluations are noisy: also average
    late_evals = [(t, bpb) for n in honest for t, bpb in tl.eval_points(n) if t >= late_from]  # last 20% of the run
    late = [bpb for _, bpb in late_evals]
    base_points = (record.baseline or {}).get("points", [])
    curves = _curves(tl, honest, start, dp_step_s, stalls)
    equal_tokens = at_equal_tokens(curves["nodes"], honest, base_points)
    equal_time = at_equal_wall_time(late_evals, base_points, start=start, stalls=stalls, step_s=dp_step_s)
    equal_time["from_s"] = _round(late_from - tl.t_launch, 2)
    baseline_run = _baseline_run(record)
    base_final = base_points[-1][2] if base_points and baseline_run["state"] == "measured" else None
    mean_final = statistics.mean(finals.values()) if finals else None
    return {
        "run": {"nodes": meta.nodes, "model": meta.model, "inner_steps": meta.inner_steps, "param_count": params,
                "wan": meta.wan, "cpus": meta.extra.get("cpus"), "seed": meta.seed, "plan": plan.fingerprint(), "interrupted": meta.interrupted,
                "duration_s": _round(tl.t_end - tl.t_launch, 2),
                "all_training_at_s": _round(t_ready - tl.t_launch, 2) if t_ready is not None else None,
                "window_s": _round(window, 2), "honest_nodes": list(honest),
                "restarts": sum(i.inc > 0 for i in tl.incs.values()), "faults": _faults(plan), "compression": meta.compression,
                "stopped_during": meta.extra.get("stopped_during")},
        "baseline_run": baseline_run,
        "goodput": {"value": _round(goodput), "from_launch": _round(from_launch), "per_node": [_round(g) for g in per_node],
                    "never_killed": _round(statistics.mean(unkilled)) if unkilled else None,
                    "published_at_stop_s": _round(sum(at_stop), 2) if answered else None,
                    "published_at_stop_nodes": sum(x > 0 for x in at_stop) if answered else None},
        "baseline_goodput": {"same_failures": _round(dp_same), "no_failures": _round(slow_eff),
                             "stalled_s": _round(stalled, 2),
                             "ratio": _round(goodput / dp_same) if goodput is not None and dp_same else None,
                             "basis": "model, not measured: perfect scaling assumed; stalls from this run's outages "
                                      "and partitions"},
        "communication": {"bytes_per_node_step": _round(ours, 1), "dp_bytes_per_step": _round(dp, 1),
                          "ratio": _round(dp / ours, 2) if dp and ours else None,
                          "bytes_sent": int(sent) if answered else None,
                          "inner_steps": int(steps) if answered else None,
                          "steady_bytes_per_node_step": _round(steady, 1),
                          "steady_ratio": _round(dp / steady, 2) if dp and steady else None},
        "overlap": {"value": _round(overlap), "network_steps_per_s": {str(k): _round(v) for k, v in step_rates.items()},
                    "solo_steps_per_s": [_round(r) for r in solo_rates],
                    "note": None if solo_rates else "no solo run (--solo-seconds)"},
        "throughput": {"tokens_per_s": {str(k): _round(v, 1) for k, v in _node_rates(tl, "tokens", tuple(range(meta.nodes))).items()},
                       "total_tokens": int(tl.total_at("tokens", tl.t_end)) if answered else None},
        "agreement": _agreement(tl, honest),
        "rejections": {"total": total, "per_node": {str(k): v for k, v in per_reason_node.items()}},
        "outcome": assess(tl).to_dict(),
        "joins": joins, "rejoined": rejoined, "recovered": _recovered(tl),
        "time": {"all": _time_breakdown(tl), "never_killed": _time_breakdown(tl, set(range(meta.nodes)) - killed)},
        "quality": {"final_bpb": {str(k): _round(v) for k, v in finals.items()}, "mean_final_bpb": _round(mean_final),
                    "late_mean_bpb": _round(statistics.mean(late)) if late else None, "late_evaluations": len(late),
                    "baseline_final_bpb": _round(base_final),
                    "ratio_to_baseline": _round(mean_final / base_final) if mean_final and base_final else None,
                    "baseline_tokens": base_points[-1][1] if base_points else None,
                    "at_equal_tokens": _rounded(equal_tokens), "at_equal_wall_time": _rounded(equal_time)},
        "loss_after_restarts": loss_after_restarts(tl, [n for n in honest if n not in killed]),
        "memory": _memory(tl),
        "slots": _slot_fill(tl),
        "forks": _forks(tl),
        "curves": curves,
    }


def _faults(plan) -> list[str]:
    """The plan's faults in a few words each (empty: no faults)."""
    out = [f"{len(plan.kills)} kill{'s' * (len(plan.kills) != 1)} and restart{'s' * (len(plan.kills) != 1)}"] \
        if plan.kills else []
    out += [f"node {node} {factor:g}x slower" for node, factor in plan.slow]
    out += [f"{len(plan.partitions)} partition{'s' * (len(plan.partitions) != 1)}"] if plan.partitions else []
    out += [f"node {node} misbehaving ({mode})" for node, mode in plan.misbehave]
    return out


def _baseline_run(record: RunRecord) -> dict[str, Any]:
    """What the data-parallel baseline did: `measured` (finished), `interrupted` (its child writes
    `baseline.json` after every evaluation, `finished` false until the last), `skipped` (--no-baseline) or
    `not run` (the run stopped before it, or it was stopped before its first evaluation)."""
    base = record.baseline
    if base is None:
        skipped = record.meta.extra.get("options", {}).get("baseline") is False
        return {"state": "skipped" if skipped else "not run", "steps": None, "steps_done": None, "tokens": None}
    points = base.get("points", [])
    done = points[-1][0] if points else 0
    return {"state": "interrupted" if base.get("finished") is False else "measured", "steps": base.get("steps"),
            "steps_done": done, "tokens": points[-1][1] if points else None}


def _rounded(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _round(v) if isinstance(v, float) else v for k, v in d.items()}


def write_report(run_dir: Path) -> dict[str, Any]:
    """Compute the report of `run_dir` and write `report.json`, `report.md` and `loss.png` there."""
    from testnet.plot import plot_loss

    fig = compute(load_run(run_dir))
    (run_dir / "report.json").write_text(json.dumps(fig, indent=1) + "\n")
    (run_dir / "report.md").write_text(to_markdown(fig))
    jumps = sorted({(j["at_s"], j["after"]) for r in fig["loss_after_restarts"]["restarts"] for j in r["jumps"]})
    plot_loss(fig["curves"], run_dir / "loss.png", title=f"{fig['run']['nodes']} nodes, {fig['run']['model']}",
              jumps=jumps)
    return fig


def main(argv: list[str] | None = None) -> int:
    """`python -m testnet.report RUN_DIR`: (re)compute a run's report and print its table."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m testnet.report", description=main.__doc__)
    p.add_argument("run_dir", type=Path)
    args = p.parse_args(argv)
    print(to_markdown(write_report(args.run_dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
