"""Configuration of one p2p host (transport, limits, blob plane). Gossip parameters live in
`protocol.gossip.GossipConfig`; `HostConfig.gossip` carries them (default: derived from `run_id`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from protocol.admission import Admission
from protocol.errors import LocalProtocolError
from protocol.framing import MAX_FRAME_SIZE
from protocol.gossip import AcceptHook, GossipConfig
from protocol.identity import Identity


@dataclass(frozen=True)
class HostConfig:
    identity: Identity
    run_id: str
    data_dir: Path  # blobs are stored under data_dir/blobs
    listen_host: str = "127.0.0.1"
    gossip_port: int = 0  # 0: pick a free port
    http_port: int = 0
    advertise_host: str = ""  # the host peers should reach us at (default: `p2p.advertise`'s choice)
    advertise_gossip_port: int = 0  # the gossip port peers dial (0: the bound one; e.g. a NAT's forward)
    advertise_http: str = ""  # "host:port" of our HTTP plane for peers (default: advertised host, bound port)
    bootstrap: tuple[str, ...] = ()  # "host:port" gossip addresses
    gossip: GossipConfig | None = None
    max_frame_size: int = MAX_FRAME_SIZE
    max_connections: int = 64  # open TCP connections, handshaking ones included
    max_handshakes_per_host: int = 16  # inbound connections from one host not yet past the handshake
    # every HTTP request, all routes and clients together (`p2p.http`; "": no limit), beside the routes' own
    http_total: str = "1000/second"
    queue_frames: int = 1024  # per-connection send queue bounds
    queue_bytes: int = 8 << 20
    handshake_timeout_s: float = 5.0
    dial_timeout_s: float = 5.0
    fetch_timeout_s: float = 60.0  # per HTTP read/connect, not per blob
    blob_min_rate: float = 128 << 10  # bytes/s: a holder sending slower is dropped as `too_slow` (0: no floor)
    blob_grace_s: float = 10.0  # ... counted from this long after the request
    max_parallel_fetches: int = 4
    # a blob of at least `range_fetch_bytes` comes as `fetch_streams` byte ranges at once, over as many
    # connections and from up to as many of its holders (`BlobClient.fetch_ranges`): one TCP stream cannot fill
    # a link whose bandwidth × round trip exceeds its socket buffer (1: one stream per blob)
    fetch_streams: int = 4
    range_fetch_bytes: int = 16 << 20
    # a full disk under data_dir: blobs go to a spill directory in memory (`p2p.blobstore.default_spill_dir`)
    # up to this many bytes (0: none), and fetches wait from 1 s doubling to 30 s after a local write error
    blob_spill_bytes: int = 256 << 20
    blob_read_bytes: int = 1 << 20  # HTTP client read size
    blob_chunk_bytes: int = 4 << 20  # HTTP server body chunk
    goodbye_flush_s: float = 1.0  # how long close() waits for the goodbye to be written
    seed: int | None = None  # for the router's randomness (None: from the OS)
    clock: Callable[[], float] = time.time  # Unix time: seqnos and replay windows use it
    accept: AcceptHook | None = None  # application check on signed messages, raises RemoteProtocolError
    # message ids the application holds already (a node's ledger): duplicates before any fetch or forward
    known: Callable[[bytes], bool] | None = None
    agent: str = "diloco/0.1"
    run_config: str = ""  # protocol.runconfig text sent in the hello; a peer's must be equal
    admission: Admission | None = None  # protocol.admission; None becomes an open run's in __post_init__
    # cleartext on both planes (benchmarks, tests that read the bytes): TLS nodes refuse such a node, and it them
    insecure: bool = False
    # whether peers can dial us: "auto" (ask them, p2p.reach), or "public" / "private" as the operator knows
    reachability: str = "auto"

    def __post_init__(self) -> None:
        if self.gossip is not None and self.gossip.run_id != self.run_id:
            raise LocalProtocolError("gossip config is for another run id")
        if self.max_connections < 1 or self.queue_frames < 1 or self.queue_bytes < self.max_frame_size:
            raise LocalProtocolError("need max_connections >= 1, queue_frames >= 1, queue_bytes >= max_frame_size")
        if self.max_handshakes_per_host < 1:
            raise LocalProtocolError("need max_handshakes_per_host >= 1")
        if self.admission is None:
            object.__setattr__(self, "admission", Admission(self.run_id))
        elif self.admission.run_id != self.run_id:
            raise LocalProtocolError("admission is for another run id")

    @property
    def gossip_config(self) -> GossipConfig:
        return self.gossip if self.gossip is not None else GossipConfig(run_id=self.run_id)
