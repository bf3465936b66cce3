"""Restarts that hurt the model: did a never-killed node's held-out loss jump after a restart?

For every restart (a process started after its node's previous process was killed,
`Timeline.restarts`), each *observer*, an honest node never killed in the run, has the held-out
evaluations of a window after the restart compared each with the one before it (the first with the last
evaluation before the restart). One more than `threshold` (5%) above its predecessor is a *loss jump
after restart*. The window runs from the restart (the new process's launch) through the observer's
`evals_after`-th evaluation made after the restarted process first published an update
(`first_update_at`; its launch if it never published): a bad rejoin reaches the other nodes through the
state it serves or the updates it publishes, so its harm shows a round or two after the join, not at the
launch. Windows of restarts close together overlap; a jump inside two windows is listed under both and
counted once.

`loss_after_restarts` is pure (a `Timeline` in, a JSON-ready dict out; times are seconds since launch);
`banner` is the sentence the report and `diloco-testnet` lead with when the loss rose.
"""

from __future__ import annotations

import bisect
from typing import Any

from testnet.timeline import Incarnation, Timeline

__all__ = ["THRESHOLD", "banner", "loss_after_restarts"]

THRESHOLD = 0.05


def _window(points: list[tuple[float, float]], at: float, anchor: float, evals_after: int) -> range:
    """Indices of `points` (by time) after `at`, through the `evals_after`-th one after `anchor`."""
    first = bisect.bisect_right([t for t, _ in points], at)
    end, after = first, 0
    while end < len(points) and after < evals_after:
        after += points[end][0] > anchor
        end += 1
    return range(first, end)


def _joined(inc: Incarnation) -> float | None:
    first = inc.last.get("first_update_at")
    return float(first) if isinstance(first, (int, float)) and not isinstance(first, bool) else None


def loss_after_restarts(tl: Timeline, observers: list[int], threshold: float = THRESHOLD,
                        evals_after: int = 2) -> dict[str, Any]:
    """The restart section of the report (module doc). `loss_rose` is None (n/a) without a restart or
    without any evaluation of an observer to compare in a window; otherwise whether any jump was found."""
    t0 = tl.t_launch
    evals = {node: tl.eval_points(node) for node in observers}
    rows, compared, jumps = [], set(), {}
    for inc in tl.restarts():
        at, joined = tl.started(inc), _joined(inc)
        found = []
        for node in observers:
            points = evals[node]
            for i in _window(points, at, max(at, joined or at), evals_after):
                if i == 0:
                    continue  # nothing before it to compare with
                (t, after), before = points[i], points[i - 1][1]
                compared.add((node, t))
                rise = after / before - 1
                if rise > threshold:
                    jump = {"node": node, "at_s": round(t - t0, 2), "before": round(before, 4),
                            "after": round(after, 4), "rise": round(rise, 4)}
                    found.append(jump)
                    jumps.setdefault((node, t), jump | {"restart_node": inc.node, "restart_at_s": round(at - t0, 2)})
        rows.append({"node": inc.node, "process": inc.inc, "at_s": round(at - t0, 2),
                     "joined_at_s": None if joined is None else round(joined - t0, 2), "jumps": found})
    worst = max(jumps.values(), key=lambda j: j["rise"], default=None)
    note = ("no restart" if not rows else "no never-killed honest node" if not observers
            else "no evaluation of a never-killed node to compare around a restart" if not compared else None)
    return {"threshold": threshold, "evals_after_join": evals_after, "observers": list(observers),
            "restarts": rows, "evaluations_compared": len(compared), "jumps": len(jumps),
            "restarts_with_jumps": sum(bool(r["jumps"]) for r in rows), "worst": worst,
            "loss_rose": None if note else bool(jumps), "note": note}


def banner(section: dict[str, Any]) -> str | None:
    """One sentence when the loss of a never-killed node jumped after a restart; None otherwise."""
    worst = section["worst"]
    if not section["loss_rose"] or worst is None:
        return None
    return (f"Held-out loss rose after restarts: {section['jumps']} evaluation(s) of never-killed nodes more than "
            f"{section['threshold']:.0%} above the previous one, after {section['restarts_with_jumps']} of "
            f"{len(section['restarts'])} restarts; worst: node {worst['node']} {worst['before']:.3f} -> "
            f"{worst['after']:.3f} bpb (+{worst['rise']:.1%}) at {worst['at_s']:.0f} s, after node "
            f"{worst['restart_node']} restarted at {worst['restart_at_s']:.0f} s.")
