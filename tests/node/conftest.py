"""Shared fixtures for the node tests: a shrunk config and the embedded corpus, loaded once."""

import pytest

from node.island.config import Config, preset
from node.island.data import Dataset


def shrunk(**overrides) -> Config:
    """The tiny preset made smaller still, so real steps take a few milliseconds on a busy CPU."""
    base = dict(seq_len=32, d_model=32, n_layers=2, n_heads=2, d_ff=64, batch_size=8, lr=1e-2, warmup_steps=5,
                total_steps=1000)
    base.update(overrides)
    return preset("tiny").with_overrides(**base)


@pytest.fixture(scope="session")
def config() -> Config:
    return shrunk()


@pytest.fixture(scope="session")
def dataset(config: Config) -> Dataset:
    return Dataset(config.data, seq_len=config.model.seq_len, vocab_size=config.model.vocab_size)
