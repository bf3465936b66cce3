"""What a testnet run leaves in its run directory, and how to read it back.

Files (all times are Unix seconds, like the node's `started_at`):
- `run.json`: `RunMeta` (settings, peer ids, launch and end times), written by the CLI.
- `plan.json`: the `FaultPlan`.
- `events.jsonl`: one object per supervisor event: `{"t", "node", "inc", "event", ...}` with `event`
  one of `launch`, `listening`, `ready`, `kill`, `exit`, `partition`, `heal`, `chaos-error`, `stop`,
  `start-error`. `inc` counts the node's processes (0 = first launch, 1 = first restart, ...).
- `status.jsonl`: one object per `/status` poll: `{"t", "node", "inc", "status": {...}}` or
  `{"t", "node", "inc", "error": "..."}`.
- `baseline.json`, `solo.json`: optional (see `testnet.baseline_run`, `testnet.cli`).
- `node-<i>.log`, `keys/`, `checkpoints/`: the nodes' own files.

`Recorder` appends and flushes one line per call (a crash loses at most the line being written);
`load_run` reads a directory back into a `RunRecord`, the only input of `testnet.report`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from testnet.faults import FaultPlan

__all__ = ["Recorder", "RunMeta", "RunRecord", "load_run"]


@dataclasses.dataclass
class RunMeta:
    """Settings and landmarks of one run (`run.json`)."""

    nodes: int
    model: str
    inner_steps: int
    peer_ids: list[str]
    t_launch: float = 0.0
    t_end: float = 0.0
    wan: str = "off"
    data: list[str] = dataclasses.field(default_factory=list)
    compression: str | None = None
    seed: int = 0
    interrupted: bool = False
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunMeta:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"run.json has unknown keys {sorted(unknown)}")
        return cls(**d)


class Recorder:
    """Appends events and status samples to the run directory's JSONL files."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self._events = open(run_dir / "events.jsonl", "a", encoding="utf-8")
        self._status = open(run_dir / "status.jsonl", "a", encoding="utf-8")

    def event(self, t: float, node: int, inc: int, event: str, **fields: Any) -> None:
        self._events.write(json.dumps({"t": t, "node": node, "inc": inc, "event": event, **fields}) + "\n")
        self._events.flush()

    def sample(self, t: float, node: int, inc: int, *, status: dict[str, Any] | None = None,
               error: str | None = None) -> None:
        row: dict[str, Any] = {"t": t, "node": node, "inc": inc}
        if status is not None:
            row["status"] = status
        else:
            row["error"] = error or "unknown error"
        self._status.write(json.dumps(row) + "\n")
        self._status.flush()

    def close(self) -> None:
        self._events.close()
        self._status.close()


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a crash of the testnet itself
            if n != len(lines):
                raise ValueError(f"{path}:{n} is not JSON") from None
    return rows


@dataclasses.dataclass
class RunRecord:
    """Everything the report needs from one run."""

    meta: RunMeta
    plan: FaultPlan
    events: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    baseline: dict[str, Any] | None = None
    solo: dict[str, Any] | None = None


def load_run(run_dir: Path) -> RunRecord:
    """Read a run directory (see module doc). Raises FileNotFoundError / ValueError if incomplete."""
    meta = RunMeta.from_dict(json.loads((run_dir / "run.json").read_text()))
    plan = FaultPlan.from_dict(json.loads((run_dir / "plan.json").read_text()))
    optional = {}
    for name in ("baseline", "solo"):
        path = run_dir / f"{name}.json"
        optional[name] = json.loads(path.read_text()) if path.exists() else None
    return RunRecord(meta, plan, _jsonl(run_dir / "events.jsonl"), _jsonl(run_dir / "status.jsonl"), **optional)
