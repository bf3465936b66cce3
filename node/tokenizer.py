"""`diloco-tokenizer`: train a tokenizer on your own text, inspect one, or pre-tokenize text with it.

    diloco-tokenizer train [--data PATH|DIR|GLOB[,...]] --vocab-size N --out tokenizer.json
    diloco-tokenizer info tokenizer.json
    diloco-tokenizer encode [--data ...] --tokenizer tokenizer.json --out tokens.bin

`train` fits a byte-level BPE tokenizer (`node.island.tokens.train_tokenizer`) to the text files `--data`
names, read as `diloco-node --data` reads them (default: the embedded Python stdlib corpus), and writes
it as a HuggingFace `tokenizers` JSON file. Train nodes with it: `diloco-node --set tokenizer=FILE`; every
node of the run needs the same file (its SHA-256 is part of the run configuration). `info` prints a
tokenizer's vocabulary and hash. `encode` writes the text as one pre-tokenized file with its sidecar
(documents in the order `--data` lists them), to train from tokens without encoding at every start.
Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import numpy as np

from node.island.data import load_corpus, token_files
from node.island.tokens import DataError, load_tokenizer, tokenizer_hash, train_tokenizer, write_tokens

__all__ = ["main"]


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part for part in text.split(",") if part)


def _texts(sources: Sequence[str]) -> list[str]:
    if token_files(sources):
        raise DataError("the sources are pre-tokenized files; a tokenizer is trained on text")
    docs = load_corpus(sources)
    return [d.tokens.tobytes().decode("utf-8", errors="replace") for d in docs]


def _train(args: argparse.Namespace) -> str:
    started = time.perf_counter()
    texts = _texts(args.data)
    tokenizer = train_tokenizer(texts, args.vocab_size, min_frequency=args.min_frequency)
    tokenizer.save(args.out)
    return (f"wrote {args.out}: {tokenizer.get_vocab_size()} tokens, trained on {len(texts)} documents "
            f"({sum(len(t) for t in texts) / 1e6:.1f} M characters) in {time.perf_counter() - started:.1f} s; "
            f"sha256 {tokenizer_hash(args.out)}")


def _info(args: argparse.Namespace) -> str:
    tokenizer = load_tokenizer(args.tokenizer)
    return f"{args.tokenizer}: vocab_size {tokenizer.get_vocab_size()}, sha256 {tokenizer_hash(args.tokenizer)}"


def _encode(args: argparse.Namespace) -> str:
    docs = load_corpus(args.data, args.tokenizer)
    tokens = np.concatenate([d.tokens for d in docs])
    n_bytes = sum(int(d.token_bytes.sum()) for d in docs if d.token_bytes is not None)
    vocab = load_tokenizer(args.tokenizer).get_vocab_size()
    write_tokens(args.out, tokens, vocab, tokenizer_sha256=tokenizer_hash(args.tokenizer))
    return (f"wrote {args.out} and its sidecar: {len(tokens)} tokens from {len(docs)} documents "
            f"({n_bytes / max(len(tokens), 1):.2f} bytes of text per token), vocab_size {vocab}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="diloco-tokenizer", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    data_help = "text files, folders or globs, comma-separated (default: the embedded Python stdlib corpus)"
    train = sub.add_parser("train", help="train a byte-level BPE tokenizer on your text")
    train.add_argument("--data", type=_csv, default=(), metavar="PATH|DIR|GLOB[,...]", help=data_help)
    train.add_argument("--vocab-size", type=int, required=True, metavar="N", help="tokens, at least 256")
    train.add_argument("--min-frequency", type=int, default=2, metavar="K",
                       help="merge only pairs seen at least K times (default %(default)s)")
    train.add_argument("--out", required=True, metavar="FILE", help="where to write the tokenizer JSON")
    train.set_defaults(run=_train)
    info = sub.add_parser("info", help="a tokenizer's vocabulary size and SHA-256")
    info.add_argument("tokenizer", metavar="FILE")
    info.set_defaults(run=_info)
    encode = sub.add_parser("encode", help="pre-tokenize text into NAME.bin/.npy and its NAME.json sidecar")
    encode.add_argument("--data", type=_csv, default=(), metavar="PATH|DIR|GLOB[,...]", help=data_help)
    encode.add_argument("--tokenizer", required=True, metavar="FILE")
    encode.add_argument("--out", required=True, metavar="FILE.bin|FILE.npy")
    encode.set_defaults(run=_encode)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        print(args.run(args), flush=True)
    except (DataError, ValueError, OSError) as exc:  # ConfigError is a ValueError
        print(f"diloco-tokenizer {args.command}: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
