"""Tier (a): a joiner's settings adopted from the run's configuration (`node.adopt`): what the user left open
is taken, what the user pinned and differs is a startup error naming the flag, and what no flag sets must
already agree."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from node.adopt import adopted, own_run_config
from node.island.config import ConfigError
from node.settings import NodeSettings

RUN = dict(run_id="r", key_path=Path("unused.key"))
FOUNDER = "12D3KooWEQUVqFMohwJD3diWHUkMgzXxsckskijwM7ZxygCLGAsh"


def _run() -> str:
    """The run: a founder started with non-default run-wide settings."""
    founder = NodeSettings(**RUN, model="tiny", overrides=("lr=0.02", "d_model=32", "n_heads=2"), seed=3, window=4,
                           inner_steps=20, compression="int8", outer_lr=0.5)
    return own_run_config(founder, "")


def test_a_joiner_that_pins_nothing_takes_every_run_wide_setting() -> None:
    joiner = NodeSettings(**RUN, peers=("127.0.0.1:7000",))
    assert own_run_config(joiner, "") != _run()
    taken = adopted(joiner, _run(), "", pinned={"run_id", "key_path", "peers"})
    assert own_run_config(taken, "") == _run()
    assert (taken.seed, taken.window, taken.inner_steps, taken.compression, taken.outer_lr) == (3, 4, 20, "int8", 0.5)
    assert taken.ml_config("").inner.lr == 0.02 and taken.ml_config("").model.d_model == 32
    assert adopted(taken, _run(), "", pinned=set()) is taken  # nothing to change


def test_a_pinned_setting_that_agrees_is_kept_and_one_that_differs_is_an_error_naming_its_flag() -> None:
    agrees = NodeSettings(**RUN, window=4, seed=3)
    assert own_run_config(adopted(agrees, _run(), "", pinned={"window", "seed"}), "") == _run()
    with pytest.raises(ConfigError, match=r"--window 2 \(the run's outer.window is 4\)"):
        adopted(NodeSettings(**RUN, window=2), _run(), "", pinned={"window"}, peer="peer-x")
    with pytest.raises(ConfigError, match=r"inner.lr=0.5 \(the run's is 0.02\)"):
        adopted(NodeSettings(**RUN, overrides=("lr=0.5",)), _run(), "", pinned={"overrides"})


def test_a_closed_run_and_settings_no_flag_sets_are_not_adopted() -> None:
    closed = own_run_config(NodeSettings(**RUN), FOUNDER)
    with pytest.raises(ConfigError, match=f"closed by founder {FOUNDER}: join it with --membership"):
        adopted(NodeSettings(**RUN), closed, "", pinned=set())
    with pytest.raises(ConfigError, match="is open"):
        adopted(NodeSettings(**RUN), own_run_config(NodeSettings(**RUN), ""), FOUNDER, pinned=set())
    other_version = _run().replace('outer.aggregation="radial-directional"', 'outer.aggregation="mean"')
    with pytest.raises(ConfigError, match="no flag sets.*outer.aggregation"):
        adopted(NodeSettings(**RUN), other_version, "", pinned=set())
    with pytest.raises(ConfigError, match="unreadable"):
        adopted(NodeSettings(**RUN), "model.d_model=sixty-four\n", "", pinned=set())
    assert dataclasses.replace(NodeSettings(**RUN)).window == 8  # the inputs are never changed in place
