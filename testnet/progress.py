"""Live progress of a testnet: a `rich` table on a terminal, plain periodic lines otherwise.

Per node: state, slot, round, training loss, held-out bits per byte, tokens/s, peers, MB sent and
received, updates rejected. Everything comes from the supervisor's handles (the last good `/status`
of each node); any field may be missing or null (a node that is down, an older node version) and
shows as "-". Tokens/s is measured here from successive `tokens` readings of the same process.

`RunProgress.notify` is the supervisor's `notify` callback: events (kills, restarts, warnings) are printed
above the table, or as plain lines; `RunProgress.refresh` is its `on_poll` callback. Use it as a context
manager around the run (`with RunProgress() as p:`) so the live table is started and stopped.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

__all__ = ["COLUMNS", "RunProgress", "node_cells"]

COLUMNS = ("node", "state", "slot", "round", "loss", "bpb", "tok/s", "peers", "sent MB", "recv MB", "rej")
"""Column names; `bpb` is the last held-out bits per byte, `rej` the updates rejected, `node` carries
`rN` when the node runs its N-th restarted process."""


def _field(status: dict[str, Any] | None, key: str) -> Any:
    return None if status is None else status.get(key)


def _fmt(value: Any, spec: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return format(value, spec)


def _rejected(value: Any) -> str:
    if not isinstance(value, dict):
        return "-"
    total = sum(v for v in value.values() if isinstance(v, int) and not isinstance(v, bool))
    return str(total)


def node_cells(index: int, supervisor_state: str, inc: int, status: dict[str, Any] | None,
               tokens_per_s: float | None) -> list[str]:
    """The row of one node, as strings in `COLUMNS` order. Never raises on odd or missing fields."""
    node_state = _field(status, "state")
    state = node_state if supervisor_state == "up" and isinstance(node_state, str) else supervisor_state
    if supervisor_state == "up" and _field(status, "draining") is True:
        state = "draining"
    peers = _field(status, "peers")
    mb = 1e-6
    sent, received = _field(status, "bytes_sent"), _field(status, "bytes_received")
    return [
        f"{index} r{inc}" if inc > 0 else str(index), state,
        _fmt(_field(status, "slot"), "d"), _fmt(_field(status, "round"), "d"),
        _fmt(_field(status, "loss"), ".2f"), _fmt(_field(status, "eval_loss"), ".2f"),
        _fmt(tokens_per_s, ",.0f"),
        str(len(peers)) if isinstance(peers, list) else "-",
        _fmt(sent * mb if isinstance(sent, (int, float)) else None, ".1f"),
        _fmt(received * mb if isinstance(received, (int, float)) else None, ".1f"),
        _rejected(_field(status, "updates_rejected")),
    ]


class RunProgress:
    """Renders the handles of a `Supervisor` (anything with `.spec.index`, `.state`, `.inc`, `.status`).

    `mode`: `rich` (live table), `plain` (a block of lines every `plain_every` seconds), `quiet`
    (events only), or `auto` (rich on a terminal, plain otherwise).
    """

    def __init__(self, mode: str = "auto", *, out: TextIO | None = None, plain_every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, width: int | None = None) -> None:
        self.out = out or sys.stdout
        if mode == "auto":
            mode = "rich" if self.out.isatty() else "plain"
        if mode not in ("rich", "plain", "quiet"):
            raise ValueError(f"progress mode must be auto, rich, plain or quiet, got {mode!r}")
        self.mode, self.plain_every, self.clock = mode, plain_every, clock
        self.console = Console(file=self.out, highlight=False, width=width)
        self._live: Live | None = None
        self._start = clock()
        self._last_plain = -plain_every
        self._tokens: dict[int, tuple[int, float, float]] = {}  # node -> (inc, t, tokens)
        self._rate: dict[int, float | None] = {}

    def notify(self, text: str) -> None:
        line = f"[{self.clock() - self._start:6.1f}s] {text}"
        if self._live is not None:
            self._live.console.print(line, markup=False)
        else:
            print(line, file=self.out, flush=True)

    def rows(self, handles: Sequence[Any]) -> list[list[str]]:
        """Update the tokens/s estimates from the handles and return one row of cells per node."""
        now = self.clock()
        out = []
        for h in handles:
            i = h.spec.index
            tokens = _field(h.status, "tokens")
            if h.state != "up" or not isinstance(tokens, (int, float)):
                self._rate[i] = None
            else:
                last = self._tokens.get(i)
                if last is None or last[0] != h.inc:  # first reading of this process
                    self._rate[i] = None
                    self._tokens[i] = (h.inc, now, float(tokens))
                elif tokens != last[2] and now > last[1]:
                    self._rate[i] = (tokens - last[2]) / (now - last[1])
                    self._tokens[i] = (h.inc, now, float(tokens))
            out.append(node_cells(i, h.state, h.inc, h.status, self._rate.get(i)))
        return out

    def table(self, rows: list[list[str]]) -> Table:
        table = Table(title=f"diloco testnet - {self.clock() - self._start:.0f} s", title_justify="left",
                      box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True)
        for name in COLUMNS:
            table.add_column(name, justify="left" if name in ("node", "state") else "right", no_wrap=True,
                             min_width=8 if name == "state" else None)
        for row in rows:
            table.add_row(*row)
        return table

    def plain_lines(self, rows: list[list[str]]) -> list[str]:
        elapsed = self.clock() - self._start
        return [f"[{elapsed:6.1f}s] " + " ".join(f"{name}={cell}" for name, cell in zip(COLUMNS, row) if cell != "-")
                for row in rows]

    def refresh(self, handles: Sequence[Any]) -> None:
        rows = self.rows(handles)
        if self.mode == "rich" and self._live is not None:
            self._live.update(self.table(rows), refresh=True)
        elif self.mode == "plain" and self.clock() - self._last_plain >= self.plain_every:
            self._last_plain = self.clock()
            for line in self.plain_lines(rows):
                print(line, file=self.out, flush=True)

    def __enter__(self) -> RunProgress:
        """Start the live table (rich mode); plain and quiet modes need nothing."""
        if self.mode == "rich":
            self._live = Live(console=self.console, auto_refresh=False, transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
