"""``diloco-sim``: the goodput table, single cells, the bandwidth model, and the calibration.

    python -m testnet.sim table [--out runs/sim] [--days 6] [--workers 2] [--seed 0] [--set name=value ...]
    python -m testnet.sim run --policy ours-m8 --chips 1.2e6 [--days 2] [--set name=value ...]
    python -m testnet.sim bandwidth --params 2.5e9 --step-seconds 0.707 --inner-steps 29 --bits 4 --islands 8
    python -m testnet.sim bandwidth --paper
    python -m testnet.sim calibrate [--days 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from protocol.errors import LocalProtocolError
from testnet.sim.bandwidth import GOSSIP, RING, BandwidthSetting, compare_measured, estimate, paper_example
from testnet.sim.calibrate import calibrate
from testnet.sim.config import SimConfig, parse_override
from testnet.sim.engine import simulate
from testnet.sim.layout import Policy
from testnet.sim.paper import PAPER_BANDWIDTH, PAPER_CHIPS
from testnet.sim.table import DEFAULT_POLICIES, ablation_specs, format_ablations, format_table, run_cells, table_specs

__all__ = ["main"]


def _config(args: argparse.Namespace) -> SimConfig:
    cfg = SimConfig()
    changes = dict(parse_override(text, cfg) for text in args.set)
    if args.days is not None:
        changes["horizon_seconds"] = args.days * 86400.0
    return cfg.replace(**changes)


def _cmd_table(args: argparse.Namespace) -> int:
    cfg = _config(args)
    t0 = time.perf_counter()
    chips = [int(float(c)) for c in args.chips] if args.chips else list(PAPER_CHIPS)
    main = run_cells(table_specs(cfg, args.policies, chips), seed=args.seed, workers=args.workers)
    print(f"goodput (%), seed {args.seed}, {cfg.horizon_seconds / 86400:g} simulated days per cell")
    print(format_table(main, chips))
    abl = []
    if not args.no_ablations:
        abl = run_cells(ablation_specs(cfg), seed=args.seed, workers=args.workers)
        print("\nablations at 1.2M chips (M=8 unless named):")
        print(format_ablations(abl))
    wall = time.perf_counter() - t0
    print(f"\n{len(main) + len(abl)} cells in {wall:.1f} s wall ({args.workers} worker(s))")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "config": dataclasses.asdict(cfg), "seed": args.seed, "wall_seconds": wall,
        "table": [c.as_json() for c in main], "ablations": [c.as_json() for c in abl],
    }
    (out / "goodput.json").write_text(json.dumps(doc, indent=2))
    from testnet.sim.plot import plot_table  # matplotlib only when a plot is asked for

    png = plot_table(main, out / "goodput.png")
    print(f"wrote {out / 'goodput.json'} and {png}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    cfg = _config(args)
    t0 = time.perf_counter()
    r = simulate(Policy.parse(args.policy), int(float(args.chips)), cfg, seed=args.seed)
    print(json.dumps({
        "policy": r.policy, "chips": r.chips, "seed": r.seed, "goodput": r.goodput, "failures": r.failures,
        "slot_updates_mean": r.slot_updates_mean, "hold_per_round_mean": r.hold_per_round_mean,
        "hold_per_round_max": r.hold_per_round_max, "closed_by": r.closed_by, "receptions": r.receptions,
        "events": r.events, "seconds": time.perf_counter() - t0,
    }, indent=2))
    return 0


def _cmd_bandwidth(args: argparse.Namespace) -> int:
    if args.paper:
        setting, h_exact = paper_example(args.params or 2.5e9)
        print(f"paper example: {PAPER_BANDWIDTH['islands']} datacenters, DP {PAPER_BANDWIDTH['dp_gbps']} Gbit/s vs "
              f"ours {PAPER_BANDWIDTH['ours_gbps']} Gbit/s; assumed fp32 DP gradients, 4-bit outer gradients, "
              f"ring all-reduce for both; solved step {setting.step_seconds:.4f} s, "
              f"H {h_exact:.2f} → {setting.inner_steps}")
        settings = [setting, dataclasses.replace(setting, topology=GOSSIP)]
    else:
        missing = [n for n in ("params", "step_seconds", "inner_steps") if getattr(args, n) is None]
        if missing:
            flags = " ".join("--" + m.replace("_", "-") for m in missing)
            raise LocalProtocolError(f"bandwidth needs {flags} (or --paper)")
        settings = [BandwidthSetting(args.params, args.step_seconds, args.inner_steps, args.bits, args.islands,
                                     args.dp_bits, args.topology)]
    for s in settings:
        e = estimate(s)
        print(f"[{s.topology}] params {s.params:.3g}, step {s.step_seconds:.4g} s, H {s.inner_steps}, "
              f"{s.bits:g} bits vs DP {s.dp_bits:g} bits, {s.islands} islands: "
              f"DP {e.dp_gbps:.2f} Gbit/s, ours {e.ours_gbps:.3f} Gbit/s, ratio {e.ratio:.1f}×")
    if args.measured is not None:
        c = compare_measured(_measured(args.measured), settings[-1])
        print(f"measured {c.measured_bytes_per_step:.4g} B/node/step vs predicted {c.predicted_bytes_per_step:.4g}: "
              f"×{c.measured_over_predicted:.3f}; communication ratio vs DP {c.measured_ratio_vs_dp:.1f}×")
    return 0


def _measured(text: str) -> float:
    """A number, or a testnet ``report.json`` (its ``communication.bytes_per_node_step``)."""
    try:
        return float(text)
    except ValueError:
        doc = json.loads(Path(text).read_text())
        try:
            return float(doc["communication"]["bytes_per_node_step"])
        except (KeyError, TypeError) as exc:
            raise LocalProtocolError(f"{text}: no communication.bytes_per_node_step (a testnet report.json?)") from exc


def _cmd_calibrate(args: argparse.Namespace) -> int:
    cfg = _config(argparse.Namespace(set=args.set, days=None))
    t0 = time.perf_counter()
    cal = calibrate(cfg, horizon_seconds=args.days * 86400.0, seed=args.seed)
    print(f"return_seconds = {cal.return_seconds} (config {cfg.return_seconds}), "
          f"resize_seconds = {cal.resize_seconds} (config {cfg.resize_seconds})")
    print(f"DP @ 1.2M = {100 * cal.dp_goodput:.2f} % (target {100 * cal.targets[0]:.0f}), "
          f"elastic @ 1.2M = {100 * cal.elastic_goodput:.2f} % (target {100 * cal.targets[1]:.0f}); "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="diloco-sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    def sim_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--days", type=float, default=None, help="simulated days per cell (table: 6, run: 2)")
        sp.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="override a SimConfig field")

    t = sub.add_parser("table", help="the goodput table, JSON and PNG")
    sim_args(t)
    t.set_defaults(days=6.0)
    t.add_argument("--out", default="runs/sim")
    t.add_argument("--workers", type=int, default=2)
    t.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES))
    t.add_argument("--chips", nargs="+", default=None)
    t.add_argument("--no-ablations", action="store_true")
    t.set_defaults(fn=_cmd_table)

    r = sub.add_parser("run", help="one cell")
    sim_args(r)
    r.add_argument("--policy", required=True, help="dp, elastic, ours-m8, ...")
    r.add_argument("--chips", required=True)
    r.set_defaults(fn=_cmd_run)

    b = sub.add_parser("bandwidth", help="required cross-island bandwidth, DP vs ours")
    b.add_argument("--params", type=float)
    b.add_argument("--step-seconds", type=float)
    b.add_argument("--inner-steps", type=int)
    b.add_argument("--bits", type=float, default=4.0)
    b.add_argument("--islands", type=int, default=8)
    b.add_argument("--dp-bits", type=float, default=32.0)
    b.add_argument("--topology", choices=[GOSSIP, RING], default=GOSSIP)
    b.add_argument("--paper", action="store_true", help="settings that reproduce the paper's 198 vs 0.84 Gbit/s")
    b.add_argument("--measured", help="bytes sent per node per step, or a testnet report JSON")
    b.set_defaults(fn=_cmd_bandwidth)

    c = sub.add_parser("calibrate", help="solve return_seconds and resize_seconds against the 1.2M column")
    c.add_argument("--days", type=float, default=10.0)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    c.set_defaults(fn=_cmd_calibrate)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except LocalProtocolError as exc:
        print(f"diloco-sim: error: {exc}", file=sys.stderr)
        return 2
