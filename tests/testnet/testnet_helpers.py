"""Shared pieces of the testnet tests: fake-node specs and command lines, and a condition waiter."""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path


from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from p2p.tlscert import make_certificate
from protocol.identity import Identity
from testnet.nodes import NodeSpec, prepare_nodes
from waiting import wait_for  # noqa: F401  (re-exported)

FAKE_NODE = str(Path(__file__).with_name("fake_node.py"))


@functools.cache
def fake_pem() -> str:
    """A libp2p certificate of a fresh key with its private key, PEM, for the fake nodes' https planes (made once:
    importing p2p in every fake node would slow its start)."""
    certificate, key = make_certificate(Identity.generate())
    fd, path = tempfile.mkstemp(suffix=".pem")
    with os.fdopen(fd, "wb") as f:
        f.write(certificate.public_bytes(Encoding.PEM))
        f.write(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    return path


def fake_specs(run_dir: Path, n: int) -> list[NodeSpec]:
    return prepare_nodes(run_dir, n, seed=0)


def fake_argv(*flags: str, failing: set[int] = frozenset(), per_node: Mapping[int, Sequence[str]] | None = None):
    """An `ArgvBuilder` that starts `fake_node.py` (with `flags`; nodes in `failing` die before LISTENING;
    node i also gets `per_node[i]`)."""

    def build(spec: NodeSpec, gossip_port: int, http_port: int, peers) -> list[str]:
        extra = list(flags) + (["--die-before-listening"] if spec.index in failing else [])
        extra += list((per_node or {}).get(spec.index, ()))
        return [*spec.exec_prefix, sys.executable, FAKE_NODE, "--listen", f"{spec.host}:{gossip_port}",
                "--http", f"{spec.host}:{http_port}", "--peer-id", spec.peer_id, "--tls-pem", fake_pem(),
                "--checkpoint-dir", str(spec.checkpoint_dir), "--peers", ",".join(peers), *extra]

    return build


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

