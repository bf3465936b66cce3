"""Tier (a): the baseline adapter trains what the nodes train (their own config function), on as many
tokens, and its command line round-trips through its own parser."""

from __future__ import annotations

from pathlib import Path

from node.island.config import preset
from node.settings import NodeSettings
from testnet.baseline_run import baseline_argv, baseline_config, baseline_steps


def test_config_is_the_nodes_own() -> None:
    cfg = baseline_config("tiny", ["a.txt"], 7)
    node = NodeSettings(run_id="x", key_path=Path("k"), model="tiny", data=("a.txt",), seed=7).ml_config("peer")
    assert cfg.model == node.model and cfg.inner == node.inner
    assert cfg.data.sources == ("a.txt",) and cfg.data.data_seed == 7 and cfg.inner.init_seed == 7


def test_steps_match_the_nodes_tokens() -> None:
    tiny = preset("tiny")
    per_step = 3 * tiny.data.batch_size * tiny.model.seq_len
    assert baseline_steps(100 * per_step, 3, "tiny") == 100
    assert baseline_steps(100.4 * per_step, 3, "tiny") == 100
    assert baseline_steps(0, 3, "tiny") == 1


def test_argv() -> None:
    argv = baseline_argv(model="tiny", data=["a", "b"], seed=3, steps=400, shard_keys=["p1", "p2"],
                         out=Path("/tmp/b.json"), eval_batches=4)
    assert argv[1:3] == ["-m", "testnet.baseline_run"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags == {"--model": "tiny", "--seed": "3", "--steps": "400", "--eval-every": "10", "--eval-batches": "4",
                     "--shard-keys": "p1,p2", "--out": "/tmp/b.json", "--data": "a,b"}
