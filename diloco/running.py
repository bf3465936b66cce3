"""A node running in this process, in the background, with a handle on it: `diloco.start`.

`diloco.run` hands the process to the node until it stops; `start` runs the same node (the same command line,
the same task) in a thread of its own, with its own trio loop, and returns at once with a `RunningNode`: its
`status()` (what `GET /status` answers), the run's current global `params()`, `stop()`, and `wait()` for how
it ended. Signals stay the caller's: the node stops when `stop()` is called, at `--max-rounds`, or with the
process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import trio

__all__ = ["RunningNode", "start"]


class RunningNode:
    """One node started by `start`. Thread-safe: its methods may be called from any thread."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime
        self._token: trio.lowlevel.TrioToken | None = None
        self._listening = threading.Event()
        self.error: BaseException | None = None  # what ended the node, when it failed
        self._thread = threading.Thread(target=self._main, name=f"diloco-node {runtime.peer_id[:16]}", daemon=True)
        self._thread.start()
        self._listening.wait()
        if self.error is not None:
            raise self.error

    @property
    def peer_id(self) -> str:
        return self._runtime.peer_id

    @property
    def gossip_addr(self) -> str:
        """HOST:PORT peers dial (`--peers` of another node)."""
        return self._runtime.host.gossip_addr

    @property
    def http_addr(self) -> str:
        return self._runtime.host.http_addr

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # noqa: BLE001 - kept for `wait` and the constructor
            self.error = exc
        finally:
            self._listening.set()

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            await nursery.start(self._runtime.run)
            self._listening.set()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if not self.running:
            raise RuntimeError("the node has stopped")
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and self._token is not None

    def status(self) -> dict[str, Any]:
        """What `GET /status` answers now (docs/node-contract.md): state, slot, round, tokens, peers, losses, ..."""
        from node.status import status_fields

        runtime = self._runtime
        return self._call(lambda: status_fields(runtime.stats, runtime.replica, runtime.host))

    def params(self) -> dict[str, np.ndarray]:
        """The run's global parameters at this node's newest slot, flat (float32 numpy copies by dotted name;
        `Model.restore` makes them your own object). Raises RuntimeError before the node has them."""
        if not self.running:
            raise RuntimeError("the node has stopped: diloco.load(its --checkpoint-dir) reads its last parameters")
        replica = self._runtime.replica
        if replica is None:
            raise RuntimeError("the node has no parameters yet (it is preparing its model and state)")
        return trio.from_thread.run(replica.params, trio_token=self._token)

    def stop(self, reason: str = "stop() called") -> None:
        """Stop as a SIGTERM does (the round in flight published as it stands, goodbye, checkpoint); returns at
        once: `wait()` for the end. Nothing happens once the node has stopped."""
        if self.running:
            self._call(self._runtime.request_stop, reason)

    def wait(self, timeout: float | None = None) -> Any:
        """Wait until the node stops; its `Stopped` (slot, digests, reason), or None if `timeout` passed first.
        Raises what ended the node if it failed."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return None
        if self.error is not None:
            raise self.error
        return self._runtime.result

    def __enter__(self) -> RunningNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop("leaving the with block")
        self.wait()


def start(task: Any, argv: Sequence[str] | None = None, *, settings: Any = None,
          on_metrics: Callable[[dict[str, Any]], object] | None = None) -> RunningNode:
    """Start one node training `task` in the background and return its handle once it listens: with
    `diloco-node`'s command line (`argv`, default `sys.argv[1:]`), or with typed `settings` (a
    `diloco.NodeSettings`: the flags as fields, taken as they are — no adoption of the run's configuration from
    a peer, whose handshake still refuses a mismatch). Raises ValueError for arguments `diloco-node` would
    refuse (the message is on stderr too), and the node's own error if it fails before listening."""
    from node.cli import CLI_MODEL_FLAGS, build_runtime, node_runtime, parse
    from node.island.task import Task
    from node.settings import NodeSettings

    if not isinstance(task, Task):
        raise TypeError(f"start() needs a diloco.Task, got {type(task).__name__}")
    if settings is not None:
        if argv is not None:
            raise ValueError("start() takes argv or settings, not both")
        if not isinstance(settings, NodeSettings):
            raise TypeError(f"settings must be a diloco.NodeSettings, got {type(settings).__name__}")
        return RunningNode(node_runtime(settings, task=task, on_metrics=on_metrics))
    try:
        args, given = parse(argv, task.model.name)
    except SystemExit as exc:
        raise ValueError(f"diloco-node would refuse these arguments (exit {exc.code}): {list(argv or [])}") from None
    if flags := [flag for dest, flag in CLI_MODEL_FLAGS.items() if dest in given]:
        raise ValueError(f"{', '.join(flags)} choose diloco-node's byte-level model; this task trains its own "
                         f"({task.model.name})")
    if args.num_processes > 1:
        raise ValueError("an island of several processes runs with diloco.run (every process runs the same program)")
    return RunningNode(build_runtime(args, given, task, on_metrics))
