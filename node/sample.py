"""`diloco-sample`: generate text with a trained model — from a node's checkpoint (the run's global
parameters, `node.export.global_params`) or from a file `diloco-export` wrote.

    diloco-sample SOURCE [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S] [--tokenizer FILE]

SOURCE is a `--checkpoint-dir`, a `ckpt-*.dlc` file or a `.safetensors` export. The architecture comes from
the run configuration stored with it; for a checkpoint written before that was stored, give the node's
`--model`/`--set` flags. Tokens are bytes for a model trained on text read as bytes: the output is the
prompt and its continuation, decoded as UTF-8 (invalid sequences shown as U+FFFD). A model trained with a
tokenizer (`--set tokenizer=FILE`; its hash is in the run configuration) needs that file, `--tokenizer FILE`,
which encodes the prompt and decodes the output. The context is the model's `seq_len` last tokens; each
new token is drawn from softmax(logits / T) over the `top_k` likeliest (T = 0: greedy).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from node.checkpoint import CheckpointError
from node.export import global_params, load_checkpoint, load_exported, model_config
from node.island.config import ConfigError, ModelConfig, preset
from protocol.errors import LocalProtocolError

__all__ = ["generate", "main"]


def generate(cfg: ModelConfig, params: Mapping[str, np.ndarray], prompt: bytes, tokens: int, *,
             temperature: float = 0.8, top_k: int = 40, seed: int = 0) -> bytes:
    """`prompt` followed by `tokens` bytes the model draws one at a time (a byte-level model)."""
    if cfg.vocab_size != 256:
        raise ConfigError(f"this model's vocabulary has {cfg.vocab_size} tokens, not 256 bytes: give the "
                          "tokenizer it was trained with (--tokenizer FILE)")
    return bytes(generate_ids(cfg, params, list(prompt or b"\n"), tokens, temperature=temperature, top_k=top_k,
                              seed=seed))


def generate_ids(cfg: ModelConfig, params: Mapping[str, np.ndarray], prompt: Sequence[int], tokens: int, *,
                 temperature: float = 0.8, top_k: int = 40, seed: int = 0) -> list[int]:
    """`prompt` (token ids) followed by `tokens` ids the model draws one at a time."""
    import jax
    import jax.numpy as jnp

    from node.island.model import check_flat, make_apply

    check_flat(cfg, params)
    apply = jax.jit(make_apply(cfg))
    flat = {k: jnp.asarray(v) for k, v in params.items()}
    rng = np.random.default_rng(seed)
    out = list(prompt) or [0]
    for _ in range(tokens):
        context = np.asarray(out[-cfg.seq_len:], dtype=np.int32)
        window = np.zeros((1, cfg.seq_len), dtype=np.int32)  # a fixed shape: one compilation
        window[0, : len(context)] = context
        logits = np.asarray(apply(flat, jnp.asarray(window))[0, len(context) - 1], dtype=np.float64)
        if temperature <= 0:
            out.append(int(np.argmax(logits)))
            continue
        keep = np.argsort(logits)[-max(1, top_k):]
        weights = np.exp((logits[keep] - logits[keep].max()) / temperature)
        out.append(int(rng.choice(keep, p=weights / weights.sum())))
    return out


def _run_tokenizer(run_config: str) -> str:
    """The SHA-256 of the tokenizer a run encodes text with ("" for bytes, or a source that does not say)."""
    from protocol.runconfig import decode_config

    return str(decode_config(run_config).get("data.tokenizer", "")) if run_config else ""


def _with_tokenizer(cfg: ModelConfig, params: Mapping[str, np.ndarray], want: str, path: Path | None,
                    args: argparse.Namespace) -> str:
    """Text from a model trained on tokenized text: the prompt encoded and the output decoded with the
    tokenizer at `path`, which must be the run's (`want`, its hash; "" when the source does not say)."""
    from node.island.tokens import load_tokenizer, tokenizer_hash

    if path is None:
        raise ConfigError(f"this model was trained with the tokenizer of sha256 {want}: give that file with "
                          "--tokenizer FILE" if want else "this model was not trained on bytes: give its tokenizer "
                          "with --tokenizer FILE")
    if want and tokenizer_hash(str(path)) != want:
        raise ConfigError(f"--tokenizer {path} is not the run's tokenizer (sha256 {want})")
    tokenizer = load_tokenizer(str(path))
    prompt = tokenizer.encode(args.prompt).ids
    ids = generate_ids(cfg, params, prompt, args.tokens, temperature=args.temperature, top_k=args.top_k,
                       seed=args.seed)
    return tokenizer.decode(ids)


def _source(path: Path) -> tuple[dict[str, np.ndarray], str]:
    """Parameters and run configuration text of a checkpoint (dir or file) or an exported file."""
    if path.suffix == ".safetensors":
        params, metadata = load_exported(path)
        return params, metadata.get("diloco.run_config", "")
    ckpt = load_checkpoint(path)
    return global_params(ckpt), str(ckpt.meta.get("run_config", ""))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="diloco-sample", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("source", type=Path, metavar="SOURCE", help="checkpoint dir, ckpt-*.dlc file or .safetensors export")
    p.add_argument("--prompt", default="The ", help="text to continue (default: %(default)r)")
    p.add_argument("--tokens", type=int, default=200, metavar="N", help="bytes to generate (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.8, metavar="T", help="0: greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=40, metavar="K", help="draw among the K likeliest (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="sampling seed (default: %(default)s)")
    p.add_argument("--tokenizer", type=Path, default=None, metavar="FILE",
                   help="the tokenizer file the model was trained with (--set tokenizer=FILE); default: bytes")
    p.add_argument("--model", default=None, metavar="PRESET", help="architecture, only for sources that do not store it")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="with --model: the node's --set flags")
    args = p.parse_args(argv)
    try:
        params, run_config = _source(args.source)
        if args.model is not None:
            cfg = preset(args.model).with_overrides_from_strings(args.overrides).model
        elif run_config:
            cfg = model_config(run_config)
        else:
            raise ConfigError(f"{args.source} does not say which model it holds: give --model (and --set)")
        want = _run_tokenizer(run_config)
        if want or args.tokenizer is not None or cfg.vocab_size != 256:
            text = _with_tokenizer(cfg, params, want, args.tokenizer, args)
        else:
            text = generate(cfg, params, args.prompt.encode(), args.tokens, temperature=args.temperature,
                            top_k=args.top_k, seed=args.seed).decode("utf-8", errors="replace")
    except (CheckpointError, ConfigError, LocalProtocolError, OSError, ValueError) as exc:
        print(f"diloco-sample: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
