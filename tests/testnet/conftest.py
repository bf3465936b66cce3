"""Lets the testnet tests share `testnet_helpers` (pytest runs with --import-mode=importlib), and gives the
tests that run real nodes a persistent JAX compilation cache (under pytest's cache directory, shared with the
node_net tests), so only the first run on a checkout pays for compiling the model."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def jax_cache(request: pytest.FixtureRequest) -> Path:
    return Path(request.config.cache.mkdir("node-net-jax-cache"))
