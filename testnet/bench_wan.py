"""`python -m testnet.bench wan`: diloco against data-parallel that really talks, over the same emulated WAN.

1. **The scale.** The seeds' data-parallel needs 198 Gbit/s per datacenter to keep its chips busy where the
   links give 2-5 (their 12B model; docs/design.md, "The WAN benchmark's scale"): its per-step traffic takes
   κ = 198 / `--paper-gbps` times its compute time. Here the compute time of one step of one worker (`step_s`)
   is measured first, N workers at once on this machine, and the link rate is chosen so that data-parallel's
   ring all-reduce of fp32 gradients (2(N-1)/N × 4 B × parameters per worker and step) takes κ × `step_s`.
2. **diloco**: a testnet of N nodes (`diloco-testnet --wan RATE,DELAY`), each node in its own namespace behind
   that link with `--rtt-ms` / 2 one-way delay (`testnet.wan`: netem, or the delay line where netem is
   missing), with its in-process data-parallel baseline on the same tokens (the curve of loss against steps).
3. **data-parallel over the network** (`testnet.dp_network`): N processes in N namespaces behind the same
   links, the same model, data shards, schedule and held-out batches, their gradients all-reduced by
   `jax.distributed` (gloo over TCP) every step, for `--dp-seconds`: its seconds per step and its bytes on the
   links are measured.
4. **The figures.** The target is the held-out bits per byte every diloco node reached by the end of its run;
   diloco's time to it is measured (from the testnet's launch, start-up included). Data-parallel's steps to the
   target come from the baseline's curve (the same computation as over the network, which cannot train for
   hours here), its time = those steps × its measured seconds per step; also against an *ideal* data-parallel
   (one ring all-reduce per step at the full link rate, 2(N-1) one-way delays, no other cost), a bound that
   no implementation reaches. Bytes per node per second are each method's own counts; the bandwidth each
   needs to keep its workers busy is its bytes per step over `step_s`.

Writes `wan.json` (`--json FILE` too) and `wan.png` (held-out against wall time, log scale) in the run's
directory. Needs root and network namespaces (it says why not and exits 2 otherwise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from testnet.options import Options
from testnet.wan import LinkSpec, WanNetwork, probe

__all__ = ["bench_wan", "scaled_rate_mbit"]

PAPER_DP_GBPS = 198.0  # data-parallel's bandwidth need across 8 datacenters in the seeds' paper
COORDINATOR_PORT = 7733

STEP_TIMER = """
import sys, time
from node.island.data import Dataset
from node.island.train import InnerLoop
from testnet.baseline_run import baseline_config
cfg = baseline_config(sys.argv[1], (), 0)
ds = Dataset(cfg.data, seq_len=cfg.model.seq_len, vocab_size=cfg.model.vocab_size)
loop = InnerLoop.byte_lm(cfg, ds.batcher(sys.argv[2], batch_size=cfg.data.batch_size))
loop.warm_up()
loop.run(5)
start = time.perf_counter()
loop.run(int(sys.argv[3]))
print((time.perf_counter() - start) / int(sys.argv[3]))
"""


def ring_bytes(params: int, nodes: int) -> float:
    """What a ring all-reduce of fp32 gradients sends per worker and step."""
    return 2 * (nodes - 1) / nodes * 4 * params


def scaled_rate_mbit(params: int, nodes: int, step_s: float, kappa: float) -> float:
    """The link rate at which data-parallel's all-reduce takes `kappa` × its compute time per step."""
    return ring_bytes(params, nodes) * 8 / (kappa * step_s) / 1e6


def measure_step_seconds(nodes: int, model: str, steps: int = 40) -> float:
    """Seconds per inner step of one worker while `nodes` workers train at once on this machine (mean)."""
    procs = [subprocess.Popen([sys.executable, "-c", STEP_TIMER, model, f"timer-{i}", str(steps)],
                              stdout=subprocess.PIPE, text=True) for i in range(nodes)]
    seconds = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode:
            raise RuntimeError(f"the step timer failed (exit {proc.returncode})")
        seconds.append(float(out.split()[-1]))
    return statistics.mean(seconds)


def run_dp_network(spec: LinkSpec, qdisc: str, *, nodes: int, model: str, seed: int, shard_keys: Sequence[str],
                   overrides: Sequence[str], eval_batches: int, eval_every: int, seconds: float,
                   out: Path) -> dict[str, Any]:
    """Data-parallel over N namespaces behind `spec` links for `seconds`; its record and the links' bytes."""
    net = WanNetwork(nodes, spec, qdisc)
    net.setup()
    try:
        argv = ["--coordinator", f"{net.host(0)}:{COORDINATOR_PORT}", "--num-processes", str(nodes), "--model", model,
                "--seed", str(seed), "--steps", "1000000", "--eval-every", str(eval_every),
                "--eval-batches", str(eval_batches), "--max-seconds", str(seconds), "--out", str(out),
                "--shard-keys", *shard_keys, *(f"--set={item}" for item in overrides)]
        logs = [open(out.with_name(f"dp-{i}.log"), "w") for i in range(nodes)]
        procs = [subprocess.Popen([*net.exec_prefix(i), sys.executable, "-m", "testnet.dp_network", *argv,
                                   "--process-id", str(i)], stdout=log, stderr=subprocess.STDOUT)
                 for i, log in enumerate(logs)]
        for proc in procs:
            proc.wait(timeout=seconds + 600)
        for log in logs:
            log.close()
        if any(p.returncode for p in procs):
            raise RuntimeError(f"data-parallel over the network failed: see {out.with_name('dp-0.log')}")
        stats = net.link_stats()
    finally:
        net.teardown()
    record = json.loads(out.read_text())
    record["link_bytes_sent"] = {name: port["sent_bytes"] for name, port in stats.items()
                                 if name.startswith(f"dlc{net.tag}n")}
    return record


def _first_at_or_below(points: Sequence[tuple[float, float]], target: float) -> float | None:
    return next((x for x, y in points if y <= target), None)


def figures(report: dict[str, Any], baseline: dict[str, Any], dp: dict[str, Any], *, step_s: float,
            rate_mbit: float, one_way_ms: float, kappa: float) -> dict[str, Any]:
    """Everything `wan.json` holds, from the testnet's report, its baseline's curve and the DP record."""
    run, nodes = report["run"], report["run"]["nodes"]
    curves = report["curves"]["nodes"]  # node -> [tokens_all_nodes, seconds, bpb]
    target = max(points[-1][2] for points in curves.values())
    ours_s = max(_first_at_or_below([(s, b) for _, s, b in points], target) for points in curves.values())
    tokens_per_step = dp["points"][-1][2] / max(1, dp["points"][-1][1])
    dp_steps = _first_at_or_below([(step, bpb) for step, _, bpb in baseline["points"]], target)
    dp_step_s = statistics.median(dp["step_seconds"])
    ideal_step_s = step_s + ring_bytes(run["param_count"], nodes) * 8 / (rate_mbit * 1e6) \
        + 2 * (nodes - 1) * one_way_ms / 1000
    steps_done = dp["points"][-1][1]
    dp_bytes_step = sum(dp["link_bytes_sent"].values()) / nodes / max(1, steps_done)
    comm = report["communication"]
    ours_bytes_s = comm["bytes_sent"] / nodes / run["duration_s"]
    dp_s = None if dp_steps is None else dp_steps * dp_step_s
    return {
        "nodes": nodes, "model": run["model"], "param_count": run["param_count"], "inner_steps": run["inner_steps"],
        "rtt_ms": 2 * one_way_ms, "rate_mbit": rate_mbit, "kappa": kappa, "step_s": step_s,
        "target_bpb": target, "ours_time_to_target_s": ours_s,
        "dp_steps_to_target": dp_steps, "dp_step_s": dp_step_s, "dp_time_to_target_s": dp_s,
        "dp_ideal_step_s": ideal_step_s,
        "dp_ideal_time_to_target_s": None if dp_steps is None else dp_steps * ideal_step_s,
        "speedup_time_to_target": None if dp_s is None else dp_s / ours_s,
        "speedup_vs_ideal_dp": None if dp_steps is None else dp_steps * ideal_step_s / ours_s,
        "ours_bytes_per_node_s": ours_bytes_s, "dp_bytes_per_node_s": dp_bytes_step / dp_step_s,
        "ours_bytes_per_node_step": comm["bytes_per_node_step"], "dp_bytes_per_node_step": dp_bytes_step,
        "ours_mbit_to_keep_busy": comm["bytes_per_node_step"] * 8 / step_s / 1e6,
        "dp_mbit_to_keep_busy": dp_bytes_step * 8 / step_s / 1e6,
        "dp_steps_measured": steps_done, "dp_tokens_per_step": tokens_per_step,
        "ours_held_out_vs_dp_equal_tokens": report["quality"]["at_equal_tokens"]["ratio"],
        "wan": run["wan"],
    }


def plot(report: dict[str, Any], baseline: dict[str, Any], dp: dict[str, Any], f: dict[str, Any],
         path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for node, points in sorted(report["curves"]["nodes"].items()):
        ax.plot([max(s, 1.0) for _, s, _ in points], [b for *_, b in points], lw=1, label=f"diloco node {node}")
    ax.plot([max(s, 1.0) for s, *_ in dp["points"]], [p[3] for p in dp["points"]], "ko-", ms=3,
            label="data-parallel over the links (measured)")
    steps = [(max(step, 1) * f["dp_step_s"], bpb) for step, _, bpb in baseline["points"]]
    ax.plot(*zip(*steps), "k--.", lw=1, ms=4, label=f"data-parallel: baseline curve x {f['dp_step_s']:.2f} s/step measured")
    ideal = [(max(step, 1) * f["dp_ideal_step_s"], bpb) for step, _, bpb in baseline["points"]]
    ax.plot(*zip(*ideal), ":", color="grey", lw=1, label=f"ideal data-parallel ({f['dp_ideal_step_s']:.2f} s/step)")
    ax.axhline(f["target_bpb"], color="red", lw=0.8, label=f"target {f['target_bpb']:.3f} bpb")
    ax.set_xscale("log")
    ax.set_xlabel("wall time (s, log)")
    ax.set_ylabel("held-out bits per byte")
    ax.set_ylim(top=min(8.0, max(p[3] for p in dp["points"]) + 0.2))
    ax.set_title(f"{f['nodes']} nodes, {f['model']}, {f['rate_mbit']:.2f} Mbit/s, {f['rtt_ms']:g} ms RTT "
                 f"(scaled: DP comm = {f['kappa']:.0f} x compute)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bench_wan(a: argparse.Namespace, run: Callable[[Options], dict[str, Any]]) -> int:
    one_way = a.rtt_ms / 2
    support = probe(LinkSpec(100.0, one_way, 0.0))
    if not support.available:
        print(f"the WAN benchmark needs emulated links: {support.reason}", file=sys.stderr)
        return 2
    kappa = PAPER_DP_GBPS / a.paper_gbps
    from testnet.baseline_run import baseline_config
    from node.island.bytelm import byte_lm_model

    params = byte_lm_model(baseline_config(a.model, (), a.seed)).param_count
    print(f"measuring one worker's step time with {a.nodes} workers at once ...", flush=True)
    step_s = measure_step_seconds(a.nodes, a.model)
    rate = scaled_rate_mbit(params, a.nodes, step_s, kappa)
    link = f"{rate:.4f}mbit,{one_way:g}ms"
    print(f"step {step_s * 1000:.1f} ms; data-parallel's all-reduce {ring_bytes(params, a.nodes):,.0f} B per worker "
          f"and step; kappa = {PAPER_DP_GBPS:g} / {a.paper_gbps:g} = {kappa:.1f}: link {link}", flush=True)
    report = run(Options(nodes=a.nodes, minutes=a.minutes, seed=a.seed, out=a.out, progress="plain", model=a.model,
                         inner_steps=a.inner_steps, solo_seconds=a.solo_seconds, wan=link))
    run_dir = Path(report["run_dir"])
    baseline = json.loads((run_dir / "baseline.json").read_text())
    overrides = json.loads((run_dir / "run.json").read_text()).get("extra", {}).get("config_overrides", [])
    print(f"data-parallel over the same links for {a.dp_seconds:g} s ...", flush=True)
    started = time.monotonic()
    dp = run_dp_network(LinkSpec.parse(link), support.qdisc or "netem", nodes=a.nodes, model=a.model, seed=a.seed,
                        shard_keys=baseline["shard_keys"], overrides=overrides, eval_batches=4,
                        eval_every=a.dp_eval_every, seconds=a.dp_seconds, out=run_dir / "dp_network.json")
    print(f"  ... {dp['points'][-1][1]} steps in {time.monotonic() - started:.0f} s", flush=True)
    f = figures(report, baseline, dp, step_s=step_s, rate_mbit=rate, one_way_ms=one_way, kappa=kappa)
    (run_dir / "wan.json").write_text(json.dumps(f, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(f, indent=1))
    plot(report, baseline, dp, f, run_dir / "wan.png")
    _print(f, run_dir)
    return 0


def _print(f: dict[str, Any], run_dir: Path) -> None:
    def s(x: float | None) -> str:
        return "not reached" if x is None else f"{x:,.1f} s"

    print(f"\n{f['nodes']} nodes of {f['model']} ({f['param_count']:,} parameters), H = {f['inner_steps']}, over "
          f"{f['rate_mbit']:.3f} Mbit/s per node and {f['rtt_ms']:g} ms RTT ({f['wan']})")
    print(f"scale: data-parallel's all-reduce = {f['kappa']:.1f} x its compute per step "
          f"({f['step_s'] * 1000:.1f} ms), as the seeds' 12B model on {PAPER_DP_GBPS / f['kappa']:g} Gbit/s")
    print(f"target: {f['target_bpb']:.4f} held-out bpb (what every diloco node reached)")
    print(f"  diloco, time to target (measured)                 {s(f['ours_time_to_target_s'])}")
    print(f"  data-parallel, {f['dp_steps_to_target']} steps x {f['dp_step_s']:.3f} s/step measured    "
          f"{s(f['dp_time_to_target_s'])}")
    print(f"  ideal data-parallel, x {f['dp_ideal_step_s']:.3f} s/step                  "
          f"{s(f['dp_ideal_time_to_target_s'])}")
    if f["speedup_time_to_target"] is not None:
        print(f"  speedup: {f['speedup_time_to_target']:.1f}x (against the ideal: {f['speedup_vs_ideal_dp']:.1f}x); "
              f"target >= 10x {'met' if f['speedup_time_to_target'] >= 10 else 'NOT met'}")
    print(f"bytes per node per second: diloco {f['ours_bytes_per_node_s']:,.0f}, data-parallel "
          f"{f['dp_bytes_per_node_s']:,.0f}")
    print(f"bandwidth to keep the workers busy: diloco {f['ours_mbit_to_keep_busy']:.3f} Mbit/s, data-parallel "
          f"{f['dp_mbit_to_keep_busy']:.3f} Mbit/s "
          f"({f['dp_mbit_to_keep_busy'] / max(1e-12, f['ours_mbit_to_keep_busy']):.0f}x)")
    print(f"files: {run_dir / 'wan.json'}, {run_dir / 'wan.png'}")
