"""A real nats-server running fracpilot's example configuration (deploy/nats/), and what the
tests need around it: one set of settings per identity, TLS certificates made with
``cryptography``, an nkey made from random bytes.

The example files are copied verbatim; only the port, the JetStream store, the passwords (test
values instead of environment references) and, when asked, a ``tls {}`` block are filled in.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fracpilot_actuator.hooks import release_secrets
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats.embedded import EmbeddedNats
from fracpilot_libs.server_process import free_port

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "deploy" / "nats"
IDENTITIES = ("ingest", "decision", "actuator", "policy-admin", "operator")


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def make_tls_files(directory: Path) -> TlsFiles:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("fracpilot test CA"))
        .issuer_name(_name("fracpilot test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(common_name: str, usage: x509.ObjectIdentifier, server: bool) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return key, builder.sign(ca_key, hashes.SHA256())

    files = TlsFiles(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server-key.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client-key.pem",
    )
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    server_key, server_cert = leaf("fracpilot-nats", ExtendedKeyUsageOID.SERVER_AUTH, True)
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(files.server_key, server_key)
    client_key, client_cert = leaf("fracpilot-decision", ExtendedKeyUsageOID.CLIENT_AUTH, False)
    files.client_cert.write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(files.client_key, client_key)
    return files


def chart_tls_files(directory: Path) -> TlsFiles:
    """The built-in NATS's certificate as the chart's release-secrets hook makes it
    (``nats_tls_secret_data``: a new CA, one certificate for server and client auth, since the
    routes between the servers are mutual TLS with it), for localhost and 127.0.0.1. The
    certificate is also the client's, for a test of mutual TLS."""
    directory.mkdir(parents=True, exist_ok=True)
    data = release_secrets.nats_tls_secret_data(
        "fracpilot-nats-tls-ca", ["localhost"], dt.datetime.now(dt.UTC), dt.timedelta(days=1)
    )
    files = TlsFiles(
        ca=directory / "ca.crt",
        server_cert=directory / "tls.crt",
        server_key=directory / "tls.key",
        client_cert=directory / "tls.crt",
        client_key=directory / "tls.key",
    )
    files.ca.write_bytes(data["ca.crt"])
    files.server_cert.write_bytes(data["tls.crt"])
    files.server_key.write_bytes(data["tls.key"])
    files.server_key.chmod(0o600)
    return files


def make_user_nkey(path: Path) -> str:
    """Write a new user nkey seed to ``path``; returns its public key (U...)."""
    seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER)
    path.write_bytes(seed + b"\n")
    path.chmod(0o600)
    return str(nkeys.from_seed(bytearray(seed)).public_key.decode())


def example_config(
    passwords: dict[str, str],
    tls: TlsFiles | None = None,
    verify_clients: bool = False,
    extra_users: tuple[str, ...] = (),
) -> str:
    """deploy/nats/nats-server.conf with the identities' test passwords, any further users and,
    with ``tls``, the client TLS block (``verify_clients``: mutual). Port, server name and store
    are left as the example has them; it includes permissions.conf from its own directory."""
    config = (EXAMPLE_DIR / "nats-server.conf").read_text()
    for name, password in passwords.items():
        variable = f"$FRACPILOT_NATS_{name.upper().replace('-', '_')}_PASSWORD"
        config = _replace_once(config, re.escape(variable), f'"{password}"')
    if extra_users:  # e.g. an nkey identity: added beside the example's users
        config = _replace_once(
            config, r"(?m)^    users: \[$", "    users: [\n" + "\n".join(extra_users)
        )
    if tls is not None:
        config += (
            "\ntls {\n"
            f'  cert_file: "{tls.server_cert}"\n'
            f'  key_file: "{tls.server_key}"\n'
            f'  ca_file: "{tls.ca}"\n'
            f"  verify: {'true' if verify_clients else 'false'}\n"
            "  timeout: 2\n}\n"
        )
    return config


def identity_passwords() -> dict[str, str]:
    return {name: f"test-{name}-{secrets.token_hex(8)}" for name in IDENTITIES}


class SecuredNats:
    """nats-server started with deploy/nats/nats-server.conf and permissions.conf."""

    def __init__(
        self,
        directory: Path,
        tls: TlsFiles | None = None,
        verify_clients: bool = False,
        extra_users: tuple[str, ...] = (),
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.passwords = identity_passwords()
        self.port = free_port()
        self.tls = tls
        store = directory / "store"
        shutil.copy(EXAMPLE_DIR / "permissions.conf", directory / "permissions.conf")
        config = example_config(self.passwords, tls, verify_clients, extra_users)
        config = _replace_once(config, r"(?m)^port: 4222$", f"port: {self.port}")
        # EmbeddedNats passes the store with -sd, which may not be given twice.
        config = _replace_once(config, r"store_dir: /data/jetstream", "# store_dir: -sd")
        self.config_path = directory / "nats-server.conf"
        self.config_path.write_text(config)
        self.server = EmbeddedNats(
            store_dir=str(store), port=self.port, extra_args=("-c", str(self.config_path))
        )

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def log_text(self) -> str:
        path = self.server.log_path
        return path.read_text(errors="replace") if path.exists() else ""

    def violations(self, user: str, client: str | None = None) -> list[str]:
        """The server's log lines about permissions this user lacked (on connections named
        ``client``, such as ``fracpilot-decision``, when given)."""
        who = f'"FRACPILOT/user:{user}"'
        return [
            line
            for line in self.log_text.splitlines()
            if who in line and "Violation" in line and (client is None or f':{client}"' in line)
        ]

    def identity(self, name: str, **nats: str) -> dict[str, dict[str, str]]:
        """``ServiceSettings`` keyword arguments (the ``nats`` group) for one example identity,
        with any further ``nats`` fields given."""
        fields = {"url": self.url, "user": name, "password": self.passwords[name]}
        if self.tls is not None:
            fields["tls_ca_file"] = str(self.tls.ca)
        return {"nats": fields | nats}

    def settings(self, name: str) -> ServiceSettings:
        """The identity's connection settings (for the test's own clients: helpers.connect)."""
        return ServiceSettings(**self.identity(name))

    def env(self, name: str) -> dict[str, str]:
        """The same identity as FRACPILOT_ environment variables (for the CLI)."""
        return {f"FRACPILOT_NATS_{k.upper()}": v for k, v in self.identity(name)["nats"].items()}

    def start(self) -> SecuredNats:
        self.server.start()
        return self

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL); the store stays, and ``start`` runs the same configuration."""
        self.server.stop(kill=kill)

    def cleanup(self) -> None:
        self.server.cleanup()

    def __enter__(self) -> SecuredNats:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def _replace_once(text: str, pattern: str, replacement: str) -> str:
    new, count = re.subn(pattern, lambda _m: replacement, text, count=1)
    if count != 1:
        raise ValueError(f"the example config no longer contains {pattern!r}")
    return new


def without_nats_env() -> dict[str, str]:
    """This process's environment minus FRACPILOT_NATS_* (so a test names its own)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FRACPILOT_NATS_")}
