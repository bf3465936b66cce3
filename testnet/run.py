"""One testnet run, stage by stage: `run_testnet(options)` (what `diloco-testnet` runs, and scripts such as
`testnet.bench`).

Stages, each cleaning up after itself (also on Ctrl-C or SIGTERM): optional solo run (overlap, and the pace
that sets the learning-rate schedule), the testnet (supervisor + live progress), the baseline (child
process, its progress on the terminal), the report (`report.md`, `report.json`, `loss.png` in the run
directory). Interrupted at any stage after the nodes started, the caller writes the report of what ran from
`stage` (`testnet.finish`). A plan with faults counts from the moment every node trains (`plan_from_ready`):
every fault then lands in the window the report measures.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testnet.baseline_run import BaselineProgress, baseline_argv, baseline_steps, run_baseline_child
from testnet.checks import UsageError
from testnet.cpus import pinning
from testnet.faults import FaultPlan, parse_slow
from testnet.finish import Stage, final_report, verdict
from testnet.horizon import Pace, horizon_steps, run_seconds
from testnet.nodes import RunFlags, node_argv, node_env, prepare_nodes
from testnet.options import Options, check_inputs
from testnet.procs import GroupRegistry
from testnet.progress import RunProgress
from testnet.record import Recorder, RunMeta, load_run
from testnet.supervisor import ArgvBuilder, ChaosPartitioner, NetnsPartitioner, Supervisor
from testnet.timeline import Timeline
from testnet.wan import LinkSpec, WanNetwork, is_loopback, probe

__all__ = ["run_testnet", "say"]


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


def say(text: str) -> None:
    print(text, flush=True)


async def _supervise(specs: list, argv_for: ArgvBuilder, run_dir: Path, plan: FaultPlan, o: Options, meta: RunMeta, *,
                     progress: RunProgress, registry: GroupRegistry, bootstrap: bool = True,
                     network: WanNetwork | None = None, plan_from_ready: bool = False,
                     until_steps: int | None = None) -> None:
    """Run one supervised testnet; `run.json` (with `meta`'s launch and end times, and `interrupted`)
    is written however it ends. `plan_from_ready`: the plan's clock starts once every node trains;
    `until_steps`: the run ends once the nodes' mean inner steps reach it (`Supervisor`)."""
    recorder = Recorder(run_dir)
    sup = Supervisor(specs, argv_for, recorder, env=node_env(o.jax_cache_dir()), start_timeout=o.start_timeout,
                     stop_grace=o.stop_grace, poll_interval=o.poll_interval,
                     partitioner=NetnsPartitioner(network) if network else ChaosPartitioner(),
                     allows=network.allows if network else is_loopback, registry=registry,
                     notify=progress.notify, on_poll=progress.refresh, bootstrap=bootstrap,
                     plan_from_ready=plan_from_ready, until_steps=until_steps, insecure=o.insecure)
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


def _prefixes(nodes: int, pins: list[tuple[str, ...]] | None,
              network: WanNetwork | None) -> list[tuple[str, ...]] | None:
    """Node i's command prefix: its cores (`testnet.cpus`), then its network namespace (`--wan`)."""
    if pins is None and network is None:
        return None
    return [(*(pins[i] if pins else ()), *(network.exec_prefix(i) if network else ())) for i in range(nodes)]


async def _solo(o: Options, run_dir: Path, argv_builder, registry: GroupRegistry,
                pins: list[tuple[str, ...]] | None) -> tuple[dict[int, float], list[float]]:
    """Every node alone (no peers), all at once so the machine is as loaded as in the testnet; returns
    their inner steps/s while training (node -> rate) and their seconds from launch to training."""
    solo_dir = run_dir / "solo"
    specs = prepare_nodes(solo_dir, o.nodes, o.seed + 1_000_003, exec_prefixes=pins)
    plan = FaultPlan(nodes=o.nodes, duration=o.solo_seconds, seed=o.seed)
    (solo_dir / "plan.json").write_text(json.dumps(plan.to_dict()))
    timed = o.steps is None and o.rounds is None
    sets = "their pace sets the learning-rate schedule to end with the run; " if timed else ""
    say(f"solo run: {o.nodes} isolated nodes, {o.solo_seconds:g} s once every node trains ({sets}the overlap figure)")
    meta = RunMeta(nodes=o.nodes, model=o.model, inner_steps=o.inner_steps, peer_ids=[s.peer_id for s in specs])
    # timed from the moment every node trains: on a loaded machine the start-up (JAX compiling in every
    # process at once) can take most of a window counted from the launch, and then no pace is measured
    await _supervise(specs, argv_builder(specs), solo_dir, plan, o, meta, progress=RunProgress("quiet"),
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
    """`o` with the schedule's horizon from the solo run's pace (`testnet.horizon`) for a run timed by
    `--minutes`; slowed nodes do not set the pace. A run sized by `--steps` or `--rounds` knows its horizon
    without a pace (`Options.schedule_horizon`): the pace then only tells how long it may take."""
    slowed = {node for node, _ in (parse_slow(s) for s in o.slow)}
    pace = Pace.of([r for node, r in rates.items() if node not in slowed], startups)
    if pace is None:
        return o
    if o.steps is not None:
        say(f"at the solo run's pace ({pace.steps_per_second:.2f} steps/s, {pace.startup_s:.1f} s start-up), "
            f"{o.steps:,} inner steps take about {run_seconds(pace, o.steps):.0f} s")
        return o
    paced = dataclasses.replace(o, paced_total_steps=horizon_steps(pace, o.minutes * 60))
    if o.rounds is None and paced.schedule_horizon() is not None:
        length = f"{o.minutes * 60:g} s - {pace.startup_s:.1f} s start-up" if pace.startup_s else \
            f"{o.minutes * 60:g} s from when every node trains"
        say(f"learning-rate schedule: cosine over {paced.paced_total_steps} inner steps, the run's length at "
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
        say(line)
    if o.steps is not None:
        say(f"run length: until the nodes have taken {o.steps:,} inner steps each on average, at most {o.minutes:g} "
            f"minutes; learning-rate schedule: cosine over those {o.steps:,} steps")
    if o.config_overrides():
        say(f"config overrides (nodes and baseline): {' '.join(o.config_overrides())}")
    if o.plan_only:
        return Path()
    run_dir = stage.run_dir = _new_run_dir(o.out)
    say(f"run directory: {run_dir}")
    (run_dir / "plan.json").write_text(json.dumps(plan.to_dict(), indent=1))
    network: WanNetwork | None = None
    wan_desc = "off"
    pins, cpus_desc = pinning(o.nodes, o.pin_cpus)
    say(f"CPU: {cpus_desc}")
    try:
        if o.wan is not None:
            spec = LinkSpec.parse(o.wan)
            support = probe(spec)
            if support.available:
                network = WanNetwork(o.nodes, spec, support.qdisc or "netem")
                network.setup()
                wan_desc = f"{spec} per node ({support.reason}); subnet {network.subnet}"
                say(f"WAN emulation: {wan_desc}")
            else:
                say(f"WAN emulation off: {support.reason}; running on loopback")
                wan_desc = f"off ({support.reason})"
        def default_builder(specs: list) -> ArgvBuilder:  # reads `o` when called: the main run gets the paced one
            settings = RunFlags(
                run_id=f"testnet-{run_dir.name}", model=o.model, inner_steps=o.inner_steps, eval_every=o.eval_every,
                eval_batches=o.eval_batches, max_rounds=o.rounds, seed=o.seed, data=o.data, compression=o.compression,
                outer_momentum=o.outer_momentum,
                overrides=o.config_overrides(), allow_chaos=bool(plan.partitions) and network is None,
                extra_args=(*o.node_args, *(("--insecure",) if o.insecure else ())))
            return lambda spec, gp, hp, peers: node_argv(spec, settings, gossip_port=gp, http_port=hp, peers=peers)

        builder = argv_builder or default_builder
        solo_rates = None
        if o.solo_seconds > 0:
            stage.name = "solo"
            solo_rates, startups = await _solo(o, run_dir, builder, registry, pins)
            # a plan with faults counts the run from the moment every node trains: no start-up inside it
            o = _pace_schedule(o, solo_rates, [] if plan.has_faults else startups)
        specs = prepare_nodes(run_dir, o.nodes, o.seed,
                              hosts=[network.host(i) for i in range(o.nodes)] if network else None,
                              exec_prefixes=_prefixes(o.nodes, pins, network),
                              slow=dict(plan.slow), misbehave=dict(plan.misbehave))
        meta = RunMeta(nodes=o.nodes, model=o.model, inner_steps=o.inner_steps, peer_ids=[s.peer_id for s in specs],
                       wan=wan_desc, data=list(o.data), compression=o.compression, seed=o.seed,
                       extra={"param_count": _param_count(o.model, o.config_overrides()), "options": _jsonable(o),
                              "cpus": cpus_desc,
                              "config_overrides": list(o.config_overrides())})
        if solo_rates is not None:
            (run_dir / "solo.json").write_text(json.dumps({"steps_per_second": list(solo_rates.values())}))
        stage.name = "nodes"
        # faults count from the moment every node trains, so that each lands inside the window the report
        # measures (a kill during the start-up would move that window and leave the kill out of it)
        await _supervise(specs, _with_traffic(o, run_dir, specs, builder(specs)), run_dir, plan, o, meta,
                         progress=RunProgress(o.progress),
                         registry=registry, network=network, plan_from_ready=plan.has_faults, until_steps=o.steps)
    finally:
        if network is not None:
            for error in network.teardown():
                say(f"warning: WAN cleanup: {error}")
    warnings = verdict(run_dir, specs)
    if o.baseline:
        stage.name = "baseline"
        await _baseline(o, run_dir, meta, registry)
    stage.name = "report"
    final_report(run_dir, warnings, say)
    return run_dir


def _with_traffic(o: Options, run_dir: Path, specs: list, argv: ArgvBuilder) -> ArgvBuilder:
    """The main run's command lines: with `--traffic reduced`, every node's gets the roster of the run's keys
    (the solo run's nodes, of other keys, train all-to-all alone)."""
    if o.traffic != "reduced":
        return argv
    roster = run_dir / "roster.txt"
    roster.write_text("".join(f"{spec.peer_id}\n" for spec in specs))
    return lambda spec, gp, hp, peers: [*argv(spec, gp, hp, peers), "--traffic", "reduced", "--roster", str(roster)]


async def _baseline(o: Options, run_dir: Path, meta: RunMeta, registry: GroupRegistry) -> None:
    tokens = Timeline(load_run(run_dir)).total_at("tokens", meta.t_end)
    steps = baseline_steps(tokens, o.nodes, o.model, o.config_overrides())
    say(f"data-parallel baseline: {o.nodes} workers, {steps} synchronous steps ({tokens:,.0f} tokens, as the nodes); "
         "compiling, then its progress every 10 s")
    argv = baseline_argv(model=o.model, data=o.data, seed=o.seed, steps=steps, shard_keys=meta.peer_ids,
                         out=run_dir / "baseline.json", eval_batches=o.eval_batches, overrides=o.config_overrides())
    progress = BaselineProgress(steps, say) if o.progress != "quiet" else None
    await run_baseline_child(argv, run_dir / "baseline.log", registry,
                             on_line=progress.line if progress else lambda line: None)


def _jsonable(o: Options) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(o).items()}

