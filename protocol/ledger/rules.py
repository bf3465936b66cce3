"""The outer optimizer as a seam: the rule every replica applies when it closes a slot.

A rule steps the replicated state, ``θ`` and one buffer ``v`` of ``θ``'s shape and dtype (Nesterov's
momentum; a rule that needs none leaves it as it is), with a slot's aggregate ``g = scale · u``. The ledger
(:mod:`protocol.ledger.ledger`) calls :meth:`OuterRule.step` span by span over flat arrays, for every tensor
in parallel threads, when a slot closes, when the window is replayed and when its bottom advances. So a
rule must be:

* **elementwise**: each element's new ``θ``, ``v`` a function of that element's ``θ``, ``v``, ``u``, the scale
  and ``η`` alone (spans and threads must not change a bit);
* **deterministic in its rounding**: the same operations in the same order on every replica (intermediates
  in float64, each result rounded once into the arrays' dtype, as :func:`protocol.kernels.nesterov_chunk`
  does), since replicas compare digests of the bits.

``linear`` says whether the state after slot ``n`` is affine in each past slot's aggregate with scalar
coefficients: a change ``δ`` of slot ``r``'s aggregate moves ``v_n`` by ``a·δ`` and ``θ_n`` by ``−k·δ``, with
``(a, k) = fold_coefficients(r, n, eta)``. Then a late update is folded in closed form, one pass over the
model (:func:`protocol.ledger.outer.fold_change`). A rule that is not linear has no such form: the ledger
replays the window from its bottom instead (:meth:`protocol.ledger.Ledger.resync`: one step per slot of the
window, for every late update that changes an aggregate), which keeps every replica's bits equal at that
price.

Rules are found by name (:func:`register_rule`, :func:`outer_rule`). A run names its rule in
``LedgerConfig.outer_rule``, which is part of the run configuration (the fingerprint carries it when it is
not ``nesterov``), so replicas of different rules refuse each other's states and connections.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from protocol.errors import LocalProtocolError
from protocol.kernels import nesterov_chunk

if TYPE_CHECKING:
    from protocol.ledger.config import LedgerConfig

__all__ = ["DEFAULT_RULE", "Nesterov", "OuterRule", "check_rule_name", "outer_rule", "register_rule", "rule_names"]

DEFAULT_RULE = "nesterov"


class OuterRule(abc.ABC):
    """One outer optimizer (see the module docstring for the contract a rule keeps)."""

    name: ClassVar[str]
    linear: ClassVar[bool] = False

    @abc.abstractmethod
    def step(self, theta: np.ndarray, v: np.ndarray, u: np.ndarray, scale: float | None, eta: float) -> None:
        """One step in place over flat spans: the aggregate is ``u · scale`` (``scale`` None: ``u`` itself; ``u``
        float64 or float32), ``η`` the slot's outer learning rate."""

    def fold_coefficients(self, r: int, n: int, eta: Callable[[int], float]) -> tuple[float, float]:
        """``(a, k)``: a change ``δ`` of closed slot ``r``'s aggregate moves ``v_n`` by ``+a·δ`` and ``θ_n`` by
        ``−k·δ`` (``1 ≤ r ≤ n``; ``eta(t)``: slot ``t``'s learning rate). Only a linear rule has them."""
        raise LocalProtocolError(f"the outer rule {self.name!r} is not linear: it has no closed-form fold")


@dataclass(frozen=True)
class Nesterov(OuterRule):
    """SGD with Nesterov momentum ``μ`` (DiLoCo's outer optimizer): ``v ← μ v + g``, ``θ ← θ − η (μ v + g)``."""

    mu: float
    name: ClassVar[str] = "nesterov"
    linear: ClassVar[bool] = True

    def step(self, theta: np.ndarray, v: np.ndarray, u: np.ndarray, scale: float | None, eta: float) -> None:
        nesterov_chunk(theta, v, u, scale, eta=eta, mu=self.mu)

    def fold_coefficients(self, r: int, n: int, eta: Callable[[int], float]) -> tuple[float, float]:
        """``(μ^{n−r}, η_r (1+μ) + Σ_{t=r+1..n} η_t μ^{t−r+1})`` (:mod:`protocol.ledger.outer` derives them)."""
        if not 1 <= r <= n:
            raise ValueError(f"need 1 ≤ r ≤ n, got r={r}, n={n}")
        mu = self.mu
        theta_terms = [eta(r) * (1.0 + mu)] + [eta(t) * mu ** (t - r + 1) for t in range(r + 1, n + 1)]
        return mu ** (n - r), math.fsum(theta_terms)


_FACTORIES: dict[str, Callable[[LedgerConfig], OuterRule]] = {DEFAULT_RULE: lambda config: Nesterov(config.momentum)}


def register_rule(name: str, factory: Callable[[LedgerConfig], OuterRule]) -> None:
    """Make ``LedgerConfig(outer_rule=name)`` mean ``factory(config)`` (the config gives the rule its settings,
    e.g. ``momentum``). A name is registered once: registering another factory under it is an error."""
    if not isinstance(name, str) or not name or len(name) > 32:
        raise LocalProtocolError(f"an outer rule's name is a non-empty str of at most 32 characters, got {name!r}")
    if _FACTORIES.get(name, factory) is not factory:
        raise LocalProtocolError(f"an outer rule named {name!r} is already registered")
    _FACTORIES[name] = factory


def rule_names() -> list[str]:
    """The registered rules' names, sorted."""
    return sorted(_FACTORIES)


def check_rule_name(name: object) -> None:
    """``LocalProtocolError`` unless ``name`` is a registered rule's."""
    if name not in _FACTORIES:
        raise LocalProtocolError(f"unknown outer rule {name!r}; registered: {rule_names()}")


def outer_rule(config: LedgerConfig) -> OuterRule:
    """The rule ``config`` names, with ``config``'s settings."""
    check_rule_name(config.outer_rule)
    rule = _FACTORIES[config.outer_rule](config)
    if not isinstance(rule, OuterRule):
        raise LocalProtocolError(f"the factory of outer rule {config.outer_rule!r} made {type(rule).__name__}, "
                                 "not an OuterRule")
    return rule
