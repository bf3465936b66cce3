"""Real `diloco-node` processes for the tier (c) tests: start, read stdout lines, poll `/status`, kill.

Every wait is on a condition (a stdout line, a `/status` predicate) with a bounded timeout; on failure the
message quotes the node's stderr log. Nodes share a persistent JAX compilation cache (under pytest's
cache directory), so only the first run of the suite pays for compiling the model.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

import p2p
from p2p.tlscert import pem
from protocol.gossip import GossipConfig
from protocol.identity import Identity

REPO = Path(__file__).resolve().parents[2]
RUN_ID = "node-net-test"
POLL_S = 0.1

# The tiny preset shrunk further so an inner step takes milliseconds on a busy CPU.
SMALL_MODEL = ["--set", "seq_len=32", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64",
               "--set", "batch_size=8", "--set", "lr=1e-2", "--set", "warmup_steps=5"]


def fast_host_config(tmp: Path, name: str, run_id: str, bootstrap: tuple[str, ...] = ()) -> p2p.HostConfig:
    """A loopback host (no training) with fast heartbeats and dial backoff, its data under `tmp/name`."""
    gossip = GossipConfig(run_id=run_id, heartbeat_s=0.05, heartbeat_timeout_s=1.0, dial_backoff_s=0.05,
                          dial_backoff_max_s=0.2)
    return p2p.HostConfig(identity=Identity.generate(), run_id=run_id, data_dir=tmp / name, gossip=gossip,
                          bootstrap=bootstrap, goodbye_flush_s=0.2)


def node_env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", JAX_COMPILATION_CACHE_DIR=str(cache_dir),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
               JAX_PLATFORMS="cpu")
    return env


def free_port() -> int:
    """A loopback TCP port nobody listens on now (for a node told its port, or a peer not started yet)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NodeProc:
    """One `python -m node.cli` process (or another program that runs a node: `program`) with its own key and
    checkpoint directory under `home`."""

    def __init__(self, home: Path, env: dict[str, str], args: list[str], *, exec_prefix: tuple[str, ...] = (),
                 listen: tuple[str, str] = ("127.0.0.1:0", "127.0.0.1:0"),
                 program: tuple[str, ...] = ("-m", "node.cli"), model_args: Sequence[str] = SMALL_MODEL) -> None:
        """`exec_prefix` runs the node under another command (e.g. `ip netns exec NS`); `listen` is its
        (--listen, --http) pair; `program` the Python arguments that run the node (e.g. an example's path),
        `model_args` the flags that choose its model."""
        self.program, self.model_args = program, model_args
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.args = args
        self.env = env
        self.exec_prefix = exec_prefix
        self.listen = listen
        self.peer_id = self.gossip = self.http = ""
        self.stdout: list[str] = []
        self.proc: subprocess.Popen | None = None
        self._tls_client: ssl.SSLContext | None = None
        self.start()

    @property
    def log_path(self) -> Path:
        return self.home / "stderr.log"

    def start(self) -> None:
        """(Re)start the process with the same key and checkpoint directory."""
        cmd = [*self.exec_prefix, sys.executable, *self.program, "--run-id", RUN_ID, "--key",
               str(self.home / "key"), "--checkpoint-dir", str(self.home / "ckpt"), "--listen", self.listen[0],
               "--http", self.listen[1], *self.model_args, *self.args]
        self._lines: queue.Queue[str | None] = queue.Queue()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                                         env=self.env, cwd=REPO, start_new_session=True)
        threading.Thread(target=self._read, args=(self.proc, self._lines), daemon=True).start()

    @staticmethod
    def _read(proc: subprocess.Popen, lines: queue.Queue) -> None:
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    def log_tail(self, n: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-n:])

    def wait_line(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {prefix!r} line within {timeout} s; log:\n{self.log_tail()}")
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"exited ({self.proc.wait()}) before a {prefix!r} line; log:\n{self.log_tail()}")
            self.stdout.append(line)
            if line.startswith(prefix):
                return line

    def wait_listening(self, timeout: float = 120.0) -> None:
        _, self.peer_id, self.gossip, self.http = self.wait_line("LISTENING ", timeout).split()

    def status(self) -> dict[str, Any]:
        """GET /status as the node itself: a TLS client certificate of its own key (a closed run's plane answers
        its own peer id), read with Python's ssl (what curl or a browser uses)."""
        if "--insecure" in self.args:
            return httpx.get(f"http://{self.http}/status", timeout=10.0).json()
        return httpx.get(f"https://{self.http}/status", timeout=10.0, verify=self.tls_client()).json()

    def tls_client(self) -> ssl.SSLContext:
        if self._tls_client is None:
            pem_file = self.home / "client.pem"
            pem_file.write_bytes(pem(Identity.load(self.home / "key")))
            pem_file.chmod(0o600)
            self._tls_client = ssl.create_default_context()
            self._tls_client.check_hostname = False
            self._tls_client.verify_mode = ssl.CERT_NONE  # a node's certificate is self-signed (libp2p's scheme)
            self._tls_client.load_cert_chain(pem_file)
        return self._tls_client

    def wait_status(self, predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"exited ({self.proc.returncode}) waiting for {what}; log:\n{self.log_tail()}")
            try:
                last = self.status()
            except httpx.HTTPError:
                last = None
            if last is not None and predicate(last):
                return last
            time.sleep(POLL_S)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}; last status {last}; "
                             f"log:\n{self.log_tail()}")

    def wait_log(self, pattern: str, timeout: float) -> None:
        """Wait until the stderr log contains the regular expression `pattern`."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.log_path.read_text(errors="replace")):
            if time.monotonic() > deadline:
                raise AssertionError(f"no /{pattern}/ in the log within {timeout} s:\n{self.log_tail()}")
            time.sleep(POLL_S)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s; log:\n{self.log_tail()}") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
