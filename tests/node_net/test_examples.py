"""Tier (c): the library API's examples (`examples/`) as their users run them — two real processes of each,
through the same node as `diloco-node` (`diloco.run` -> `node.cli.main`): the second joins the first
mid-run, both train the example's own model, the held-out loss falls, and both stop with the same ledger
and parameter digests. No fixed sleeps: every wait is a stdout line or a log pattern with a timeout."""

from __future__ import annotations

import re

import pytest

from node_net_helpers import REPO

# --slowdown stretches every inner step (a sleep, no CPU) so that the second node arrives while the first
# still trains (the first node drains, waiting for it, after its own rounds); --eval-budget 1 evaluates every
# round whatever it costs.
COMMON = ["--inner-steps", "20", "--heartbeat", "0.3", "--eval-every", "1", "--eval-budget", "1",
          "--slowdown", "40", "--drain-timeout", "30"]
START_S = 120.0


def _evaluations(node) -> list[float]:
    return [float(x) for x in re.findall(r"held-out ([0-9.]+) nats/example", node.log_path.read_text())]


@pytest.mark.parametrize("example", ["mlp_spirals.py", "nnx_bars.py"])
def test_two_processes_train_the_example_and_agree(cluster, example: str) -> None:
    program = (str(REPO / "examples" / example),)
    # a trains 7 rounds, b 5: a is still training when b arrives (b is up within a round or two of a's start)
    a = cluster("a", *COMMON, "--max-rounds", "7", program=program, model_args=())
    a.wait_listening(START_S)
    b = cluster("b", *COMMON, "--max-rounds", "5", "--peers", a.gossip, program=program, model_args=())
    b.wait_listening(START_S)
    lines = [node.wait_line("STOPPED ", 180.0) for node in (a, b)]
    assert [node.wait_exit(30.0) for node in (a, b)] == [0, 0]
    assert lines[0] == lines[1], lines
    from_b = re.findall(r"update \w+ from " + b.peer_id, a.log_path.read_text())
    assert len(from_b) >= 3, "the first node applied the second's updates while both trained"
    first_node, joiner = _evaluations(a), _evaluations(b)
    assert len(first_node) >= 3 and len(joiner) >= 3, (first_node, joiner)
    assert first_node[-1] < 0.5 * first_node[0], (example, first_node)  # the run's loss at least halved
    assert joiner[-1] < 0.8 * joiner[0], (example, joiner)  # and fell while the joiner took part


def test_the_model_flags_of_diloco_node_are_refused(tmp_path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, str(REPO / "examples" / "mlp_spirals.py"), "--run-id", "x", "--key",
                           str(tmp_path / "k"), "--model", "small"], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("diloco-node: error: --model choose the byte-level model of "
                                                    "diloco-node; this program trains its own (mlp-spirals)")
