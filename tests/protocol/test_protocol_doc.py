"""PROTOCOL.md's worked examples are recomputed here, so the document cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

from protocol import signing, wire
from protocol.framing import encode_frame
from protocol.identity import Identity
from protocol.messages import Goodbye, Heartbeat

DOC = (Path(__file__).resolve().parents[2] / "PROTOCOL.md").read_text()
SEED = bytes.fromhex("7e0830617c4a7de83925dfb2694556b12936c477a0e1feb2e148ec9da60fee7d")


def _doc_hex(label: str) -> str:
    match = re.search(rf"^{label}[^\n]*=\n([0-9a-f]+)$", DOC, re.MULTILINE)
    assert match, f"PROTOCOL.md lost its '{label}' example"
    return match.group(1)


def test_worked_example_matches_the_implementation():
    ident = Identity.from_seed(SEED)
    assert ident.peer_id in DOC and ident.public_key.hex() in DOC
    signed = signing.sign(ident, Goodbye("demo", ident.peer_id, 1_800_000_000_000_000, "done"))
    assert _doc_hex("signing_input") == signed.signing_input.hex()
    assert _doc_hex("signature") == signed.signature.hex()
    assert _doc_hex("message_id") == signed.message_id.hex()
    assert _doc_hex("frame") == encode_frame(signed).hex()
    signing.verify(wire.decode(bytes.fromhex(_doc_hex("frame"))[4:]))


def test_heartbeat_example_matches():
    assert encode_frame(Heartbeat("demo", 7, 3, "train", 42)).hex() in DOC


def test_every_kind_is_documented():
    from protocol.messages import KINDS

    for kind in KINDS:
        assert f"`{kind}`" in DOC, kind


def _documented_fields(kind: str) -> list[str]:
    start = DOC.index(f"**`{kind}`**")
    end = DOC.find("**`", start + 4)
    section = DOC[start : end if end != -1 else len(DOC)]
    rows = re.findall(r"^\| (\d+) \| (\w+) \|", section, re.MULTILINE)
    if rows:
        assert [int(n) for n, _ in rows] == list(range(len(rows)))
        return [name for _, name in rows]
    inline = re.search(r"\*\*`\w+`\*\* `\[([^\]]*)", section)
    assert inline, f"no field list for {kind}"
    return [part.split(":")[0].strip() for part in inline.group(1).split(",")]


def test_documented_field_order_matches_the_dataclasses():
    import dataclasses

    from protocol.messages import KINDS, PeerInfo

    for kind, cls in KINDS.items():
        assert _documented_fields(kind) == [f.name for f in dataclasses.fields(cls)], kind
    assert "`PeerInfo` = `[peer_id: PeerId, gossip_addr: Addr, http_addr: Addr]`" in DOC
    assert [f.name for f in dataclasses.fields(PeerInfo)] == ["peer_id", "gossip_addr", "http_addr"]
