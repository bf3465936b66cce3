"""Lets the node_net tests share `node_net_helpers` (pytest runs with --import-mode=importlib), and
provides a persistent JAX compilation cache and a cluster fixture that always kills its processes."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from node_net_helpers import NodeProc, node_env  # noqa: E402

from testnet.wan import LinkSpec, WanNetwork, probe  # noqa: E402


@pytest.fixture(scope="session")
def jax_cache(request: pytest.FixtureRequest) -> Path:
    return Path(request.config.cache.mkdir("node-net-jax-cache"))


@pytest.fixture
def jax_persistent_cache(jax_cache: Path):
    """Compile through the same persistent cache as the node processes, in this process, for one test.
    Only takes effect if nothing in this process compiled before without a cache (JAX fixes it then)."""
    import jax

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")
    old = {name: getattr(jax.config, name) for name in names}
    if old["jax_compilation_cache_dir"] is None:
        for name, value in zip(names, (str(jax_cache), 0, 0)):
            jax.config.update(name, value)
    yield
    for name, value in old.items():
        jax.config.update(name, value)


@pytest.fixture
def cluster(tmp_path: Path, jax_cache: Path):
    """`cluster(name, *args, **NodeProc options)` starts a node; every node is killed when the test ends."""
    nodes: list[NodeProc] = []
    env = node_env(jax_cache)

    def start(name: str, *args: str, **options) -> NodeProc:
        node = NodeProc(tmp_path / name, env, list(args), **options)
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.kill()


@pytest.fixture
def hosts():
    """`hosts(n)`: n namespaces with their own addresses, removed when the test ends; `hosts(n, "25ms")`
    joins them by emulated links of that spec (`testnet.wan.LinkSpec.parse`: rate, one-way delay, loss)."""
    made: list[WanNetwork] = []

    def make(n: int, link: str | None = None) -> WanNetwork:
        spec = LinkSpec(rate_mbit=None, delay_ms=0.0) if link is None else LinkSpec.parse(link)
        support = probe(spec)
        if not support.available:
            pytest.skip(f"separate hosts need network namespaces: {support.reason}")
        net = WanNetwork(n, spec, support.qdisc)
        made.append(net)
        net.setup()
        return net

    yield make
    for net in made:
        net.teardown()
