"""A small certificate authority per cluster, kept on the controller, and the hosts' certificates.

The directory (the user's ``gpumon_tls_dir``) is created 0700; the CA key (``ca.key``) and every
host key (``hosts/<host>.key``) are written 0600 and never leave the controller except a host's
own key to that host. A key file others can read is refused rather than used. A host's
certificate is issued again when it is missing, was not signed by this CA, names other SANs than
the host has now, or expires within the renewal threshold (``renew_days``): a normal ``up``
renews it. Keys are ECDSA P-256; certificates are X.509 v3 with the SANs as the only names that
count (CN is informational; Go's crypto/x509 ignores it for verification).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from deployer.controller_secrets import read_private, write_private
from deployer.errors import InputError

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CA_DAYS = 3650


@dataclass(frozen=True)
class Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()


@dataclass(frozen=True)
class Issued:
    cert_pem: str
    key_pem: str
    not_after: dt.datetime
    issued: bool  # True when this call issued it (new, changed SANs, or renewed)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _directory(path: Path) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute():
        raise InputError(f"gpumon_tls_dir must be an absolute path, got {str(path)!r}")
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    (p / "hosts").mkdir(mode=0o700, exist_ok=True)
    return p


def ensure_ca(directory: Path, name: str = "gpumon") -> Authority:
    """The CA kept in ``directory``, created at first use."""
    d = _directory(directory)
    cert_path, key_path = d / CA_CERT, d / CA_KEY
    if key_path.exists() and cert_path.exists():
        key = serialization.load_pem_private_key(read_private(key_path), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise InputError(f"{key_path}: not an ECDSA key", source=str(key_path))
        return Authority(x509.load_pem_x509_certificate(cert_path.read_bytes()), key)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} monitoring CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(key_path, _key_pem(key), 0o600)
    write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return Authority(cert, key)


def split_names(names: list[str]) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) of ``names``, each sorted and without duplicates."""
    dns: set[str] = set()
    ips: set[str] = set()
    for n in names:
        n = str(n).strip()
        if not n:
            continue
        try:
            ips.add(str(ipaddress.ip_address(n)))
        except ValueError:
            dns.add(n.lower())
    return sorted(dns), sorted(ips)


def sans_of(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return [], []
    dns = sorted(n.lower() for n in ext.get_values_for_type(x509.DNSName))
    ips = sorted(str(a) for a in ext.get_values_for_type(x509.IPAddress))
    return dns, ips


def _signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def needs_issue(
    cert: x509.Certificate | None,
    ca: Authority,
    names: list[str],
    renew_days: int,
    now: dt.datetime | None = None,
    also_signed_by: x509.Certificate | None = None,
) -> str | None:
    """Why the host's certificate must be issued again, or None when it is good. A certificate of
    ``also_signed_by`` counts as good too (the old CA, while clients trust both: rotation.py)."""
    if cert is None:
        return "missing"
    if not _signed_by(cert, ca.cert) and not (
        also_signed_by is not None and _signed_by(cert, also_signed_by)
    ):
        return "not signed by this CA"
    if sans_of(cert) != split_names(names):
        return "its names changed"
    left = cert.not_valid_after_utc - (now or _now())
    if left < dt.timedelta(days=renew_days):
        return f"expires in {max(left.days, 0)} days (renewed under {renew_days})"
    return None


def issue_host(
    ca: Authority,
    directory: Path,
    host: str,
    names: list[str],
    *,
    days: int,
    renew_days: int,
    now: dt.datetime | None = None,
    also_signed_by: x509.Certificate | None = None,
) -> Issued:
    """``host``'s certificate and key, issued (or issued again) when :func:`needs_issue` says."""
    if renew_days >= days:
        raise InputError(
            f"gpumon_tls_renew_days ({renew_days}) must be below gpumon_tls_cert_days ({days})",
            key="gpumon_tls_renew_days",
        )
    d = _directory(directory) / "hosts"
    cert_path, key_path = d / f"{host}.crt", d / f"{host}.key"
    current = None
    if cert_path.exists() and key_path.exists():
        current = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key_bytes = read_private(key_path)
        if needs_issue(current, ca, names, renew_days, now, also_signed_by) is None:
            return Issued(
                cert_path.read_text(), key_bytes.decode(), current.not_valid_after_utc, False
            )
    key = ec.generate_private_key(ec.SECP256R1())
    dns, ips = split_names(names)
    start = now or _now()
    san = [x509.DNSName(n) for n in dns] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - dt.timedelta(minutes=5))
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = _key_pem(key)
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    write_private(key_path, key_pem, 0o600)
    write_private(cert_path, cert_pem, 0o644)
    return Issued(cert_pem.decode(), key_pem.decode(), cert.not_valid_after_utc, True)
