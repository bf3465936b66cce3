"""Tier (a): the report watches the model. Loss jumps after restarts, the held-out loss against
data-parallel (modelled under the run's failures) at equal wall time and at equal tokens, and what
`testnet.bench goodput` prints of them, on the hand-made run of `test_report` (node 0 never killed;
node 1 killed at 1009, its next process launched at 1012, first update at 1018; all train from 1004).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report import record

from testnet import bench
from testnet.faults import FaultPlan
from testnet.quality import at_equal_wall_time, dp_bpb_at, dp_work_at, interpolate
from testnet.record import RunRecord
from testnet.report import alerts, compute, to_markdown, write_report

BASE = {"points": [[0, 0, 8.0], [100, 20000, 3.5]]}
SOLO = {"steps_per_second": [10.0]}


def with_evals(rec: RunRecord, node: int, evals: list) -> RunRecord:
    """`rec` with `node`'s eval history (in its last sample) replaced by `evals`."""
    last = max((row for row in rec.samples if row["node"] == node and "status" in row), key=lambda row: row["t"])
    last["status"]["eval_history"] = evals
    return rec


def without_restart(rec: RunRecord) -> RunRecord:
    rec.plan = FaultPlan(nodes=2, duration=20)
    rec.events = [e for e in rec.events if e["event"] == "launch" and e["inc"] == 0]
    rec.samples = [row for row in rec.samples if row["inc"] == 0]
    return rec


def write_run(run_dir: Path, rec: RunRecord) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps(rec.meta.to_dict()))
    (run_dir / "plan.json").write_text(json.dumps(rec.plan.to_dict()))
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in rec.events))
    (run_dir / "status.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rec.samples))
    if rec.baseline is not None:
        (run_dir / "baseline.json").write_text(json.dumps(rec.baseline))
    if rec.solo is not None:
        (run_dir / "solo.json").write_text(json.dumps(rec.solo))
    return run_dir


def jumping() -> RunRecord:
    """Node 0's loss rises 14.8% at 1020, two seconds after the restarted process's first update."""
    return with_evals(record(baseline=BASE, solo=SOLO), 0, [[5000, 1010, 3.0], [9000, 1015, 3.05], [13000, 1020, 3.5]])


def test_a_jump_after_a_restart_is_flagged_and_leads_the_report() -> None:
    fig = compute(jumping())
    section = fig["loss_after_restarts"]
    assert section["observers"] == [0] and section["loss_rose"] is True and section["note"] is None
    assert section["evaluations_compared"] == 2 and section["jumps"] == 1 and section["restarts_with_jumps"] == 1
    jump = {"node": 0, "at_s": 20.0, "before": 3.05, "after": 3.5, "rise": pytest.approx(3.5 / 3.05 - 1, abs=1e-4)}
    assert section["restarts"] == [{"node": 1, "process": 1, "at_s": 12.0, "joined_at_s": 18.0, "jumps": [jump]}]
    assert section["worst"] == jump | {"restart_node": 1, "restart_at_s": 12.0}
    md = to_markdown(fig)
    lines = md.splitlines()
    assert lines[0].startswith("# Testnet report") and lines[2] == f"**{alerts(fig)[0]}**"
    assert lines[2].startswith("**Held-out loss rose after restarts: 1 evaluation(s) of never-killed nodes more than "
                               "5% above the previous one, after 1 of 1 restarts; worst: node 0 3.050 -> 3.500 bpb "
                               "(+14.8%) at 20 s, after node 1 restarted at 12 s.")
    assert "| loss jump after restart | YES (1) | a never-killed node's held-out loss more than 5% above its previous " \
        "evaluation soon after a restart; 1 of 1 restarts followed by one" in md
    assert "| 1 | 1 | 12.0 | 18.0 | node 0 at 20 s: 3.050 -> 3.500 (+14.8%) |" in md


def test_only_the_window_after_a_restart_and_never_killed_nodes_count() -> None:
    # node 0: two evaluations after the first update at 1018 (1019, 1019.5) close the window; the rise at
    # 1020 comes after it. Node 1 (killed, restarted) rises too, but it is no observer.
    rec = with_evals(record(), 0, [[5000, 1010, 3.0], [9000, 1019, 2.9], [9500, 1019.5, 2.8], [13000, 1020, 3.5]])
    rec = with_evals(rec, 1, [[4000, 1019, 9.0]])
    section = compute(rec)["loss_after_restarts"]
    assert section["evaluations_compared"] == 2 and section["jumps"] == 0 and section["loss_rose"] is False


def test_a_run_without_jumps_has_no_flag() -> None:
    fig = compute(record(baseline=BASE))
    section = fig["loss_after_restarts"]
    assert section["loss_rose"] is False and section["jumps"] == 0 and section["worst"] is None
    assert section["evaluations_compared"] == 1  # node 0's 3.0 at 1020 against its 4.0 at 1010
    md = to_markdown(fig)
    assert alerts(fig) == [] and "Held-out loss rose" not in md
    assert md.splitlines()[4] == "| figure | value | what it means |"
    assert "| loss jump after restart | none | " in md and "; 0 of 1 restarts followed by one" in md


def test_zero_restarts_read_not_applicable() -> None:
    fig = compute(without_restart(record(baseline=BASE)))
    section = fig["loss_after_restarts"]
    assert section["restarts"] == [] and section["loss_rose"] is None and section["note"] == "no restart"
    assert json.loads(json.dumps(fig))["loss_after_restarts"]["loss_rose"] is None  # null in report.json
    md = to_markdown(fig)
    assert "| loss jump after restart | n/a | " in md and "soon after a restart; no restart |" in md
    assert "| restarted node |" not in md
    assert alerts(fig) == [] and fig["curves"]["restarts"] == []


def test_restarts_without_a_never_killed_observer_read_not_applicable() -> None:
    rec = record()
    rec.events.append({"t": 1015.0, "node": 0, "inc": 0, "event": "kill", "pid": 3})
    section = compute(rec)["loss_after_restarts"]
    assert section["observers"] == [] and section["loss_rose"] is None
    assert section["note"] == "no never-killed honest node"


def test_modelled_data_parallel_by_hand() -> None:
    points = [[0, 0, 8.0], [10, 1000, 4.0]]
    stalls = [(102.0, 104.0)]  # start 100, a step every 0.5 s
    assert dp_work_at(101, 100, stalls) == 1 and dp_work_at(103, 100, stalls) == 2 and dp_work_at(105, 100, stalls) == 3
    assert dp_bpb_at(101, points, 100, stalls, 0.5) == pytest.approx(8.0 - 4.0 * 2 / 10)  # step 2
    assert dp_bpb_at(103, points, 100, stalls, 0.5) == pytest.approx(8.0 - 4.0 * 4 / 10)  # stalled since step 4
    assert dp_bpb_at(105, points, 100, stalls, 0.5) == pytest.approx(8.0 - 4.0 * 6 / 10)  # 5 s less the 2 s stall
    assert dp_bpb_at(99, points, 100, stalls, 0.5) == 8.0  # nothing trained before the start
    assert dp_bpb_at(108, points, 100, stalls, 0.5) is None  # step 12: past the baseline's last point
    cmp = at_equal_wall_time([(105, 4.8), (108, 4.0)], points, start=100, stalls=stalls, step_s=0.5)
    assert cmp["evaluations"] == 1 and cmp["left_out"] == 1
    assert cmp["ratio"] == pytest.approx(4.8 / 5.6) and cmp["dp_same_failures_bpb"] == pytest.approx(5.6)
    assert at_equal_wall_time([(105, 4.8)], points, start=100, stalls=stalls, step_s=None)["ratio"] is None
    assert interpolate(5, [0, 10], [1, 3]) == 2 and interpolate(10, [0, 10], [1, 3]) == 3
    assert interpolate(11, [0, 10], [1, 3]) is None and interpolate(0, [], []) is None


def test_report_compares_with_data_parallel_at_equal_wall_time_and_tokens() -> None:
    fig = compute(record(baseline=BASE, solo=SOLO))
    wall, tokens = fig["quality"]["at_equal_wall_time"], fig["quality"]["at_equal_tokens"]
    # the last 20% of the run: node 1's 3.2 at 1019 and node 0's 3.0 at 1020. Data-parallel starts at
    # 1004 and stalls 1009..1016; by 1019 it worked 15 - 7 = 8 s, by 1020 9 s, one step per
    # 1 / mean(7.5, 60/9) s (the nodes' step rate): steps 56.67 and 63.75 on the baseline's 8.0 -> 3.5 line
    step_s = 1 / ((7.5 + 60 / 9) / 2)
    dp = [8.0 - 4.5 * (8 / step_s) / 100, 8.0 - 4.5 * (9 / step_s) / 100]
    assert wall["from_s"] == 16.0 and wall["evaluations"] == 2 and wall["left_out"] == 0
    assert wall["nodes_bpb"] == pytest.approx(3.1)
    assert wall["dp_same_failures_bpb"] == pytest.approx(sum(dp) / 2, abs=1e-4)
    assert wall["ratio"] == pytest.approx(3.1 / (sum(dp) / 2), abs=1e-4) and wall["basis"].startswith("model, not run")
    # equal tokens: every honest node has evaluations up to 9,500 tokens (node 1 at 1019); the window
    # 7,600..9,500 holds node 0's 4.0 at 8,500 and node 1's 3.2 at 9,500, the baseline there 6.0875 and 5.8625
    assert (tokens["tokens_from"], tokens["tokens_to"], tokens["evaluations"]) == (7600, 9500, 2)
    assert tokens["nodes_bpb"] == pytest.approx(3.6) and tokens["dp_bpb"] == pytest.approx(5.975)
    assert tokens["ratio"] == pytest.approx(3.6 / 5.975, abs=1e-4)
    md = to_markdown(fig)
    assert "| held-out bpb ÷ data-parallel, same failures, equal wall time | 0.586 (modelled) |" in md
    assert "| held-out bpb ÷ data-parallel, equal tokens | 0.603 |" in md
    assert fig["curves"]["restarts"] == [[8500.0, 12.0, 1]] and fig["curves"]["duration_s"] == 20.0
    # the modelled curve for loss.png: from the start (4 s), 5 s of work to the kill (9 s), flat through the
    # stall to 16 s, then the rest of the baseline's 100 steps
    flat = 8.0 - 4.5 * (5 / step_s) / 100
    assert fig["curves"]["dp_same_failures"] == [[4.0, 8.0], [9.0, pytest.approx(flat, abs=1e-4)],
                                                 [16.0, pytest.approx(flat, abs=1e-4)],
                                                 [pytest.approx(16 + 100 * step_s - 5, abs=1e-3), 3.5]]


def test_without_a_baseline_the_comparisons_read_not_applicable() -> None:
    fig = compute(record())
    assert fig["quality"]["at_equal_wall_time"]["ratio"] is None and fig["quality"]["at_equal_tokens"]["ratio"] is None
    md = to_markdown(fig)
    assert "| held-out bpb ÷ data-parallel, same failures, equal wall time | n/a |" in md
    assert "| held-out bpb ÷ data-parallel, equal tokens | n/a |" in md


@pytest.mark.slow
def test_loss_png_with_restarts_and_jumps(tmp_path: Path) -> None:
    fig = write_report(write_run(tmp_path / "run", jumping()))
    assert fig["loss_after_restarts"]["loss_rose"] is True
    assert (tmp_path / "run" / "report.md").read_text().splitlines()[2].startswith("**Held-out loss rose")
    assert (tmp_path / "run" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_bench_goodput_prints_the_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    faults = write_run(tmp_path / "faults", jumping())
    clean = write_run(tmp_path / "clean", without_restart(record(baseline=BASE, solo=SOLO)))
    assert bench.main(["goodput", "--from-runs", str(faults), str(clean)]) == 0
    out = capsys.readouterr().out
    assert "Held-out loss rose after restarts: 1 evaluation(s)" in out
    lines = out.split("targets:\n")[1].splitlines()
    assert len(lines) == 5
    # equal tokens: node 0's 3.0 and 3.05 at 8,500 tokens and node 1's 3.2 at 9,500 against the baseline's
    # 6.0875 (twice) and 5.8625; equal wall time: (3.5 + 3.2) / 2 against the model's 5.2906 (test above)
    assert lines[0].split()[-2:] == ["0.5128", "met"] and "equal tokens <= 1.08" in lines[0]
    assert lines[1].split()[-2:] == ["0.6332", "met"] and "below data-parallel, same kills, equal wall time" in lines[1]
    assert lines[2].split()[-3:] == ["0.5938", "NOT", "met"] and "goodput >= 0.85" in lines[2]
    assert lines[3].split()[-4:] == ["1", "jumps", "NOT", "met"] and "after a restart" in lines[3]
    assert lines[4].split()[-3:] == ["1.06x", "NOT", "met"]
    # the run without kills has only node 0's 3.0 at 1020 in its last 20%; with kills (3.5 + 3.2) / 2
    assert "without kills (run " in out
    assert "held-out bpb at equal wall time (mean of the last 20% of each run): kills 3.3500, no kills 3.0000 -> " \
           "ratio 1.1167" in out


def test_bench_goodput_refuses_a_bad_slow_node(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        bench.main(["goodput", "--nodes", "3", "--slow", "3:4"])
    assert e.value.code == 2 and "--slow" in capsys.readouterr().err
