"""Tier (a): a reduced run's settings — the roster file, its errors, and its digest in the run configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.island.config import ConfigError
from node.settings import NodeSettings, load_roster, roster_digest, run_configuration, ledger_config
from protocol.identity import Identity
from protocol.runconfig import decode_config


def _ids(n: int) -> list[str]:
    return [Identity.generate().peer_id for _ in range(n)]


def _settings(tmp: Path, text: str, **kw) -> NodeSettings:
    roster = tmp / "roster.txt"
    roster.write_text(text)
    return NodeSettings(run_id="r", key_path=tmp / "k", traffic="reduced", roster=roster, **kw)


def test_a_roster_file_reads_sorted_without_comments_and_names_this_node(tmp_path: Path) -> None:
    ids = _ids(3)
    s = _settings(tmp_path, f"# contributors\n{ids[2]}\n\n{ids[0]}  # the founder\n{ids[1]}\n{ids[0]}\n")
    assert load_roster(s, ids[1]) == tuple(sorted(ids))
    with pytest.raises(ConfigError, match="does not name this node's key"):
        load_roster(s, Identity.generate().peer_id)


@pytest.mark.parametrize("text, match", [("not-a-peer-id\n", r"entry 1\) is not a peer id"),
                                          ("", "at least 2 contributors")])
def test_a_bad_roster_is_one_clear_error(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_roster(_settings(tmp_path, text), "x")


def test_reduced_needs_a_roster_and_a_roster_needs_reduced(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs --roster"):
        NodeSettings(run_id="r", key_path=tmp_path / "k", traffic="reduced")
    with pytest.raises(ConfigError, match="give it with --traffic reduced"):
        NodeSettings(run_id="r", key_path=tmp_path / "k", roster=tmp_path / "roster.txt")
    with pytest.raises(ConfigError, match="--slot-step must be > 0"):
        _settings(tmp_path, "", slot_step_s=0.0)
    with pytest.raises(ConfigError, match="not built for --traffic reduced"):
        _settings(tmp_path, "", misbehave="flood")  # the ledger's attacks: a reduced run has no such ledger
    with pytest.raises(ConfigError, match="an all-to-all run has no aggregators"):
        NodeSettings(run_id="r", key_path=tmp_path / "k", misbehave="lie")
    assert _settings(tmp_path, "", misbehave="lie").misbehave == "lie"


def test_the_roster_is_in_the_run_configuration_and_an_all_to_all_run_is_unchanged(tmp_path: Path) -> None:
    ids = _ids(4)
    s = _settings(tmp_path, "\n".join(ids))
    task = s.byte_lm_task()
    roster = load_roster(s, ids[0])
    fields = decode_config(run_configuration(s, task, ledger_config(s, task).fingerprint(), roster=roster))
    assert fields["run.traffic"] == "reduced" and fields["reduced.shards"] == 4
    assert fields["reduced.roster"] == roster_digest(roster) != roster_digest(roster[:3])
    plain = NodeSettings(run_id="r", key_path=tmp_path / "k")
    assert not any(k.startswith(("reduced.", "run.traffic")) for k in
                   decode_config(run_configuration(plain, task, ledger_config(plain, task).fingerprint())))
