"""``dpdl consortium init``: a consortium certificate authority and, for every party, a key
and a certificate signed by it (``cryptography``; ECDSA P-256, SHA-256).

A party's certificate names it twice: subject CN (what a server checks of a client,
``auth_context``) and a DNS SAN (what a client checks of a server, as the TLS target name).
Keys are written readable by their owner only (0600); the CA key signs nothing after
provisioning and belongs offline, away from every party.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dpdl.engine.consortium.settings import Consortium
from dpdl.errors import require

__all__ = ["Identity", "issue", "new_authority", "provision"]

CA_DAYS, PARTY_DAYS = 3650, 825


@dataclass(frozen=True)
class Identity:
    """A private key and its certificate (PEM bytes)."""

    key_pem: bytes
    cert_pem: bytes

    @property
    def key(self):
        return serialization.load_pem_private_key(self.key_pem, password=None)

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())  # fmt: skip


def _builder(subject: str, issuer: x509.Name, public_key, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days)))  # fmt: skip


def new_authority(name: str) -> Identity:
    """A self-signed CA for consortium ``name`` (it may sign certificates only)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} consortium CA")])
    cert = (_builder(f"{name} consortium CA", subject, key.public_key(), CA_DAYS)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))  # fmt: skip
    return Identity(_key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def issue(authority: Identity, party: str) -> Identity:
    """A key and a certificate for ``party`` signed by ``authority``: CN and DNS SAN the name,
    good for TLS server and client authentication."""
    key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = authority.cert
    cert = (_builder(party, ca_cert.subject, key.public_key(), PARTY_DAYS)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(party)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(authority.key, hashes.SHA256()))  # fmt: skip
    return Identity(_key_pem(key), cert.public_bytes(serialization.Encoding.PEM))


def write_identity(identity: Identity, cert_path: Path, key_path: Path) -> None:
    """Write the certificate (0644) and the key (0600, created so: never readable by others)."""
    for path in (cert_path, key_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    cert_path.write_bytes(identity.cert_pem)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(identity.key_pem)


def provision(consortium: Consortium, out_dir: str | Path) -> list[Path]:
    """The consortium's CA (``ca.pem``, ``ca.key``) and every party's ``<name>.pem`` and
    ``<name>.key`` in ``out_dir``; refuses, before writing anything, to overwrite a file."""
    out = Path(out_dir)
    targets = [out / "ca.pem", out / "ca.key"] + [
        out / f"{p.name}{suffix}" for p in consortium.parties for suffix in (".pem", ".key")]
    existing = [str(t) for t in targets if t.exists()]
    require(not existing, f"{existing[0] if existing else ''} exists: refusing to overwrite "
                          "keys or certificates (choose an empty folder)")  # fmt: skip
    authority = new_authority(consortium.name)
    write_identity(authority, out / "ca.pem", out / "ca.key")
    for party in consortium.parties:
        write_identity(issue(authority, party.name), out / f"{party.name}.pem",
                       out / f"{party.name}.key")  # fmt: skip
    return targets
