"""Reduced slots among in-process nodes: every message real (signed headers, commitments, seals, partials,
reductions, encoded pieces), every byte a node would receive or send counted, the network itself a loop.

A slot closes in the phases of docs/design.md ("Reduced slots"): contributors gossip signed headers with
their commitments; the first live sealer seals the slot; the first live aggregator of each shard fetches its
shard of every sealed update (checked against the commitment), the aggregators of a tensor exchange
screen partials until the screen is decided, each reduces its shard and publishes it; every node fetches the
``S`` reduced shards, refuses one longer than the headers allow (``protocol.reduced.bounds``: its successor's
is fetched instead, and its aggregator leaves the eligible set), and steps its replica; the checker of each shard (the next origin in the shard's order)
re-reduces the pieces its own coin draws and, when they differ, signs a fraud proof naming a piece; every node
judges it from that piece of every update (``protocol.reduced.fraud``): a proven liar's shard is replaced on
every replica by the checker's reduction (the window replayed) and the liar leaves the eligible set, a false
accuser leaves it instead.

Counting: a gossiped record (header, commitment, seal, partials, reduction, fraud proof) reaches every other
node once and each node forwards, on average, what it receives (the mesh's steady state), so it counts once
in and once out per node (a carried update's header once, in the slot it was published); a fetched range
(raw pieces with their Merkle proof, a reduced shard) counts in at the fetcher and out at the server.
All-to-all, counted the same way over the same updates, is every node fetching every other payload.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from protocol import signing, wire
from protocol.compression import decode_tensors
from protocol.errors import RemoteProtocolError
from protocol.identity import Identity
from protocol.ledger import LedgerConfig, UpdateMeta
from protocol.ledger.proof import header_shapes
from protocol.messages import UpdateHeader
from protocol.reduced import (Commitment, PartialScreen, ReducedReplica, Seal, ShardPlan, commit, header_entry,
                              make_seal, piece_partials, reduce_pieces, reducers, sealers, slot_terms,
                              winning_seal)
from protocol.reduced.bounds import check_reduction, reduction_bounds
from protocol.reduced.fraud import first_difference, judge, make_fraud
from protocol.reduced.records import PARTIALS, REDUCTION, Record, pack_floats, sign_record
from protocol.reduced.slot import piece_leaves, pieces_proof

__all__ = ["ReducedNet", "SlotReport"]

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


class ReducedNet:
    """``n`` nodes training a model of ``shapes`` in reduced slots of ``shards`` shards (default ``n``).

    ``replicas``: how many nodes keep a full replica (all by default; a large ``n`` keeps a few, the
    others still do every part of the protocol and count every byte). ``q``: the checkers' chance per piece."""

    def __init__(self, n: int, shapes: Mapping[str, tuple[int, ...]], params: Mapping[str, np.ndarray],
                 config: LedgerConfig, *, codec: str = "int4", reduction_codec: str | None = None,
                 shards: int | None = None, q: float = 0.5, replicas: int | None = None, cap: int | None = None,
                 seed: int = 0) -> None:
        self.ids = [Identity.from_seed(hashlib.sha256(b"reduced-node-%d" % i).digest()) for i in range(n)]
        self.peers = [i.peer_id for i in self.ids]
        self.by_peer = dict(zip(self.peers, self.ids, strict=True))
        self.plan = ShardPlan(shapes, shards if shards is not None else n)
        self.config, self.codec, self.q, self.cap = config, codec, q, cap
        self.reduction_codec = reduction_codec or codec
        keep = n if replicas is None else min(n, replicas)
        self.replicas = {p: ReducedReplica(params, config, self.plan, self.reduction_codec) for p in self.peers[:keep]}
        self.eligible = set(self.peers)
        self.excluded: set[str] = set()
        self.slot = 0
        self.carried: dict[bytes, tuple[Commitment, bytes]] = {}  # unsealed: candidates of the next slot
        self.rng = np.random.default_rng(seed)

    # -- contributors ------------------------------------------------------------------------------
    def _publish(self, peer: str, data: bytes, base: int, tokens: int, steps: int):
        header = UpdateHeader(RUN, peer, self.slot + 1, base, self.slot, tokens, steps, self.codec,
                              header_shapes(self.plan.shapes), hashlib.sha256(data).digest(), len(data))
        signed = signing.sign(self.by_peer[peer], header)
        meta = UpdateMeta(signed.message_id, peer, base, self.slot, tokens, steps)
        values = decode_tensors(data, self.codec, self.plan.shapes)
        record = commit(self.by_peer[peer], meta, self.plan, data, self.codec, values)
        return meta, data, Commitment(record, meta, self.plan), len(wire.encode(signed)) + record.size

    # -- one slot ----------------------------------------------------------------------------------
    def close(self, updates: Iterable[tuple[str, bytes, int, int, int]], *, dead: Sequence[str] = (),
              liars: Mapping[str, float] | None = None, late: Iterable[str] = (),
              false_checkers: Iterable[str] = ()) -> SlotReport:
        """Close the next slot over ``updates`` ((peer, payload in the run's codec, base slot, tokens, inner
        steps), each taken as it comes, so a large run never holds every update's values) and the updates
        earlier slots carried. ``dead`` nodes take no role this slot; a liar's reductions are its honest ones
        times its factor; the updates of ``late`` peers reach the sealer after it sealed. An update no seal holds
        (late, or past the cap) is carried: a candidate of the next slot, one slot staler. ``false_checkers``
        sign a fraud proof against every shard they check, honest or not."""
        liars, false_checkers = dict(liars or {}), set(false_checkers)
        dead, late = set(dead), set(late)
        published = [self._publish(*u) for u in updates]
        slot = self.slot + 1
        report = SlotReport(slot, max(len(d) for _, d, _, _ in published))

        def gossip(kind: str, size: int, author: str | None = None) -> None:
            for p in self.peers:
                if p != author:
                    report.received[p] += size
                    report.sent[p] += size
                    report.by_kind[kind] += size

        def fetch(kind: str, to: str, server: str, size: int) -> None:
            if to != server:
                report.received[to] += size
                report.sent[server] += size
                report.by_kind[kind] += size

        for meta, data, _, size in published:
            gossip("headers", size, meta.origin)
            for q_ in self.peers:  # all-to-all over the same updates
                if q_ != meta.origin:
                    report.all_to_all_in[q_] += len(data)
                    report.all_to_all_out[meta.origin] += len(data)

        # seal: what the sealer holds, carried updates included (a cap ranks them all alike)
        candidates = dict(self.carried)
        candidates.update((c.meta.update_id, (c, data)) for meta, data, c, _ in published if meta.origin not in late)
        eligible = sorted(self.eligible - self.excluded)
        sealer = next(p for p in sealers(slot, eligible) if p not in dead)
        record = make_seal(self.by_peer[sealer], slot, list(candidates), self.cap)
        seal = winning_seal([Seal.read(record, eligible, self.cap)], eligible)
        gossip("seals", record.size, sealer)
        sealed = {i: candidates[i] for i in seal.ids}
        self.carried = {i: cd for i, cd in candidates.items() if i not in sealed}
        self.carried.update((c.meta.update_id, (c, data)) for meta, data, c, _ in published if meta.origin in late)
        report.sealed, report.carried = len(sealed), len(self.carried)
        entries = [header_entry(c, self.plan, slot, self.config) for c, _ in sealed.values()]

        # every shard's raw pieces, at its aggregator (the first live one of its order)
        roles = {k: [p for p in reducers(slot, k, eligible) if p not in dead] for k in range(self.plan.shards)}
        report.fall_backs = sum(reducers(slot, k, eligible)[0] in dead for k in range(self.plan.shards))
        leaves = {}  # update id -> its origin's Merkle leaves, for the proofs it serves
        for i, (c, data) in sealed.items():
            leaves[i] = piece_leaves(self.plan, data, self.codec)
            for k in range(self.plan.shards):
                pieces = self.plan.shard(k)
                part, proof = self.plan.cut(data, pieces, self.codec), pieces_proof(leaves[i], pieces)
                c.check_pieces(pieces[0].index, self.plan.split(part, pieces, self.codec), proof)
                fetch("raw shards", roles[k][0], c.meta.origin, len(part) + 32 * len(proof))
        values = {i: _Pieces(self.plan, data, self.codec) for i, (_, data) in sealed.items()}

        # the screen, from the aggregators' partials of each tensor's pieces
        owners = {p.index: roles[self.plan.shard_of(p)][0] for p in self.plan.pieces}
        tensor_pieces = {name: [p for p in self.plan.pieces if p.name == name] for name in self.plan.shapes}

        def gather(name: str, live: list[tuple[bytes, float]]):
            report.screen_rounds += 1
            pieces = tensor_pieces[name]
            parts = piece_partials(values, live, pieces)
            holders = {owners[p.index] for p in pieces}
            for author in holders:  # each aggregator of the tensor signs its pieces' partials for the others
                mine = [p for p in pieces if owners[p.index] == author]
                floats = [x for p in mine for x in _flat(parts[p.index])]
                rec = sign_record(self.by_peer[author], PARTIALS, [slot, name, pack_floats(floats)])
                for other in holders - {author}:
                    fetch("partials", other, author, rec.size)
            return [parts[p.index] for p in pieces]

        screen = PartialScreen(gather)
        coefficients, scales = {}, {}
        for name in self.plan.shapes:
            coefficients[name], scales[name] = slot_terms(entries, name, self.config, screen)

        # reductions: each shard's first live reducer publishes, every node fetches it and holds it to the
        # headers' norm bound (past it: refused by name, the next reducer's is fetched); then the next one in the
        # shard's order checks it, and every node judges its fraud proof (protocol.reduced.fraud): a proven lie is
        # replaced by the checker's own reduction, which the next one in the order checks in turn
        bounds = reduction_bounds(entries, self.config)
        honest = {k: self.plan.encode(reduce_pieces(values, self.plan.shard(k), coefficients, scales),
                                      self.plan.shard(k), self.reduction_codec) for k in range(self.plan.shards)}

        def publish(k: int, at: int, kind: str) -> tuple[int, bytes, Record | None]:
            """Shard ``k``'s reduction by the ``at``-th of its order or, past the bound, a later one's."""
            while True:
                pieces = self.plan.shard(k)
                if at == len(roles[k]):  # nobody left to reduce it: every node reduces it from the raw pieces
                    for c, payload in sealed.values():
                        for p in self.peers:
                            fetch("raw shards", p, c.meta.origin, len(self.plan.cut(payload, pieces, self.codec)))
                    return at, honest[k], None
                member = roles[k][at]
                factor = liars.get(member)
                data = honest[k] if factor is None else self.plan.encode(
                    {i: (x * np.float32(factor)).astype(np.float32)
                     for i, x in self.plan.decode(honest[k], pieces, self.reduction_codec).items()},
                    pieces, self.reduction_codec)
                rec = sign_record(self.by_peer[member], REDUCTION, [slot, k, seal.record.id, hashlib.sha256(data).digest()])
                gossip("reductions", rec.size, member)
                for p in self.peers:
                    fetch(kind, p, member, len(data))
                try:
                    check_reduction(self.plan.decode(data, pieces, self.reduction_codec), pieces, bounds,
                                    self.reduction_codec)
                    return at, data, rec
                except RemoteProtocolError:  # refused by name, on every node
                    report.refused.append((k, member))
                    self.excluded.add(member)
                    at += 1

        standing = {k: publish(k, 0, "reduced shards") for k in range(self.plan.shards)}
        for replica in self.replicas.values():
            replica.apply(slot, {k: data for k, (_, data, _) in standing.items()})
        for k in range(self.plan.shards):
            at, data, rec = standing[k]
            while at + 1 < len(roles[k]):
                lied = self._check(slot, k, roles[k][at + 1], data, rec, sealed, leaves, values, coefficients,
                                   scales, roles[k][at + 1] in false_checkers, fetch, gossip)
                if lied is None:
                    break
                if not lied:
                    self.excluded.add(roles[k][at + 1])
                    report.false_accusations.append((k, roles[k][at + 1]))
                    break
                self.excluded.add(roles[k][at])
                report.caught.append((k, roles[k][at]))
                at, data, rec = publish(k, at + 1, "fraud proofs")  # the checker's own reduction
                for replica in self.replicas.values():
                    replica.replace(slot, k, data)
        self.slot = slot
        return report

    def _check(self, slot: int, k: int, checker: str, data: bytes, reduction: Record, sealed: Mapping, leaves: Mapping,
               values: Mapping, coefficients: Mapping, scales: Mapping, accuses: bool, fetch, gossip) -> bool | None:
        """``checker``'s check of shard ``k``'s reduction ``data``: None when it finds nothing (and ``accuses``
        is false), else every node's judgement of its fraud proof: True, the reduction lied; False, the
        accuser did. A proven checker fetches the pieces it did not draw, to reduce the whole shard."""
        pieces, codec = self.plan.shard(k), self.reduction_codec
        drawn = self._draw(pieces)
        for c, payload in sealed.values():
            fetch("checks", checker, c.meta.origin, len(self.plan.cut(payload, drawn, self.codec)))
        mine = self.plan.encode(reduce_pieces(values, drawn, coefficients, scales), drawn, codec)
        piece = first_difference(self.plan, drawn, mine, self.plan.within(data, pieces, drawn, codec), codec)
        if piece is None and not accuses:
            return None
        named = self.plan.pieces[piece] if piece is not None else (drawn or pieces)[0]  # a false accuser's pick
        proof = make_fraud(self.by_peer[checker], slot, k, reduction, named.index)
        gossip("fraud proofs", proof.size, checker)
        for i, (c, payload) in sealed.items():  # every node fetches the named piece of every sealed update
            part, siblings = self.plan.cut(payload, [named], self.codec), pieces_proof(leaves[i], [named])
            c.check_pieces(named.index, [part], siblings)
            for p in self.peers:
                fetch("fraud proofs", p, c.meta.origin, len(part) + 32 * len(siblings))
        lied = judge(self.plan, named, self.plan.within(data, pieces, [named], codec), values, coefficients, scales,
                     codec)
        if lied:
            rest = [p for p in pieces if p not in drawn]
            for c, payload in sealed.values():
                fetch("fraud proofs", checker, c.meta.origin, len(self.plan.cut(payload, rest, self.codec)))
        return lied

    def _draw(self, pieces: list) -> list:
        """A checker's draw of ``pieces``: ``q·m`` of the ``m`` on average, ⌊q·m⌋ or one more, which ones by its
        own coin (the aggregator cannot know them)."""
        whole, part = divmod(self.q * len(pieces), 1.0)
        count = min(len(pieces), int(whole) + (self.rng.random() < part))
        picked = sorted(self.rng.choice(len(pieces), size=count, replace=False).tolist())
        return [pieces[i] for i in picked]

    def agree(self) -> bool:
        """Whether every replica holds the same bits."""
        return len({r.digest() for r in self.replicas.values()}) <= 1

    def params(self) -> dict[str, np.ndarray]:
        return next(iter(self.replicas.values())).params()


class _Pieces(Mapping[int, np.ndarray]):
    """An update's pieces by index, decoded from its payload when read (what an aggregator fetched)."""

    def __init__(self, plan: ShardPlan, data: bytes, codec: str) -> None:
        self.plan, self.data, self.codec = plan, data, codec

    def __getitem__(self, index: int) -> np.ndarray:
        piece = self.plan.pieces[index]
        return self.plan.decode(self.plan.cut(self.data, [piece], self.codec), [piece], self.codec)[index]

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.plan.pieces)))

    def __len__(self) -> int:
        return len(self.plan.pieces)


def per_update(counts: Counter, peers: Sequence[str], update_bytes: int) -> tuple[float, float]:
    """(mean, max) over ``peers`` of ``counts`` ÷ one update's bytes."""
    xs = [counts[p] / update_bytes for p in peers]
    return float(np.mean(xs)), float(max(xs))


def _flat(partials) -> list[float]:
    square, along, pair = partials
    return [square, *along] + ([] if pair is None else [pair])
