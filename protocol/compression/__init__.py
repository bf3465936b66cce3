"""Pseudo-gradient compression: codecs (fp32, bf16, blockwise int8 and int4), payload encoding of a
named set of tensors, and sender-side error feedback. numpy, with int4's passes compiled for real model sizes
(``protocol.kernels``); byte layout in docs/payload-format.md.
"""

from protocol.compression.feedback import ErrorFeedback
from protocol.compression.formats import BLOCK_SIZE, Codec, payload_size
from protocol.compression.tensors import (
    add_decoded_span, decode_span, decode_span_into, decode_tensors, encode_tensors, record_offsets,
)

__all__ = ["BLOCK_SIZE", "Codec", "ErrorFeedback", "add_decoded_span", "decode_span", "decode_span_into", "decode_tensors", "encode_tensors",
           "payload_size", "record_offsets"]
