"""Whether peers can dial this node, asked of the peers (PROTOCOL.md section 11, as libp2p's AutoNAT does).

A node behind a NAT (a cluster's private network, a cloud VM without a public port, a workstation at home) can
dial out but cannot be dialled; its advertised addresses reach nobody. It finds that out by asking connected
peers to dial it back: `POST /dialback` on a peer's HTTP plane, over TLS, so the peer knows who asks (the
certificate's peer id) and dials exactly the gossip address that peer advertised in its hello, expecting its
peer id in the TLS handshake, and answers `{"reachable": bool, "address": ..., "detail": ...}`.

- `DialBack`: the route. Only a connected peer is dialled back, only at its own advertised address, within
  `timeout_s`, at most `per_client` times a second: no one can make a node dial a third party.
- `Reachability`: the owner of what this node knows of itself: "unknown" until a peer answers; "public" once any
  peer dialled it back; "private" when every peer that answered (at least `quorum`) could not. `forced` (the
  `--reachability` flag) fixes the answer without asking.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import trio

from p2p.errors import TransportError
from p2p.http import HttpApp, Request, Response
from protocol.errors import RemoteProtocolError

log = logging.getLogger("p2p.reach")

DIALBACK_PATH = "/dialback"


@dataclass
class DialBack:
    """`POST /dialback`: dial the asking peer's advertised gossip address. `address_of(peer)` is that address
    of a connected peer (None if it is not connected); `dial(address, peer)` connects (TLS, expecting `peer`)
    and closes, raising TransportError or RemoteProtocolError."""

    address_of: Callable[[str], str | None]
    dial: Callable[[str, str], Awaitable[None]]
    timeout_s: float = 5.0

    def mount(self, app: HttpApp) -> None:
        app.route("POST", DIALBACK_PATH, self.handle, per_client="2/second", total="50/second")

    async def handle(self, request: Request) -> Response:
        peer = request.peer or request.headers.get("x-diloco-peer", "")
        address = self.address_of(peer) if peer else None
        if address is None:
            return Response.text(403, "only a connected peer is dialled back\n")
        if not address:
            return _answer(False, "", "no gossip address advertised")
        try:
            with trio.fail_after(self.timeout_s):
                await self.dial(address, peer)
        except trio.TooSlowError:
            return _answer(False, address, f"no answer within {self.timeout_s:g} s")
        except (TransportError, RemoteProtocolError) as exc:
            return _answer(False, address, str(exc))
        return _answer(True, address, "dialled back")


def _answer(reachable: bool, address: str, detail: str) -> Response:
    body = json.dumps({"reachable": reachable, "address": address, "detail": detail[:300]}).encode()
    return Response(200, body, {"content-type": "application/json"})


@dataclass
class Reachability:
    """What this node knows of whether peers can dial it (module doc)."""

    forced: str = "auto"  # "auto", or "public" / "private" as the operator said
    quorum: int = 1  # peers that must answer "no" (and none "yes") for "private"
    answers: dict[str, tuple[bool, str]] = field(default_factory=dict)  # peer -> (dialled back, detail)

    def __post_init__(self) -> None:
        if self.forced not in ("auto", "public", "private"):
            raise ValueError(f"reachability is auto, public or private, not {self.forced!r}")

    @property
    def state(self) -> str:
        if self.forced != "auto":
            return self.forced
        if any(ok for ok, _ in self.answers.values()):
            return "public"
        return "private" if len(self.answers) >= self.quorum else "unknown"

    def heard(self, peer: str, reachable: bool, detail: str) -> None:
        before = self.state
        self.answers[peer] = (reachable, detail)
        if self.state != before:
            log.log(logging.WARNING if self.state == "private" else logging.INFO,
                    "reachability: %s (%s says: %s)%s", self.state, peer, detail,
                    "; this node's blobs are pushed to peers it dials (p2p.blobpush)" if self.state == "private" else "")

    def describe(self) -> dict[str, object]:
        return {"state": self.state, "forced": self.forced != "auto",
                "answers": {peer: {"reachable": ok, "detail": detail} for peer, (ok, detail) in self.answers.items()}}


async def ask(client: httpx.AsyncClient, base_url: str) -> tuple[bool, str] | None:
    """One peer's answer to our dial-back request (None: no answer)."""
    try:
        response = await client.post(f"{base_url}{DIALBACK_PATH}")
        if response.status_code != 200:
            return None
        answer = response.json()
        return bool(answer["reachable"]), str(answer.get("detail", ""))
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


class Prober:
    """Asks connected peers to dial this node back (`Reachability.heard`): each newly connected peer once while
    fewer than `wanted` have answered, and every peer again after `every_s`. `peers()` lists (peer id, base URL
    of its HTTP plane) of connected peers; `client()` opens an HTTP client with our certificate."""

    def __init__(self, reach: Reachability, peers: Callable[[], list[tuple[str, str]]],
                 client: Callable[[], httpx.AsyncClient], *, wanted: int = 3, every_s: float = 600.0) -> None:
        self.reach, self.peers, self.client = reach, peers, client
        self.wanted, self.every_s = wanted, every_s
        self._asked: dict[str, float] = {}  # peer -> when last asked (trio time)

    def due(self, now: float) -> list[tuple[str, str]]:
        """The peers to ask now (marked asked)."""
        if self.reach.forced != "auto":
            return []
        out = []
        for peer, url in self.peers():
            last = self._asked.get(peer)
            fresh = last is None and len(self.reach.answers) + len(out) < self.wanted
            if fresh or (last is not None and now - last > self.every_s):
                self._asked[peer] = now
                out.append((peer, url))
        return out

    async def ask(self, peer: str, url: str) -> None:
        async with self.client() as client:
            answer = await ask(client, url)
        if answer is None:
            self._asked.pop(peer, None)  # no answer (a peer of an older version, or busy): asked again later
            return
        self.reach.heard(peer, *answer)
