"""Tier (a): the WAN benchmark's arithmetic (`testnet.bench_wan`): the scaled link rate and the figures drawn
from a testnet report, its baseline's curve and a data-parallel record."""

from __future__ import annotations

import pytest

from testnet.bench_wan import figures, ring_bytes, scaled_rate_mbit


def test_the_link_rate_makes_the_all_reduce_kappa_times_the_compute() -> None:
    assert ring_bytes(115_008, 3) == pytest.approx(613_376)
    rate = scaled_rate_mbit(115_008, 3, 0.05, 79.2)
    assert rate == pytest.approx(613_376 * 8 / (79.2 * 0.05) / 1e6)
    assert ring_bytes(115_008, 3) * 8 / (rate * 1e6) == pytest.approx(79.2 * 0.05)  # seconds per all-reduce


def _report() -> dict:
    curves = {"0": [[0, 5.0, 7.0], [100, 20.0, 3.0], [200, 40.0, 2.5]],
              "1": [[0, 5.0, 7.0], [100, 25.0, 2.9], [200, 45.0, 2.6]]}
    return {"run": {"nodes": 2, "model": "tiny", "param_count": 1000, "inner_steps": 100, "duration_s": 50.0,
                    "wan": "emulated"},
            "curves": {"nodes": curves},
            "communication": {"bytes_sent": 1_000_000, "bytes_per_node_step": 50.0},
            "quality": {"at_equal_tokens": {"ratio": 1.02}}}


def test_figures_time_to_target_speedup_and_bytes() -> None:
    baseline = {"points": [[0, 0, 7.0], [10, 100, 3.0], [20, 200, 2.6], [30, 300, 2.4]]}
    dp = {"points": [[0.0, 0, 0, 7.0], [8.0, 4, 40, 4.0], [16.0, 8, 80, 3.5]], "step_seconds": [2.0, 2.0],
          "link_bytes_sent": {"n0": 16_000, "n1": 16_000}}
    f = figures(_report(), baseline, dp, step_s=0.1, rate_mbit=1.0, one_way_ms=40.0, kappa=80.0)
    assert f["target_bpb"] == 2.6  # the worst node's last evaluation: every node reached it
    assert f["ours_time_to_target_s"] == 45.0  # node 1 reached it last
    assert f["dp_steps_to_target"] == 20 and f["dp_time_to_target_s"] == 40.0
    assert f["speedup_time_to_target"] == pytest.approx(40.0 / 45.0)
    ideal = 0.1 + ring_bytes(1000, 2) * 8 / 1e6 + 2 * 1 * 0.040
    assert f["dp_ideal_step_s"] == pytest.approx(ideal)
    assert f["dp_bytes_per_node_step"] == 2000 and f["dp_bytes_per_node_s"] == 1000
    assert f["ours_bytes_per_node_s"] == pytest.approx(1_000_000 / 2 / 50.0)
    assert f["dp_mbit_to_keep_busy"] / f["ours_mbit_to_keep_busy"] == pytest.approx(2000 / 50)
    assert f["rtt_ms"] == 80.0 and f["rate_mbit"] == 1.0


def test_a_target_the_baseline_never_reached_says_so() -> None:
    baseline = {"points": [[0, 0, 7.0], [10, 100, 3.0]]}
    dp = {"points": [[0.0, 0, 0, 7.0], [8.0, 4, 40, 4.0]], "step_seconds": [2.0],
          "link_bytes_sent": {"n0": 1, "n1": 1}}
    f = figures(_report(), baseline, dp, step_s=0.1, rate_mbit=1.0, one_way_ms=40.0, kappa=80.0)
    assert f["dp_steps_to_target"] is None and f["speedup_time_to_target"] is None


def test_the_cold_tcp_bound_is_slow_start_then_the_rate() -> None:
    from testnet.benchmarks.wan_blobs import INITIAL_WINDOW, cold_tcp_seconds

    # a path whose bandwidth × delay fits in the first windows: the setup round trips, then the rate
    assert cold_tcp_seconds(10 << 20, 1e9, 1e-4, 4, tls=False) == pytest.approx(2e-4 + (10 << 20) * 8 / 1e9)
    # one window's worth: setup, then its bytes at the rate, no round trip waited for
    assert cold_tcp_seconds(INITIAL_WINDOW, 1e9, 0.08, 1, tls=True) == pytest.approx(0.24 + INITIAL_WINDOW * 8 / 1e9)
    # 100 MiB at 1 Gbit/s and 80 ms: slow start holds it near half the rate; 1 GiB comes near the rate
    ratio = {mib: (mib << 20) * 8 / 1e9 / cold_tcp_seconds(mib << 20, 1e9, 0.08, 4, tls=False) for mib in (100, 1024)}
    assert 0.5 < ratio[100] < 0.6 and 0.9 < ratio[1024] < 0.95
    assert cold_tcp_seconds(100 << 20, 1e9, 0.08, 16, tls=False) < cold_tcp_seconds(100 << 20, 1e9, 0.08, 4, tls=False)
