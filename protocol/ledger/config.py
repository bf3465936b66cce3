"""Input record, outcomes and configuration of the slot ledger.

Everything the ledger needs to know about an update comes from its signed header (:class:`UpdateMeta`),
so every replica computes the same slot and the same weight for it. The ledger does not import the wire
messages: the node copies the header fields into an ``UpdateMeta``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass

from protocol.errors import LocalProtocolError
from protocol.ledger.rules import DEFAULT_RULE, check_rule_name

__all__ = ["COUNTERS", "EVICTED", "ORPHANED", "RELEASED", "Aggregation", "LedgerConfig", "Outcome", "StalePolicy", "UpdateMeta",
           "Weighting"]

ID_BYTES = 32


@dataclass(frozen=True)
class UpdateMeta:
    """The fields of an update's signed header that the ledger uses.

    update_id: 32-byte message id (SHA-256); canonical summation order and deduplication.
    origin: the sender's peer id (informational: counted, not used by the math).
    base_slot: slot of the global parameters the sender's round started from.
    publish_slot: latest slot the sender had closed when it published (``base_slot ≤ publish_slot``).
    tokens: tokens the round trained on (> 0).
    inner_steps: inner optimizer steps of the round (> 0).
    """

    update_id: bytes
    origin: str
    base_slot: int
    publish_slot: int
    tokens: int
    inner_steps: int

    @property
    def target_slot(self) -> int:
        """The slot the update belongs to: ``publish_slot + 1``."""
        return self.publish_slot + 1


class Outcome(enum.StrEnum):
    """What :meth:`Ledger.add` did with an update. Values are stable (metrics, `/status`)."""

    APPLIED_OPEN = "applied-open"  # assigned to the open slot
    FOLDED_LATE = "folded-late"  # assigned to an already-closed slot inside the window, folded in exactly
    APPLIED_STALE = "applied-stale"  # older than the window: applied at the open slot, staleness-weighted
    DROPPED_STALE = "dropped-stale"  # older than the window and the config says drop
    DROPPED_SURPLUS = "dropped-surplus"  # its origin already has more updates in the slot, all with smaller ids
    DUPLICATE = "duplicate"  # this update id was seen before: ignored
    HELD_FUTURE = "held-future"  # the sender is ahead: held until its slot opens here


RELEASED = "released"  # counter: held updates moved into a newly opened slot
ORPHANED = "orphaned"  # counter: ids marked seen without being applied (`Ledger.ignore`, fork choice)
EVICTED = "evicted"  # counter: entries that left their slot for a smaller id of their origin (`bound.surplus`)
COUNTERS = (*(o.value for o in Outcome), RELEASED, ORPHANED, EVICTED)  # every counter a ledger keeps


class Weighting(enum.StrEnum):
    """The token part of an update's weight (the staleness factor is applied on top)."""

    TOKENS = "tokens"  # w = tokens
    TOKENS_PER_STEP = "tokens-per-step"  # paper's quantity × quality: w = tokens · tokens / inner_steps
    UNIFORM = "uniform"  # w = 1


class Aggregation(enum.StrEnum):
    """How a slot's updates are combined (per tensor)."""

    RADIAL_DIRECTIONAL = "radial-directional"  # mean norm × normalized mean direction (embeddings: mean)
    MEAN = "mean"  # weighted average for every tensor


class StalePolicy(enum.StrEnum):
    """What to do with an update whose slot has left the window."""

    APPLY = "apply"  # apply at the open slot, weighted by its staleness measured from the open slot
    DROP = "drop"


@dataclass(frozen=True)
class LedgerConfig:
    """Run-wide ledger settings. Every replica of a run must use the same values (they are part of the
    snapshot's config fingerprint, except ``lr_schedule``, a function, which the run must fix).

    window: W, number of closed slots a late update can still be folded into.
    lr, momentum: outer Nesterov SGD (DiLoCo: 0.7, 0.9). ``lr_schedule(slot)``, when given, is η_slot.
    outer_rule: the outer optimizer's registered name (:mod:`protocol.ledger.rules`; default ``nesterov``,
    which reads ``momentum``; a rule may read any of these settings).
    staleness_alpha: α in the staleness factor ``(1 + staleness)^-α``; 0 disables it.
    weighting, aggregation: see the enums. embeddings: tensor names aggregated with the plain mean.
    stale_policy: fate of updates older than the window.
    max_future_slots: an update for a slot more than this many slots past the open one is refused.
    norm_clip: k of the norm bound ``τ = k ×`` the slot's lower median norm, per tensor
    (:mod:`protocol.ledger.bound`); 0 turns it off.
    direction_screen: κ of the direction screen: with 3 or more counted updates in a slot, one whose cosine
    with the others' sum is at most κ is left out of that tensor's aggregate (None turns it off;
    ``norm_clip = 0`` turns the whole bound off, this included).
    max_step_rms: the largest root-mean-square change one inner step can make to a tensor's elements: an
    update's tensor norm is clipped to ``max_step_rms · inner_steps · sqrt(size)`` (None: unchecked).
    tokens_per_step, max_inner_steps: the most tokens one inner step and the most inner steps one update
    may claim (None: unchecked); an update claiming more is refused.
    max_updates_per_origin: K: an origin with more than K updates in a slot counts for nothing there, and a
    slot keeps at most K + 1 of an origin's updates, the smallest ids (:mod:`protocol.ledger.bound`; None:
    no limit, every update is kept and the smallest id counts).
    end_slot: the run's last slot (None: the run has no end). An update that would enter a later slot is
    refused (``past_end``), and no slot past it is ever closed: every replica ends at the same set.
    """

    window: int = 4
    lr: float = 0.7
    momentum: float = 0.9
    lr_schedule: Callable[[int], float] | None = None
    staleness_alpha: float = 0.5
    weighting: Weighting = Weighting.TOKENS
    aggregation: Aggregation = Aggregation.RADIAL_DIRECTIONAL
    embeddings: frozenset[str] = frozenset()
    stale_policy: StalePolicy = StalePolicy.APPLY
    max_future_slots: int = 64
    norm_clip: float = 1.0
    direction_screen: float | None = 0.05
    max_step_rms: float | None = None
    tokens_per_step: int | None = None
    max_inner_steps: int | None = None
    max_updates_per_origin: int | None = 2
    end_slot: int | None = None
    outer_rule: str = DEFAULT_RULE

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 0:
            raise LocalProtocolError(f"window must be an int ≥ 0, got {self.window!r}")
        if not (math.isfinite(self.lr) and self.lr >= 0.0):
            raise LocalProtocolError(f"lr must be finite and ≥ 0, got {self.lr!r}")
        if not (0.0 <= self.momentum < 1.0):
            raise LocalProtocolError(f"momentum must be in [0, 1), got {self.momentum!r}")
        check_rule_name(self.outer_rule)
        if not (math.isfinite(self.staleness_alpha) and self.staleness_alpha >= 0.0):
            raise LocalProtocolError(f"staleness_alpha must be finite and ≥ 0, got {self.staleness_alpha!r}")
        if not isinstance(self.max_future_slots, int) or self.max_future_slots < 0:
            raise LocalProtocolError(f"max_future_slots must be an int ≥ 0, got {self.max_future_slots!r}")
        if not (math.isfinite(self.norm_clip) and (self.norm_clip == 0.0 or self.norm_clip >= 1.0)):
            raise LocalProtocolError(f"norm_clip must be 0 (off) or finite and ≥ 1, got {self.norm_clip!r}")
        if self.direction_screen is not None and not (-1.0 <= self.direction_screen < 1.0):
            raise LocalProtocolError(f"direction_screen must be None or in [-1, 1), got {self.direction_screen!r}")
        if self.max_step_rms is not None and not (math.isfinite(self.max_step_rms) and self.max_step_rms > 0.0):
            raise LocalProtocolError(f"max_step_rms must be None or finite and > 0, got {self.max_step_rms!r}")
        if self.max_updates_per_origin is not None and (
            type(self.max_updates_per_origin) is not int or self.max_updates_per_origin < 1
        ):
            raise LocalProtocolError(
                f"max_updates_per_origin must be None or an int ≥ 1, got {self.max_updates_per_origin!r}"
            )
        if self.end_slot is not None and (type(self.end_slot) is not int or self.end_slot < 0):
            raise LocalProtocolError(f"end_slot must be None or an int ≥ 0, got {self.end_slot!r}")
        for name in ("tokens_per_step", "max_inner_steps"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise LocalProtocolError(f"{name} must be None or an int ≥ 1, got {value!r}")
        if not isinstance(self.embeddings, frozenset) or not all(isinstance(n, str) for n in self.embeddings):
            raise LocalProtocolError("embeddings must be a frozenset of tensor names")
        # Enum fields: accept their string values, refuse anything else.
        for field, kind in (("weighting", Weighting), ("aggregation", Aggregation), ("stale_policy", StalePolicy)):
            value = getattr(self, field)
            try:
                object.__setattr__(self, field, kind(value))
            except ValueError:
                raise LocalProtocolError(
                    f"{field} must be one of {[k.value for k in kind]}, got {value!r}"
                ) from None

    def eta(self, slot: int) -> float:
        """Outer learning rate used when slot ``slot`` (≥ 1) is closed."""
        if self.lr_schedule is None:
            return self.lr
        value = float(self.lr_schedule(slot))
        if not (math.isfinite(value) and value >= 0.0):
            raise LocalProtocolError(f"lr_schedule({slot}) must be finite and ≥ 0, got {value!r}")
        return value

    @classmethod
    def from_fingerprint(cls, fingerprint: dict[str, object]) -> LedgerConfig:
        """The config a fingerprint describes (a snapshot's ``config``). A fingerprint of a config with an
        ``lr_schedule`` cannot be turned back (the function is not in it): ``LocalProtocolError``."""
        fields = dict(fingerprint)
        if fields.pop("lr_schedule", False):
            raise LocalProtocolError("the config had an lr_schedule, which a fingerprint does not hold")
        try:
            return cls(**{**fields, "embeddings": frozenset(fields.get("embeddings", ()))})  # type: ignore[arg-type]
        except TypeError as exc:
            raise LocalProtocolError(f"not a ledger config fingerprint: {exc}") from None

    def fingerprint(self) -> dict[str, object]:
        """The settings a snapshot must agree on (plain msgpack-able values). ``outer_rule`` is there only
        when it is not the default, so a run of Nesterov has the fingerprint it had before rules were a
        setting."""
        rule = {} if self.outer_rule == DEFAULT_RULE else {"outer_rule": self.outer_rule}
        return {
            "window": self.window,
            "lr": self.lr,
            "momentum": self.momentum,
            "lr_schedule": self.lr_schedule is not None,
            "staleness_alpha": self.staleness_alpha,
            "weighting": self.weighting.value,
            "aggregation": self.aggregation.value,
            "embeddings": sorted(self.embeddings),
            "stale_policy": self.stale_policy.value,
            "max_future_slots": self.max_future_slots,
            "norm_clip": self.norm_clip,
            "direction_screen": self.direction_screen,
            "max_step_rms": self.max_step_rms,
            "tokens_per_step": self.tokens_per_step,
            "max_inner_steps": self.max_inner_steps,
            "max_updates_per_origin": self.max_updates_per_origin,
            "end_slot": self.end_slot,
            **rule,
        }
