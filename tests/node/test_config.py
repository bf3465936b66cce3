"""Config: presets, typed overrides from Python and from strings, clear errors."""

import pytest

from node.island.config import PRESETS, Config, ConfigError, preset


def test_presets_exist_and_are_ordered_by_size():
    from node.island.model import param_count

    counts = [param_count(PRESETS[name].model) for name in ("tiny", "small", "base", "large")]
    assert counts == sorted(counts)
    assert counts[0] < 500_000 and 1_000_000 < counts[1] < 10_000_000
    assert 50_000_000 < counts[2] < 200_000_000 and 700_000_000 < counts[3] < 2_000_000_000


def test_unknown_preset_lists_known_names():
    with pytest.raises(ConfigError, match="tiny"):
        preset("huge")


def test_overrides_by_plain_and_qualified_name():
    cfg = preset("tiny").with_overrides(d_model=96, lr=1e-3, sources=["a.txt"])
    assert (cfg.model.d_model, cfg.inner.lr, cfg.data.sources) == (96, 1e-3, ("a.txt",))
    cfg = preset("tiny").with_overrides_from_strings(
        ["model.d_model=128", "lr=2e-3", "tie_embeddings=false", "sources=a.txt,b/", "shard_key=peer"])
    assert cfg.model.d_model == 128 and cfg.inner.lr == 2e-3 and cfg.model.tie_embeddings is False
    assert cfg.data.sources == ("a.txt", "b/") and cfg.data.shard_key == "peer"
    assert preset("tiny").model.d_model == 64  # presets are not mutated


def test_int_is_accepted_for_float_but_not_bool_for_int():
    assert preset("tiny").with_overrides(lr=1).inner.lr == 1.0
    with pytest.raises(ConfigError, match="d_model expects int"):
        preset("tiny").with_overrides(d_model=True)


@pytest.mark.parametrize(
    "items, message",
    [
        (["dmodel=3"], "unknown config key 'dmodel'"),
        (["inner.d_model=64"], "unknown config key 'inner.d_model'"),
        (["opt.lr=1"], "unknown config section 'opt'"),
        (["d_model=abc"], "d_model expects int"),
        (["lr=fast"], "lr expects float"),
        (["tie_embeddings=maybe"], "expects a boolean"),
        (["d_model"], "not of the form key=value"),
        (["d_model=65"], "divisible by n_heads"),
        (["n_heads=0"], "n_heads must be > 0"),
        (["heldout_fraction=1.5"], "heldout_fraction"),
        (["warmup_steps=20000"], "warmup_steps"),
        (["dtype=float16"], "dtype"),
    ],
)
def test_bad_overrides_are_rejected_with_a_clear_message(items, message):
    with pytest.raises(ConfigError, match=message):
        preset("tiny").with_overrides_from_strings(items)


def test_wrong_python_type_is_rejected():
    with pytest.raises(ConfigError, match="lr expects float, got str"):
        Config().with_overrides(lr="0.1")
    with pytest.raises(ConfigError, match="tuple of strings"):
        Config().with_overrides(sources="a.txt")
