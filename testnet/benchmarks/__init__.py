"""Benchmark scripts for the sans-IO core (they time things, so they live outside `protocol/`), run as
`python -m testnet.benchmarks.<name>`: `codecs` (pseudo-gradient compression) and `ledger_fold` (folding
a late update into the ledger against one outer step). Figures and dates: BENCHMARKS.md."""
