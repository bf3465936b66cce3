"""Tier (a): PROTOCOL.md §11a's worked example of the ledger and state digests, recomputed twice: from the
definitions written there (hashlib and struct only) and by the ledger itself."""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

import numpy as np

from protocol.ledger import Ledger, LedgerConfig

DOC = (Path(__file__).resolve().parents[2] / "PROTOCOL.md").read_text()


def H(data: bytes) -> bytes:  # noqa: N802 - the spec's name
    return hashlib.sha256(data).digest()


def example() -> dict[str, str]:
    section = DOC[DOC.index("## 11a."):DOC.index("## 12.")]
    block = section[section.index("```\n") + 4:]
    block = block[:block.index("```")]
    return {m.group(1).strip(): m.group(2) for m in re.finditer(r"^(.+?)\s+([0-9a-f]{64})$", block, re.M)}


def tree_entry(name: str, a: np.ndarray) -> bytes:
    raw = name.encode()
    header = struct.pack(">I", len(raw)) + raw + a.dtype.str.encode() + struct.pack(">B", a.ndim)
    header += b"".join(struct.pack(">Q", d) for d in a.shape)
    data = a.astype(a.dtype.newbyteorder("<")).tobytes()
    return header + b"".join(H(data[i:i + (1 << 22)]) for i in range(0, len(data), 1 << 22))


def test_the_worked_example_follows_from_the_written_definitions() -> None:
    doc = example()
    genesis = H(b"diloco/ledger-genesis/v1")
    slot1 = H(b"diloco/ledger-slot/v1\0" + struct.pack(">QI", 1, 0))
    ledger = H(b"diloco/ledger/v2\0" + struct.pack(">Q", 0) + genesis + bytes(16 + 40) + slot1)
    theta, momentum = np.array([1.0, -2.0, 0.5], dtype="<f4"), np.zeros(3, dtype="<f4")
    bottom = H(b"diloco/bottom/v2\0" + tree_entry("momentum/w", momentum) + tree_entry("theta/w", theta))
    state = H(b"diloco/ledger-state/v2\0" + bottom + ledger)
    assert doc == {
        "GENESIS": genesis.hex(),
        "slot digest of slot 1": slot1.hex(),
        "ledger digest": ledger.hex(),
        "H(momentum/w piece)": H(momentum.tobytes()).hex(),
        "H(theta/w piece)": H(theta.tobytes()).hex(),
        "bottom digest": bottom.hex(),
        "state digest": state.hex(),
    }


def test_the_ledger_computes_the_worked_example() -> None:
    doc = example()
    led = Ledger({"w": np.array([1.0, -2.0, 0.5], dtype=np.float32)}, LedgerConfig())
    assert led.ledger_digest().hex() == doc["ledger digest"]
    assert led.bottom_digest().hex() == doc["bottom digest"]
    assert led.params_digest().hex() == doc["state digest"]


def test_pieces_are_cut_every_4_mib() -> None:
    """A tensor of 1.5 pieces hashes as two pieces, so the digest differs from one over the whole bytes."""
    n = 3 * (1 << 22) // 8  # float32 elements in 1.5 pieces
    theta, momentum = np.arange(n, dtype=np.float32), np.zeros(n, dtype=np.float32)
    led = Ledger({"w": theta}, LedgerConfig())
    bottom = H(b"diloco/bottom/v2\0" + tree_entry("momentum/w", momentum) + tree_entry("theta/w", theta))
    assert led.bottom_digest() == bottom
    whole = momentum.tobytes()
    assert tree_entry("momentum/w", momentum).endswith(H(whole[: 1 << 22]) + H(whole[1 << 22:]))
