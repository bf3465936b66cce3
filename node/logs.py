"""One log line per event, each carrying the peer id of the node that logged it.

The runtime sets `PEER` when it starts; trio copies context variables into the tasks it spawns and into
worker threads, so every line a node's code (or its host's) logs names that node, even with several
nodes in one process (tests). Human lines show the peer id's first 16 characters (as the messages do);
JSON lines (`--log-format json`, one object per line: `time`, `level`, `peer` in full, `logger`,
`message`, and `exc_info` when there is a traceback) are for log collectors. `--log-file FILE` appends
the same lines to FILE as well as stderr.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from pathlib import Path

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

__all__ = ["PEER", "PeerFilter", "setup_logging"]

PEER: contextvars.ContextVar[str] = contextvars.ContextVar("diloco_peer", default="-")
FORMAT = "%(asctime)s %(levelname)-7s %(peer_short)s %(name)s: %(message)s"
JSON_FIELDS = "%(asctime)s %(levelname)s %(peer)s %(name)s %(message)s"


class PeerFilter(logging.Filter):
    """Adds `record.peer` (the current node's peer id) and `record.peer_short` (its first 16 characters)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.peer = PEER.get()
        record.peer_short = record.peer[:16]
        return True


def setup_logging(level: str, *, log_format: str = "text", log_file: Path | None = None) -> None:
    """Log to stderr (stdout carries only the LISTENING and STOPPED lines) and, with `log_file`, to that
    file too; `log_format` "text" (human) or "json" (one object per line). Raises OSError when the file
    cannot be opened."""
    if log_format == "json":
        formatter: logging.Formatter = JsonFormatter(
            JSON_FIELDS, rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            reserved_attrs=[*RESERVED_ATTRS, "peer_short"])
    else:
        formatter = logging.Formatter(FORMAT)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file is not None:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    for handler in handlers:
        handler.addFilter(PeerFilter())
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "hypercorn.error", "jax._src"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
