"""Tier (c): the model gets out. A real node trains a few rounds and stops (its last checkpoint written);
(its log written as JSON lines to a file); `diloco-export` turns the checkpoint into a safetensors file that a process importing only safetensors and
numpy loads, with exactly the run's global parameters (the ledger replayed); `diloco-sample` prints text
from the checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
from node_net_helpers import REPO

from node.export import global_params, load_checkpoint, model_config

COMMON = ["--inner-steps", "5", "--eval-every", "0", "--max-rounds", "3"]

LOAD_ALONE = """
import sys
import numpy as np
from safetensors.numpy import load_file
params = load_file(sys.argv[1])
assert "node" not in sys.modules and "protocol" not in sys.modules, "only safetensors and numpy"
np.savez(sys.argv[2], **params)
print(len(params), sum(v.size for v in params.values()))
"""


def test_a_checkpoint_exports_to_safetensors_with_the_runs_global_parameters_and_samples_text(cluster, tmp_path) -> None:
    log_file = tmp_path / "node.jsonl"
    node = cluster("a", *COMMON, "--log-format", "json", "--log-file", str(log_file))
    assert node.wait_exit(180.0) == 0, node.log_tail()
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]  # every line one JSON object
    assert lines and all({"time", "level", "peer", "logger", "message"} <= set(x) for x in lines)
    assert any(x["logger"] == "node.outer.rounds" and "published" in x["message"] for x in lines)
    checkpoint_dir = node.home / "ckpt"
    out = tmp_path / "model.safetensors"
    export = subprocess.run([sys.executable, "-m", "node.export", str(checkpoint_dir), "-o", str(out)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert export.returncode == 0, export.stderr
    assert "wrote" in export.stdout and "global parameters" in export.stdout

    loaded = subprocess.run([sys.executable, "-c", LOAD_ALONE, str(out), str(tmp_path / "loaded.npz")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 0, loaded.stderr
    ckpt = load_checkpoint(checkpoint_dir)
    expected = global_params(ckpt)
    with np.load(tmp_path / "loaded.npz") as got:
        assert set(got.files) == set(expected)
        for name, value in expected.items():
            assert got[name].dtype == np.float32 and np.array_equal(got[name], value), name
    local = {k[len("params/"):]: v for k, v in ckpt.inner.items() if k.startswith("params/")}
    assert any(not np.array_equal(local[n], expected[n]) for n in expected), "global, not the node's local copy"
    assert model_config(ckpt.meta["run_config"]).d_model == 32  # the architecture travels with it

    sample = subprocess.run([sys.executable, "-m", "node.sample", str(out), "--prompt", "The ", "--tokens", "40"],
                            cwd=REPO, capture_output=True, text=True, timeout=180)
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout.startswith("The ") and len(sample.stdout.encode()) >= 40, sample.stdout
    same = subprocess.run([sys.executable, "-m", "node.sample", str(checkpoint_dir), "--tokens", "40"], cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert same.returncode == 0 and same.stdout == sample.stdout, "the checkpoint and its export give the same text"
