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
    # the run ends at slot 12; b takes that from a: a is still training when b arrives and trains at least
    # three rounds with it (b is up within a few rounds of a's start)
    a = cluster("a", *COMMON, "--max-rounds", "12", program=program, model_args=())
    a.wait_listening(START_S)
    b = cluster("b", *COMMON, "--peers", a.gossip, program=program, model_args=())
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


def test_a_joiner_with_another_head_count_is_refused_naming_the_field(cluster) -> None:
    """The same tensors, the same parameter count, another model: the run configuration's traced computation
    (`model.computation`) tells them apart, for a joiner that reads the run's settings (a one-line error, exit
    2) and at the handshake for one that does not (`config_mismatch`, both sides naming the field)."""
    program = (str(REPO / "examples" / "char_transformer.py"),)
    common = ["--inner-steps", "5", "--heartbeat", "0.3", "--eval-every", "0", "--slowdown", "20"]
    a = cluster("a", *common, program=program, model_args=())
    a.wait_listening(START_S)
    adopting = cluster("adopting", *common, "--heads", "2", "--peers", a.gossip, program=program, model_args=())
    assert adopting.wait_exit(START_S) == 2
    error = adopting.log_path.read_text().strip().splitlines()[-1]
    assert error.startswith("diloco-node: error: --peers:") and "model.computation" in error, error
    handshake = cluster("handshake", *common, "--heads", "2", "--no-adopt", "--peers", a.gossip, program=program,
                        model_args=())
    handshake.wait_listening(START_S)
    a.wait_log(r"config_mismatch.*model\.computation", 60.0)
    line = next(ln for ln in a.log_path.read_text().splitlines() if "config_mismatch" in ln)
    assert re.findall(r"([a-z_]+\.[a-z_]+): ours", line) == ["model.computation"], line
    handshake.wait_log(r"config_mismatch.*model\.computation", 60.0)
    assert handshake.peer_id not in a.status()["peers"]
