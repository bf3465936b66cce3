"""Tier (a): PROTOCOL.md §11c's worked example of the outer optimizer (placement, weights, aggregate, step,
late fold, finalization), recomputed twice: from the definitions written there (numpy and math only, none
of the ledger's code) and by the ledger itself. The example's inputs, events and numbers are all read from
the text, so a change to the document or to the code that breaks their agreement turns this red."""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import Ledger, LedgerConfig, UpdateMeta, aggregate, fold_coefficients

DOC = (Path(__file__).resolve().parents[2] / "PROTOCOL.md").read_text()
F32, F64 = np.float32, np.float64
CHUNK = 65_536  # "chunks of 65,536 elements"


# -- reading the example ---------------------------------------------------------------------------------
def section() -> str:
    return DOC[DOC.index("## 11c."):DOC.index("## 12.")]


def blocks() -> list[str]:
    """The code blocks of the worked example, in order: inputs, events, numbers."""
    text = section()
    text = text[text.index("### Worked example"):]
    return re.findall(r"^```\n(.*?)^```$", text, re.M | re.S)


def rows(block: str) -> dict[str, list[str]]:
    """``label  values`` lines (label and values separated by two or more spaces)."""
    out = {}
    for line in block.splitlines():
        m = re.match(r"^(\S.*?)\s{2,}(\S.*)$", line)
        if m and not line.startswith("--"):
            assert m[1] not in out, f"label {m[1]!r} twice"
            out[m[1]] = m[2].split()
    return out


class Example:
    def __init__(self) -> None:
        inputs, self.events_block, numbers = blocks()
        cfg = rows(inputs)
        self.config = {k: v[0] for k, v in cfg.items() if k in {
            "window", "lr", "momentum", "staleness_alpha", "weighting", "aggregation", "embeddings",
            "stale_policy", "max_future_slots", "norm_clip", "direction_screen", "max_step_rms"}}
        self.theta0 = {m[1]: np.array(m[2].split(), F32).reshape(tuple(int(d) for d in m[3].split(",") if d.strip()))
                       for m in re.finditer(r"^θ_0\[(\w+)\]\s+(.*?)\s+shape \(([\d, ]*)\)$", inputs, re.M)}
        self.updates = {}
        row = r"^([A-Z])\s+([0-9a-f]{2})…\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\[([^\]]*)\]\s+\[([^\]]*)\]$"
        for m in re.finditer(row, inputs, re.M):
            self.updates[m[1]] = dict(
                id=bytes.fromhex(m[2]) * 32, base=int(m[3]), publish=int(m[4]), tokens=int(m[5]), steps=int(m[6]),
                delta={"embed": np.array(m[7].split(), F32).reshape(self.theta0["embed"].shape),
                       "w": np.array(m[8].split(), F32).reshape(self.theta0["w"].shape)})
        self.numbers = rows(numbers)

    def f64(self, label: str) -> list[float]:
        return [float(x) for x in self.numbers[label]]

    def f32(self, label: str) -> np.ndarray:
        return np.array([F32(x) for x in self.numbers[label]], F32)

    def events(self) -> list[tuple]:
        out = []
        for line in self.events_block.splitlines():
            if m := re.match(r"^(\d+)\s+close\b", line):
                out.append(("close", int(m[1])))
            elif m := re.match(r"^(\d+)\s+add ([A-Z])\b.*?\s{2,}(\d+)\s+(refused: \w+|\S+)", line):
                out.append(("add", int(m[1]), m[2], int(m[3]), m[4]))
        return out


EX = Example()


def bits(a: np.ndarray) -> list[int]:
    return np.asarray(a, F32).reshape(-1).view(np.uint32).tolist()


# -- the written definitions, in plain numpy and math ------------------------------------------------
def pairwise(a: list[float]) -> float:
    """The pairwise sum as §11c writes it (blocks of 8 partial sums up to 128 elements, halves above)."""
    n = len(a)
    if n < 8:
        r = 0.0
        for x in a:
            r += x
        return r
    if n <= 128:
        p, i = list(a[:8]), 8
        while i < n - n % 8:
            for k in range(8):
                p[k] += a[i + k]
            i += 8
        r = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))
        for x in a[i:]:
            r += x
        return r
    m = n // 2
    m -= m % 8
    return pairwise(a[:m]) + pairwise(a[m:])


def norm(x: np.ndarray) -> float:
    f = np.asarray(x, F64).reshape(-1)
    parts = [pairwise((f[i:i + CHUNK] * f[i:i + CHUNK]).tolist()) for i in range(0, f.size, CHUNK)]
    return math.sqrt(math.fsum(parts))


class Spec:
    """Placement, weights, aggregate and step exactly as §11c defines them."""

    def __init__(self, ex: Example) -> None:
        c = ex.config
        self.ex, self.window, self.lr, self.mu = ex, int(c["window"]), float(c["lr"]), float(c["momentum"])
        self.alpha, self.ahead = float(c["staleness_alpha"]), int(c["max_future_slots"])
        self.clip = float(c["norm_clip"])
        self.kappa = None if c["direction_screen"] == "nil" else float(c["direction_screen"])
        self.step_rms = None if c.get("max_step_rms", "nil") == "nil" else float(c["max_step_rms"])
        per_origin = c.get("max_updates_per_origin", "2")
        self.per_origin = None if per_origin == "nil" else int(per_origin)
        self.embeddings = set(c["embeddings"].strip("[]").split(","))
        self._norms: dict[tuple[str, str], float] = {}
        assert c["weighting"] == "tokens" and c["aggregation"] == "radial-directional" and c["stale_policy"] == "apply"

    def norm(self, tag: str, name: str) -> float:
        key = (tag, name)
        if key not in self._norms:
            self._norms[key] = norm(self.ex.updates[tag]["delta"][name])
        return self._norms[key]

    def weight(self, tag: str, slot: int) -> float:
        u = self.ex.updates[tag]
        return float(u["tokens"]) * (1.0 + (slot - 1 - u["base"])) ** -self.alpha

    def origin(self, tag: str) -> str:
        return self.ex.updates[tag].get("origin", tag)

    def uid(self, tag: str) -> bytes:
        return self.ex.updates[tag]["id"]

    def counted(self, entries: list[tuple[str, float]]) -> list[tuple[str, float]]:
        """Per origin, the update with the smallest id, none of an origin with more than K; in id order."""
        first: dict[str, tuple[str, float]] = {}
        for tag, w in sorted(entries, key=lambda e: self.uid(e[0])):
            first.setdefault(self.origin(tag), (tag, w))
        sent = Counter(self.origin(tag) for tag, _ in entries)
        kept = sorted((e for o, e in first.items() if self.per_origin is None or sent[o] <= self.per_origin),
                      key=lambda e: self.uid(e[0]))
        distinct: list[tuple[str, float]] = []  # of bit-identical deltas, the smallest id
        for tag, w in kept:
            deltas = self.ex.updates[tag]["delta"]
            if not any(all(np.array_equal(deltas[k].view(np.uint32), self.ex.updates[t]["delta"][k].view(np.uint32))
                           for k in deltas) for t, _ in distinct):
                distinct.append((tag, w))
        return distinct

    def bound(self, entries: list[tuple[str, float]], name: str) -> float:
        """τ: norm_clip × the lower median (by count) of the counted updates' norms."""
        counted = self.counted(entries)
        if self.clip == 0.0 or not counted:
            return math.inf
        ranked = sorted(counted, key=lambda e: (self.norm(e[0], name), self.uid(e[0])))
        return self.clip * self.norm(ranked[(len(ranked) - 1) // 2][0], name)

    def base_coefficient(self, tag: str, w: float, name: str, entries: list[tuple[str, float]]) -> float:
        """c_i before the direction screen."""
        if (tag, w) not in self.counted(entries):
            return 0.0
        n, b = self.norm(tag, name), self.limit(tag, entries, name)
        if name in self.embeddings:
            return w if n <= b else w * (b / n)
        return w / n if n > 0.0 else 0.0

    def limit(self, tag: str, entries: list[tuple[str, float]], name: str) -> float:
        """min(τ, A_i): the slot's bound and the update's own, (max_step_rms·inner_steps)·sqrt(size)."""
        own = math.inf if self.step_rms is None or self.clip == 0.0 else \
            (self.step_rms * self.ex.updates[tag]["steps"]) * math.sqrt(self.ex.updates[tag]["delta"][name].size)
        return min(self.bound(entries, name), own)

    @staticmethod
    def inner(fa: np.ndarray, fb: np.ndarray) -> float:
        """⟨y, z⟩: chunks of 65,536, P over the products within a chunk, fsum across chunks."""
        return math.fsum(pairwise((fa[i:i + CHUNK] * fb[i:i + CHUNK]).tolist()) for i in range(0, fa.size, CHUNK))

    def flat(self, tag: str, name: str) -> np.ndarray:
        return self.ex.updates[tag]["delta"][name].astype(F64).reshape(-1)

    def screened(self, entries: list[tuple[str, float]], name: str) -> set[str]:
        """The direction screen: two that pull apart both go; of m ≥ 3, of those whose cosine with the others' sum
        is ≤ κ the one whose leaving leaves the others' mean direction longest goes (ties: smaller id), again while
        three are in and more than half of the m stay; from ‖U_R‖² and ⟨x_i, U_R⟩ of the sum U_R over R."""
        live = [(t, self.base_coefficient(t, w, name, entries)) for t, w in self.counted(entries)]
        live = sorted(((t, c) for t, c in live if c != 0.0), key=lambda tc: self.uid(tc[0]))
        if self.clip == 0.0 or self.kappa is None or len(live) < 2:
            return set()
        n = {t: self.norm(t, name) for t, _ in live}
        if len(live) == 2:
            (a, _), (b, _) = live
            pulls_apart = self.inner(self.flat(a, name), self.flat(b, name)) <= self.kappa * n[a] * n[b]
            return {a, b} if min(n[a], n[b]) <= 0.0 or pulls_apart else set()
        out: set[str] = set()
        while len(live) - len(out) >= 3 and 2 * (len(live) - len(out) - 1) > len(live):
            rest_of = [(t, c) for t, c in live if t not in out]
            u_r = None
            for t, c in rest_of:  # the accumulator over R, as U is summed
                u_r = self.flat(t, name) * F64(c) if u_r is None else u_r + self.flat(t, name) * F64(c)
            u = self.inner(u_r, u_r)
            disagreeing = []
            sizes = {t: c * n[t] for t, c in rest_of}
            for t, c in rest_of:
                d = self.inner(self.flat(t, name), u_r)
                e = sizes[t]
                along, rest = d - e * n[t], math.fsum([u, (-2.0 * c) * d, e * e])
                if rest <= 0.0 or n[t] <= 0.0 or along <= self.kappa * n[t] * math.sqrt(rest):
                    others = math.fsum(sizes[o] for o, _ in rest_of if o != t)
                    disagreeing.append((math.sqrt(rest) / others if rest > 0.0 and others > 0.0 else 0.0, t))
            if not disagreeing:
                break
            out.add(min(disagreeing, key=lambda gt: (-gt[0], self.uid(gt[1])))[1])
        return out

    def coefficient(self, tag: str, w: float, name: str, entries: list[tuple[str, float]]) -> float:
        """c_i of ``tag`` (weight ``w``) in a slot holding ``entries`` (``tag`` among them)."""
        return 0.0 if tag in self.screened(entries, name) else self.base_coefficient(tag, w, name, entries)

    def accumulate(self, entries: list[tuple[str, float]], name: str) -> np.ndarray:
        u = None
        for tag, w in sorted(entries, key=lambda e: self.uid(e[0])):
            c = self.coefficient(tag, w, name, entries)
            if c != 0.0:
                x = self.ex.updates[tag]["delta"][name].astype(F64).reshape(-1)
                u = x * F64(c) if u is None else u + x * F64(c)
        return np.zeros(self.ex.theta0[name].size) if u is None else u

    def scale(self, entries: list[tuple[str, float]], name: str, u_norm: float) -> float:
        out = self.screened(entries, name)
        counted = [(t, w) for t, w in self.counted(entries) if t not in out]
        if not counted:
            return 0.0
        total = math.fsum(w for _, w in counted)
        if name in self.embeddings:
            return 1.0 / total
        if u_norm <= 0.0:
            return 0.0
        floor = math.sqrt(math.fsum(w * w for t, w in counted if self.norm(t, name) > 0.0)) if self.clip else 0.0
        return math.fsum(w * min(self.norm(t, name), self.limit(t, entries, name)) for t, w in counted) / total \
            / max(u_norm, floor)

    def aggregate(self, entries: list[tuple[str, float]], name: str) -> tuple[np.ndarray, float, float, np.ndarray]:
        u = self.accumulate(entries, name)
        un = norm(u)
        s = self.scale(entries, name, un)
        return u, un, s, u * F64(s)

    def step(self, theta: dict, v: dict, entries: list[tuple[str, float]], slot: int) -> tuple[dict, dict]:
        eta, mu, out_t, out_v = F64(self.lr), F64(self.mu), {}, {}  # no lr_schedule: η(slot) = lr
        for name in theta:
            g = self.aggregate(entries, name)[3]
            vn = v[name].astype(F64).reshape(-1) * mu + g
            t = (vn * mu + g) * eta
            out_v[name] = vn.astype(F32).reshape(theta[name].shape)
            out_t[name] = (theta[name].astype(F64).reshape(-1) - t).astype(F32).reshape(theta[name].shape)
        return out_t, out_v

    def place(self, n: int, tag: str, seen: set[str]) -> tuple[int, str]:
        """(slot r, outcome) of adding ``tag`` to a replica that closed ``n`` slots (§11c "Placement")."""
        u = self.ex.updates[tag]
        r, b = u["publish"] + 1, max(0, n - self.window)
        if tag in seen:
            return r, "duplicate"
        if r > n + 1 + self.ahead:
            return r, "bad_slot"
        seen.add(tag)
        if r <= b:
            return r, "applied-stale"
        return r, "held-future" if r > n + 1 else "applied-open" if r == n + 1 else "folded-late"


# -- tier 1: the numbers follow from the written definitions -----------------------------------------------
def test_the_events_follow_from_the_placement_rules() -> None:
    spec, seen, n = Spec(EX), set(), 0
    events = EX.events()
    assert [e[0] for e in events].count("close") == 4
    for event in events:
        assert event[1] == n
        if event[0] == "close":
            n += 1
        else:
            _, _, tag, slot, outcome = event
            assert spec.place(n, tag, seen) == (slot, outcome.removeprefix("refused:").strip())


def test_the_worked_example_follows_from_the_written_definitions() -> None:
    spec, ex, names = Spec(EX), EX, ("embed", "w")
    num = ex.numbers
    d = {t: ex.updates[t]["delta"] for t in ex.updates}
    # slot 1 = {A, B}, in canonical order B, A
    w = {"B": spec.weight("B", 1), "A": spec.weight("A", 1)}
    s1 = list(w.items())
    assert ex.f64("w_i (B, A)") == [w["B"], w["A"]]
    for name in names:
        assert ex.f64(f"‖Δ_i[{name}]‖ (B, A)") == [norm(d["B"][name]), norm(d["A"][name])]
        assert ex.f64(f"c_i[{name}] (B, A)") == [spec.coefficient(t, w[t], name, s1) for t in "BA"]
        u, un, s, g = spec.aggregate(s1, name)
        assert ex.f64(f"U_1[{name}]") == u.tolist()
        assert ex.f64(f"‖U_1[{name}]‖") == [un]
        assert ex.f64(f"s_1[{name}]") == [s]
        assert ex.f64(f"g_1[{name}]") == g.tolist()
    v0 = {n: np.zeros_like(a) for n, a in ex.theta0.items()}
    th1, v1 = spec.step(ex.theta0, v0, s1, 1)
    # slot 2 = {D}, staleness 1
    wd = spec.weight("D", 2)
    assert ex.f64("w_D") == [wd]
    th2, v2 = spec.step(th1, v1, [("D", wd)], 2)
    for name in names:
        assert ex.f64(f"g_2[{name}]") == spec.aggregate([("D", wd)], name)[3].tolist()
        for label, a in ((f"v_1[{name}]", v1), (f"θ_1[{name}]", th1), (f"v_2[{name}]", v2), (f"θ_2[{name}]", th2)):
            assert bits(ex.f32(label)) == bits(a[name]), label
    # C folds into slot 1 at n = 2
    wc = spec.weight("C", 1)
    assert ex.f64("w_C") == [wc]
    s1c = s1 + [("C", wc)]
    mu, eta = spec.mu, spec.lr
    assert ex.f64("μ^(n−r)") == [mu ** (2 - 1)]
    assert ex.f64("K") == [math.fsum([eta * (1.0 + mu), eta * mu ** 2])]
    for name in names:
        c = spec.coefficient("C", wc, name, s1c)
        assert [spec.coefficient(t, w[t], name, s1c) for t in "BA"] == \
            [spec.coefficient(t, w[t], name, s1) for t in "BA"]  # C moves no other coefficient
        s_old = spec.aggregate(s1, name)[2]
        u_new = spec.accumulate(s1, name) + d["C"][name].astype(F64).reshape(-1) * F64(c)
        s_new = spec.scale(s1c, name, norm(u_new))
        assert ex.f64(f"c_C[{name}]") == [c]
        assert ex.f64(f"s_1[{name}] old, new") == [s_old, s_new]
        delta = u_new * F64(s_new - s_old) + d["C"][name].astype(F64).reshape(-1) * F64(s_old * c)
        assert ex.f64(f"δ[{name}]") == delta.tolist()
        # δ is g_1 with C minus g_1 without it, up to float64 rounding
        exact = spec.aggregate(s1c, name)[3] - spec.aggregate(s1, name)[3]
        np.testing.assert_allclose(delta, exact, rtol=1e-12, atol=1e-15)
    th1c, v1c = spec.step(ex.theta0, v0, s1c, 1)
    th2c, v2c = spec.step(th1c, v1c, [("D", wd)], 2)
    for name in names:
        for label, a in ((f"v_2'[{name}]", v2c), (f"θ_2'[{name}]", th2c), (f"v_1'[{name}]", v1c),
                         (f"θ_1'[{name}]", th1c)):
            assert bits(ex.f32(label)) == bits(a[name]), label
        # the closed form moves the state the same way, up to binary32 rounding
        a, k = ex.f64("μ^(n−r)")[0], ex.f64("K")[0]
        delta = np.array(ex.f64(f"δ[{name}]"))
        np.testing.assert_allclose(v2[name].reshape(-1) + a * delta, v2c[name].reshape(-1), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(th2[name].reshape(-1) - k * delta, th2c[name].reshape(-1), rtol=1e-6, atol=1e-7)
    assert ex.f64("w_E") == [spec.weight("E", 4)]
    assert len(num) == 42  # every number of the block is checked above


# -- tier 2: the ledger computes the same -------------------------------------------------------------
def ledger_config() -> LedgerConfig:
    c = EX.config
    return LedgerConfig(window=int(c["window"]), lr=float(c["lr"]), momentum=float(c["momentum"]),
                        staleness_alpha=float(c["staleness_alpha"]), weighting=c["weighting"],
                        aggregation=c["aggregation"], embeddings=frozenset(c["embeddings"].strip("[]").split(",")),
                        stale_policy=c["stale_policy"], max_future_slots=int(c["max_future_slots"]),
                        norm_clip=float(c["norm_clip"]),
                        direction_screen=None if c["direction_screen"] == "nil" else float(c["direction_screen"]),
                        max_step_rms=None if c["max_step_rms"] == "nil" else float(c["max_step_rms"]))


def meta(tag: str) -> UpdateMeta:
    u = EX.updates[tag]
    return UpdateMeta(u["id"], tag, u["base"], u["publish"], u["tokens"], u["steps"])


def deltas(tag: str) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in EX.updates[tag]["delta"].items()}


def assert_state(theta: dict, v: dict, index: str) -> None:
    for name in ("embed", "w"):
        assert bits(theta[name]) == bits(EX.f32(f"θ_{index}[{name}]")), (index, name)
        assert bits(v[name]) == bits(EX.f32(f"v_{index}[{name}]")), (index, name)


def test_the_ledger_computes_the_worked_example() -> None:
    cfg = ledger_config()
    led = Ledger(EX.theta0, cfg)
    (w_b, w_a), doc_weights = EX.f64("w_i (B, A)"), {}
    doc_weights.update(A=w_a, B=w_b, C=EX.f64("w_C")[0], D=EX.f64("w_D")[0], E=EX.f64("w_E")[0])
    for event in EX.events():
        assert event[1] == led.slot
        if event[0] == "close":
            if led.slot == 0:
                g = aggregate([e for e in led.entries() if e.slot == 1], led.shapes, cfg)
                for name in g:
                    assert g[name].reshape(-1).tolist() == EX.f64(f"g_1[{name}]")
            led.close_slot()
            if led.slot == 1:
                assert_state(led.params(), led.momentum(), "1")
            elif led.slot == 2:
                assert_state(led.params(), led.momentum(), "2")
            elif led.slot == 3:  # slot 1 left the window: the bottom is θ_1', v_1'
                snap = led.snapshot()
                assert (snap.base_slot, snap.slot) == (1, 3)
                assert_state(snap.base_params, snap.base_momentum, "1'")
            continue
        _, _, tag, slot, outcome = event
        assert meta(tag).target_slot == slot
        if outcome.startswith("refused:"):
            with pytest.raises(RemoteProtocolError) as err:
                led.add(meta(tag), deltas(tag))
            assert err.value.reason is Reason(outcome.removeprefix("refused:").strip())
            assert not led.has_seen(meta(tag).update_id)
            continue
        assert led.add(meta(tag), deltas(tag)).value == outcome
        if tag in doc_weights and outcome != "duplicate":
            entry = next(e for e in led.entries() if e.meta.update_id == meta(tag).update_id)
            applied_at = led.slot + 1 if outcome == "applied-stale" else slot
            assert (entry.slot, entry.weight) == (applied_at, doc_weights[tag])
        if outcome == "folded-late":
            theta, v = led.canonical_state()
            assert_state(theta, v, "2'")
            for name, a in led.params().items():  # the working state: the fold's rounding, not the canonical bits
                np.testing.assert_allclose(a, theta[name], rtol=1e-6, atol=1e-7)
    slots = {e.meta.origin: e.slot for e in led.entries()}
    assert (led.slot, led.base_slot, slots) == (4, 2, {"E": 4, "G": 5}) and led.held_future() == {}
    assert list(fold_coefficients(1, 2, cfg.eta, cfg.momentum)) == EX.f64("μ^(n−r)") + EX.f64("K")


def test_the_fingerprint_table_lists_the_ledgers_fingerprint() -> None:
    text = section()
    table = text[text.index("### Run-wide settings"):text.index("### Worked example")]
    keys = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert keys == [*LedgerConfig().fingerprint(), "outer_rule"]  # the last only in a run not of Nesterov


@pytest.mark.slow
def test_a_larger_case_follows_the_definitions_bit_for_bit() -> None:
    """What the small example cannot pin down: tensors of three norm chunks (150,001 and 150,000 elements),
    five updates arriving out of id order with non-integer weights, a late fold. The written definitions
    give the ledger's states bit for bit (the working state after the fold up to rounding), so a change
    of summation order, norm chunking, pairwise sum or the step's operation order turns this red."""
    rng = np.random.default_rng(7)
    shapes = {"emb": (3, 50_000), "t": (2 * CHUNK + 18_929,)}
    theta0 = {n: rng.standard_normal(s).astype(F32) for n, s in shapes.items()}
    # pseudo-gradients of one model agree: a shared direction plus noise, under element scales spread
    # over six decades (which tell the summation orders apart)
    shared = {n: rng.standard_normal(s) for n, s in shapes.items()}
    spread = {n: 10.0 ** rng.integers(-3, 3, s) for n, s in shapes.items()}
    updates = {tag: dict(id=bytes([byte]) * 32, base=base, publish=publish, tokens=tokens, steps=10,
                         origin=origin or tag,
                         delta={n: ((shared[n] + 0.5 * rng.standard_normal(s)) * spread[n] * scale).astype(F32)
                                for n, s in shapes.items()})
               for tag, byte, base, publish, tokens, scale, origin in [
                   ("a", 5, 0, 0, 700, 1.0, None), ("b", 1, 0, 0, 1300, 1.0, None), ("c", 9, 0, 0, 400, 1.0, None),
                   ("d", 3, 0, 1, 900, 1.0, None), ("e", 7, 1, 1, 1100, 1.0, None),
                   ("f", 2, 1, 1, 800, 1e4, None),  # ×10⁴: clipped to τ
                   ("g", 4, 1, 1, 900, 1.0, "d"),  # d's origin again, a larger id: does not count
                   ("h", 6, 1, 1, 1000, 1.0, "e"),  # e's origin again, a smaller id: displaces e when it lands
                   ("i", 8, 1, 1, 1000, 1.0, None)]}  # made d's negation below: the direction screen leaves it out
    updates["i"]["delta"] = {n: -x for n, x in updates["d"]["delta"].items()}
    config = dict(window="3", lr="0.7", momentum="0.9", staleness_alpha="0.5", weighting="tokens",
                  aggregation="radial-directional", embeddings="[emb]", stale_policy="apply", max_future_slots="64",
                  norm_clip="2.0", direction_screen="0.05", max_step_rms="2.0")
    spec = Spec(SimpleNamespace(theta0=theta0, updates=updates, config=config))
    led = Ledger(theta0, LedgerConfig(window=3, lr=0.7, momentum=0.9, staleness_alpha=0.5,
                                      embeddings=frozenset({"emb"}), norm_clip=2.0, direction_screen=0.05,
                                      max_step_rms=2.0))
    tag_of = {u["id"]: tag for tag, u in updates.items()}

    def add(tag: str) -> str:
        u = updates[tag]
        meta = UpdateMeta(u["id"], u["origin"], u["base"], u["publish"], u["tokens"], u["steps"])
        return led.add(meta, {n: x.copy() for n, x in u["delta"].items()}).value

    zero = {n: np.zeros_like(a) for n, a in theta0.items()}
    slot1 = [(t, spec.weight(t, 1)) for t in "ab"]
    slot2 = [(t, spec.weight(t, 2)) for t in "defgi"]
    assert [add("a"), add("b")] == ["applied-open"] * 2
    led.close_slot()
    th1, v1 = spec.step(theta0, zero, slot1, 1)
    assert all(bits(led.params()[n]) == bits(th1[n]) and bits(led.momentum()[n]) == bits(v1[n]) for n in shapes)
    assert [add(t) for t in "defgic"] == ["applied-open"] * 5 + ["folded-late"]
    led.close_slot()
    assert add("h") == "folded-late"  # into slot 2, now the newest closed slot: e's coefficients go to 0
    slot2.append(("h", spec.weight("h", 2)))
    assert {n: spec.coefficient("f", spec.weight("f", 2), n, slot2) for n in shapes}["emb"] < \
        spec.weight("f", 2) / 1000.0  # f's embedding is clipped far below its weight
    assert spec.coefficient("e", spec.weight("e", 2), "t", slot2) == 0.0
    assert all(spec.screened(slot2, n) == {"i"} for n in shapes)  # the negated one, and only it
    assert any(spec.limit(t, slot2, n) < spec.bound(slot2, n) for t, _ in slot2 for n in shapes), \
        "an update's own limit A_i binds somewhere"
    th1c, v1c = spec.step(theta0, zero, slot1 + [("c", spec.weight("c", 1))], 1)
    th2c, v2c = spec.step(th1c, v1c, slot2, 2)
    cfg = led.config
    for slot, entries in ((1, slot1 + [("c", spec.weight("c", 1))]), (2, slot2)):  # binary64 aggregates, bit for bit
        g = aggregate([e for e in led.entries() if e.slot == slot], led.shapes, cfg)
        assert all(g[n].reshape(-1).tolist() == spec.aggregate(entries, n)[3].tolist() for n in shapes), slot
    theta, v = led.canonical_state()
    for n in shapes:
        assert bits(theta[n]) == bits(th2c[n]) and bits(v[n]) == bits(v2c[n]), n
        working = led.params()[n]  # the fold's roundings: within binary32 rounding of the largest values
        assert np.max(np.abs(working - th2c[n])) <= 1e-6 * np.max(np.abs(th2c[n]))
    # every update's norms are the written ones, and this data tells them from near misses: a sequential
    # sum of squares, one pairwise sum over the whole tensor, chunk sums added without fsum
    assert {(tag_of[e.meta.update_id], n): e.norms[n] for e in led.entries() for n in shapes} == \
        {(t, n): spec.norm(t, n) for t in updates for n in shapes}
    squares = {(t, n): (u["delta"][n].astype(F64).reshape(-1) ** 2).tolist()
               for t, u in updates.items() for n in shapes}
    for variant in (lambda sq: sum(sq), pairwise,
                    lambda sq: sum(pairwise(sq[i:i + CHUNK]) for i in range(0, len(sq), CHUNK))):
        assert any(math.sqrt(variant(sq)) != spec.norm(*key) for key, sq in squares.items())
    # a third update of e's origin in slot 2 (K = 2): that origin counts for nothing there any more
    updates["k"] = dict(id=bytes([10]) * 32, base=1, publish=1, tokens=1000, steps=10, origin="e",
                        delta={n: x.copy() for n, x in updates["e"]["delta"].items()})
    assert add("k") == "folded-late"
    slot2.append(("k", spec.weight("k", 2)))
    assert "e" not in {spec.origin(t) for t, _ in spec.counted(slot2)}
    th2k, v2k = spec.step(th1c, v1c, slot2, 2)
    theta, v = led.canonical_state()
    assert all(bits(theta[n]) == bits(th2k[n]) and bits(v[n]) == bits(v2k[n]) for n in shapes)
    assert any(bits(th2k[n]) != bits(th2c[n]) for n in shapes)
