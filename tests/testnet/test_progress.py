"""Tier (a): progress rendering copes with missing and odd fields; tokens/s comes from successive readings."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from testnet.progress import COLUMNS, RunProgress, node_cells


@dataclass
class Spec:
    index: int


@dataclass
class Handle:
    spec: Spec
    state: str = "up"
    inc: int = 0
    status: dict | None = field(default_factory=dict)


FULL = {"state": "training", "slot": 12, "round": 11, "loss": 2.345678, "eval_loss": 3.5, "tokens": 1000,
        "peers": ["a", "b"], "bytes_sent": 2_500_000, "bytes_received": 1_000_000,
        "updates_rejected": {"bad_signature": 2, "malformed": 1}}


def test_full_row() -> None:
    cells = node_cells(0, "up", 0, FULL, 1234.5)
    assert dict(zip(COLUMNS, cells)) == {"node": "0", "state": "training", "slot": "12", "round": "11", "loss": "2.35",
                                         "bpb": "3.50", "tok/s": "1,234", "peers": "2", "sent MB": "2.5",
                                         "recv MB": "1.0", "rej": "3"}
    assert node_cells(3, "up", 2, FULL | {"draining": True}, None)[:2] == ["3 r2", "draining"]


def test_missing_null_and_wrong_types_show_as_dash() -> None:
    for status in (None, {}, {k: None for k in FULL},
                   {"slot": "7", "loss": [1], "peers": 3, "bytes_sent": "x", "updates_rejected": [], "round": True}):
        cells = node_cells(1, "up", 0, status, None)
        assert len(cells) == len(COLUMNS)
        assert cells[2:] == ["-"] * (len(COLUMNS) - 2)
    assert node_cells(2, "down", 1, None, None)[:2] == ["2 r1", "down"]
    assert node_cells(2, "up", 0, {"state": 5}, None)[1] == "up"


def test_tokens_per_second_from_successive_readings() -> None:
    now = [0.0]
    progress = RunProgress("quiet", out=io.StringIO(), clock=lambda: now[0])
    h = Handle(Spec(0), status={"tokens": 1000})
    assert progress.rows([h])[0][6] == "-"
    now[0], h.status = 2.0, {"tokens": 5000}
    assert progress.rows([h])[0][6] == "2,000"
    now[0], h.status = 2.5, {"tokens": 5000}  # no new reading yet: keep the last rate
    assert progress.rows([h])[0][6] == "2,000"
    h.inc, now[0], h.status = 1, 3.0, {"tokens": 10}  # a new process: counters restart, no rate yet
    assert progress.rows([h])[0][6] == "-"
    now[0], h.status = 4.0, {"tokens": 1010}
    assert progress.rows([h])[0][6] == "1,000"
    h.state = "down"
    assert progress.rows([h])[0][6] == "-"


def test_plain_mode_prints_periodically_and_events_immediately() -> None:
    out, now = io.StringIO(), [0.0]
    progress = RunProgress("plain", out=out, plain_every=10, clock=lambda: now[0])
    handles = [Handle(Spec(0), status=FULL), Handle(Spec(1), state="down", status=None)]
    with progress:
        progress.refresh(handles)
        now[0] = 5
        progress.refresh(handles)  # too soon: nothing
        progress.notify("killed node 1")
        now[0] = 10
        progress.refresh(handles)
    lines = out.getvalue().splitlines()
    assert len(lines) == 5
    assert "node=0 state=training slot=12" in lines[0] and "node=1 state=down" in lines[1]
    assert lines[2] == "[   5.0s] killed node 1"


def test_rich_table_renders() -> None:
    out = io.StringIO()
    progress = RunProgress("rich", out=out, width=80)  # a plain 80-column terminal: nothing may be cut
    big = FULL | {"slot": 12345, "round": 9999, "bytes_sent": 12_345_678_901, "bytes_received": 9_999_999_999}
    handles = [Handle(Spec(0), status=big, inc=3), Handle(Spec(1), status=None, state="starting")]
    progress.console.print(progress.table(progress.rows(handles)))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    assert "training" in text and "starting" in text and "0 r3" in text and "12345.7" in text
    with progress:  # a live table on a non-terminal stream must not crash either
        progress.refresh(handles)
        progress.notify("restarted node 1")
    assert "restarted node 1" in out.getvalue()
