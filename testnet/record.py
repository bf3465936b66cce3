"""What a testnet run leaves in its run directory, and how to read it back.

Files (all times are Unix seconds, like the node's `started_at`):
- `run.json`: `RunMeta` (settings, peer ids, launch and end times), written by the CLI.
- `plan.json`: the `FaultPlan`.
- `events.jsonl`: one object per supervisor event: `{"t", "node", "inc", "event", ...}` with `event`
  one of `launch`, `listening`, `ready`, `kill`, `exit`, `partition`, `heal`, `chaos-error`, `stop`,
  `start-error`. `inc` counts the node's processes (0 = first launch, 1 = first restart, ...).
- `status.jsonl`: one object per `/status` poll: `{"t", "node", "inc", "status": {...}}` or
  `{"t", "node", "inc", "error": "..."}`.
- `baseline.json`, `solo.json`: optional (see `testnet.baseline_run`, `testnet.run`).
- `node-<i>.log`, `keys/`, `checkpoints/`: the nodes' own files.

`Recorder` appends one line per call straight to the file (a crash loses at most the line being written; a
full disk loses nothing while lines can wait in memory, and is reported, not raised);
`load_run` reads a directory back into a `RunRecord`, the only input of `testnet.report`.
"""

from __future__ import annotations

import dataclasses
import json
import os
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
    t_plan: float | None = None  # Unix time the fault plan's clock started (None: at t_launch, older runs)
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


_WAITING_MAX = 64 << 20  # bytes of lines a full disk refused, kept to be written when space is back


class _Appender:
    """One JSONL file, appended a line at a time with `os.write` (nothing buffered in the process). A write
    the disk refuses (full, quota) does not raise: the line waits, and goes first at the next append, when
    there may be space again (the nodes' clean-up frees blobs); `error` says what happened, `lost` counts
    the lines dropped once `_WAITING_MAX` bytes wait."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._waiting = bytearray()
        self.error: str | None = None
        self.lost = 0

    def append(self, line: str) -> None:
        data = line.encode()
        if len(self._waiting) + len(data) > _WAITING_MAX:
            self.lost += 1
        else:
            self._waiting += data
        try:
            while self._waiting:
                del self._waiting[: os.write(self._fd, self._waiting)]
        except OSError as exc:
            self.error = f"{self.path.name}: {exc.strerror or exc}"

    def close(self) -> None:
        self.append("")  # a last try for the lines that wait
        if self._waiting:
            self.lost += self._waiting.count(b"\n")
        os.close(self._fd)


class Recorder:
    """Appends events and status samples to the run directory's JSONL files. A full disk does not stop
    the run: `problem()` says what could not be written."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self._events = _Appender(run_dir / "events.jsonl")
        self._status = _Appender(run_dir / "status.jsonl")

    def problem(self) -> str | None:
        """None, or what went wrong writing the records (the last error, and lines lost for good)."""
        errors = [f.error for f in (self._events, self._status) if f.error]
        if not errors:
            return None
        lost = self._events.lost + self._status.lost
        return "; ".join(errors) + (f"; {lost} line(s) lost" if lost else "; every line written once space was back")

    def event(self, t: float, node: int, inc: int, event: str, **fields: Any) -> None:
        self._events.append(json.dumps({"t": t, "node": node, "inc": inc, "event": event, **fields}) + "\n")

    def sample(self, t: float, node: int, inc: int, *, status: dict[str, Any] | None = None,
               error: str | None = None) -> None:
        row: dict[str, Any] = {"t": t, "node": node, "inc": inc}
        if status is not None:
            row["status"] = status
        else:
            row["error"] = error or "unknown error"
        self._status.append(json.dumps(row) + "\n")

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
