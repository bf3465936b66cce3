"""Tier (a): the worked examples and lists PROTOCOL.md gives for what an implementer needs beyond the wire
messages — the run configuration's encoding and the reference node's settings (§7a), a membership and its
file (§7b), the ledger settings as a state meta encodes them (§11b) — recomputed by the code."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import msgpack
import numpy as np

from node.adopt import own_run_config
from node.settings import NodeSettings, ledger_config
from protocol.admission import Membership, grant
from protocol.identity import Identity
from protocol.ledger import Ledger, LedgerConfig
from protocol.ledger.statesync import BottomIndex, StateMeta, bottom_arrays
from protocol.runconfig import config_hash, decode_config, encode_config

DOC = (Path(__file__).resolve().parents[2] / "PROTOCOL.md").read_text()
SEED = bytes.fromhex("7e0830617c4a7de83925dfb2694556b12936c477a0e1feb2e148ec9da60fee7d")  # §5's test vector
SETTINGS = NodeSettings(run_id="demo", key_path=Path("unused.key"))  # the reference node's defaults


def section(start: str, end: str) -> str:
    return DOC[DOC.index(start):DOC.index(end)]


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```\n(.*?)^```$", text, re.M | re.S)


def labelled_hex(text: str, label: str) -> str:
    match = re.search(rf"^{re.escape(label)}[^\n]*=\n([0-9a-f]+)$", text, re.M)
    assert match, f"PROTOCOL.md lost its '{label}' line"
    return match.group(1)


# -- §7a ----------------------------------------------------------------------------------------------------
def test_the_run_configuration_encoding_example() -> None:
    text = section("## 7a.", "## 7b.")
    example = text[text.index("An example of the encoding"):]
    block = code_blocks(example)[0]
    fields = {"model.name": "byte-lm", "model.d_model": 64, "model.rope_base": 10000.0, "model.tie_embeddings": True,
              "inner.lr": 0.003, "inner.eps": 1e-08, "outer.embeddings": ("embed.embedding",), "outer.end_slot": None,
              "run.founder": ""}
    assert encode_config(fields) == block
    assert encode_config(decode_config(block)) == block  # the text is its own canonical form
    assert f"is {len(block.encode())} bytes ({len(block.splitlines())} lines)" in example
    assert config_hash(block) == hashlib.sha256(block.encode()).hexdigest()
    assert f"`{config_hash(block)}`" in example


def _table_names(table: str) -> dict[str, str]:
    """name → type of each row of a `| names | type | value |` table (`outer.<key>` kept as it is)."""
    out: dict[str, str] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        types = [t.strip() for t in cells[1].split(",")]
        for k, name in enumerate(names):
            out[name] = types[k] if len(types) == len(names) else types[0]
    return out


def test_the_reference_nodes_settings_are_listed_with_their_types() -> None:
    text = section("## 7a.", "## 7b.")
    table = text[text.index("The reference node's run configuration holds exactly"):text.index("A library user's run")]
    listed = _table_names(table)
    assert listed.pop("outer.<key>")
    fingerprint = LedgerConfig().fingerprint()
    values = decode_config(own_run_config(SETTINGS, ""))
    assert set(listed) | {f"outer.{k}" for k in fingerprint} == set(values)
    python = {"int": int, "float": float, "bool": bool, "str": str}
    for name, kind in listed.items():
        assert type(values[name]) is python[kind], (name, kind, values[name])


# -- §7b ----------------------------------------------------------------------------------------------------
def test_the_membership_example() -> None:
    text = section("## 7b.", "## 8.")
    founder, member = Identity.from_seed(SEED), Identity.from_seed(bytes(range(32)))
    assert f"member peer id    {member.peer_id}" in text
    granted = grant(founder, "demo", member.peer_id)
    assert labelled_hex(text, "membership signing input") == granted.signing_input().hex()
    assert labelled_hex(text, "membership signature") == granted.signature.hex()
    wire = bytes.fromhex(labelled_hex(text, "membership ("))
    assert wire == granted.to_bytes() and len(wire) == 180 and "membership (180 bytes" in text
    assert wire == msgpack.packb(["demo", member.peer_id, founder.peer_id, granted.signature], use_bin_type=True)
    assert Membership.from_bytes(wire) == granted
    file = code_blocks(text[text.index("Its membership file:"):])[0]
    assert file == granted.to_json()
    assert Membership.from_json(file) == granted  # it verifies
    assert list(json.loads(file)) == ["run_id", "member", "founder", "signature"]


# -- §11b ---------------------------------------------------------------------------------------------------
def test_the_ledger_settings_example_is_the_reference_nodes_and_its_meta_encodes_it() -> None:
    text = section("## 11b.", "## 11c.")
    part = text[text.index("**Ledger settings**"):text.index("The **bottom index**")]
    keys = [k for row in re.findall(r"^\| (`.*?) \|", part, re.M) for k in re.findall(r"`(\w+)`", row)]
    config = ledger_config(SETTINGS, SETTINGS.byte_lm_task())
    fingerprint = config.fingerprint()
    assert sorted(keys) == sorted(fingerprint) and len(fingerprint) == 17
    block = code_blocks(part)[0]
    data = bytes.fromhex("".join(re.split(r"\s{2,}", line)[0].replace(" ", "") for line in block.splitlines()))
    assert data == msgpack.packb(fingerprint, use_bin_type=True)
    assert f"`config`, {len(data)} bytes:" in part
    assert list(msgpack.unpackb(data)) == list(fingerprint)  # written in the listed order
    # the state meta carries exactly these bytes as its `config`, and reads them back as the fingerprint
    led = Ledger({"w": np.array([1.0, -2.0, 0.5], dtype=np.float32)}, config)
    snap = led.snapshot()
    meta = StateMeta.of_snapshot(snap, {}, BottomIndex.of_arrays(bottom_arrays(snap)))
    encoded = meta.to_bytes()
    assert msgpack.packb("config") + data in encoded
    assert dict(StateMeta.from_bytes(encoded).config) == fingerprint
