"""The webhook's serving certificate: made, and judged still good, as pure functions.

The chart can make its secrets in the cluster (``secretGeneration: job``) instead of at render
time, so that two renders of the same values are the same (GitOps tools diff renders). Then a
hook Job (:mod:`fracpilot_actuator.hooks.release_secrets`) calls :func:`issue_serving_bundle`
once and :func:`renewal_reason` on every upgrade; the CA lives only in the Secret and in the
webhook's
``caBundle``. Time is an argument, so expiry is testable.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The apiserver accepts P-256 ECDSA; it is small and quick to make in a Job.
_CURVE = ec.SECP256R1()


@dataclass(frozen=True)
class TlsBundle:
    """PEM bytes as a ``kubernetes.io/tls`` Secret holds them (plus the CA)."""

    ca_crt: bytes
    tls_crt: bytes
    tls_key: bytes

    def as_secret_data(self) -> dict[str, bytes]:
        return {"ca.crt": self.ca_crt, "tls.crt": self.tls_crt, "tls.key": self.tls_key}


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def issue_serving_bundle(
    ca_name: str,
    dns_names: list[str],
    now: dt.datetime,
    validity: dt.timedelta,
    *,
    ip_addresses: Sequence[str] = (),
    client_auth: bool = False,
) -> TlsBundle:
    """A new CA and a serving certificate for ``dns_names`` (and ``ip_addresses``) signed by
    it, valid from ``now``. ``client_auth``: also a client certificate (NATS routes present
    the same certificate both ways)."""
    if not dns_names:
        raise ValueError("a serving certificate needs at least one DNS name")
    ca_key = ec.generate_private_key(_CURVE)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(ca_name))
        .issuer_name(_name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # clock skew between nodes
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    usages = [ExtendedKeyUsageOID.SERVER_AUTH]
    if client_auth:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    key = ec.generate_private_key(_CURVE)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(dns_names[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + validity)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return TlsBundle(
        ca_crt=ca_cert.public_bytes(serialization.Encoding.PEM),
        tls_crt=cert.public_bytes(serialization.Encoding.PEM),
        tls_key=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def renewal_reason(
    data: dict[str, bytes], dns_names: list[str], now: dt.datetime, renew_before: dt.timedelta
) -> str | None:
    """Why the Secret's bundle must be made again, or None when it is still good.

    Good means: all three keys present and parseable, the certificate signed by the CA, the
    key matching the certificate, every DNS name covered, and neither expiring before
    ``now + renew_before``.
    """
    missing = [k for k in ("ca.crt", "tls.crt", "tls.key") if not data.get(k)]
    if missing:
        return f"missing {', '.join(missing)}"
    try:
        ca = x509.load_pem_x509_certificate(data["ca.crt"])
        cert = x509.load_pem_x509_certificate(data["tls.crt"])
        key = serialization.load_pem_private_key(data["tls.key"], password=None)
    except ValueError as exc:
        return f"unreadable: {exc}"
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError) as exc:
        return f"tls.crt is not signed by ca.crt ({type(exc).__name__})"
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if public != cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        return "tls.key does not match tls.crt"
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        covered = set(san.value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        covered = set()
    uncovered = sorted(set(dns_names) - covered)
    if uncovered:
        return f"does not cover {', '.join(uncovered)}"
    deadline = now + renew_before
    for what, c in (("ca.crt", ca), ("tls.crt", cert)):
        if c.not_valid_after_utc <= deadline:
            return f"{what} expires {c.not_valid_after_utc.isoformat()}"
    return None
