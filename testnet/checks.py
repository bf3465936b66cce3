"""Up-front checks of `diloco-testnet`'s inputs, cheap and before any node starts: each failure is a
`UsageError` whose one-line message names the flag (the CLI prints it and exits 2).

Nothing here creates or writes a file: `check_writable_dir` looks at the nearest existing ancestor,
`check_data` lists the sources and sniffs the start of each file (`node.island.data.check_sources`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["UsageError", "check_data", "check_writable_dir"]


class UsageError(ValueError):
    """A bad flag value: one line, naming the flag."""


def check_writable_dir(path: Path, flag: str) -> None:
    """`path` is a folder we can write in, or one we could create (its nearest existing ancestor is a
    writable folder)."""
    try:
        existing = path
        while not existing.exists() and existing.parent != existing:  # Path("runs").parent is Path(".")
            existing = existing.parent
        if not existing.is_dir():
            raise UsageError(f"{flag} {path}: {existing} is not a folder")
    except OSError as e:  # e.g. a parent we may not look into
        raise UsageError(f"{flag} {path}: {e.strerror or e}") from None
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {existing} is not writable")


def check_data(sources: Sequence[str]) -> None:
    """What `node.island.data.load_corpus(sources)` would reject (`node.island.data.check_sources`: lists the sources
    and sniffs the start of each file, reads none whole). No sources means the embedded corpus."""
    from node.island.data import DataError, check_sources

    try:
        check_sources(sources)
    except DataError as e:
        raise UsageError(f"--data: {e}") from None
