"""Tier (a): the report tells the story. Its opening sentences, a baseline that was skipped or stopped
half-way, `loss.png`'s legend and clipped axes, and the baseline's progress lines, on the hand-made run
of `test_report` (2 nodes, node 1 killed at 1009 and back at 1016; all train from 1004)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_report import record
from test_report_loss import BASE, SOLO, without_restart, write_run

from testnet.baseline_run import BaselineProgress
from testnet.plot import clipped_top, gap_curves, plot_loss, tick_step
from testnet.report import compute, write_report
from testnet.report_md import summary, to_markdown


def test_the_opening_says_what_ran_what_the_figures_mean_and_whether_the_promise_held() -> None:
    fig = compute(without_restart(record(baseline=BASE, solo=SOLO)))
    what, loss, promise = summary(fig)
    assert what.startswith("2 nodes trained the `tiny` model (1,000 parameters) for 20 s on this machine with no "
                           "faults, exchanging compressed updates every 10 local steps; then a synchronous "
                           "data-parallel baseline")
    tokens = fig["quality"]["at_equal_tokens"]
    assert f"ended {tokens['ratio']:.3f}x data-parallel's at equal tokens" in loss
    assert f"goodput, the share of the nodes' time spent on training that counted, was {fig['goodput']['value']:.3f}" \
        in loss
    # the node's loss (3.0) is below data-parallel's there: the promise on the loss held; the digests agree
    assert tokens["ratio"] < 1.05 and fig["agreement"]["ok"] is True
    assert promise == ("The method promises a held-out loss within 5% of data-parallel's at equal tokens and every "
                       "replica holding the same model: this run kept it.")
    assert to_markdown(fig).splitlines()[2] == " ".join(summary(fig))


def test_a_missed_promise_is_named_with_its_figure() -> None:
    fig = compute(record(baseline={"points": [[0, 0, 4.0], [100, 20000, 2.0]]}, solo=SOLO))
    assert fig["run"]["faults"] == ["1 kill and restart"]
    ratio = fig["quality"]["at_equal_tokens"]["ratio"]
    assert ratio > 1.05
    promise = summary(fig)[2]
    assert "and more goodput than data-parallel under the same faults (modelled): this run missed the loss " \
           f"({ratio:.3f} > 1.05) but kept the agreement and the goodput (1.06x data-parallel's)." in promise


def test_without_a_baseline_the_loss_promise_is_not_applicable() -> None:
    rec = record()
    rec.meta.extra["options"] = {"baseline": False}
    fig = compute(rec)
    assert fig["baseline_run"]["state"] == "skipped"
    what, loss, promise = summary(fig)
    assert what.endswith("; no data-parallel baseline ran (--no-baseline).")
    assert "with no data-parallel figure to compare it to" in loss
    assert promise.endswith("kept the agreement and the goodput (1.06x data-parallel's); the loss: n/a (not measured).")
    assert "| held-out bpb ÷ data-parallel, equal tokens | n/a |" in to_markdown(fig)


def test_a_baseline_stopped_half_way_counts_as_far_as_it_trained() -> None:
    partial = {"points": [[0, 0, 8.0], [40, 8000, 5.0]], "steps": 100, "finished": False}
    fig = compute(record(baseline=partial))
    assert fig["baseline_run"] == {"state": "interrupted", "steps": 100, "steps_done": 40, "tokens": 8000}
    md = to_markdown(fig)
    assert "**Interrupted** during the data-parallel baseline" in md
    assert "was stopped at step 40 of 100" in md
    # the nodes' late evaluations are past the 8,000 tokens it reached: nothing to pair, n/a, not a value
    assert fig["quality"]["at_equal_tokens"]["ratio"] is None
    assert "| held-out bpb ÷ data-parallel, equal tokens | n/a |" in md and "(baseline interrupted)" in md
    assert compute(record(baseline=BASE))["baseline_run"]["state"] == "measured"  # an older file, no `finished`


def test_clipped_axis_and_the_gap() -> None:
    curve = [(0, 8.0), (10, 4.0), (20, 3.0), (100, 2.0)]
    assert clipped_top([curve]) == pytest.approx(3.0 * 1.04), "the highest point past 15% of the x range"
    assert clipped_top([]) is None
    curves = {"nodes": {"0": [[0, 1, 8.0], [10000, 5, 5.0], [30000, 9, 3.0]]},
              "baseline": [[0, None, None, 8.0], [20000, None, None, 4.0]]}
    assert gap_curves(curves) == {"0": [(0, 1.0), (10000, pytest.approx(5.0 / 6.0))]}, "none past the baseline"


@pytest.mark.slow
def test_loss_png_legend_has_every_curve_once_and_names_the_models(tmp_path: Path) -> None:
    faults = write_report(write_run(tmp_path / "faults", record(baseline=BASE, solo=SOLO)))
    labels = plot_loss(faults["curves"], tmp_path / "a.png", title="t")
    assert labels["tokens"] == ["node 0", "node 1", "data-parallel (measured)", "restart"]
    assert labels["time"] == ["node 0", "node 1", "data-parallel, no failures (modelled)",
                              "data-parallel, same failures (modelled)", "restart"]
    assert labels["gap"][-3:] == ["data-parallel (= 1)", "the method's promise (1.05)", "restart"]
    clean = compute(without_restart(record(baseline=BASE, solo=SOLO)))
    labels = plot_loss(clean["curves"], tmp_path / "b.png")
    # nothing stalled data-parallel: its two models are the same curve, drawn and listed once
    assert labels["time"] == ["node 0", "node 1", "data-parallel (modelled: its measured curve\nat the nodes' pace; "
                                                   "no failure stalled it)"]
    labels = plot_loss(compute(record())["curves"], tmp_path / "c.png")
    assert labels["gap"] == ["restart"] and (tmp_path / "c.png").stat().st_size > 10_000


def test_loss_png_draws_a_run_whose_loss_went_to_thousands(tmp_path: Path) -> None:
    """A run wrecked by a hostile peer (measured: 8,767 bits per byte) still gets its plot and report."""
    assert [tick_step(span) for span in (0.3, 3.0, 40.0, 8767.0)] == [0.05, 0.5, 5.0, 2000.0]
    fig = compute(record())
    for node in fig["curves"]["nodes"].values():
        node[-1] = [node[-1][0], node[-1][1], 8767.0]
    plot_loss(fig["curves"], tmp_path / "wrecked.png")
    assert (tmp_path / "wrecked.png").stat().st_size > 10_000


def test_baseline_progress_lines() -> None:
    said, now = [], [100.0]
    progress = BaselineProgress(1000, said.append, every=10.0, clock=lambda: now[0])
    feed = [(130.0, "data-parallel baseline: 3 workers x batch 16, 1000 steps"), (130.0, "step 0 tokens 0 bpb 7.7576"),
            (134.0, "step 100 tokens 307200 bpb 4.1000"), (140.0, "step 250 tokens 768000 bpb 3.5000"),
            (141.0, "step 275 tokens 844800 bpb 3.4000"), (150.0, "step 500 tokens 1536000 bpb 3.0000"),
            (151.0, "step 1000 tokens 3072000 bpb 2.5000")]
    for t, line in feed:
        now[0] = t
        progress.line(line)
    assert said == [
        "data-parallel baseline: step 0/1,000 (0%), 0 tokens, held-out bpb 7.758, 30 s",
        "data-parallel baseline: step 250/1,000 (25%), 768,000 tokens, held-out bpb 3.500, 40 s, about 30 s left",
        "data-parallel baseline: step 500/1,000 (50%), 1,536,000 tokens, held-out bpb 3.000, 50 s, about 20 s left",
        "data-parallel baseline: step 1,000/1,000 (100%), 3,072,000 tokens, held-out bpb 2.500, 51 s",
    ]
