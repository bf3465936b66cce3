"""The inner-loop benchmark runs the node's own model and loop, and its FLOP count is the compiler's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.island.config import preset
from testnet.benchmarks import inner


@pytest.mark.slow
def test_tiny_run_writes_its_figures_and_counts_flops_as_xla_does(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "inner.json"
    assert inner.main(["--model", "tiny", "--steps", "3", "--repeats", "1", "--peak-tflops", "1",
                       "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["params"] == 115_008 and figures["tokens_per_step"] == 16 * 64
    assert figures["tokens_per_s"] == pytest.approx(figures["steps_per_s"] * 16 * 64)
    assert figures["steps_per_s"] > 0 and figures["bare_steps_per_s"] > 0
    # PaLM's count against what XLA's cost analysis finds in the lowered step (which adds the
    # element-wise work, the optimizer's included): within 10%.
    assert figures["xla_flops_per_token"] == pytest.approx(figures["flops_per_token"], rel=0.10)
    assert figures["mfu"] == pytest.approx(figures["model_tflops_per_s"] / 1.0)
    assert "MFU" in capsys.readouterr().out


def test_flop_count_of_the_presets() -> None:
    # base: 6 x 85,150,464 + 12 x 12 layers x 768 x 1024; large: 6 x 1,007,241,216 + 12 x 20 x 2048 x 2048
    assert inner.flops_per_token(preset("base"), 85_150_464) == 6 * 85_150_464 + 12 * 12 * 768 * 1024
    assert inner.flops_per_token(preset("large"), 1_007_241_216) == pytest.approx(7.05e9, rel=1e-3)


def test_unknown_preset_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert inner.main(["--model", "huge"]) == 2
    assert "unknown model preset 'huge'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--repeats", "0"], ["--peak-tflops", "0"]])
def test_counts_that_measure_nothing_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        inner.main(argv)
    assert exit_.value.code == 2 and argv[0] in capsys.readouterr().err
