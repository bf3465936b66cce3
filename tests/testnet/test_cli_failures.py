"""`diloco-testnet` tells the truth about failures: bad input is one line naming the flag and exit 2
before any node starts; nodes that cannot start, or a run in which every node died, exit non-zero and
quote the failed nodes' logs; a run in which some nodes died says so and still reports."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from testnet.cli import main
from testnet.procs import alive
from testnet_helpers import events, fake_argv

FAST = ["--progress", "quiet", "--no-baseline", "--solo-seconds", "0", "--poll-interval", "0.1", "--stop-grace", "2"]


def never_started(specs):  # an ArgvBuilder that fails the test if any node is started
    raise AssertionError("a node was started despite bad input")


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run main with bad input: exit 2, nothing on stdout, one line on stderr; return that line."""
    assert main(argv, argv_builder=never_started) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1, captured
    return lines[0]


def test_bad_out_is_one_line_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("not a folder")
    for out in (tmp_path / "file", tmp_path / "file" / "runs"):
        line = one_line_error(capsys, ["--out", str(out)])
        assert line.startswith("diloco-testnet: error: --out ") and "is not a folder" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no run directory was made anywhere


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write in any folder")
def test_unwritable_out_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    line = one_line_error(capsys, ["--out", str(locked / "runs")])
    assert line.startswith("diloco-testnet: error: --out ") and "is not writable" in line


def test_bad_data_is_one_line_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs"
    (tmp_path / "empty").mkdir()
    (tmp_path / "blank.txt").write_text("")
    (tmp_path / "text.txt").write_text("some text")
    np.save(tmp_path / "tokens.npy", np.arange(10))
    cases = {str(tmp_path / "missing"): "does not exist", str(tmp_path / "empty"): "holds no files",
             str(tmp_path / "*.md"): "matches no files", str(tmp_path / "blank.txt"): "every file is empty",
             f"{tmp_path / 'text.txt'},{tmp_path / 'tokens.npy'}": "cannot mix text files"}
    for data, why in cases.items():
        line = one_line_error(capsys, ["--data", data, "--out", str(out)])
        assert line.startswith("diloco-testnet: error: --data: ") and why in line, line
    assert not out.exists()


def test_bad_flag_values_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, flag in ((["--poll-interval", "0"], "--poll-interval must be > 0"),
                       (["--downtime", "-1"], "--downtime must be >= 0"),
                       (["--no-such-flag"], "unrecognized arguments: --no-such-flag")):
        with pytest.raises(SystemExit) as exit_:  # argparse's own checks
            main(argv, argv_builder=never_started)
        assert exit_.value.code == 2
        captured = capsys.readouterr()
        assert len(captured.err.splitlines()) == 1 and flag in captured.err, captured.err
    for argv, flag in ((["--wan", "3parsecs"], "--wan: cannot read '3parsecs'"),  # checks after parsing
                       (["--slow", "9:2"], "--slow: node 9 does not exist")):
        assert flag in one_line_error(capsys, argv)


@pytest.mark.slow
def test_every_node_dying_after_start_fails_the_run_and_quotes_their_logs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As with `--data /nonexistent` before the up-front check: every node prints LISTENING, then exits 2."""
    code = main(["--out", str(tmp_path), "--minutes", "10", *FAST],
                argv_builder=lambda specs: fake_argv("--exit-after-listening", "2"))
    assert code == 1  # and well before the 10 minutes: the run ends once every node has died
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("diloco-testnet: run failed: every node failed (3 of 3); no node trained")
    for node in range(3):
        at = err.index(next(line for line in err if line.startswith(f"node {node} (process 0) exited by itself "
                                                                     f"with status 2; last lines of ")))
        quoted = err[at + 1:at + 6]
        assert any("fatal: data source '/nonexistent' does not exist" in line for line in quoted), err
    run_dir = next(tmp_path.glob("2*"))
    assert "**The run failed**" in (run_dir / "report.md").read_text()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["outcome"]["failed"] and len(report["outcome"]["failed_nodes"]) == 3
    assert not [e["pid"] for e in events(run_dir) if e["event"] == "listening" and alive(e["pid"])]


def test_nodes_that_never_listen_exit_2_quoting_each_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--out", str(tmp_path), "--minutes", "10", *FAST],
                argv_builder=lambda specs: fake_argv(failing={1, 2}))
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("diloco-testnet: the testnet could not start: node 1 (process 0) exited with status 3")
    assert "node 2 (process 0) exited with status 3" in err and err.count("cannot load the model (test)") == 2
    run_dir = next(tmp_path.glob("2*"))
    assert not [e["pid"] for e in events(run_dir) if e["event"] == "listening" and alive(e["pid"])]


@pytest.mark.slow
def test_one_node_dying_is_reported_but_the_others_train_on(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--out", str(tmp_path), "--minutes", "0.02", *FAST],
                argv_builder=lambda specs: fake_argv(per_node={1: ["--exit-after-listening", "2"]}))
    assert code == 0
    out = capsys.readouterr().out
    assert "| nodes failed | 1 | nodes that exited by themselves or did not come back: node 1: exited by itself with " \
        "status 2 |" in out
    assert "warning: node 1 (process 0) exited by itself with status 2; last lines of " in out
    assert "fatal: data source '/nonexistent' does not exist" in out
    report = json.loads((next(tmp_path.glob("2*")) / "report.json").read_text())
    assert not report["outcome"]["failed"] and report["throughput"]["total_tokens"] > 0
