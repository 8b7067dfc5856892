"""A private certificate authority for a local secured stack and for the tests.

``CertificateAuthority.create(directory)`` writes ``ca.crt`` / ``ca.key`` (EC P-256, the
key readable by the owner only); ``issue`` signs a certificate for a broker (server and
client use, with the hosts as subject alternative names, so brokers present the same
certificate to each other) or for a client (its common name becomes the mTLS principal
``User:CN=<name>``). ``validity`` lets a test make an expired certificate.

Nothing here is meant for production: a real deployment uses its organisation's CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "Issued"]


@dataclass(frozen=True, slots=True)
class Issued:
    certfile: Path
    keyfile: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    os.chmod(path, 0o600)


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    certfile: Path
    keyfile: Path

    @classmethod
    def create(cls, directory: Path, name: str = "Strata local CA") -> CertificateAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        certificate = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
        authority = cls(directory / "ca.crt", directory / "ca.key")
        authority.certfile.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        _write_key(authority.keyfile, key)
        return authority

    def issue(self, directory: Path, name: str, *,
              hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
              validity: tuple[datetime.timedelta, datetime.timedelta] | None = None
              ) -> Issued:
        """A certificate and key ``<name>.crt`` / ``<name>.key`` signed by this CA.
        ``validity``: (not before, not after) relative to now (default: -5 min, 825 days)."""
        ca_certificate = x509.load_pem_x509_certificate(self.certfile.read_bytes())
        ca_key = serialization.load_pem_private_key(self.keyfile.read_bytes(), None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        start, end = validity or (datetime.timedelta(minutes=-5), datetime.timedelta(days=825))
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_certificate.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now + start).not_valid_after(now + end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(ca_key, hashes.SHA256())
        directory.mkdir(parents=True, exist_ok=True)
        issued = Issued(directory / f"{name}.crt", directory / f"{name}.key")
        issued.certfile.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        _write_key(issued.keyfile, key)
        return issued
