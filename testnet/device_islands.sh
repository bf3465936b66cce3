#!/usr/bin/env bash
# The island benchmarks on an accelerator (issue 46), in one short run: bytes of device memory per parameter,
# steps/s and MFU for `large` replicated and sharded, with and without remat. Every command has its own timeout;
# figures land in ${OUT:-/tmp/islands}/*.json and on stdout. Usage: bash testnet/device_islands.sh
set -u
out="${OUT:-/tmp/islands}"; mkdir -p "$out"
pip install -q -e . 'jax[cuda13]' >/dev/null 2>&1 || pip install -q -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
n=$(python -c 'import jax; print(jax.local_device_count())')
bench() { timeout 150 python -m testnet.benchmarks.inner "$@" 2>&1 | tail -5; }
bench --model large --steps 20 --repeats 3 --mesh "data=$n" --json "$out/large_data.json" batch_size=16
bench --model large --steps 20 --repeats 3 --mesh "data=1,fsdp=$n" --remat --json "$out/large_remat.json" batch_size=16
bench --model base --steps 20 --repeats 3 --mesh "data=$n" --json "$out/base_data.json"
