"""Tier (a), and one in-process run that trains: the outer rule is a seam. Two rules defined outside the
package (tests/plugins.py) and registered by name: plain SGD (linear, so late updates fold in closed form) and a sign
step (not linear, so the ledger replays its window instead). Replicas that receive the same updates in any
order, closing slots whenever they like, hold the same bits under either rule, and a small in-memory network
of real learners (real JAX training, one ledger each, their updates in the codec plugged beside the rules)
trains with the plugged rule and ends in agreement."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
from plugins import PlainSGD  # registers the plugged rules and codec (tests/plugins.py)

from protocol.errors import LocalProtocolError
from protocol.ledger import Ledger, LedgerConfig, UpdateMeta
from protocol.ledger.rules import register_rule


SHAPES = {"emb": (6,), "w": (4, 5), "b": (3,)}


def _config(rule: str, **kw: object) -> LedgerConfig:
    return LedgerConfig(window=3, outer_rule=rule, embeddings=frozenset({"emb"}), **kw)


def _updates(seed: int, slots: int, origins: int = 3) -> list[tuple[UpdateMeta, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(seed)
    out = []
    for r in range(1, slots + 1):
        for o in range(origins):
            if rng.random() < 0.8:
                meta = UpdateMeta(hashlib.sha256(f"{seed}/{o}/{r}".encode()).digest(), f"peer{o}", r - 1, r - 1,
                                  int(rng.integers(1, 1000)), 10)
                out.append((meta, {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}))
    return out


def _params(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def _in_order(config: LedgerConfig, seed: int, slots: int, updates: list) -> Ledger:
    ledger = Ledger(_params(seed), config)
    for r in range(1, slots + 1):
        for meta, deltas in updates:
            if meta.target_slot == r:
                ledger.add(meta, deltas)
        ledger.close_slot()
    return ledger


def _shuffled(config: LedgerConfig, seed: int, slots: int, updates: list, rnd: random.Random) -> Ledger:
    """Deliver in a random order and close slots at random moments, never letting an undelivered update's
    slot leave the window (so many updates arrive after their slot closed: late folds)."""
    ledger = Ledger(_params(seed), config)
    pending = list(updates)
    rnd.shuffle(pending)
    while pending or ledger.slot < slots:
        lowest = min((m.target_slot for m, _ in pending), default=slots + config.window + 1)
        can_close = ledger.slot < slots and ledger.slot + 1 - config.window < lowest
        if pending and (not can_close or rnd.random() < 0.5):
            ledger.add(*pending.pop())
        else:
            ledger.close_slot()
    return ledger


def test_the_fingerprint_names_a_rule_other_than_nesterov_and_an_unknown_rule_is_refused() -> None:
    assert "outer_rule" not in LedgerConfig().fingerprint()  # Nesterov runs keep the fingerprint they had
    plugged = _config("test-sign")
    assert plugged.fingerprint()["outer_rule"] == "test-sign"
    assert LedgerConfig.from_fingerprint(plugged.fingerprint()) == plugged
    assert LedgerConfig.from_fingerprint(LedgerConfig().fingerprint()).outer_rule == "nesterov"
    with pytest.raises(LocalProtocolError, match="unknown outer rule 'adam-someday'"):
        LedgerConfig(outer_rule="adam-someday")
    with pytest.raises(LocalProtocolError, match="already registered"):
        register_rule("nesterov", lambda config: PlainSGD())


@pytest.mark.parametrize("rule", ["test-plain-sgd", "test-sign"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replicas_of_a_plugged_rule_agree_whatever_the_order(rule: str, seed: int) -> None:
    config, slots = _config(rule), 7
    updates = _updates(seed, slots)
    reference = _in_order(config, seed, slots, updates)
    rnd = random.Random(seed)
    replicas = [_shuffled(config, seed, slots, updates, rnd) for _ in range(3)]
    assert sum(r.counters["folded-late"] for r in replicas) > 0
    for replica in replicas:
        assert replica.ledger_digest() == reference.ledger_digest()
        assert replica.params_digest() == reference.params_digest()  # the canonical state, bit for bit
        working, canonical = replica.params(np.float64), reference.params(np.float64)
        if config.outer_rule == "test-sign":  # every late update replayed the window: no fold rounding at all
            assert all(np.array_equal(working[k], canonical[k]) for k in SHAPES)
        else:  # closed-form folds round in arrival order (float32)
            assert max(float(np.max(np.abs(working[k] - canonical[k]))) for k in SHAPES) < 1e-5
    nesterov = _in_order(_config("nesterov"), seed, slots, updates)
    assert nesterov.params_digest() != reference.params_digest()  # the plugged rule is the one that stepped


@pytest.mark.slow
def test_an_in_memory_network_trains_with_a_plugged_rule_and_codec_and_its_replicas_agree() -> None:
    from node.island.bytelm import byte_lm_task
    from node.island.config import preset
    from testnet.benchmarks.quality import Simulation

    task = byte_lm_task(preset("tiny"), 16)
    config = LedgerConfig(window=8, outer_rule="test-plain-sgd", embeddings=task.model.embeddings)
    sim = Simulation("eager", workers=3, inner_steps=10, speeds=[1.0, 1.0, 0.7], latency=4, codec="test-fp16", seed=3,
                     outer_lr=1.0, task=task, ledger_config=config)
    before = sim.learners[0].loop.evaluate(sim.heldout, params=sim.learners[0].ledger.params())
    result = sim.run(rounds=4)
    ledgers = [ln.ledger for ln in sim.learners]
    assert {led.config.outer_rule for led in ledgers} == {"test-plain-sgd"}
    assert {str(ln.feedback.codec) for ln in sim.learners} == {"test-fp16"}
    assert len({(led.slot, led.ledger_digest(), led.params_digest()) for led in ledgers}) == 1
    assert sum(led.counters["folded-late"] for led in ledgers) > 0
    assert result["bpb"] < before  # it trained


def test_a_joiner_takes_the_runs_rule_and_a_node_refuses_a_rule_nobody_registered() -> None:
    from pathlib import Path

    from node.adopt import adopted, own_run_config
    from node.island.config import ConfigError
    from node.settings import NodeSettings

    run_fields = dict(run_id="r", key_path=Path("unused.key"))
    run = own_run_config(NodeSettings(**run_fields, outer_rule="test-sign"), "")
    assert 'outer.outer_rule="test-sign"' in run
    taken = adopted(NodeSettings(**run_fields, peers=("127.0.0.1:7000",)), run, "",
                    pinned={"run_id", "key_path", "peers"})
    assert taken.outer_rule == "test-sign" and own_run_config(taken, "") == run
    with pytest.raises(ConfigError, match="--outer-rule"):
        adopted(NodeSettings(**run_fields, outer_rule="test-plain-sgd"), run, "", pinned={"outer_rule"})
    nesterov_run = own_run_config(NodeSettings(**run_fields), "")
    with pytest.raises(ConfigError, match="--outer-rule"):
        adopted(NodeSettings(**run_fields, outer_rule="test-sign"), nesterov_run, "", pinned={"outer_rule"})
    with pytest.raises(ConfigError, match="--outer-rule 'adam-someday' is not a registered outer rule"):
        NodeSettings(**run_fields, outer_rule="adam-someday")
