"""The fork hint: `POST /compare` with `{"peer": "<peer id>"}` asks a node to compare its state with that
peer's before its next round (`node.sync.repair.pull_missing`, the fork choice).

A comparison that finds the two histories forked and our state heavier keeps ours; the peer, whose state
must give way, learns of the fork only when it compares with us itself. Nothing may make it do so for a
whole run: in one measured 100-round testnet, two nodes trained forked for six minutes while the heavier
one fetched the other's snapshot every round (communication fell from ~150x to 27x less than all-reduce).
So the heavier side sends this hint after such a comparison (`send_fork_hint`), and the lighter side then
compares, finds the peer heavier and adopts its state between rounds.

The hint carries no authority: it only puts a *connected* peer in the set of peers to compare with before
the next round (`Replica.forked_with`, a set: at most one comparison per peer and round, whoever asks and
however often), and the comparison verifies the peer's signed manifest and snapshot as always.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import httpx

from p2p import Host
from p2p.http import Request, Response

__all__ = ["COMPARE_PATH", "ForkHintRoute", "send_fork_hint"]

COMPARE_PATH = "/compare"

log = logging.getLogger("node.sync.forkhint")


class ForkHintRoute:
    """`POST /compare` (see the module docstring). `peers_to_compare()` is the replica's set of peers to
    compare with before the next round, or None while the node has no replica yet."""

    def __init__(self, host: Host, peers_to_compare: Callable[[], set[str] | None]) -> None:
        self.host, self.peers_to_compare = host, peers_to_compare

    def mount(self) -> None:
        self.host.http.route("POST", COMPARE_PATH, self.handle, per_client="10/second")

    async def handle(self, request: Request) -> Response:
        try:
            peer = request.json()["peer"]
            if not isinstance(peer, str):
                raise TypeError("peer must be a peer id string")
        except (ValueError, KeyError, TypeError) as exc:
            return Response.text(400, f"bad compare request (expected {{\"peer\": \"<peer id>\"}}): {exc}\n")
        if request.peer is not None and peer != request.peer:
            return Response.text(403, f"a hint names its sender: {peer} is not the certificate's {request.peer}\n")
        if peer not in self.host.connected_peers():
            return Response.text(404, f"{peer} is not a connected peer\n")
        queue = self.peers_to_compare()
        if queue is None:
            return Response.text(503, "not training yet\n")
        queue.add(peer)
        log.info("fork hint from %s: comparing with it before the next round", peer)
        return Response(202, json.dumps({"queued": peer}).encode(), {"content-type": "application/json"})


async def send_fork_hint(host: Host, http_addr: str, peer: str | None = None) -> bool:
    """Ask the node serving `http_addr` to compare with `peer` (us by default); True if it queued the comparison.
    Never raises (a hint that does not arrive is sent again after our next comparison with that peer)."""
    try:
        async with host.http_client(httpx.Timeout(5.0)) as client:
            response = await client.post(f"{host.peer_url(http_addr)}{COMPARE_PATH}", json={"peer": peer or host.peer_id})
    except httpx.HTTPError as exc:
        log.info("fork hint to %s not sent: %s", http_addr, exc)
        return False
    if response.status_code != 202:
        log.info("fork hint to %s refused: %d %s", http_addr, response.status_code, response.text.strip())
    return response.status_code == 202
