"""A run's configuration: every setting all nodes of a run must agree on, in one canonical text.

A node sends its run configuration in its `hello` (PROTOCOL.md §4, §7); the other side compares it with
its own and refuses the connection on any difference (`config_mismatch`), naming the fields that differ.
So a peer started with another inner learning rate, window, outer learning rate or model is kept out at
its first frame, instead of surfacing later as refused updates and states, or not at all (a different
inner learning rate passes every check an update can get, and corrupts the run).

Encoding (canonical, so equal configurations are equal strings): one line ``name=value`` per setting,
sorted by name (bytewise), each ending in ``\\n``; a name is a dotted ASCII word (``inner.lr``); a value is
its JSON text: an integer in decimal, a float as the shortest decimal that reads back as the same binary64
(with a ``.`` or an exponent), ``true``/``false``, ``null``, a string or an array of strings JSON-quoted
with no spaces. The run configuration's hash is the hex SHA-256 of that text (UTF-8), shown in `/status`
and logs. An empty text is a peer that declares none (a bare p2p host, e.g. in tests); it matches only
another empty one.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping

from protocol.errors import Reason, RemoteProtocolError

__all__ = ["MAX_CONFIG_BYTES", "check_config", "config_differences", "config_hash", "decode_config", "encode_config"]

MAX_CONFIG_BYTES = 8192  # the `hello` field's bound
Value = int | float | str | bool | None | tuple[str, ...] | list[str]
_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")


def encode_config(config: Mapping[str, Value]) -> str:
    """The canonical text of ``config``."""
    lines = []
    for name in sorted(config):
        if not _NAME.match(name):
            raise ValueError(f"run configuration name {name!r} is not a dotted lowercase word")
        value = config[name]
        if isinstance(value, float) and value != value:
            raise ValueError(f"{name}: NaN is not a configuration value")
        lines.append(f"{name}={json.dumps(list(value) if isinstance(value, tuple) else value, separators=(',', ':'))}\n")
    text = "".join(lines)
    if len(text.encode()) > MAX_CONFIG_BYTES:
        raise ValueError(f"run configuration is {len(text.encode())} bytes, more than {MAX_CONFIG_BYTES}")
    return text


def config_hash(text: str) -> str:
    """Hex SHA-256 of an encoded run configuration."""
    return hashlib.sha256(text.encode()).hexdigest()


def _fields(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if not sep or name in out:
            raise RemoteProtocolError(Reason.BAD_SCHEMA, f"run configuration line {line[:60]!r} is malformed")
        out[name] = value
    return out


def decode_config(text: str) -> dict[str, object]:
    """The settings of an encoded configuration, their JSON values decoded (`encode_config`'s inverse).
    Raises ``RemoteProtocolError(BAD_SCHEMA)`` for a line that is not ``name=<JSON>``."""
    out: dict[str, object] = {}
    for name, value in _fields(text).items():
        try:
            out[name] = json.loads(value)
        except ValueError:
            raise RemoteProtocolError(Reason.BAD_SCHEMA, f"run configuration value {name}={value[:40]!r} is not JSON") from None
    return out


def config_differences(ours: str, theirs: str) -> list[str]:
    """The fields two encoded configurations disagree on, as ``"name: ours X, theirs Y"`` (``[]`` when the
    texts are equal). Raises ``RemoteProtocolError(BAD_SCHEMA)`` if ``theirs`` is not ``name=value`` lines."""
    if ours == theirs:
        return []
    mine, other = _fields(ours), _fields(theirs)
    out = [f"{name}: ours {mine.get(name, 'absent')}, theirs {other.get(name, 'absent')}"
           for name in sorted(set(mine) | set(other)) if mine.get(name) != other.get(name)]
    return out or ["the same fields in another order or spelling"]


def check_config(ours: str, theirs: str) -> None:
    """Refuse a peer whose run configuration differs (``CONFIG_MISMATCH``, the fields named)."""
    differences = config_differences(ours, theirs)
    if differences:
        shown = "; ".join(differences[:6]) + (f"; and {len(differences) - 6} more" if len(differences) > 6 else "")
        raise RemoteProtocolError(Reason.CONFIG_MISMATCH, f"run configuration differs: {shown}")
