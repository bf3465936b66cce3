"""Moved to ``testnet.benchmarks.blob_plane`` (benchmarks live under ``testnet/benchmarks/``); this keeps
``python -m p2p.bench``, the command BENCHMARKS.md's older entries name, working."""

if __name__ == "__main__":
    import runpy

    runpy.run_module("testnet.benchmarks.blob_plane", run_name="__main__", alter_sys=True)
