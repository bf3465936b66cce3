"""The codec benchmark runs end to end on a small update, and importing the codecs pulls in no I/O."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from testnet.benchmarks import codecs as bench
from testnet.benchmarks import pseudograd


def test_benchmark_prints_every_codec_and_target(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--params", "150000", "--repeats", "1", "--steps", "2", "--sweep"])
    out = capsys.readouterr().out
    for codec in ("fp32", "bf16", "int8", "int4"):
        assert any(line.startswith(codec + " ") for line in out.splitlines()), codec
    assert out.count("met") >= 4  # one verdict per target ("met" or "NOT MET")
    assert "int4 ratio >= 7.5x" in out and "7.53x" in out
    assert "student-t(3)" in out and "block" in out


def test_transformer_shapes_hit_the_requested_size() -> None:
    for params in (1_000_000, 10_000_000, 50_000_000):
        total = sum(math.prod(s) for s in pseudograd.transformer_shapes(params).values())
        assert abs(total - params) / params < 0.1


def test_adamw_delta_is_deterministic_and_finite() -> None:
    shapes = pseudograd.transformer_shapes(100_000)
    a = pseudograd.adamw_delta(shapes, steps=3, seed=7)
    b = pseudograd.adamw_delta(shapes, steps=3, seed=7)
    assert a.keys() == shapes.keys()
    for k in a:
        assert a[k].shape == shapes[k] and a[k].dtype.name == "float32"
        assert (a[k] == b[k]).all() and a[k].any()


def test_importing_codecs_pulls_in_no_io_or_benchmarks() -> None:
    forbidden = ("trio", "socket", "jax", "asyncio", "httpx", "testnet.benchmarks")
    code = f"import sys, protocol.compression; print(sorted(m for m in {forbidden!r} if m in sys.modules))"
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo)
    assert result.stdout.strip() == "[]"
