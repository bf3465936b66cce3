"""A reduced run's slots closed over the node's real planes: one :class:`protocol.reduced.participant.ReducedNode`
driven by gossip (records in ``ReducedRecord`` messages, PROTOCOL.md §15a), HTTP fetches
(:mod:`node.reduced.plane`) and a wall-time slot clock.

The clock, per slot, on every node alike:

* **seal**: the sealer ``i`` places into the slot's sealer order seals once its candidates hold an update of
  every origin it expects, or ``patience + i·ξ`` after this node published (a seal that comes first is taken).
  It expects every eligible origin, but after two slots only those a seal of the last two held: an origin
  that crashed, or whose every header the run refuses, costs ``patience`` twice, not every slot (its next
  update, when one comes, is a candidate like any other and is sealed now or carried); an origin whose header
  of this slot was refused counts as heard;
* **pass over**: a shard whose expected reducer has not published ``ξ`` after it became expected is passed
  over (the next in the shard's order is expected);
* **finish**: once every shard stands, this node's checks are done and no fraud proof waits, and ``ξ`` more
  has passed with nothing new, the slot is finished and the node moves on.

Records of a later slot wait until the node gets there; records of a finished slot are dropped and counted.
A fetch that fails is asked again after ``RETRY_S``.

The participant's work (verifying and offering commitments, decoding fetched pieces, reducing, checking,
judging, stepping the replica) runs in a worker thread, never on the trio loop, so that heartbeats, gossip
and HTTP go on while a slot of a large model is reduced; every call into the participant, its slot state and
this driver's own lists of records goes through one lock (:meth:`SlotDriver._locked`), the fetch tasks'
included, so no two of them ever run at once. What this version does not do: a fraud proof that reaches
a node after it finished the slot is not judged there (so a late proof can split replicas: the finish waits
``ξ`` for that reason), and a node whose clock passed over a reducer refuses that reducer's late reduction
while a node that took it in time keeps it — honest reducers sign the same bytes, so replicas still agree.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable
from typing import TypeVar

import httpx
import trio

import p2p
from node.reduced.plane import FetchFailed, ReducedPlane
from protocol import wire
from protocol.errors import RemoteProtocolError
from protocol.messages import ReducedRecord, Signed, UpdateHeader
from protocol.reduced.participant import FetchPieces, NeedPartials, Publish, ReducedNode
from protocol.reduced.records import COMMITMENT, FRAUD, PARTIALS, REDUCTION, SEAL, Record, carried_record
from protocol.reduced.slot_state import SlotState

__all__ = ["SlotClock", "SlotDriver"]

log = logging.getLogger("node.reduced")

RETRY_S = 0.2
T = TypeVar("T")


class SlotClock:
    """The slot clock's two times: ``patience`` (how long a sealer waits for every origin's update after its own)
    and ``xi`` (the step between sealers, before a silent reducer is passed over, and before a slot is
    finished)."""

    def __init__(self, patience: float, xi: float) -> None:
        self.patience, self.xi = patience, xi


class SlotDriver:
    """Closes ``node``'s slots over ``host``; :meth:`run` reads the inbox, :meth:`close` closes one slot."""

    def __init__(self, host: p2p.Host, node: ReducedNode, clock: SlotClock,
                 now: Callable[[], float] = trio.current_time) -> None:
        self.host, self.node, self.clock, self.now = host, node, clock, now
        self.plane = ReducedPlane(host, node)
        self.later: list[Record] = []  # records of slots this node has not reached
        self.dropped: Counter[str] = Counter()  # records refused or too late, by why
        self._arrived: list[Signed] = []  # reduced messages from gossip, read by the next step
        self._changed = trio.Event()
        self._lock = trio.Lock()  # one call into the participant at a time, in a worker thread
        self._inflight: set[object] = set()
        self._since: dict[int, tuple[int, float]] = {}  # shard -> (place expected, since when)
        self._sealed_lately: deque[set[str]] = deque(maxlen=2)  # the origins of the last two slots' seals
        self._nursery: trio.Nursery | None = None
        self._client: httpx.AsyncClient | None = None  # one for every fetch, so links are kept

    async def _locked(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` in a worker thread, under the driver's lock (the participant is not thread-safe).
        A cancellation waits for the call to return, so the participant is never left half-way."""
        async with self._lock:
            return await trio.to_thread.run_sync(fn, *args)

    # -- what gossip brings --------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read the host's inbox and keep the fetches running, until cancelled."""
        async with self.host.http_client(timeout=30.0) as client, trio.open_nursery() as nursery:
            self._client, self._nursery = client, nursery
            task_status.started()
            async for delivery in self.host.inbox:
                if isinstance(delivery.body, ReducedRecord):
                    self._arrived.append(delivery.message)  # verified and offered by the next step
                    self._poke()

    def _refused(self, why: str) -> None:
        self.dropped[why] += 1
        log.warning("reduced record refused: %s", why)

    def _take(self, message: Signed) -> None:
        body = message.body
        try:
            record = carried_record(body.record_kind, body.fields, body.origin, body.record_signature)
            if record.kind == COMMITMENT:
                header = wire.decode(body.header)
                if not isinstance(header, Signed) or not isinstance(header.body, UpdateHeader) \
                        or header.origin != body.origin:
                    self._refused("a commitment whose header is not its origin's update header")
                    return
                self.node.offer(header, record)
            else:
                self.later.append(record)
        except RemoteProtocolError as e:
            self._refused(f"{body.record_kind} from {body.origin[:12]}: {e}")

    def _poke(self) -> None:
        self._changed.set()

    def _dispatch_ready(self) -> list[Record]:
        """Hand the node the records of the slot it is closing; keep later ones; drop older ones. Returns the
        reductions whose bytes are to be fetched."""
        s, keep, fetch = self.node._current(), [], []
        for record in self.later:
            slot = record.fields[0] if record.fields and isinstance(record.fields[0], int) else -1
            if slot > s.number or (slot == s.number and record.kind != SEAL and s.seal is None):
                keep.append(record)
            elif slot < s.number:
                self.dropped[f"{record.kind.decode()} of finished slot {slot}"] += 1
            elif record.kind == SEAL:
                try:
                    self.node.take_seal(record)
                except RemoteProtocolError as e:
                    self._refused(f"seal from {record.author[:12]}: {e}")
            elif record.kind == REDUCTION:
                fetch.append(record)
            elif record.kind == FRAUD:
                self.node.take_fraud(record)
            else:
                self._refused(f"{record.kind.decode()} is not gossiped")
        self.later = keep
        return fetch

    def _step(self, started: float, now: float) -> tuple[list[Record], list[FetchPieces | NeedPartials | Publish], bool]:
        """One step of the slot, in the worker thread: what gossip brought, the clock, everything the node can do.
        Returns the reductions to fetch, what the node asks for (its own pieces already taken), and whether the
        slot is applied with no fraud proof waiting."""
        arrived, self._arrived = self._arrived, []
        for message in arrived:
            self._take(message)
        fetch = self._dispatch_ready()
        seal = self._tick(started, now)
        out: list[FetchPieces | NeedPartials | Publish] = [] if seal is None else [seal]
        own = True
        while own:  # its own pieces are taken at once, and the node goes on with them
            own = False
            for action in self.node.advance():
                if isinstance(action, FetchPieces) and action.origin == self.node.peer:
                    self.node.take_pieces(action.update_id, action.pieces, *self.node.serve(action.update_id, action.pieces))
                    own = True
                else:
                    out.append(action)
        s = self.node._current()
        return fetch, out, s.applied and not s.frauds

    # -- fetches -------------------------------------------------------------------------------------
    def _start(self, key: object, fn, *args) -> None:
        if key in self._inflight or self._nursery is None:
            return
        self._inflight.add(key)
        self._nursery.start_soon(self._fetch, key, fn, args)

    async def _fetch(self, key: object, fn, args) -> None:
        try:
            await fn(self._client, *args)
        except FetchFailed as e:
            log.info("fetch %s failed (%s): asked again", key[0], e)
            await trio.sleep(RETRY_S)
            if isinstance(key, tuple) and key[0] == "pieces":  # the node asks for them again
                await self._locked(self.node._current().asked.difference_update, [(key[1], p.index) for p in key[2]])
            elif key[0] == "reduction":
                await self._locked(self.later.append, args[0])
        except RemoteProtocolError as e:
            self._refused(f"{key[0]}: {e}")
        finally:
            self._inflight.discard(key)
            self._poke()

    async def _fetch_pieces(self, client, action: FetchPieces) -> None:
        data, proof = await self.plane.fetch_pieces(client, action.origin, action.update_id, action.pieces)

        def take() -> None:
            s = self.node._current()
            if s.seal is not None and action.update_id in s.sealed:
                self.node.take_pieces(action.update_id, action.pieces, data, proof)

        await self._locked(take)

    async def _fetch_reduction(self, client, record: Record) -> None:
        limit = sum(n for _, n in self.node.plan.byte_ranges(self.node.plan.pieces, self.node.reduction_codec))
        data = await self.plane.fetch_reduction(client, record, limit)

        def take() -> None:
            if record.fields[0] == self.node._current().number:
                self.node.take_reduction(record, data)

        await self._locked(take)

    async def _fetch_partials(self, client, need: NeedPartials) -> None:
        def authors() -> list[str]:
            s = self.node._current()
            shards = {self.node.plan.shard_of(self.node.plan.pieces[i]) for i in need.pieces}
            return sorted({p for k in shards for p in s.roles[k][:s.at[k] + 1] if p != self.node.peer})

        found = False
        for author in await self._locked(authors):
            try:
                records = [r for r in await self.plane.fetch_partials(client, author, need.key) if r.fields[1] == need.name]
            except FetchFailed:
                continue
            for record in records:
                await self._locked(self.node.take_partials, record)
                found = True
        if not found:
            raise FetchFailed(f"no partials of {need.name} yet")

    # -- one slot ------------------------------------------------------------------------------------
    async def publish(self, data: bytes, base: int, tokens: int, steps: int) -> Signed:
        """Sign and gossip this node's update for the slot it is about to close."""
        signed, record = await self._locked(self.node.publish, data, base, tokens, steps)
        self.plane.own(signed.message_id, self.node.slot)
        self.host.publish_reduced(record.kind, record.body, record.signature, wire.encode(signed))
        return signed

    def _act(self, action: FetchPieces | NeedPartials | Publish) -> None:
        """What the node asked for, on the trio loop: fetches started, records kept and gossiped."""
        if isinstance(action, FetchPieces):
            self._start(("pieces", action.update_id, action.pieces), self._fetch_pieces, action)
        elif isinstance(action, NeedPartials):
            self._start(("partials", action.name, action.key), self._fetch_partials, action)
        elif action.record.kind == PARTIALS:
            self.plane.keep_partials(action.record)  # served to whoever asks
        else:
            if action.record.kind == REDUCTION:
                self.plane.keep_reduction(action.record, action.data)
            r = action.record
            self.host.publish_reduced(r.kind, r.body, r.signature)

    def _tick(self, started: float, now: float) -> Publish | None:
        """Seal or pass over what the clock says is due (in the worker thread: ``now`` is read on the loop);
        returns this node's seal when it sealed."""
        s = self.node._current()
        if s.seal is None:
            order = self.node.sealer_order()
            if self.node.peer in order and self.node.takes_roles:
                place = order.index(self.node.peer)
                if self._expected(s) <= self._heard(s) or now >= started + self.clock.patience + place * self.clock.xi:
                    return self.node.seal()
            return None
        for k in s.roles:
            if not self.node.awaits(k):
                self._since.pop(k, None)
                continue
            at, since = self._since.get(k, (None, now))
            if at != s.at[k]:
                self._since[k] = (s.at[k], now)
            elif now - since >= self.clock.xi and not self.node.holds(k):
                log.info("slot %d: shard %d's reducer %s is silent: passed over", s.number, k, s.roles[k][at][:12])
                self.node.pass_over(k)

    def _expected(self, s: SlotState) -> set[str]:
        """The origins a sealer of slot ``s`` waits for (the module docstring)."""
        if len(self._sealed_lately) < self._sealed_lately.maxlen:
            return set(s.eligible)
        return set(s.eligible) & set().union(*self._sealed_lately)

    def _heard(self, s: SlotState) -> set[str]:
        """The origins with a candidate here, or whose header of slot ``s`` the run refused."""
        refused = {o for o, at in self.node.refused_origins.items() if at >= s.number - 1}
        return {c.meta.origin for c in self.node.pool.values()} | refused

    def _waiting(self) -> str:
        s = self.node._current()
        if s.seal is None:
            return f"no seal ({len(self.node.pool)} candidates)"
        awaited = {k: s.roles[k][s.at[k]][:12] if s.at[k] < len(s.roles[k]) else "everyone"
                   for k in s.roles if self.node.awaits(k)}
        fetching = sorted(str(key[0]) for key in self._inflight if isinstance(key, tuple))
        return (f"shards awaited {awaited}, fetches in flight {fetching}, fraud proofs {sorted(s.frauds)}, "
                f"applied {s.applied}")

    async def close(self, *, timeout: float = 600.0, applied: trio.Event | None = None) -> SlotState:
        """Close the slot this node is in (after :meth:`publish`, or with none of its own): returns what it
        found, once the slot is finished here. ``applied`` is set once the replica has stepped with the slot's
        reduced shards (its ``θ`` is the slot's unless a fraud proof still replaces a shard)."""
        started, settled_at = self.now(), None
        with trio.move_on_after(timeout) as scope:
            while True:
                self._changed = trio.Event()
                fetch, actions, applied_here = await self._locked(self._step, started, self.now())
                for record in fetch:
                    self._start(("reduction", record.id), self._fetch_reduction, record)
                for action in actions:
                    self._act(action)
                if applied_here and applied is not None:
                    applied.set()
                if applied_here and not self._fetching():
                    settled_at = settled_at if settled_at is not None else self.now()
                    if self.now() - settled_at >= self.clock.xi:
                        break
                else:
                    settled_at = None
                with trio.move_on_after(min(RETRY_S, self.clock.xi / 4)):
                    await self._changed.wait()
        if scope.cancelled_caught:
            raise trio.TooSlowError(f"slot {self.node._current().number} not closed in {timeout:.0f} s: "
                                    f"{self._waiting()}")
        s = await self._locked(self._finish)
        self.plane.forget_before(s.number - 2)  # on the loop, beside the HTTP routes that read what it holds
        for reason in s.rejected:
            log.warning("slot %d: %s", s.number, reason)
        return s

    def _fetching(self) -> bool:
        """Whether pieces or partials are on their way (a check or a judgement may still need them)."""
        return any(isinstance(key, tuple) and key[0] in ("pieces", "partials") for key in self._inflight)

    def _finish(self) -> SlotState:
        s = self.node.finish()
        self._since.clear()
        self._sealed_lately.append({c.meta.origin for c in s.sealed.values()})
        return s
