"""A host's part in taking nodes nobody can dial (PROTOCOL.md section 11): its own reachability, asked of its
peers (`p2p.reach`), its blobs pushed out when it cannot be dialled, and the pushes and dial-backs it serves
its peers (`p2p.blobpush`). One owner, wired to the host by four calls: `mount` (the routes), `tend` (each
heartbeat), `before_publish` (an update's blob, before its header) and `delivered` (a header's blob)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from p2p.blobpush import PushIntake, push_to_peers
from p2p.reach import DialBack, Prober, Reachability
from p2p.tls import connect
from p2p.transport import dial
from protocol.gossip import Reject

if TYPE_CHECKING:
    from p2p.host import Host

log = logging.getLogger("p2p.outreach")


class Outreach:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.reach = Reachability(host.config.reachability)
        self.prober = Prober(self.reach, self._peers_with_http, host.http_client)
        self.pushes = PushIntake(
            host.store, host.counters, known=lambda peer: peer in host.router.peers,
            stored=lambda name: host._execute(host.router.blob_stored(name, host.now())),
            penalize=lambda peer, reason, detail: host._execute([Reject(peer, reason, detail)]))
        self.pushed_to: list[str] = []  # the peers that took our last update's blob (when we cannot be dialled)

    def mount(self) -> None:
        DialBack(self._advertised_gossip, self._dial_back).mount(self.host.http)
        self.pushes.mount(self.host.http)

    def tend(self, nursery: trio.Nursery) -> None:
        """Once a heartbeat: ask peers not asked yet to dial us back; remove pushed blobs no header named."""
        now = trio.current_time()
        for peer, url in self.prober.due(now):
            nursery.start_soon(self.prober.ask, peer, url)
        for name in self.pushes.sweep(now):
            self.host.remove_blob(name)
            log.info("removed blob %s: pushed, and no header named it in time", name[:12])

    def delivered(self, blob: str) -> None:
        self.pushes.announced(blob)

    async def before_publish(self, name: str, size: int) -> None:
        """Our update's blob `name`: when no one can dial us, push it to peers first (peers we dialled first:
        reaching them is proven; then the others that advertise an HTTP plane)."""
        if self.reach.state != "private":
            return
        host = self.host
        states = sorted((s for s in host.router.peers.values() if s.info.http_addr), key=lambda s: not s.outbound)
        targets = [(s.info.peer_id, host.peer_url(s.info.http_addr)) for s in states]
        async with host.http_client(host.config.fetch_timeout_s) as client:
            self.pushed_to = await push_to_peers(client, targets, name, host.store.path(name), size)
        if self.pushed_to:
            log.info("pushed blob %s to %s (this node cannot be dialled)", name[:12],
                     ", ".join(p[:16] for p in self.pushed_to))
        else:
            log.warning("blob %s could not be pushed to any peer: its update reaches only peers that can dial us",
                        name[:12])

    @property
    def blobs_leave(self) -> str:
        """How our updates' payloads reach the peers (for /status)."""
        if self.reach.state != "private":
            return "served by this node's HTTP plane"
        return "pushed over connections this node opens, to " + (", ".join(self.pushed_to) or "(none yet)")

    def _peers_with_http(self) -> list[tuple[str, str]]:
        host = self.host
        return [(s.info.peer_id, host.peer_url(s.info.http_addr)) for s in host.router.peers.values() if s.info.http_addr]

    def _advertised_gossip(self, peer: str) -> str | None:
        state = self.host.router.peers.get(peer)
        return None if state is None else state.info.gossip_addr

    async def _dial_back(self, address: str, peer: str) -> None:
        host = self.host
        if host.tls is None:
            stream: trio.abc.Stream = await dial(address, host.config.dial_timeout_s)
        else:
            stream = await connect(address, host.tls.gossip_client, host.config.dial_timeout_s, expected_peer=peer)
        await stream.aclose()
