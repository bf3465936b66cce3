"""Tier (c): a user's mistake on the `diloco-node` command line is one line on stderr that names the flag,
exit status 2, and no `LISTENING` (the node never joined the network with a setting it cannot run).

The processes of every case run at once (each pays for importing JAX)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from node_net_helpers import REPO, node_env

from protocol.admission import grant
from protocol.identity import Identity

TIMEOUT_S = 120.0


@pytest.fixture
def busy_port():
    """A port this test holds a listening socket on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_each_user_error_is_one_line_naming_its_flag_and_exit_2(tmp_path: Path, jax_cache: Path, busy_port: int):
    (tmp_path / "empty").mkdir()
    (tmp_path / "weights.bin.gz").write_bytes(bytes(range(256)) * 4096)  # 1 MiB of binary, passed as text
    (tmp_path / "a-file").write_text("x")
    founder, someone = Identity.generate(), Identity.generate()
    (tmp_path / "other.json").write_text(grant(founder, "errors", someone.peer_id).to_json())
    cases = {
        "missing data": (["--data", str(tmp_path / "nonexistent")], "--data: data source", "does not exist"),
        "empty folder": (["--data", str(tmp_path / "empty")], "--data: folder", "holds no files"),
        "unmatched glob": (["--data", str(tmp_path / "*.txt")], "--data: glob", "matches no files"),
        "binary as text": (["--data", str(tmp_path / "weights.bin.gz")], "--data: data source", "is not text"),
        "gossip port in use": (["--listen", f"127.0.0.1:{busy_port}"], "--listen: cannot listen on", "in use"),
        "http port in use": (["--http", f"127.0.0.1:{busy_port}"], "--http: cannot listen on", "in use"),
        # 192.0.2.0/24 is reserved for documentation: never an address of this host (binding sends nothing)
        "address not local": (["--listen", "192.0.2.123:0", "--http", "192.0.2.123:0"], "--listen: cannot listen on",
                              "assign"),
        "wildcard advertised": (["--advertise", "0.0.0.0"], "--advertise 0.0.0.0:", "wildcard"),
        "bad peer address": (["--peers", "localhost"], "--peers:", "host:port"),
        "checkpoint dir under a file": (["--checkpoint-dir", str(tmp_path / "a-file" / "ckpt")], "--checkpoint-dir",
                                        "Not a directory"),
        "membership of another key": (["--membership", str(tmp_path / "other.json")], "--membership", "but --key is"),
        "membership not one": (["--membership", str(tmp_path / "a-file")], "--membership", "not a membership file"),
        "log file in no folder": (["--log-file", str(tmp_path / "no-such-folder" / "node.log")], "--log-file",
                                  "No such file"),
    }
    procs = {}
    for name, (args, _, _) in cases.items():
        home = tmp_path / name.replace(" ", "-")
        home.mkdir()
        cmd = [sys.executable, "-m", "node.cli", "--run-id", "errors", "--key", str(home / "key"), *args]
        procs[name] = subprocess.Popen(cmd, cwd=REPO, env=node_env(jax_cache), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    for name, (_, start, detail) in cases.items():
        out, err = procs[name].communicate(timeout=TIMEOUT_S)
        errors = [line for line in err.splitlines() if line.startswith("diloco-node: error:")]
        assert procs[name].returncode == 2, f"{name}: exit {procs[name].returncode}\n{err}"
        assert "LISTENING" not in out, f"{name}: listened before refusing"
        assert "Traceback" not in err and "sub-exception" not in err, f"{name}: a traceback\n{err}"
        assert len(errors) == 1, f"{name}: {len(errors)} error lines\n{err}"
        assert errors[0].startswith(f"diloco-node: error: {start}") and detail in errors[0], f"{name}: {errors[0]}"
