"""`report.md`: the report's figures (`testnet.report.compute`) told for someone who did not write the code.

It opens with three sentences: what ran, what the main figures say, and whether the run kept the
method's promise (`PROMISE`: held-out loss within 5% of data-parallel's at equal tokens, every replica
holding the same model, and, when the plan had faults, more goodput than data-parallel under the same
faults). Then one table row per figure, each defining its figure where it is shown (docs/design.md,
"Figures", has the long form), then where the nodes' time went, join times and loss jumps after restarts.

A figure that was not measured reads "n/a", never a value; one that was modelled reads "(modelled)" and
one that was assumed "(assumed)", with the model or the assumption in its row.
"""

from __future__ import annotations

from typing import Any

from testnet.loss_jumps import banner

__all__ = ["PROMISE", "alerts", "summary", "to_markdown"]

PROMISE = 1.05
"""The held-out ratio against data-parallel at equal tokens that the method promises to stay within."""


def _fmt(value: Any, spec: str = ".3f", tag: str = "") -> str:
    """`value` formatted, with `tag` after it; "n/a" when it was not measured (None)."""
    return "n/a" if value is None else format(value, spec) + tag


def _yes_no(value: bool | None, yes: str = "yes", no: str = "NO") -> str:
    return "n/a" if value is None else yes if value else no


def _memory_cell(memory: dict[str, Any] | None) -> str:
    peaks = (memory or {}).get("peak_rss_bytes") or {}
    return ", ".join(f"node {k}: {v / 2**30:.2f} GiB" for k, v in peaks.items()) or "n/a"


def _forks_row(forks: dict[str, Any] | None) -> tuple[str, str, str]:
    forks = forks or {}
    adopted, refused = forks.get("adopted"), forks.get("refused")
    if adopted is None or refused is None:
        return "forked states adopted / refused", "n/a", "no node reported its ledger outcomes"
    per_node = ", ".join(f"node {n}: {adopted[n]} / {refused.get(n, 0)}" for n in adopted) or "none"
    return ("forked states adopted / refused", f"{sum(adopted.values())} / {sum(refused.values())}",
            "states of another history taken (the heavier side of a fork) and refused as a worse model on the "
            f"node's held-out batches (--fork-tolerance): {per_node}")


def _late_cell(slots: dict[str, Any] | None) -> str:
    share = (slots or {}).get("late_share")
    return "n/a" if share is None else f"{share:.0%}"


def _late_detail(slots: dict[str, Any] | None) -> str:
    slots = slots or {}
    per_node = ", ".join(f"node {k}: {_fmt(v, '.0%')}" for k, v in (slots.get("late_share_per_node") or {}).items())
    counted = "" if slots.get("peer_updates") is None else f"{slots['late']} of {slots['peer_updates']}; "
    return (f"peers' updates that reached a node after the slot they were made for had closed there ({counted}"
            f"{per_node or 'n/a'}): folded in exactly, but each costs every node a pass over the model")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _baseline_clause(base: dict[str, Any]) -> str:
    state = base["state"]
    if state == "measured":
        return (f"then a synchronous data-parallel baseline, one worker per node, trained the same model on the "
                f"same {_fmt(base['tokens'], ',')} tokens")
    if state == "interrupted":
        return (f"then a synchronous data-parallel baseline started on the same tokens and was stopped at step "
                f"{base['steps_done']:,} of {base['steps']:,}")
    return {"skipped": "no data-parallel baseline ran (--no-baseline)",
            "not run": "the data-parallel baseline did not run (the run stopped before it, or it was stopped before "
                       "its first evaluation)"}[state]


def summary(fig: dict[str, Any]) -> list[str]:
    """The opening sentences: what ran, what the main figures say, whether the run kept the promise."""
    run, q, gp, dp = fig["run"], fig["quality"], fig["goodput"], fig["baseline_goodput"]
    tokens, ag, comm = q["at_equal_tokens"], fig["agreement"], fig["communication"]
    faults = ", ".join(run["faults"]) if run["faults"] else "no faults"
    what = (f"{run['nodes']} nodes trained the `{run['model']}` model ({run['param_count']:,} parameters) for "
            f"{run['duration_s']:.0f} s on this machine with {faults}, exchanging compressed updates every "
            f"{run['inner_steps']} local steps; {_baseline_clause(fig['baseline_run'])}.")
    ratio = tokens["ratio"]
    loss = ("Held-out loss (bits per byte on text no node trained on; lower is better) ended "
            + (f"{ratio:.3f}x data-parallel's at equal tokens ({tokens['nodes_bpb']:.3f} against "
               f"{tokens['dp_bpb']:.3f})" if ratio is not None else
               f"at {_fmt(q['mean_final_bpb'])}, with no data-parallel figure to compare it to")
            + f"; goodput, the share of the nodes' time spent on training that counted, was {_fmt(gp['value'])}, "
            f"and the nodes sent {_fmt(comm['ratio'], '.0f')}x fewer bytes than data-parallel's all-reduce would have.")
    within = None if ratio is None else ratio <= PROMISE
    checks = [(f"a held-out loss within {PROMISE - 1:.0%} of data-parallel's at equal tokens",
               "the loss" + ("" if ratio is None else f" ({ratio:.3f} {'<=' if within else '>'} {PROMISE:g})"), within),
              ("every replica holding the same model", "the agreement", ag["ok"])]
    if run["faults"]:
        checks.append(("more goodput than data-parallel under the same faults (modelled)",
                       f"the goodput ({_fmt(dp['ratio'], '.2f')}x data-parallel's)",
                       None if dp["ratio"] is None else dp["ratio"] > 1))
    kept = [short for _, short, ok in checks if ok]
    missed = [short for _, short, ok in checks if ok is False]
    unknown = [short for _, short, ok in checks if ok is None]
    if not missed and not unknown:
        verdict = "this run kept it"
    else:
        verdict = (f"this run missed {_and(missed)}" if missed else "this run") + \
            (f"{' but' if missed else ''} kept {_and(kept)}" if kept else "") + \
            (f"; {_and(unknown)}: n/a (not measured)" if unknown else "")
    promise = f"The method promises {_and([long for long, _, _ in checks])}: {verdict}."
    return [what, loss, promise]


def _rows(fig: dict[str, Any]) -> list[tuple[str, str, str]]:
    run, gp, dp, comm = fig["run"], fig["goodput"], fig["baseline_goodput"], fig["communication"]
    ag, q, ov, outcome = fig["agreement"], fig["quality"], fig["overlap"], fig["outcome"]
    at_time, at_tokens, jumps, base = q["at_equal_wall_time"], q["at_equal_tokens"], fig["loss_after_restarts"], \
        fig["baseline_run"]
    rejected = fig["rejections"]["total"]
    no_base = "" if base["state"] == "measured" else f" (baseline {base['state']})"
    return [
        ("goodput", _fmt(gp["value"]),
         "share of the nodes' time spent on inner steps of rounds whose update was published (measured: "
         f"`contributed_step_seconds`), from the moment every node trained to the stop ({run['window_s']} s); "
         f"counting start-up from launch {_fmt(gp['from_launch'])}; nodes never killed {_fmt(gp['never_killed'])}"),
        ("data-parallel goodput, same failures", _fmt(dp["same_failures"], tag=" (modelled)"),
         f"not run: synchronous training stalls every worker while any is down or cut off ({dp['stalled_s']} s "
         "here) and steps at the slowest worker's pace; an upper bound (no start-up, lost work or all-reduce time)"),
        ("data-parallel goodput, no failures", _fmt(dp["no_failures"], tag=" (assumed)"),
         "not measured: perfect scaling assumed, the slowest worker sets the pace"),
        ("goodput ÷ data-parallel", _fmt(dp["ratio"], ".2f", " (modelled)" if dp["ratio"] is not None else ""),
         "our goodput over data-parallel's under the same failures (modelled above); above 1: we kept more "
         "machines busy"),
        ("held-out bpb ÷ data-parallel, equal tokens", _fmt(at_tokens["ratio"]),
         "bits per byte on fixed held-out text, nodes over data-parallel after the same number of tokens, both "
         f"measured; below {PROMISE:g}: the promise kept. Nodes {_fmt(at_tokens['nodes_bpb'])}, data-parallel "
         f"{_fmt(at_tokens['dp_bpb'])}, over the {at_tokens['evaluations']} evaluations at "
         f"{at_tokens['tokens_from']:,}..{at_tokens['tokens_to']:,} tokens (the last 20%){no_base}"),
        ("held-out bpb ÷ data-parallel, same failures, equal wall time", _fmt(at_time["ratio"], tag=" (modelled)"),
         "the same at the same moments, data-parallel modelled from its measured curve at the nodes' step time, "
         f"stalled by this run's outages and partitions: nodes {_fmt(at_time['nodes_bpb'])}, data-parallel "
         f"{_fmt(at_time['dp_same_failures_bpb'])}, {at_time['evaluations']} evaluations from {at_time['from_s']} s"
         + (f"; {at_time['left_out']} left out (past the baseline's tokens)" if at_time["left_out"] else "")
         + no_base),
        ("loss jump after restart", _yes_no(jumps["loss_rose"], f"YES ({jumps['jumps']})", "none"),
         "a never-killed node's held-out loss more than 5% above its previous evaluation soon after a restart; "
         + _jumps_detail(jumps)),
        ("communication ratio (all-reduce ÷ ours)", _fmt(comm["ratio"], ".1f"),
         "bytes a ring all-reduce of fp32 gradients sends per worker and step (2(N-1)/N x 4 x parameters, "
         f"{_fmt(comm['dp_bytes_per_step'], ',.0f')} B) over the bytes each node sent per inner step (measured, "
         f"{_fmt(comm['bytes_per_node_step'], ',.0f')} B); without the start-up state downloads "
         f"{_fmt(comm.get('steady_ratio'), '.1f')}"),
        ("overlap (steps/s network ÷ alone)", _fmt(ov["value"]),
         "inner steps per second while in the network over the same nodes alone: 1 means communication costs no "
         "training time; " + (ov["note"] or "alone = every node isolated at once; with nodes sharing cores, > 1 means "
                              "the network run left each node more CPU")),
        ("replica agreement", _yes_no(ag["ok"], "ok", "NOT OK"),
         "nodes that applied the same updates hold the same parameters (digests compared): "
         f"{ag['conflicts']} conflicts in {ag['ledgers_seen']} ledgers; pairs seen on the same ledger after the "
         f"last fault {ag['pairs_met_after_quiet']}/{ag['pairs']}"
         + ("" if ag["finished_equal"] is None else f"; final digests equal: {ag['finished_equal']}")),
        ("updates rejected", "n/a" if rejected is None else str(sum(rejected.values())),
         "updates the nodes refused (bad signature, malformed, out of bounds, ...): "
         + ("n/a" if rejected is None else ", ".join(f"{k}: {v}" for k, v in rejected.items()) or "none")),
        ("restarted nodes rejoined", _yes_no(fig["rejoined"]),
         f"every restarted process published an update again; {run['restarts']} restarts"),
        ("rounds recovered after a kill", _fmt(fig["recovered"]["rounds"], "d"),
         "rounds in flight when a process ended, published by the node's next process "
         f"({_fmt(fig['recovered']['step_seconds'], '.1f')} s of inner steps)"),
        ("nodes failed", str(len(outcome["failed_nodes"])),
         "nodes that exited by themselves or did not come back: "
         + ("; ".join(f"node {f['node']}: {f['reason']}" for f in outcome["failed_nodes"]) or "none")),
        ("held-out bpb (mean of nodes)", _fmt(q["mean_final_bpb"]),
         f"the nodes' last evaluations; data-parallel's last {_fmt(q['baseline_final_bpb'])} (ratio "
         f"{_fmt(q['ratio_to_baseline'], '.4f')}, at unequal tokens); mean of the last 20% of the run "
         f"{_fmt(q['late_mean_bpb'])}"),
        ("tokens trained", _fmt(fig["throughput"]["total_tokens"], ","), "all nodes together (measured)"),
        ("peak memory per node (RSS)", _memory_cell(fig.get("memory")), "the most each node's processes reported"),
        ("updates that missed their slot", _late_cell(fig.get("slots")), _late_detail(fig.get("slots"))),
        _forks_row(fig.get("forks")),
    ]


def to_markdown(fig: dict[str, Any]) -> str:
    """The whole of `report.md` (module doc)."""
    run, outcome, jumps = fig["run"], fig["outcome"], fig["loss_after_restarts"]
    out = [f"# Testnet report: {run['nodes']} nodes, model {run['model']}, plan {run['plan']}", ""]
    if outcome["failed"]:
        out += [f"**The run failed**: {'; '.join(outcome['problems'])}.", ""]
    if run["interrupted"]:
        out += ["**Interrupted**: the nodes were stopped before the end of the run; the figures cover what ran.", ""]
    elif fig["baseline_run"]["state"] == "interrupted" or run.get("stopped_during") == "baseline":
        out += ["**Interrupted** during the data-parallel baseline: its figures cover what it trained, n/a where it "
                "did not get that far.", ""]
    banners = alerts(fig)
    out += [f"**{line}**" for line in banners] + ([""] if banners else [])
    out += [" ".join(summary(fig)), ""]
    out += ["| figure | value | what it means |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in _rows(fig)]
    out += ["", "n/a: not measured in this run. (modelled), (assumed): not measured, computed from a model or an "
            "assumption stated in the row. Definitions in full: docs/design.md, \"Figures\"; the curves: loss.png."]
    shares = (fig.get("time") or {}).get("never_killed", {}).get("fractions")
    if shares:
        out += ["", "Where the time of nodes never killed went (share of their processes' wall time):", "",
                " · ".join(f"{k} {v:.3f}" for k, v in shares.items())]
    out += ["", "| node | process | join (s) | recovery after kill (s) | killed |", "|---|---|---|---|---|"]
    out += [f"| {j['node']} | {j['process']} | {_fmt(j['join_s'], '.1f')} | {_fmt(j['recovery_s'], '.1f')} | "
            f"{'yes' if j['killed'] else ''} |" for j in fig["joins"]]
    out += ["", "Join: seconds from a process's start to its first published update; recovery: from the kill."]
    if jumps["restarts"]:
        out += ["", f"Held-out evaluations of never-killed nodes (observers {jumps['observers']}) more than "
                f"{jumps['threshold']:.0%} above their previous one, from each restart through their next "
                f"{jumps['evals_after_join']} evaluations after the restarted process's first update:", "",
                "| restarted node | process | at (s) | first update (s) | loss jumps (node: bpb before -> after) |",
                "|---|---|---|---|---|"]
        out += [f"| {r['node']} | {r['process']} | {r['at_s']:.1f} | {_fmt(r['joined_at_s'], '.1f')} | "
                + ("; ".join(f"node {j['node']} at {j['at_s']:.0f} s: {j['before']:.3f} -> {j['after']:.3f} "
                             f"(+{j['rise']:.1%})" for j in r["jumps"]) or "none") + " |" for r in jumps["restarts"]]
    return "\n".join(out) + "\n"


def _jumps_detail(jumps: dict[str, Any]) -> str:
    if jumps["loss_rose"] is None:
        return jumps["note"]
    detail = (f"{jumps['restarts_with_jumps']} of {len(jumps['restarts'])} restarts followed by one "
              f"({jumps['evaluations_compared']} evaluations compared)")
    worst = jumps["worst"]
    return detail + ("" if worst is None else f"; worst node {worst['node']} {worst['before']:.3f} -> "
                     f"{worst['after']:.3f} (+{worst['rise']:.1%}) at {worst['at_s']:.0f} s")


def alerts(fig: dict[str, Any]) -> list[str]:
    """Sentences that must not go unseen (report.md's first lines, `diloco-testnet`'s last): today, a
    held-out loss that rose after a restart (`testnet.loss_jumps`)."""
    line = banner(fig["loss_after_restarts"])
    return [line] if line else []
