"""`diloco-node`: one training node of a peer-to-peer Decoupled DiLoCo run (docs/node-contract.md).

stdout carries exactly two kinds of lines, flushed: `LISTENING <peer_id> <gossip host:port> <http host:port>`
once both listeners are up, and `STOPPED <slot> <ledger digest hex> <params digest hex>` at the end.
Logs (one line per event, with the peer id) go to stderr. Exit status: 0 after `--max-rounds` or a
SIGTERM/SIGINT (goodbye and checkpoint first), 2 for bad arguments, configuration, key or data,
1 for anything else. A second SIGTERM/SIGINT stops at once (exit 1).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

__all__ = ["build_parser", "main", "settings_from_args"]

EPILOG = """\
stdout: "LISTENING <peer_id> <gossip host:port> <http host:port>" once listening, and at the end
"STOPPED <slot> <ledger digest> <params digest>". Logs go to stderr. Exit 0 after --max-rounds or
SIGTERM/SIGINT (goodbye and checkpoint first), 2 for bad arguments, key, config or data.

Run-wide flags (every node of a run must agree): --run-id, --model, --set, --seed, --window, --outer-lr,
--outer-momentum, --heartbeat.

Environment: JAX_COMPILATION_CACHE_DIR=DIR (with JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0) keeps
compiled steps between starts, which cuts a restart's start-up from tens of seconds to a few.

Example, three nodes on one machine:
  python -m node.cli --run-id demo --key a.key --listen 127.0.0.1:7000 --http 127.0.0.1:8000 --max-rounds 20
  python -m node.cli --run-id demo --key b.key --listen 127.0.0.1:7001 --http 127.0.0.1:8001 --peers 127.0.0.1:7000 --max-rounds 20
  python -m node.cli --run-id demo --key c.key --listen 127.0.0.1:7002 --http 127.0.0.1:8002 --peers 127.0.0.1:7000 --max-rounds 20
  curl -s 127.0.0.1:8000/status
"""


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="diloco-node", description="One node of a peer-to-peer Decoupled DiLoCo training run.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    net = p.add_argument_group("network")
    net.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                     help="gossip TCP address; port 0 picks a free one (default %(default)s)")
    net.add_argument("--http", default="127.0.0.1:0", metavar="HOST:PORT",
                     help="HTTP address for /status, /metrics, /state, /blobs/<sha256>; port 0 picks one; "
                          "served on the --listen host (default %(default)s)")
    net.add_argument("--peers", type=_csv, default=(), metavar="ADDR[,ADDR...]",
                     help="bootstrap gossip addresses; with peers the node first syncs the freshest state "
                          "(default: none, start a new run)")
    net.add_argument("--run-id", required=True, metavar="ID", help="the run; peers of other runs are refused")
    net.add_argument("--key", required=True, type=Path, metavar="FILE",
                     help="Ed25519 key file (libp2p format, mode 0600), created if missing; its peer id names "
                          "the node and picks its data shard")
    net.add_argument("--heartbeat", type=float, default=1.0, metavar="SECONDS",
                     help="gossip heartbeat interval; a peer silent for 5 heartbeats is gone (default %(default)s)")
    train = p.add_argument_group("training")
    train.add_argument("--data", type=_csv, default=(), metavar="PATH|DIR|GLOB[,...]",
                       help="text or pre-tokenized .npy/.bin sources (default: the embedded Python stdlib corpus)")
    train.add_argument("--model", default="tiny", metavar="PRESET",
                       help="model preset: tiny, small, base, large (default %(default)s)")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="config override, repeatable, e.g. --set batch_size=8 --set inner.lr=1e-3")
    train.add_argument("--inner-steps", type=int, default=50, metavar="H",
                       help="inner optimizer steps per round (default %(default)s)")
    train.add_argument("--adaptive-steps", action=argparse.BooleanOptionalAction, default=True,
                       help="end a round when the peers' measured round time is used up (at most H steps), "
                            "so a slow node sends a smaller update on time instead of a full one late "
                            "(default on; --no-adaptive-steps: always H steps)")
    train.add_argument("--max-rounds", type=int, default=None, metavar="N",
                       help="after N rounds: drain (wait for the peers), goodbye, checkpoint, print STOPPED, "
                            "exit 0 (default: run until SIGTERM/SIGINT)")
    train.add_argument("--compression", default="int4", choices=("fp32", "bf16", "int8", "int4"),
                       help="pseudo-gradient codec, with error feedback (default %(default)s: 7.5x smaller than "
                            "fp32, see BENCHMARKS.md)")
    train.add_argument("--seed", type=int, default=0, metavar="N",
                       help="seed of the initial parameters and the data order (default %(default)s)")
    train.add_argument("--window", type=int, default=8, metavar="W",
                       help="closed slots a late update can still be folded into exactly (default %(default)s)")
    train.add_argument("--quorum", type=int, default=1, metavar="K",
                       help="updates a slot needs before it closes early; the deadline (half a round after "
                            "the own round, while the next one trains) closes it anyway (default %(default)s)")
    train.add_argument("--outer-lr", type=float, default=0.7, metavar="ETA",
                       help="outer Nesterov learning rate, applied by every node (default %(default)s, DiLoCo's)")
    train.add_argument("--outer-momentum", type=float, default=0.9, metavar="MU",
                       help="outer Nesterov momentum (default %(default)s, DiLoCo's)")
    ev = p.add_argument_group("evaluation and checkpoints")
    ev.add_argument("--eval-every", type=int, default=5, metavar="ROUNDS",
                    help="held-out bits-per-byte every ROUNDS rounds, and once before the first; 0: never "
                         "(default %(default)s)")
    ev.add_argument("--eval-budget", type=float, default=0.02, metavar="FRACTION",
                    help="postpone a due evaluation while evaluations took more than FRACTION of the process's "
                         "time; 1: no limit (default %(default)s)")
    ev.add_argument("--eval-batches", type=int, default=4, metavar="N",
                    help="fixed held-out batches per evaluation (default %(default)s)")
    ev.add_argument("--checkpoint-dir", type=Path, default=None, metavar="DIR",
                    help="checkpoints and blobs; a restart resumes from the newest valid checkpoint here "
                         "(default: none, blobs in a temporary directory)")
    ev.add_argument("--checkpoint-every", type=int, default=1, metavar="ROUNDS",
                    help="write a checkpoint every ROUNDS rounds, at most one per --checkpoint-interval "
                         "(default %(default)s)")
    ev.add_argument("--checkpoint-interval", type=float, default=30.0, metavar="SECONDS",
                    help="at least this long between checkpoints (the first one after the first round); written "
                         "in the background while the next round trains (default %(default)s)")
    ev.add_argument("--keep-checkpoints", type=int, default=3, metavar="K",
                    help="checkpoints kept (default %(default)s)")
    ev.add_argument("--sync-timeout", type=float, default=60.0, metavar="SECONDS",
                    help="how long a joiner looks for a peer state before starting from its own "
                         "(default %(default)s)")
    ev.add_argument("--drain-timeout", type=float, default=None, metavar="SECONDS",
                    help="at the end, stop waiting for the peers after this long without progress "
                         "(default: 6 heartbeat timeouts or 3 rounds, whichever is longer)")
    ev.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                    help="stderr log level (default %(default)s)")
    chaos = p.add_argument_group("chaos (testing)")
    chaos.add_argument("--slowdown", type=float, default=1.0, metavar="FACTOR",
                       help="every inner step takes FACTOR times as long (default %(default)s)")
    chaos.add_argument("--misbehave", choices=("garbage", "bad-updates"), default=None,
                       help="also send malformed frames / invalid updates that honest peers must refuse")
    chaos.add_argument("--allow-chaos", action="store_true",
                       help='enable POST /chaos {"block_peers": [ids], "seconds": T} (off by default)')
    return p


def settings_from_args(args: argparse.Namespace):  # -> NodeSettings (imported lazily: no JAX for --help)
    from node.settings import NodeSettings

    return NodeSettings(
        run_id=args.run_id, key_path=args.key, listen=args.listen, http=args.http, peers=args.peers, data=args.data,
        model=args.model, overrides=tuple(args.overrides), inner_steps=args.inner_steps,
        adaptive_steps=args.adaptive_steps, max_rounds=args.max_rounds, checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every, checkpoint_interval_s=args.checkpoint_interval,
        keep_checkpoints=args.keep_checkpoints, eval_budget=args.eval_budget,
        compression=args.compression, eval_every=args.eval_every, eval_batches=args.eval_batches, seed=args.seed,
        window=args.window, quorum=args.quorum, outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum, heartbeat_s=args.heartbeat, sync_timeout_s=args.sync_timeout,
        drain_timeout_s=args.drain_timeout, slowdown=args.slowdown, misbehave=args.misbehave,
        allow_chaos=args.allow_chaos)


async def _serve(runtime) -> int:
    async def signals(cancel: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            async for signum in received:
                if runtime.stop_requested():
                    logging.getLogger("node.cli").error("second signal: stopping at once")
                    cancel.cancel()
                    return
                runtime.request_stop(signal.Signals(signum).name)

    async def node(cancel: trio.CancelScope, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await runtime.run(task_status=task_status)
        cancel.cancel()  # the signal watcher

    async with trio.open_nursery() as nursery:
        nursery.start_soon(signals, nursery.cancel_scope)
        await nursery.start(node, nursery.cancel_scope)
        print(f"LISTENING {runtime.peer_id} {runtime.host.gossip_addr} {runtime.host.http_addr}", flush=True)
    if runtime.result is None:
        return 1
    print(runtime.result.line(), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the node, return the exit status."""
    args = build_parser().parse_args(argv)
    from node.logs import setup_logging

    setup_logging(args.log_level)
    log = logging.getLogger("node.cli")
    from node.config import ConfigError
    from node.data import DataError
    from protocol.identity import KeyFileError

    try:
        from node.runtime import NodeRuntime

        runtime = NodeRuntime(settings_from_args(args))
    except (ConfigError, KeyFileError) as exc:
        log.error("%s", exc)
        print(f"diloco-node: error: {exc}", file=sys.stderr)
        return 2
    try:
        return trio.run(_serve, runtime)
    except (ConfigError, DataError) as exc:
        log.error("%s", exc)
        return 2
    except BaseExceptionGroup as group:  # raised inside the node's nursery
        bad, other = group.split((ConfigError, DataError))
        if other is not None:
            raise
        for exc in bad.exceptions:
            log.error("%s", exc)
        return 2


if __name__ == "__main__":
    sys.exit(main())
