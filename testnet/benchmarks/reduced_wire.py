"""Reduced slots against all-to-all between real processes on this machine (issue 49).

N processes, each one ``p2p`` host (TCP, TLS, gossip, HTTP) with the harness's identities, exchange the same
int4 updates twice: **all-to-all** (each publishes its update as a signed header and a blob; every node fetches
every other node's blob, as a node of this version does) and **reduced** (each publishes a commitment; the
records travel as ``reduced`` messages and the pieces, partials and reductions over HTTP, ``node.reduced``;
slots are closed by the slot clock). Printed: each node's bytes received and sent per round ÷ one update's
bytes, from the host's own traffic counters (gossip frames and HTTP bodies; TLS records and HTTP headers not
counted), the mean and the largest node, the wall time per round, and whether the reduced replicas hold the
same bits as each other and as the in-process harness (``testnet.reduced_net``) fed the same updates.

Run: ``python -m testnet.benchmarks.reduced_wire --nodes 8 --rounds 3 --json reduced_wire.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import trio

from protocol.compression import encode_tensors
from protocol.ledger import LedgerConfig
from testnet.benchmarks.traffic import model_shapes
from testnet.reduced_net import RUN, ReducedNet

MODES = ("all-to-all", "reduced")
CONFIG = LedgerConfig(window=4)


def node_update(shapes: dict, seed: int, r: int, k: int) -> bytes:
    """Node ``k``'s update of round ``r``: a direction all share, plus the node's own noise (int4)."""
    shared, own = np.random.default_rng([seed, r]), np.random.default_rng([seed, r, k + 1])
    common = {name: 0.01 * shared.standard_normal(shape).astype(np.float32) for name, shape in sorted(shapes.items())}
    return encode_tensors({name: (c + 0.005 * own.standard_normal(c.shape)).astype(np.float32)
                           for name, c in common.items()}, "int4")


# -- one node (a process of its own) -----------------------------------------------------------------
async def _files(folder: Path, prefix: str, n: int) -> None:
    while len(list(folder.glob(prefix + "-*"))) < n:  # the other processes' marks: polled, like a supervisor
        await trio.sleep(0.05)


async def barrier(folder: Path, name: str, k: int, n: int) -> None:
    (folder / f"{name}-{k}").write_text("")
    await _files(folder, name, n)


def _traffic(host) -> dict[str, int]:
    """Bytes in and out: gossip frames (``control``) and HTTP bodies (``blob``), from the host's counters."""
    control, blob = (host.counters.total(kind) for kind in ("control", "blob"))
    return {"received": control.recv_bytes + blob.recv_bytes, "sent": control.sent_bytes + blob.sent_bytes,
            "gossip_received": control.recv_bytes}


def identities(n: int) -> list:
    """The harness's identities (``testnet.reduced_net``), so that headers, ids and roles are its bits."""
    from protocol.identity import Identity

    return [Identity.from_seed(hashlib.sha256(b"reduced-node-%d" % i).digest()) for i in range(n)]


async def open_host(nursery: trio.Nursery, folder: Path, k: int, n: int, *, reduced: bool):
    """Start node ``k``'s host (TLS, node 0 the others' bootstrap), and return it once its peer table and mesh
    are full and every other node's are too (marks in ``folder``)."""
    from p2p.config import HostConfig
    from p2p.host import run as run_host
    from protocol.gossip import GossipConfig

    if k:
        await _files(folder, "addr", 1)
    bootstrap = ((folder / "addr-0").read_text(),) if k else ()
    gossip = GossipConfig(run_id=RUN, heartbeat_s=0.2, heartbeat_timeout_s=5.0, reduced_records=reduced)
    config = HostConfig(identity=identities(n)[k], run_id=RUN, data_dir=folder / f"n{k}", gossip=gossip,
                        bootstrap=bootstrap)
    host = await nursery.start(run_host, config)
    if k == 0:
        (folder / "addr-0").write_text(host.gossip_addr)
    want = min(n - 1, gossip.target_peers)
    while len(host.connected_peers()) < want or len(host.router.mesh) < min(gossip.d_lo, n - 1):
        await trio.sleep(0.05)
    await barrier(folder, "ready", k, n)
    return host


async def _node(a: argparse.Namespace) -> dict:
    from node.reduced.driver import SlotClock, SlotDriver
    from protocol.ledger.proof import header_shapes
    from protocol.messages import UpdateHeader
    from protocol.reduced import ShardPlan
    from protocol.reduced.participant import ReducedNode

    folder, k, n, reduced = Path(a.dir), a.worker, a.nodes, a.mode == "reduced"
    shapes = model_shapes(a.pieces * n)
    ids = identities(n)
    out: dict = {"node": k, "rounds": []}
    async with trio.open_nursery() as nursery:
        host = await open_host(nursery, folder, k, n, reduced=reduced)
        if reduced:
            node = ReducedNode(ids[k], [i.peer_id for i in ids], ShardPlan(shapes, n), CONFIG, run_id=RUN, q=a.q,
                               params={name: np.zeros(s, np.float32) for name, s in shapes.items()})
            driver = SlotDriver(host, node, SlotClock(patience=a.patience, xi=a.xi))
            await nursery.start(driver.run)
        else:
            got: dict[int, set[str]] = {}
            arrived = trio.Event()

            async def intake() -> None:
                nonlocal arrived
                async for delivery in host.inbox:
                    if isinstance(delivery.body, UpdateHeader):
                        got.setdefault(delivery.body.publish_slot, set()).add(delivery.body.origin)
                        arrived.set()
                        arrived = trio.Event()

            nursery.start_soon(intake)
        started_all = trio.current_time()
        for r in range(a.rounds):
            payload, started = node_update(shapes, a.seed, r, k), trio.current_time()
            out["update_bytes"] = len(payload)
            if reduced:
                await driver.publish(payload, node.slot, 1000, 50)
                s = await driver.close(timeout=a.timeout)
                row = {"sealed": len(s.seal.ids), "passed": len(s.passed), "rejected": len(s.rejected)}
            else:
                await host.publish_update(payload, base_slot=r, publish_slot=r, tokens=1000, inner_steps=50,
                                          codec="int4", shapes=header_shapes(shapes))
                while len(got.get(r, ())) < n - 1:
                    await arrived.wait()
                row = {}
            out["rounds"].append({**row, "seconds": round(trio.current_time() - started, 3)})
        out["seconds"] = round(trio.current_time() - started_all, 3)
        await barrier(folder, "done", k, n)  # everyone has what it fetches: the totals are final
        out.update(_traffic(host))
        if reduced:
            out["digest"] = node.digest().hex()
            out["dropped"] = dict(driver.dropped)
        nursery.cancel_scope.cancel()
    return out


def worker(a: argparse.Namespace, node) -> int:
    """Run ``node(a)`` in this process and write what it returns for the parent."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("node.reduced").setLevel(logging.INFO)
    out = trio.run(node, a)
    (Path(a.dir) / f"result-{a.worker}.json").write_text(json.dumps(out))
    return 0


# -- the run ----------------------------------------------------------------------------------------
def spawn(module: str, argv: list[str], n: int, folder: Path, timeout: float) -> list[dict]:
    """Run ``python -m module *argv --dir folder --worker k`` for k < n; their ``result-k.json`` once all exit 0."""
    folder.mkdir()
    procs = []
    for k in range(n):
        log = open(folder / f"node-{k}.log", "w")
        procs.append(subprocess.Popen([sys.executable, "-m", module, *argv, "--dir", str(folder), "--worker", str(k)],
                                      stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    for k, p in enumerate(procs):
        try:
            code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = None
        if code != 0:
            for q in procs:
                q.kill()
            raise SystemExit(f"node {k} {'did not finish' if code is None else f'exited {code}'}; "
                             f"see {folder}/node-{k}.log")
    return [json.loads((folder / f"result-{k}.json").read_text()) for k in range(n)]


def _spawn(a: argparse.Namespace, mode: str, folder: Path) -> list[dict]:
    argv = ["--nodes", str(a.nodes), "--rounds", str(a.rounds), "--pieces", str(a.pieces), "--q", str(a.q),
            "--seed", str(a.seed), "--patience", str(a.patience), "--xi", str(a.xi), "--timeout", str(a.timeout),
            "--mode", mode]
    return spawn("testnet.benchmarks.reduced_wire", argv, a.nodes, folder, a.timeout * (a.rounds + 2))


def _harness_digest(a: argparse.Namespace) -> str:
    shapes = model_shapes(a.pieces * a.nodes)
    net = ReducedNet(a.nodes, shapes, {name: np.zeros(s, np.float32) for name, s in shapes.items()}, CONFIG, q=a.q,
                     replicas=1)
    for r in range(a.rounds):
        net.close([(p, node_update(shapes, a.seed, r, k), net.slot, 1000, 50) for k, p in enumerate(net.peers)])
    return next(iter(net.replicas.values())).digest().hex()


def _ratios(results: list[dict], rounds: int) -> dict:
    u = results[0]["update_bytes"]

    def of(key: str) -> dict:
        per = [r[key] / (u * rounds) for r in results]
        return {"mean": round(float(np.mean(per)), 3), "max": round(max(per), 3)}

    seconds = [s["seconds"] for r in results for s in r["rounds"]]
    return {"in": of("received"), "out": of("sent"), "gossip_in": of("gossip_received"), "round_s": {"mean": round(float(np.mean(seconds)), 2),
                                                                   "max": round(max(seconds), 2)}}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.benchmarks.reduced_wire", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=8, help="processes (default 8)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pieces", type=int, default=1, help="pieces of 65,536 values per node in the model (default 1)")
    p.add_argument("--q", type=float, default=0.5, help="a checker's chance to draw each piece (default 0.5)")
    p.add_argument("--patience", type=float, default=20.0, help="a sealer's wait for every update (s, default 20)")
    p.add_argument("--xi", type=float, default=3.0, help="the slot clock's step (s, default 3)")
    p.add_argument("--timeout", type=float, default=300.0, help="a round's limit (s, default 300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="FILE", help="write the figures here")
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker is not None:
        return worker(a, _node)
    with tempfile.TemporaryDirectory(prefix="reduced-wire-") as tmp:
        found = {}
        for mode in MODES:
            print(f"{mode}: {a.nodes} processes, {a.rounds} rounds ...", flush=True)
            found[mode] = _spawn(a, mode, Path(tmp) / mode)
    reduced = found["reduced"]
    digests = {r["digest"] for r in reduced}
    harness = _harness_digest(a)
    row = {"nodes": a.nodes, "rounds": a.rounds, "update_bytes": reduced[0]["update_bytes"],
           **{mode: _ratios(found[mode], a.rounds) for mode in MODES},
           "replicas_agree": len(digests) == 1, "harness_bits": digests == {harness},
           "passed_over": sum(s["passed"] for r in reduced for s in r["rounds"]),
           "sealed": [s["sealed"] for s in reduced[0]["rounds"]], "dropped": [r["dropped"] for r in reduced],
           "date": time.strftime("%Y-%m-%d")}
    red, a2a = row["reduced"], row["all-to-all"]
    print(f"N={a.nodes}, U {row['update_bytes']:,} B, per node and round ÷ U (mean / largest):")
    for mode, r in (("all-to-all", a2a), ("reduced", red)):
        print(f"  {mode:10s}  in {r['in']['mean']:.2f} / {r['in']['max']:.2f}   out {r['out']['mean']:.2f} / "
              f"{r['out']['max']:.2f}   (gossip in {r['gossip_in']['mean']:.3f})   round {r['round_s']['mean']:.2f} s (largest {r['round_s']['max']:.2f})")
    print(f"  reduced ÷ all-to-all, bytes in: {red['in']['mean'] / a2a['in']['mean']:.3f}; replicas agree "
          f"{row['replicas_agree']}, the harness's bits {row['harness_bits']}; shards passed over "
          f"{row['passed_over']}; seals held {row['sealed']}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(row, indent=2))
    return 0 if row["replicas_agree"] and row["harness_bits"] else 1


if __name__ == "__main__":
    sys.exit(main())
