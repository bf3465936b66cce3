"""The testnet's nodes on disk and on the command line: keys, directories, and the `diloco-node` argv.

`prepare_nodes` creates `keys/node-<i>.key` (deterministic from the seed, so peer ids and therefore
data shards are reproducible), `checkpoints/node-<i>/` and the log path, and returns one `NodeSpec` per
node. `node_argv` turns a spec plus the ports and bootstrap peers of one launch into the command line of
docs/node-contract.md. The node program is started as `python -c "from node.cli import main; ..."` so
it works whether or not the `diloco-node` entry point is installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from protocol.identity import Identity

__all__ = ["NODE_MAIN", "RunFlags", "NodeSpec", "node_argv", "node_env", "prepare_nodes", "repo_root"]

NODE_MAIN = "import sys; from node.cli import main; sys.exit(main())"


def repo_root() -> Path:
    """The directory holding the `node`, `p2p`, `protocol` and `testnet` packages."""
    return Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """Everything fixed about node `index` across its restarts."""

    index: int
    peer_id: str
    key_path: Path
    checkpoint_dir: Path
    log_path: Path
    host: str = "127.0.0.1"
    exec_prefix: tuple[str, ...] = ()  # e.g. ("ip", "netns", "exec", "dlc-1a2b-0") under --wan
    slowdown: float = 1.0
    misbehave: str | None = None


@dataclasses.dataclass(frozen=True)
class RunFlags:
    """The flags the testnet gives every node of its run (docs/node-contract.md); what a node makes of them is
    `node.settings.NodeSettings`. `inner_steps` is the testnet's own default (20: rounds short enough for a
    few minutes' demo), not the node's (50)."""

    run_id: str
    model: str = "tiny"
    inner_steps: int = 20
    eval_every: int = 2
    eval_batches: int = 4
    max_rounds: int | None = None
    seed: int = 0
    data: tuple[str, ...] = ()
    compression: str | None = None
    allow_chaos: bool = False
    overrides: tuple[str, ...] = ()  # KEY=VALUE config overrides, each passed as --set
    outer_momentum: float | None = None  # --outer-momentum (None: the node's default)
    extra_args: tuple[str, ...] = ()


def prepare_nodes(run_dir: Path, nodes: int, seed: int, *, hosts: Sequence[str] | None = None,
                  exec_prefixes: Sequence[Sequence[str]] | None = None,
                  slow: dict[int, float] | None = None, misbehave: dict[int, str] | None = None) -> list[NodeSpec]:
    """Create keys and directories under `run_dir` and return the specs (existing keys are reused)."""
    (run_dir / "keys").mkdir(parents=True, exist_ok=True)
    specs = []
    for i in range(nodes):
        key_path = run_dir / "keys" / f"node-{i}.key"
        if key_path.exists():
            ident = Identity.load(key_path)
        else:
            ident = Identity.from_seed(hashlib.sha256(f"diloco-testnet-key:{seed}:{i}".encode()).digest())
            ident.save(key_path)
        ckpt = run_dir / "checkpoints" / f"node-{i}"
        ckpt.mkdir(parents=True, exist_ok=True)
        specs.append(NodeSpec(
            index=i, peer_id=ident.peer_id, key_path=key_path, checkpoint_dir=ckpt,
            log_path=run_dir / f"node-{i}.log", host=hosts[i] if hosts else "127.0.0.1",
            exec_prefix=tuple(exec_prefixes[i]) if exec_prefixes else (),
            slowdown=(slow or {}).get(i, 1.0), misbehave=(misbehave or {}).get(i)))
    return specs


def node_argv(spec: NodeSpec, settings: RunFlags, *, gossip_port: int, http_port: int,
              peers: Sequence[str]) -> list[str]:
    """The command line for one launch of `spec` (ports 0 = let the node pick)."""
    argv = [*spec.exec_prefix, sys.executable, "-c", NODE_MAIN,
            "--listen", f"{spec.host}:{gossip_port}", "--http", f"{spec.host}:{http_port}",
            "--run-id", settings.run_id, "--key", str(spec.key_path), "--checkpoint-dir", str(spec.checkpoint_dir),
            "--model", settings.model, "--inner-steps", str(settings.inner_steps),
            "--eval-every", str(settings.eval_every), "--eval-batches", str(settings.eval_batches),
            "--seed", str(settings.seed)]
    if settings.max_rounds is not None:
        argv += ["--max-rounds", str(settings.max_rounds)]
    for item in settings.overrides:
        argv += ["--set", item]
    if peers:
        argv += ["--peers", ",".join(peers)]
    if settings.data:
        argv += ["--data", ",".join(settings.data)]
    if settings.compression:
        argv += ["--compression", settings.compression]
    if settings.outer_momentum is not None:
        argv += ["--outer-momentum", f"{settings.outer_momentum:g}"]
    if spec.slowdown != 1.0:
        argv += ["--slowdown", f"{spec.slowdown:g}"]
    if spec.misbehave:
        argv += ["--misbehave", spec.misbehave]
    if settings.allow_chaos:
        argv.append("--allow-chaos")
    return argv + list(settings.extra_args)


def node_env(jax_cache: Path | None = None) -> dict[str, str]:
    """The environment for node processes: ours, with the repository on PYTHONPATH, unbuffered output,
    and, given `jax_cache`, JAX's persistent compilation cache there (a restarted node then skips most of
    its compile time; every process of a run shares it). On a GPU, JAX would take 75% of its memory in
    each process at start; the testnet's processes share the machine's GPUs, so each takes what it needs
    (`XLA_PYTHON_CLIENT_PREALLOCATE=false`). Variables the user set win."""
    env = dict(os.environ)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if jax_cache is not None:
        jax_cache.mkdir(parents=True, exist_ok=True)
        env.setdefault("JAX_COMPILATION_CACHE_DIR", str(jax_cache.resolve()))
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    root = str(repo_root())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env
