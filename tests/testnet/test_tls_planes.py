"""Tier (a): the TLS-planes benchmark's command line and its serving child's command parsing
(`testnet.benchmarks.tls_planes`, `testnet.benchmarks.tls_planes_remote`); the runs themselves are benchmarks."""

from __future__ import annotations

from pathlib import Path

import pytest

from testnet.benchmarks.tls_planes import parse, summarize
from testnet.benchmarks.tls_planes_remote import COMMANDS, parse_command


def test_commands_parse_to_their_typed_arguments() -> None:
    assert parse_command("donors 10.213.4.2 /tmp/x 16\n") == ("donors", ("10.213.4.2", Path("/tmp/x"), 16))
    assert parse_command("meshed tls 12D3KooW 20") == ("meshed", ("tls", "12D3KooW", 20.0))
    assert parse_command("draw cleartext 16 4194304") == ("draw", ("cleartext", 16, 4 << 20))
    assert parse_command("mark") == ("mark", ())
    assert set(COMMANDS) >= {"donors", "publishers", "meshed", "draw", "mark", "publish", "cpu", "forget", "quit"}


@pytest.mark.parametrize("line", ["", "teleport", "mark now", "draw tls 16", "draw tls many 4",
                                  "publish quic", "donors 127.0.0.1 /tmp 1.5"])
def test_a_bad_command_is_refused(line: str) -> None:
    with pytest.raises(ValueError):
        parse_command(line)


def test_link_implies_split_and_a_bad_link_is_an_error() -> None:
    assert not parse([]).split and parse([]).link is None
    assert parse(["--split"]).split
    args = parse(["--link", "2.5gbit,20ms"])
    assert args.split and args.link == "2.5gbit,20ms"
    with pytest.raises(SystemExit):
        parse(["--link", "fast"])


def test_the_summary_reports_each_side_when_there_are_two() -> None:
    gib = 1 << 30
    row = {"seconds": 2.0, "bytes": gib, "machine_cpu_s": 3.0}
    runs = {"tls": [dict(row, cpu_s=1.2, cpu_remote_s=0.9)], "cleartext": [dict(row, seconds=1.0, cpu_s=1.0,
                                                                               cpu_remote_s=0.5)]}
    s = summarize(runs)
    assert s["tls"]["cpu_s_per_gib"] == pytest.approx(2.1)
    assert (s["tls"]["cpu_s_per_gib_receiver"], s["tls"]["cpu_s_per_gib_sender"]) == pytest.approx((1.2, 0.9))
    assert s["ratio_cpu_per_gib_sender"] == pytest.approx(1.8) and s["ratio_seconds"] == pytest.approx(2.0)
    in_process = summarize({k: [{x: y for x, y in r.items() if x != "cpu_remote_s"} for r in v]
                            for k, v in runs.items()})
    assert in_process["tls"]["cpu_s_per_gib"] == pytest.approx(1.2) and "cpu_s_per_gib_sender" not in in_process["tls"]
