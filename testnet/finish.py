"""How a `diloco-testnet` run ends, however it ends: the verdict on the records, the report, and what is
printed; after Ctrl-C (or SIGTERM) at any stage, the report of what ran.

`Stage` is where a run is: `run_testnet` moves it along (`solo`, `nodes`, `baseline`, `report`) and `main`
reads it after an interrupt, once every process was stopped, to write the report of what ran
(`interrupted_report`): the nodes' figures up to the stop, the baseline's as far as it trained
(`baseline.json` is rewritten after each of its evaluations), "n/a" for what did not happen.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testnet.nodes import NodeSpec
from testnet.outcome import RunFailed, assess
from testnet.record import load_run
from testnet.report import alerts, to_markdown, write_report
from testnet.timeline import Timeline

__all__ = ["Stage", "final_report", "interrupted_report", "verdict"]


@dataclasses.dataclass
class Stage:
    """Where a run is: its directory once made, and the stage it is in."""

    run_dir: Path | None = None
    name: str = "checks"


def verdict(run_dir: Path, specs: list[NodeSpec]) -> list[str]:
    """Judge the recorded run (`testnet.outcome`): raise RunFailed, after writing the report of what
    there is, if it failed; otherwise return one warning per failed node (others trained on)."""
    outcome = assess(Timeline(load_run(run_dir)))
    details = outcome.describe(lambda node: specs[node].log_path)
    if outcome.failed:
        write_report(run_dir)
        raise RunFailed(f"run failed: {'; '.join(outcome.problems)}; records and a report marked failed in "
                        f"{run_dir}", run_dir, details)
    return details


def final_report(run_dir: Path, warnings: list[str], say: Callable[[str], None]) -> dict[str, Any]:
    """Write the report, print it, then the warnings and where everything is."""
    fig = write_report(run_dir)
    say(to_markdown(fig))
    for warning in warnings + alerts(fig):
        say(f"warning: {warning}")
    say(f"report: {run_dir / 'report.md'}, {run_dir / 'report.json'}, {run_dir / 'loss.png'}")
    checkpoints = run_dir / "checkpoints" / "node-0"
    say(f"the model: diloco-sample {checkpoints} (text), diloco-export {checkpoints} -o model.safetensors")
    return fig


def interrupted_report(stage: Stage, say: Callable[[str], None]) -> Path | None:
    """After an interrupt: write the report of what ran and say where it is; None (and say why) when
    the nodes had not started (nothing to report). Marks `run.json` with the stage it stopped in."""
    run_dir = stage.run_dir
    meta_path = None if run_dir is None else run_dir / "run.json"
    if meta_path is None or not meta_path.exists():
        say(f"interrupted during the {stage.name} stage, before the nodes ran: no report")
        return None
    meta = json.loads(meta_path.read_text())
    meta["extra"]["stopped_during"] = stage.name
    meta_path.write_text(json.dumps(meta, indent=1))
    try:
        fig = write_report(run_dir)
    except (FileNotFoundError, ValueError) as e:  # records cut short: say so, the records stay
        say(f"interrupted during the {stage.name} stage: no report ({e}); records in {run_dir}")
        return None
    say(to_markdown(fig))
    say(f"interrupted during the {stage.name} stage; report of what ran: {run_dir / 'report.md'}, "
        f"{run_dir / 'report.json'}, {run_dir / 'loss.png'}")
    return run_dir
