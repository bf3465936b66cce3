"""Node identity: an Ed25519 key pair, the libp2p-compatible peer id derived from it, and key files.

Peer id (exactly libp2p's Ed25519 peer id, see PROTOCOL.md "Peer ids"):

    pubkey_proto = 08 01 12 20 || public_key(32)        # protobuf PublicKey{Type=Ed25519, Data=key}
    multihash    = 00 24 || pubkey_proto                 # identity multihash (code 0x00, length 36)
    peer_id      = base58btc(multihash)                  # 52 characters, always "12D3KooW..."

The public key is recoverable from the peer id, so messages carry only the peer id.

Key file: the libp2p protobuf `PrivateKey` encoding, `08 01 12 40 || seed(32) || public_key(32)` (68
bytes), the format go-/rust-libp2p store keys in. Created with mode 0600 (set by `os.open`, never
widened); refused on load if group or others may read or write it.
"""

from __future__ import annotations

import functools
import os
import stat
from dataclasses import dataclass

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError

PUBLIC_KEY_PREFIX = bytes.fromhex("08011220")  # protobuf PublicKey: Type=1 (Ed25519), Data len 32
PRIVATE_KEY_PREFIX = bytes.fromhex("08011240")  # protobuf PrivateKey: Type=1 (Ed25519), Data len 64
IDENTITY_MULTIHASH_PREFIX = bytes.fromhex("0024")  # multihash code 0x00 (identity), length 36
PEER_ID_BYTES = len(IDENTITY_MULTIHASH_PREFIX) + len(PUBLIC_KEY_PREFIX) + 32  # 38
PEER_ID_LENGTH = 52  # characters of base58btc for every Ed25519 peer id
KEY_FILE_BYTES = len(PRIVATE_KEY_PREFIX) + 64  # 68
SIGNATURE_BYTES = 64

_B58_ALPHABET = frozenset("123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz")


def b58encode(data: bytes) -> str:
    """Bitcoin-alphabet base58 (multibase 'base58btc' without the 'z' prefix). Leading zero bytes → '1'."""
    return base58.b58encode(data).decode("ascii")


def b58decode(text: str) -> bytes:
    """Inverse of `b58encode`. Raises ValueError on any character outside the alphabet, whitespace
    included (the `base58` package would strip trailing whitespace: a peer id has exactly one spelling)."""
    bad = next((c for c in text if c not in _B58_ALPHABET), None)
    if bad is not None:
        raise ValueError(f"not a base58 character: {bad!r}")
    return base58.b58decode(text)


def peer_id_from_public_key(public_key: bytes) -> str:
    """The libp2p peer id ("12D3KooW...") of a raw 32-byte Ed25519 public key."""
    if type(public_key) is not bytes or len(public_key) != 32:
        raise LocalProtocolError("an Ed25519 public key is 32 bytes")
    return b58encode(IDENTITY_MULTIHASH_PREFIX + PUBLIC_KEY_PREFIX + public_key)


@functools.lru_cache(maxsize=4096)
def public_key_from_peer_id(peer_id: str) -> Ed25519PublicKey:
    """Recover the public key a peer id embeds. Raises `RemoteProtocolError(BAD_IDENTITY)` for anything
    that is not the canonical libp2p Ed25519 peer id of some key (wrong length, other key type, other
    multihash, non-canonical base58). Cached: peer ids repeat on every message."""
    if type(peer_id) is not str or len(peer_id) != PEER_ID_LENGTH:
        raise RemoteProtocolError(Reason.BAD_IDENTITY, "peer id is not a 52-character Ed25519 peer id")
    try:
        raw = b58decode(peer_id)
    except ValueError as exc:
        raise RemoteProtocolError(Reason.BAD_IDENTITY, str(exc)) from None
    prefix = IDENTITY_MULTIHASH_PREFIX + PUBLIC_KEY_PREFIX
    if len(raw) != PEER_ID_BYTES or not raw.startswith(prefix):
        raise RemoteProtocolError(Reason.BAD_IDENTITY, "peer id is not an identity-multihash Ed25519 key")
    key = raw[len(prefix) :]
    if b58encode(raw) != peer_id:  # base58 has no redundancy, but keep the canonical check explicit
        raise RemoteProtocolError(Reason.BAD_IDENTITY, "non-canonical peer id")
    try:
        return Ed25519PublicKey.from_public_bytes(key)
    except ValueError as exc:
        raise RemoteProtocolError(Reason.BAD_IDENTITY, f"bad public key: {exc}") from None


def verify_signature(peer_id: str, signature: bytes, data: bytes) -> None:
    """Check an Ed25519 `signature` over `data` by the key of `peer_id`.

    Raises `RemoteProtocolError(BAD_IDENTITY)` if the peer id is malformed, `BAD_SIGNATURE` if the
    signature does not verify. Returns None on success."""
    key = public_key_from_peer_id(peer_id)
    if type(signature) is not bytes or len(signature) != SIGNATURE_BYTES:
        raise RemoteProtocolError(Reason.BAD_SIGNATURE, "signature is not 64 bytes")
    try:
        key.verify(signature, data)
    except InvalidSignature:
        raise RemoteProtocolError(Reason.BAD_SIGNATURE, f"signature by {peer_id} does not verify") from None


class KeyFileError(LocalProtocolError):
    """A key file is missing, corrupt, the wrong size, or readable by group/others. Says which and where."""


@dataclass(frozen=True, eq=False)
class Identity:
    """An Ed25519 key pair and its peer id. Create with `generate`, `from_seed`, `load` or
    `load_or_create`; never print or log `seed`."""

    _private: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> Identity:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """Deterministic identity from a 32-byte Ed25519 seed (tests, the simulator)."""
        if type(seed) is not bytes or len(seed) != 32:
            raise LocalProtocolError("an Ed25519 seed is 32 bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @functools.cached_property
    def public_key(self) -> bytes:
        """The raw 32-byte public key."""
        return self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @functools.cached_property
    def peer_id(self) -> str:
        return peer_id_from_public_key(self.public_key)

    @property
    def seed(self) -> bytes:
        return self._private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def sign(self, data: bytes) -> bytes:
        """Ed25519 signature (64 bytes) over `data`. Callers sign domain-separated bytes only
        (see `protocol.signing`); never sign bytes a peer chose."""
        return self._private.sign(data)

    def __repr__(self) -> str:
        return f"Identity({self.peer_id})"

    # ---- key files -------------------------------------------------------------------------------

    def to_key_file_bytes(self) -> bytes:
        return PRIVATE_KEY_PREFIX + self.seed + self.public_key

    @classmethod
    def from_key_file_bytes(cls, data: bytes, where: str = "key file") -> Identity:
        """Parse the 68-byte libp2p PrivateKey encoding. Raises `KeyFileError` if malformed."""
        if len(data) != KEY_FILE_BYTES:
            raise KeyFileError(f"{where}: expected {KEY_FILE_BYTES} bytes, found {len(data)}")
        if not data.startswith(PRIVATE_KEY_PREFIX):
            raise KeyFileError(f"{where}: not an Ed25519 libp2p private key (bad header {data[:4].hex()})")
        seed, public = data[4:36], data[36:]
        ident = cls.from_seed(seed)
        if ident.public_key != public:
            raise KeyFileError(f"{where}: corrupt (public key does not match the private key)")
        return ident

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a new key file with mode 0600. Refuses to overwrite an existing file (`KeyFileError`)."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            raise KeyFileError(f"{os.fspath(path)}: already exists; refusing to overwrite a key") from None
        except OSError as exc:
            raise KeyFileError(f"{os.fspath(path)}: cannot create: {exc.strerror}") from None
        with os.fdopen(fd, "wb") as f:
            f.write(self.to_key_file_bytes())
            f.flush()
            os.fsync(f.fileno())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        """Read a key file written by `save` (or by libp2p). Raises `KeyFileError` if it is missing, not a
        regular file, accessible by group or others (mode & 0o077), the wrong size, or corrupt."""
        where = os.fspath(path)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            raise KeyFileError(f"{where}: no such key file") from None
        except OSError as exc:  # ELOOP for a symlink (O_NOFOLLOW): keys are never read through links
            raise KeyFileError(f"{where}: cannot open: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise KeyFileError(f"{where}: not a regular file")
            if st.st_mode & 0o077:
                raise KeyFileError(
                    f"{where}: permissions {stat.S_IMODE(st.st_mode):04o} let group/others access the key;"
                    f" run `chmod 600 {where}`"
                )
            data = b""
            while len(data) <= KEY_FILE_BYTES and (chunk := os.read(fd, KEY_FILE_BYTES + 1 - len(data))):
                data += chunk
        finally:
            os.close(fd)
        return cls.from_key_file_bytes(data, where)

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str]) -> Identity:
        """Load the key at `path`, or create one there (mode 0600) if no file exists."""
        if os.path.lexists(path):
            return cls.load(path)
        ident = cls.generate()
        ident.save(path)
        return ident
