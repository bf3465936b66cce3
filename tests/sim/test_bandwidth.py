"""The bandwidth model: closed forms, the paper's 198 vs 0.84 Gbit/s example, measured-bytes comparison."""

import dataclasses

import pytest

from protocol.errors import LocalProtocolError
from testnet.sim import BandwidthSetting, compare_measured, estimate, paper_example
from testnet.sim.paper import PAPER_BANDWIDTH


def test_data_parallel_is_a_ring_all_reduce_of_fp32_gradients():
    s = BandwidthSetting(params=1e9, step_seconds=2.0, inner_steps=100, islands=4)
    e = estimate(s)
    assert e.dp_bytes_per_step == pytest.approx(2 * 3 / 4 * 4 * 1e9)
    assert e.dp_gbps == pytest.approx(e.dp_bytes_per_step * 8 / 2.0 / 1e9)


def test_ours_ring_and_gossip():
    ring = BandwidthSetting(params=1e9, step_seconds=1.0, inner_steps=50, bits=4, islands=8, topology="ring")
    e = estimate(ring)
    assert e.ours_bytes_per_step == pytest.approx(2 * 7 / 8 * 1e9 * 0.5 / 50)
    assert e.ratio == pytest.approx(32 / 4 * 50)  # (dp_bits / bits) · H, whatever the model size
    gossip = estimate(dataclasses.replace(ring, topology="gossip"))
    assert gossip.ours_bytes_per_step == pytest.approx(7 * 1e9 * 0.5 / 50)
    assert gossip.ours_bytes_per_step / e.ours_bytes_per_step == pytest.approx(8 / 2)  # N/2


def test_paper_example_is_reproduced():
    setting, h_exact = paper_example()
    e = estimate(setting)
    assert setting.islands == PAPER_BANDWIDTH["islands"]
    assert e.dp_gbps == pytest.approx(PAPER_BANDWIDTH["dp_gbps"], rel=1e-9)
    assert e.ours_gbps == pytest.approx(PAPER_BANDWIDTH["ours_gbps"], rel=0.03)
    assert e.ratio == pytest.approx(235, rel=0.03)
    assert 29 <= h_exact <= 30
    # the ratio does not depend on the assumed model size, only the step time does
    other, _ = paper_example(params=10e9)
    assert estimate(other).ratio == pytest.approx(e.ratio)
    assert other.step_seconds == pytest.approx(4 * setting.step_seconds)


def test_measured_bytes_against_the_model():
    s = BandwidthSetting(params=1e8, step_seconds=0.5, inner_steps=20, bits=4, islands=4)
    predicted = estimate(s).ours_bytes_per_step
    c = compare_measured(predicted * 1.04, s)
    assert c.measured_over_predicted == pytest.approx(1.04)
    assert c.measured_ratio_vs_dp == pytest.approx(estimate(s).ratio / 1.04)
    with pytest.raises(LocalProtocolError):
        compare_measured(0.0, s)


@pytest.mark.parametrize("bad", [dict(params=0), dict(inner_steps=0), dict(islands=1), dict(topology="star")])
def test_bad_settings_are_refused(bad):
    args = dict(params=1e9, step_seconds=1.0, inner_steps=10) | bad
    with pytest.raises(LocalProtocolError):
        BandwidthSetting(**args)
