"""The gossip router: one sans-IO state machine per node. Events in, actions out ("decide, then do").

Events (methods; `now` is Unix time in seconds, never read from a clock here):

    connected(hello, conn, outbound, now, dialed,   a handshake completed on connection `conn`, with
              remote)                               `remote` ("host:port": caps and eviction groups)
    disconnected(peer, conn, now)                   that connection closed (stale conns ignored)
    dial_failed(address, now)                       a Dial action could not connect/handshake
    received(peer, conn, frame_body, now)           one frame from a connected peer
    stream_error(peer, conn, reason, now)           the byte stream broke (oversized, truncated)
    heartbeat(now)                                  every `heartbeat_s`
    publish(signed, now)                            a local message (its blob already stored)
    blob_stored(blob, now) / fetch_failed(...)      outcome of a Fetch, or a blob added locally

Rules (the whole state of the overlay lives here):

    state               changed by                       rule
    peers (connected)   connected / disconnected / hb    one connection per peer: a simultaneous dial
                                                          keeps the one dialled by the smaller peer id;
                                                          a newer connection from the same side (a
                                                          restart) or replacing a silent one wins;
                                                          banned peers refused; caps per address and
                                                          prefix, and a full table's eviction:
                                                          `protocol.gossip.places` (refused for room: a
                                                          peer_exchange, then Disconnect);
                                                          silent > heartbeat_timeout_s: disconnected
    mesh                heartbeat, Graft, Prune           plan_mesh keeps d_lo..d_hi, never score < 0
    pending fetches     header whose blob is not here    one Fetch at a time per blob; next holder
                                                          on failure; holders = peers that sent the
                                                          header or an IHAVE for it (they hold it)
    mcache              a message is held (blob stored)  pushed to mesh peers that lack it; IHAVE'd to
                                                          d_lazy others for gossip_windows heartbeats;
                                                          IWANT served for mcache_windows heartbeats,
                                                          update headers for history_s (forget_blob
                                                          ends it); a manifest is delivered at once but
                                                          held only once all its blobs are here
    anti-entropy        connected, anti_entropy_every    all held ids the peer may lack are IHAVE'd to
                                                          it (<= max_ihave_ids per IHAVE, one IWANT
                                                          each); REPLAYED answers to it not penalized
    iwant budgets       IWant / IHave, heartbeat          `protocol.gossip.iwant`: each id answered once
                                                          per peer per mcache window, iwant_budget ids
                                                          per heartbeat (past it: unanswered, `flood`);
                                                          we ask a peer <= iwant_budget // 2 per beat
    scores / bans       every Reject                     below disconnect: Disconnect + ban; a refused
                                                          control frame also disconnects (PROTOCOL.md 9)
    dials               heartbeat, PX, dial_failed       `protocol.gossip.dialer`: while < target_peers
                                                          or < min_outbound dialled by us

Seen-cache, replay window and every message check are `protocol.validation.Validator`'s. Two hooks of the
application: `accept(signed)` refuses a signed message it cannot use (raises RemoteProtocolError), and
`known(message_id)` names messages it holds already (a node's ledger after a restart or a state sync): those
are duplicates, neither fetched, forwarded nor asked for with IWANT.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from protocol import wire
from protocol.addresses import peer_address_problem
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.gossip.actions import Action, Deliver, Disconnect, Reject, Send
from protocol.gossip.backoff import DialSchedule
from protocol.gossip.config import GossipConfig
from protocol.gossip.dialer import Dialer
from protocol.gossip.fetches import PendingBlobs
from protocol.gossip.iwant import AskedIds, IWantBudget, WantPacer
from protocol.gossip.lazy import LazyPull
from protocol.gossip.manifests import WaitingManifests, holds_blobs
from protocol.gossip.mcache import MessageCache
from protocol.gossip.mesh import gossip_targets, plan_mesh
from protocol.gossip.peers import PeerState, PeerTable
from protocol.gossip.places import address_of, place_for
from protocol.gossip.score import PeerScores
from protocol.messages import (Goodbye, Graft, Heartbeat, Hello, IHave, IWant, PeerExchange, PeerInfo, Prune,
                               ReducedRecord, Signed, StateManifest, UpdateHeader)
from protocol.validation import Validator

AcceptHook = Callable[[Signed], None]  # raises RemoteProtocolError to refuse a message


class Router(LazyPull):
    def __init__(
        self,
        config: GossipConfig,
        local: PeerInfo,
        *,
        rng: random.Random,
        validator: Validator | None = None,
        bootstrap: Sequence[str] = (),
        accept: AcceptHook | None = None,
        known: Callable[[bytes], bool] | None = None,
    ) -> None:
        self.config = config
        self.local = local
        self.rng = rng
        self.validator = validator if validator is not None else Validator(config.run_id)
        if self.validator.run_id != config.run_id:
            raise LocalProtocolError("validator and config disagree on the run id")
        self.bootstrap = [a for a in bootstrap if a != local.gossip_addr]
        self.accept = accept
        self.known = known  # message ids the application holds already (a node's ledger): duplicates
        self.peers: dict[str, PeerState] = {}
        self.mesh: set[str] = set()
        self.table = PeerTable(local.peer_id)
        self.scores = PeerScores(config.score)
        self.mcache = MessageCache(config.mcache_windows, config.gossip_windows, config.history_heartbeats, config.history_max)
        self.dials = DialSchedule(config.dial_backoff_s, config.dial_backoff_max_s, rng)
        self.local_blobs: set[str] = set()
        self.pending = PendingBlobs(config.max_fetches_per_holder)
        self.dialer = Dialer(config, self.bootstrap, self.dials)
        self.asked = AskedIds(config.iwant_timeout_s)
        self.iwants = IWantBudget(config.iwant_budget, config.heartbeat_s, config.mcache_windows)
        self.wants = WantPacer(config.iwant_budget // 2, 4 * config.max_ihave_ids)  # waiting: ~64 KiB a peer
        self.manifests = WaitingManifests()  # delivered, blobs not all here: forwarded once they are
        self._heartbeats = 0
        self.progress = (0, 0, "")  # slot, round, state: sent in our heartbeats

    # ---- connections ------------------------------------------------------------------------------

    def connected(self, hello: Hello, conn: int, outbound: bool, now: float, dialed: str | None = None,
                  remote: str | None = None) -> list[Action]:
        """A handshake completed on `conn`, whose other end is `remote` ("host:port"; None: unknown, one group
        of its own). Returns actions; a Disconnect for `conn` means it was refused."""
        peer = hello.peer_id
        info = PeerInfo(peer, hello.gossip_addr, hello.http_addr)
        if dialed is not None:
            self.dialer.connected(dialed, peer)
        if self.scores.banned(peer, now):
            return [Reject(peer, Reason.PEER_BANNED, "banned"), Disconnect(peer, conn, "banned")]
        out: list[Action] = []
        old = self.peers.get(peer)
        if old is not None:
            if not self._new_wins(old, outbound, now):
                return [Disconnect(peer, conn, "duplicate connection")]
            out.append(Disconnect(peer, old.conn, "replaced by a newer connection"))
            self._drop(peer)
        address = address_of(remote)
        if old is None:
            full = len(self.peers) >= self.config.max_peers or (not outbound and self.dialer.inbound_full(self.peers))
            place = place_for(address, outbound, self.peers, self.config, self.scores.score, full=full)
            if not place.accepted:  # PROTOCOL.md section 7: told where else to go, then closed
                px = self.table.sample(self.config.px_peers, self.rng, {peer, self.local.peer_id})
                px_message = PeerExchange(self.config.run_id, px)
                return [Send(peer, px_message, conn=conn), Disconnect(peer, conn, place.refusal)]
            if place.evict is not None:
                evicted = self.peers[place.evict]
                self._drop(place.evict)
                out.append(Disconnect(place.evict, evicted.conn, f"evicted for a newcomer from {address or '?'}"))
        self.peers[peer] = PeerState(info, conn, outbound, now, now, address=address)
        self.table.connected(info, now)
        self.dials.succeeded(peer)
        exclude = {peer, self.local.peer_id}
        out.append(Send(peer, PeerExchange(self.config.run_id, self.table.sample(self.config.px_peers, self.rng, exclude))))
        if len(self.mesh) < self.config.d_lo and not self.scores.graylisted(peer):
            self.mesh.add(peer)
            out.append(Send(peer, Graft(self.config.run_id, self.config.topic)))
        return out + self._announce_held(peer)  # anti-entropy: a (re)joining peer learns what it missed

    def _announce_held(self, peer: str) -> list[Action]:
        """IHAVE to `peer` for every held message it is not known to have, in messages of at most
        `max_ihave_ids` ids (it answers each with one IWANT)."""
        cfg = self.config
        chunks = self.mcache.held_ids_chunked(peer, cfg.max_ihave_ids)
        return [Send(peer, IHave(cfg.run_id, cfg.topic, chunk)) for chunk in chunks]

    def _new_wins(self, old: PeerState, outbound: bool, now: float) -> bool:
        if old.outbound == outbound or old.last_recv < now - 2 * self.config.heartbeat_s:
            return True  # the peer restarted and came back, or the old connection went quiet
        dialer_new = self.local.peer_id if outbound else old.info.peer_id
        dialer_old = self.local.peer_id if old.outbound else old.info.peer_id
        return dialer_new < dialer_old

    def disconnected(self, peer: str, conn: int, now: float) -> list[Action]:
        state = self.peers.get(peer)
        if state is None or state.conn != conn:
            return []  # already dropped (replaced, timed out, refused)
        self._drop(peer)
        self.dials.failed(peer, now)  # do not redial a peer that just went away at once
        return []

    def dial_failed(self, address: str, now: float) -> list[Action]:
        self.dialer.failed(address, now)
        return []

    def _drop(self, peer: str) -> None:
        self.peers.pop(peer, None)
        self.mesh.discard(peer)
        self.mcache.forget_peer(peer)
        self.pending.drop_peer(peer)  # a running fetch from it stays the blob's until it reports its end
        self.wants.forget_peer(peer)

    # ---- frames -----------------------------------------------------------------------------------

    def received(self, peer: str, conn: int, data: bytes, now: float) -> list[Action]:
        state = self.peers.get(peer)
        if state is None or state.conn != conn:
            return []
        state.last_recv = now
        try:
            message = self.validator.validate(data, now)
            if isinstance(message, Signed) and self.known is not None and self.known(message.message_id):
                # e.g. a restarted node's ledger holds an update its peers announce again: not fetched again
                raise RemoteProtocolError(Reason.DUPLICATE, "held already")
            if isinstance(message, Signed) and self.accept is not None:
                self.accept(message)
        except RemoteProtocolError as exc:
            if exc.reason is Reason.DUPLICATE:
                return [Reject(peer, exc.reason, ""), *self._on_duplicate(peer, wire.decode(data), now)]
            if exc.reason is Reason.REPLAYED and (asked := wire.signed_message_id(data)) in self.asked:
                # we asked for it (another message under an accepted seqno, or one older than our window):
                self.validator.seen.add(asked, now)  # not the sender's fault; do not ask again
                return [Reject(peer, exc.reason, "asked for with IWANT")]
            out = self._refuse(peer, exc.reason, exc.detail, now)
            if peer in self.peers and wire.signed_message_id(data) is None:
                # PROTOCOL.md section 9: a broken control message means a broken or hostile peer
                self._drop(peer)
                out.append(Disconnect(peer, conn, f"bad control message: {exc.reason.value}"))
            return out
        handler = _HANDLERS.get(type(message))
        if handler is None:  # Hello / HelloProof after the handshake
            return self._refuse(peer, Reason.BAD_HANDSHAKE, f"{type(message).__name__} after the handshake", now)
        return handler(self, peer, message, now)

    def stream_error(self, peer: str, conn: int, reason: Reason, now: float) -> list[Action]:
        """The connection's byte stream is unusable (framing error): penalize and close it."""
        state = self.peers.get(peer)
        out = self._refuse(peer, reason, "stream error", now)
        if state is not None and state.conn == conn and peer in self.peers:
            self._drop(peer)
            out.append(Disconnect(peer, conn, f"stream error: {reason.value}"))
        return out

    def _refuse(self, peer: str, reason: Reason, detail: str, now: float) -> list[Action]:
        out: list[Action] = [Reject(peer, reason, detail)]
        if self.scores.penalize(peer, reason):
            self.scores.ban(peer, now)
            state = self.peers.get(peer)
            if state is not None:
                self._drop(peer)
                out.append(Disconnect(peer, state.conn, f"score {self.scores.score(peer):.0f}: banned"))
        return out

    def _on_duplicate(self, peer: str, message: object, now: float) -> list[Action]:
        assert isinstance(message, Signed)
        entry = self.mcache.get(message.message_id)
        if entry is not None:
            entry.known_by.add(peer)
        if isinstance(message.body, UpdateHeader):
            return list(self.pending.holder(message.body.payload_sha256.hex(), peer, self.peers))
        return []

    def _on_signed(self, peer: str, message: Signed, now: float) -> list[Action]:
        self.scores.reward(peer)
        body = message.body
        if isinstance(body, UpdateHeader):
            blob = body.payload_sha256.hex()
            if blob in self.local_blobs:
                return self._hold(message, blob, peer, {peer})
            self.pending.add(message, blob, body.payload_size, now)
            out: list[Action] = []
            for holder in [peer, *self.asked.take_announcers(message.message_id)]:
                out += self.pending.holder(blob, holder, self.peers)
            return out
        if isinstance(body, Goodbye):
            self.table.left(body.origin)
            out = self._hold(message, None, peer, {peer}, flood=True)
            state = self.peers.get(body.origin)
            if state is not None:
                self._drop(body.origin)
                out.append(Disconnect(body.origin, state.conn, "goodbye"))
            return out
        if isinstance(body, StateManifest):
            return self._on_manifest(peer, message)
        if isinstance(body, ReducedRecord):  # delivered and forwarded; what it needs fetched, the node fetches
            if not self.config.reduced_records:
                return self._refuse(peer, Reason.BAD_STATE, "a reduced record in a run that is not reduced", now)
            return self._hold(message, None, peer, {peer})
        raise TypeError(f"the router has no rule for signed {type(body).__name__} messages")

    def _on_manifest(self, peer: str, message: Signed) -> list[Action]:
        """Deliver a manifest at once (a joiner fetches its blobs from the sender or the origin), but
        forward and announce it only while holding every blob it lists (PROTOCOL.md section 10)."""
        if holds_blobs(message, self.local_blobs):
            return self._hold(message, None, peer, {peer})
        self.manifests.add(message, peer)
        return [Deliver(message, None, peer)]

    def _hold(
        self, message: Signed, blob: str | None, source: str, known_by: set[str], *, flood: bool = False,
        deliver: bool = True,
    ) -> list[Action]:
        """We hold `message` (and its blobs): deliver it, cache it, push it to mesh peers lacking it."""
        entry = self.mcache.put(message, known_by, keep=blob is not None)  # update headers: long history
        local = source == self.local.peer_id
        out: list[Action] = [Deliver(message, blob, source)] if deliver and not local else []
        targets = self.peers if flood or not self.mesh else self.mesh
        for p in sorted(targets):
            if p not in entry.known_by:
                entry.known_by.add(p)
                out.append(Send(p, message))
        return out

    def _on_heartbeat(self, peer: str, message: Heartbeat, now: float) -> list[Action]:
        self.peers[peer].heartbeat = message
        return []

    def _on_peer_exchange(self, peer: str, message: PeerExchange, now: float) -> list[Action]:
        return self._learn(peer, message.peers, now) + self._plan_dials(now)

    def _learn(self, peer: str, infos: tuple[PeerInfo, ...], now: float) -> list[Action]:
        """Hearsay addresses into the table; one that cannot reach its peer (`protocol.addresses`) is
        counted (`bad_address`, no penalty: the sender may only be passing it on) and skipped."""
        own = frozenset((self.local.gossip_addr, self.local.http_addr))
        out: list[Action] = []
        for info in infos:
            problem = peer_address_problem(info.gossip_addr, info.http_addr, own=own)
            if problem is not None and info.peer_id != self.local.peer_id:
                out.append(Reject(peer, Reason.BAD_ADDRESS, f"address of {info.peer_id}: {problem}"))
            elif problem is None:
                self.table.learn(info, now)
        return out

    def _on_graft(self, peer: str, message: Graft, now: float) -> list[Action]:
        if message.topic == self.config.topic and not self.scores.graylisted(peer) and len(self.mesh) < self.config.d_hi:
            self.mesh.add(peer)
            return []
        self.mesh.discard(peer)
        return [Send(peer, self._prune_message(peer))]

    def _on_prune(self, peer: str, message: Prune, now: float) -> list[Action]:
        self.mesh.discard(peer)
        self.peers[peer].graft_after = now + message.backoff_s
        return self._learn(peer, message.peers, now) + self._plan_dials(now)

    def _prune_message(self, peer: str) -> Prune:
        px = self.table.sample(self.config.px_peers, self.rng, {peer, self.local.peer_id})
        return Prune(self.config.run_id, self.config.topic, self.config.prune_backoff_s, px)

    # ---- blobs ------------------------------------------------------------------------------------

    def blob_stored(self, blob: str, now: float, source: str | None = None) -> list[Action]:
        """`blob` is now in the local store (fetched from `source`, or added locally)."""
        self.local_blobs.add(blob)
        out: list[Action] = []
        for manifest, sender in self.manifests.ready(self.local_blobs):  # now we can serve it: forward it on
            out += self._hold(manifest, None, sender, {sender}, deliver=False)
        pending, started = self.pending.done(blob, self.peers)
        if pending is None:
            return out
        origin = source if source is not None else pending.holders[0] if pending.holders else self.local.peer_id
        return out + started + self._hold(pending.message, blob, origin, set(pending.holders))

    def fetch_failed(self, blob: str, peer: str, reason: Reason | None, detail: str, now: float, *,
                     gone: bool = False) -> list[Action]:
        """A Fetch from `peer` failed: `reason` if it sent wrong bytes or sent too slowly (penalized), None
        if it could not be reached, or (`gone`) said it does not hold the blob (not penalized: its clean-up
        removed it, e.g. an update its ledger left out). The next holder is tried; when none is left the blob
        waits for new holders (headers or IHAVEs), and unreachable holders are retried on the next heartbeat;
        the others are not asked for that blob again."""
        out = self._refuse(peer, reason, detail, now) if reason is not None else []
        slow_until = now + self.config.slow_holder_s if reason is Reason.TOO_SLOW else None
        return out + self.pending.failed(blob, peer, reason is not None or gone, self.peers, slow_until)

    def forget_blob(self, blob: str) -> None:
        """The application removed `blob` from the store: its headers are no longer announced or served."""
        self.local_blobs.discard(blob)
        self.mcache.forget_payload(blob)

    # ---- local ------------------------------------------------------------------------------------

    def publish(self, message: Signed, now: float) -> list[Action]:
        """Send our own signed message. An update's blob must be stored first (`blob_stored`)."""
        if message.origin != self.local.peer_id:
            raise LocalProtocolError("publish only messages this node signed")
        blob = None
        if isinstance(message.body, UpdateHeader):
            blob = message.body.payload_sha256.hex()
            if blob not in self.local_blobs:
                raise LocalProtocolError(f"store blob {blob[:12]} before publishing its header")
        if isinstance(message.body, StateManifest) and not holds_blobs(message, self.local_blobs):
            raise LocalProtocolError("store every blob of a manifest before publishing it")
        self.validator.mark_seen(message, now)
        return self._hold(message, blob, self.local.peer_id, set(), flood=isinstance(message.body, Goodbye))

    # ---- heartbeat --------------------------------------------------------------------------------

    def heartbeat(self, now: float) -> list[Action]:
        cfg = self.config
        self._heartbeats += 1
        out: list[Action] = []
        for peer, state in sorted(self.peers.items()):
            if state.last_recv < now - cfg.heartbeat_timeout_s:
                self._drop(peer)
                self.dials.failed(peer, now)
                out.append(Disconnect(peer, state.conn, f"silent for {now - state.last_recv:.1f} s"))
        self.scores.decay(set(self.peers))
        plan = plan_mesh(
            self.mesh,
            self.peers,
            self.scores.score,
            lambda p: self.peers[p].graft_after <= now and not self.scores.graylisted(p),
            d=cfg.d,
            d_lo=cfg.d_lo,
            d_hi=cfg.d_hi,
            d_score=cfg.d_score,
            rng=self.rng,
        )
        for peer in plan.prune:
            self.mesh.discard(peer)
            out.append(Send(peer, self._prune_message(peer)))
        for peer in plan.graft:
            self.mesh.add(peer)
            out.append(Send(peer, Graft(cfg.run_id, cfg.topic)))
        out += self._gossip()
        slot, round_, status = self.progress
        for peer, state in sorted(self.peers.items()):
            state.sent_heartbeats += 1
            out.append(Send(peer, Heartbeat(cfg.run_id, slot, round_, status, state.sent_heartbeats)))
        if self._heartbeats % cfg.px_every == 0:
            for peer in gossip_targets(self.peers, (), lambda p: True, cfg.d_lazy, self.rng):
                px = self.table.sample(cfg.px_peers, self.rng, {peer, self.local.peer_id})
                out.append(Send(peer, PeerExchange(cfg.run_id, px)))
        if cfg.anti_entropy_every and self._heartbeats % cfg.anti_entropy_every == 0:
            for peer in gossip_targets(self.peers, (), lambda p: not self.scores.graylisted(p), 1, self.rng):
                out += self._announce_held(peer)
        self.mcache.shift()
        self.iwants.shift()
        self.asked.expire(now)
        for peer, ids in self.wants.due():  # wanted ids that had no room in the last heartbeat
            if peer in self.peers and not self.scores.graylisted(peer):
                out += self._want(peer, ids, now)
        out += self.pending.retry(now, self.validator.seen.ttl_s, self.peers)
        return out + self._plan_dials(now)

    def _plan_dials(self, now: float) -> list[Action]:
        return list(self.dialer.plan(self.peers, self.table, lambda peer: self.scores.banned(peer, now), now))

    def set_progress(self, slot: int, round_: int, state: str) -> None:
        """What our heartbeats tell peers about this node (slot, round, a short state word)."""
        self.progress = (slot, round_, state)


_HANDLERS: dict[type, Callable[[Router, str, object, float], list[Action]]] = {
    Signed: Router._on_signed,
    Heartbeat: Router._on_heartbeat,
    PeerExchange: Router._on_peer_exchange,
    Graft: Router._on_graft,
    Prune: Router._on_prune,
    IHave: Router._on_ihave,
    IWant: Router._on_iwant,
}

__all__ = ["AcceptHook", "PeerState", "Router"]
