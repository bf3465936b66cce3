"""Shared test settings. Hypothesis runs derandomized in CI so a red build is reproducible."""

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))  # shared helpers such as `waiting`

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=100)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_collection_modifyitems(config, items) -> None:
    """The files marked `slow(seconds)` first, the longest first, then the rest in collection order. With
    pytest-xdist scheduling whole files in this order (`--dist loadfile --no-loadscope-reorder`,
    pyproject.toml), the files that take minutes start at once on the workers, instead of last (xdist's
    default starts the files with the most tests first) with one worker idle while the other ends them."""
    def key(item) -> float:
        slow = item.get_closest_marker("slow")
        return -slow.args[0] if slow is not None else 0.0

    items.sort(key=key)  # stable: a file's tests stay together, in their order
