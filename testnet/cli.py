"""`diloco-testnet`: N `diloco-node` processes on this machine, chaos from a seeded plan, the
data-parallel baseline, and a report.

    diloco-testnet                                   # 3 nodes, tiny model, 2 minutes, baseline, report
    diloco-testnet --nodes 6 --minutes 5 --kill-every 30 --downtime 15
    diloco-testnet --slow 2:4 --partition 40:60:0 --misbehave 1:garbage --wan 2gbit,30ms

Stages, each cleaning up after itself (also on Ctrl-C or SIGTERM): optional solo run (overlap), the
testnet (supervisor + live progress), the baseline (child process, its progress on the terminal), the
report (`report.md`, `report.json`, `loss.png` in the run directory). Interrupted at any stage after the
nodes started, it still writes the report of what ran (`testnet.finish`). `run_testnet(options)` is the
same thing for scripts.

Every input that can be checked cheaply is checked before any node starts (flag values, the fault plan,
`--wan`, `--data` sources, `--out` and `--jax-cache` writable). After the run, `testnet.outcome` judges
the records: a run in which every node failed (exited by itself, or did not come back after a planned
kill), or no node trained, fails, quoting the last lines of each failed node's log.

Exit status (EXIT_STATUS, also in `--help`):
    0    the run worked; the report is written and printed
    1    the run failed: every node failed, no node trained, or the baseline failed (records and a
         report marked failed stay in the run directory); or the run's files could not be written (a
         full disk: the records of a full disk during the run are written when space is back, and a
         warning says what could not be)
    2    bad arguments (one line naming the flag), or the nodes could not be started (a node never
         printed LISTENING: its log is quoted), or the WAN emulation could not be set up
    130  interrupted (Ctrl-C, SIGTERM, SIGHUP): every process was stopped, and the report of what ran
         written (n/a for what did not happen, e.g. the baseline's figures if it had not started)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import trio

from testnet.baseline_run import BaselineError, BaselineProgress, baseline_argv, baseline_steps, run_baseline_child
from testnet.checks import UsageError, check_data, check_writable_dir
from testnet.faults import FaultPlan, PlanError, make_plan, parse_misbehave, parse_partition, parse_slow
from testnet.finish import Stage, final_report, interrupted_report, verdict
from testnet.horizon import Pace, horizon_steps
from testnet.nodes import NodeSettings, node_argv, node_env, prepare_nodes
from testnet.outcome import RunFailed
from testnet.procs import GroupRegistry, NodeStartError
from testnet.progress import Progress
from testnet.record import Recorder, RunMeta, load_run
from testnet.supervisor import ArgvBuilder, ChaosPartitioner, NetnsPartitioner, Supervisor
from testnet.timeline import Timeline
from testnet.wan import LinkSpec, WanError, WanNetwork, is_loopback, probe

__all__ = ["EXIT_STATUS", "Options", "build_plan", "check_inputs", "main", "parse_args", "run_testnet"]

EXIT_STATUS = {0: "the run worked", 1: "the run failed (every node failed, no node trained, or the baseline failed), "
                                      "or its files could not be written (a full disk)",
               2: "bad arguments, or the nodes could not be started",
               130: "interrupted (the report of what ran is written)"}


@dataclasses.dataclass(frozen=True)
class Options:
    """Everything `diloco-testnet` can be told (see `--help`)."""

    nodes: int = 3
    minutes: float = 2.0
    model: str = "tiny"
    inner_steps: int = 20
    outer_momentum: float | None = None  # the nodes' --outer-momentum (None: diloco-node's default, 0.8)
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
    overrides: tuple[str, ...] = ()
    jax_cache: str = "auto"
    plan_only: bool = False
    paced_total_steps: int | None = None  # set by the testnet from the solo run's pace (`testnet.horizon`)

    def schedule_horizon(self) -> int | None:
        """The inner schedule's `total_steps` the testnet sets, or None (the preset's, or `--set`'s):
        with no `total_steps` given, the schedule spans the run: `rounds × inner_steps` with `--rounds`,
        else the horizon measured from the solo run's pace; a horizon inside the warmup is not used."""
        from node.island.config import preset

        if any(item.partition("=")[0].strip().endswith("total_steps") for item in self.overrides):
            return None
        horizon = self.rounds * self.inner_steps if self.rounds is not None else self.paced_total_steps
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


def _param_count(model: str, overrides: Sequence[str]) -> int:
    from node.island.config import preset
    from node.island.model import param_count

    return param_count(preset(model).with_overrides_from_strings(overrides).model)


def _new_run_dir(out: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = out / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise UsageError(f"--out {out}: cannot create the run folder {path.name}: {e.strerror or e}") from None
    raise UsageError(f"--out {out}: cannot create a run folder (1000 exist for {stamp})")


def _say(text: str) -> None:
    print(text, flush=True)


async def _supervise(specs: list, argv_for: ArgvBuilder, run_dir: Path, plan: FaultPlan, o: Options, meta: RunMeta, *,
                     progress: Progress, registry: GroupRegistry, bootstrap: bool = True,
                     network: WanNetwork | None = None, plan_from_ready: bool = False) -> None:
    """Run one supervised testnet; `run.json` (with `meta`'s launch and end times, and `interrupted`)
    is written however it ends. `plan_from_ready`: the plan's clock starts once every node trains."""
    recorder = Recorder(run_dir)
    sup = Supervisor(specs, argv_for, recorder, env=node_env(o.jax_cache_dir()), start_timeout=o.start_timeout,
                     stop_grace=o.stop_grace, poll_interval=o.poll_interval,
                     partitioner=NetnsPartitioner(network) if network else ChaosPartitioner(),
                     allows=network.allows if network else is_loopback, registry=registry,
                     notify=progress.notify, on_poll=progress.refresh, bootstrap=bootstrap,
                     plan_from_ready=plan_from_ready)
    try:
        with progress:
            await sup.run(plan)
    except BaseException:
        meta.interrupted = True
        raise
    finally:
        recorder.close()
        if (problem := recorder.problem()) is not None:
            print(f"diloco-testnet: warning: the run's records in {run_dir} could not all be written ({problem}); "
                  "the report covers what was", file=sys.stderr, flush=True)
        meta.t_launch, meta.t_end, meta.t_plan = sup.t0, sup.t_end, sup.t_plan
        (run_dir / "run.json").write_text(json.dumps(meta.to_dict(), indent=1))


async def _solo(o: Options, run_dir: Path, argv_builder,
                registry: GroupRegistry) -> tuple[dict[int, float], list[float]]:
    """Every node alone (no peers), all at once so the machine is as loaded as in the testnet; returns
    their inner steps/s while training (node -> rate) and their seconds from launch to training."""
    solo_dir = run_dir / "solo"
    specs = prepare_nodes(solo_dir, o.nodes, o.seed + 1_000_003)
    plan = FaultPlan(nodes=o.nodes, duration=o.solo_seconds, seed=o.seed)
    (solo_dir / "plan.json").write_text(json.dumps(plan.to_dict()))
    _say(f"solo run: {o.nodes} isolated nodes, {o.solo_seconds:g} s once every node trains (their pace sets the "
         "learning-rate schedule to end with the run; the overlap figure)")
    meta = RunMeta(nodes=o.nodes, model=o.model, inner_steps=o.inner_steps, peer_ids=[s.peer_id for s in specs])
    # timed from the moment every node trains: on a loaded machine the start-up (JAX compiling in every
    # process at once) can take most of a window counted from the launch, and then no pace is measured
    await _supervise(specs, argv_builder(specs), solo_dir, plan, o, meta, progress=Progress("quiet"),
                     registry=registry, bootstrap=False, plan_from_ready=True)
    tl = Timeline(load_run(solo_dir))
    rates: dict[int, float] = {}
    startups: list[float] = []
    # the pace once every node trains: before, the others' start-up (JAX compiling) slows the first ones
    all_training = max((inc.ready_at for node in range(o.nodes) for inc in tl.of(node) if inc.ready_at is not None),
                       default=float("-inf"))
    for node in range(o.nodes):
        pairs = [inc.rate("inner_steps", all_training) for inc in tl.of(node)]
        if not sum(p[1] for p in pairs):  # no sample after that moment: the whole solo run
            pairs = [inc.rate("inner_steps") for inc in tl.of(node)]
        steps, seconds = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
        if steps > 0 and seconds > 0:  # no round finished: no pace measured (a zero would end the schedule at once)
            rates[node] = steps / seconds
        startups += [inc.ready_at - inc.launched_at for inc in tl.of(node)
                     if inc.ready_at is not None and inc.launched_at is not None]
    return rates, startups


def _pace_schedule(o: Options, rates: dict[int, float], startups: list[float]) -> Options:
    """`o` with the schedule's horizon from the solo run's pace (`testnet.horizon`); slowed nodes do not
    set the pace."""
    slowed = {node for node, _ in (parse_slow(s) for s in o.slow)}
    pace = Pace.of([r for node, r in rates.items() if node not in slowed], startups)
    if pace is None:
        return o
    paced = dataclasses.replace(o, paced_total_steps=horizon_steps(pace, o.minutes * 60))
    if o.rounds is None and paced.schedule_horizon() is not None:
        length = f"{o.minutes * 60:g} s - {pace.startup_s:.1f} s start-up" if pace.startup_s else \
            f"{o.minutes * 60:g} s from when every node trains"
        _say(f"learning-rate schedule: cosine over {paced.paced_total_steps} inner steps, the run's length at "
             f"the solo run's pace ({pace.steps_per_second:.2f} steps/s x ({length}))")
    return paced


async def run_testnet(o: Options, *, argv_builder=None, registry: GroupRegistry | None = None,
                      stage: Stage | None = None) -> Path:
    """Run every stage (see module doc) and return the run directory.

    `argv_builder(specs)` may replace the `diloco-node` command line (tests); it returns an `ArgvBuilder`.
    Every process started is registered in `registry` (for a last-resort `kill_all_now`); `stage` follows
    where the run is (for the report after an interrupt, `testnet.finish`).
    Raises, each with a message for the user: UsageError (bad options, before anything starts),
    NodeStartError or WanError (the testnet could not start), RunFailed (see `testnet.outcome`; the run
    directory holds the records and a report marked failed), BaselineError.
    """
    registry = GroupRegistry() if registry is None else registry
    stage = Stage() if stage is None else stage
    plan = check_inputs(o)
    for line in plan.describe():
        _say(line)
    if o.config_overrides():
        _say(f"config overrides (nodes and baseline): {' '.join(o.config_overrides())}")
    if o.plan_only:
        return Path()
    run_dir = stage.run_dir = _new_run_dir(o.out)
    _say(f"run directory: {run_dir}")
    (run_dir / "plan.json").write_text(json.dumps(plan.to_dict(), indent=1))
    network: WanNetwork | None = None
    wan_desc = "off"
    try:
        if o.wan is not None:
            spec = LinkSpec.parse(o.wan)
            support = probe(spec)
            if support.available:
                network = WanNetwork(o.nodes, spec, support.qdisc or "netem")
                network.setup()
                wan_desc = f"{spec} per node ({support.reason}); subnet {network.subnet}"
                _say(f"WAN emulation: {wan_desc}")
            else:
                _say(f"WAN emulation off: {support.reason}; running on loopback")
                wan_desc = f"off ({support.reason})"
        def default_builder(specs: list) -> ArgvBuilder:  # reads `o` when called: the main run gets the paced one
            settings = NodeSettings(
                run_id=f"testnet-{run_dir.name}", model=o.model, inner_steps=o.inner_steps, eval_every=o.eval_every,
                eval_batches=o.eval_batches, max_rounds=o.rounds, seed=o.seed, data=o.data, compression=o.compression,
                outer_momentum=o.outer_momentum,
                overrides=o.config_overrides(), allow_chaos=bool(plan.partitions) and network is None,
                extra_args=o.node_args)
            return lambda spec, gp, hp, peers: node_argv(spec, settings, gossip_port=gp, http_port=hp, peers=peers)

        builder = argv_builder or default_builder
        solo_rates = None
        if o.solo_seconds > 0:
            stage.name = "solo"
            solo_rates, startups = await _solo(o, run_dir, builder, registry)
            # a plan with faults counts the run from the moment every node trains: no start-up inside it
            o = _pace_schedule(o, solo_rates, [] if plan.has_faults else startups)
        specs = prepare_nodes(run_dir, o.nodes, o.seed,
                              hosts=[network.host(i) for i in range(o.nodes)] if network else None,
                              exec_prefixes=[network.exec_prefix(i) for i in range(o.nodes)] if network else None,
                              slow=dict(plan.slow), misbehave=dict(plan.misbehave))
        meta = RunMeta(nodes=o.nodes, model=o.model, inner_steps=o.inner_steps, peer_ids=[s.peer_id for s in specs],
                       wan=wan_desc, data=list(o.data), compression=o.compression, seed=o.seed,
                       extra={"param_count": _param_count(o.model, o.config_overrides()), "options": _jsonable(o),
                              "config_overrides": list(o.config_overrides())})
        if solo_rates is not None:
            (run_dir / "solo.json").write_text(json.dumps({"steps_per_second": list(solo_rates.values())}))
        stage.name = "nodes"
        # faults count from the moment every node trains, so that each lands inside the window the report
        # measures (a kill during the start-up would move that window and leave the kill out of it)
        await _supervise(specs, builder(specs), run_dir, plan, o, meta, progress=Progress(o.progress),
                         registry=registry, network=network, plan_from_ready=plan.has_faults)
    finally:
        if network is not None:
            for error in network.teardown():
                _say(f"warning: WAN cleanup: {error}")
    warnings = verdict(run_dir, specs)
    if o.baseline:
        stage.name = "baseline"
        await _baseline(o, run_dir, meta, registry)
    stage.name = "report"
    final_report(run_dir, warnings, _say)
    return run_dir


async def _baseline(o: Options, run_dir: Path, meta: RunMeta, registry: GroupRegistry) -> None:
    tokens = Timeline(load_run(run_dir)).total_at("tokens", meta.t_end)
    steps = baseline_steps(tokens, o.nodes, o.model, o.config_overrides())
    _say(f"data-parallel baseline: {o.nodes} workers, {steps} synchronous steps ({tokens:,.0f} tokens, as the nodes); "
         "compiling, then its progress every 10 s")
    argv = baseline_argv(model=o.model, data=o.data, seed=o.seed, steps=steps, shard_keys=meta.peer_ids,
                         out=run_dir / "baseline.json", eval_batches=o.eval_batches, overrides=o.config_overrides())
    progress = BaselineProgress(steps, _say) if o.progress != "quiet" else None
    await run_baseline_child(argv, run_dir / "baseline.log", registry,
                             on_line=progress.line if progress else lambda line: None)


def _jsonable(o: Options) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(o).items()}


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one line (the usage is 17 lines; `--help` shows it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = _Parser(
        prog="diloco-testnet", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run N diloco nodes on this machine with chaos from a seeded plan, the synchronous "
                    "data-parallel baseline on the same data, and write a report (table, JSON, loss plot).",
        epilog="With kills or partitions, the run's --minutes and the times of the plan (--partition, the kills)\n"
               "count from the moment every node first trains (so that every fault lands in the measured\n"
               "window); without, from the first node's launch. Ctrl-C stops every\n"
               "process cleanly and writes the report of what ran. Results go to OUT/<timestamp>/ (node logs,\n"
               "status time series, report).\n\n"
               "exit status:\n" + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_STATUS.items()))
    a = p.add_argument
    a("--nodes", type=int, default=3, help="number of nodes (default 3)")
    a("--minutes", type=float, default=2.0, help="length of the run from the first launch, or, with kills or "
                                                 "partitions, from when every node trains (default 2)")
    a("--model", default="tiny", help="model preset: tiny, small, base, large (default tiny)")
    a("--inner-steps", type=int, default=20, help="inner steps per round, H (default 20)")
    a("--outer-momentum", type=float, default=None, metavar="MU",
      help="every node's outer Nesterov momentum (default: diloco-node's, 0.8)")
    a("--compression", choices=("fp32", "bf16", "int8", "int4"), help="pseudo-gradient codec (default: the node's)")
    a("--data", action="append", default=[], help="text/.npy/.bin file, folder or glob (repeatable; default: "
                                                  "the embedded corpus)")
    a("--seed", type=int, default=0, help="seed of the fault plan and the node keys (default 0)")
    a("--eval-every", type=int, default=2, help="held-out evaluation every N rounds on each node (default 2)")
    a("--eval-batches", type=int, default=4, help="fixed held-out batches per evaluation, nodes and baseline "
                                                  "alike (default 4)")
    a("--rounds", type=int, metavar="R", help="every node stops by itself after R rounds, first waiting for its "
                                              "peers (drain), so the run ends quiescent with equal digests; "
                                              "--minutes is then an upper bound, and the inner learning-rate "
                                              "schedule decays over the run (total_steps = R x H, unless --set "
                                              "gives it) (default: run --minutes)")
    a("--kill-every", type=float, default=0.0, metavar="T",
      help="SIGKILL a random running node every T seconds (0 = never; default 0)")
    a("--downtime", type=float, default=15.0, metavar="D", help="restart a killed node after D seconds (default 15)")
    a("--first-kill", type=float, metavar="T0", help="time of the first kill (default: T)")
    a("--settle", type=float, metavar="S", help="no restart in the last S seconds, so the run ends quiet "
                                                "(default: 20%% of the run, 10..60 s)")
    a("--slow", action="append", default=[], metavar="NODE:FACTOR",
      help="make NODE's inner steps FACTOR times slower, like older hardware (repeatable)")
    a("--partition", action="append", default=[], metavar="START:END:A[/B]",
      help="cut nodes A (comma-separated) off from B (default: all others) from START to END seconds (repeatable)")
    a("--misbehave", action="append", default=[], metavar="NODE[:MODE]",
      help="NODE sends malformed frames (garbage) or invalid updates (bad-updates, default) (repeatable)")
    a("--wan", nargs="?", const="2gbit,30ms", metavar="RATE,DELAY,LOSS",
      help="each node in its own network namespace with an emulated link (default 2gbit,30ms; delay is one-way); "
           "needs root and iproute2, otherwise says why and runs on loopback")
    a("--baseline", action=argparse.BooleanOptionalAction, default=True,
      help="also train the data-parallel baseline on the same tokens (default on)")
    a("--solo-seconds", type=float, default=20.0, metavar="S",
      help="first run every node alone for S seconds once all of them train: without --rounds the measured pace sets the learning-rate "
           "schedule to end with the run (else the preset's horizon applies, 10,000 steps for tiny), and the "
           "overlap figure (default 20; 0 = skip)")
    a("--out", type=Path, default=Path("runs"), help="parent of the run directory (default runs)")
    a("--progress", choices=("auto", "rich", "plain", "quiet"), default="auto",
      help="live table (rich), periodic lines (plain), events only (quiet); auto = rich on a terminal")
    a("--start-timeout", type=float, default=180.0, help="seconds a node may take to print LISTENING (default 180)")
    a("--stop-grace", type=float, default=20.0, help="seconds between SIGTERM and SIGKILL at the end (default 20)")
    a("--poll-interval", type=float, default=1.0, help="seconds between /status polls (default 1)")
    a("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
      help="model/data/optimizer override for every node and the baseline alike, e.g. --set inner.lr=1e-3 "
           "(repeatable; keys as in diloco-node --set)")
    a("--node-arg", action="append", default=[], metavar="ARG", help="extra argument for every node (repeatable)")
    a("--jax-cache", default="auto", metavar="DIR",
      help="JAX compilation cache shared by the nodes, so restarts skip compiling (default auto = OUT/jax-cache; "
           "none = off)")
    a("--plan-only", action="store_true", help="print the fault plan and exit")
    ns = p.parse_args(argv)
    at_least = {"--nodes": (ns.nodes, 1), "--inner-steps": (ns.inner_steps, 1), "--rounds": (ns.rounds, 1),
                "--eval-batches": (ns.eval_batches, 1), "--eval-every": (ns.eval_every, 0),
                "--kill-every": (ns.kill_every, 0), "--downtime": (ns.downtime, 0), "--first-kill": (ns.first_kill, 0),
                "--settle": (ns.settle, 0), "--solo-seconds": (ns.solo_seconds, 0), "--stop-grace": (ns.stop_grace, 0)}
    for flag, (value, low) in at_least.items():
        if value is not None and not value >= low:
            p.error(f"{flag} must be >= {low}, got {value:g}")
    for flag, value in (("--minutes", ns.minutes), ("--start-timeout", ns.start_timeout),
                        ("--poll-interval", ns.poll_interval)):
        if not value > 0:
            p.error(f"{flag} must be > 0, got {value:g}")
    from node.island.config import ConfigError, preset

    try:
        preset(ns.model).with_overrides_from_strings(ns.overrides)
    except ConfigError as e:
        p.error(str(e))
    data = tuple(d for item in ns.data for d in item.split(",") if d)
    if ns.outer_momentum is not None and not 0.0 <= ns.outer_momentum < 1.0:
        p.error(f"--outer-momentum must be in [0, 1), got {ns.outer_momentum:g}")
    return Options(nodes=ns.nodes, minutes=ns.minutes, model=ns.model, inner_steps=ns.inner_steps,
                   outer_momentum=ns.outer_momentum,
                   compression=ns.compression, data=data, seed=ns.seed, eval_every=ns.eval_every,
                   eval_batches=ns.eval_batches, rounds=ns.rounds, jax_cache=ns.jax_cache,
                   kill_every=ns.kill_every, downtime=ns.downtime, first_kill=ns.first_kill, settle=ns.settle,
                   slow=tuple(ns.slow), partition=tuple(ns.partition), misbehave=tuple(ns.misbehave), wan=ns.wan,
                   baseline=ns.baseline, solo_seconds=ns.solo_seconds, out=ns.out, progress=ns.progress,
                   start_timeout=ns.start_timeout, stop_grace=ns.stop_grace, poll_interval=ns.poll_interval,
                   node_args=tuple(ns.node_arg), overrides=tuple(ns.overrides), plan_only=ns.plan_only)


def main(argv: Sequence[str] | None = None, *, argv_builder=None) -> int:
    """Entry point of `diloco-testnet`; returns the exit status (module doc, `EXIT_STATUS`).
    `argv_builder` as in `run_testnet` (tests)."""
    options = parse_args(argv)
    # SIGTERM/SIGHUP become SIGINT, which trio turns into KeyboardInterrupt at a safe point. SIGINT gets
    # Python's own handler first: a shell starts background jobs with SIGINT ignored, and then neither
    # Ctrl-C nor the forwarded SIGTERM would stop the testnet.
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}
    previous.update({sig: signal.signal(sig, lambda s, f: os.kill(os.getpid(), signal.SIGINT))
                     for sig in (signal.SIGTERM, signal.SIGHUP)})
    registry, stage = GroupRegistry(), Stage()
    try:
        trio.run(functools.partial(run_testnet, options, argv_builder=argv_builder, registry=registry, stage=stage))
    except KeyboardInterrupt:
        print("interrupted: every process was stopped", file=sys.stderr)
        try:
            interrupted_report(stage, _say)
        except KeyboardInterrupt:
            print("interrupted again: no report (`python -m testnet.report RUN_DIR` makes one from the records)",
                  file=sys.stderr)
        return 130
    except UsageError as e:
        print(f"diloco-testnet: error: {e}", file=sys.stderr)
        return 2
    except (NodeStartError, WanError) as e:
        print(f"diloco-testnet: the testnet could not start: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print("\n".join([*e.details, f"diloco-testnet: {e}"]), file=sys.stderr)
        return 1
    except BaselineError as e:
        print(f"diloco-testnet: run failed: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # e.g. a full disk while writing the run's files (the nodes were stopped)
        where = f" ({e.filename})" if e.filename else ""
        print(f"diloco-testnet: the run's files could not be written{where}: {e.strerror or e}", file=sys.stderr)
        return 1
    finally:
        leftover = registry.kill_all_now()  # only if cleanup itself was interrupted (a second Ctrl-C)
        if leftover:
            print(f"killed {len(leftover)} leftover process group(s)", file=sys.stderr)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
