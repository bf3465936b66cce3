"""`diloco-testnet`: N `diloco-node` processes on this machine, chaos from a seeded plan, the
data-parallel baseline, and a report.

    diloco-testnet                                   # 3 nodes, tiny model, 1,800 inner steps each, baseline, report
    diloco-testnet --nodes 6 --minutes 5 --kill-every 30 --downtime 15
    diloco-testnet --slow 2:4 --partition 40:60:0 --misbehave 1:garbage --wan 2gbit,30ms

Stages, each cleaning up after itself (also on Ctrl-C or SIGTERM): optional solo run (overlap), the
testnet (supervisor + live progress), the baseline (child process, its progress on the terminal), the
report (`report.md`, `report.json`, `loss.png` in the run directory). Interrupted at any stage after the
nodes started, it still writes the report of what ran (`testnet.finish`). `run_testnet(options)`
(`testnet.run`, the stages) is the same thing for scripts; `Options` and the checks before the start are
in `testnet.options`. This module is the command line: its flags, its exit status.

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
import functools
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import trio

from node.settings import REDUCED_CHAOS_MODES
from testnet.baseline_run import BaselineError
from testnet.checks import UsageError
from testnet.finish import Stage, interrupted_report
from testnet.options import Options, build_plan, check_inputs
from testnet.outcome import RunFailed
from testnet.procs import GroupRegistry, NodeStartError
from testnet.run import run_testnet, say
from testnet.wan import WanError

__all__ = ["DEMO_STEPS", "EXIT_STATUS", "STEPS_MINUTES", "Options", "build_plan", "check_inputs", "main", "parse_args",
           "run_testnet"]

# The demo's length in inner steps per node: ~1,800 kept the held-out loss within 5% of data-parallel's where
# ~800 did not (BENCHMARKS.md, session 25), whatever the machine's pace; at most STEPS_MINUTES minutes.
DEMO_STEPS = 1800
STEPS_MINUTES = 10.0

EXIT_STATUS = {0: "the run worked", 1: "the run failed (every node failed, no node trained, or the baseline failed), "
                                      "or its files could not be written (a full disk)",
               2: "bad arguments, or the nodes could not be started",
               130: "interrupted (the report of what ran is written)"}



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
    a("--minutes", type=float, help="length of the run from the first launch, or, with kills or partitions, "
                                    "from when every node trains; with --steps or --rounds, its upper bound "
                                    f"(default 2, or {STEPS_MINUTES:g} with --steps)")
    a("--steps", type=int, metavar="N",
      help="run until the nodes have taken N inner steps each on average (their /status), so that a run trains "
           "alike on a fast machine and a slow one, and end the learning-rate schedule there; --minutes is then "
           f"an upper bound (not with kills, partitions or --rounds) (default {DEMO_STEPS} when none of "
           "--minutes, --rounds, kills or partitions is given)")
    a("--model", default="tiny", help="model preset: tiny, small, base, large (default tiny)")
    a("--inner-steps", type=int, default=20, help="inner steps per round, H (default 20)")
    a("--outer-momentum", type=float, default=None, metavar="MU",
      help="every node's outer Nesterov momentum (default: diloco-node's, 0.6)")
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
    a("--traffic", choices=("all-to-all", "reduced"), default="all-to-all",
      help="how the nodes' updates travel: all-to-all (every node fetches every update), or reduced (diloco-node "
           "--traffic reduced: slots sealed, each shard reduced by one node and checked; ~2-3 updates in per node and "
           "round whatever --nodes is). reduced needs --rounds and no kills or partitions (a reduced node cannot "
           "sync a state yet); its --misbehave modes are poison:KIND and lie (default all-to-all)")
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
      help="NODE sends malformed frames (garbage) or invalid updates (bad-updates, default), or any mode of "
           "diloco-node --misbehave (poison:negate, lie with --traffic reduced, ...) (repeatable)")
    a("--wan", nargs="?", const="2gbit,30ms", metavar="RATE,DELAY,LOSS",
      help="each node in its own network namespace with an emulated link (default 2gbit,30ms; delay is one-way; "
           "loss e.g. 0.1%%): tc netem, or where the kernel lacks it a user-space delay line over TUN devices "
           "with tc tbf for the rate; needs root and iproute2, otherwise says why and runs on loopback")
    a("--baseline", action=argparse.BooleanOptionalAction, default=True,
      help="also train the data-parallel baseline on the same tokens (default on)")
    a("--solo-seconds", type=float, default=20.0, metavar="S",
      help="first run every node alone for S seconds once all of them train: in a run of --minutes the measured "
           "pace sets the learning-rate schedule to end with the run (without it the preset's horizon applies, "
           "10,000 steps for tiny); it also gives the overlap figure (default 20; 0 = skip)")
    a("--out", type=Path, default=Path("runs"), help="parent of the run directory (default runs)")
    a("--progress", choices=("auto", "rich", "plain", "quiet"), default="auto",
      help="live table (rich), periodic lines (plain), events only (quiet); auto = rich on a terminal")
    a("--start-timeout", type=float, default=180.0, help="seconds a node may take to print LISTENING (default 180)")
    a("--stop-grace", type=float, default=20.0, help="seconds between SIGTERM and SIGKILL at the end (default 20)")
    a("--poll-interval", type=float, default=1.0, help="seconds between /status polls (default 1)")
    a("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
      help="model/data/optimizer override for every node and the baseline alike, e.g. --set inner.lr=1e-3 "
           "(repeatable; keys as in diloco-node --set)")
    a("--insecure", action="store_true",
      help="start the nodes with --insecure: cleartext gossip and HTTP instead of TLS 1.3 (for benchmarks)")
    a("--node-arg", action="append", default=[], metavar="ARG", help="extra argument for every node (repeatable)")
    a("--jax-cache", default="auto", metavar="DIR",
      help="JAX compilation cache shared by the nodes, so restarts skip compiling (default auto = OUT/jax-cache; "
           "none = off)")
    a("--pin-cpus", action=argparse.BooleanOptionalAction, default=True,
      help="pin each node to an equal share of this machine's cores with taskset, as islands on their own "
           "hardware: unpinned, the kernel shares cores by thread and a node starting up on one thread gets "
           "less than its share beside multi-threaded trainers (default on; off, or when the nodes cannot "
           "share the cores equally, the kernel shares them)")
    a("--plan-only", action="store_true", help="print the fault plan and exit")
    ns = p.parse_args(argv)
    timed = ns.kill_every > 0 or bool(ns.partition) or ns.rounds is not None
    if ns.steps is None and ns.minutes is None and not timed:
        ns.steps = DEMO_STEPS
    if ns.steps is not None and timed:
        p.error("--steps goes with neither kills, partitions nor --rounds, whose times need a run of known length "
                "(give --minutes)")
    if ns.traffic == "reduced" and ns.rounds is None:
        p.error("--traffic reduced needs --rounds R: a reduced run's nodes stop together at its last slot")
    if ns.traffic == "reduced" and (ns.kill_every > 0 or ns.partition):
        p.error("--traffic reduced goes with neither kills nor partitions: a reduced node cannot sync a state yet, "
                "so a restarted or cut-off one stops")
    modes = {m.partition(":")[2] or "bad-updates" for m in ns.misbehave}  # as testnet.faults.parse_misbehave
    if ns.traffic == "reduced" and modes - set(REDUCED_CHAOS_MODES):
        p.error(f"--traffic reduced: --misbehave {', '.join(sorted(modes - set(REDUCED_CHAOS_MODES)))} is not built "
                f"there (built: {', '.join(REDUCED_CHAOS_MODES)})")
    if ns.traffic != "reduced" and "lie" in modes:
        p.error("--misbehave NODE:lie is an aggregator's lie: it needs --traffic reduced")
    if ns.minutes is None:
        ns.minutes = STEPS_MINUTES if ns.steps is not None else 2.0
    at_least = {"--nodes": (ns.nodes, 1), "--inner-steps": (ns.inner_steps, 1), "--rounds": (ns.rounds, 1),
                "--steps": (ns.steps, 1),
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
    return Options(nodes=ns.nodes, minutes=ns.minutes, steps=ns.steps, model=ns.model, inner_steps=ns.inner_steps,
                   outer_momentum=ns.outer_momentum,
                   compression=ns.compression, data=data, seed=ns.seed, eval_every=ns.eval_every,
                   eval_batches=ns.eval_batches, rounds=ns.rounds, jax_cache=ns.jax_cache,
                   kill_every=ns.kill_every, downtime=ns.downtime, first_kill=ns.first_kill, settle=ns.settle,
                   slow=tuple(ns.slow), partition=tuple(ns.partition), misbehave=tuple(ns.misbehave), wan=ns.wan,
                   baseline=ns.baseline, solo_seconds=ns.solo_seconds, out=ns.out, progress=ns.progress,
                   start_timeout=ns.start_timeout, stop_grace=ns.stop_grace, poll_interval=ns.poll_interval,
                   node_args=tuple(ns.node_arg), insecure=ns.insecure, overrides=tuple(ns.overrides), plan_only=ns.plan_only,
                   pin_cpus=ns.pin_cpus, traffic=ns.traffic)


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
            interrupted_report(stage, say)
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
