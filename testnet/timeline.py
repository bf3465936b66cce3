"""The recorded run as per-process series: the raw material of the report's figures.

A node's counters in `/status` (`tokens`, `inner_steps`, `bytes_sent`, `contributed_step_seconds`, ...)
count *per process*: they restart from zero when a killed node comes back. `Timeline` groups the good
status samples by (node, process) and answers time-based questions about them; everything is pure.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from testnet.faults import merge_intervals
from testnet.record import RunRecord

__all__ = ["Incarnation", "Timeline", "clip_length"]


def _num(status: dict[str, Any], key: str) -> float | None:
    value = status.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@dataclasses.dataclass
class Incarnation:
    """One process of one node: its good samples `[(t, status)]` in time order, and its supervisor events."""

    node: int
    inc: int
    samples: list[tuple[float, dict[str, Any]]]
    launched_at: float | None = None
    killed_at: float | None = None
    stopped: tuple[int, str, str] | None = None  # its STOPPED line: (slot, ledger digest, params digest)
    finished: bool = False  # it ended by itself after --max-rounds (drained), not by a signal
    # samples after this time were read while the run stopped (the supervisor's `t_end`): they carry what a
    # stop published, counted by `value`, but no training time, so `rate` ends before them
    stopping_from: float = float("inf")

    @property
    def last(self) -> dict[str, Any]:
        return self.samples[-1][1] if self.samples else {}

    def value(self, key: str) -> float:
        """The last reading of a cumulative counter (0 if never reported)."""
        for _, status in reversed(self.samples):
            v = _num(status, key)
            if v is not None:
                return v
        return 0.0

    def value_at(self, key: str, t: float) -> float:
        """The counter's last reading at or before `t` (0 before the first)."""
        out = 0.0
        for ts, status in self.samples:
            if ts > t:
                break
            v = _num(status, key)
            if v is not None:
                out = v
        return out

    @property
    def ready_at(self) -> float | None:
        """Time of the first sample in state `training`."""
        return next((t for t, s in self.samples if s.get("state") == "training"), None)

    def rate(self, key: str, since: float = float("-inf")) -> tuple[float, float]:
        """(increase of `key`, seconds) from the first `training` sample (at or after `since`) to the last
        before `stopping_from`."""
        samples = [(t, s) for t, s in self.samples if t <= self.stopping_from]
        start = next(((t, s) for t, s in samples if s.get("state") == "training" and t >= since), None)
        if start is None or len(samples) < 2:
            return 0.0, 0.0
        t_last, s_last = samples[-1]
        a, b = _num(start[1], key), _num(s_last, key)
        if a is None or b is None or t_last <= start[0]:
            return 0.0, 0.0
        return b - a, t_last - start[0]


class Timeline:
    """The run's samples and events grouped by process (see module doc)."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.meta, self.plan = record.meta, record.plan
        grouped: dict[tuple[int, int], list[tuple[float, dict[str, Any]]]] = defaultdict(list)
        for row in record.samples:
            if isinstance(row.get("status"), dict):
                grouped[(row["node"], row["inc"])].append((float(row["t"]), row["status"]))
        keys = set(grouped) | {(e["node"], e["inc"]) for e in record.events if e["event"] == "launch"}
        stopping_from = self.meta.t_end or float("inf")  # 0: the run's end was not recorded
        self.incs: dict[tuple[int, int], Incarnation] = {
            k: Incarnation(k[0], k[1], sorted(grouped.get(k, []), key=lambda x: x[0]), stopping_from=stopping_from)
            for k in sorted(keys)}
        for e in record.events:
            inc = self.incs.get((e["node"], e["inc"]))
            if inc is None:
                continue
            if e["event"] == "launch" and inc.launched_at is None:
                inc.launched_at = float(e["t"])
            elif e["event"] == "kill" and not e.get("skipped"):
                inc.killed_at = float(e["t"])
            elif e["event"] == "stopped":
                inc.stopped = (int(e["slot"]), str(e["ledger"]), str(e["params"]))
            elif e["event"] == "exit" and e.get("finished"):
                inc.finished = True

    def of(self, node: int) -> list[Incarnation]:
        return [inc for (n, _), inc in self.incs.items() if n == node]

    @property
    def t_launch(self) -> float:
        return self.meta.t_launch

    @property
    def t_end(self) -> float:
        return self.meta.t_end

    @property
    def t_plan(self) -> float:
        """Unix time the fault plan's clock started (the launch for runs recorded before it was kept)."""
        return self.meta.t_plan if self.meta.t_plan is not None else self.meta.t_launch

    def first_ready(self, node: int) -> float | None:
        times = [inc.ready_at for inc in self.of(node) if inc.ready_at is not None]
        return min(times) if times else None

    @property
    def t_ready(self) -> float | None:
        """When every node had reported `training` at least once (None if one never did)."""
        times = [self.first_ready(n) for n in range(self.meta.nodes)]
        return None if any(t is None for t in times) else max(times)  # type: ignore[type-var]

    def total_at(self, key: str, t: float, nodes: tuple[int, ...] | None = None) -> float:
        """Sum over processes (of `nodes`, default all) of `key`'s last reading at or before `t`."""
        return sum(inc.value_at(key, t) for inc in self.incs.values() if nodes is None or inc.node in nodes)

    def outages(self) -> list[tuple[float, float]]:
        """Per kill: (kill time, time the node's next process reported `training`, or the run's end)."""
        out = []
        for (node, i), inc in self.incs.items():
            if inc.killed_at is None:
                continue
            nxt = self.incs.get((node, i + 1))
            back = nxt.ready_at if nxt is not None and nxt.ready_at is not None else self.t_end
            out.append((inc.killed_at, back))
        return sorted(out)

    def restarts(self) -> list[Incarnation]:
        """The processes started after their node's previous process was killed, by start time
        (`started`)."""
        out = [inc for (node, i), inc in self.incs.items()
               if i > 0 and (prev := self.incs.get((node, i - 1))) is not None and prev.killed_at is not None]
        return sorted(out, key=self.started)

    def started(self, inc: Incarnation) -> float:
        """When a process started: its launch event, else its first sample, else the run's end."""
        if inc.launched_at is not None:
            return inc.launched_at
        return inc.samples[0][0] if inc.samples else self.t_end

    def partitions(self) -> list[tuple[float, float]]:
        return [(self.t_plan + p.start, self.t_plan + p.end) for p in self.plan.partitions]

    def eval_points(self, node: int) -> list[tuple[float, float]]:
        """Held-out `(wall_time, bits_per_byte)` of a node, all its processes, by time (deduplicated)."""
        points: dict[float, float] = {}
        for inc in self.of(node):
            history = inc.last.get("eval_history")
            if not isinstance(history, list):
                continue
            for entry in history:
                if isinstance(entry, list) and len(entry) == 3 and all(isinstance(x, (int, float)) for x in entry):
                    points[float(entry[1])] = float(entry[2])
        return sorted(points.items())


def clip_length(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Total length of the union of `intervals` inside `[start, end]`."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in merge_intervals(intervals))
