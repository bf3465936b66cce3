"""Tier (a): the libp2p TLS certificate (p2p.tlscert, PROTOCOL.md section 1a): the specification's own test
vectors, our certificates round trip, and every rule a received certificate must pass."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding

from p2p.tlscert import EXTENSION_OID, make_certificate, peer_id_of, signed_key
from protocol.errors import Reason, RemoteProtocolError
from protocol.identity import Identity

# github.com/libp2p/specs tls/tls.md, "Test vectors" 1 (Ed25519), 3 (secp256k1) and 4 (a mismatched signature)
ED25519_VECTOR = bytes.fromhex(
    "308201ae30820156a0030201020204499602d2300a06082a8648ce3d040302302031123010060355040a13096c69627032702e696f310a"
    "300806035504051301313020170d3735303130313133303030305a180f34303936303130313133303030305a302031123010060355040a"
    "13096c69627032702e696f310a300806035504051301313059301306072a8648ce3d020106082a8648ce3d030107034200040c901d423c"
    "831ca85e27c73c263ba132721bb9d7a84c4f0380b2a6756fd601331c8870234dec878504c174144fa4b14b66a651691606d8173e55bd37"
    "e381569ea37c307a3078060a2b0601040183a25a0101046a3068042408011220a77f1d92fedb59dddaea5a1c4abd1ac2fbde7d7b879ed3"
    "64501809923d7c11b90440d90d2769db992d5e6195dbb08e706b6651e024fda6cfb8846694a435519941cac215a8207792e42849cccc6c"
    "d8136c6e4bde92a58c5e08cfd4206eb5fe0bf909300a06082a8648ce3d0403020346003043021f50f6b6c52711a881778718238f650c9f"
    "b48943ae6ee6d28427dc6071ae55e702203625f116a7a454db9c56986c82a25682f7248ea1cb764d322ea983ed36a31b77")
SECP256K1_VECTOR = bytes.fromhex(
    "308201ba3082015fa0030201020204499602d2300a06082a8648ce3d040302302031123010060355040a13096c69627032702e696f310a"
    "300806035504051301313020170d3735303130313133303030305a180f34303936303130313133303030305a302031123010060355040a"
    "13096c69627032702e696f310a300806035504051301313059301306072a8648ce3d020106082a8648ce3d030107034200040c901d423c"
    "831ca85e27c73c263ba132721bb9d7a84c4f0380b2a6756fd601331c8870234dec878504c174144fa4b14b66a651691606d8173e55bd37"
    "e381569ea38184308181307f060a2b0601040183a25a01010471306f0425080212210206dc6968726765b820f050263ececf7f71e49558"
    "92776c0970542efd689d2382044630440220145e15a991961f0d08cd15425bb95ec93f6ffa03c5a385eedc34ecf464c7a8ab022026b310"
    "9b8a3f40ef833169777eb2aa337cfb6282f188de0666d1bcec2a4690dd300a06082a8648ce3d0403020349003046022100e1a217eeef9e"
    "c9204b3f774a08b70849646b6a1e6b8b27f93dc00ed58545d9fe022100b00dafa549d0f03547878338c7b15e7502888f6d45db387e5ae6"
    "b5d46899cef0")
NOW = datetime.datetime(2026, 12, 2, tzinfo=datetime.timezone.utc)


def refused(der: bytes, now: datetime.datetime = NOW) -> str:
    with pytest.raises(RemoteProtocolError) as info:
        peer_id_of(der, now)
    assert info.value.reason is Reason.BAD_CERTIFICATE
    return info.value.detail


def der(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(Encoding.DER)


def test_the_specifications_ed25519_vector_proves_its_peer_id() -> None:
    assert peer_id_of(ED25519_VECTOR, NOW) == "12D3KooWM6CgA9iBFZmcYAHA6A2qvbAxqfkmrYiRQuz3XEsk4Ksv"


def test_other_host_key_types_are_refused_by_name() -> None:
    assert "not an Ed25519" in refused(SECP256K1_VECTOR)


def test_our_certificate_proves_our_peer_id_and_no_one_elses() -> None:
    identity = Identity.generate()
    certificate, _ = make_certificate(identity, NOW)
    assert peer_id_of(der(certificate), NOW) == identity.peer_id
    assert [e.critical for e in certificate.extensions if e.oid == EXTENSION_OID] == [True]
    assert "not valid now" in refused(der(certificate), NOW + datetime.timedelta(days=400))
    assert "not valid now" in refused(der(certificate), NOW - datetime.timedelta(days=1))


def _build(identity: Identity, *, extension: bytes | None = None, signer: ec.EllipticCurvePrivateKey | None = None,
           extra_critical: bool = False) -> bytes:
    """A certificate like ours, with one thing changed."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([])
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
               .serial_number(7).not_valid_before(NOW - datetime.timedelta(hours=1))
               .not_valid_after(NOW + datetime.timedelta(days=1)))
    value = signed_key(identity, key.public_key()) if extension is None else extension
    builder = builder.add_extension(x509.UnrecognizedExtension(EXTENSION_OID, value), critical=False)
    if extra_critical:
        builder = builder.add_extension(x509.UnrecognizedExtension(x509.ObjectIdentifier("1.2.3.4"), b"\x05\x00"),
                                        critical=True)
    return der(builder.sign(signer or key, hashes.SHA256()))


def test_every_rule_of_a_received_certificate() -> None:
    identity = Identity.generate()
    assert peer_id_of(_build(identity), NOW) == identity.peer_id  # the extension may be non-critical
    assert "self-signature" in refused(_build(identity, signer=ec.generate_private_key(ec.SECP256R1())))
    assert "unknown critical extension 1.2.3.4" in refused(_build(identity, extra_critical=True))
    # the host key signed another certificate key: this certificate's key is not the one it vouches for
    other = ec.generate_private_key(ec.SECP256R1())
    assert "signature" in refused(_build(identity, extension=signed_key(identity, other.public_key())))
    good = signed_key(identity, other.public_key())
    assert "not a SignedKey" in refused(_build(identity, extension=good + b"\x00"))  # trailing bytes
    assert "not a SignedKey" in refused(_build(identity, extension=b"\x30\x81\x02\x04\x00"))  # a long form for 2
    assert "not a SignedKey" in refused(_build(identity, extension=b"\x04\x00"))
    assert "not an X.509" in refused(b"\x30\x03\x02\x01\x00")


def test_a_certificate_without_the_extension_is_refused() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([])
    plain = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
             .serial_number(7).not_valid_before(NOW - datetime.timedelta(hours=1))
             .not_valid_after(NOW + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    assert "no libp2p public key extension" in refused(der(plain))
