"""Child processes that never outlive the testnet: each in its own process group, logged to a file.

- `spawn` starts a command in a new session (so its process group id is its pid), stdout piped to us,
  stderr appended to a log file, and registers the group in a `GroupRegistry`.
- `LineReader` reads stdout lines; `wait_listening` parses the node's `LISTENING` line within a
  timeout, raising `NodeStartError` (with the log's tail) if the process dies or stays silent;
  `drain_to_log` copies the remaining stdout to the log so the pipe never fills.
- `stop_processes` is the one way to stop: SIGTERM to each group, wait at most `grace` seconds, SIGKILL
  the groups still alive, then reap. It shields itself from cancellation, so it is safe in `finally`.
- `GroupRegistry.kill_all_now` is the synchronous last resort (after `trio.run` returned or raised).
- `free_port`: a loopback port for a child told its address before it starts.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

import trio

__all__ = ["GroupRegistry", "LineReader", "Listening", "NodeStartError", "alive", "drain_to_log", "free_port", "log_tail",
           "spawn", "stop_processes", "wait_listening"]


class NodeStartError(RuntimeError):
    """A node exited or stayed silent before printing its LISTENING line. The message quotes its log."""


@dataclasses.dataclass(frozen=True)
class Listening:
    """The node's `LISTENING <peer_id> <gossip host:port> <http host:port>` line, parsed."""

    peer_id: str
    gossip: str
    http: str

    @classmethod
    def parse(cls, line: str) -> Listening | None:
        parts = line.split()
        if len(parts) != 4 or parts[0] != "LISTENING":
            return None
        for addr in parts[2:]:
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit():
                return None
        return cls(parts[1], parts[2], parts[3])

    @property
    def gossip_port(self) -> int:
        return int(self.gossip.rpartition(":")[2])

    @property
    def http_port(self) -> int:
        return int(self.http.rpartition(":")[2])


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie (a killed child nobody reaped yet counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def _group_members(pgid: int) -> list[int]:
    """Pids (not zombies) whose process group is `pgid`, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


class GroupRegistry:
    """The process groups this testnet started (group id = the leader's pid, from `start_new_session`)."""

    def __init__(self) -> None:
        self._groups: set[int] = set()

    def add(self, pgid: int) -> None:
        self._groups.add(pgid)

    def signal_group(self, pgid: int, sig: int) -> None:
        """Send `sig` to every live member of a group we started; a vanished group is not an error."""
        if pgid not in self._groups:
            raise ValueError(f"process group {pgid} was not started by this testnet")
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass

    def live_groups(self) -> list[int]:
        return sorted(g for g in self._groups if _group_members(g))

    def kill_all_now(self) -> list[int]:
        """SIGKILL every group of ours that still has a live member; returns those groups. Synchronous."""
        hit = self.live_groups()
        for pgid in hit:
            self.signal_group(pgid, signal.SIGKILL)
        return hit


async def spawn(command: Sequence[str], log_path: Path, registry: GroupRegistry, *,
                env: Mapping[str, str] | None = None, cwd: str | None = None) -> trio.Process:
    """Start `command` in its own session with stdout piped and stderr appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab", buffering=0) as log:
        log.write(f"---- start: {' '.join(command)}\n".encode())
        process = await trio.lowlevel.open_process(list(command), stdout=subprocess.PIPE,
                                                   stderr=log, stdin=subprocess.DEVNULL,
                                                   start_new_session=True, env=dict(env) if env else None,
                                                   cwd=cwd)
    registry.add(process.pid)
    return process


class LineReader:
    """Lines (str, without the newline) from a trio receive stream; `None` at end of stream."""

    def __init__(self, stream: trio.abc.ReceiveStream, max_line: int = 1 << 20) -> None:
        self._stream, self._buf, self._max = stream, bytearray(), max_line

    async def readline(self) -> str | None:
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[:i + 1]
                return line.decode(errors="replace").rstrip("\r")
            if len(self._buf) > self._max:
                line = bytes(self._buf)
                self._buf.clear()
                return line.decode(errors="replace")
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                if self._buf:
                    line = bytes(self._buf)
                    self._buf.clear()
                    return line.decode(errors="replace")
                return None
            self._buf += chunk


def log_tail(log_path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a log file ('' if it does not exist)."""
    try:
        data = log_path.read_bytes()[-16384:]
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def _append(log: IO[bytes], line: str) -> None:
    log.write(line.encode() + b"\n")


async def wait_listening(process: trio.Process, reader: LineReader, log_path: Path, *, timeout: float,
                         what: str) -> Listening:
    """Read stdout until the LISTENING line (copying earlier lines to the log) and parse it.

    Raises `NodeStartError` naming `what` and quoting the log tail if stdout closes (the process died)
    or `timeout` seconds pass first.
    """
    with open(log_path, "ab", buffering=0) as log, trio.move_on_after(timeout):
        while True:
            line = await reader.readline()
            if line is None:
                rc = await process.wait()
                raise NodeStartError(f"{what} exited with status {rc} before printing LISTENING; "
                                     f"last lines of {log_path}:\n{log_tail(log_path)}")
            _append(log, line)
            listening = Listening.parse(line)
            if listening is not None:
                return listening
    raise NodeStartError(f"{what} printed no LISTENING line within {timeout:g} s; last lines of {log_path}:\n"
                         f"{log_tail(log_path)}")


async def drain_to_log(reader: LineReader, log_path: Path,
                       on_line: Callable[[str], None] = lambda line: None) -> None:
    """Copy the rest of stdout to the log until end of stream, handing each line to `on_line` too."""
    with open(log_path, "ab", buffering=0) as log:
        while (line := await reader.readline()) is not None:
            _append(log, line)
            on_line(line)


async def stop_processes(processes: Iterable[trio.Process], registry: GroupRegistry, *, grace: float,
                         kill_wait: float = 5.0) -> dict[int, int | None]:
    """Stop every process group: SIGTERM, wait up to `grace` s, SIGKILL what is left, reap.

    Shielded from cancellation (safe to call from `finally` after Ctrl-C). Returns pid → exit status
    (`None` if a process could not be reaped within `kill_wait` s after SIGKILL, which should not happen).
    """
    procs = list(processes)
    status: dict[int, int | None] = {}
    with trio.CancelScope(shield=True):
        for p in procs:
            if p.returncode is None:
                registry.signal_group(p.pid, signal.SIGTERM)
        with trio.move_on_after(grace):
            for p in procs:
                await p.wait()
        for p in procs:
            # The leader may be gone while children in its group live on: kill the whole group.
            if p.returncode is None or _group_members(p.pid):
                registry.signal_group(p.pid, signal.SIGKILL)
        with trio.move_on_after(kill_wait):
            for p in procs:
                await p.wait()
            # Members of a group (a node's own children) take a moment to die after SIGKILL; nobody
            # reaps them for us, so wait until /proc shows none of them alive.
            while any(_group_members(p.pid) for p in procs):
                await trio.sleep(0.02)
        for p in procs:
            status[p.pid] = p.returncode
    return status
