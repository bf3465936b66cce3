"""Sans-IO core of diloco: identity, wire messages and their encoding, validation, pseudo-gradient
compression and the outer-step ledger. No sockets, no trio, no clocks, no JAX: time is an argument.
"""

from protocol.compression import BLOCK_SIZE, Codec, ErrorFeedback, decode_tensors, encode_tensors, payload_size
from protocol.errors import LocalProtocolError, ProtocolError, Reason, RemoteProtocolError

__all__ = [
    "BLOCK_SIZE",
    "Codec",
    "ErrorFeedback",
    "LocalProtocolError",
    "ProtocolError",
    "Reason",
    "RemoteProtocolError",
    "decode_tensors",
    "encode_tensors",
    "payload_size",
]
