"""What a node tells the world: `GET /status` (JSON, every field of docs/node-contract.md plus a few
extras) and `GET /metrics` (Prometheus text through `prometheus_client`, from a custom collector on a
registry of this node's own: no global metrics, so several nodes can live in one process).

`NodeStats` holds the counters the round loop updates; `status_fields` assembles the JSON from it, the
replica (slot, digests, outcomes) and the host (peers, bytes, refusals). Digests are the replica's
cached values; the `/status` handler refreshes them first (in a worker thread). A stopping node also
writes its last `/status` object to its checkpoint directory (`write_last_status`).

Under a flood of requests both bodies come from a `CachedBody`: at most `FRESH_BUILDS` are built per
`CACHE_S` (0.5 s), and the requests past that get the latest one, so polling many times a second costs a
node no more than a few builds. Both routes are limited per client address and across all clients.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import math
import os
import resource
import sys
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from p2p import Host, Kind, Request, Response
from protocol.errors import Reason
from protocol.runconfig import config_hash
from node.outer.replica import Replica

__all__ = ["LAST_STATUS", "PHASES", "CachedBody", "NodeStats", "StatusRoutes", "status_fields", "write_last_status"]

log = logging.getLogger("node.status")

STATUS_LIMIT = "50/second"  # per client address, for /status and /metrics (a poll a second is plenty)
STATUS_TOTAL = "200/second"  # all clients together, each route
CACHE_S = 0.5  # bodies are built at most FRESH_BUILDS times per CACHE_S; past that the latest is served
FRESH_BUILDS = 8  # (a client polling ten times a second, or reading once after an event, still gets fresh ones)
ROUND_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
FETCH_BUCKETS = (0.005, 0.02, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300)
try:
    VERSION = importlib.metadata.version("diloco")
except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
    VERSION = "unknown"

# Where a node's wall time goes (`NodeStats.time_s`, `/status` "time_s"): inner steps, and everything else.
# Phases ending in "_bg" run alongside the others (background threads) and are not part of the sum.
PHASES = ("prepare", "sync", "round_start", "inner_steps", "train_hop", "compress", "publish", "ledger_add",
          "close_wait", "evaluate", "checkpoint", "blob_gc", "drain", "checkpoint_write_bg")


@dataclass
class NodeStats:
    """Progress of this process, updated by the runtime (trio thread only)."""

    peer_id: str
    started_at: float = field(default_factory=time.time)
    state: str = "syncing"  # syncing / training / stopped
    draining: bool = False
    round: int = 0  # rounds finished (restored from a checkpoint)
    inner_steps: int = 0  # this process
    tokens: int = 0  # this process
    loss: float | None = None
    eval_loss: float | None = None
    eval_slot: int | None = None  # the slot of the global parameters eval_loss was taken of
    eval_history: list[list[float]] = field(default_factory=list)
    steps_per_second: float | None = None
    contributed_step_seconds: float = 0.0
    first_update_at: float | None = None  # the first update this process trained (not a recovered one)
    updates_published: int = 0
    # rounds a previous process of this node had in flight when it ended, published by this one
    # (node.outer.inflight); their steps count in contributed_step_seconds, inner_steps and tokens too
    recovered_rounds: int = 0
    recovered_step_seconds: float = 0.0
    rejections: Counter[str] = field(default_factory=Counter)  # node-level refusals (payload contents)
    sync: dict[str, Any] | None = None  # the state sync this process did, if any
    waiting_for: str | None = None  # while syncing: what the node waits for (a peer, a state, a download)
    resumed_round: int | None = None  # round of the checkpoint this process resumed from
    time_s: Counter[str] = field(default_factory=Counter)  # seconds of this process per phase (PHASES)
    # the last failed write per kind ("checkpoint", "update_blob": a full disk, permissions), removed when a
    # write of that kind succeeds again; the node keeps training meanwhile
    disk_errors: dict[str, str] = field(default_factory=dict)
    # what this node trains (set by the runtime): shown in /status and on the info metric
    run_id: str = ""
    model: str = ""  # the preset, and how many parameters
    inner_lr: float | None = None  # the inner optimizer's peak learning rate
    max_rounds: int | None = None
    island: dict[str, Any] | None = None  # the inner loop's devices and mesh (`InnerLoop.layout`)
    # how updates travel (--traffic): a reduced run adds its roster, shards and its last slot's outcome
    traffic: dict[str, Any] = field(default_factory=lambda: {"mode": "all-to-all"})
    round_seconds: Histogram | None = None  # set by StatusRoutes (/metrics): the wall time of each round

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Add the wall time of the block to `time_s[phase]` (trio thread)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.time_s[phase] += time.perf_counter() - start

    def observe_round(self, steps: int, seconds: float, tokens: int, loss: float) -> None:
        if self.round_seconds is not None:
            self.round_seconds.observe(seconds)
        self.inner_steps += steps
        self.tokens += tokens
        self.loss = loss if math.isfinite(loss) else None
        if steps and seconds > 0:
            rate = steps / seconds
            self.steps_per_second = rate if self.steps_per_second is None else 0.7 * self.steps_per_second + 0.3 * rate


def _rejections(stats: NodeStats, host: Host) -> dict[str, int]:
    merged: Counter[str] = Counter(stats.rejections)
    for reason, n in host.counters.rejections.items():
        if reason is not Reason.DUPLICATE and n:  # duplicates are normal gossip, not refusals
            merged[reason.value] += n
    return dict(sorted(merged.items()))


def status_fields(stats: NodeStats, replica: Replica | None, host: Host,
                  digests: tuple[bytes, bytes] | None = None) -> dict[str, Any]:
    """The `/status` JSON object (contract fields first, then extras). `digests` default to the
    replica's cached ones (empty strings before the first computation)."""
    control, blob = host.counters.total(Kind.CONTROL), host.counters.total(Kind.BLOB)
    if digests is None and replica is not None:
        digests = replica.cached_digests
    return {
        "peer_id": stats.peer_id,
        "run_id": stats.run_id,
        "model": stats.model,
        "inner_lr": stats.inner_lr,
        # slots to the run's last one (its configuration's end, --max-rounds): about rounds of each node
        "rounds_left": (max(0, stats.max_rounds - (replica.slot if replica is not None else 0))
                        if stats.max_rounds is not None else None),
        "end_slot": stats.max_rounds,
        "state": stats.state,
        "slot": replica.slot if replica is not None else 0,
        "round": stats.round,
        "inner_steps": stats.inner_steps,
        "tokens": stats.tokens,
        "loss": stats.loss,
        "eval_loss": stats.eval_loss,
        "eval_slot": stats.eval_slot,
        "eval_history": stats.eval_history,
        "peers": host.connected_peers(),
        "bytes_sent": control.sent_bytes + blob.sent_bytes,
        "bytes_received": control.recv_bytes + blob.recv_bytes,
        "updates_applied": replica.updates_applied if replica is not None else 0,
        "updates_rejected": _rejections(stats, host),
        "ledger_digest": digests[0].hex() if digests else "",
        "params_digest": digests[1].hex() if digests else "",
        "steps_per_second": stats.steps_per_second,
        "contributed_step_seconds": stats.contributed_step_seconds,
        "started_at": stats.started_at,
        "first_update_at": stats.first_update_at,
        # extras
        "draining": stats.draining,
        "gossip_addr": host.gossip_addr,
        "http_addr": host.http_addr,
        "updates_published": stats.updates_published,
        "recovered_rounds": stats.recovered_rounds,
        "recovered_step_seconds": stats.recovered_step_seconds,
        "ledger_outcomes": dict(sorted(replica.outcomes.items())) if replica is not None else {},
        "held_future": {str(k): v for k, v in replica.held.items()} if replica is not None else {},
        "fork_refused_from": sorted(replica.guard.refused_from) if replica is not None else [],
        "sync": stats.sync,
        "waiting_for": stats.waiting_for,
        "dial_failures": host.dial_failures.describe(),
        "resumed_round": stats.resumed_round,
        "disk_errors": dict(sorted(stats.disk_errors.items())),
        "http_throttled": dict(sorted(host.http.throttled.items())),
        # connections: open now, and the host's events (connects, refused_connections, evicted_handshakes, ...)
        "connections": host.open_connections,
        "p2p_events": dict(sorted(host.counters.events.items())),
        "run_config_hash": config_hash(host.config.run_config),
        "run_config": host.config.run_config,
        "admission": {"closed": host.config.admission.closed, "founder": host.config.admission.founder},
        # whether peers can dial this node (asked of them: p2p.reach), and how its updates' blobs leave it
        "reachable": {"public": "yes", "private": "no"}.get(host.outreach.reach.state, "unknown"),
        "reachability": host.outreach.reach.describe(),
        "blobs_leave": host.outreach.blobs_leave,
        "tls": host.tls is not None,
        "island": stats.island,
        "traffic": stats.traffic,
        # the two totals above by plane: gossip frames, and HTTP bodies (blobs, states, a reduced run's pieces)
        "bytes_by_plane": {"gossip": {"sent": control.sent_bytes, "received": control.recv_bytes},
                           "http": {"sent": blob.sent_bytes, "received": blob.recv_bytes}},
        "peer_slots": {p.peer_id: p.slot for p in host.peers()},
        "time_s": {k: round(v, 3) for k, v in stats.time_s.items()},
        "peak_rss_bytes": peak_rss_bytes(),
    }


def peak_rss_bytes() -> int:
    """The process's peak resident memory so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class _Collector(Collector):
    def __init__(self, routes: StatusRoutes) -> None:
        self.routes = routes

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = status_fields(self.routes.stats, self.routes.replica, self.routes.host)
        info = GaugeMetricFamily("diloco_node_info", "this node (value 1)", labels=["peer_id", "run_id", "model", "version"])
        info.add_metric([s["peer_id"], s["run_id"], s["model"], VERSION], 1)
        yield info
        state = GaugeMetricFamily("diloco_node_state", "1 for the node's state, 0 for the others", labels=["state"])
        for name in ("syncing", "training", "stopped"):
            state.add_metric([name], float(s["state"] == name))
        yield state
        for name, help_text, value in [
            ("slot", "slots closed (outer steps applied)", s["slot"]),
            ("round", "rounds finished", s["round"]),
            ("peers", "connected peers", len(s["peers"])),
            ("loss", "mean training loss of the last round (nats)", s["loss"]),
            ("eval_bits_per_byte", "last held-out loss (bits per byte)", s["eval_loss"]),
            ("steps_per_second", "inner steps per second (moving average)", s["steps_per_second"]),
            ("started_at_seconds", "Unix time the process started", s["started_at"]),
            ("first_update_at_seconds", "Unix time of the first published update", s["first_update_at"]),
            ("draining", "1 while waiting for peers at the end of the run", int(s["draining"])),
        ]:
            if value is not None:
                yield GaugeMetricFamily(f"diloco_node_{name}", help_text, value=float(value))
        for name, help_text, value in [
            ("inner_steps", "inner steps done by this process", s["inner_steps"]),
            ("tokens", "tokens trained by this process", s["tokens"]),
            ("updates_applied", "updates put into the ledger (own and peers')", s["updates_applied"]),
            ("updates_published", "updates this node published", s["updates_published"]),
            ("contributed_step_seconds", "inner-step time of rounds whose update was published",
             s["contributed_step_seconds"]),
            ("recovered_rounds", "rounds of a previous process of this node, in flight when it ended, published "
             "by this one", s["recovered_rounds"]),
        ]:
            yield CounterMetricFamily(f"diloco_node_{name}", help_text, value=float(value))
        rejected = CounterMetricFamily("diloco_node_updates_rejected", "refused messages and updates",
                                       labels=["reason"])
        for reason, n in s["updates_rejected"].items():
            rejected.add_metric([reason], n)
        yield rejected
        outcomes = CounterMetricFamily("diloco_node_ledger_outcomes", "ledger add outcomes", labels=["outcome"])
        for outcome, n in s["ledger_outcomes"].items():
            outcomes.add_metric([outcome], n)
        yield outcomes
        traffic = self.routes.host.counters.snapshot()["peers"]
        for direction in ("sent", "recv"):
            fam = CounterMetricFamily(f"diloco_p2p_{direction}_bytes", f"bytes {direction}, by peer and kind",
                                      labels=["peer", "kind"])
            for peer, kinds in traffic.items():
                for kind, t in kinds.items():
                    fam.add_metric([peer, kind], t[f"{direction}_bytes"])
            yield fam


LAST_STATUS = "status.json"  # in the checkpoint directory: the `/status` object of the process's last moment


def write_last_status(directory: Path, fields: dict[str, Any]) -> None:
    """Write a stopping process's final `/status` object to `directory/LAST_STATUS`, atomically (temp file,
    rename): what it published while stopping, readable after its HTTP server is gone (the testnet's goodput
    counts the round a stop published from it). An I/O error is logged, never raised: the stop goes on."""
    path = directory / LAST_STATUS
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(fields))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("last status not written to %s: %s", path, exc)


class CachedBody:
    """A response body that costs a build: `get()` builds a fresh one unless `fresh` were built in the last
    `interval` seconds (trio's clock) or one is being built; then it returns the latest (never older than
    `interval` while requests keep coming). Builds never overlap; before the first body exists, a request
    waits for the build under way. Trio thread only."""

    def __init__(self, build: Callable[[], Awaitable[bytes]], *, interval: float = CACHE_S,
                 fresh: int = FRESH_BUILDS) -> None:
        self._build = build
        self.interval, self.fresh = interval, fresh
        self.builds = 0
        self._body: bytes | None = None
        self._recent: deque[float] = deque()  # when the builds of the last `interval` s started
        self._building: trio.Event | None = None

    async def get(self) -> bytes:
        now = trio.current_time()
        while self._recent and self._recent[0] <= now - self.interval:
            self._recent.popleft()
        if self._body is not None and (self._building is not None or len(self._recent) >= self.fresh):
            return self._body
        if self._building is not None:  # the first body is being built: wait for it
            await self._building.wait()
            return await self.get()
        self._building = building = trio.Event()
        self._recent.append(now)
        try:
            self._body = await self._build()
            self.builds += 1
        finally:
            self._building = None
            building.set()
        return self._body


class StatusRoutes:
    """Mounts `GET /status` and `GET /metrics` on the host's HTTP app (bodies from a `CachedBody` each)."""

    def __init__(self, stats: NodeStats, host: Host) -> None:
        self.stats, self.host = stats, host
        self.replica: Replica | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        stats.round_seconds = Histogram("diloco_node_round_seconds", "wall time of a round (training, compression, "
                                        "publishing)", buckets=ROUND_BUCKETS, registry=self.registry)
        fetch = Histogram("diloco_p2p_blob_fetch_seconds", "wall time of a blob download that succeeded",
                          buckets=FETCH_BUCKETS, registry=self.registry)
        host.counters.on_fetch = fetch.observe
        self.status_body = CachedBody(self._build_status)
        self.metrics_body = CachedBody(self._build_metrics)

    def mount(self) -> None:
        self.host.http.route("GET", "/status", self.status, per_client=STATUS_LIMIT, total=STATUS_TOTAL)
        self.host.http.route("GET", "/metrics", self.metrics, per_client=STATUS_LIMIT, total=STATUS_TOTAL)

    async def _build_status(self) -> bytes:
        digests = await self.replica.digests() if self.replica is not None else None
        return json.dumps(status_fields(self.stats, self.replica, self.host, digests)).encode()

    async def _build_metrics(self) -> bytes:
        return generate_latest(self.registry)

    async def status(self, request: Request) -> Response:
        return Response(200, await self.status_body.get(), {"content-type": "application/json"})

    async def metrics(self, request: Request) -> Response:
        return Response(200, await self.metrics_body.get(), {"content-type": CONTENT_TYPE_LATEST})
