"""Tier (a): the report's figures on a hand-made recorded run, checked against hand-computed values.

The run: 2 nodes launched at t=1000, stopped at t=1020. Node 0 trains throughout; node 1 is killed at
1009 (plan: kill at 9 s, restart after 3 s), comes back and trains again from 1016. Every node reported
`training` at least once by 1004, so the goodput window is [1004, 1020] (16 s).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from testnet.faults import FaultPlan, Kill, Partition
from testnet.record import RunMeta, RunRecord, load_run
from testnet.report import compute, dp_bytes_per_step, stretch, to_markdown, write_report


def status(state: str, css: float, steps: int, sent: int, *, started: float, first: float | None,
           ledger: str = "", params: str = "", rejected: dict | None = None, evals: list | None = None) -> dict:
    return {"state": state, "contributed_step_seconds": css, "inner_steps": steps, "tokens": steps * 100,
            "bytes_sent": sent, "bytes_received": 0, "started_at": started, "first_update_at": first,
            "ledger_digest": ledger or None, "params_digest": params or None, "updates_rejected": rejected or {},
            "eval_history": evals or [], "slot": steps // 10}


def record(conflict: bool = False, baseline: dict | None = None, solo: dict | None = None) -> RunRecord:
    meta = RunMeta(nodes=2, model="tiny", inner_steps=10, peer_ids=["a", "b"], t_launch=1000.0, t_end=1020.0,
                   extra={"param_count": 1000})
    plan = FaultPlan(nodes=2, duration=20, kills=(Kill(9, 1, 3),))
    n0 = dict(started=1001, first=1005)
    samples = [
        (1002, 0, 0, status("syncing", 0, 0, 0, started=1001, first=None)),
        (1004, 0, 0, status("training", 1, 10, 500, **n0)),
        (1010, 0, 0, status("training", 5, 50, 2500, **n0, ledger="L1", params="P1")),
        (1020, 0, 0, status("training", 13, 130, 6500, **n0, ledger="L2", params="P2", rejected={"bad_signature": 2},
                            evals=[[5000, 1010, 4.0], [13000, 1020, 3.0]])),
        (1003, 1, 0, status("training", 0.5, 5, 250, started=1001, first=1006)),
        (1008, 1, 0, status("training", 3.5, 35, 1750, started=1001, first=1006, ledger="L1",
                            params="P9" if conflict else "P1", rejected={"bad_signature": 1, "malformed": 3},
                            evals=[[3500, 1007, 4.5]])),
        (1014, 1, 1, status("syncing", 0, 0, 0, started=1013, first=None)),
        (1016, 1, 1, status("training", 1, 10, 500, started=1013, first=1018)),
        (1020, 1, 1, status("training", 4, 40, 2000, started=1013, first=1018, ledger="L2", params="P2",
                            evals=[[4000, 1019, 3.2]])),
    ]
    events = [{"t": 1000.0, "node": 0, "inc": 0, "event": "launch"}, {"t": 1000.0, "node": 1, "inc": 0, "event": "launch"},
              {"t": 1009.0, "node": 1, "inc": 0, "event": "kill", "pid": 1},
              {"t": 1012.0, "node": 1, "inc": 1, "event": "launch"}]
    rows = [{"t": t, "node": n, "inc": i, "status": s} for t, n, i, s in samples]
    rows.append({"t": 1011.0, "node": 1, "inc": 0, "error": "ConnectError()"})
    return RunRecord(meta, plan, events, rows, baseline=baseline, solo=solo)


def test_goodput_and_data_parallel_goodput() -> None:
    fig = compute(record())
    assert fig["run"]["all_training_at_s"] == 4.0 and fig["run"]["window_s"] == 16.0
    # node 0 earned 13 - 1 = 12 s in the window, node 1 (3.5 - 0.5) + 4 = 7 s; 2 nodes x 16 s allocated
    assert fig["goodput"]["per_node"] == [0.75, 0.4375]
    assert fig["goodput"]["value"] == pytest.approx(19 / 32, abs=1e-4)
    assert fig["goodput"]["from_launch"] == pytest.approx(20.5 / 40, abs=1e-4)
    # data-parallel stalls from the kill (1009) until node 1 trains again (1016): 7 of 16 s
    assert fig["baseline_goodput"]["stalled_s"] == 7.0
    assert fig["baseline_goodput"]["same_failures"] == pytest.approx(9 / 16, abs=1e-4)
    assert fig["baseline_goodput"]["no_failures"] == 1.0
    assert fig["baseline_goodput"]["ratio"] == pytest.approx((19 / 32) / (9 / 16), abs=1e-3)
    assert fig["baseline_goodput"]["basis"].startswith("model, not measured")
    md = to_markdown(fig)
    assert "| data-parallel goodput, no failures | 1.000 (assumed) |" in md
    assert "| data-parallel goodput, same failures | 0.562 (modelled) |" in md


def test_communication_ratio() -> None:
    fig = compute(record())
    comm = fig["communication"]
    assert comm["bytes_sent"] == 6500 + 1750 + 2000 and comm["inner_steps"] == 130 + 35 + 40
    assert comm["bytes_per_node_step"] == 50.0
    assert comm["dp_bytes_per_step"] == dp_bytes_per_step(2, 1000) == 4000.0
    assert comm["ratio"] == 80.0
    assert dp_bytes_per_step(8, 1_000_000) == pytest.approx(2 * 7 / 8 * 4e6)


def test_join_times_recovery_and_rejoin() -> None:
    fig = compute(record())
    joins = {(j["node"], j["process"]): j for j in fig["joins"]}
    assert joins[(0, 0)]["join_s"] == 4.0 and joins[(1, 0)]["join_s"] == 5.0
    assert joins[(1, 1)]["join_s"] == 5.0 and joins[(1, 1)]["recovery_s"] == 9.0
    assert fig["rejoined"] is True and fig["run"]["restarts"] == 1


def test_a_restart_that_never_published_is_not_rejoined() -> None:
    rec = record()
    for row in rec.samples:
        if row.get("inc") == 1 and "status" in row:
            row["status"]["first_update_at"] = None
    assert compute(rec)["rejoined"] is False
    # ... unless it was killed again before it could join: then it had no chance to, and with no other
    # restarted process, whether restarted nodes rejoin was not observed at all
    rec.events.append({"t": 1019.0, "node": 1, "inc": 1, "event": "kill", "pid": 2})
    fig = compute(rec)
    assert fig["rejoined"] is None
    assert "| restarted nodes rejoined | n/a | every restarted process published an update again; 1 restarts |" \
        in to_markdown(fig)
    assert [j["killed"] for j in fig["joins"] if j["node"] == 1] == [True, True]


def test_rejoined_is_not_applicable_without_restarts() -> None:
    rec = record()
    rec.plan = FaultPlan(nodes=2, duration=20)
    rec.events = [e for e in rec.events if e["event"] == "launch" and e["inc"] == 0]
    rec.samples = [row for row in rec.samples if row["inc"] == 0]
    fig = compute(rec)
    assert fig["run"]["restarts"] == 0 and fig["rejoined"] is None
    md = to_markdown(fig)
    assert "| restarted nodes rejoined | n/a | every restarted process published an update again; 0 restarts |" in md
    assert "| restarted nodes rejoined | yes" not in md
    assert json.loads(json.dumps(fig))["rejoined"] is None  # null in report.json


def test_agreement_by_digest() -> None:
    good = compute(record())["agreement"]
    assert good["ok"] and good["conflicts"] == 0 and good["pairs_met_after_quiet"] == 1
    assert good["quiet_from_s"] == 16.0  # the restarted node trained again at 1016
    bad = compute(record(conflict=True))["agreement"]
    assert not bad["ok"] and bad["conflicts"] == 1


def test_agreement_of_nodes_that_finished_their_rounds() -> None:
    def finished(ledgers: tuple[str, str]) -> dict:
        rec = record()
        for (node, inc), ledger in zip(((0, 0), (1, 1)), ledgers):
            rec.events.append({"t": 1020.0, "node": node, "inc": inc, "event": "stopped", "slot": 9, "ledger": ledger,
                               "params": "P"})
            rec.events.append({"t": 1020.5, "node": node, "inc": inc, "event": "exit", "rc": 0, "expected": True,
                               "finished": True})
        return compute(rec)["agreement"]

    assert finished(("L", "L"))["finished_equal"] is True and finished(("L", "L"))["ok"]
    assert finished(("L", "M"))["finished_equal"] is False and not finished(("L", "M"))["ok"]
    assert compute(record())["agreement"]["finished_equal"] is None  # stopped by SIGTERM: not comparable


def test_rejections_summed_over_processes() -> None:
    rej = compute(record())["rejections"]
    assert rej["total"] == {"bad_signature": 3, "malformed": 3}
    assert rej["per_node"] == {"0": {"bad_signature": 2}, "1": {"bad_signature": 1, "malformed": 3}}


def test_overlap_needs_a_solo_run() -> None:
    assert compute(record())["overlap"]["value"] is None
    fig = compute(record(solo={"steps_per_second": [10.0, 10.0]}))
    # node 0: 120 steps in 16 s; node 1: (30 + 30) steps in (5 + 4) s
    assert fig["overlap"]["network_steps_per_s"] == {"0": 7.5, "1": pytest.approx(60 / 9, abs=1e-4)}
    assert fig["overlap"]["value"] == pytest.approx((7.5 + 60 / 9) / 2 / 10, abs=1e-4)
    # a solo run in which no node finished a round measured no pace: no overlap figure, not a crash
    assert compute(record(solo={"steps_per_second": [0.0, 0.0]}))["overlap"]["value"] is None


def test_curves_quality_and_baseline_wall_time() -> None:
    base = {"points": [[0, 0, 8.0], [100, 20000, 3.5]]}
    fig = compute(record(baseline=base, solo={"steps_per_second": [10.0]}))
    nodes = fig["curves"]["nodes"]
    # at 1010 node 0 had 5000 tokens, node 1's first process 3500 (its last reading), the second none yet
    assert nodes["0"][0] == [8500, 10.0, 4.0]
    assert [p[2] for p in nodes["1"]] == [4.5, 3.2]
    step_s = 1 / ((7.5 + 60 / 9) / 2)
    work = 100 * step_s
    last = fig["curves"]["baseline"][1]
    assert last[1] == pytest.approx(4 + work, abs=1e-3)  # no failures: starts when the nodes did
    assert last[2] == pytest.approx(16 + (work - 5), abs=1e-3)  # 5 s of work, the 7 s stall, the rest
    q = fig["quality"]
    assert q["final_bpb"] == {"0": 3.0, "1": 3.2} and q["mean_final_bpb"] == pytest.approx(3.1)
    assert q["ratio_to_baseline"] == pytest.approx(3.1 / 3.5, abs=1e-4)


def test_stretch() -> None:
    assert stretch(5, 0, []) == 5
    assert stretch(5, 0, [(2, 4)]) == 7
    assert stretch(1, 0, [(2, 4)]) == 1
    assert stretch(5, 3, [(2, 4), (3.5, 6), (7, 8)]) == 12  # inside a stall until 6, 1 s of work, stall, 4 s
    assert stretch(0, 2, [(2, 4)]) == 4


def test_slow_node_sets_data_parallel_pace() -> None:
    rec = record()
    rec.plan = FaultPlan(nodes=2, duration=20, kills=rec.plan.kills, slow=((1, 4.0),))
    fig = compute(rec)
    assert fig["baseline_goodput"]["no_failures"] == pytest.approx(5 / 8)


def test_write_report_files(tmp_path: Path) -> None:
    rec = record(baseline={"points": [[0, 0, 8.0], [100, 20000, 3.5]]})
    (tmp_path / "run.json").write_text(json.dumps(rec.meta.to_dict()))
    (tmp_path / "plan.json").write_text(json.dumps(rec.plan.to_dict()))
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in rec.events))
    (tmp_path / "status.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rec.samples) + '{"t": 10')
    (tmp_path / "baseline.json").write_text(json.dumps(rec.baseline))
    assert len(load_run(tmp_path).samples) == len(rec.samples)  # a torn last line is ignored
    fig = write_report(tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["goodput"] == fig["goodput"]
    md = (tmp_path / "report.md").read_text()
    assert "| goodput | 0.594 |" in md and "| 1 | 1 | 5.0 | 9.0 |  |" in md and "| 1 | 0 | 5.0 | n/a | yes |" in md
    png = (tmp_path / "loss.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert to_markdown(fig) == md


def test_a_run_without_measurements_shows_nothing_as_measured() -> None:
    """No node ever answered /status (every one died at start): nothing measured reads as a value."""
    meta = RunMeta(nodes=2, model="tiny", inner_steps=10, peer_ids=["a", "b"], t_launch=0.0, t_end=5.0)
    events = [{"t": 0.5, "node": n, "inc": 0, "event": e, "rc": 2, "expected": False, "finished": False}
              for n in (0, 1) for e in ("launch", "exit")]
    fig = compute(RunRecord(meta, FaultPlan(nodes=2, duration=5), events, []))
    assert fig["goodput"] == {"value": None, "from_launch": None, "per_node": [None, None], "never_killed": None,
                              "published_at_stop_s": None, "published_at_stop_nodes": None}
    assert fig["agreement"]["ok"] is None and fig["agreement"]["consistent"] is None
    assert fig["rejections"]["total"] is None and fig["throughput"]["total_tokens"] is None
    assert fig["communication"]["bytes_sent"] is None and fig["baseline_goodput"]["ratio"] is None
    assert fig["rejoined"] is None and fig["run"]["all_training_at_s"] is None
    assert fig["outcome"]["failed"] and len(fig["outcome"]["failed_nodes"]) == 2
    md = to_markdown(fig)
    assert md.splitlines()[2].startswith("**The run failed**: every node failed (2 of 2); no node trained")
    for row in ("goodput", "replica agreement", "updates rejected", "restarted nodes rejoined", "tokens trained"):
        assert f"| {row} | n/a |" in md, row
    assert ("| nodes failed | 2 | nodes that exited by themselves or did not come back: node 0: exited by itself with "
            "status 2; node 1: exited by itself with status 2 |") in md


def test_peak_memory_per_node_is_the_largest_any_of_its_processes_reported() -> None:
    rec = record()
    peaks = iter([1 << 30, 3 << 29, None, 1 << 29, 5 << 28, 1 << 28, 1 << 27, 2 << 30, 1 << 30])
    for row in rec.samples:
        if "status" in row and (peak := next(peaks)) is not None:
            row["status"]["peak_rss_bytes"] = peak
    fig = compute(rec)
    assert fig["memory"]["peak_rss_bytes"] == {"0": 3 << 29, "1": 2 << 30}
    assert "node 0: 1.50 GiB, node 1: 2.00 GiB" in to_markdown(fig)
    assert "| peak memory per node (RSS) | n/a |" in to_markdown(compute(record()))


def test_the_plans_times_count_from_when_its_clock_started() -> None:
    """A testnet with faults starts the plan's clock once every node trains (`run.json`'s `t_plan`): a
    partition at 2–4 s of the plan stalls data-parallel from 1006 to 1008, not from 1002 (before the window)."""
    rec = record()
    rec.meta.t_plan = 1004.0
    rec.plan = FaultPlan(nodes=2, duration=16, kills=(Kill(5, 1, 3),), partitions=(Partition(2, 4, (0,), (1,)),))
    fig = compute(rec)
    assert fig["baseline_goodput"]["stalled_s"] == 2.0 + 7.0  # the partition, then the kill until 1016
    rec.meta.t_plan = None  # a run recorded before the plan's start was kept: its plan counted from the launch
    assert compute(rec)["baseline_goodput"]["stalled_s"] == 7.0


def test_a_round_published_by_a_stop_counts_in_goodput_but_adds_no_training_time() -> None:
    """The supervisor reads `/status` while the nodes stop (after `t_end`): node 0 published there the round
    its stop cut short (2 more contributed seconds, 20 more steps). Goodput counts those seconds, trained
    before the stop; the pace (overlap, throughput) still ends at the last sample before `t_end`."""
    run = record(solo={"steps_per_second": [10.0, 10.0]})
    n0 = dict(started=1001, first=1005)
    run.samples.append({"t": 1021.5, "node": 0, "inc": 0,
                        "status": status("training", 15, 150, 7000, **n0, ledger="L3", params="P3")})
    fig = compute(run)
    assert fig["run"]["window_s"] == 16.0
    assert fig["goodput"]["per_node"] == [14 / 16, 0.4375]
    assert fig["goodput"]["published_at_stop_s"] == 2.0 and fig["goodput"]["published_at_stop_nodes"] == 1
    assert compute(record())["goodput"]["published_at_stop_s"] == 0.0
    assert fig["overlap"]["network_steps_per_s"]["0"] == 7.5, "120 steps in 16 s, as without the stop's sample"
    comm = fig["communication"]  # the stop's update: its bytes and its steps
    assert comm["bytes_sent"] == 7000 + 1750 + 2000 and comm["inner_steps"] == 150 + 35 + 40


def test_updates_that_missed_their_slot_are_counted_per_node_without_the_nodes_own() -> None:
    rec = record()
    last = {(row["node"], row["inc"]): row for row in rec.samples if "status" in row}  # each process's last sample
    outcomes = {(0, 0): ({"applied-open": 10, "folded-late": 3, "held-future": 1}, 5),  # 6 of its peers' in time
                (1, 0): ({"applied-open": 4, "applied-stale": 1}, 2),  # 2 in time, 1 late
                (1, 1): ({"applied-open": 3, "folded-late": 1}, 1)}  # 2 in time, 1 late
    for key, (counts, published) in outcomes.items():
        last[key]["status"].update(ledger_outcomes=counts, updates_published=published)
    slots = compute(rec)["slots"]
    assert slots["late_share_per_node"] == {"0": round(3 / 9, 4), "1": round(2 / 6, 4)}
    assert (slots["late"], slots["peer_updates"], slots["late_share"]) == (5, 15, round(5 / 15, 4))
    md = to_markdown(compute(rec))
    assert "| updates that missed their slot | 33% | " in md and "(5 of 15; node 0: 33%, node 1: 33%)" in md
    assert "| updates that missed their slot | n/a |" in to_markdown(compute(record()))


def test_forked_states_adopted_and_refused_are_summed_per_node_over_its_processes() -> None:
    rec = record()
    last = {(row["node"], row["inc"]): row for row in rec.samples if "status" in row}
    outcomes = {(0, 0): {"applied-open": 5, "fork-refused": 1},  # refused a forged state
                (1, 0): {"applied-open": 2, "fork-adopted": 1},  # took the heavier side of a fork
                (1, 1): {"applied-open": 3, "fork-adopted": 1, "fork-refused": 2}}
    for key, counts in outcomes.items():
        last[key]["status"].update(ledger_outcomes=counts)
    forks = compute(rec)["forks"]
    assert forks == {"adopted": {"0": 0, "1": 2}, "refused": {"0": 1, "1": 2}}
    md = to_markdown(compute(rec))
    assert "| forked states adopted / refused | 2 / 3 | " in md and "node 0: 0 / 1, node 1: 2 / 2 |" in md
    assert "| forked states adopted / refused | n/a |" in to_markdown(compute(record()))


def test_a_hostile_nodes_tokens_are_not_the_runs_progress_at_equal_tokens() -> None:
    """The hostile-peer comparison pairs evaluations at the honest nodes' tokens: node 1 misbehaving, node 0's
    evaluations sit at its own tokens, not at both nodes' together."""
    from testnet.bench import _last_eval_tokens
    from testnet.quality import bpb_near_tokens, honest_token_points

    r = record()
    hostile = dataclasses.replace(r, plan=dataclasses.replace(r.plan, misbehave=((1, "poison:negate"),)))
    fig = compute(hostile)
    assert fig["run"]["honest_nodes"] == [0]
    # node 0 evaluated at 1010 (all nodes 5000 + 3500 tokens, node 0 alone 5000) and at 1020 (13000 + 3500 + 4000
    # of node 1's two processes; 13000)
    assert [p[0] for p in fig["curves"]["nodes"]["0"]] == [8500, 20500]
    assert honest_token_points(fig)["0"] == [[5000, 10.0, 4.0], [13000, 20.0, 3.0]]
    assert _last_eval_tokens(fig) == 13000
    assert bpb_near_tokens(fig, 13000) == 3.0 and bpb_near_tokens(fig, 6000, width=0.5) == 4.0
    del fig["curves"]["honest_tokens"]  # a report written before: all nodes' tokens
    assert honest_token_points(fig)["0"][1][0] == 20500
