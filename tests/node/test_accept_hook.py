"""Tier (a): the node's header check (`node.outer.updates.accept_hook`), run by the gossip router before a
payload is fetched and before the header is forwarded: another model, impossible counts and claims above the
run's limits are refused there, so the peer that sent them is the one penalised."""

from __future__ import annotations

import pytest

from node.outer.updates import accept_hook, shapes_field
from protocol.errors import Reason, RemoteProtocolError
from protocol.identity import Identity
from protocol.ledger import LedgerConfig
from protocol.messages import UpdateHeader
from protocol.signing import sign

SHAPES = {"w": (4, 4), "b": (4,)}
KEY = Identity.generate()


def header(**fields) -> object:
    body = dict(run_id="r", origin=KEY.peer_id, seqno=1, base_slot=3, publish_slot=4, tokens=512 * 10, inner_steps=10,
                codec="int4", shapes=shapes_field(SHAPES), payload_sha256=b"\0" * 32, payload_size=16)
    body.update(fields)
    return sign(KEY, UpdateHeader(**body))


@pytest.mark.parametrize("fields,reason", [
    ({"tokens": 512 * 10 + 1}, Reason.BAD_CLAIM),
    ({"inner_steps": 11, "tokens": 512}, Reason.BAD_CLAIM),
    ({"tokens": 2**60, "inner_steps": 2**60}, Reason.BAD_SCHEMA),
    ({"base_slot": 5}, Reason.BAD_SLOT),
    ({"shapes": shapes_field({"w": (4, 4)})}, Reason.SHAPE_MISMATCH),
])
def test_headers_refused_before_any_fetch(fields, reason) -> None:
    accept = accept_hook(SHAPES, LedgerConfig(tokens_per_step=512, max_inner_steps=10))
    accept(header())  # a full round's claim passes
    with pytest.raises(RemoteProtocolError) as err:
        accept(header(**fields))
    assert err.value.reason is reason
