"""The ledger is sans-IO: importing it pulls in no I/O, clock-driven or accelerator library, nor its scripts."""

import subprocess
import sys
from pathlib import Path

FORBIDDEN = (
    "trio",
    "jax",
    "socket",
    "httpx",
    "asyncio",
    "hypercorn",
    "testnet.benchmarks.ledger_fold",
    "protocol.ledger.demo",
)


def test_import_is_pure():
    code = (
        f"import sys, protocol.ledger\nbad = [m for m in {FORBIDDEN!r} if m in sys.modules]\nassert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
