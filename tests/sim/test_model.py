"""The simulator as a model: seeds, the time ledger, the renewal formula, the calibrated cells."""

import dataclasses
import math

import pytest

from protocol.errors import LocalProtocolError
from testnet.sim import Policy, SimConfig, simulate
from testnet.sim.config import SECONDS_PER_YEAR, parse_override
from testnet.sim.paper import PAPER_GOODPUT

SMALL = SimConfig(horizon_seconds=0.25 * 86400)
POLICIES = [Policy("dp"), Policy("elastic"), Policy("ours", 4)]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.key)
def test_same_seed_same_run_other_seed_other_run(policy):
    a = simulate(policy, 300_000, SMALL, seed=7)
    b = simulate(policy, 300_000, SMALL, seed=7)
    c = simulate(policy, 300_000, SMALL, seed=8)
    assert a == b
    assert a.failures > 50
    assert c.goodput != a.goodput


@pytest.mark.parametrize("policy", POLICIES + [Policy("ours", 3)], ids=lambda p: p.key)
def test_time_ledger_adds_up(policy):
    cfg = SMALL.replace(speed_sigma=0.05, learner_elastic=policy.learners != 3)
    r = simulate(policy, 200_000, cfg, seed=1)
    for g in r.groups:
        total = g.useful + g.lost + g.straggle + g.hold + g.stalled + g.out
        assert total == pytest.approx(g.chips * cfg.horizon_seconds, rel=1e-9)
        assert min(g.useful, g.lost, g.straggle, g.stalled, g.out) >= 0
    assert r.goodput == pytest.approx(sum(g.useful for g in r.groups) / (200_000 * cfg.horizon_seconds))


def test_data_parallel_follows_the_renewal_formula():
    # Up time ~ Exp(λ), then a stall of return + restart; the in-flight step is lost:
    # goodput = (1/λ − E[U mod s]) / (1/λ + return + resize).
    cfg = SimConfig(horizon_seconds=3 * 86400)
    chips = 300_000
    lam = chips / cfg.mtbi_seconds
    s = cfg.step_seconds
    lost = 1 / lam - s * math.exp(-lam * s) / (1 - math.exp(-lam * s))
    expected = (1 / lam - lost) / (1 / lam + cfg.return_seconds + cfg.resize_seconds)
    got = simulate(Policy("dp"), chips, cfg, seed=3).goodput
    assert got == pytest.approx(expected, abs=0.015)


def test_ours_with_elastic_learners_is_elastic_at_a_fraction_of_the_chips():
    # A learner of N/M chips is an elastic island of N/M chips, minus the hold of ≤ 1 step per round.
    cfg = SimConfig(horizon_seconds=86400)
    ours = simulate(Policy("ours", 8), 1_200_000, cfg, seed=2).goodput
    elastic = simulate(Policy("elastic"), 150_000, cfg, seed=2).goodput
    per_round = cfg.inner_steps / (cfg.inner_steps + cfg.max_hold_steps + cfg.sync_seconds)
    assert ours == pytest.approx(elastic * per_round, abs=0.01)


@pytest.mark.parametrize("key", ["dp", "elastic"])
def test_calibrated_constants_hit_their_cells(key):
    # return_seconds and resize_seconds were solved against these two cells (testnet.sim.calibrate).
    r = simulate(Policy.parse(key), 1_200_000, SimConfig(), seed=0)
    assert 100 * r.goodput == pytest.approx(PAPER_GOODPUT[key][1_200_000], abs=1.0)


def test_config_overrides_are_typed():
    cfg = SimConfig()
    assert cfg.mtbi_seconds == SECONDS_PER_YEAR
    assert parse_override("quorum=4", cfg) == ("quorum", 4)
    assert parse_override("island-speeds=1,0.5", cfg) == ("island_speeds", (1.0, 0.5))
    assert parse_override("learner_elastic=false", cfg) == ("learner_elastic", False)
    assert cfg.replace(mtbi_seconds=10).mtbi_seconds == 10.0
    with pytest.raises(LocalProtocolError):
        parse_override("nonsense=1", cfg)
    with pytest.raises(LocalProtocolError):
        parse_override("quorum=many", cfg)
    with pytest.raises(LocalProtocolError):
        cfg.replace(quorum=1.5)
    with pytest.raises(LocalProtocolError):
        cfg.replace(colour=1)
    with pytest.raises(LocalProtocolError):
        dataclasses.replace(cfg, step_seconds=0.0)
