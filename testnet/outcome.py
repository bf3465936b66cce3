"""Did the run work? `assess` judges a recorded testnet run, purely (a `Timeline` in, a `RunOutcome`
out); `RunOutcome.describe` then quotes the failed nodes' logs for the user.

A node *failed* when its last process ended without being asked to: it exited by itself before
finishing its `--max-rounds` (the supervisor records `exit` with `expected: false`), or it did not come
back after a planned kill (its restart's `start-error`). Processes killed on purpose, nodes that
finished their rounds and nodes stopped at the end of the run have not failed.

The run *failed* when every node failed, or when no node trained (no tokens): its figures would be a
report of zeros. Some nodes failing while others train on is not a failed run, but it is reported.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testnet.procs import log_tail
from testnet.timeline import Timeline

__all__ = ["NodeFailure", "RunOutcome", "RunFailed", "assess"]

TAIL_LINES = 5  # lines of a failed node's log quoted in the verdict


@dataclasses.dataclass(frozen=True)
class NodeFailure:
    """Why node `node`'s last process (`process`) ended."""

    node: int
    process: int
    reason: str  # e.g. "exited by itself with status 2"


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """The verdict: the nodes that failed, and the tokens trained by all nodes together."""

    nodes: int
    tokens: int
    failures: tuple[NodeFailure, ...]

    @property
    def problems(self) -> list[str]:
        """Why the run failed; empty when it did not."""
        out = []
        if self.failures and len(self.failures) == self.nodes:
            out.append(f"every node failed ({self.nodes} of {self.nodes})")
        if self.tokens == 0:
            out.append("no node trained: no tokens reported")
        return out

    @property
    def failed(self) -> bool:
        return bool(self.problems)

    def describe(self, log_of: Callable[[int], Path]) -> list[str]:
        """One paragraph per failed node: its reason and the last lines of its log (`log_of(node)`)."""
        out = []
        for f in self.failures:
            tail = log_tail(log_of(f.node), TAIL_LINES) or "(empty)"
            out.append(f"node {f.node} (process {f.process}) {f.reason}; last lines of {log_of(f.node)}:\n"
                       + "\n".join("    " + line for line in tail.splitlines()))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"failed": self.failed, "problems": self.problems,
                "failed_nodes": [dataclasses.asdict(f) for f in self.failures]}


class RunFailed(RuntimeError):
    """The run went through but did not work (see `RunOutcome`): the message says why in one line,
    `details` has a paragraph per failed node (`RunOutcome.describe`); the records are in `run_dir`."""

    def __init__(self, message: str, run_dir: Path, details: list[str]) -> None:
        super().__init__(message)
        self.run_dir, self.details = run_dir, details


def _failure(tl: Timeline, node: int) -> NodeFailure | None:
    incs = tl.of(node)
    if not incs:
        return None
    last = incs[-1].inc
    events = [e for e in tl.record.events if e["node"] == node and e["inc"] == last]
    crash = next((e for e in events if e["event"] == "exit" and not e.get("expected")), None)
    if crash is None:
        return None
    start_error = next((e for e in events if e["event"] == "start-error"), None)
    if start_error is not None:
        error = str(start_error.get("error", "failed to start"))  # the NodeStartError's first line
        reason = error.removeprefix(f"node {node} (process {last}) ").partition("; last lines")[0]
        return NodeFailure(node, last, reason)
    return NodeFailure(node, last, f"exited by itself with status {crash.get('rc')}")


def assess(tl: Timeline) -> RunOutcome:
    """The verdict on a run (see module doc)."""
    failures = tuple(f for node in range(tl.meta.nodes) if (f := _failure(tl, node)) is not None)
    return RunOutcome(nodes=tl.meta.nodes, tokens=int(tl.total_at("tokens", tl.t_end)), failures=failures)
