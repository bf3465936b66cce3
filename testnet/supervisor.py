"""The supervisor: starts the testnet's node processes, executes the fault plan, polls `/status`, and
stops everything — on success, on error and on Ctrl-C.

One `Supervisor` owns the state machine of every node (`NodeHandle.state`):

    pending --launch--> starting --LISTENING--> up --kill--> down --restart--> starting ...
    starting --died/timeout--> crashed        up --exited by itself--> crashed
    up --printed STOPPED and exited 0 (after --max-rounds)--> finished
    any --stop()--> stopped

Contract:
- `run(plan)` launches node 0, then the others with node 0 as bootstrap peer (none with
  `bootstrap=False`: isolated nodes, for the solo run); plan times count from node 0's launch (`t0`), or,
  with `plan_from_ready=True` (the solo run, which measures the pace of training), from the moment every
  node first reported `training` (waited for at most `start_timeout` seconds: a node that never trains
  does not hold the others up). It returns after `plan.duration` seconds, a final `/status` poll and `stop()`
  (`t_end`: SIGTERM), which reads `/status` until the nodes exit, then the last status each wrote to its
  checkpoint directory: a node publishes the round its stop cut short, and those samples, after `t_end`,
  carry it.
- However `run` ends (return, exception, cancellation, KeyboardInterrupt), every process group it
  started has been sent SIGTERM, then SIGKILL after `stop_grace` seconds, and reaped.
- A failed *initial* launch raises `NodeStartError` (quoting the log of every node that failed); a
  failed *restart* is recorded (`start-error`) and reported, and the run goes on without that node.
- A restarted node keeps its key and checkpoint directory, and its ports when it can bind them again
  (otherwise new ports); its bootstrap peers are the nodes up at that moment.
- With `--max-rounds` the nodes end by themselves: once every node is finished (or crashed), `run`
  stops early. With `until_steps` (`diloco-testnet --steps`), `run` also stops early, once the running
  nodes' mean `inner_steps` (their last `/status`) has reached it. A node's `STOPPED <slot> <ledger>
  <params>` line is recorded as a `stopped` event.
- Every event and status sample goes to the `Recorder` (see `testnet.record`); `notify` gets one
  human-readable line per event.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import httpx
import trio

from node.status import LAST_STATUS
from p2p.httpclient import operator_client
from testnet.faults import FaultPlan, Partition
from testnet.nodes import NodeSpec
from testnet.procs import (GroupRegistry, LineReader, Listening, NodeStartError, drain_to_log, spawn,
                           stop_processes, wait_listening)
from testnet.record import Recorder
from testnet.wan import is_loopback

__all__ = ["ArgvBuilder", "ChaosPartitioner", "NodeHandle", "NetnsPartitioner", "Supervisor"]

STOP_POLL_S = 0.25  # how often `stop()` reads the stopping nodes' `/status`

ArgvBuilder = Callable[[NodeSpec, int, int, Sequence[str]], list[str]]  # spec, gossip port, http port, peers


@dataclasses.dataclass
class NodeHandle:
    """Runtime state of one node, across its processes. Written only by the `Supervisor`."""

    spec: NodeSpec
    inc: int = -1  # index of the current process (0 = first launch)
    state: str = "pending"
    process: trio.Process | None = None
    listening: Listening | None = None
    status: dict[str, Any] | None = None  # last good /status
    ready: bool = False  # the current process has reported state "training"
    expect_exit: bool = False  # the current process is being killed/stopped on purpose
    gossip_port: int = 0
    http_port: int = 0
    stopped_line: tuple[int, str, str] | None = None  # (slot, ledger, params) from the current process


class Partitioner(Protocol):
    """How a partition is made. `per_process`: the cut lives in the node process (redo it after a restart)."""

    per_process: bool

    async def cut(self, sup: Supervisor, node: int, others: Sequence[int], seconds: float) -> None: ...

    async def heal(self, sup: Supervisor, node: int, others: Sequence[int]) -> None: ...


class ChaosPartitioner:
    """Partitions through the nodes' `POST /chaos` (they must run with `--allow-chaos`); the node lifts
    the block itself when `seconds` have passed."""

    per_process = True

    async def cut(self, sup: Supervisor, node: int, others: Sequence[int], seconds: float) -> None:
        body = {"block_peers": [sup.handles[o].spec.peer_id for o in others], "seconds": seconds}
        response = await sup.client.post(sup.url(node, "/chaos"), json=body)
        response.raise_for_status()

    async def heal(self, sup: Supervisor, node: int, others: Sequence[int]) -> None:
        return None


class NetnsPartitioner:
    """Partitions as routes inside the nodes' network namespaces (`testnet.wan.WanNetwork`)."""

    per_process = False

    def __init__(self, network: Any) -> None:
        self.network = network

    async def cut(self, sup: Supervisor, node: int, others: Sequence[int], seconds: float) -> None:
        self.network.block(node, others)

    async def heal(self, sup: Supervisor, node: int, others: Sequence[int]) -> None:
        self.network.unblock(node, others)


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out.extend(_leaves(e) if isinstance(e, BaseExceptionGroup) else [e])
    return out


class Supervisor:
    """Runs one testnet (see module doc). Use once: `await Supervisor(...).run(plan)`."""

    def __init__(self, specs: Sequence[NodeSpec], argv_for: ArgvBuilder, recorder: Recorder, *,
                 env: dict[str, str] | None = None, start_timeout: float = 120.0, stop_grace: float = 20.0,
                 poll_interval: float = 1.0, partitioner: Partitioner | None = None,
                 allows: Callable[[str], bool] = is_loopback, notify: Callable[[str], None] = lambda s: None,
                 on_poll: Callable[[list[NodeHandle]], None] = lambda handles: None, bootstrap: bool = True,
                 registry: GroupRegistry | None = None, plan_from_ready: bool = False,
                 until_steps: int | None = None, insecure: bool = False) -> None:
        """`insecure`: the nodes were started with --insecure (their HTTP planes are http, not https)."""
        self.handles = [NodeHandle(spec) for spec in specs]
        self.plan_from_ready, self.until_steps = plan_from_ready, until_steps
        self._everyone_ready = trio.Event()
        self.registry = GroupRegistry() if registry is None else registry
        self.recorder, self.notify, self.on_poll, self.bootstrap = recorder, notify, on_poll, bootstrap
        self._argv_for, self._env, self._allows = argv_for, env, allows
        self.start_timeout, self.stop_grace, self.poll_interval = start_timeout, stop_grace, poll_interval
        self.partitioner = partitioner or ChaosPartitioner()
        self._procs: list[trio.Process] = []
        self._exited: set[int] = set()
        self._stop_sent: set[int] = set()  # pids that stop() has already handled
        self._active: dict[Partition, float] = {}  # partition -> its end on the trio clock
        self._stopped = False
        self._nursery: trio.Nursery | None = None
        self._plan_scope = trio.CancelScope()  # cancelled when the run ends early (`_end_early`)
        self._ended_because = ""
        self.scheme = "http" if insecure else "https"
        self.client: httpx.AsyncClient = operator_client(insecure=insecure, timeout=httpx.Timeout(3.0))
        self.t0 = 0.0  # Unix time of node 0's launch
        self._trio_t0 = 0.0
        self._plan_t0 = 0.0  # where the plan's times count from, on the trio clock
        self.t_end = 0.0

    # ---- helpers ---------------------------------------------------------------------------------

    def url(self, node: int, path: str) -> str:
        listening = self.handles[node].listening
        if listening is None:
            raise RuntimeError(f"node {node} has no HTTP address yet")
        return f"{self.scheme}://{listening.http}{path}"

    def elapsed(self) -> float:
        return trio.current_time() - self._trio_t0

    @property
    def t_plan(self) -> float:
        """Unix time from which the plan's times count (node 0's launch, or when every node trained)."""
        return self.t0 + (self._plan_t0 - self._trio_t0)

    def _event(self, handle: NodeHandle, event: str, **fields: Any) -> None:
        self.recorder.event(time.time(), handle.spec.index, handle.inc, event, **fields)

    # ---- the run ---------------------------------------------------------------------------------

    async def run(self, plan: FaultPlan) -> None:
        """Launch, execute `plan`, poll, stop (see module doc). Always stops every process."""
        try:
            async with self.client, trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._launch_all()
                nursery.start_soon(self._poll_loop)
                await self._execute(plan)
                await self.poll_once()
                await self.stop()
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # trio wraps everything leaving a nursery; surface a lone error
            leaves = _leaves(group)
            if any(isinstance(e, KeyboardInterrupt) for e in leaves):
                raise KeyboardInterrupt from group
            if len(leaves) == 1 and isinstance(leaves[0], Exception):
                raise leaves[0] from None
            raise
        finally:
            await self.stop()

    async def stop(self) -> None:
        """SIGTERM every process group, SIGKILL after `stop_grace`, reap; record it. Shielded.

        A second call stops only processes started since the first (a launch that raced the stop)."""
        first = not self._stopped
        self._stopped = True
        pending = [p for p in self._procs if p.pid not in self._stop_sent]
        if not pending:
            return
        with trio.CancelScope(shield=True):
            if first:
                self.t_end = time.time()
            for h in self.handles:
                h.expect_exit = True
            live = [h for h in self.handles if h.process in pending and h.process.returncode is None]
            for h in live:
                self._event(h, "stop", pid=h.process.pid)
            self._stop_sent.update(p.pid for p in pending)
            async with trio.open_nursery() as nursery:
                if first:  # a node publishes the round its stop cut short: read its counters until it exits
                    nursery.start_soon(self._poll_while_stopping)
                await stop_processes(pending, self.registry, grace=self.stop_grace)
                nursery.cancel_scope.cancel()
            for h in live:
                self._read_last_status(h)
            for h in live:
                self._record_exit(h, h.process, expected=True)
            for h in self.handles:
                h.state = "stopped"

    def _record_exit(self, handle: NodeHandle, process: trio.Process, *, expected: bool, finished: bool = False) -> None:
        if process.pid in self._exited:
            return
        self._exited.add(process.pid)
        rc = process.returncode
        self.recorder.event(time.time(), handle.spec.index, handle.inc if handle.process is process else -1,
                            "exit", pid=process.pid, rc=rc, expected=expected, finished=finished)

    async def _launch_all(self) -> None:
        self._trio_t0, self.t0 = trio.current_time(), time.time()
        first = self.handles[0]
        await self._launch(first, peers=[])
        errors: list[tuple[int, NodeStartError]] = []

        async def launch(h: NodeHandle) -> None:
            try:
                await self._launch(h, peers=[first.listening.gossip] if first.listening and self.bootstrap else [])
            except NodeStartError as e:
                errors.append((h.spec.index, e))

        async with trio.open_nursery() as starters:
            for h in self.handles[1:]:
                starters.start_soon(launch, h)
        if errors:  # every node that failed, in order, each with its log's tail
            errors.sort(key=lambda pair: pair[0])
            raise errors[0][1] if len(errors) == 1 else NodeStartError("\n".join(str(e) for _, e in errors))
        self.notify(f"all {len(self.handles)} nodes listening after {self.elapsed():.1f} s")

    async def _launch(self, h: NodeHandle, *, peers: Sequence[str], fresh_ports: bool = False) -> None:
        """Start a process for `h`, wait for LISTENING, start its watcher. Raises NodeStartError."""
        assert self._nursery is not None
        if self._stopped:
            raise NodeStartError(f"node {h.spec.index} not started: the testnet is stopping")
        if fresh_ports:
            h.gossip_port = h.http_port = 0
        h.inc += 1
        h.state, h.ready, h.status, h.expect_exit, h.listening = "starting", False, None, False, None
        h.stopped_line = None
        argv = self._argv_for(h.spec, h.gossip_port, h.http_port, peers)
        self._event(h, "launch", argv=argv)
        process = await spawn(argv, h.spec.log_path, self.registry, env=self._env)
        self._procs.append(process)
        h.process = process
        if self._stopped:  # stop() ran while the process was being created: it is ours to stop
            await self.stop()
            raise NodeStartError(f"node {h.spec.index} not started: the testnet is stopping")
        reader = LineReader(process.stdout)
        what = f"node {h.spec.index} (process {h.inc})"
        try:
            listening = await wait_listening(process, reader, h.spec.log_path, timeout=self.start_timeout, what=what)
            if listening.peer_id != h.spec.peer_id:
                raise NodeStartError(f"{what} announced peer id {listening.peer_id}, but its key file "
                                     f"{h.spec.key_path} is {h.spec.peer_id}")
            host = listening.http.rpartition(":")[0]
            if not self._allows(host):
                raise NodeStartError(f"{what} serves HTTP on {host}, outside loopback and the testnet's namespaces")
        except NodeStartError as e:
            with trio.CancelScope(shield=True):
                self.registry.signal_group(process.pid, signal.SIGKILL)
                await process.wait()
            self._record_exit(h, process, expected=h.expect_exit)
            self._event(h, "start-error", error=str(e).splitlines()[0])
            h.state = "down" if h.expect_exit else "crashed"
            raise
        h.listening, h.gossip_port, h.http_port = listening, listening.gossip_port, listening.http_port
        h.state = "up"
        self._event(h, "listening", pid=process.pid, peer_id=listening.peer_id, gossip=listening.gossip,
                    http=listening.http)
        self._nursery.start_soon(self._watch, h, process, reader)

    async def _watch(self, h: NodeHandle, process: trio.Process, reader: LineReader) -> None:
        """Copy the process's stdout to its log until it exits; record the exit."""
        inc = h.inc
        await drain_to_log(reader, h.spec.log_path, on_line=lambda line: self._stdout_line(h, inc, line))
        await process.wait()
        current = h.process is process
        finished = current and process.returncode == 0 and h.stopped_line is not None and not h.expect_exit
        expected = (h.expect_exit and current) or self._stopped or not current or finished
        self._record_exit(h, process, expected=expected, finished=finished)
        if finished:
            h.state = "finished"
            self.notify(f"node {h.spec.index} finished its rounds (slot {h.stopped_line[0]})")
        elif current and not expected:
            h.state = "crashed"
            self.notify(f"node {h.spec.index} exited by itself with status {process.returncode} "
                        f"(see {h.spec.log_path})")
        if all(o.state in ("finished", "crashed") for o in self.handles):
            self._end_early("every node has finished")

    def _stdout_line(self, h: NodeHandle, inc: int, line: str) -> None:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "STOPPED" and parts[1].isdigit() and h.inc == inc:
            h.stopped_line = (int(parts[1]), parts[2], parts[3])
            self.recorder.event(time.time(), h.spec.index, inc, "stopped", slot=int(parts[1]), ledger=parts[2],
                                params=parts[3])

    # ---- the fault plan --------------------------------------------------------------------------

    async def _execute(self, plan: FaultPlan) -> None:
        with self._plan_scope:
            self._plan_t0 = self._trio_t0
            if self.plan_from_ready:
                with trio.move_on_after(self.start_timeout):
                    await self._everyone_ready.wait()
                self._plan_t0 = trio.current_time()
                self.notify(f"t={self.elapsed():.0f}s: every node trains; {plan.duration:g} s from now")
            await self._execute_actions(plan)
        if self._plan_scope.cancelled_caught:
            self.notify(f"t={self.elapsed():.0f}s: {self._ended_because}")

    def _end_early(self, because: str) -> None:
        """End the plan now (the run then stops every node), saying why; the first reason given stands."""
        if not self._plan_scope.cancel_called:
            self._ended_because = because
            self._plan_scope.cancel()

    def _check_steps(self) -> None:
        """With `until_steps`: end the plan once the running nodes' mean `inner_steps` has reached it."""
        running = [h for h in self.handles if h.state == "up"]
        if self.until_steps is None or not running or any(h.status is None for h in running):
            return
        mean = sum(int(h.status.get("inner_steps") or 0) for h in running) / len(running)
        if mean >= self.until_steps:
            self._end_early(f"the nodes have taken {mean:,.0f} inner steps each on average "
                            f"(the run's length: {self.until_steps:,})")

    async def _execute_actions(self, plan: FaultPlan) -> None:
        assert self._nursery is not None
        for action in plan.actions():
            await trio.sleep_until(self._plan_t0 + action.at)
            if action.kind == "kill":
                await self._kill(self.handles[action.node])
            elif action.kind == "restart":
                self._nursery.start_soon(self._restart, self.handles[action.node])
            elif action.kind == "partition" and action.partition is not None:
                self._nursery.start_soon(self._partition, action.partition)
            elif action.kind == "heal" and action.partition is not None:
                self._nursery.start_soon(self._heal, action.partition)
        await trio.sleep_until(self._plan_t0 + plan.duration)

    async def _kill(self, h: NodeHandle) -> None:
        if h.process is None or h.process.returncode is not None or h.state == "finished":
            self.notify(f"t={self.elapsed():.0f}s: node {h.spec.index} is not running; nothing to kill")
            self._event(h, "kill", skipped=True)
            return
        h.expect_exit = True
        self.registry.signal_group(h.process.pid, signal.SIGKILL)
        self._event(h, "kill", pid=h.process.pid)
        h.state = "down"
        self.notify(f"t={self.elapsed():.0f}s: killed node {h.spec.index} (SIGKILL)")
        with trio.move_on_after(10):
            await h.process.wait()

    async def _restart(self, h: NodeHandle) -> None:
        if h.process is not None and h.process.returncode is None:
            self.notify(f"node {h.spec.index} is still running; not restarting it")
            return
        others = [o for o in self.handles if o is not h and o.listening is not None and self.bootstrap]
        peers = [o.listening.gossip for o in others if o.state == "up"] or [o.listening.gossip for o in others]
        try:
            await self._launch(h, peers=peers)
        except NodeStartError as first:
            if h.expect_exit or self._stopped:
                return
            self.notify(f"node {h.spec.index} did not come back on its old ports ({str(first).splitlines()[0]}); "
                        f"trying new ports")
            try:
                await self._launch(h, peers=peers, fresh_ports=True)
            except NodeStartError as second:
                self.notify(f"node {h.spec.index} failed to restart: {second}")
                return
        self.notify(f"t={self.elapsed():.0f}s: restarted node {h.spec.index} (process {h.inc}) on {h.listening.gossip}")
        if self.partitioner.per_process:
            for part, end in list(self._active.items()):
                others_idx = part.other_side(h.spec.index)
                if others_idx and end > trio.current_time():
                    await self._cut(h, others_idx, end - trio.current_time())

    async def _cut(self, h: NodeHandle, others: Sequence[int], seconds: float) -> None:
        try:
            await self.partitioner.cut(self, h.spec.index, others, seconds)
            self._event(h, "partition", others=list(others), seconds=seconds)
        except (httpx.HTTPError, RuntimeError, OSError) as e:
            self._event(h, "chaos-error", error=repr(e))
            self.notify(f"could not partition node {h.spec.index}: {e!r}")

    async def _partition(self, part: Partition) -> None:
        self._active[part] = self._plan_t0 + part.end
        self.notify(f"t={self.elapsed():.0f}s: partition {list(part.side_a)} | {list(part.side_b)} "
                    f"for {part.end - part.start:g} s")
        for node in part.side_a + part.side_b:
            h = self.handles[node]
            if h.state == "up" or not self.partitioner.per_process:
                await self._cut(h, part.other_side(node), part.end - part.start)

    async def _heal(self, part: Partition) -> None:
        self._active.pop(part, None)
        self.notify(f"t={self.elapsed():.0f}s: healed partition {list(part.side_a)} | {list(part.side_b)}")
        for node in part.side_a + part.side_b:
            h = self.handles[node]
            try:
                await self.partitioner.heal(self, node, part.other_side(node))
                self._event(h, "heal", others=list(part.other_side(node)))
            except (httpx.HTTPError, RuntimeError, OSError) as e:
                self._event(h, "chaos-error", error=repr(e))

    # ---- polling ---------------------------------------------------------------------------------

    async def _poll_loop(self) -> None:
        while True:
            await self.poll_once()
            self.on_poll(self.handles)
            self._check_steps()
            await trio.sleep(self.poll_interval)

    def _read_last_status(self, h: NodeHandle) -> None:
        """Record, as a sample at its exit, the last `/status` object a stopped process wrote to its checkpoint
        directory (`node.status.write_last_status`): its server may close before a poll reads what the stop
        published. Only one of this process (the same `started_at` as its polled status); none is fine."""
        try:
            status = json.loads((h.spec.checkpoint_dir / LAST_STATUS).read_text())
        except (OSError, ValueError):
            return
        if isinstance(status, dict) and h.status is not None and status.get("started_at") == h.status.get("started_at"):
            self.recorder.sample(time.time(), h.spec.index, h.inc, status=status)

    async def _poll_while_stopping(self) -> None:
        """`/status` of the stopping nodes, every `STOP_POLL_S`, until cancelled (they exit). These samples
        come after `t_end`: they carry what a stop published (the round in flight), not time trained."""
        while True:
            await self.poll_once()
            await trio.sleep(STOP_POLL_S)

    async def poll_once(self) -> None:
        """GET /status from every node that is up, concurrently; record each answer or error."""
        async with trio.open_nursery() as nursery:
            for h in self.handles:
                if h.state == "up" and h.listening is not None:
                    nursery.start_soon(self._poll_node, h)

    async def _poll_node(self, h: NodeHandle) -> None:
        inc = h.inc
        try:
            response = await self.client.get(self.url(h.spec.index, "/status"))
            response.raise_for_status()
            status = response.json()
            if not isinstance(status, dict):
                raise ValueError(f"/status is a {type(status).__name__}, not an object")
        except (httpx.HTTPError, ValueError, RuntimeError) as e:
            if h.inc == inc and h.state == "up" and not self._stopped:  # a stopping node closes its server
                self.recorder.sample(time.time(), h.spec.index, inc, error=repr(e))
            return
        if h.inc != inc:  # the process changed while we waited: the answer is stale
            return
        self.recorder.sample(time.time(), h.spec.index, inc, status=status)
        h.status = status
        if status.get("state") == "training" and not h.ready:
            h.ready = True
            self._event(h, "ready")
            if all(handle.ready for handle in self.handles):
                self._everyone_ready.set()
