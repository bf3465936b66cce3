"""Tier (c): a user's mistake on the library path (`diloco.run` in the user's own script) is one line on stderr
and exit status 2, as on `diloco-node`'s command line: a data file the task's batches open that is missing,
a model whose `config` would replace a field diloco takes from the model; `diloco-sample` on a library model's
checkpoint says in one line where to sample it. The scripts run at once (each pays for importing JAX)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from node_net_helpers import REPO, node_env

TIMEOUT_S = 120.0

SCRIPT = textwrap.dedent('''
    import sys
    import jax.numpy as jnp
    import numpy as np
    import diloco

    def init(key):
        return {"w": jnp.zeros((3, 1))}

    def loss(params, batch):
        return jnp.mean((batch["x"] @ params["w"])[:, 0] - batch["y"]) ** 2

    def batches(peer_id):
        data = np.load(sys.argv[1])  # the user's file: missing in this test
        while True:
            yield {"x": data[:8, :3], "y": data[:8, 3]}

    config = {"model.parameters": 1} if sys.argv[2] == "replace" else {}
    model = diloco.Model(name="reg", init=init, loss=loss, config=config)
    example = {"x": np.zeros((8, 3), np.float32), "y": np.zeros(8, np.float32)}
    task = diloco.Task(model, batches=batches, tokens_per_batch=8, example=example if config else None)
    raise SystemExit(diloco.run(task, sys.argv[3:]))
''')


def test_library_errors_are_one_line_and_exit_2(tmp_path: Path, jax_cache: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cases = {
        "missing file": ("none", "diloco-node: error: the task's data:", "No such file or directory"),
        "config replacing a field": ("replace", "diloco-node: error: Model 'reg': config sets model.parameters=1",
                                     "leave it out"),
    }
    procs = {}
    for name, (mode, _, _) in cases.items():
        home = tmp_path / name.replace(" ", "-")
        home.mkdir()
        procs[name] = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "missing.npy"), mode, "--run-id", "lib", "--key",
             str(home / "key"), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=node_env(jax_cache), cwd=REPO)
    for name, (_, start, detail) in cases.items():
        out, err = procs[name].communicate(timeout=TIMEOUT_S)
        lines = err.strip().splitlines()
        assert procs[name].returncode == 2, (name, err[-3000:])
        assert len(lines) == 1 and lines[0].startswith(start) and detail in lines[0], (name, lines)
        assert "LISTENING" not in out


def test_diloco_sample_says_where_to_sample_a_library_model(tmp_path: Path, jax_cache: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    export = tmp_path / "model.safetensors"
    save_file({"w": np.zeros((3, 1), np.float32)}, str(export),
              metadata={"diloco.run_config": 'model.name="reg"\nmodel.parameters=3\n'})
    done = subprocess.run([sys.executable, "-m", "node.sample", str(export)], capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=REPO, env=node_env(jax_cache))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "library model (reg)" in lines[0] and "diloco.load(SOURCE, model)" in lines[0], lines
