"""The declarative fault plan: which node is killed, slowed, partitioned or misbehaving, and when.

A `FaultPlan` is a pure value: built from the CLI flags and a seed by `make_plan`, printable
(`describe()`), serializable (`to_dict` / `from_dict`), and free of I/O and clocks, so the supervisor
(`testnet.supervisor`), the report (`testnet.report`), the discrete-event simulator
(`testnet.sim.faults.from_testnet_plan`) and the in-memory gossip network (`SimNet.follow`) all read the same
object. Times are seconds from the moment the plan's clock starts: in `diloco-testnet`, when every node first
trains if the plan has faults (`has_faults`), else when the testnet launches its nodes.

Contents:
- `kills`: `Kill(at, node, downtime)`: SIGKILL node `node` at `at`, restart it at `at + downtime`
  (same key, same checkpoint directory). A node is never killed while it is already down.
- `partitions`: `Partition(start, end, side_a, side_b)`: no traffic between the two sides in
  `[start, end)`.
- `slow`: node → factor (every inner step takes `factor` times as long, for the whole run).
- `misbehave`: node → mode (`garbage` or `bad-updates`), for the whole run.

Contract: `make_plan` is a function of its arguments only (same seed, same plan); every kill's restart
happens at least `settle` seconds before the end, so the run ends with every node up and a quiet period.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from node.settings import CHAOS_MODES as MISBEHAVE_MODES  # the node's --misbehave modes

__all__ = [
    "MISBEHAVE_MODES",
    "Action",
    "FaultPlan",
    "Kill",
    "Partition",
    "PlanError",
    "make_plan",
    "merge_intervals",
    "parse_misbehave",
    "parse_partition",
    "parse_slow",
]


class PlanError(ValueError):
    """A fault flag is malformed or inconsistent with the run (node out of range, overlapping times)."""


@dataclasses.dataclass(frozen=True, order=True)
class Kill:
    """SIGKILL `node` at `at` seconds; restart it `downtime` seconds later."""

    at: float
    node: int
    downtime: float

    @property
    def restart_at(self) -> float:
        return self.at + self.downtime


@dataclasses.dataclass(frozen=True, order=True)
class Partition:
    """No traffic between `side_a` and `side_b` during `[start, end)`."""

    start: float
    end: float
    side_a: tuple[int, ...]
    side_b: tuple[int, ...]

    def other_side(self, node: int) -> tuple[int, ...]:
        """The nodes `node` cannot reach during the partition (empty if it is on neither side)."""
        if node in self.side_a:
            return self.side_b
        if node in self.side_b:
            return self.side_a
        return ()


@dataclasses.dataclass(frozen=True, order=True)
class Action:
    """One step of the plan's timeline, as the supervisor executes it.

    `kind` is `kill`, `restart`, `partition` or `heal`; `node` is set for kill/restart, `partition`
    for partition/heal. Ordered by time, then kind (`_KIND_ORDER`: restarts before kills at the same
    instant, heals before partitions), then node.
    """

    at: float
    order: int
    kind: str
    node: int = -1
    partition: Partition | None = None


_KIND_ORDER = {"heal": 0, "restart": 1, "kill": 2, "partition": 3}


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of half-open intervals as a sorted list of disjoint ones (empty intervals dropped)."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    """Everything that will go wrong in a run of `nodes` nodes lasting `duration` seconds (see module doc)."""

    nodes: int
    duration: float
    seed: int = 0
    kills: tuple[Kill, ...] = ()
    partitions: tuple[Partition, ...] = ()
    slow: tuple[tuple[int, float], ...] = ()
    misbehave: tuple[tuple[int, str], ...] = ()

    def __post_init__(self) -> None:
        if self.nodes < 1 or not self.duration > 0:
            raise PlanError(f"need nodes >= 1 and duration > 0, got {self.nodes} nodes, {self.duration} s")
        for kill in self.kills:
            self._check_node(kill.node, "kill")
            if kill.at < 0 or kill.downtime < 0 or kill.restart_at > self.duration:
                raise PlanError(f"kill of node {kill.node} at {kill.at:g} s with downtime {kill.downtime:g} s "
                                f"does not fit in the run's {self.duration:g} s")
        for node in range(self.nodes):
            downs = sorted((k.at, k.restart_at) for k in self.kills if k.node == node)
            for (_, end), (start, _) in zip(downs, downs[1:]):
                if start < end:
                    raise PlanError(f"node {node} is killed at {start:g} s while still down (until {end:g} s)")
        for part in self.partitions:
            for node in part.side_a + part.side_b:
                self._check_node(node, "--partition")
            if set(part.side_a) & set(part.side_b) or not part.side_a or not part.side_b:
                raise PlanError(f"--partition sides must be disjoint and non-empty: {part.side_a} / {part.side_b}")
            if not 0 <= part.start < part.end <= self.duration:
                raise PlanError(f"--partition [{part.start:g}, {part.end:g}) s must lie in the run, "
                                f"[0, {self.duration:g}) s")
        for node, factor in self.slow:
            self._check_node(node, "--slow")
            if not factor >= 1:
                raise PlanError(f"--slow factor of node {node} must be >= 1, got {factor:g}")
        for node, mode in self.misbehave:
            self._check_node(node, "--misbehave")
            if mode not in MISBEHAVE_MODES:
                raise PlanError(f"--misbehave mode must be one of {', '.join(MISBEHAVE_MODES)}, got {mode!r}")
        for name, pairs in (("slow", self.slow), ("misbehave", self.misbehave)):
            nodes = [n for n, _ in pairs]
            if len(set(nodes)) != len(nodes):
                raise PlanError(f"node named twice in --{name}: {sorted(nodes)}")

    def _check_node(self, node: int, what: str) -> None:
        if not 0 <= node < self.nodes:
            raise PlanError(f"{what}: node {node} does not exist (nodes are 0..{self.nodes - 1})")

    # ---- queries --------------------------------------------------------------------------------

    def slow_factor(self, node: int) -> float:
        return dict(self.slow).get(node, 1.0)

    def misbehave_mode(self, node: int) -> str | None:
        return dict(self.misbehave).get(node)

    @property
    def honest_nodes(self) -> tuple[int, ...]:
        bad = {n for n, _ in self.misbehave}
        return tuple(n for n in range(self.nodes) if n not in bad)

    def downtime(self, node: int) -> list[tuple[float, float]]:
        """`[(kill time, restart time)]` of `node`, in order."""
        return sorted((k.at, k.restart_at) for k in self.kills if k.node == node)

    def is_up(self, node: int, t: float) -> bool:
        return not any(start <= t < end for start, end in self.downtime(node))

    @property
    def has_faults(self) -> bool:
        """Whether anything happens at a time of the plan (kills, partitions); slow and misbehaving nodes
        are what they are from the start."""
        return bool(self.kills or self.partitions)

    def all_up_after(self) -> float:
        """The time after which no fault is active: the last restart or partition end (0 if none)."""
        return max([k.restart_at for k in self.kills] + [p.end for p in self.partitions] + [0.0])

    def actions(self) -> list[Action]:
        """The timeline the supervisor executes, sorted (see `Action`)."""
        out: list[Action] = []
        for k in self.kills:
            out.append(Action(k.at, _KIND_ORDER["kill"], "kill", node=k.node))
            out.append(Action(k.restart_at, _KIND_ORDER["restart"], "restart", node=k.node))
        for p in self.partitions:
            out.append(Action(p.start, _KIND_ORDER["partition"], "partition", partition=p))
            out.append(Action(p.end, _KIND_ORDER["heal"], "heal", partition=p))
        return sorted(out)

    def fingerprint(self) -> str:
        """Short hash of the plan's content: equal plans, equal fingerprints."""
        return hashlib.sha256(repr(self.to_dict()).encode()).hexdigest()[:12]

    def describe(self) -> list[str]:
        """Human-readable lines, one per fault, in time order."""
        lines = [f"fault plan {self.fingerprint()}: {self.nodes} nodes, {self.duration:g} s, seed {self.seed}"]
        for node, factor in self.slow:
            lines.append(f"  whole run  node {node} is {factor:g}x slower")
        for node, mode in self.misbehave:
            lines.append(f"  whole run  node {node} misbehaves ({mode})")
        for a in self.actions():
            if a.kind == "kill":
                lines.append(f"  t={a.at:7.1f}s  kill node {a.node} (SIGKILL)")
            elif a.kind == "restart":
                lines.append(f"  t={a.at:7.1f}s  restart node {a.node}")
            elif a.partition is not None:
                sides = f"{list(a.partition.side_a)} | {list(a.partition.side_b)}"
                lines.append(f"  t={a.at:7.1f}s  {'partition' if a.kind == 'partition' else 'heal'} {sides}")
        if len(lines) == 1:
            lines.append("  no faults")
        return lines

    # ---- serialization --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes, "duration": self.duration, "seed": self.seed,
            "kills": [[k.at, k.node, k.downtime] for k in self.kills],
            "partitions": [[p.start, p.end, list(p.side_a), list(p.side_b)] for p in self.partitions],
            "slow": [[n, f] for n, f in self.slow],
            "misbehave": [[n, m] for n, m in self.misbehave],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FaultPlan:
        try:
            return cls(
                nodes=int(d["nodes"]), duration=float(d["duration"]), seed=int(d["seed"]),
                kills=tuple(Kill(float(a), int(n), float(dt)) for a, n, dt in d["kills"]),
                partitions=tuple(Partition(float(s), float(e), tuple(map(int, a)), tuple(map(int, b)))
                                 for s, e, a, b in d["partitions"]),
                slow=tuple((int(n), float(f)) for n, f in d["slow"]),
                misbehave=tuple((int(n), str(m)) for n, m in d["misbehave"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"not a fault plan: {e!r}") from None

def _kill_schedule(nodes: int, duration: float, every: float, downtime: float, first: float,
                   settle: float, rng: random.Random) -> tuple[Kill, ...]:
    """One kill every `every` seconds from `first`, of a node drawn uniformly from those up then."""
    kills: list[Kill] = []
    down_until = [0.0] * nodes
    tick = 0
    while (t := first + tick * every) + downtime <= duration - settle:
        up = [n for n in range(nodes) if t >= down_until[n]]
        if up:
            victim = rng.choice(up)
            kills.append(Kill(t, victim, downtime))
            down_until[victim] = kills[-1].restart_at
        tick += 1
    return tuple(kills)


def make_plan(*, nodes: int, duration: float, seed: int = 0, kill_every: float = 0.0, downtime: float = 15.0,
              first_kill: float | None = None, settle: float | None = None,
              kills: Sequence[Kill] = (), partitions: Sequence[Partition] = (),
              slow: Mapping[int, float] | None = None, misbehave: Mapping[int, str] | None = None) -> FaultPlan:
    """Build the plan for a run from the CLI's settings.

    `kill_every > 0` schedules one kill every `kill_every` seconds starting at `first_kill` (default
    `kill_every`), of a node drawn with `random.Random(seed)` among those up at that moment, each
    restarted after `downtime`; kills whose restart would fall within the last `settle` seconds
    (default: 20% of the run, at least 10 s, at most 60 s) are not scheduled. `kills` adds explicit ones.
    """
    if kill_every < 0 or downtime < 0:
        raise PlanError(f"--kill-every and --downtime must be >= 0, got {kill_every:g} and {downtime:g}")
    if settle is None:
        settle = min(60.0, max(10.0, 0.2 * duration))
    scheduled: tuple[Kill, ...] = ()
    if kill_every > 0:
        rng = random.Random(f"diloco-testnet-kills:{seed}")
        scheduled = _kill_schedule(nodes, duration, kill_every, downtime,
                                   kill_every if first_kill is None else first_kill, settle, rng)
    return FaultPlan(nodes=nodes, duration=duration, seed=seed, kills=tuple(sorted(scheduled + tuple(kills))),
                     partitions=tuple(sorted(partitions)), slow=tuple(sorted((slow or {}).items())),
                     misbehave=tuple(sorted((misbehave or {}).items())))


# ---- flag parsing ------------------------------------------------------------------------------------


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise PlanError(f"{what}: {text!r} is not an integer") from None


def _float(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise PlanError(f"{what}: {text!r} is not a number") from None


def parse_slow(text: str) -> tuple[int, float]:
    """`NODE:FACTOR`, e.g. `2:4` (node 2 runs 4x slower)."""
    node, sep, factor = text.partition(":")
    if not sep:
        raise PlanError(f"--slow expects NODE:FACTOR, got {text!r}")
    return _int(node, "--slow node"), _float(factor, "--slow factor")


def parse_misbehave(text: str) -> tuple[int, str]:
    """`NODE` or `NODE:MODE` (a node `--misbehave` mode, e.g. `garbage` or `poison:negate`; default
    `bad-updates`)."""
    node, _, mode = text.partition(":")
    return _int(node, "--misbehave node"), mode or "bad-updates"


def parse_partition(text: str, nodes: int) -> Partition:
    """`START:END:A` or `START:END:A/B`: nodes `A` (comma-separated) cut off from `B` (default: all the
    others) from START to END seconds, e.g. `40:60:0,1` or `40:60:0/2,3`."""
    parts = text.split(":")
    if len(parts) != 3:
        raise PlanError(f"--partition expects START:END:NODES[/NODES], got {text!r}")
    start, end = _float(parts[0], "--partition start"), _float(parts[1], "--partition end")
    side_texts = parts[2].split("/")
    if len(side_texts) > 2:
        raise PlanError(f"--partition has more than two sides: {text!r}")
    sides = [tuple(sorted({_int(x, "--partition node") for x in s.split(",") if x.strip()})) for s in side_texts]
    if len(sides) == 1:
        sides.append(tuple(n for n in range(nodes) if n not in sides[0]))
    return Partition(start, end, sides[0], sides[1])
