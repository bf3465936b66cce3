"""Tier (a): PROTOCOL.md §11b's worked example of a state's bottom pieces, recomputed twice: from the
definitions written there and in §11a (hashlib, struct and numpy only) and by the ledger and
`protocol.ledger.statesync` themselves."""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

import numpy as np

from protocol.ledger import Ledger, LedgerConfig
from protocol.ledger.statesync import BottomIndex, bottom_arrays

DOC = (Path(__file__).resolve().parents[2] / "PROTOCOL.md").read_text()
PIECE = 4_194_304  # "4 MiB pieces (4,194,304 bytes)", §11a


def H(data: bytes) -> bytes:  # noqa: N802 - the spec's name
    return hashlib.sha256(data).digest()


def example() -> tuple[list[tuple[int, str, int, int, str]], dict[str, str]]:
    section = DOC[DOC.index("## 11b."):DOC.index("## 12.")]
    block = section[section.index("Worked example"):]
    block = block[block.index("```\n") + 4:]
    block = block[:block.index("```")]
    pieces = [(int(m[1]), m[2], int(m[3]), int(m[4]), m[5]) for m in
              re.finditer(r"^piece (\d+) (\S+)\s+(\d+)\s+(\d+)\s+([0-9a-f]{64})$", block, re.M)]
    digests = {m[1]: m[2] for m in re.finditer(r"^(bottom digest|state digest)\s+([0-9a-f]{64})$", block, re.M)}
    return pieces, digests


def arrays() -> dict[str, np.ndarray]:
    """The example's bottom as written: b = [0.5, -1.0], w = 1,048,577 × 0.25, float32, momentum zeros."""
    b, w = np.array([0.5, -1.0], "<f4"), np.full(1_048_577, 0.25, "<f4")
    return {"momentum/b": np.zeros_like(b), "momentum/w": np.zeros_like(w), "theta/b": b, "theta/w": w}


def test_the_worked_example_follows_from_the_written_definitions() -> None:
    pieces, digests = example()
    expected, tree, at = [], hashlib.sha256(b"diloco/bottom/v2\0"), 0
    for name, a in arrays().items():  # already in ascending name order
        raw = a.tobytes()
        tree.update(struct.pack(">I", len(name)) + name.encode() + b"<f4" + struct.pack(">B", 1)
                    + struct.pack(">Q", a.size))
        for k in range(0, len(raw), PIECE):
            piece = raw[k:k + PIECE]
            expected.append((len(expected), name, at + k, len(piece), H(piece).hex()))
            tree.update(H(piece))
        at += len(raw)
    assert pieces == expected and len(pieces) == 6
    genesis = H(b"diloco/ledger-genesis/v1")
    ledger = H(b"diloco/ledger/v2\0" + struct.pack(">Q", 0) + genesis + bytes(16 + 40) + H(b"diloco/ledger-slot/v1\0"
                                                                            + struct.pack(">QI", 1, 0)))
    state = H(b"diloco/ledger-state/v2\0" + tree.digest() + ledger)
    assert digests == {"bottom digest": tree.hexdigest(), "state digest": state.hex()}
    assert f"GET /state/bottom/{tree.hexdigest()[:8]}…{tree.hexdigest()[-4:]}/4" in DOC


def test_the_ledger_and_the_index_compute_the_worked_example() -> None:
    pieces, digests = example()
    a = arrays()
    led = Ledger({"b": a["theta/b"], "w": a["theta/w"]}, LedgerConfig())
    index = BottomIndex.of_arrays(bottom_arrays(led.snapshot()))
    assert [(p.index, p.offset, p.length, p.sha256.hex()) for p in index.pieces()] == \
        [(i, offset, length, sha) for i, _, offset, length, sha in pieces]
    assert index.digest().hex() == led.bottom_digest().hex() == digests["bottom digest"]
    assert led.params_digest().hex() == digests["state digest"]
