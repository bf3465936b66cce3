"""`protocol` is sans-IO: importing it must not pull in any I/O, async or accelerator library."""

import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("trio", "socket", "httpx", "jax", "flax", "asyncio", "hypercorn")
MODULES = ("protocol", "protocol.identity", "protocol.messages", "protocol.wire", "protocol.framing",
           "protocol.signing", "protocol.seen", "protocol.validation")


def test_importing_protocol_pulls_in_no_io_modules():
    code = (
        "import importlib, sys\n"
        f"for m in {MODULES!r}: importlib.import_module(m)\n"
        f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
