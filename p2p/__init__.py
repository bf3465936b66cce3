"""trio I/O around the sans-IO gossip router: TCP transport and handshake, bounded send queues,
reconnect with backoff, the HTTP blob plane (hypercorn + httpx), byte counters.

    async with trio.open_nursery() as nursery:
        host = await nursery.start(p2p.run, p2p.HostConfig(identity, run_id, data_dir, bootstrap=...))
        signed = await host.publish_update(payload, base_slot=..., publish_slot=..., tokens=...,
                                           inner_steps=..., codec=..., shapes=...)
        delivery = await host.inbox.receive()      # p2p.Delivery: verified header + stored blob path
        host.http.route("GET", "/status", handler)  # the node mounts its own endpoints
        await host.close("done")                   # signed goodbye
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
