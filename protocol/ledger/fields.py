"""Checks of the fields of the state documents a peer sends (snapshots, state metas).

Each refuses anything else with ``RemoteProtocolError(Reason.BAD_STATE)`` naming what was wrong: inside a
peer's state, a malformed field is a bad state. Pure functions of decoded msgpack values.
"""

from __future__ import annotations

from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger.config import ID_BYTES

__all__ = ["array", "bad_state", "binary", "seen_ids", "shapes_field", "string_map", "uint"]


def bad_state(detail: str) -> RemoteProtocolError:
    return RemoteProtocolError(Reason.BAD_STATE, detail)


#: The largest slot, token count or step count a peer may send: every integer up to it is exact in
#: binary64, so no arithmetic on it (weights, powers, sums) can overflow or round an integer away.
MAX_COUNT = 2**53


def uint(x: object, what: str) -> int:
    if type(x) is not int or not 0 <= x <= MAX_COUNT:
        raise bad_state(f"{what} must be an int in [0, 2^53]")
    return x


def binary(x: object, what: str) -> bytes:
    if not isinstance(x, bytes):
        raise bad_state(f"{what} must be bytes")
    return x


def array(x: object, what: str) -> list:
    if not isinstance(x, list):
        raise bad_state(f"{what} must be an array")
    return x


def string_map(x: object, what: str) -> dict:
    """A map whose keys are all strings (the config fingerprint, the counters)."""
    if not isinstance(x, dict) or not all(isinstance(k, str) for k in x):
        raise bad_state(f"{what} must be a map")
    return x


def shapes_field(x: object) -> dict[str, tuple[int, ...]]:
    """A non-empty map of tensor names to shapes (lists of non-negative ints), by name."""
    if not isinstance(x, dict) or not x or not all(isinstance(k, str) for k in x):
        raise bad_state("shapes must be a non-empty map of names")
    return {
        name: tuple(uint(d, f"shape of {name}") for d in array(dims, f"shape of {name}"))
        for name, dims in sorted(x.items())
    }


def seen_ids(x: object) -> tuple[bytes, ...]:
    """The seen ids: a concatenation of 32-byte ids, sorted and unique."""
    raw = binary(x, "seen")
    if len(raw) % ID_BYTES:
        raise bad_state("seen must be a concatenation of 32-byte ids")
    seen = tuple(raw[i : i + ID_BYTES] for i in range(0, len(raw), ID_BYTES))
    if any(a >= b for a, b in zip(seen, seen[1:], strict=False)):
        raise bad_state("seen ids must be sorted and unique")
    return seen
