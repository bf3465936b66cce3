"""Sans-IO core of diloco: identity, wire messages and their encoding, validation, pseudo-gradient
compression and the outer-step ledger. No sockets, no trio, no clocks, no JAX: time is an argument.
"""

from protocol.errors import LocalProtocolError, ProtocolError, Reason, RemoteProtocolError

__all__ = ["LocalProtocolError", "ProtocolError", "Reason", "RemoteProtocolError"]
