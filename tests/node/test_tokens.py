"""Data and tokens: token files carry (sidecar) or infer their vocabulary, the node's config takes it or
refuses one too small, a tokenizer trained here encodes text, and evaluation stays bits per byte."""

import dataclasses
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

import node.island.tokens as tokens_module
from node.adopt import adopted, own_run_config
from node.island.config import ConfigError, DataConfig
from node.island.data import Dataset, DataError, HeldOut, data_vocab, load_corpus
from node.island.tokens import encode_text, file_vocab, load_tokenizer, tokenizer_hash, write_tokens
from node.settings import NodeSettings
from node.tokenizer import main as tokenizer_main
from protocol.runconfig import config_differences

# A small text, written here (so the test needs no network and no corpus): varied enough that BPE learns
# merges, with multi-byte characters so that bytes and characters differ.
SENTENCES = [
    "The river carries the boat past the old mill, and the miller waves from the door.",
    "A café on the corner sells bread, cheese and coffee to the workers at dawn.",
    "Naïve plans fail when the weather turns; the wise farmer watches the sky.",
    "Über the hills the shepherd leads the sheep home before the night falls.",
    "Numbers like 3.14 and 2.71 appear in every textbook of mathematics — and in songs.",
    "The library keeps its oldest books in a cold room behind a heavy door.",
    "Children run along the river bank, shouting names into the wind: Zoë! Renée!",
    "At the market the fishmonger weighs the catch and writes the price in chalk.",
]


def corpus_texts(n_docs: int = 24, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(SENTENCES[i] for i in rng.permutation(len(SENTENCES))) + "\n" for _ in range(n_docs)]


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("text")
    for i, text in enumerate(corpus_texts()):
        (folder / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def tokenizer_file(text_dir, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    assert tokenizer_main(["train", "--data", str(text_dir), "--vocab-size", "400", "--out", out]) == 0
    return out


def settings(**kw) -> NodeSettings:
    return NodeSettings(run_id="r", key_path=Path("unused"), **kw)


# ---- pre-tokenized files ---------------------------------------------------------------------------


def test_sidecar_gives_vocab_and_dtype_and_is_not_read_as_data(tmp_path):
    ids = (np.arange(3000, dtype=np.int64) * 7919) % 70_000  # needs uint32
    write_tokens(str(tmp_path / "tokens.bin"), ids, 70_000)
    assert json.loads((tmp_path / "tokens.json").read_text()) == {"vocab_size": 70_000, "dtype": "uint32"}
    [doc] = load_corpus([str(tmp_path)])  # the folder: tokens.json is the sidecar, not text to mix in
    assert doc.name == "tokens.bin" and doc.tokens.dtype == np.dtype("<u4")
    np.testing.assert_array_equal(doc.tokens, ids)
    vocab, source = data_vocab(DataConfig(sources=(str(tmp_path),)))
    assert vocab == 70_000 and source == f"the sidecar vocabulary of {tmp_path}/tokens.bin"
    assert settings(data=(str(tmp_path / "tokens.bin"),)).ml_config("p").model.vocab_size == 70_000


@pytest.mark.parametrize("suffix", [".npy", ".bin"])
def test_vocab_is_inferred_in_chunks_without_a_sidecar(tmp_path, monkeypatch, caplog, suffix):
    ids = np.random.default_rng(1).integers(0, 900, 10_001).astype(np.uint16)
    ids[7777] = 1234  # the maximum sits in a late chunk
    path = str(tmp_path / f"t{suffix}")
    np.save(path, ids) if suffix == ".npy" else ids.astype("<u2").tofile(path)
    monkeypatch.setattr(tokens_module, "_CHUNK", 1000)
    with caplog.at_level(logging.INFO, logger="node.island.tokens"):
        assert file_vocab(path) == (1235, "inferred")
    assert "inferred as max(token)+1 = 1235" in caplog.text
    cfg = settings(data=(path,)).ml_config("p")
    assert cfg.model.vocab_size == 1235 and cfg.data.sources == (path,)


def test_a_vocab_size_too_small_for_the_data_is_an_error_and_a_larger_one_is_kept(tmp_path):
    write_tokens(str(tmp_path / "a.npy"), np.arange(500) % 300, 300)
    write_tokens(str(tmp_path / "b.bin"), np.arange(500) % 200, 1000)  # the largest file's vocabulary wins
    data = (str(tmp_path / "a.npy"), str(tmp_path / "b.bin"))
    assert settings(data=data).ml_config("p").model.vocab_size == 1000
    with pytest.raises(ConfigError, match=r"vocab_size=999 is too small for the data, which needs 1000"):
        settings(data=data, overrides=("model.vocab_size=999",)).ml_config("p")
    assert settings(data=data, overrides=("vocab_size=1024",)).ml_config("p").model.vocab_size == 1024
    assert settings(data=(str(tmp_path / "notes.txt"),)).ml_config("p").model.vocab_size == 256  # not opened


def test_bad_sidecars_are_data_errors(tmp_path):
    ids = np.arange(100, dtype=np.uint16)
    np.save(tmp_path / "t.npy", ids)
    (tmp_path / "t.json").write_text('{"vocab_size": 100, "dtype": "uint32"}')
    with pytest.raises(DataError, match="holds uint16 but its sidecar says uint32"):
        load_corpus([str(tmp_path / "t.npy")])
    for text, match in (('{"dtype": "uint16"}', "vocab_size must be a positive integer"),
                        ('{"vocab_size": 100, "dtype": "float16"}', "dtype must be one of"),
                        ("[100]", "expected a JSON object"), ("{", "cannot read the sidecar")):
        (tmp_path / "t.json").write_text(text)
        with pytest.raises(DataError, match=match):
            file_vocab(str(tmp_path / "t.npy"))
    (tmp_path / "v.bin").write_bytes(b"\0" * 6)
    (tmp_path / "v.json").write_text('{"vocab_size": 100, "dtype": "uint32"}')
    with pytest.raises(DataError, match="not a whole number of uint32 tokens"):
        load_corpus([str(tmp_path / "v.bin")])
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(DataError, match="every token file is empty"):
        settings(data=(str(tmp_path / "empty.bin"),)).ml_config("p")


# ---- a tokenizer for text ------------------------------------------------------------------------


def test_encoding_counts_every_byte_and_round_trips(tokenizer_file):
    tokenizer = load_tokenizer(tokenizer_file)
    assert tokenizer.get_vocab_size() == 400
    texts = corpus_texts(3, seed=5) + ["", "日本語と English — ünïcödé\n" * 3, "x" * 10]
    for text, (ids, sizes) in zip(texts, encode_text(tokenizer, texts)):
        assert len(ids) == len(sizes) and int(sizes.sum()) == len(text.encode("utf-8"))
        assert tokenizer.decode(ids.tolist()) == text
    ids, _ = encode_text(tokenizer, corpus_texts(1, seed=9))[0]
    assert len(ids) < len(corpus_texts(1, seed=9)[0].encode()) / 2  # merges learned: < half a token per byte


def test_tokenizer_in_the_config_encodes_text_and_sets_the_vocab(text_dir, tokenizer_file):
    node = settings(data=(str(text_dir),), overrides=(f"tokenizer={tokenizer_file}",))
    cfg = node.ml_config("p").with_overrides(split_unit_tokens=64, heldout_fraction=0.25, batch_size=4, seq_len=32)
    assert cfg.model.vocab_size == 400
    ds = Dataset(cfg.data, seq_len=32, vocab_size=cfg.model.vocab_size)
    heldout = ds.heldout_batches(2)
    assert isinstance(heldout, HeldOut) and heldout[0].shape == (4, 33) and heldout[0].max() < 400
    assert 2 * 4 * 32 * 1.5 < heldout.n_bytes < 2 * 4 * 32 * 8  # several bytes of text per token
    plain = Dataset(dataclasses.replace(cfg.data, tokenizer=""), seq_len=32, vocab_size=256)
    assert plain.heldout_batches(2).n_bytes is None  # bytes: one per token
    with pytest.raises(ConfigError, match="too small for the data, which needs 400"):
        settings(data=(str(text_dir),), overrides=(f"tokenizer={tokenizer_file}", "vocab_size=256")).ml_config("p")
    with pytest.raises(ConfigError, match="tokenizer=.*doc00.txt: not a tokenizers JSON file"):
        settings(overrides=(f"tokenizer={text_dir / 'doc00.txt'}",)).ml_config("p")
    with pytest.raises(ConfigError, match="tokenizer=missing.json: cannot read it"):
        settings(overrides=("tokenizer=missing.json",)).ml_config("p")


@pytest.mark.slow
def test_peers_compare_the_tokenizers_content_not_its_path(tmp_path, tokenizer_file, text_dir):
    copy = tmp_path / "elsewhere.json"
    copy.write_bytes(Path(tokenizer_file).read_bytes())
    other = str(tmp_path / "other.json")
    assert tokenizer_main(["train", "--data", str(text_dir), "--vocab-size", "300", "--out", other]) == 0
    mine = own_run_config(settings(overrides=(f"tokenizer={tokenizer_file}",)), "")
    assert f"data.tokenizer=\"{tokenizer_hash(tokenizer_file)}\"" in mine and tokenizer_file not in mine
    assert own_run_config(settings(overrides=(f"tokenizer={copy}",)), "") == mine
    theirs = own_run_config(settings(overrides=(f"tokenizer={other}",)), "")
    assert {d.split(":")[0] for d in config_differences(mine, theirs)} >= {"data.tokenizer", "model.vocab_size"}
    with pytest.raises(ConfigError, match=f"tokenizer of sha256 {tokenizer_hash(tokenizer_file)}"):
        adopted(settings(), mine, "", pinned=())  # a joiner without the file cannot take it from the hash
    with pytest.raises(ConfigError, match="reads text as bytes: drop --set tokenizer"):
        adopted(settings(overrides=(f"tokenizer={tokenizer_file}",)), own_run_config(settings(), ""), "", pinned=())


def test_cli_info_and_encode_write_a_token_file_the_node_reads(tmp_path, text_dir, tokenizer_file, capsys):
    assert tokenizer_main(["info", tokenizer_file]) == 0
    assert f"vocab_size 400, sha256 {tokenizer_hash(tokenizer_file)}" in capsys.readouterr().out
    out = str(tmp_path / "corpus.bin")
    assert tokenizer_main(["encode", "--data", str(text_dir), "--tokenizer", tokenizer_file, "--out", out]) == 0
    sidecar = json.loads((tmp_path / "corpus.json").read_text())
    assert sidecar == {"vocab_size": 400, "dtype": "uint16", "tokenizer_sha256": tokenizer_hash(tokenizer_file)}
    [doc] = load_corpus([out])
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(text_dir.iterdir()))
    assert load_tokenizer(tokenizer_file).decode(doc.tokens.tolist()) == text
    assert settings(data=(out,)).ml_config("p").model.vocab_size == 400
    assert tokenizer_main(["train", "--data", out, "--vocab-size", "300", "--out", str(tmp_path / "x.json")]) == 2
    assert "pre-tokenized" in capsys.readouterr().err
    too_small = ["train", "--data", str(text_dir), "--vocab-size", "100", "--out", str(tmp_path / "y.json")]
    assert tokenizer_main(too_small) == 2
    assert "vocab_size >= 256" in capsys.readouterr().err and not (tmp_path / "y.json").exists()


@pytest.mark.slow
def test_a_tiny_model_trains_on_tokenized_text_and_reports_bits_per_byte(config, text_dir, tokenizer_file):
    from node.island.train import InnerLoop

    node = settings(data=(str(text_dir),), overrides=(f"tokenizer={tokenizer_file}",))
    vocab = node.ml_config("p").model.vocab_size
    cfg = config.with_overrides(vocab_size=vocab, sources=(str(text_dir),), tokenizer=tokenizer_file,
                                split_unit_tokens=64, heldout_fraction=0.25, batch_size=4, lr=3e-3)
    ds = Dataset(cfg.data, seq_len=cfg.model.seq_len, vocab_size=cfg.model.vocab_size)
    heldout = ds.heldout_batches(2)
    loop = InnerLoop.byte_lm(cfg, ds.batcher("peer-a"))
    before = loop.evaluate(heldout)
    per_token = loop.evaluate(list(heldout))  # a plain list: no byte count, bits per token
    n_tokens = sum(b.shape[0] * (b.shape[1] - 1) for b in heldout)
    assert before == pytest.approx(per_token * n_tokens / heldout.n_bytes, rel=1e-6)
    assert per_token == pytest.approx(math.log2(vocab), abs=0.3)  # a fresh model: about uniform
    result = loop.run(30)
    after = loop.evaluate(heldout)
    assert result.steps == 30 and all(math.isfinite(x) for x in result.losses)
    assert np.mean(result.losses[-5:]) < np.mean(result.losses[:5]) - 1.0  # nats per token
    assert after < before - 0.5  # bits per byte of text


@pytest.mark.slow
def test_diloco_sample_speaks_the_runs_tokenizer(text_dir, tokenizer_file, tmp_path, capsys) -> None:
    from safetensors.numpy import save_file

    from node.island.model import init_params
    from node.sample import main as sample_main

    node = settings(data=(str(text_dir),), overrides=(f"tokenizer={tokenizer_file}", "seq_len=32", "d_model=32",
                                                       "n_heads=2", "d_ff=64", "n_layers=1"))
    cfg = node.ml_config("p")
    export = tmp_path / "model.safetensors"
    save_file(init_params(cfg.model, 0), str(export), metadata={"diloco.run_config": own_run_config(node, "")})
    assert sample_main([str(export), "--tokens", "8"]) == 2  # the run's tokenizer is needed, and named
    assert f"sha256 {tokenizer_hash(tokenizer_file)}" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text(Path(tokenizer_file).read_text().replace('"vocab"', '"vocab" ', 1))
    assert sample_main([str(export), "--tokenizer", str(other), "--tokens", "8"]) == 2
    assert "is not the run's tokenizer" in capsys.readouterr().err
    assert sample_main([str(export), "--tokenizer", tokenizer_file, "--prompt", "The river", "--tokens", "8"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("The river") and len(text) > len("The river\n")
