"""Peer ids (libp2p-compatible), base58, and key files."""

from __future__ import annotations

import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.identity import (
    Identity,
    KeyFileError,
    b58decode,
    b58encode,
    peer_id_from_public_key,
    public_key_from_peer_id,
    verify_signature,
)

# libp2p's published Ed25519 vector (specs/peer-ids: key pair; peer id as derived by rust-libp2p)
LIBP2P_SEED = bytes.fromhex("7e0830617c4a7de83925dfb2694556b12936c477a0e1feb2e148ec9da60fee7d")
LIBP2P_PUBLIC = bytes.fromhex("1ed1e8fae2c4a144b8be8fd4b47bf3d3b34b871c3cacf6010f0e42d474fce27e")
LIBP2P_PEER_ID = "12D3KooWBtg3aaRMjxwedh83aGiUkwSxDwUZkzuJcfaqUmo7R3pq"
LIBP2P_PRIVATE_PROTOBUF = bytes.fromhex("08011240") + LIBP2P_SEED + LIBP2P_PUBLIC


def test_peer_id_matches_libp2p_vector():
    ident = Identity.from_seed(LIBP2P_SEED)
    assert ident.public_key == LIBP2P_PUBLIC
    assert ident.peer_id == peer_id_from_public_key(LIBP2P_PUBLIC) == LIBP2P_PEER_ID
    assert ident.to_key_file_bytes() == LIBP2P_PRIVATE_PROTOBUF
    signature = ident.sign(b"hello")
    verify_signature(LIBP2P_PEER_ID, signature, b"hello")  # key recovered from the peer id alone


@pytest.mark.parametrize(
    ("raw", "text"),
    [  # Bitcoin base58 vectors
        (b"", ""),
        (b"\0", "1"),
        (b"\0\0\0\x01", "1112"),
        (b"a", "2g"),
        (b"abc", "ZiCa"),
        (bytes.fromhex("516b6fcd0f"), "ABnLTmg"),
        (bytes.fromhex("00eb15231dfceb60925886b67d065299925915aeb172c06647"), "1NS17iag9jJgTHD1VXjvLCEnZuQ3rJDE9L"),
        (b"Hello World!", "2NEpo7TZRRrLZSi2U"),
    ],
)
def test_base58_vectors(raw, text):
    assert b58encode(raw) == text
    assert b58decode(text) == raw


@pytest.mark.parametrize("text", ["2g ", " 2g", "2g\n", "0", "O", "I", "l", "2g\u00e9"])
def test_base58_refuses_characters_outside_the_alphabet_whitespace_included(text):
    with pytest.raises(ValueError, match="not a base58 character"):
        b58decode(text)


@given(st.binary(max_size=64))
def test_base58_round_trip(raw):
    assert b58decode(b58encode(raw)) == raw


@given(st.binary(min_size=32, max_size=32))
def test_peer_id_round_trip_and_shape(public):
    peer_id = peer_id_from_public_key(public)
    assert peer_id.startswith("12D3KooW") and len(peer_id) == 52
    try:
        key = public_key_from_peer_id(peer_id)
    except RemoteProtocolError as exc:  # not every 32-byte string is a curve point
        assert exc.reason == Reason.BAD_IDENTITY
    else:
        assert key.public_bytes_raw() == public


@pytest.mark.parametrize(
    "peer_id",
    [
        "",
        "12D3KooW",
        LIBP2P_PEER_ID[:-1] + "0",  # '0' is not base58
        LIBP2P_PEER_ID + "1",
        LIBP2P_PEER_ID[:-1] + " ",  # trailing whitespace is not another spelling of a peer id
        "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N",  # sha256-multihash (RSA-style) peer id
        b58encode(bytes.fromhex("0024080212") + bytes(33)),  # identity multihash of a secp256k1 key
        2,
    ],
)
def test_malformed_peer_ids_are_bad_identity(peer_id):
    with pytest.raises(RemoteProtocolError) as info:
        public_key_from_peer_id(peer_id)
    assert info.value.reason == Reason.BAD_IDENTITY


def test_bad_signatures_are_refused():
    ident = Identity.generate()
    sig = ident.sign(b"data")
    for signature, data in [(sig, b"datA"), (sig[:-1], b"data"), (bytes(64), b"data")]:
        with pytest.raises(RemoteProtocolError) as info:
            verify_signature(ident.peer_id, signature, data)
        assert info.value.reason == Reason.BAD_SIGNATURE


def test_key_file_is_created_0600_and_round_trips(tmp_path):
    path = tmp_path / "node.key"
    old = os.umask(0)  # even with a permissive umask the file is private
    try:
        ident = Identity.load_or_create(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() == ident.to_key_file_bytes()
    assert Identity.load(path).peer_id == ident.peer_id
    assert Identity.load_or_create(path).peer_id == ident.peer_id
    with pytest.raises(KeyFileError, match="already exists"):
        ident.save(path)


def _write(path, data, mode=0o600):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


@pytest.mark.parametrize(
    ("data", "mode", "message"),
    [
        (LIBP2P_PRIVATE_PROTOBUF, 0o644, "permissions 0644"),
        (LIBP2P_PRIVATE_PROTOBUF, 0o640, "permissions 0640"),
        (LIBP2P_PRIVATE_PROTOBUF, 0o602, "permissions 0602"),
        (LIBP2P_PRIVATE_PROTOBUF[:-1], 0o600, "expected 68 bytes, found 67"),
        (LIBP2P_PRIVATE_PROTOBUF + b"\n", 0o600, "expected 68 bytes, found 69"),
        (b"", 0o600, "found 0"),
        (b"\x08\x02\x12\x40" + bytes(64), 0o600, "not an Ed25519"),
        (LIBP2P_PRIVATE_PROTOBUF[:-1] + b"\0", 0o600, "corrupt"),
    ],
)
def test_bad_key_files_give_clear_errors(tmp_path, data, mode, message):
    path = tmp_path / "node.key"
    _write(path, data, mode)
    with pytest.raises(KeyFileError, match=message) as info:
        Identity.load(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, LocalProtocolError)
    if mode & 0o077:  # load_or_create must not silently replace it either
        with pytest.raises(KeyFileError):
            Identity.load_or_create(path)


def test_missing_and_symlinked_key_files(tmp_path):
    with pytest.raises(KeyFileError, match="no such key file"):
        Identity.load(tmp_path / "absent.key")
    target = tmp_path / "real.key"
    _write(target, LIBP2P_PRIVATE_PROTOBUF)
    link = tmp_path / "link.key"
    link.symlink_to(target)
    with pytest.raises(KeyFileError):
        Identity.load(link)
    with pytest.raises(KeyFileError):
        Identity.load(tmp_path)  # a directory


def test_identity_does_not_print_its_secret():
    ident = Identity.from_seed(LIBP2P_SEED)
    assert LIBP2P_SEED.hex() not in repr(ident) and ident.peer_id in repr(ident)
