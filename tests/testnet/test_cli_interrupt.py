"""Tier (c): Ctrl-C during the data-parallel baseline. A real SIGINT to a real `diloco-testnet` process
(fake node processes, the real baseline child, which trains with JAX) still leaves the report of what
ran, and no process behind."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import trio
from testnet_helpers import FAKE_NODE, wait_for

DRIVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from testnet.cli import main
    from testnet_helpers import fake_argv
    sys.exit(main(["--minutes", "0.08", "--out", {out!r}, "--progress", "plain", "--stop-grace", "1",
                   "--poll-interval", "0.2", "--eval-batches", "1", "--solo-seconds", "0"],
                  argv_builder=lambda specs: fake_argv("--tokens-per-step", "100000")))
""")


def _baseline_children(run_dir: Path) -> list[int]:
    """Live processes whose command line is this run's baseline child."""
    out = str(run_dir / "baseline.json")
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, PermissionError, NotADirectoryError, ProcessLookupError):
            continue
        if b"testnet.baseline_run" in argv and out.encode() in argv:
            pids.append(int(proc.name))
    return pids


async def test_ctrl_c_during_the_baseline_writes_the_report_of_what_ran(tmp_path: Path) -> None:
    script = DRIVER.format(tests=str(Path(FAKE_NODE).parent), out=str(tmp_path))
    output = tmp_path / "output.txt"
    root = str(Path(__file__).parents[2])
    with open(output, "wb") as out:
        driver = await trio.lowlevel.open_process(
            [sys.executable, "-c", script], stdout=out, stderr=out,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([root, str(Path(__file__).parents[1])])})
    try:
        with trio.fail_after(150):
            # the baseline has compiled and measured its first point: its progress line is on the terminal
            await wait_for(lambda: "data-parallel baseline: step 0/" in output.read_text() or driver.poll() is not None,
                           140, "the baseline's first progress line", interval=0.1)
            assert driver.returncode is None, output.read_text()
            driver.send_signal(signal.SIGINT)
            assert await driver.wait() == 130
    finally:
        if driver.returncode is None:
            driver.kill()
    text = output.read_text()
    run_dir = next(tmp_path.glob("2*"))
    assert "interrupted during the baseline stage; report of what ran:" in text
    md = (run_dir / "report.md").read_text()
    assert "**Interrupted** during the data-parallel baseline" in md
    report = json.loads((run_dir / "report.json").read_text())
    base = report["baseline_run"]
    assert base["state"] == "interrupted" and base["steps_done"] < base["steps"]
    assert report["run"]["stopped_during"] == "baseline" and not report["run"]["interrupted"]
    assert report["goodput"]["value"] is not None, "the nodes' figures are there"
    assert (run_dir / "loss.png").stat().st_size > 10_000
    assert _baseline_children(run_dir) == [], "the baseline child was stopped"
