"""trio I/O around the sans-IO gossip router: TLS 1.3 links with libp2p certificates (`p2p.tls`), the
handshake, bounded send queues, reconnect with backoff, the HTTPS blob plane (hypercorn + httpx), nodes
nobody can dial (`p2p.outreach`), byte counters.

    async with trio.open_nursery() as nursery:
        host = await nursery.start(p2p.run, p2p.HostConfig(identity, run_id, data_dir, bootstrap=...))
        signed = await host.publish_update(payload, base_slot=..., publish_slot=..., tokens=...,
                                           inner_steps=..., codec=..., shapes=...)
        delivery = await host.inbox.receive()      # p2p.Delivery: verified header + stored blob path
        host.http.route("GET", "/status", handler)  # the node mounts its own endpoints
        async with host.http_client() as client:    # https to peers, with this host's certificate
            status = (await client.get(f"{host.peer_url(peer_http_addr)}/status")).json()
        await host.close("done")                   # signed goodbye

An operator's script reads nodes' HTTP planes with `p2p.httpclient.operator_client()`.
"""

from p2p.blobstore import BlobStore, blob_hex
from p2p.config import HostConfig
from p2p.counters import Counters, Kind, Traffic
from p2p.errors import TransportError
from p2p.host import Delivery, Host, PeerStatus, run
from p2p.http import HttpApp, Request, Response, serve_http

__all__ = [
    "BlobStore",
    "Counters",
    "Delivery",
    "Host",
    "HostConfig",
    "HttpApp",
    "Kind",
    "PeerStatus",
    "Request",
    "Response",
    "Traffic",
    "TransportError",
    "blob_hex",
    "run",
    "serve_http",
]
