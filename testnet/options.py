"""What `diloco-testnet` can be told (`Options`, filled by `testnet.cli.parse_args` or by a script), the
fault plan it builds (`build_plan`), and the checks made before anything starts (`check_inputs`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from testnet.checks import UsageError, check_data, check_writable_dir
from testnet.faults import FaultPlan, PlanError, make_plan, parse_misbehave, parse_partition, parse_slow
from testnet.wan import LinkSpec

__all__ = ["Options", "build_plan", "check_inputs"]


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything `diloco-testnet` can be told (see `--help`)."""

    nodes: int = 3
    minutes: float = 2.0  # the run's length; with `steps` (or `rounds`), its upper bound
    steps: int | None = None  # the run's length: until the nodes' mean inner steps reach it (at most `minutes`)
    model: str = "tiny"
    inner_steps: int = 20
    outer_momentum: float | None = None  # the nodes' --outer-momentum (None: diloco-node's default, 0.6)
    compression: str | None = None
    data: tuple[str, ...] = ()
    seed: int = 0
    eval_every: int = 2
    eval_batches: int = 4
    rounds: int | None = None
    kill_every: float = 0.0
    downtime: float = 15.0
    first_kill: float | None = None
    settle: float | None = None
    slow: tuple[str, ...] = ()
    partition: tuple[str, ...] = ()
    misbehave: tuple[str, ...] = ()
    wan: str | None = None
    baseline: bool = True
    solo_seconds: float = 20.0  # the solo phase: the nodes' pace sets the schedule's horizon (and overlap)
    out: Path = Path("runs")
    progress: str = "auto"
    start_timeout: float = 180.0
    stop_grace: float = 20.0
    poll_interval: float = 1.0
    node_args: tuple[str, ...] = ()
    insecure: bool = False  # the nodes' --insecure: cleartext links (TLS 1.3 otherwise)
    overrides: tuple[str, ...] = ()
    jax_cache: str = "auto"
    pin_cpus: bool = True  # each node on an equal share of the cores (`testnet.cpus`)
    plan_only: bool = False
    paced_total_steps: int | None = None  # set by the testnet from the solo run's pace (`testnet.horizon`)
    traffic: str = "all-to-all"  # the nodes' --traffic ("reduced": the main run's nodes get a roster of their keys)

    def schedule_horizon(self) -> int | None:
        """The inner schedule's `total_steps` the testnet sets, or None (the preset's, or `--set`'s):
        with no `total_steps` given, the schedule spans the run: `rounds × inner_steps` with `--rounds`,
        `steps` with `--steps`, else the horizon measured from the solo run's pace; a horizon inside the
        warmup is not used."""
        from node.island.config import preset

        if any(item.partition("=")[0].strip().endswith("total_steps") for item in self.overrides):
            return None
        horizon = self.rounds * self.inner_steps if self.rounds is not None else \
            self.steps if self.steps is not None else self.paced_total_steps
        if horizon is None or horizon <= preset(self.model).with_overrides_from_strings(self.overrides).inner.warmup_steps:
            return None
        return horizon

    def config_overrides(self) -> tuple[str, ...]:
        """`--set` items for the nodes and the baseline, with the schedule's horizon (`schedule_horizon`)."""
        horizon = self.schedule_horizon()
        return self.overrides if horizon is None else (*self.overrides, f"total_steps={horizon}")

    def jax_cache_dir(self) -> Path | None:
        """Where the nodes share JAX's compilation cache (`auto`: OUT/jax-cache; `none`: no cache)."""
        if self.jax_cache == "none":
            return None
        return self.out / "jax-cache" if self.jax_cache == "auto" else Path(self.jax_cache)


def build_plan(o: Options) -> FaultPlan:
    """The run's fault plan from the options (deterministic in `o.seed`). Raises PlanError."""
    slow = dict(parse_slow(s) for s in o.slow)
    misbehave = dict(parse_misbehave(m) for m in o.misbehave)
    return make_plan(nodes=o.nodes, duration=o.minutes * 60, seed=o.seed, kill_every=o.kill_every,
                     downtime=o.downtime, first_kill=o.first_kill, settle=o.settle,
                     partitions=[parse_partition(p, o.nodes) for p in o.partition], slow=slow, misbehave=misbehave)


def check_inputs(o: Options) -> FaultPlan:
    """Check what the flags name, cheaply and before anything starts; return the fault plan. Raises
    `UsageError` (one line naming the flag). With `--plan-only`, only the plan and `--wan`."""
    try:
        plan = build_plan(o)
    except PlanError as e:
        raise UsageError(str(e)) from None
    if o.wan is not None:
        try:
            LinkSpec.parse(o.wan)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if not o.plan_only:
        check_data(o.data)
        check_writable_dir(o.out, "--out")
        if o.jax_cache not in ("auto", "none"):
            check_writable_dir(Path(o.jax_cache), "--jax-cache")
    return plan

