"""One node's part in a reduced run, sans-IO: what it signs, what it needs fetched, and what it decides from
what it was given (docs/design.md, "Reduced slots"; PROTOCOL.md §15).

A driver (``testnet.reduced_net`` among in-process nodes; the node's gossip and blob planes next) brings what
the network delivers and does what the node asks. A :class:`ReducedNode` knows only what it was handed:

* :meth:`~ReducedNode.publish` signs this node's update (header and commitment) for gossip, and
  :meth:`~ReducedNode.serve` answers a ranged fetch of it with the range's Merkle proof;
* :meth:`~ReducedNode.offer` takes a peer's header and commitment: a candidate of the next slot until a seal
  holds it (so an update the seal missed is carried, one slot staler);
* :meth:`~ReducedNode.seal` signs the slot's seal when the driver's slot clock says it is this node's turn;
  :meth:`~ReducedNode.take_seal` reads one;
* :meth:`~ReducedNode.advance` does all the node can with what it holds and returns what it needs done:
  :class:`FetchPieces` (pieces of an update from its origin, answered by :meth:`~ReducedNode.take_pieces`),
  :class:`NeedPartials` (screen partials of other aggregators, answered by
  :meth:`~ReducedNode.take_partials`) and :class:`Publish` (a record to gossip, with the bytes of a reduction
  its peers fetch);
* :meth:`~ReducedNode.take_reduction` and :meth:`~ReducedNode.take_fraud` read what gossip brings;
* :meth:`~ReducedNode.pass_over` is the clock's verdict that a shard's reducer did not publish in time: every
  node then expects the next one in the shard's order (and, past the last, reduces the shard itself).

Every decision (the seal that holds, the reduction that stands, a refusal past the norm bound, a fraud
proof's judgement, who is excluded) reads only signed records, the bytes their hashes pin and the run's
configuration, so nodes handed the same messages hold the same bits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, MutableMapping, Sequence

import numpy as np

from protocol import signing
from protocol.compression import decode_tensors
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.identity import Identity
from protocol.ledger.bound import check_claim
from protocol.ledger.config import LedgerConfig, UpdateMeta
from protocol.ledger.proof import header_shapes
from protocol.messages import Signed, UpdateHeader
from protocol.reduced.bounds import check_reduction, reduction_bounds
from protocol.reduced.fraud import first_difference, judge, make_fraud
from protocol.reduced.plan import ModelPiece, ShardPlan
from protocol.reduced.records import FRAUD, PARTIALS, REDUCTION, Record, floats, pack_floats, sign_record
from protocol.reduced.replica import ReducedReplica
from protocol.reduced.roles import reducers, sealers
from protocol.reduced.seal import Seal, make_seal, winning_seal
from protocol.reduced.slot import Commitment, PartialScreen, PiecePartials, commit, header_entry, piece_leaves, piece_partials, \
    pieces_proof, reduce_pieces, slot_terms
from protocol.reduced.slot_state import (FetchPieces, MissingPartials, NeedPartials, PieceValues, Publish, SlotState,
                                         flat_partials, piece_runs, screened_key)

__all__ = ["FetchPieces", "NeedPartials", "Publish", "ReducedNode"]


class ReducedNode:
    """One node of a reduced run among ``peers`` (peer ids, itself included), with the model of ``plan``.

    ``params``: the initial parameters, for a node that keeps a replica (None: it takes every part of the
    protocol and keeps no state). ``takes_roles``: False for a node that seals, reduces and checks nothing
    (the others pass it over after their clock's ``ξ``). ``verdicts``: a cache of the norm bound's verdict
    by reduction id (the verdict is a function of the bytes the id pins), which nodes in one process may
    share."""

    def __init__(self, identity: Identity, peers: Iterable[str], plan: ShardPlan, config: LedgerConfig, *,
                 run_id: str, codec: str = "int4", reduction_codec: str | None = None, cap: int | None = None,
                 q: float = 0.5, params: Mapping[str, np.ndarray] | None = None, seed: int = 0,
                 takes_roles: bool = True, verdicts: MutableMapping[bytes, str | None] | None = None) -> None:
        self.identity, self.peer = identity, identity.peer_id
        self.peers = sorted(set(peers) | {self.peer})
        self.plan, self.config, self.run_id, self.codec = plan, config, run_id, codec
        self.reduction_codec = reduction_codec or codec
        self.cap, self.q, self.takes_roles = cap, q, takes_roles
        self.replica = None if params is None else ReducedReplica(params, config, plan, self.reduction_codec)
        self.excluded: set[str] = set()
        self.pool: dict[bytes, Commitment] = {}  # candidates no seal holds yet
        self.refused_ids: set[bytes] = set()  # updates whose signed header the run refuses (a seal of one is too)
        self.refused_origins: dict[str, int] = {}  # origin -> the slot its last refused header was published at
        self.own: dict[bytes, tuple[bytes, list[bytes]]] = {}  # this node's payloads and their Merkle leaves
        self.slot = 0  # the last slot closed
        self.open: SlotState | None = None
        self.rng = np.random.default_rng([seed, int.from_bytes(hashlib.sha256(self.peer.encode()).digest()[:4], "big")])
        self.verdicts = {} if verdicts is None else verdicts
        self._seqno = 0

    # -- contributing ------------------------------------------------------------------------------
    def publish(self, data: bytes, base: int, tokens: int, steps: int) -> tuple[Signed, Record]:
        """Sign this node's update of payload ``data`` (the run's codec) for gossip: header and commitment."""
        self._seqno += 1
        header = UpdateHeader(self.run_id, self.peer, self._seqno, base, self.slot, tokens, steps, self.codec,
                              header_shapes(self.plan.shapes), hashlib.sha256(data).digest(), len(data))
        signed = signing.sign(self.identity, header)
        meta = UpdateMeta(signed.message_id, self.peer, base, self.slot, tokens, steps)
        record = commit(self.identity, meta, self.plan, data, self.codec,
                        decode_tensors(data, self.codec, self.plan.shapes))
        self.own[meta.update_id] = (data, piece_leaves(self.plan, data, self.codec))
        self.offer(signed, record)
        return signed, record

    def serve(self, update_id: bytes, pieces: Sequence[ModelPiece]) -> tuple[bytes, list[bytes]]:
        """The bytes of ``pieces`` (contiguous) of this node's update ``update_id``, and their Merkle proof."""
        data, leaves = self.own[update_id]
        return self.plan.cut(data, pieces, self.codec), pieces_proof(leaves, pieces)

    def offer(self, signed: Signed, record: Record) -> None:
        """A peer's update (header and commitment) from gossip: ``RemoteProtocolError`` if it does not verify
        or does not fit the run; otherwise a candidate of the next slot no seal has closed."""
        signing.verify(signed)
        h = signed.body
        if not isinstance(h, UpdateHeader) or h.run_id != self.run_id or h.codec != self.codec \
                or h.shapes != header_shapes(self.plan.shapes):
            raise RemoteProtocolError(Reason.BAD_SCHEMA, "an update header of another run, codec or model")
        if h.origin not in self.peers:  # the run's roster contributes; a closed run's roster is its members
            raise RemoteProtocolError(Reason.NOT_ADMITTED, f"{h.origin[:12]} is not in the run's roster")
        meta = UpdateMeta(signed.message_id, h.origin, h.base_slot, h.publish_slot, h.tokens, h.inner_steps)
        try:
            check_claim(meta, self.config)  # a claim past the run's work would outweigh the honest updates
        except RemoteProtocolError:
            self.refused_ids.add(meta.update_id)
            self.refused_origins[h.origin] = max(h.publish_slot, self.refused_origins.get(h.origin, -1))
            self._retry_unheard()  # a seal that waited for this header is refused with it
            raise
        self.pool.setdefault(meta.update_id, Commitment(record, meta, self.plan))
        self._retry_unheard()

    def _retry_unheard(self) -> None:
        """Take the seal that came before some of its headers, now that one came (it waits again for the rest)."""
        if self.open is None or self.open.unheard is None:
            return
        unheard, self.open.unheard = self.open.unheard, None
        try:
            self.take_seal(unheard)
        except RemoteProtocolError as e:
            self.open.rejected.append(f"seal from {unheard.author[:12]}: {e}")

    # -- the seal ----------------------------------------------------------------------------------
    def _current(self) -> SlotState:
        if self.open is None:
            eligible = sorted(set(self.peers) - self.excluded)
            self.open = SlotState(self.slot + 1, eligible, screen=PartialScreen(self._gather))
        return self.open

    def sealer_order(self) -> list[str]:
        """Who may seal the slot being closed, first the one whose seal wins."""
        return sealers(self._current().number, self._current().eligible)

    def seal(self) -> Publish:
        """This node's seal of the slot being closed, over every candidate it holds (at most the cap)."""
        s = self._current()
        record = make_seal(self.identity, s.number, list(self.pool), self.cap)
        self.take_seal(record)
        return Publish(record)

    def take_seal(self, record: Record) -> None:
        """A seal of the slot being closed. The one of the earlier sealer in the slot's order wins."""
        s = self._current()
        seal = Seal.read(record, s.eligible, self.cap)
        if seal.slot != s.number:
            raise RemoteProtocolError(Reason.BAD_STATE, f"a seal of slot {seal.slot} while closing {s.number}")
        if s.seal is not None:
            if winning_seal([s.seal, seal], s.eligible) is s.seal:
                return
            if s.standing:
                raise LocalProtocolError("a winning seal after reductions stood: the slot must be replayed")
        if self.refused_ids.intersection(seal.ids):
            raise RemoteProtocolError(Reason.BAD_STATE, "a seal of an update whose header the run refuses")
        if any(i not in self.pool and i not in s.sealed for i in seal.ids):
            s.unheard = record  # gossip brought the seal before some of its headers: taken when they come
            return
        s.unheard = None
        for i in s.sealed:  # a seal that lost: its updates are candidates again
            self.pool.setdefault(i, s.sealed[i])
        s.seal, s.sealed = seal, {i: self.pool.pop(i) for i in seal.ids}
        s.entries = [header_entry(c, self.plan, s.number, self.config) for c in s.sealed.values()]
        s.bounds = reduction_bounds(s.entries, self.config)
        s.roles = {k: reducers(s.number, k, s.eligible) for k in range(self.plan.shards)}
        s.at = dict.fromkeys(s.roles, 0)

    # -- the network's answers ---------------------------------------------------------------------
    def take_pieces(self, update_id: bytes, pieces: Sequence[ModelPiece], data: bytes, proof: Sequence[bytes]) -> None:
        """The bytes of ``pieces`` of sealed update ``update_id`` with their Merkle proof, as fetched."""
        s = self._current()
        parts = self.plan.split(data, pieces, self.codec)
        s.sealed[update_id].check_pieces(pieces[0].index, parts, proof)
        held = s.raw.setdefault(update_id, PieceValues(self.plan, self.codec))
        for p, part in zip(pieces, parts, strict=True):
            held.encoded[p.index] = part

    def take_partials(self, record: Record) -> None:
        """Another aggregator's screen partials (``[slot, tensor, set key, piece indices, floats]``)."""
        s = self._current()
        try:
            if record.kind != PARTIALS or len(record.fields) != 5:
                raise RemoteProtocolError(Reason.BAD_SCHEMA, "not a partials record")
            slot, name, key, indices, packed = record.fields
            if slot != s.number or not isinstance(indices, list) or not isinstance(packed, bytes):
                raise RemoteProtocolError(Reason.BAD_SCHEMA, "partials of another slot, or malformed")
            pieces = [self.plan.pieces[i] for i in indices if isinstance(i, int) and 0 <= i < len(self.plan.pieces)]
            if len(pieces) != len(indices) or any(p.name != name for p in pieces) or len(packed) % (8 * len(pieces) or 1):
                raise RemoteProtocolError(Reason.BAD_SCHEMA, "partials of pieces outside their tensor")
            if any(record.author not in s.roles[k][:s.at[k] + 1] for k in {self.plan.shard_of(p) for p in pieces}):
                raise RemoteProtocolError(Reason.BAD_STATE, "partials by a node that does not reduce those pieces")
            record.verify()
        except RemoteProtocolError as e:
            s.rejected.append(f"partials from {record.author[:12]}: {e}")
            return
        values, each = floats(packed), len(packed) // 8 // len(pieces)
        known = s.partials.setdefault((name, key), {})
        for j, p in enumerate(pieces):
            known.setdefault(p.index, values[j * each:(j + 1) * each])

    def take_reduction(self, record: Record, data: bytes) -> None:
        """A reduction of the slot being closed, and its bytes. It stands if its author is the shard's expected
        reducer, its bytes are the ones it signed and its pieces keep to the headers' norm bound; past the
        bound it is refused by name, its author excluded, and the next reducer expected."""
        s = self._current()
        try:
            if record.kind != REDUCTION or len(record.fields) != 5 or s.seal is None:
                raise RemoteProtocolError(Reason.BAD_SCHEMA, "not a reduction, or no seal yet")
            slot, k, place, seal_id, digest = record.fields
            if slot != s.number or seal_id != s.seal.record.id or k not in s.roles \
                    or not isinstance(place, int) or s.roles[k][place:place + 1] != [record.author]:
                raise RemoteProtocolError(Reason.BAD_STATE, "a reduction of another slot, seal or shard, or by "
                                                            "another than the place it names")
            at = s.at[k]
            if record.author in s.roles[k][at + 1:]:  # this node has not yet passed over or judged the ones before
                s.early.append((record, data))
                return
            # A reducer this node's clock passed over, late: taken while the shard has nothing standing, so that
            # this node holds what the nodes that took it in time hold (its successor, if honest, signs the same
            # bytes; a lie is the checker's to find, as it is for them).
            late = place < at and k in s.passed and k not in s.replacing and k not in s.standing \
                and (k, record.author) not in s.refused
            if not late and (at >= len(s.roles[k]) or record.author != s.roles[k][at]
                             or s.standing.get(k, (None,))[0] == at):
                raise RemoteProtocolError(Reason.BAD_STATE, f"shard {k} expects no reduction by {record.author[:12]}")
            record.verify()
            if hashlib.sha256(data).digest() != digest:
                raise RemoteProtocolError(Reason.BAD_STATE, "a reduction's bytes are not the ones its author signed")
        except RemoteProtocolError as e:
            s.rejected.append(f"reduction from {record.author[:12]}: {e}")
            return
        verdict = self.verdicts.get(record.id, False)
        if verdict is False:
            try:
                pieces = self.plan.shard(k)
                check_reduction(self.plan.decode(data, pieces, self.reduction_codec), pieces, s.bounds,
                                self.reduction_codec)
                verdict = None
            except RemoteProtocolError as e:
                verdict = str(e)
            self.verdicts[record.id] = verdict
        if verdict is not None:  # refused by name, on every node
            s.refused.append((k, record.author))
            s.rejected.append(f"reduction of shard {k} from {record.author[:12]}: {verdict}")
            self.excluded.add(record.author)
            s.at[k] = at if late else at + 1
            return
        if late:
            s.at[k] = at = place
        self._stand(k, at, data, record)

    def take_fraud(self, record: Record) -> None:
        """A fraud proof against a standing reduction, by its checker: judged in :meth:`advance`."""
        s = self._current()
        try:
            if record.kind != FRAUD or len(record.fields) != 4:
                raise RemoteProtocolError(Reason.BAD_SCHEMA, "not a fraud proof")
            slot, k, reduction_id, index = record.fields
            standing = s.standing.get(k) if slot == s.number else None
            if standing is None or standing[2] is None or standing[2].id != reduction_id:
                if slot == s.number and record.author in s.roles.get(k, ()):  # against one not yet here
                    s.early.append((record, None))
                    return
                raise RemoteProtocolError(Reason.BAD_STATE, "a fraud proof against no standing reduction")
            at = standing[0]
            if at + 1 >= len(s.roles[k]) or record.author != s.roles[k][at + 1]:
                raise RemoteProtocolError(Reason.BAD_STATE, "a fraud proof by another than the shard's checker")
            pieces = self.plan.shard(k)
            if not isinstance(index, int) or not pieces[0].index <= index <= pieces[-1].index:
                raise RemoteProtocolError(Reason.BAD_SCHEMA, "a fraud proof names a piece outside its shard")
            record.verify()
        except RemoteProtocolError as e:
            s.rejected.append(f"fraud proof from {record.author[:12]}: {e}")
            return
        s.frauds.setdefault(k, (record, self.plan.pieces[index]))

    def pass_over(self, k: int) -> None:
        """Shard ``k``'s expected reducer did not publish in time: expect the next in the shard's order."""
        s = self._current()
        if s.seal is None or s.standing.get(k, (None,))[0] == s.at[k] or s.at[k] >= len(s.roles[k]):
            return
        s.at[k] += 1
        s.passed.add(k)

    # -- what the node does ------------------------------------------------------------------------
    def holds(self, k: int) -> bool:
        """Whether this node reduces shard ``k`` now: its expected reducer, or everyone once nobody is left."""
        s = self._current()
        at = s.at[k]
        return at == len(s.roles[k]) or (self.takes_roles and s.roles[k][at] == self.peer)

    def awaits(self, k: int) -> bool:
        """Whether shard ``k`` has no standing reduction by its expected reducer here."""
        s = self._current()
        return s.seal is not None and s.standing.get(k, (None,))[0] != s.at[k]

    def advance(self) -> list[FetchPieces | NeedPartials | Publish]:
        """Everything this node can do now (until what it decides leaves nothing more to do with what it
        holds), and what it needs for the rest."""
        s, out = self.open, []
        while s is not None and s.seal is not None:
            before = (tuple(s.at.values()), len(s.standing), len(s.frauds), len(s.checked), len(s.early), s.applied)
            out += self._step()
            if (tuple(s.at.values()), len(s.standing), len(s.frauds), len(s.checked), len(s.early), s.applied) == before:
                break
        return out

    def _step(self) -> list[FetchPieces | NeedPartials | Publish]:
        s = self._current()
        early, s.early = s.early, []
        for record, data in early:
            self.take_fraud(record) if data is None else self.take_reduction(record, data)
        out: list[FetchPieces | NeedPartials | Publish] = []
        held = [k for k in s.roles if self.holds(k) and self.awaits(k)]
        for k in held:
            out += self._wants("fraud proofs" if k in s.replacing else "raw shards", self.plan.shard(k))
        if not out:  # what was asked may still be on its way
            for k in held:
                if self._holds_raw(self.plan.shard(k)):
                    out += self._reduce(k)
        for k in list(s.standing):
            out += self._check(k)
        for k in list(s.frauds):
            out += self._judge(k)
        if not s.applied and len(s.standing) == self.plan.shards:
            if self.replica is not None:
                self.replica.apply(s.number, {k: data for k, (_, data, _) in s.standing.items()})
            s.applied = True
        out += s.outbox
        s.outbox = []
        return out

    def finish(self) -> SlotState:
        """Close the slot: this node steps on to the next. Returns what it found."""
        s = self._current()
        if not s.applied:
            raise LocalProtocolError(f"slot {s.number} has shards with no standing reduction")
        s.rejected += [f"{r.kind.decode()} from {r.author[:12]}: never expected in slot {s.number}" for r, _ in s.early]
        self.slot, self.open = s.number, None
        return s

    def _wants(self, kind: str, pieces: Sequence[ModelPiece]) -> list[FetchPieces]:
        """Fetches of the ``pieces`` of every sealed update this node neither holds nor has asked for."""
        s, out = self._current(), []
        for i, c in s.sealed.items():
            have = s.raw.get(i, {})
            missing = [p for p in pieces if p.index not in have and (i, p.index) not in s.asked]
            for run in piece_runs(missing):
                s.asked.update((i, p.index) for p in run)
                out.append(FetchPieces(kind, c.meta.origin, i, tuple(run)))
        return out

    def _holds_raw(self, pieces: Sequence[ModelPiece]) -> bool:
        s = self._current()
        return all(p.index in s.raw.get(i, {}) for i in s.sealed for p in pieces)

    def _terms(self, names: Iterable[str]) -> tuple[dict[str, dict[bytes, float]], dict[str, float]]:
        """The coefficients and scales of tensors ``names`` (``MissingPartials`` while partials are missing)."""
        s = self._current()
        for name in sorted(set(names)):
            if name not in s.terms:
                s.terms[name] = slot_terms(s.entries, name, self.config, s.screen)
        return {n: s.terms[n][0] for n in s.terms}, {n: s.terms[n][1] for n in s.terms}

    def _gather(self, name: str, live: list[tuple[bytes, float]]) -> list[PiecePartials]:
        """The partials of every piece of tensor ``name`` for the set ``live``: this node's own (published when
        it is the pieces' reducer), and the other reducers' it was handed."""
        s, key = self._current(), screened_key(live)
        pieces = [p for p in self.plan.pieces if p.name == name]
        known = s.partials.setdefault((name, key), {})
        mine = [p for p in pieces if p.index not in known and self.holds(self.plan.shard_of(p))
                and self._holds_raw([p])]
        if mine:
            computed = piece_partials(s.raw, live, mine)
            flat = {i: flat_partials(v) for i, v in computed.items()}
            known.update(flat)
            shared = [p for p in mine if s.at[self.plan.shard_of(p)] < len(s.roles[self.plan.shard_of(p)])]
            if shared:
                s.outbox.append(Publish(sign_record(self.identity, PARTIALS, [
                    s.number, name, key, [p.index for p in shared],
                    pack_floats([x for p in shared for x in flat[p.index]])])))
        lacking = tuple(p.index for p in pieces if p.index not in known)
        if lacking:
            raise MissingPartials(NeedPartials(name, key, lacking))
        s.screened.add((name, key))
        n = len(live)
        out = []
        for p in pieces:
            v = known[p.index]
            if len(v) != 1 + n + (n == 2):
                raise RemoteProtocolError(Reason.BAD_SCHEMA, f"partials of piece {p.index} for another set's size")
            out.append((v[0], list(v[1:1 + n]), v[1 + n] if n == 2 else None))
        return out

    def _reduction_values(self, k: int, coefficients, scales) -> dict[int, np.ndarray]:
        """Shard ``k``'s ``g``, piece by piece (a hostile subclass in the testnet changes it)."""
        return reduce_pieces(self._current().raw, self.plan.shard(k), coefficients, scales)

    def _reduce(self, k: int) -> list[Publish | NeedPartials]:
        s, pieces = self._current(), self.plan.shard(k)
        try:
            coefficients, scales = self._terms(p.name for p in pieces)
        except MissingPartials as m:
            return [m.need]
        data = self.plan.encode(self._reduction_values(k, coefficients, scales), pieces, self.reduction_codec)
        if s.at[k] == len(s.roles[k]):  # nobody left: every node's own reduction, from the raw pieces
            self._stand(k, s.at[k], data, None)
            return []
        record = sign_record(self.identity, REDUCTION, [s.number, k, s.at[k], s.seal.record.id,
                                                        hashlib.sha256(data).digest()])
        self.take_reduction(record, data)
        return [Publish(record, data, "fraud proofs" if k in s.replacing else "reduced shards")]

    def _stand(self, k: int, at: int, data: bytes, record: Record | None) -> None:
        s = self._current()
        s.standing[k] = (at, data, record)
        if s.applied and self.replica is not None:  # a replacement: the window replayed
            self.replica.replace(s.number, k, data)

    def _difference(self, k: int, drawn: Sequence[ModelPiece], mine: bytes, theirs: bytes) -> int | None:
        """The first drawn piece of shard ``k`` whose bytes differ (a hostile subclass accuses regardless)."""
        return first_difference(self.plan, drawn, mine, theirs, self.reduction_codec)

    def _check(self, k: int) -> list[FetchPieces | NeedPartials | Publish]:
        """This node's check of shard ``k``'s standing reduction, if it is its checker: the pieces its own coin
        draws, re-reduced; a fraud proof naming the first that differs."""
        s = self._current()
        at, data, reduction = s.standing[k]
        if reduction is None or at + 1 >= len(s.roles[k]) or s.roles[k][at + 1] != self.peer \
                or not self.takes_roles or (k, at) in s.checked or k in s.frauds:
            return []
        pieces = self.plan.shard(k)
        drawn = s.draws.setdefault((k, at), self._draw(pieces))
        wants = self._wants("checks", drawn)
        if wants or not self._holds_raw(drawn):
            return wants
        try:
            coefficients, scales = self._terms(p.name for p in drawn)
        except MissingPartials as m:
            return [m.need]
        s.checked.add((k, at))
        mine = self.plan.encode(reduce_pieces(s.raw, drawn, coefficients, scales), drawn, self.reduction_codec)
        index = self._difference(k, drawn, mine, self.plan.within(data, pieces, drawn, self.reduction_codec))
        if index is None:
            return []
        fraud = make_fraud(self.identity, s.number, k, reduction, index)
        self.take_fraud(fraud)
        return [Publish(fraud)]

    def _draw(self, pieces: list[ModelPiece]) -> list[ModelPiece]:
        """``q·m`` of the ``m`` pieces on average (⌊q·m⌋ or one more), which ones by this node's own coin."""
        whole, part = divmod(self.q * len(pieces), 1.0)
        count = min(len(pieces), int(whole) + (self.rng.random() < part))
        return [pieces[i] for i in sorted(self.rng.choice(len(pieces), size=count, replace=False).tolist())]

    def _judge(self, k: int) -> list[FetchPieces | NeedPartials]:
        """This node's judgement of the fraud proof against shard ``k`` (:mod:`protocol.reduced.fraud`), from
        the named piece of every sealed update."""
        s = self._current()
        record, piece = s.frauds[k]
        wants = self._wants("fraud proofs", [piece])
        if wants or not self._holds_raw([piece]):
            return wants
        try:
            coefficients, scales = self._terms([piece.name])
        except MissingPartials as m:
            return [m.need]
        del s.frauds[k]
        at, data, _ = s.standing[k]
        accused = self.plan.within(data, self.plan.shard(k), [piece], self.reduction_codec)
        if judge(self.plan, piece, accused, s.raw, coefficients, scales, self.reduction_codec):
            s.caught.append((k, s.roles[k][at]))
            self.excluded.add(s.roles[k][at])
            s.at[k] = at + 1
            s.replacing.add(k)
        else:
            s.false_accusations.append((k, record.author))
            self.excluded.add(record.author)
        return []

    def digest(self) -> bytes | None:
        return None if self.replica is None else self.replica.digest()
