"""The serving side of `testnet.benchmarks.tls_planes --split` / `--link`, in its own process, and what both
sides share (the run, the ledger config, the hosts' config, the replica).

    python -m testnet.benchmarks.tls_planes_remote [--verbose]    # started by tls_planes, not by hand

It holds the hosts that send the bytes: the state-sync donors (a `node.sync.stateserve.StateServer` over a
replica, one donor per kind) or the intake publishers (one per kind), each kind's built exactly as the
in-process benchmark builds it. It reads one command a line on stdin and answers each with one JSON line on
stdout (`{"ok": true, ...}`, or `{"error": "..."}` for a command it cannot read); logs go to stderr.

    donors HOST FOLDER PIECES     a donor per kind listening on HOST, its replica's `w` of PIECES pieces
                                  -> {KIND: {"addr", "peer", "digests": [ledger hex, params hex]}}
    publishers HOST FOLDER        a publisher per kind listening on HOST -> {KIND: {"addr", "peer"}}
    meshed KIND PEER TIMEOUT      wait until PEER is connected to KIND's publisher and in its mesh
    draw KIND COUNT BYTES         draw COUNT random payloads of BYTES for KIND's next publish (untimed)
    mark                          start counting this process's CPU time (`time.process_time()`)
    publish KIND                  publish the drawn payloads one after another (`Host.publish_update`)
    cpu                           -> {"cpu_s": this process's CPU seconds since `mark`}
    forget KIND                   remove KIND's published payloads from the publisher's store
    quit                          close the hosts and exit (so does the end of stdin)

`ServingChild` is the measuring process's handle on it (`async with ServingChild.open(prefix) as child`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import trio

import p2p
from node.outer.replica import Replica
from node.sync.stateserve import StateServer
from protocol.gossip import GossipConfig
from protocol.identity import Identity
from protocol.ledger import Ledger, LedgerConfig
from protocol.ledger.digest import PIECE

RUN = "tls-planes-bench"
CONFIG = LedgerConfig(window=2)
KINDS = ("tls", "cleartext")
ROOT = Path(__file__).resolve().parents[2]  # the repository: the child's working directory


def host_config(tmp: Path, name: str, kind: str, bootstrap: tuple[str, ...] = (),
                listen: str = "127.0.0.1") -> p2p.HostConfig:
    return p2p.HostConfig(identity=Identity.generate(), run_id=RUN, data_dir=tmp / name, listen_host=listen,
                          gossip=GossipConfig(run_id=RUN), bootstrap=bootstrap, insecure=kind == "cleartext",
                          goodbye_flush_s=0.2)


async def until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    with trio.move_on_after(timeout_s):
        while not predicate():
            await trio.sleep(0.005)
        return
    raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")


def replica_of(pieces: int, seed: int) -> Replica:
    """A replica whose window bottom is `w` (`pieces` pieces of float32) and its momentum (as many)."""
    rng = np.random.default_rng(seed)
    n = pieces * PIECE // 4
    params = {"w": rng.standard_normal(n, dtype=np.float32)}
    momentum = {"w": rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3)}
    return Replica(Ledger(params, CONFIG, momentum))


def _kind(text: str) -> str:
    if text not in KINDS:
        raise ValueError(f"not a kind: {text!r} (one of {', '.join(KINDS)})")
    return text


COMMANDS: dict[str, tuple[Callable[[str], Any], ...]] = {
    "donors": (str, Path, int),
    "publishers": (str, Path),
    "meshed": (_kind, str, float),
    "draw": (_kind, int, int),
    "mark": (),
    "publish": (_kind,),
    "cpu": (),
    "forget": (_kind,),
    "quit": (),
}


def parse_command(line: str) -> tuple[str, tuple[Any, ...]]:
    """One command line (module docstring) -> (name, its arguments converted). Raises ValueError."""
    words = line.split()
    if not words or words[0] not in COMMANDS:
        raise ValueError(f"unknown command: {line.strip()!r}")
    types = COMMANDS[words[0]]
    if len(words) - 1 != len(types):
        raise ValueError(f"{words[0]} takes {len(types)} arguments, got {len(words) - 1}")
    return words[0], tuple(convert(word) for convert, word in zip(types, words[1:]))


class ServingSide:
    """The child's hosts and their payloads; `handle` runs one command (after `parse_command`)."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.hosts: dict[str, p2p.Host] = {}
        self.payloads: dict[str, list[bytes]] = {k: [] for k in KINDS}
        self.published: dict[str, list[bytes]] = {k: [] for k in KINDS}
        self.c0 = time.process_time()

    async def handle(self, name: str, args: tuple[Any, ...]) -> dict[str, Any]:
        if name == "donors":
            listen, folder, pieces = args
            out: dict[str, Any] = {}
            for k, kind in enumerate(KINDS):
                replica = replica_of(pieces, seed=k)
                donor = await self.nursery.start(p2p.run, host_config(folder, f"donor-{kind}", kind, listen=listen))
                server = StateServer(donor)
                server.mount()
                server.replica = replica
                self.hosts[kind] = donor
                ledger, params = await replica.digests()
                out[kind] = {"addr": donor.gossip_addr, "peer": donor.peer_id, "digests": [ledger.hex(), params.hex()]}
            return out
        if name == "publishers":
            listen, folder = args
            for kind in KINDS:
                self.hosts[kind] = await self.nursery.start(p2p.run, host_config(folder, f"pub-{kind}", kind,
                                                                                 listen=listen))
            return {kind: {"addr": h.gossip_addr, "peer": h.peer_id} for kind, h in self.hosts.items()}
        if name == "meshed":
            kind, peer, timeout_s = args
            publisher = self.hosts[kind]
            await until(lambda: peer in publisher.connected_peers() and bool(publisher.router.mesh), timeout_s,
                        f"{peer} in the {kind} publisher's mesh")
        elif name == "draw":
            kind, count, size = args
            self.payloads[kind] = [os.urandom(size) for _ in range(count)]
        elif name == "mark":
            self.c0 = time.process_time()
        elif name == "publish":
            (kind,) = args
            publisher, payloads = self.hosts[kind], self.payloads[kind]
            for payload in payloads:  # as tls_planes.update_intake does in one process
                await publisher.publish_update(payload, base_slot=0, publish_slot=0, tokens=1, inner_steps=1,
                                               codec="fp32", shapes=(("w", (len(payload) // 4,)),))
            self.published[kind], self.payloads[kind] = payloads, []
        elif name == "cpu":
            return {"cpu_s": time.process_time() - self.c0}
        elif name == "forget":
            (kind,) = args
            for payload in self.published[kind]:
                self.hosts[kind].store.remove(p2p.blob_hex(payload))
            self.published[kind] = []
        return {}


async def serve(answers: Any) -> None:
    """Read commands from stdin until `quit` or its end, answer each on `answers`."""
    def answer(obj: dict[str, Any]) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    async with trio.open_nursery() as nursery:
        side = ServingSide(nursery)
        while line := await trio.to_thread.run_sync(sys.stdin.readline):
            try:
                name, args = parse_command(line)
            except ValueError as e:  # the measuring side misused us
                answer({"error": str(e)})
                continue
            if name == "quit":
                break
            answer({"ok": True, **await side.handle(name, args)})
        for host in side.hosts.values():
            await host.close()
        nursery.cancel_scope.cancel()
    answer({"ok": True})


class ServingChild:
    """The measuring process's handle on a child running `serve`; `ask` sends one command, returns its answer."""

    def __init__(self, process: trio.Process) -> None:
        self._process = process
        self._buffer = b""

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, prefix: Sequence[str] = (), verbose: bool = False) -> AsyncIterator[ServingChild]:
        """Start the child under `prefix` (e.g. `ip netns exec NS`); on leaving, `quit` it (kill it after 30 s)."""
        command = [*prefix, sys.executable, "-m", "testnet.benchmarks.tls_planes_remote"] + (["--verbose"] * verbose)
        process = await trio.lowlevel.open_process(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
        child = cls(process)
        try:
            yield child
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(30):
                    if process.returncode is None:
                        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, RuntimeError):
                            await child.ask("quit")
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()

    async def ask(self, *words: object, timeout_s: float = 120.0) -> dict[str, Any]:
        """Send the command `words` (joined by spaces); its answer. Raises RuntimeError on an error answer or
        the child's end, trio.TooSlowError after `timeout_s`."""
        assert self._process.stdin is not None and self._process.stdout is not None
        await self._process.stdin.send_all((" ".join(map(str, words)) + "\n").encode())
        with trio.fail_after(timeout_s):
            while b"\n" not in self._buffer:
                chunk = await self._process.stdout.receive_some()
                if not chunk:
                    raise RuntimeError(f"the serving side exited during `{words[0]}` (its stderr says why)")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the serving side refused `{' '.join(map(str, words))}`: {answer['error']}")
        return answer


def main() -> None:
    logging.basicConfig(level=logging.INFO if "--verbose" in sys.argv[1:] else logging.ERROR, stream=sys.stderr,
                        format="%(asctime)s serving %(name)s %(levelname)s %(message)s")
    answers = os.fdopen(os.dup(1), "w")
    sys.stdout = sys.stderr  # only answers on the real stdout
    trio.run(serve, answers)


if __name__ == "__main__":
    main()
