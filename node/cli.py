"""`diloco-node`: one training node of a peer-to-peer Decoupled DiLoCo run (docs/node-contract.md).

stdout carries exactly two kinds of lines, flushed: `LISTENING <peer_id> <gossip host:port> <http host:port>`
once both listeners are up, and `STOPPED <slot> <ledger digest hex> <params digest hex>` at the end (a
follower process of an island of several hosts prints `ISLAND <process id> <processes> <coordinator>` only:
`node.island.multihost`).
Logs (one line per event, with the peer id) go to stderr; a user error is one line
`diloco-node: error: <flag>: <what is wrong>` on stderr, before `LISTENING` where it can be known then.
Exit status: 0 after `--max-rounds` or a SIGTERM/SIGINT (goodbye and checkpoint first), 2 for bad
arguments, addresses, configuration, key or data, 1 for anything else (including `--sync-timeout`
passing). Stopping is bounded: the drain after `--max-rounds` waits at most 4 × `--drain-timeout`, and
a SIGTERM/SIGINT stops within `--stop-timeout`; a second SIGTERM/SIGINT stops at once (exit 1).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio

__all__ = ["build_parser", "main", "node_runtime", "settings_from_args"]

EPILOG = """\
stdout: "LISTENING <peer_id> <gossip host:port> <http host:port>" once listening, and at the end
"STOPPED <slot> <ledger digest> <params digest>". Logs go to stderr. Exit 0 after --max-rounds or
SIGTERM/SIGINT (the round in flight published as it stands, goodbye and checkpoint first; at most
--stop-timeout), 2 for bad arguments, addresses,
key, config or data (one line, "diloco-node: error: ..."), 1 otherwise.

On several hosts: listen on every interface and say how peers reach this node when it cannot tell:
  diloco-node --run-id R --key node.key --listen 0.0.0.0:7000 --http 0.0.0.0:8000 --advertise 203.0.113.7
A node with --peers never starts a run of its own: until a peer answers it waits, logging each failed
dial; GET /status shows "waiting_for" and "dial_failures".

One node over several hosts (an island of N processes, one mesh over all their devices): the same command
on each host with --coordinator HOST_A:PORT --num-processes N --process-id I; process 0 is the node, the
others print "ISLAND <id> <N> <coordinator>" and train their devices' share (docs/deployment.md).

Links: TLS 1.3 on both ports by default (nothing to set up: the certificate is made from --key, and proves
its peer id to every peer, as libp2p's TLS does); the HTTP plane is https. Anyone may read an open run's
HTTP plane; in a closed run an outsider gets only GET /health, and members' certificates the rest.
--insecure turns TLS off on both planes (benchmarks and tests on a trusted network).

Run-wide settings (every node of a run must agree; a joiner with --peers takes them from the run): --model,
--set, --seed, --inner-steps, --compression, --window, --outer-lr, --outer-momentum, --outer-rule, --norm-clip,
--max-rounds (the run's last slot), --closed/--membership, --traffic/--roster. All flags can come from a TOML file: --config node.toml.

Environment: JAX_COMPILATION_CACHE_DIR=DIR (with JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0) keeps
compiled steps between starts, which cuts a restart's start-up from tens of seconds to a few.

Example, three nodes on one machine:
  python -m node.cli --run-id demo --key a.key --listen 127.0.0.1:7000 --http 127.0.0.1:8000 --max-rounds 20
  python -m node.cli --run-id demo --key b.key --listen 127.0.0.1:7001 --http 127.0.0.1:8001 --peers 127.0.0.1:7000 --max-rounds 20
  python -m node.cli --run-id demo --key c.key --listen 127.0.0.1:7002 --http 127.0.0.1:8002 --peers 127.0.0.1:7000 --max-rounds 20
  curl -sk https://127.0.0.1:8000/status
"""


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def build_parser(model_name: str | None = None) -> argparse.ArgumentParser:
    """The command line of `diloco-node`; with `model_name` (a library user's program, `diloco.run`), the same
    under the program's name, without the flags that choose diloco-node's own model in `--help`."""
    from protocol.compression.formats import codec_names  # numpy only; the codecs registered by now

    own = model_name is None
    p = argparse.ArgumentParser(
        prog="diloco-node" if own else Path(sys.argv[0]).name,
        description="One node of a peer-to-peer Decoupled DiLoCo training run"
                    + ("." if own else f", training {model_name} (flags as for diloco-node)."),
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    mine = argparse.SUPPRESS  # the help of a flag that chooses diloco-node's own model, in a library program
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help="read flags from a TOML file (keys: the flag names without dashes; flags given here "
                        "override it; see node/configfile.py)")
    net = p.add_argument_group("network")
    net.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                     help="gossip TCP address; port 0 picks a free one (default %(default)s)")
    net.add_argument("--http", default="127.0.0.1:0", metavar="HOST:PORT",
                     help="HTTP address for /status, /metrics, /state, /blobs/<sha256>; port 0 picks one; "
                          "served on the --listen host (default %(default)s)")
    net.add_argument("--peers", type=_csv, default=(), metavar="ADDR[,ADDR...]",
                     help="bootstrap gossip addresses; with peers the node first syncs the run's freshest state "
                          "and never starts a run of its own: it keeps dialling (each failure logged, and shown "
                          "in /status) until a peer answers (default: none, start a new run)")
    net.add_argument("--advertise", default="", metavar="HOST[:PORT]",
                     help="the address peers reach this node at, for gossip (PORT, default the bound one) and "
                          "HTTP (the --http port); needed behind NAT or a load balancer (default: the --listen "
                          "host; for a wildcard --listen such as 0.0.0.0, the address of the interface that "
                          "reaches the first --peers address, else this host's only non-loopback address)")
    net.add_argument("--advertise-http", default="", metavar="HOST:PORT",
                     help="the address peers fetch blobs and state from, when it differs from the --advertise "
                          "host with the --http port (default: that)")
    net.add_argument("--insecure", action="store_true",
                     help="cleartext gossip and HTTP, for benchmarks and tests on a trusted network only. By default "
                          "every link is TLS 1.3, both ends proving their peer id by certificate (libp2p's TLS "
                          "scheme), and the HTTP plane is https; TLS nodes and --insecure nodes refuse each other "
                          "(cleartext_peer / tls_peer), and a closed run's HTTP plane is only closed with TLS")
    net.add_argument("--reachability", choices=("auto", "public", "private"), default="auto",
                     help="whether peers can dial this node. auto: ask connected peers to dial it back (as "
                          "libp2p's AutoNAT does); /status says \"reachable\". A node nobody can dial (behind a NAT, "
                          "a firewall, no public port) still takes part: before it publishes an update it pushes "
                          "the payload over connections it opened to peers that can be dialled, which serve it "
                          "on; nothing to forward. public / private: skip the question (default %(default)s)")
    net.add_argument("--run-id", required=True, metavar="ID", help="the run; peers of other runs are refused")
    net.add_argument("--key", required=True, type=Path, metavar="FILE",
                     help="Ed25519 key file (libp2p format, mode 0600), created if missing; its peer id names "
                          "the node and picks its data shard")
    admission = net.add_mutually_exclusive_group()
    admission.add_argument("--closed", action="store_true",
                           help="found a closed run: only this node's key and the keys it admits take part "
                                "(diloco-admit grant --key THIS_KEY ...); other keys are refused (not_admitted)")
    admission.add_argument("--membership", type=Path, default=None, metavar="FILE",
                           help="join a closed run: the membership file its founder granted to --key's peer id "
                                "(diloco-admit id --key FILE prints it); default: an open run, anyone may join")
    net.add_argument("--adopt", action=argparse.BooleanOptionalAction, default=True,
                     help="with --peers: before starting, read the run's configuration from a bootstrap peer and "
                          "train with it, so only --run-id and --peers are needed to join; a run-wide flag given "
                          "here that differs from the run's is an error naming it (default: on)")
    net.add_argument("--heartbeat", type=float, default=1.0, metavar="SECONDS",
                     help="gossip heartbeat interval; a peer silent for 5 heartbeats is gone (default %(default)s)")
    train = p.add_argument_group("training")
    train.add_argument("--data", type=_csv, default=(), metavar="PATH|DIR|GLOB[,...]",
                       help="text files, folders or globs (read as bytes, or encoded with --set tokenizer=FILE), or "
                            "pre-tokenized .npy/.bin files, each optionally with a NAME.json sidecar giving vocab_size "
                            "and dtype (docs/data.md) (default: the embedded Python stdlib corpus)" if own else mine)
    train.add_argument("--model", default="tiny", metavar="PRESET",
                       help="model preset: tiny, small, base, large (default %(default)s)" if own else mine)
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="config override, repeatable, e.g. --set batch_size=8 --set inner.lr=1e-3; --set "
                            "tokenizer=tokenizer.json encodes text with a tokenizers file (diloco-tokenizer train makes "
                            "one; every node needs the same file); vocab_size defaults to the data's" if own else mine)
    train.add_argument("--mesh", default=None, metavar="data=D,fsdp=F",
                       help="how the island lays its training over this host's devices (D x F of them): the "
                            "batch split over both axes, parameters, gradients and AdamW state sharded over fsdp "
                            "(FSDP: each device holds 1/F of every large tensor) and replicated over data (default: "
                            "data over every device while a replicated copy takes at most half of one device's "
                            "memory, fsdp over every device otherwise; docs/deployment.md)")
    train.add_argument("--remat", action="store_true",
                       help="recompute each layer's activations in the backward pass instead of keeping them: "
                            "less device memory for activations, about a third more compute per step (default off)")
    train.add_argument("--inner-steps", type=int, default=50, metavar="H",
                       help="inner optimizer steps per round (default %(default)s)")
    train.add_argument("--adaptive-steps", action=argparse.BooleanOptionalAction, default=True,
                       help="end a round when the peers' measured round time is used up (at most H steps), "
                            "so a slow node sends a smaller update on time instead of a full one late "
                            "(default on; --no-adaptive-steps: always H steps)")
    train.add_argument("--max-rounds", type=int, default=None, metavar="N",
                       help="the run ends at slot N (about N rounds of each node; run-wide: a joiner takes it "
                            "from the run): once there, drain (wait for the peers), evaluate the final model, "
                            "goodbye, checkpoint, print STOPPED, exit 0 (default: run until SIGTERM/SIGINT)")
    train.add_argument("--compression", default="int4", choices=codec_names(),
                       help="pseudo-gradient codec, with error feedback (default %(default)s: 7.5x smaller than "
                            "fp32, see BENCHMARKS.md); Python code may register more before the node starts "
                            "(protocol.compression.formats.register_codec)")
    train.add_argument("--seed", type=int, default=0, metavar="N",
                       help="seed of the initial parameters and the data order (default %(default)s)")
    train.add_argument("--window", type=int, default=8, metavar="W",
                       help="closed slots a late update can still be folded into exactly (default %(default)s)")
    train.add_argument("--quorum", type=int, default=1, metavar="K",
                       help="updates a slot needs before it closes early; the deadline (half a round after "
                            "the own round, while the next one trains) closes it anyway (default %(default)s)")
    train.add_argument("--outer-lr", type=float, default=0.7, metavar="ETA",
                       help="outer Nesterov learning rate, applied by every node (default %(default)s, DiLoCo's)")
    train.add_argument("--outer-momentum", type=float, default=0.6, metavar="MU",
                       help="outer Nesterov momentum (default %(default)s: below DiLoCo's 0.9, tuned for "
                            "synchronous rounds of H = 500; our slots close on the updates that arrived and fold "
                            "the others in later, and a higher momentum carries each partial step: 3-node runs "
                            "of the demo and of a user's transformer measured 1.01 x data-parallel at 0.6, "
                            "1.03-1.23 at 0.8; BENCHMARKS.md, issue 44)")
    train.add_argument("--outer-rule", default="nesterov", metavar="NAME",
                       help="the outer optimizer every node applies at each slot (default %(default)s: SGD with "
                            "Nesterov momentum, --outer-lr and --outer-momentum); Python code registers others "
                            "with protocol.ledger.rules.register_rule before it runs the node (docs/library.md)")
    train.add_argument("--norm-clip", type=float, default=1.0, metavar="K",
                       help="bound on any one update's influence: per tensor, updates larger than K x the slot's "
                            "median norm enter with that norm; 0 turns the bound off (default %(default)s; "
                            "PROTOCOL.md section 11c, docs/threat-model.md)")
    traffic = p.add_argument_group(
        "traffic that does not grow with the run",
        "--traffic reduced: each slot sealed once, each shard of the model reduced by one aggregator and checked by "
        "others: ~2-3 updates' bytes in per node and round whatever the run's size, against N - 1 all-to-all "
        "(docs/deployment.md, \"Many nodes\"). Every node starts together with the same --roster; one that "
        "restarts or comes late cannot catch up yet (it stops, saying so), and no checkpoints are written")
    traffic.add_argument("--traffic", choices=("all-to-all", "reduced"), default="all-to-all",
                         help="how updates travel (run-wide; default %(default)s: every node fetches every update)")
    traffic.add_argument("--roster", type=Path, default=None, metavar="FILE",
                         help="with --traffic reduced: the run's contributors, one peer id a line (diloco-admit id "
                              "--key FILE prints a key's); run-wide, this node's own among them")
    traffic.add_argument("--slot-patience", type=float, default=30.0, metavar="SECONDS",
                         help="reduced: how long a sealer waits for every contributor's update after publishing its "
                              "own; a slower contributor's update is carried into the next slot (default %(default)s)")
    traffic.add_argument("--slot-step", type=float, default=3.0, metavar="SECONDS",
                         help="reduced: the slot clock's step: between sealers, before a silent aggregator is "
                              "passed over, and after a slot settles (default %(default)s); must exceed the time to "
                              "fetch and reduce a shard")
    island = p.add_argument_group(
        "an island of several hosts",
        "one node trained by several processes, one per host, over one JAX mesh of all their devices "
        "(jax.distributed): start every process with the same command line but its --process-id. Process 0 "
        "speaks for the island (network, ledger, HTTP, checkpoints, data); the others train their shards. When "
        "one process dies the others exit within 10 s; restart them together (docs/deployment.md)")
    island.add_argument("--coordinator", default="", metavar="HOST:PORT",
                        help="where process 0 serves JAX's coordination service (process 0's host, a free port)")
    island.add_argument("--num-processes", type=int, default=1, metavar="N",
                        help="processes in the island (default %(default)s: this process alone)")
    island.add_argument("--process-id", type=int, default=0, metavar="I",
                        help="this process's index, 0 to N-1; 0 speaks for the island (default %(default)s)")
    ev = p.add_argument_group("evaluation and checkpoints")
    ev.add_argument("--eval-every", type=int, default=5, metavar="ROUNDS",
                    help="held-out loss (bits per byte; a library model's own metric) every ROUNDS rounds, once "
                         "before the first and of the final model at the end; 0: never (default %(default)s)")
    ev.add_argument("--eval-budget", type=float, default=0.02, metavar="FRACTION",
                    help="postpone a due evaluation while evaluations took more than FRACTION of the process's "
                         "time (logged; taken anyway 4 x --eval-every rounds late); 1: no limit (default "
                         "%(default)s)")
    ev.add_argument("--eval-batches", type=int, default=4, metavar="N",
                    help="fixed held-out batches per evaluation (default %(default)s)")
    ev.add_argument("--fork-tolerance", type=float, default=0.1, metavar="FRACTION",
                    help="after a fork, adopt the heavier side's state only if its held-out loss is at most "
                         "(1 + FRACTION) x ours (its weight is its server's word: a hostile peer could claim "
                         "any); when joining, take a peer's state only if it is at most that much worse than "
                         "our starting model; inf: adopt without evaluating (default %(default)s; "
                         "docs/threat-model.md)")
    ev.add_argument("--checkpoint-dir", type=Path, default=None, metavar="DIR",
                    help="checkpoints and blobs; a restart resumes from the newest valid checkpoint here "
                         "(default: none, blobs in a temporary directory)")
    ev.add_argument("--checkpoint-every", type=int, default=1, metavar="ROUNDS",
                    help="write a checkpoint every ROUNDS rounds, at most one per --checkpoint-interval "
                         "(default %(default)s)")
    ev.add_argument("--checkpoint-interval", type=float, default=30.0, metavar="SECONDS",
                    help="at least this long between checkpoints (the first one after the first round); written "
                         "in the background while the next round trains (default %(default)s)")
    ev.add_argument("--inflight-every", type=float, default=2.0, metavar="SECONDS",
                    help="with --checkpoint-dir: write the round in flight (its pseudo-gradient so far) there at "
                         "most every SECONDS, and never more than 5%% of the round's time, so that a crash loses "
                         "seconds of training, not the round; the next start publishes it; 0: off (default "
                         "%(default)s)")
    ev.add_argument("--keep-checkpoints", type=int, default=3, metavar="K",
                    help="checkpoints kept (default %(default)s)")
    ev.add_argument("--sync-timeout", type=float, default=None, metavar="SECONDS",
                    help="with --peers: give up (exit 1) when no peer state could be had within SECONDS "
                         "(default: keep trying until stopped)")
    ev.add_argument("--drain-timeout", type=float, default=None, metavar="SECONDS",
                    help="at the end (--max-rounds), stop waiting for the peers after this long without "
                         "progress, and after 4 times this long in all, whatever the peers do (default: 6 "
                         "heartbeat timeouts or 3 rounds, whichever is longer)")
    ev.add_argument("--stop-timeout", type=float, default=120.0, metavar="SECONDS",
                    help="after SIGTERM/SIGINT the node finishes its inner step, says goodbye (at most 1 s) and "
                         "writes a final checkpoint; past SECONDS it stops at once, without them (exit 1) "
                         "(default %(default)s)")
    ev.add_argument("--log-format", default="text", choices=("text", "json"),
                    help="stderr (and --log-file) lines: text for people, json for log collectors (one object "
                         "per line: time, level, peer, logger, message) (default %(default)s)")
    ev.add_argument("--metrics-file", type=Path, default=None, metavar="FILE",
                    help="append the node's figures (loss, held-out, tokens/s, bytes, slot) after every round as one "
                         "JSON object per line, for an experiment tracker (default: off; node/metrics.py)")
    ev.add_argument("--log-file", type=Path, default=None, metavar="FILE",
                    help="also append the log lines to FILE")
    ev.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                    help="stderr log level (default %(default)s)")
    chaos = p.add_argument_group("chaos (testing)")
    chaos.add_argument("--slowdown", type=float, default=1.0, metavar="FACTOR",
                       help="every inner step takes FACTOR times as long (default %(default)s)")
    from node.settings import CHAOS_MODES

    chaos.add_argument("--misbehave", choices=CHAOS_MODES, default=None, metavar="MODE",
                       help="act as a hostile peer: garbage (malformed frames), bad-updates (also publish "
                            "invalid updates), flood (also publish 6 more validly signed updates per round for "
                            "the same slot), unproven (also publish its update without its closed-run "
                            "membership), tarpit (serve blobs one byte per 20 s), forge-state (serve a state "
                            "claiming 2^40 more tokens with garbage parameters, and ask every peer to compare "
                            "with it), poison:negate|scale|random|tokens|collude (publish a ×10⁴ negated, "
                            "scaled or random-direction update instead of its own, claiming the most tokens "
                            "the run allows; tokens: claiming 2^40; collude: a random direction that every "
                            "colluder publishing into a slot shares), lie (--traffic reduced: every shard it "
                            "reduces is published negated). With --traffic reduced only the poison kinds and lie "
                            "are built. Honest peers must refuse or bound them")
    chaos.add_argument("--allow-chaos", action="store_true",
                       help='enable POST /chaos {"block_peers": [ids], "seconds": T} (off by default)')
    return p


def settings_from_args(args: argparse.Namespace):  # -> NodeSettings (imported lazily: no JAX for --help)
    from node.island.config import MeshShape
    from node.settings import NodeSettings

    return NodeSettings(
        run_id=args.run_id, key_path=args.key, listen=args.listen, http=args.http, peers=args.peers,
        advertise=args.advertise, advertise_http=args.advertise_http, insecure=args.insecure, reachability=args.reachability, data=args.data,
        model=args.model, overrides=tuple(args.overrides), inner_steps=args.inner_steps,
        mesh=MeshShape.parse(args.mesh) if args.mesh else None, remat=args.remat,
        adaptive_steps=args.adaptive_steps, max_rounds=args.max_rounds, checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every, checkpoint_interval_s=args.checkpoint_interval,
        inflight_every_s=args.inflight_every,
        keep_checkpoints=args.keep_checkpoints, eval_budget=args.eval_budget,
        compression=args.compression, eval_every=args.eval_every, eval_batches=args.eval_batches,
        fork_tolerance=args.fork_tolerance, seed=args.seed,
        window=args.window, quorum=args.quorum, outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum, outer_rule=args.outer_rule, norm_clip=args.norm_clip, heartbeat_s=args.heartbeat, sync_timeout_s=args.sync_timeout,
        drain_timeout_s=args.drain_timeout, slowdown=args.slowdown, misbehave=args.misbehave,
        allow_chaos=args.allow_chaos, closed=args.closed, membership=args.membership, metrics_file=args.metrics_file,
        traffic=args.traffic, roster=args.roster, slot_patience_s=args.slot_patience, slot_step_s=args.slot_step)


async def _serve(runtime, stop_timeout_s: float) -> int:
    async def signals(cancel: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            async for signum in received:
                if runtime.stop_requested():
                    logging.getLogger("node.cli").error("second signal: stopping at once")
                    cancel.cancel()
                    return
                runtime.request_stop(signal.Signals(signum).name)
                cancel.deadline = min(cancel.deadline, trio.current_time() + stop_timeout_s)

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


ADDRESS_FLAGS = {"gossip": "--listen", "http": "--http", "advertise": "--advertise"}


def _user_error(exc: BaseException) -> tuple[int, str] | None:
    """(exit status, one-line message) for an error the user can fix; None for a bug."""
    from node.island.config import ConfigError
    from node.island.data import DataError
    from node.island.task import TaskDataError, TaskError
    from node.reduced.runtime import ReducedBehind
    from node.sync.join import NoPeerState
    from p2p.errors import AddressError
    from protocol.identity import KeyFileError

    if isinstance(exc, AddressError):
        return 2, f"{ADDRESS_FLAGS[exc.what]}: {exc}"
    if isinstance(exc, (TaskDataError, TaskError)):  # a library task's data, or a Model or Task diloco cannot train
        return 2, str(exc)
    if isinstance(exc, DataError):
        return 2, f"--data: {exc}"
    if isinstance(exc, (ConfigError, KeyFileError)):
        return 2, str(exc)
    if isinstance(exc, NoPeerState):
        return 1, f"--peers: {exc}"
    if isinstance(exc, ReducedBehind):
        return 1, f"--traffic reduced: {exc}"
    return None


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, in order."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _report(exc: BaseException) -> int:
    """Print each user error inside `exc` once, on one line; re-raise if any part of it is a bug."""
    leaves = _leaves(exc)
    errors = [_user_error(leaf) for leaf in leaves]
    if any(e is None for e in errors):
        bugs = [leaf for leaf, e in zip(leaves, errors) if e is None]
        if len(bugs) == 1 and bugs[0] is not exc:  # its own traceback, not the task groups' around it
            raise bugs[0].with_traceback(bugs[0].__traceback__) from None
        raise exc
    for _, message in dict.fromkeys(errors):  # an error reported by two tasks is printed once
        print(f"diloco-node: error: {message}", file=sys.stderr, flush=True)
    return max(status for status, _ in errors)


def explicit_flags(argv: Sequence[str] | None) -> frozenset[str]:
    """The destinations (NodeSettings fields) of the options given on the command line, defaults aside."""
    parser = build_parser("")
    for action in parser._actions:
        action.default = argparse.SUPPRESS
        action.required = False  # --run-id and --key may come from a --config file
    return frozenset(vars(parser.parse_known_args(argv)[0]))


def parse(argv: Sequence[str] | None = None, model_name: str | None = None) -> tuple[argparse.Namespace, frozenset[str]]:
    """The arguments, a `--config` file's settings under the command line's, and the destinations the user
    set (in the file or on the command line). Exits 2 with one line for a bad file. `model_name`: see
    `build_parser`."""
    from node.configfile import ConfigFileError, apply_config_file

    parser, pre = build_parser(model_name), argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", type=Path, default=None)
    known, _ = pre.parse_known_args(argv)
    try:
        from_file = apply_config_file(parser, known.config) if known.config is not None else frozenset()
    except ConfigFileError as exc:
        parser.exit(2, f"diloco-node: error: {exc}\n")
    return parser.parse_args(argv), from_file | explicit_flags(argv)


CLI_MODEL_FLAGS = {"model": "--model", "overrides": "--set", "data": "--data"}


def main(argv: Sequence[str] | None = None, task: Any = None, on_metrics: Any = None) -> int:
    """Parse the command line, run the node, return the exit status (see the module docstring). `task`: a
    library user's model and data (`diloco.run`, `node.island.task.Task`); None trains the CLI's byte-level
    model of `--model`, `--set` and `--data`. `on_metrics`: called with the node's figures after every round
    (`node.metrics`)."""
    args, given = parse(argv, None if task is None else task.model.name)
    if task is not None and (flags := [flag for dest, flag in CLI_MODEL_FLAGS.items() if dest in given]):
        print(f"diloco-node: error: {', '.join(flags)} choose the byte-level model of diloco-node; this program "
              f"trains its own ({task.model.name})", file=sys.stderr)
        return 2
    from node.logs import setup_logging

    try:
        setup_logging(args.log_level, log_format=args.log_format, log_file=args.log_file)
    except OSError as exc:
        print(f"diloco-node: error: --log-file {args.log_file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    from node.island import multihost

    island = multihost.current()
    try:
        island = multihost.join(args.coordinator, args.num_processes, args.process_id)  # before JAX is used
        if not island.speaks:
            from node.island.follow import follow

            print(f"ISLAND {island.process_id} {island.process_count} {args.coordinator}", flush=True)
            follow(island, task)
            return 0
        try:
            status = _speak(args, given, task, on_metrics)
        finally:
            island.close()
    except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - user errors reported, bugs re-raised
        status = _report(exc)
    if status and not island.single:
        island.leave(status)  # the other processes go down with this one
    return status


def _speak(args: argparse.Namespace, given: frozenset[str], task: Any, on_metrics: Any) -> int:
    """Run the node of this process (of its island: process 0)."""
    return trio.run(_serve, build_runtime(args, given, task, on_metrics), args.stop_timeout)


def node_runtime(settings, identity: Any = None, task: Any = None, on_metrics: Any = None):
    """The runtime of `settings`: `node.runtime.NodeRuntime` (all-to-all), or `node.reduced.runtime.ReducedRuntime`
    for `--traffic reduced`."""
    if settings.traffic == "reduced":
        from node.reduced.runtime import ReducedRuntime

        return ReducedRuntime(settings, identity, task, on_metrics)
    from node.runtime import NodeRuntime

    return NodeRuntime(settings, identity, task, on_metrics)


def build_runtime(args: argparse.Namespace, given: frozenset[str], task: Any = None, on_metrics: Any = None):
    """The node of parsed arguments (`parse`), with the run's configuration adopted from a bootstrap peer
    when `--adopt` says so. Blocking (the adoption dials out)."""
    from node.outer.outer_files import return_freed_memory
    from node.runtime import NodeRuntime

    return_freed_memory()

    settings = settings_from_args(args)
    if settings.traffic == "reduced":  # every node is given the run's flags with its roster: nothing to adopt
        return node_runtime(settings, task=task, on_metrics=on_metrics)
    runtime = NodeRuntime(settings, task=task, on_metrics=on_metrics)
    if args.adopt and runtime.settings.peers:
        from node.adopt import adopt_run_config

        from p2p.tls import Credentials

        credentials = None if runtime.settings.insecure else Credentials(runtime.identity)
        settings = trio.run(partial(adopt_run_config, credentials=credentials, identity=runtime.identity,
                                    admission=runtime.admission), runtime.settings,
                            runtime.admission.founder, given, min(30.0, args.sync_timeout or 30.0), task, runtime.peer_id)
        if settings is not runtime.settings:
            runtime = NodeRuntime(settings, runtime.identity, task, on_metrics)
    return runtime


if __name__ == "__main__":
    sys.exit(main())
