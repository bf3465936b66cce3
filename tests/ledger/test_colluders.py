"""Tier (a): hostile members of a slot, one or two, every round (issue "Trust, second pass").

- Bit-identical deltas from several origins (colluders sharing one payload) count once: the smallest id
  counts, on time or folded in late, and the late fold ends in the bits of a replica that had the set on time;
  deltas with an honest update's norms but other values are not a copy and cannot displace it.
- The direction screen removes, of the updates that disagree, the one whose leaving makes the rest agree most:
  in a small tensor whose honest updates are mostly short rounds, with a hostile update weighing more than they do.
"""

import hashlib
import importlib

import numpy as np

from protocol.ledger import Ledger, LedgerConfig, Outcome, UpdateMeta
from protocol.ledger.aggregate import SlotEntry, tensor_terms
from protocol.ledger.chunks import tensor_norm

aggregate_module = importlib.import_module("protocol.ledger.aggregate")

SHAPES = {"scale": (16,), "w": (64, 32)}


def _meta(origin: str, slot: int = 0, tokens: int = 100, below: bytes | None = None,
          above: bytes | None = None) -> UpdateMeta:
    for n in range(10_000):
        update_id = hashlib.sha256(f"{origin}/{slot}/{n}".encode()).digest()
        if (below is None or update_id < below) and (above is None or update_id > above):
            return UpdateMeta(update_id, origin, slot, slot, tokens, 10)
    raise AssertionError("no such id")


def _entry(meta: UpdateMeta, deltas: dict[str, np.ndarray], weight: float | None = None) -> SlotEntry:
    deltas = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in deltas.items()}
    return SlotEntry(meta, meta.target_slot, float(meta.tokens) if weight is None else weight, deltas,
                     {k: tensor_norm(v) for k, v in deltas.items()})


def _updates(seed: int, count: int, agreement: float = 1.0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    shared = {k: rng.standard_normal(s) for k, s in SHAPES.items()}
    return [{k: (agreement * shared[k] + rng.standard_normal(s)).astype(np.float32) for k, s in SHAPES.items()}
            for _ in range(count)]


def _ledger() -> Ledger:
    return Ledger({k: np.zeros(s, np.float32) for k, s in SHAPES.items()}, LedgerConfig())


def test_bit_identical_deltas_from_two_origins_count_once_whatever_the_order() -> None:
    honest = _updates(0, 2)
    hostile = {k: (-3.0 * v).astype(np.float32) for k, v in honest[0].items()}
    metas = [_meta("h0"), _meta("h1"), _meta("c0"), _meta("c1")]
    entries = [_entry(m, d) for m, d in zip(metas, [*honest, hostile, hostile], strict=True)]
    first_copy = min(metas[2:], key=lambda m: m.update_id)
    for name in SHAPES:
        coefficients = tensor_terms(entries, name, LedgerConfig(), screen=False).coefficients
        assert [m.origin for m in metas if coefficients[m.update_id] != 0.0] == ["h0", "h1", first_copy.origin]
    # every arrival order, closed at once or folded in late, gives the same bits
    results = []
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [0, 1, 3, 2]):
        led = _ledger()
        for k in order[:3]:
            led.add(metas[k], entries[k].deltas)
        led.close_slot()
        assert led.add(metas[order[3]], entries[order[3]].deltas) is Outcome.FOLDED_LATE
        results.append(led.canonical_state()[0])
        assert all(np.array_equal(led.params()[k], results[-1][k].astype(np.float32)) or
                   np.allclose(led.params()[k], results[-1][k], rtol=1e-5, atol=1e-7) for k in SHAPES)
    assert all(np.array_equal(results[0][k], r[k]) for r in results[1:] for k in SHAPES)


def test_a_late_copy_with_a_smaller_id_takes_the_place_of_the_first_and_changes_no_bit() -> None:
    honest = _updates(1, 3)
    hostile = {k: (-2.0 * v).astype(np.float32) for k, v in honest[0].items()}
    first = _meta("c0")
    led = _ledger()
    for k, d in enumerate(honest):
        led.add(_meta(f"h{k}"), d)
    led.add(first, hostile)
    led.close_slot()
    before = led.canonical_state()[0]
    assert led.add(_meta("c1", below=first.update_id), hostile) is Outcome.FOLDED_LATE
    after = led.canonical_state()[0]
    assert all(np.array_equal(before[k], after[k]) for k in SHAPES)  # the same deltas, counted once


def test_an_honest_updates_norms_with_other_values_are_not_a_copy() -> None:
    honest = _updates(2, 3)
    mirrored = {k: (-v).astype(np.float32) for k, v in honest[0].items()}  # the same norms in every tensor
    metas = [_meta(f"h{k}") for k in range(3)]
    forger = _meta("x", below=min(m.update_id for m in metas))  # a ground id, smaller than every honest one
    entries = [_entry(m, d) for m, d in zip(metas, honest, strict=True)] + [_entry(forger, mirrored)]
    assert entries[0].norms_key == entries[-1].norms_key
    for name in SHAPES:
        unscreened = tensor_terms(entries, name, LedgerConfig(), screen=False).coefficients
        assert all(unscreened[m.update_id] != 0.0 for m in metas)  # it displaced nobody
        screened = tensor_terms(entries, name, LedgerConfig()).coefficients
        assert screened[forger.update_id] == 0.0 and all(screened[m.update_id] != 0.0 for m in metas)


def test_the_screen_leaves_out_the_update_whose_leaving_makes_the_rest_agree_most() -> None:
    """Three honest updates of a small tensor, two of them short rounds (a fifth of the weight), and a member
    publishing its own update negated ×10⁴ at a full round's weight: whenever the hostile update is well
    against the honest ones (cosine ≤ −0.3 with their sum), the screen leaves it out. By the smallest cosine
    (the rule before 2026-12-02) an honest one went instead in some of these slots: the others' sum of the
    heavy honest update was mostly the hostile one."""
    kept_hostile = {"now": 0, "by the smallest cosine": 0}
    for seed in range(400):
        rng = np.random.default_rng(seed)
        shared = rng.standard_normal(24)
        honest = [{"t": (shared + rng.standard_normal(24)).astype(np.float32)} for _ in range(4)]
        entries = [_entry(_meta(f"h{k}", seed), honest[k], w) for k, w in enumerate([0.2, 0.2, 1.0])]
        evil = _entry(_meta("evil", seed), {"t": (-1e4 * honest[3]["t"]).astype(np.float32)}, 1.0)
        if _cosine(evil, entries) > -0.3:
            continue
        entries.append(evil)
        kept_hostile["now"] += tensor_terms(entries, "t", LedgerConfig()).coefficients[evil.meta.update_id] != 0.0
        kept_hostile["by the smallest cosine"] += _smallest_cosine_keeps(entries, evil)
    assert kept_hostile["now"] == 0, kept_hostile
    assert kept_hostile["by the smallest cosine"] > 0, kept_hostile  # the case is the one the rule is for


def _cosine(entry: SlotEntry, others: list[SlotEntry]) -> float:
    """The cosine of ``entry``'s tensor ``t`` with the weighted sum of the others' unit vectors."""
    x = entry.deltas["t"].astype(np.float64)
    rest = sum(e.weight * e.deltas["t"].astype(np.float64) / e.norms["t"] for e in others)
    return float(x @ rest / (np.linalg.norm(x) * np.linalg.norm(rest)))


def _cosines(entries: list[SlotEntry], ids: list[bytes]) -> dict[bytes, float]:
    coefficients = tensor_terms(entries, "t", LedgerConfig(), screen=False).coefficients
    x = {e.meta.update_id: e.deltas["t"].astype(np.float64) for e in entries}
    out = {}
    for i in ids:
        rest = sum(coefficients[j] * x[j] for j in ids if j != i)
        out[i] = float(x[i] @ rest / (np.linalg.norm(x[i]) * np.linalg.norm(rest)))
    return out


def _smallest_cosine_keeps(entries: list[SlotEntry], evil: SlotEntry) -> bool:
    """Whether the rule before 2026-12-02 (of four, the one disagreeing update with the smallest cosine goes)
    kept the hostile update."""
    cosines = _cosines(entries, [e.meta.update_id for e in entries])
    disagreeing = [(q, i) for i, q in cosines.items() if q <= LedgerConfig().direction_screen]
    return bool(disagreeing) and min(disagreeing)[1] != evil.meta.update_id
