"""Tier (a): `diloco-node --config FILE` (TOML): the file's settings become the flags' defaults, the command
line overrides them, both count as the user's choices (for adopting the run's settings), and a bad file is
one line naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.cli import parse, settings_from_args

GOOD = """
run-id = "my-run"
key = "node.key"
peers = ["10.0.0.1:7000", "10.0.0.2:7000"]
inner-steps = 20
closed = true
outer_lr = 0.5
log-format = "json"
[set]
lr = 0.001
tie_embeddings = false
"""


def test_a_config_file_gives_the_flags_and_the_command_line_overrides_it(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(GOOD)
    args, given = parse(["--config", str(path), "--inner-steps", "30"])
    settings = settings_from_args(args)
    assert (settings.run_id, settings.key_path, settings.peers) == ("my-run", Path("node.key"),
                                                                    ("10.0.0.1:7000", "10.0.0.2:7000"))
    assert settings.inner_steps == 30 and settings.outer_lr == 0.5 and settings.closed and args.log_format == "json"
    assert settings.overrides == ("lr=0.001", "tie_embeddings=false")
    assert {"run_id", "peers", "inner_steps", "outer_lr", "overrides", "closed"} <= given
    assert "window" not in given, "only what the user set counts as pinned"
    assert settings.ml_config("x").inner.lr == 0.001 and not settings.ml_config("x").model.tie_embeddings


@pytest.mark.parametrize(("text", "message"), [
    ("colour = 1\n", "unknown setting 'colour'"),
    ("inner-steps = \"many\"\n", "inner-steps = 'many' cannot be read"),
    ("closed = \"yes\"\n", "closed takes true or false"),
    ("compression = \"int3\"\n", "compression must be one of"),
    ("set = 3\n", "set is a table"),
    ("run-id = [\n", "not TOML"),
])
def test_a_bad_config_file_is_one_line_naming_the_file_and_the_key(tmp_path: Path, capsys, text: str,
                                                                   message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        parse(["--config", str(path), "--run-id", "r", "--key", "k"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"diloco-node: error: --config {path}: ") and message in err, err
