"""The node's figures for an experiment tracker: one flat record after every round and at the end, handed to
a library user's callback (`diloco.run(task, on_metrics=...)`) and/or appended to `--metrics-file` as one
JSON object per line (what TensorBoard, Weights & Biases, MLflow or a spreadsheet can ingest as they are).
Off unless asked for.

A record: `time` (Unix seconds), `event` ("round", or "stopped" at the end), `round`, `slot`, `inner_steps`
and `tokens` (this process), `loss` (the round's mean training loss), `eval_loss` and `eval_slot` (the last
held-out figure and the slot of the global parameters it was taken of; null before the first), `metric`
(what the held-out figure is), `steps_per_second`, `tokens_per_second`, `bytes_sent`, `bytes_received`,
`peers`, `updates_applied`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["MetricsSink", "metrics_record"]

log = logging.getLogger("node.metrics")

Record = dict[str, Any]


def metrics_record(event: str, status: dict[str, Any], metric: str, tokens_per_step: int) -> Record:
    """The tracker's record from a `/status` object (`node.status.status_fields`)."""
    rate = status.get("steps_per_second")
    return {"time": time.time(), "event": event, "round": status["round"], "slot": status["slot"],
            "inner_steps": status["inner_steps"], "tokens": status["tokens"], "loss": status["loss"],
            "eval_loss": status["eval_loss"], "eval_slot": status.get("eval_slot"), "metric": metric,
            "steps_per_second": rate, "tokens_per_second": rate * tokens_per_step if rate is not None else None,
            "bytes_sent": status["bytes_sent"], "bytes_received": status["bytes_received"],
            "peers": len(status["peers"]), "updates_applied": status["updates_applied"]}


class MetricsSink:
    """Where records go: a callback (called in a worker thread: it may block, e.g. on a tracker's network
    call, without stalling gossip) and/or a JSON-lines file. A callback that raises is logged and switched
    off; a file that cannot be written is logged once per failure streak. Training goes on either way."""

    def __init__(self, callback: Callable[[Record], Any] | None = None, path: Path | None = None) -> None:
        self.callback, self.path = callback, path
        self._file_failing = False

    @property
    def active(self) -> bool:
        return self.callback is not None or self.path is not None

    def emit(self, record: Record) -> None:
        """Send one record (blocking: call from a worker thread)."""
        if self.path is not None:
            try:
                with self.path.open("a") as f:
                    f.write(json.dumps(record) + "\n")
                self._file_failing = False
            except OSError as exc:
                if not self._file_failing:
                    log.error("--metrics-file %s: %s; training goes on (logged once until it works)", self.path,
                              exc.strerror or exc)
                self._file_failing = True
        if self.callback is not None:
            try:
                self.callback(record)
            except Exception:  # noqa: BLE001 - the user's code: logged with its traceback, never fatal
                log.exception("the on_metrics callback raised: it is not called again in this process")
                self.callback = None
