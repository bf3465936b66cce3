"""The libp2p TLS certificate: a self-signed X.509 certificate that carries the node's Ed25519 host key.

Exactly the scheme of the libp2p TLS handshake specification (github.com/libp2p/specs, tls/tls.md), so a
libp2p peer can check our peer ids and we can check theirs (Ed25519 host keys only):

- the certificate's own key is a fresh ECDSA P-256 key, unrelated to the host key, and the certificate is
  signed by it (self-signed, one certificate, no chain);
- it carries the extension 1.3.6.1.4.1.53594.1.1 (the libp2p Public Key Extension), whose value is the DER of
  ``SignedKey ::= SEQUENCE { publicKey OCTET STRING, signature OCTET STRING }``: `publicKey` is the protobuf
  `PublicKey{Type=Ed25519, Data=key}` (``08 01 12 20 || key``), `signature` the host key's Ed25519 signature
  over ``b"libp2p-tls-handshake:" || DER(SubjectPublicKeyInfo of the certificate's key)``.

`peer_id_of(der, now)` checks a received certificate as the specification asks (validity window, self-signature,
no critical extension but ours, the extension's signature) and returns the peer id it proves; anything else
raises `RemoteProtocolError(BAD_CERTIFICATE)`. Pure: no I/O.
"""

from __future__ import annotations

import datetime
import secrets

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from protocol.errors import Reason, RemoteProtocolError
from protocol.identity import PUBLIC_KEY_PREFIX, Identity, peer_id_from_public_key, verify_signature

EXTENSION_OID = x509.ObjectIdentifier("1.3.6.1.4.1.53594.1.1")
SIGNING_PREFIX = b"libp2p-tls-handshake:"
VALIDITY = datetime.timedelta(days=365)
CLOCK_SKEW = datetime.timedelta(hours=1)  # NotBefore lies this far back: a peer's clock may run behind ours


def _der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def _der(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _der_length(len(body)) + body


def _read_der(data: bytes, pos: int, tag: int) -> tuple[bytes, int]:
    """The body of the DER element with `tag` at `pos`, and the position after it (definite lengths only)."""
    if pos + 2 > len(data) or data[pos] != tag:
        raise ValueError(f"expected DER tag {tag:#x} at {pos}")
    first = data[pos + 1]
    pos += 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if not 1 <= count <= 4 or pos + count > len(data):
            raise ValueError("bad DER length")
        length = int.from_bytes(data[pos:pos + count], "big")
        if length < 0x80 or data[pos] == 0:
            raise ValueError("DER length not in its shortest form")
        pos += count
    if pos + length > len(data):
        raise ValueError("DER element runs past its container")
    return data[pos:pos + length], pos + length


def signed_key(identity: Identity, certificate_key: ec.EllipticCurvePublicKey) -> bytes:
    """The extension's value: the DER `SignedKey` binding `certificate_key` to `identity`'s host key."""
    spki = certificate_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    public = PUBLIC_KEY_PREFIX + identity.public_key
    return _der(0x30, _der(0x04, public) + _der(0x04, identity.sign(SIGNING_PREFIX + spki)))


def make_certificate(identity: Identity, now: datetime.datetime | None = None) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A fresh certificate for `identity` and its private key (valid from an hour ago for `VALIDITY`)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.SERIAL_NUMBER, "1")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(secrets.randbits(63) + 1)
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.UnrecognizedExtension(EXTENSION_OID, signed_key(identity, key.public_key())), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate, key


def _bad(detail: str) -> RemoteProtocolError:
    return RemoteProtocolError(Reason.BAD_CERTIFICATE, detail)


def peer_id_of(der: bytes, now: datetime.datetime | None = None) -> str:
    """The peer id a received certificate proves (the libp2p rules, Ed25519 host keys).
    Raises `RemoteProtocolError(BAD_CERTIFICATE)` for anything else."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    try:
        certificate = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise _bad(f"not an X.509 certificate: {exc}") from None
    if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
        raise _bad(f"not valid now (valid {certificate.not_valid_before_utc:%Y-%m-%d} to "
                   f"{certificate.not_valid_after_utc:%Y-%m-%d})")
    try:
        certificate.verify_directly_issued_by(certificate)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise _bad(f"the self-signature does not verify: {type(exc).__name__}") from None
    ours = None
    for extension in certificate.extensions:
        if extension.oid == EXTENSION_OID:
            ours = extension
        elif extension.critical:
            raise _bad(f"unknown critical extension {extension.oid.dotted_string}")
    if ours is None:
        raise _bad("no libp2p public key extension")
    value = ours.value.value if isinstance(ours.value, x509.UnrecognizedExtension) else b""
    try:
        body, end = _read_der(value, 0, 0x30)
        if end != len(value):
            raise ValueError("bytes after SignedKey")
        public, pos = _read_der(body, 0, 0x04)
        signature, pos = _read_der(body, pos, 0x04)
        if pos != len(body):
            raise ValueError("bytes after the signature")
    except ValueError as exc:
        raise _bad(f"the extension is not a SignedKey: {exc}") from None
    if len(public) != len(PUBLIC_KEY_PREFIX) + 32 or not public.startswith(PUBLIC_KEY_PREFIX):
        raise _bad("the host key is not an Ed25519 protobuf PublicKey")
    spki = certificate.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    peer_id = peer_id_from_public_key(public[len(PUBLIC_KEY_PREFIX):])
    try:
        verify_signature(peer_id, signature, SIGNING_PREFIX + spki)
    except RemoteProtocolError as exc:
        raise _bad(f"the host key's signature over the certificate key: {exc}") from None
    return peer_id


def pem(identity: Identity) -> bytes:
    """A fresh certificate for `identity` and its private key, PEM (what `curl --cert` and Python's `ssl` take:
    `SSLContext.load_cert_chain`): a client that shows it proves `identity`'s peer id to a node's HTTP plane."""
    certificate, key = make_certificate(identity)
    return certificate.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
