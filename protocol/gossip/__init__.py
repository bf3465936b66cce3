"""The gossip overlay's sans-IO core: router state machine, handshake, mesh, scores, caches, backoff.

`Router` takes events (connected, received frame, heartbeat tick with `now`, local publish, blob
outcomes) and returns actions (`Send`, `Fetch`, `Deliver`, `Disconnect`, `Dial`, `Reject`); the trio
host in `p2p/` executes them. Nothing here reads a clock or touches a socket.
"""

from protocol.gossip.actions import Action, Deliver, Dial, Disconnect, Fetch, Reject, Send
from protocol.gossip.backoff import DialSchedule, backoff_delay
from protocol.gossip.config import DEFAULT_PENALTIES, TOPIC, GossipConfig, ScoreConfig
from protocol.gossip.fetches import PendingBlob, PendingBlobs
from protocol.gossip.handshake import Handshake, State
from protocol.gossip.mcache import MessageCache
from protocol.gossip.mesh import MeshPlan, gossip_targets, plan_mesh
from protocol.gossip.peers import PeerTable
from protocol.gossip.router import AcceptHook, PeerState, Router
from protocol.gossip.score import PeerScores

__all__ = [
    "DEFAULT_PENALTIES",
    "TOPIC",
    "AcceptHook",
    "Action",
    "Deliver",
    "Dial",
    "DialSchedule",
    "Disconnect",
    "Fetch",
    "GossipConfig",
    "Handshake",
    "MeshPlan",
    "MessageCache",
    "PeerScores",
    "PendingBlob",
    "PendingBlobs",
    "PeerState",
    "PeerTable",
    "Reject",
    "Router",
    "ScoreConfig",
    "Send",
    "State",
    "backoff_delay",
    "gossip_targets",
    "plan_mesh",
]
