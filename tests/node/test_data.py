"""Data: the embedded corpus, the deterministic split, shards, batches, other sources, DataError."""

import os

import numpy as np
import pytest

from node.island.config import DataConfig
from node.island.data import Batcher, DataError, Dataset, Document, MultiBatcher, TokenStream, load_corpus, units_of

CFG = DataConfig(batch_size=4)


def test_embedded_corpus_is_stdlib_and_docs_without_tests(dataset):
    names = [u.doc for u in dataset.train_units] + [u.doc for u in dataset.heldout.units]
    assert "stdlib/json/decoder.py" in names and "stdlib/os.py" in names
    assert any(n.startswith("pydoc/") for n in names)
    assert not any("/test/" in n or "/tests/" in n or n.startswith("stdlib/test/") for n in names)
    assert sum(len(u.tokens) for u in dataset.train_units) > 1_000_000
    assert 0 < len(dataset.heldout) < sum(len(u.tokens) for u in dataset.train_units) / 4


def test_split_is_by_unit_name_not_by_order():
    rng = np.random.default_rng(0)
    docs = [Document(f"doc{i}.txt", rng.integers(0, 256, 500, dtype=np.uint8)) for i in range(200)]
    a = Dataset(CFG, seq_len=16, vocab_size=256, documents=docs)
    b = Dataset(CFG, seq_len=16, vocab_size=256, documents=list(reversed(docs))[:150])  # fewer, reordered
    held_a = {u.name for u in a.heldout.units}
    held_b = {u.name for u in b.heldout.units}
    assert held_b == {n for n in held_a if int(n[3:].split(".")[0]) >= 50}
    assert not held_a & {u.name for u in a.train_units}
    np.testing.assert_array_equal(a.heldout_batches(2)[1], Dataset(CFG, seq_len=16, vocab_size=256,
                                                                  documents=docs[::-1]).heldout_batches(2)[1])


def test_shards_differ_by_key_and_are_stable(dataset):
    a1, a2, b = dataset.shard("peer-a"), dataset.shard("peer-a"), dataset.shard("peer-b")
    names = lambda s: [u.name for u in s.units]  # noqa: E731
    assert names(a1) == names(a2)
    assert names(a1) != names(b)
    overlap = len(set(names(a1)) & set(names(b))) / len(names(a1))
    assert 0.2 < overlap < 0.8  # about shard_fraction = 0.5
    assert len(dataset.shard("")) == sum(len(u.tokens) for u in dataset.train_units)


def test_batches_are_deterministic_and_resumable(dataset):
    one = dataset.batcher("peer-a")
    first = [one.next_batch() for _ in range(3)]
    assert first[0].shape == (8, 33) and first[0].dtype == np.int32
    again = dataset.batcher("peer-a")
    again.seek(2)
    np.testing.assert_array_equal(again.next_batch(), first[2])
    assert not np.array_equal(dataset.batcher("peer-b").next_batch(), first[0])
    both = MultiBatcher([dataset.batcher("peer-a"), dataset.batcher("peer-b")])
    np.testing.assert_array_equal(both.next_batch()[:8], first[0])
    assert both.batch_size == 16


def test_window_reads_across_units_in_document_order():
    docs = [Document("b", np.arange(30, 50, dtype=np.uint16)), Document("a", np.arange(30, dtype=np.uint16))]
    stream = TokenStream(units_of(docs, 3))  # 17 units; "a#10" must follow "a#9", not "a#1"
    assert len(stream) == 50
    for start in range(len(stream) - 7 + 1):
        np.testing.assert_array_equal(stream.take(start, 7), np.arange(start, start + 7))
    with pytest.raises(IndexError):
        stream.take(45, 7)


def write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_text_files_folders_and_globs(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path / "a.txt", b"hello " * 100)
    write(tmp_path / "sub" / "b.md", b"world " * 100)
    write(tmp_path / ".hidden", b"x" * 100)
    by_folder = load_corpus([str(tmp_path)])
    assert [d.name for d in by_folder] == ["a.txt", "sub/b.md"]
    by_glob = load_corpus([str(tmp_path / "**" / "*.md")])
    assert [d.name for d in by_glob] == ["sub/b.md"]
    assert bytes(load_corpus([str(tmp_path / "a.txt")])[0].tokens[:6]) == b"hello "


def test_pretokenized_npy_and_bin(tmp_path):
    tokens = np.arange(5000, dtype=np.uint16) % 1000
    np.save(tmp_path / "t.npy", tokens)
    tokens.astype("<u2").tofile(tmp_path / "t.bin")
    for name in ("t.npy", "t.bin"):
        [doc] = load_corpus([str(tmp_path / name)])
        np.testing.assert_array_equal(doc.tokens, tokens)
    cfg = DataConfig(sources=(str(tmp_path / "t.bin"),), batch_size=2, split_unit_tokens=100, heldout_fraction=0.2)
    ds = Dataset(cfg, seq_len=16, vocab_size=1000)
    batch = ds.batcher("k").next_batch()
    assert batch.shape == (2, 17) and batch.max() < 1000
    assert np.all(np.diff(batch, axis=1) % 1000 == 1)  # consecutive tokens of the file
    small_vocab = Dataset(ds.cfg, seq_len=16, vocab_size=256)
    with pytest.raises(DataError, match="outside the model's vocabulary"):
        for _ in range(10):
            small_vocab.batcher("k").next_batch()


def test_data_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_corpus([str(tmp_path / "missing.txt")])
    with pytest.raises(DataError, match="matches no files"):
        load_corpus([str(tmp_path / "*.nothing")])
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DataError, match="holds no files"):
        load_corpus([str(tmp_path / "empty_dir")])
    with pytest.raises(DataError, match="corpus is empty"):
        load_corpus([write(tmp_path / "empty.txt", b"")])
    with pytest.raises(DataError, match="not a whole number of uint16 tokens"):
        load_corpus([write(tmp_path / "odd.bin", b"abc")])
    np.save(tmp_path / "f.npy", np.zeros((2, 2), np.float32))
    with pytest.raises(DataError, match="1-D integer"):
        load_corpus([str(tmp_path / "f.npy")])
    with pytest.raises(DataError, match="cannot mix"):
        load_corpus([str(tmp_path / "empty.txt"), str(tmp_path / "odd.bin")])
    tiny = write(tmp_path / "tiny.txt", b"x" * 40)
    with pytest.raises(DataError, match="fewer than one sequence"):
        Dataset(DataConfig(sources=(tiny,), split_unit_tokens=8), seq_len=64, vocab_size=256)
    if os.geteuid() != 0:  # root reads anything
        locked = write(tmp_path / "locked.txt", b"secret")
        os.chmod(locked, 0)
        with pytest.raises(DataError, match="cannot read"):
            load_corpus([locked])


def test_shard_smaller_than_a_sequence_is_refused():
    docs = [Document(f"d{i}", np.zeros(20, np.uint8)) for i in range(50)]
    ds = Dataset(DataConfig(batch_size=2, split_unit_tokens=20, shard_fraction=0.01), seq_len=16,
                 vocab_size=256, documents=docs)
    key = next(k for k in (f"peer-{i}" for i in range(1000)) if len(ds.shard(k)) == 0)
    with pytest.raises(DataError, match="train shard holds 0 tokens"):
        ds.batcher(key)
    assert Batcher(ds.shard(""), batch_size=2, seq_len=16, seed=0, key="", vocab_size=256).next_batch().shape == (2, 17)


def test_binary_files_passed_as_text_are_refused_or_skipped(tmp_path, caplog):
    blob = bytes(range(256)) * 64  # NUL bytes: what git and grep call binary
    (tmp_path / "model.ckpt").write_bytes(blob)
    with pytest.raises(DataError, match="is not text"):
        load_corpus([str(tmp_path / "model.ckpt")])
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "notes.txt").write_text("plain text " * 100)
    (mixed / "figure.png").write_bytes(blob)
    with caplog.at_level("WARNING", logger="node.island.data"):
        docs = load_corpus([str(mixed)])
    assert [d.name for d in docs] == ["notes.txt"]
    assert "skipping 1 binary file(s)" in caplog.text and "figure.png" in caplog.text
    only_binary = tmp_path / "only-binary"
    only_binary.mkdir()
    (only_binary / "a.bin.gz").write_bytes(blob)
    with pytest.raises(DataError, match="holds no text|is not text"):
        load_corpus([str(only_binary)])
