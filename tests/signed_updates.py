"""Updates signed as a node's gossip would deliver them, for tests whose replicas serve states to peers: a
state's entries must carry their origins' signatures (`protocol.ledger.proof`), or peers refuse the state."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np

from protocol import signing
from protocol.compression import Codec, decode_tensors, encode_tensors
from protocol.identity import Identity
from protocol.ledger import Payload, UpdateMeta
from protocol.ledger.proof import UpdateProof, header_shapes, proof_of
from protocol.messages import UpdateHeader


def origin(seed: int) -> Identity:
    return Identity.from_seed(hashlib.sha256(b"test-origin-%d" % seed).digest())


def signed_update(run_id: str, shapes: Mapping[str, tuple[int, ...]], deltas: Mapping[str, np.ndarray], *,
                  seed: int, base: int, publish: int, tokens: int, steps: int = 5, codec: Codec | None = Codec.INT4,
                  ) -> tuple[UpdateMeta, dict[str, np.ndarray], Payload | None, UpdateProof]:
    """(meta, deltas as the ledger gets them, payload, proof) of an update by origin `seed`. With `codec`
    None the update is added without its payload: a donor then serves its deltas as fp32, which is what is
    signed."""
    data = encode_tensors(dict(deltas), codec or Codec.FP32)
    header = UpdateHeader(run_id, origin(seed).peer_id, 1, base, publish, tokens, steps, (codec or Codec.FP32).value,
                          header_shapes(shapes), hashlib.sha256(data).digest(), len(data))
    signed = signing.sign(origin(seed), header)
    meta = UpdateMeta(signed.message_id, header.origin, base, publish, tokens, steps)
    if codec is None:
        return meta, {k: np.asarray(v, np.float32).copy() for k, v in deltas.items()}, None, proof_of(signed)
    return meta, decode_tensors(data, codec, dict(shapes)), Payload(codec, data), proof_of(signed)
