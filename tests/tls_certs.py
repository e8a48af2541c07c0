"""Throwaway certificate authorities and certificates for the TLS tests (the `cryptography`
package of the test extra): a CA, and certificates it signs for 127.0.0.1 and localhost that
serve both as server and as client certificates, as a rank's certificate does."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Issued:
    """Paths of a PEM certificate, its key, and the CA that signed it."""

    cert: str
    key: str
    ca: str

    def env(self) -> dict[str, str]:
        return {
            "PYCOLLECTIVE_TLS_CERT": self.cert,
            "PYCOLLECTIVE_TLS_KEY": self.key,
            "PYCOLLECTIVE_TLS_CA": self.ca,
        }


class Authority:
    """A CA whose certificate and key live under ``folder``."""

    def __init__(self, folder: str, name: str) -> None:
        self.folder, self.name = folder, name
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.ca_path = _write(folder, f"{name}-ca.pem", self.cert.public_bytes(_PEM))

    def issue(self, holder: str, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Issued:
        """A certificate for ``holder`` naming ``hosts`` (IP or DNS subjectAltNames)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, holder)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            _PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return Issued(
            cert=_write(self.folder, f"{self.name}-{holder}.pem", cert.public_bytes(_PEM)),
            key=_write(self.folder, f"{self.name}-{holder}.key", key_pem),
            ca=self.ca_path,
        )


_PEM = serialization.Encoding.PEM


def _write(folder: str, name: str, data: bytes) -> str:
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)
    return path
