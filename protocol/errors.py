"""The protocol's error types and the named reasons a message or update can be rejected for.

Two kinds of failure, as in h11: the *local* caller misused an API (a bug on this side), or the *remote*
peer sent something we refuse. Nothing else may escape a decoder or a validator: any other exception is a
bug in this package.
"""

from __future__ import annotations

import enum


class Reason(enum.StrEnum):
    """Why something from a peer was refused. Values are stable: they appear in metrics and `/status`."""

    # framing and decoding (cheapest first)
    OVERSIZED = "oversized"
    TRUNCATED = "truncated"
    MALFORMED = "malformed"
    BAD_SCHEMA = "bad_schema"
    UNSUPPORTED_VERSION = "unsupported_version"
    # binding and freshness
    WRONG_RUN_ID = "wrong_run_id"
    CONFIG_MISMATCH = "config_mismatch"  # a peer of this run id with another run configuration
    NOT_ADMITTED = "not_admitted"  # a key the founder of a closed run did not admit (protocol.admission)
    DUPLICATE = "duplicate"
    REPLAYED = "replayed"
    # authenticity
    BAD_SIGNATURE = "bad_signature"
    BAD_IDENTITY = "bad_identity"
    BAD_HANDSHAKE = "bad_handshake"
    BAD_ADDRESS = "bad_address"
    # the link (p2p.tls)
    BAD_CERTIFICATE = "bad_certificate"  # a TLS certificate that proves no peer id (the libp2p TLS rules)
    CLEARTEXT_PEER = "cleartext_peer"  # a peer speaking cleartext (--insecure) to a node that requires TLS
    TLS_PEER = "tls_peer"  # a peer speaking TLS to a node started with --insecure
    # peer standing
    PEER_BANNED = "peer_banned"
    # application checks
    BAD_SLOT = "bad_slot"
    TOO_STALE = "too_stale"
    PAST_END = "past_end"  # an update for a slot after the run's last one (LedgerConfig.end_slot)
    BAD_CODEC = "bad_codec"
    SHAPE_MISMATCH = "shape_mismatch"
    NON_FINITE = "non_finite"
    HASH_MISMATCH = "hash_mismatch"
    BAD_STATE = "bad_state"
    BAD_CLAIM = "bad_claim"  # an update claiming more tokens or inner steps than the run allows
    BAD_CHUNK = "bad_chunk"  # a state piece whose length or SHA-256 is not the verified index's
    TOO_SLOW = "too_slow"  # a blob holder sending under the minimum rate (a tarpit, or a link too slow for the run)
    FLOOD = "flood"  # more requests than a per-peer budget allows (IWANT ids per heartbeat)


class ProtocolError(Exception):
    """Base of every error this package raises on purpose."""


class LocalProtocolError(ProtocolError):
    """The local caller misused the API (wrong argument, call out of order). A bug on this side."""


class RemoteProtocolError(ProtocolError):
    """A peer sent something we refuse. `reason` is what callers count; `detail` is for the log line."""

    def __init__(self, reason: Reason, detail: str = "") -> None:
        self.reason = Reason(reason)
        self.detail = detail
        super().__init__(f"{self.reason.value}: {detail}" if detail else self.reason.value)
