"""Reduced slots among in-process nodes: each node a :class:`protocol.reduced.participant.ReducedNode` that
knows only what this loop hands it, every message real (signed headers, commitments, seals, partials,
reductions, fraud proofs, encoded pieces with their Merkle proofs), every byte a node would receive or send
counted, the network itself a loop.

A slot closes in the phases of docs/design.md ("Reduced slots"): contributors gossip signed headers with
their commitments; the first live sealer seals the slot; each node then does what it can and asks for the
rest (:meth:`ReducedNode.advance`): an aggregator fetches its shard of every sealed update from its origin,
fetches the other aggregators' screen partials of its tensors, reduces its shard and publishes it; every
node fetches the ``S`` reduced shards, holds each to the headers' norm bound and steps its replica; each
shard's checker re-reduces the pieces its own coin draws and, when they differ, signs a fraud proof, which
every node judges from that piece of every update. This loop is also the slot clock: when no node can do
more, a shard whose expected reducer is silent (not waiting on partials) is passed over on every node.
With ``shuffle``, gossip reaches each node late and out of order (a replacement before the judgement that
calls for it, a fraud proof before the reduction it accuses): the participants hold what comes early, and
the replicas end with the same bits.

Counting: a gossiped record (header, commitment, seal, reduction, fraud proof) reaches every other node once
and each node forwards, on average, what it receives (the mesh's steady state), so it counts once in and once
out per node; a fetched range (raw pieces with their Merkle proof, a reduced shard, a partials record) counts
in at the fetcher and out at the server. All-to-all, counted the same way over the same updates, is every
node fetching every other payload.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from node.reduced.chaos import LyingNode
from protocol import wire
from protocol.errors import LocalProtocolError
from protocol.identity import Identity
from protocol.ledger import LedgerConfig
from protocol.reduced import ShardPlan
from protocol.reduced.participant import FetchPieces, NeedPartials, Publish, ReducedNode
from protocol.reduced.records import PARTIALS, REDUCTION, Record

__all__ = ["ReducedNet", "SlotNetwork", "SlotReport"]

RUN = "reduced-bench"


@dataclass
class SlotReport:
    """What one slot cost and found: bytes per node by kind, the update's size, who did what."""

    slot: int
    update_bytes: int
    received: Counter = field(default_factory=Counter)  # node -> bytes in
    sent: Counter = field(default_factory=Counter)  # node -> bytes out
    by_kind: Counter = field(default_factory=Counter)  # kind -> bytes in, all nodes
    all_to_all_in: Counter = field(default_factory=Counter)  # node -> bytes in, all-to-all
    all_to_all_out: Counter = field(default_factory=Counter)
    sealed: int = 0
    carried: int = 0  # updates no seal of this slot holds (late, or past the cap): placed in the next slot
    screen_rounds: int = 0
    fall_backs: int = 0
    caught: list[tuple[int, str]] = field(default_factory=list)  # (shard, liar) a check caught
    refused: list[tuple[int, str]] = field(default_factory=list)  # (shard, liar) past the norm bound
    false_accusations: list[tuple[int, str]] = field(default_factory=list)  # (shard, accuser) judged wrong
    rejected: list[str] = field(default_factory=list)  # messages some node refused, with the reason


class _HarnessNode(LyingNode):
    """A node the harness can make hostile for one slot: ``factor`` scales every shard it reduces (a liar's,
    `node.reduced.chaos.LyingNode`), ``accuses`` signs a fraud proof against every shard it checks, honest or
    not."""

    accuses: bool = False

    def _difference(self, k, drawn, mine, theirs):
        found = super()._difference(k, drawn, mine, theirs)
        return (drawn or self.plan.shard(k))[0].index if found is None and self.accuses else found


class ReducedNet:
    """``n`` nodes training a model of ``shapes`` in reduced slots of ``shards`` shards (default ``n``): each a
    :class:`protocol.reduced.participant.ReducedNode` that knows only what this loop delivers to it.

    ``replicas``: how many nodes keep a full replica (all by default; a large ``n`` keeps a few, the
    others still do every part of the protocol and count every byte). ``q``: the checkers' share of a shard.
    ``shuffle``: a seed by which gossip reaches each node late and out of order (default: in order, at once)."""

    def __init__(self, n: int, shapes: Mapping[str, tuple[int, ...]], params: Mapping[str, np.ndarray],
                 config: LedgerConfig, *, codec: str = "int4", reduction_codec: str | None = None,
                 shards: int | None = None, q: float = 0.5, replicas: int | None = None, cap: int | None = None,
                 seed: int = 0, shuffle: int | None = None) -> None:
        self.ids = [Identity.from_seed(hashlib.sha256(b"reduced-node-%d" % i).digest()) for i in range(n)]
        self.peers = [i.peer_id for i in self.ids]
        self.plan = ShardPlan(shapes, shards if shards is not None else n)
        keep = n if replicas is None else min(n, replicas)
        verdicts: dict = {}  # the norm bound's verdicts by reduction id, computed once for every node
        self.nodes = {p: _HarnessNode(i, self.peers, self.plan, config, run_id=RUN, codec=codec,
                                      reduction_codec=reduction_codec, cap=cap, q=q, seed=seed,
                                      params=params if k < keep else None, verdicts=verdicts)
                      for k, (p, i) in enumerate(zip(self.peers, self.ids, strict=True))}
        self.replicas = {p: node.replica for p, node in self.nodes.items() if node.replica is not None}
        self.eligible = set(self.peers)
        self.slot = 0
        self.shuffle = None if shuffle is None else np.random.default_rng(shuffle)

    @property
    def excluded(self) -> set[str]:
        """Who a proof has excluded: the same on every node (``LocalProtocolError`` otherwise)."""
        views = {frozenset(node.excluded) for node in self.nodes.values()}
        if len(views) != 1:
            raise LocalProtocolError("the nodes disagree on who is excluded")
        return set(next(iter(views)))

    def close(self, updates: Iterable[tuple[str, bytes, int, int, int]], *, dead: Sequence[str] = (),
              liars: Mapping[str, float] | None = None, late: Iterable[str] = (),
              false_checkers: Iterable[str] = ()) -> SlotReport:
        """Close the next slot over ``updates`` ((peer, payload in the run's codec, base slot, tokens, inner
        steps), each taken as it comes) and the updates earlier slots carried. ``dead`` nodes take no role this
        slot (the others pass them over); a liar's reductions are its honest ones times its factor; ``late``
        peers publish after the seal. An update no seal holds (late, or past the cap) is carried: a candidate
        of the next slot, one slot staler. ``false_checkers`` sign a fraud proof against every shard they check,
        honest or not."""
        liars, false_checkers, dead, late = dict(liars or {}), set(false_checkers), set(dead), set(late)
        for p, node in self.nodes.items():
            node.factor, node.accuses, node.takes_roles = liars.get(p), p in false_checkers, p not in dead
        net = SlotNetwork(self.nodes, SlotReport(self.slot + 1, 0), self.shuffle)
        held_back = []
        for update in updates:
            if update[0] in late:
                held_back.append(update)
            else:
                net.publish(*update)
        first = self.nodes[self.peers[0]]
        net.seal(next(p for p in first.sealer_order() if p not in dead))
        for update in held_back:  # published after the seal: candidates of the next slot
            net.publish(*update)
        net.run()

        slots = [node.finish() for node in self.nodes.values()]
        s, report = slots[0], net.report
        report.sealed, report.carried = len(s.seal.ids), len(first.pool)
        report.screen_rounds = len(set().union(*(x.screened for x in slots)))
        report.fall_backs = len(s.passed)
        report.caught, report.refused, report.false_accusations = s.caught, s.refused, s.false_accusations
        report.rejected = sorted({r for x in slots for r in x.rejected})
        self.excluded  # the nodes agree on it, or this raises
        self.slot = s.number
        return report

    def agree(self) -> bool:
        """Whether every replica holds the same bits."""
        return len({r.digest() for r in self.replicas.values()}) <= 1

    def params(self) -> dict[str, np.ndarray]:
        return next(iter(self.replicas.values())).params()


class SlotNetwork:
    """The network of one slot: gossip into each node's inbox (taken at once and in order, or, with
    ``shuffle``, each message late by a coin and in random order), fetches served by the node that holds the
    bytes, every byte counted into ``report``."""

    def __init__(self, nodes: Mapping[str, ReducedNode], report: SlotReport,
                 shuffle: np.random.Generator | None) -> None:
        self.nodes, self.report, self.shuffle = nodes, report, shuffle
        self.inbox: dict[str, list[tuple[Record, bytes | None]]] = {p: [] for p in nodes}
        self.partials: dict[tuple[str, bytes], list[Record]] = {}  # served by their authors to whoever asks
        self.delivered: dict[str, set[bytes]] = {p: set() for p in nodes}

    def gossip(self, kind: str, size: int, author: str) -> None:
        for p in self.nodes:
            if p != author:
                self.report.received[p] += size
                self.report.sent[p] += size
                self.report.by_kind[kind] += size

    def fetch(self, kind: str, to: str, server: str, size: int) -> None:
        if to != server:
            self.report.received[to] += size
            self.report.sent[server] += size
            self.report.by_kind[kind] += size

    def publish(self, peer: str, data: bytes, base: int, tokens: int, steps: int) -> None:
        signed, record = self.nodes[peer].publish(data, base, tokens, steps)
        self.report.update_bytes = max(self.report.update_bytes, len(data))
        self.gossip("headers", len(wire.encode(signed)) + record.size, peer)
        for p, node in self.nodes.items():
            if p != peer:
                node.offer(signed, record)
                self.report.all_to_all_in[p] += len(data)  # all-to-all over the same updates
                self.report.all_to_all_out[peer] += len(data)

    def seal(self, sealer: str) -> None:
        seal = self.nodes[sealer].seal().record
        self.gossip("seals", seal.size, sealer)
        for p, node in self.nodes.items():
            if p != sealer:
                node.take_seal(seal)

    def run(self) -> None:
        """Deliver what the nodes publish and ask for until none can do more; then the clock passes over each
        shard whose expected reducer is silent (not waiting on partials), until every shard stands on every
        node."""
        first = next(iter(self.nodes.values()))
        while True:
            progress, waiting = False, set()
            order = list(self.nodes)
            if self.shuffle is not None:
                self.shuffle.shuffle(order)
            for peer in order:
                progress |= self._deliver(peer)
                for action in self.nodes[peer].advance():
                    moved = self._act(peer, action)
                    progress |= moved
                    if isinstance(action, NeedPartials) and not moved:
                        waiting.add(peer)
            if progress or any(self.inbox.values()):
                continue
            stalled = [k for k in range(first.plan.shards) if any(n.awaits(k) for n in self.nodes.values())]
            if not stalled:
                return
            s = first.open
            silent = [k for k in stalled if s.at[k] < len(s.roles[k]) and s.roles[k][s.at[k]] not in waiting]
            if not silent:
                raise LocalProtocolError(f"shards {stalled} cannot be reduced: every reducer waits on another")
            for k in silent:
                for node in self.nodes.values():
                    node.pass_over(k)

    def _deliver(self, peer: str) -> bool:
        """Hand ``peer`` what gossip brought it (with ``shuffle``: each message by a coin, in random order)."""
        box, node = self.inbox[peer], self.nodes[peer]
        if self.shuffle is None:
            now, self.inbox[peer] = box, []
        else:
            coins = self.shuffle.random(len(box)) < 0.5
            now = [m for m, c in zip(box, coins, strict=True) if c]
            self.inbox[peer] = [m for m, c in zip(box, coins, strict=True) if not c]
            self.shuffle.shuffle(now)
        for record, data in now:
            if record.kind == REDUCTION:
                node.take_reduction(record, data)
            else:
                node.take_fraud(record)
        return bool(now)

    def _act(self, peer: str, action: FetchPieces | NeedPartials | Publish) -> bool:
        """Do what ``peer`` asked; whether anything moved."""
        node = self.nodes[peer]
        if isinstance(action, FetchPieces):
            data, proof = self.nodes[action.origin].serve(action.update_id, action.pieces)
            self.fetch(action.kind, peer, action.origin, len(data) + 32 * len(proof))
            node.take_pieces(action.update_id, action.pieces, data, proof)
            return True
        if isinstance(action, NeedPartials):
            found = [r for r in self.partials.get((action.name, action.key), ())
                     if r.id not in self.delivered[peer] and set(r.fields[3]) & set(action.pieces)]
            for r in found:
                self.fetch("partials", peer, r.author, r.size)
                node.take_partials(r)
                self.delivered[peer].add(r.id)
            return bool(found)
        rec = action.record
        if rec.kind == PARTIALS:
            self.partials.setdefault((rec.fields[1], rec.fields[2]), []).append(rec)
            self.delivered[peer].add(rec.id)
            return True
        self.gossip("reductions" if rec.kind == REDUCTION else "fraud proofs", rec.size, peer)
        for p in self.nodes:
            if p != peer:
                if rec.kind == REDUCTION:  # every node fetches the reduction's bytes from its author
                    self.fetch(action.kind, p, peer, len(action.data))
                self.inbox[p].append((rec, action.data))
        return True


def per_update(counts: Counter, peers: Sequence[str], update_bytes: int) -> tuple[float, float]:
    """(mean, max) over ``peers`` of ``counts`` ÷ one update's bytes."""
    xs = [counts[p] / update_bytes for p in peers]
    return float(np.mean(xs)), float(max(xs))

