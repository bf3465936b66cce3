"""The diloco-sim CLI: table (text, JSON, PNG), single runs, bandwidth, errors."""

import json

import pytest

from testnet.sim.cli import main


def test_table_writes_json_and_png(tmp_path, capsys):
    rc = main(["table", "--days", "0.02", "--workers", "1", "--chips", "150000", "300000",
               "--policies", "dp", "ours-m8", "--no-ablations", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "data-parallel" in out and "ours M=8" in out and "(72)" in out
    doc = json.loads((tmp_path / "goodput.json").read_text())
    cells = {(c["policy"], c["chips"]): c for c in doc["table"]}
    assert set(cells) == {("dp", 150000), ("dp", 300000), ("ours-m8", 150000), ("ours-m8", 300000)}
    assert cells[("dp", 150000)]["paper"] == 72.0
    assert 0.0 < cells[("dp", 150000)]["goodput"] < cells[("ours-m8", 150000)]["goodput"] <= 1.0
    assert (tmp_path / "goodput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_table_is_reproducible_across_worker_counts(tmp_path):
    args = ["table", "--days", "0.02", "--chips", "150000", "--policies", "elastic", "ours-m2", "--no-ablations"]
    assert main(args + ["--workers", "1", "--out", str(tmp_path / "a")]) == 0
    assert main(args + ["--workers", "2", "--out", str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / d / "goodput.json").read_text()) for d in "ab")
    assert [c["goodput"] for c in a["table"]] == [c["goodput"] for c in b["table"]]


def test_overridden_settings_are_not_compared_with_the_paper(tmp_path):
    rc = main(["table", "--days", "0.02", "--workers", "1", "--chips", "150000", "--policies", "dp",
               "--no-ablations", "--set", "return_seconds=120", "--out", str(tmp_path)])
    assert rc == 0
    assert json.loads((tmp_path / "goodput.json").read_text())["table"][0]["paper"] is None


def test_run_and_bandwidth(capsys, tmp_path):
    assert main(["run", "--policy", "ours-m2", "--chips", "1e5", "--days", "0.02"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["policy"] == "ours-m2" and 0 < doc["goodput"] <= 1
    assert main(["bandwidth", "--paper"]) == 0
    out = capsys.readouterr().out
    assert "DP 198.00 Gbit/s" in out and "[ring]" in out and "[gossip]" in out
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"communication": {"bytes_per_node_step": 1.0e7}}))  # a testnet report.json
    assert main(["bandwidth", "--params", "1e9", "--step-seconds", "1", "--inner-steps", "100",
                 "--measured", str(report)]) == 0
    assert "measured 1e+07 B/node/step" in capsys.readouterr().out


def test_errors_are_reported_not_raised(capsys):
    assert main(["run", "--policy", "dp", "--chips", "1000", "--set", "nonsense=3"]) == 2
    assert "unknown config key" in capsys.readouterr().err
    assert main(["bandwidth", "--params", "1e9"]) == 2
    assert "--step-seconds" in capsys.readouterr().err
