"""Chaos knobs of docs/node-contract.md, kept apart from the honest code paths.

- `Slowdown(FACTOR)`: every inner step takes FACTOR times as long: the worker thread waits
  (FACTOR − 1) × the step's own time after each step (an older hardware generation).
- `Misbehave`: `garbage` sends malformed frames to every connected peer (fresh TCP connections whose
  first frame is not msgpack: refused as `malformed` in the handshake); `bad-updates` also publishes,
  each round, an update that honest peers must refuse: alternately a payload of NaNs (`non_finite`,
  found after the download) and a header for a model of other shapes (`shape_mismatch`, refused
  before any download).
- `unproven` (`Misbehave`): after its honest update, the node publishes it once more as a new message without
  its membership (field 11): in a closed run every node must refuse it (`not_admitted`), whatever hellos it saw.
- `flood` (`Misbehave`): after its honest update, the node publishes `FLOOD` more updates for the same slot,
  each another random direction with the honest update's norm per tensor, claiming the honest round's
  work: validly signed, each its own blob. Honest peers keep at most `max_updates_per_origin` + 1 of one
  origin's updates in a slot and count none of an origin with more (`protocol.ledger.bound`), so the node
  counts for nothing and costs their disk a few payloads per slot, not `FLOOD`.
- `Poison(KIND)` (`--misbehave poison:KIND`): the node publishes, every round, a hostile update *instead
  of* its own: `negate` (−10⁴ × its Δ), `scale` (+10⁴ × its Δ), `random` (a random direction with 10⁴ ×
  its Δ's norm per tensor), each claiming the most work the run allows (a full round of full batches);
  `tokens`: −10⁴ × its Δ claiming 2⁴⁰ tokens (refused as `bad_claim`); `collude`: a random direction of
  norm 10⁴ per tensor drawn from a seed and the target slot alone, so that every node of this kind
  publishing into a slot publishes the same payload (colluding origins). Its own next round starts from its
  honest Δ (so it keeps producing honest-looking pseudo-gradients to corrupt). The honest nodes' defence
  is `protocol.ledger.bound`; `python -m testnet.bench hostile` measures it.
- `Tarpit` (`--misbehave tarpit`): the node trains and publishes honestly, but serves every blob one byte
  per 20 s (a `Content-Length` it never finishes): each download from it would hold one of the fetching
  peer's slots forever without the minimum rate of `p2p.blobfetch` and the per-holder limit of
  `protocol.gossip.fetches`.
- `ForgeState` (`--misbehave forge-state`): the node trains and publishes honestly, but after every round
  serves a forged state (`forged_replica`: its own with another chain, no window entries, 2⁴⁰ more
  finalized tokens per round so far, its window bottom's parameters scaled by −20) and sends every
  connected peer a fork hint. Every part of it checks out except the finalized totals, which are its word
  and win the fork choice; honest peers evaluate a forked state before adopting it
  (`node.outer.upkeep.BetweenRounds.vet`).
- `ChaosRoute`: `POST /chaos` `{"block_peers": [ids], "seconds": T}` drops the connections to those
  peers and refuses them for T seconds (an emulated partition); only mounted with `--allow-chaos`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import struct
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
import trio

from p2p import Host, Request, Response
from p2p.blobserve import BLOB_PREFIX
from p2p.errors import TransportError
from p2p.tls import connect as tls_connect
from protocol.compression.formats import as_codec_local
from protocol.compression.tensors import decode_tensors, encode_tensors
from protocol.errors import RemoteProtocolError
from protocol.ledger import Ledger
from protocol.messages import Signed, split_addr
from node.outer.replica import Replica
from node.outer.updates import Shapes, shapes_field
from node.settings import NodeSettings
from node.sync.forkhint import send_fork_hint
from node.sync.stateserve import StateServer

__all__ = ["ChaosRoute", "ForgeState", "Misbehave", "Poison", "Slowdown", "Tarpit", "forged_replica"]

log = logging.getLogger("node.chaos")


class Slowdown:
    """Called before every inner step (from `should_stop`, in the worker thread) and once after a round.

    The process's first step is not stretched: it includes compiling the step, which is not the
    emulated hardware's speed."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self._last: float | None = None
        self._measured = 0

    def _wait(self, now: float) -> None:
        if self._last is not None and self.factor > 1.0:
            self._measured += 1
            if self._measured > 1:
                time.sleep((self.factor - 1.0) * (now - self._last))

    def before_step(self) -> None:
        self._wait(time.perf_counter())
        self._last = time.perf_counter()

    def end_round(self) -> None:
        """The round's last step is not followed by a `before_step`: wait for it here."""
        self._wait(time.perf_counter())
        self._last = None


class Misbehave:
    """The `--misbehave` modes that act once per round (`act`), after the honest update."""

    MODES = ("garbage", "bad-updates", "flood", "unproven")
    FLOOD = 6  # extra updates per round in `flood` mode

    def __init__(self, mode: str, host: Host, shapes: Shapes, seed: int = 0) -> None:
        self.mode, self.host, self.shapes = mode, host, dict(shapes)
        self._count = 0
        self._rng = np.random.default_rng(seed)
        self.flooded: list[str] = []  # `flood`: the blobs of the extra updates, in publication order

    async def act(self, base_slot: int, publish_slot: int, honest: tuple[bytes, str, int, int]) -> list[Signed]:
        """After the round's honest update, published as (payload, codec, tokens, inner steps) = `honest`.
        Returns the valid updates it published (`flood`'s, fp32), which the node's own ledger should hold."""
        self._count += 1
        if self.mode == "garbage":
            await self._garbage()
        elif self.mode == "flood":
            return await self._flood(base_slot, publish_slot, honest)
        elif self.mode == "unproven":
            return [await self._unproven(base_slot, publish_slot, honest)]
        elif self._count % 2:
            await self._nan_update(base_slot, publish_slot)
        else:
            await self._wrong_shapes(base_slot, publish_slot)
        return []

    async def _garbage(self) -> None:
        for peer in self.host.peers():
            try:
                if self.host.tls is None:
                    host, port = split_addr(peer.gossip_addr)
                    stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
                else:  # inside TLS with our certificate: the frame, not the link, is what gets refused
                    stream = await tls_connect(peer.gossip_addr, self.host.tls.gossip_client, 5.0)
            except (ValueError, OSError, TransportError, RemoteProtocolError) as exc:
                log.info("chaos: cannot reach %s: %s", peer.peer_id, exc)
                continue
            body = b"\xc1" + os.urandom(31)  # 0xc1 is never valid msgpack
            try:
                await stream.send_all(struct.pack(">I", len(body)) + body)
                with trio.move_on_after(5):  # until the peer reads it and hangs up (closing first could cut its TLS)
                    while await stream.receive_some(1 << 16):
                        pass
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, TransportError):
                pass
            finally:
                await stream.aclose()
            log.info("chaos: sent a malformed frame to %s", peer.peer_id)

    async def _flood(self, base_slot: int, publish_slot: int, honest: tuple[bytes, str, int, int]) -> list[Signed]:
        payload, codec, tokens, steps = honest
        norms = {name: float(np.linalg.norm(x)) for name, x in decode_tensors(payload, codec, self.shapes).items()}
        published = []
        for _ in range(self.FLOOD):
            update = {}
            for name, norm in norms.items():
                r = self._rng.standard_normal(self.shapes[name]).astype(np.float32)
                update[name] = (r * np.float32(norm / max(float(np.linalg.norm(r)), 1e-30))).astype(np.float32)
            signed = await self.host.publish_update(encode_tensors(update, "fp32"), base_slot=base_slot,
                                                    publish_slot=publish_slot, tokens=tokens, inner_steps=steps,
                                                    codec="fp32", shapes=shapes_field(self.shapes))
            self.flooded.append(signed.body.payload_sha256.hex())
            published.append(signed)
        log.warning("chaos: published %d more updates for slot %d", self.FLOOD, publish_slot + 1)
        return published

    async def _unproven(self, base_slot: int, publish_slot: int, honest: tuple[bytes, str, int, int]) -> Signed:
        """The round's update once more, as a new message without its membership (field 11): a member of a
        closed run whose hello showed its membership, publishing what no rule may count."""
        payload, codec, tokens, steps = honest
        signed = await self.host.publish_update(payload, base_slot=base_slot, publish_slot=publish_slot, tokens=tokens,
                                                inner_steps=steps, codec=str(as_codec_local(codec)),
                                                shapes=shapes_field(self.shapes), membership=b"")
        log.warning("chaos: published update %s without its membership", signed.message_id.hex()[:16])
        return signed

    async def _nan_update(self, base_slot: int, publish_slot: int) -> None:
        count = sum(math.prod(s) for s in self.shapes.values())
        payload = np.full(count, np.nan, dtype="<f4").tobytes()
        signed = await self.host.publish_update(payload, base_slot=base_slot, publish_slot=publish_slot, tokens=1,
                                                inner_steps=1, codec="fp32", shapes=shapes_field(self.shapes))
        log.info("chaos: published a NaN update %s", signed.message_id.hex()[:16])

    async def _wrong_shapes(self, base_slot: int, publish_slot: int) -> None:
        name = sorted(self.shapes)[0]
        shapes = dict(self.shapes)
        shapes[name] = (*shapes[name], 2)
        payload = bytes(4 * sum(math.prod(s) for s in shapes.values()))
        signed = await self.host.publish_update(payload, base_slot=base_slot, publish_slot=publish_slot, tokens=1,
                                                inner_steps=1, codec="fp32", shapes=shapes_field(shapes))
        log.info("chaos: published an update of wrong shapes %s", signed.message_id.hex()[:16])


class Poison:
    """`--misbehave poison:KIND` (see the module docstring): `apply` turns the round's encoded update into the
    hostile one the node publishes instead."""

    KINDS = ("negate", "scale", "random", "tokens", "collude")
    FACTOR = 1e4
    TOKENS = 2**40
    COLLUDE_SEED = 45  # what colluders agree on beforehand

    def __init__(self, kind: str, shapes: Shapes, tokens_per_step: int, max_steps: int, seed: int = 0) -> None:
        if kind not in self.KINDS:
            raise ValueError(f"poison kind must be one of {self.KINDS}, got {kind!r}")
        self.kind, self.shapes = kind, dict(shapes)
        self.tokens_per_step, self.max_steps = tokens_per_step, max_steps
        self._rng = np.random.default_rng(seed)

    def apply(self, payload: bytes, codec: str, target_slot: int) -> tuple[bytes, str, int, int]:
        """(payload, codec, tokens, inner_steps) to publish into `target_slot` for the honest encoded `payload`."""
        honest = decode_tensors(payload, codec, self.shapes)
        hostile = {}
        colluding = np.random.default_rng([self.COLLUDE_SEED, target_slot])
        for name, x in honest.items():
            if self.kind == "collude":  # a function of the slot alone: every colluder publishes these bits
                r = colluding.standard_normal(x.shape).astype(np.float32)
                hostile[name] = (r * np.float32(self.FACTOR / max(float(np.linalg.norm(r)), 1e-30))).astype(np.float32)
            elif self.kind == "random":
                r = self._rng.standard_normal(x.shape).astype(np.float32)
                scale = self.FACTOR * float(np.linalg.norm(x)) / max(float(np.linalg.norm(r)), 1e-30)
                hostile[name] = (r * np.float32(scale)).astype(np.float32)
            else:
                sign = 1.0 if self.kind == "scale" else -1.0
                hostile[name] = (x * np.float32(sign * self.FACTOR)).astype(np.float32)
        tokens = self.TOKENS if self.kind == "tokens" else self.tokens_per_step * self.max_steps
        log.warning("chaos: publishing a poisoned update (%s ×%g, claiming %d tokens)", self.kind, self.FACTOR, tokens)
        return encode_tensors(hostile, "fp32"), "fp32", tokens, self.max_steps


class RoundChaos:
    """`--slowdown` and the `--misbehave` modes that touch a round, as the hooks the honest round calls
    (`node.outer.rounds.Rounds`): `slowdown` before every inner step and at the round's end,
    `publish_instead` (a poisoned update published in place of the round's), `after_publish` (a misbehaving
    node's extra messages). For an honest node each hook does nothing."""

    def __init__(self, settings: NodeSettings, host: Host, shapes: Shapes, loop: Any) -> None:
        """``loop``: the inner loop (`node.island.train.InnerLoop`), whose tokens per batch a poisoned claim reads."""
        mode = settings.misbehave or ""
        self.host, self.shapes = host, dict(shapes)
        self.slowdown = Slowdown(settings.slowdown)
        self.misbehave = Misbehave(mode, host, shapes) if mode in Misbehave.MODES else None
        self.poison = Poison(mode.removeprefix("poison:"), shapes, loop.tokens_per_batch,
                             settings.inner_steps) if mode.startswith("poison:") else None

    async def publish_instead(self, payload: bytes, codec: str, base_slot: int, publish_slot: int) -> Signed | None:
        """`--misbehave poison:KIND`: publish the hostile version of the round's encoded `payload` and return it
        (the round is then not published; its honest Δ is what the next round starts from); else None."""
        if self.poison is None:
            return None
        data, codec, tokens, steps = await trio.to_thread.run_sync(self.poison.apply, payload, codec, publish_slot + 1)
        return await self.host.publish_update(data, base_slot=base_slot, publish_slot=publish_slot, tokens=tokens,
                                              inner_steps=steps, codec=codec, shapes=shapes_field(self.shapes))

    async def after_publish(self, base_slot: int, publish_slot: int, honest: tuple[bytes, str, int, int]) -> list[Signed]:
        """After the round's update, published as (payload, codec, tokens, inner steps) = `honest`: what a
        misbehaving node does besides (`Misbehave.act`); the valid updates it published, which the node's own
        ledger holds as every peer's does."""
        return [] if self.misbehave is None else await self.misbehave.act(base_slot, publish_slot, honest)


async def forged_replica(replica: Replica, extra_tokens: int, scale: float = -20.0,
                         base: Mapping[str, np.ndarray] | None = None, slots_ahead: int = 0) -> Replica:
    """`replica`'s state, forged (see `ForgeState`): another chain, no window entries, `extra_tokens` more
    finalized tokens, and as its parameters `base` (default: its window bottom's) times `scale`; its slot
    `slots_ahead` past the replica's (a fresher claim, which a joiner prefers)."""
    snap, _, _ = await replica.snapshot()
    params = snap.base_params if base is None else base
    forged = dataclasses.replace(
        snap, slot=snap.slot + slots_ahead, base_slot=max(0, snap.slot + slots_ahead - replica.config.window),
        entries=(),
        chain=hashlib.sha256(b"a history nobody trained" + snap.chain).digest(),
        applied_tokens=snap.applied_tokens + extra_tokens,
        base_params={n: (np.float32(scale) * p).astype(np.float32) for n, p in params.items()})
    ledger = await trio.to_thread.run_sync(Ledger.from_snapshot, forged, replica.config)
    return Replica(ledger, forged.seen)


class ForgeState:
    """`--misbehave forge-state` (see the module docstring): `act` after every round."""

    TOKENS = 2**40  # more finalized tokens claimed per round so far: each forgery outweighs the last

    def __init__(self, host: Host, server: StateServer) -> None:
        self.host, self.server = host, server
        self._count = 0

    async def act(self, replica: Replica) -> None:
        self._count += 1
        self.server.serve(await forged_replica(replica, self.TOKENS * self._count))
        hinted = [p.peer_id for p in self.host.peers() if p.http_addr and await send_fork_hint(self.host, p.http_addr)]
        log.warning("chaos: serving a forged state claiming %d more tokens; fork hints sent to %d peers",
                    self.TOKENS * self._count, len(hinted))


class ChaosRoute:
    """`POST /chaos` (see the module docstring). Blocks use the router's ban list, so the host refuses
    the peers' connections and does not dial them until the block ends."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.blocked: dict[str, float] = {}  # peer -> Unix time the block ends

    def mount(self) -> None:
        self.host.http.route("POST", "/chaos", self.handle, per_client="10/second")

    async def handle(self, request: Request) -> Response:
        try:
            body = request.json() if request.body else {}
            peers, seconds = body["block_peers"], float(body["seconds"])
            if not isinstance(peers, list) or not all(isinstance(p, str) for p in peers) or not 0 < seconds <= 86400:
                raise ValueError("block_peers must be a list of peer ids and 0 < seconds <= 86400")
        except (ValueError, KeyError, TypeError) as exc:
            return Response.text(400, f"bad chaos request: {exc}\n")
        self.block(peers, seconds)
        answer = {"ok": True, "blocked": sorted(peers), "seconds": seconds}
        return Response(200, json.dumps(answer).encode(), {"content-type": "application/json"})

    def block(self, peers: list[str], seconds: float) -> None:
        now = self.host.now()
        self.host.block(peers, seconds)
        for peer in peers:
            self.blocked[peer] = now + seconds
            log.warning("chaos: blocking %s for %g s", peer, seconds)


class Tarpit:
    """`--misbehave tarpit` (see the module docstring): replaces the host's `/blobs/` route."""

    def __init__(self, host: Host, interval_s: float = 20.0) -> None:
        self.host, self.interval_s = host, interval_s

    def mount(self) -> None:
        self.host.http.route("GET", BLOB_PREFIX, self.handle)
        log.warning("chaos: serving blobs one byte per %g s", self.interval_s)

    async def handle(self, request: Request) -> Response:
        try:
            size = self.host.store.size(request.path.removeprefix(BLOB_PREFIX))
        except (KeyError, ValueError, OSError):
            return Response.text(404, "no such blob\n")
        return Response(200, self._trickle(size), {"content-type": "application/octet-stream"}, content_length=size)

    async def _trickle(self, size: int) -> AsyncIterator[bytes]:
        for _ in range(size):
            yield b"\0"
            await trio.sleep(self.interval_s)
