"""Tier (a) harness: N sans-IO routers wired together in memory with a fake clock.

Frames travel as the real canonical bytes (`protocol.wire.encode`), handshakes run the real
`Handshake` state machines, blobs are byte strings verified by SHA-256 like the host does. Nothing
here sleeps; `tick(dt)` advances the fake clock and runs every node's heartbeat.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from dataclasses import dataclass, field

from protocol import signing, wire
from protocol.errors import Reason, RemoteProtocolError
from protocol.gossip import (
    Action,
    Deliver,
    Dial,
    Disconnect,
    Fetch,
    GossipConfig,
    Handshake,
    Reject,
    Router,
    Send,
    State,
)
from protocol.identity import Identity
from protocol.messages import PeerInfo, UpdateHeader
from protocol.seen import SeqnoSource
from testnet.faults import FaultPlan

RUN = "sim-run"
T0 = 1_800_000_000.0  # Unix time: seqnos and replay windows need a plausible clock


@dataclass
class SimNode:
    index: int
    identity: Identity
    router: Router
    blobs: dict[str, bytes] = field(default_factory=dict)
    corrupt: bool = False  # serves wrong bytes for every blob
    gone: bool = False  # answers that it does not hold any blob (404: removed by its clean-up)
    up: bool = True
    delivered: list[Deliver] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    fetches: int = 0  # completed downloads
    attempts: int = 0  # downloads started
    seqnos: SeqnoSource = field(default_factory=SeqnoSource)

    @property
    def peer_id(self) -> str:
        return self.identity.peer_id


def addr(i: int) -> str:
    return f"10.0.0.{i + 1}:4000"


def header(node: SimNode, payload: bytes, now: float) -> UpdateHeader:
    return UpdateHeader(
        run_id=RUN,
        origin=node.peer_id,
        seqno=node.seqnos.next(now),
        base_slot=0,
        publish_slot=0,
        tokens=100,
        inner_steps=10,
        codec="fp32",
        shapes=(("w", (len(payload) // 4,)),),
        payload_sha256=hashlib.sha256(payload).digest(),
        payload_size=len(payload),
    )


class SimNet:
    def __init__(self, n: int, *, seed: int = 0, bootstrap: list[int] | None = None, **config: object) -> None:
        self.now = T0
        self.rng = random.Random(seed)
        self.config = GossipConfig(run_id=RUN, **config)
        self.nodes: list[SimNode] = []
        self._conns: dict[int, tuple[int, int]] = {}
        self._next_conn = 0
        self._frames: deque[tuple[int, str, int, bytes]] = deque()
        self._work: deque[tuple[int, Action]] = deque()
        self.blocked: set[frozenset[int]] = set()  # pairs that cannot reach each other (partition)
        for i in range(n):
            ident = Identity.from_seed(bytes([i + 1]) * 32)
            boot = [addr(b) for b in (bootstrap or [])]
            router = Router(
                self.config, PeerInfo(ident.peer_id, addr(i), f"10.0.0.{i + 1}:8000"),
                rng=random.Random(seed * 1000 + i), bootstrap=boot,
            )
            self.nodes.append(SimNode(i, ident, router))

    # ---- wiring -----------------------------------------------------------------------------------

    def index_of(self, peer: str) -> int:
        return next(n.index for n in self.nodes if n.peer_id == peer)

    def conns_of(self, i: int) -> list[int]:
        return [c for c, (a, b) in self._conns.items() if i in (a, b)]

    def connect(self, i: int, j: int, dialed: str | None = None) -> int | None:
        """Run a real handshake between i (dialer) and j; returns the connection id, None if refused."""
        a, b = self.nodes[i], self.nodes[j]
        if not (a.up and b.up) or frozenset((i, j)) in self.blocked:
            return None
        self._next_conn += 1
        conn = self._next_conn
        hs = {
            i: Handshake(a.identity, a.router.validator, gossip_addr=addr(i), http_addr="", challenge=self.rng.randbytes(32)),
            j: Handshake(b.identity, b.router.validator, gossip_addr=addr(j), http_addr="", challenge=self.rng.randbytes(32)),
        }
        inflight = deque([(j, wire.encode(hs[i].hello)), (i, wire.encode(hs[j].hello))])
        while inflight:
            to, data = inflight.popleft()
            other = j if to == i else i
            for message in hs[to].receive_frame(data, self.now):
                inflight.append((other, wire.encode(message)))
        assert hs[i].state is State.DONE and hs[j].state is State.DONE
        self._conns[conn] = (i, j)
        self._run(i, a.router.connected(hs[i].peer, conn, True, self.now, dialed))
        if conn in self._conns:
            self._run(j, b.router.connected(hs[j].peer, conn, False, self.now))
        return conn if conn in self._conns else None

    def close(self, conn: int, *, notify: tuple[int, ...] = ()) -> None:
        ends = self._conns.pop(conn, None)
        if ends is None:
            return
        for k in notify:
            other = ends[1] if ends[0] == k else ends[0]
            self._run(k, self.nodes[k].router.disconnected(self.nodes[other].peer_id, conn, self.now))

    def partition(self, *groups: list[int]) -> None:
        """Cut every route between the groups: their connections close (both ends told, as when
        chaos drops them) and dials across fail until `heal`."""
        for g, group in enumerate(groups):
            for other in groups[g + 1 :]:
                self.blocked |= {frozenset((a, b)) for a in group for b in other}
        for conn, (a, b) in list(self._conns.items()):
            if frozenset((a, b)) in self.blocked:
                self.close(conn, notify=(a, b))

    def heal(self, *groups: list[int]) -> None:
        """Routes between `groups` open again (every route, without groups)."""
        if not groups:
            self.blocked.clear()
        for g, group in enumerate(groups):
            for other in groups[g + 1 :]:
                self.blocked -= {frozenset((a, b)) for a in group for b in other}

    def crash(self, i: int) -> None:
        """The node stops: nothing more from it, and nobody is told (half-open connections)."""
        self.nodes[i].up = False

    def restart(self, i: int, *, keep_blobs: bool = True, known=None) -> None:
        """Same key, fresh state (a new router), same bootstrap list; `known`: the router's hook for the
        message ids the application holds (a node whose ledger came back from its checkpoint)."""
        old = self.nodes[i]
        for conn in self.conns_of(i):
            self._conns.pop(conn)
        router = Router(
            self.config, old.router.local, rng=random.Random(self.rng.random()), bootstrap=old.router.bootstrap,
            known=known,
        )
        blobs = dict(old.blobs) if keep_blobs else {}
        self.nodes[i] = SimNode(i, old.identity, router, blobs=blobs, seqnos=old.seqnos)
        for name in blobs:
            router.blob_stored(name, self.now)

    # ---- driving ----------------------------------------------------------------------------------

    def follow(self, plan: FaultPlan) -> None:
        """Play `plan` from now to its end, heartbeat by heartbeat: the testnet's fault vocabulary
        (`testnet.faults`, which the supervisor and the simulator also read). A kill is a crash, its
        restart keeps the node's key and blobs; partitions cut and heal their two sides."""
        start = self.now
        for action in plan.actions():
            while self.now + self.config.heartbeat_s <= start + action.at:
                self.tick()
            if action.kind == "kill":
                self.crash(action.node)
            elif action.kind == "restart":
                self.restart(action.node)
            elif action.partition is not None:
                sides = list(action.partition.side_a), list(action.partition.side_b)
                (self.partition if action.kind == "partition" else self.heal)(*sides)
        while self.now + self.config.heartbeat_s <= start + plan.duration:
            self.tick()

    def publish(self, i: int, payload: bytes) -> bytes:
        node = self.nodes[i]
        name = hashlib.sha256(payload).hexdigest()
        node.blobs[name] = payload
        node.router.blob_stored(name, self.now)
        signed = signing.sign(node.identity, header(node, payload, self.now))
        self._run(i, node.router.publish(signed, self.now))
        self.settle()
        return signed.message_id

    def inject(self, i: int, from_peer: str, data: bytes) -> list[Action]:
        """Hand node i a raw frame as if `from_peer` sent it on their current connection."""
        state = self.nodes[i].router.peers[from_peer]
        actions = self.nodes[i].router.received(from_peer, state.conn, data, self.now)
        self._run(i, actions)
        self.settle()
        return actions

    def tick(self, dt: float | None = None) -> None:
        self.now += self.config.heartbeat_s if dt is None else dt
        for node in self.nodes:
            if node.up:
                self._run(node.index, node.router.heartbeat(self.now))
        self.settle()

    def settle(self, limit: int = 100_000) -> None:
        """Deliver every queued frame and perform every queued dial/fetch, until nothing is left."""
        for _ in range(limit):
            if self._frames:
                to, sender, conn, data = self._frames.popleft()
                node = self.nodes[to]
                if node.up and conn in self._conns:
                    self._run(to, node.router.received(sender, conn, data, self.now))
            elif self._work:
                i, action = self._work.popleft()
                if isinstance(action, Dial):
                    self._dial(i, action)
                else:
                    assert isinstance(action, Fetch)
                    self._fetch(i, action)
            else:
                return
        raise AssertionError("network did not settle")

    def _run(self, i: int, actions: list[Action]) -> None:
        node = self.nodes[i]
        for action in actions:
            if isinstance(action, Send):
                state = node.router.peers.get(action.peer)
                assert state is not None or action.conn is not None, "router sent to a peer it does not hold"
                conn = action.conn if action.conn is not None else state.conn
                ends = self._conns.get(conn)
                if ends is not None:
                    to = ends[1] if ends[0] == i else ends[0]
                    self._frames.append((to, node.peer_id, conn, wire.encode(action.message)))
            elif isinstance(action, Deliver):
                node.delivered.append(action)
            elif isinstance(action, Reject):
                node.rejects.append(action)
            elif isinstance(action, Disconnect):
                ends = self._conns.get(action.conn)
                if ends is not None:
                    other = ends[1] if ends[0] == i else ends[0]
                    self.close(action.conn, notify=(other,) if self.nodes[other].up else ())
            else:
                self._work.append((i, action))

    def _dial(self, i: int, action: Dial) -> None:
        node = self.nodes[i]
        target = next((n for n in self.nodes if addr(n.index) == action.address), None)
        if target is None or not target.up or not node.up or frozenset((i, target.index)) in self.blocked:
            self._run(i, node.router.dial_failed(action.address, self.now))
            return
        if action.peer is not None and action.peer != target.peer_id:
            self._run(i, node.router.dial_failed(action.address, self.now))
            return
        self.connect(i, target.index, dialed=action.address)

    def _fetch(self, i: int, action: Fetch) -> None:
        node = self.nodes[i]
        holder = self.nodes[self.index_of(action.peer)]
        if not node.up:
            return
        node.attempts += 1
        if not holder.up or frozenset((i, holder.index)) in self.blocked:
            self._run(i, node.router.fetch_failed(action.blob, action.peer, None, "unreachable", self.now))
            return
        if holder.gone or action.blob not in holder.blobs:
            self._run(i, node.router.fetch_failed(action.blob, action.peer, None, "404", self.now, gone=True))
            return
        data = holder.blobs[action.blob]
        if holder.corrupt:
            data = bytes(b ^ 0xFF for b in data)
        if hashlib.sha256(data).hexdigest() != action.blob:
            err = RemoteProtocolError(Reason.HASH_MISMATCH, "sim")
            self._run(i, node.router.fetch_failed(action.blob, action.peer, err.reason, err.detail, self.now))
            return
        node.blobs[action.blob] = data
        node.fetches += 1
        self._run(i, node.router.blob_stored(action.blob, self.now, source=action.peer))

    # ---- views ------------------------------------------------------------------------------------

    def live(self) -> list[SimNode]:
        return [n for n in self.nodes if n.up]

    def overlay_connected(self) -> bool:
        """Is the graph of connections among live nodes connected?"""
        live = {n.index for n in self.live()}
        adj: dict[int, set[int]] = {i: set() for i in live}
        for a, b in self._conns.values():
            if a in live and b in live:
                adj[a].add(b)
                adj[b].add(a)
        start = next(iter(live))
        seen, stack = {start}, [start]
        while stack:
            for k in adj[stack.pop()] - seen:
                seen.add(k)
                stack.append(k)
        return seen == live
