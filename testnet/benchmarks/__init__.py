"""Benchmark scripts (they time things, so they live outside `protocol/` and `node/`), run as
`python -m testnet.benchmarks.<name>`: among them `codecs` (pseudo-gradient compression), `ledger_fold`
(a late update's fold against one outer step), `scale` (the outer machinery at real model sizes) and
`inner` (the inner loop's tokens/s and MFU on whatever JAX runs on). Figures and dates: BENCHMARKS.md."""
