"""How a node's settings become its p2p host's configuration (`p2p.HostConfig`): addresses and ports, what it
advertises, the gossip timings, and the hook that checks a received update before it is forwarded."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import p2p
from node.outer.updates import accept_hook
from node.settings import NodeSettings
from protocol.admission import Admission
from protocol.compression import payload_size
from protocol.gossip import GossipConfig
from protocol.identity import Identity
from protocol.ledger import LedgerConfig
from protocol.messages import split_addr

__all__ = ["host_config"]

log = logging.getLogger("node.runtime")


def _host_port(address: str) -> tuple[str, int]:
    """HOST:PORT, where a port 0 (any free one) may come without split_addr's checks."""
    return split_addr(address) if not address.endswith(":0") else (address[:-2], 0)


def host_config(settings: NodeSettings, identity: Identity, data_dir: Path, shapes: Mapping[str, tuple[int, ...]],
                ledger: LedgerConfig, run_config: str, admission: Admission,
                seen: Callable[[bytes], bool] | None = None) -> p2p.HostConfig:
    """The host of a node with these settings, keeping its blobs under `data_dir` and accepting updates that
    fit `shapes` and `ledger` (`node.outer.updates.accept_hook`); an update `seen` knows is a duplicate (`known`)."""
    s = settings
    host, gossip_port = _host_port(s.listen)
    http_host, http_port = _host_port(s.http)
    if http_host.strip("[]") != host.strip("[]"):
        log.warning("--http host %s differs from --listen host %s: serving HTTP on %s", http_host, host, host)
    gossip = GossipConfig(run_id=s.run_id, heartbeat_s=s.heartbeat_s, heartbeat_timeout_s=s.heartbeat_timeout_s,
                          dial_backoff_s=min(0.5, s.heartbeat_s), dial_backoff_max_s=max(2.0, 10 * s.heartbeat_s))
    advertise_host, advertise_port = s.advertise_host_port()
    return p2p.HostConfig(identity=identity, run_id=s.run_id, data_dir=Path(data_dir),
                          listen_host=host.strip("[]"), gossip_port=gossip_port, http_port=http_port,
                          advertise_host=advertise_host, advertise_gossip_port=advertise_port,
                          advertise_http=s.advertise_http, bootstrap=s.peers, gossip=gossip,
                          accept=accept_hook(shapes, ledger), known=seen, run_config=run_config, admission=admission,
                          blob_spill_bytes=spill_bytes(shapes, s.compression), insecure=s.insecure,
                          reachability=s.reachability)


#: How many of its own updates' payloads a node's spill holds on a full disk, at the least (with the payloads
#: it fetches meanwhile): a round or two of a few peers' updates, and a 1B-parameter int4 model's 8 × 0.5 GB.
SPILL_UPDATES = 8


def spill_bytes(shapes: Mapping[str, tuple[int, ...]], compression: str) -> int:
    """The host's spill bound (`p2p.HostConfig.blob_spill_bytes`): its default, or room for `SPILL_UPDATES`
    payloads of this model when that is more."""
    return max(p2p.HostConfig.blob_spill_bytes, SPILL_UPDATES * payload_size(shapes, compression))
