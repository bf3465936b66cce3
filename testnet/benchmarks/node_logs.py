"""Figures read from nodes' stderr logs.

    python -m testnet.benchmarks.node_logs intake PUBLISHER_LOG RECEIVER_LOG [--on-time 5]
        for each update the publisher published, how long after its publication the receiver had fetched
        its blob (from anyone): how many within --on-time seconds, and the delays
    python -m testnet.benchmarks.node_logs slots LOG [LOG ...]
        how many updates each slot held when the node closed it (share of slots by count)

`tests/node_net/test_tarpit.py` measures intake with `intake`; BENCHMARKS.md "Hostile peer, third pass" and
"Tarpit" quote these figures.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from datetime import datetime
from pathlib import Path

_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
PUBLISHED = re.compile(_STAMP + r".*published [0-9a-f]+ \(.*blob ([0-9a-f]{12})\)", re.M)
FETCHED = re.compile(_STAMP + r".*fetched blob ([0-9a-f]{12}) ", re.M)
CLOSED = re.compile(r"closed slot \d+ \([^)]*\): (\d+) updates")


def times(pattern: re.Pattern[str], log: Path) -> dict[str, datetime]:
    """blob (12 hex) → when `pattern` first matched it in `log`."""
    found: dict[str, datetime] = {}
    for stamp, blob in pattern.findall(log.read_text(errors="replace")):
        found.setdefault(blob, datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f"))
    return found


def intake_delays(publisher: Path, receiver: Path) -> list[float | None]:
    """Per published update (in publication order), seconds until the receiver fetched it (None: never)."""
    published, fetched = times(PUBLISHED, publisher), times(FETCHED, receiver)
    return [(fetched[b] - at).total_seconds() if b in fetched else None
            for b, at in sorted(published.items(), key=lambda item: item[1])]


def on_time(delays: list[float | None], limit_s: float) -> int:
    return sum(1 for d in delays if d is not None and d <= limit_s)


def slot_sizes(logs: list[Path]) -> Counter[int]:
    return Counter(int(n) for log in logs for n in CLOSED.findall(log.read_text(errors="replace")))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("intake")
    a.add_argument("publisher", type=Path)
    a.add_argument("receiver", type=Path)
    a.add_argument("--on-time", type=float, default=5.0)
    b = sub.add_parser("slots")
    b.add_argument("logs", type=Path, nargs="+")
    args = p.parse_args()
    if args.what == "intake":
        delays = intake_delays(args.publisher, args.receiver)
        shown = ", ".join("never" if d is None else f"{d:.2f}" for d in delays)
        print(f"{on_time(delays, args.on_time)} of {len(delays)} on time (≤ {args.on_time:g} s); delays s: {shown}")
    else:
        sizes = slot_sizes(args.logs)
        total = sum(sizes.values())
        print(", ".join(f"{n} updates: {k} ({k / total:.0%})" for n, k in sorted(sizes.items())), f"— {total} closes")


if __name__ == "__main__":
    main()
