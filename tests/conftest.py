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


# ---- the three tiers of STYLE.md as markers, and `slow` ------------------------------------------------
#
#   pure       sans-IO cores in memory (tier a)
#   loopback   trio tests: loopback sockets, a mock clock (tier b)
#   processes  real processes: diloco-node, the testnet, jax.distributed islands, emulated devices (tier c)
#   slow       every `processes` test, and the in-process tests that train or move gigabytes for seconds
#
# A test's tier is read from what it uses (its fixtures, whether it is a trio test, whether its own code starts
# a process); a mark on the test itself (`@pytest.mark.processes`, `pytestmark`) wins. `pytest -m "not slow"`
# is the fast subset (under a minute on 2 cores); `pytest -m pure` the sans-IO tier alone.

import inspect  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402

TIERS = ("pure", "loopback", "processes")
PROCESS_FIXTURES = {"cluster", "hosts", "node_net_cluster"}
# code that starts a process: a subprocess, a diloco-node (NodeProc), a testnet run, a helper named spawn
STARTS_PROCESS = re.compile(r"subprocess|Popen|NodeProc|\bspawn\(|run_testnet|sys\.executable")


def pytest_configure(config: pytest.Config) -> None:
    for name, what in (("pure", "tier (a): sans-IO cores in memory"), ("loopback", "tier (b): trio on loopback"),
                       ("processes", "tier (c): real processes"),
                       ("slow", "seconds or more: the processes tier and heavy in-process tests")):
        config.addinivalue_line("markers", f"{name}: {what}")


def _tier(item: pytest.Item) -> str:
    own = [m.name for m in item.iter_markers() if m.name in TIERS]
    if own:
        return own[0]
    if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "processes"
    function = getattr(item, "function", None)
    try:
        source = inspect.getsource(function) if function is not None else ""
    except (OSError, TypeError):
        source = ""
    if STARTS_PROCESS.search(source):
        return "processes"
    if function is not None and inspect.iscoroutinefunction(function):
        return "loopback"
    return "pure"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = _tier(item)
        item.add_marker(tier)
        if tier == "processes":
            item.add_marker("slow")
