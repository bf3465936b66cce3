"""Rewriting a snapshot document as an older writer stored it (for the tests that read old versions)."""

import numpy as np


def as_float64_base(doc: dict, split: bool = False) -> None:
    """The base state as versions 1 to 4 stored it: float64 (with ``split``, each array a list of bins of
    16 bytes, as version 4 wrote them)."""
    for field in ("base_params", "base_momentum"):
        for name, raw in doc[field].items():
            raw = b"".join(raw) if isinstance(raw, list) else raw
            wide = np.frombuffer(raw, "<f4").astype("<f8").tobytes()
            doc[field][name] = [wide[i : i + 16] for i in range(0, len(wide), 16)] if split else wide
