"""Benchmark scripts for the sans-IO core, run as `python -m protocol.benchmarks.<name>`.

Never imported by `protocol` itself: these modules read clocks and allocate large arrays.
"""
