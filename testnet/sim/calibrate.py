"""Calibrate the two free constants, each against one published cell of the 1.2M-chip column.

``return_seconds`` is solved so that data-parallel reaches the paper's 27 %, ``resize_seconds`` so that
elastic data-parallel reaches 58 % (elastic barely depends on the return time, DP on both: alternate
twice). Each solve is a secant iteration on ``1/goodput`` — nearly linear in a stall time under the
renewal model — with the simulator itself, one fixed seed and a long horizon (common random numbers keep
the iteration smooth). Nothing else is fitted; every other cell follows from the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from protocol.errors import LocalProtocolError
from testnet.sim.config import SimConfig
from testnet.sim.engine import simulate
from testnet.sim.layout import DP, ELASTIC, Policy
from testnet.sim.paper import PAPER_GOODPUT

__all__ = ["Calibration", "calibrate"]

CALIBRATION_CHIPS = 1_200_000


@dataclass(frozen=True)
class Calibration:
    return_seconds: float
    resize_seconds: float
    dp_goodput: float
    elastic_goodput: float
    targets: tuple[float, float]


def _secant(f: Callable[[float], float], x0: float, x1: float, *, tol: float = 1e-4, iters: int = 12) -> float:
    """Root of ``f`` near ``[x0, x1]`` (secant steps, kept ≥ 0)."""
    f0, f1 = f(x0), f(x1)
    for _ in range(iters):
        if abs(f1) < tol or f1 == f0:
            return x1
        x0, x1, f0 = x1, max(0.0, x1 - f1 * (x1 - x0) / (f1 - f0)), f1
        f1 = f(x1)
    if abs(f1) > 10 * tol:
        raise LocalProtocolError(f"calibration did not converge (residual {f1:.4g})")
    return x1


def calibrate(base: SimConfig, *, horizon_seconds: float = 10 * 86400.0, seed: int = 0) -> Calibration:
    """Solve ``(return_seconds, resize_seconds)`` for the paper's DP and elastic cells at 1.2M chips."""
    dp_target = PAPER_GOODPUT[DP][CALIBRATION_CHIPS] / 100.0
    el_target = PAPER_GOODPUT[ELASTIC][CALIBRATION_CHIPS] / 100.0
    cfg = base.replace(horizon_seconds=horizon_seconds)

    def goodput(kind: str, **changes: float) -> float:
        return simulate(Policy(kind), CALIBRATION_CHIPS, cfg.replace(**changes), seed=seed).goodput

    ret, res = cfg.return_seconds, cfg.resize_seconds
    for _ in range(2):
        res = _secant(lambda x: 1 / goodput(ELASTIC, return_seconds=ret, resize_seconds=x) - 1 / el_target,
                      res, res * 1.2 + 1.0)
        ret = _secant(lambda x: 1 / goodput(DP, return_seconds=x, resize_seconds=res) - 1 / dp_target,
                      ret, ret * 1.2 + 1.0)
    ret, res = round(ret, 1), round(res, 1)
    return Calibration(
        return_seconds=ret, resize_seconds=res,
        dp_goodput=goodput(DP, return_seconds=ret, resize_seconds=res),
        elastic_goodput=goodput(ELASTIC, return_seconds=ret, resize_seconds=res),
        targets=(dp_target, el_target),
    )
