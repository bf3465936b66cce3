"""Sans-IO core of diloco: identity, wire messages and their encoding, validation, pseudo-gradient
compression and the outer-step ledger. No sockets, no trio, no clocks, no JAX: time is an argument.
"""

from protocol.compression import BLOCK_SIZE, Codec, ErrorFeedback, decode_tensors, encode_tensors, payload_size
from protocol.errors import LocalProtocolError, ProtocolError, Reason, RemoteProtocolError
from protocol.framing import MAX_FRAME_SIZE, FrameDecoder, encode_frame, frame
from protocol.identity import (
    Identity,
    KeyFileError,
    peer_id_from_public_key,
    public_key_from_peer_id,
    verify_signature,
)
from protocol.messages import (
    KNOWN_CODECS,
    PROTOCOL_VERSION,
    AnyMessage,
    Goodbye,
    Graft,
    Heartbeat,
    Hello,
    HelloProof,
    IHave,
    IWant,
    Message,
    PeerExchange,
    PeerInfo,
    Prune,
    Signed,
    StateManifest,
    UpdateHeader,
    split_addr,
)
from protocol.seen import ReplayWindow, SeenCache, SeqnoSource
from protocol.signing import check_hello, make_hello_proof, new_challenge, sign, verify, verify_hello_proof
from protocol.validation import RejectCounters, Validator
from protocol.wire import decode, encode

__all__ = [
    "AnyMessage",
    "BLOCK_SIZE",
    "check_hello",
    "Codec",
    "decode",
    "decode_tensors",
    "encode",
    "encode_frame",
    "encode_tensors",
    "ErrorFeedback",
    "frame",
    "FrameDecoder",
    "Goodbye",
    "Graft",
    "Heartbeat",
    "Hello",
    "HelloProof",
    "Identity",
    "IHave",
    "IWant",
    "KeyFileError",
    "KNOWN_CODECS",
    "LocalProtocolError",
    "make_hello_proof",
    "MAX_FRAME_SIZE",
    "Message",
    "new_challenge",
    "payload_size",
    "peer_id_from_public_key",
    "PeerExchange",
    "PeerInfo",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "Prune",
    "public_key_from_peer_id",
    "Reason",
    "RejectCounters",
    "RemoteProtocolError",
    "ReplayWindow",
    "SeenCache",
    "SeqnoSource",
    "sign",
    "Signed",
    "split_addr",
    "StateManifest",
    "UpdateHeader",
    "Validator",
    "verify",
    "verify_hello_proof",
    "verify_signature",
]
