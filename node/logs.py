"""One log line per event, each carrying the peer id of the node that logged it.

The runtime sets `PEER` when it starts; trio copies context variables into the tasks it spawns and into
worker threads, so every line a node's code (or its host's) logs names that node, even with several
nodes in one process (tests).
"""

from __future__ import annotations

import contextvars
import logging
import sys

__all__ = ["PEER", "PeerFilter", "setup_logging"]

PEER: contextvars.ContextVar[str] = contextvars.ContextVar("diloco_peer", default="-")
FORMAT = "%(asctime)s %(levelname)-7s %(peer)s %(name)s: %(message)s"


class PeerFilter(logging.Filter):
    """Adds `record.peer` (the current node's peer id)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.peer = PEER.get()
        return True


def setup_logging(level: str) -> None:
    """Log to stderr (stdout carries only the LISTENING and STOPPED lines)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(PeerFilter())
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "hypercorn.error", "jax._src"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
