"""Moved to ``testnet.benchmarks.ledger_demo`` (benchmarks live under ``testnet/benchmarks/``); this keeps
``python -m protocol.ledger.demo``, the command BENCHMARKS.md's older entries name, working."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("testnet.benchmarks.ledger_demo", run_name="__main__", alter_sys=True)
