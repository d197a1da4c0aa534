"""TLS for tests: a throwaway CA and a loopback server certificate, and a bearer-token proxy.

Prometheus' ``--web.config.file`` serves TLS (``tls_server_config``) and checks basic auth,
but it cannot check a bearer token: managed Prometheus services and the Prometheus Operator's
kube-rbac-proxy do that in front of it. :class:`BearerTokenProxy` plays that part: an HTTPS
server on loopback that answers 401 unless ``Authorization: Bearer <token>`` carries its
current token (change ``proxy.token`` to rotate), and forwards the rest to the upstream
(itself HTTPS, verified against the CA).

    tls = make_tls_files(tmp_path)
    with PrometheusServer(targets, tls=tls) as prom, BearerTokenProxy(prom.url, tls, "t1") as p:
        ...  # query p.url with the token, verifying against tls.ca_file
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from support.serving_thread import QuietHandler, ServingThread

__all__ = ["BearerTokenProxy", "TlsFiles", "make_tls_files"]


@dataclass(frozen=True)
class TlsFiles:
    ca_file: Path
    cert_file: Path
    key_file: Path

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_tls_files(directory: Path) -> TlsFiles:
    """A CA and a server certificate for 127.0.0.1 and localhost, valid for a day."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = _key(), _key()
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("fracpilot test CA"))
        .issuer_name(_name("fracpilot test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    ]
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    files.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    files.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return files


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    proxy: BearerTokenProxy


class _Handler(QuietHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        proxy = self.server.proxy
        proxy.last_headers = dict(self.headers.items())
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Authorization") != f"Bearer {proxy.token}":
            proxy.count(refused=True)
            self.answer(401, b"unauthorized\n", "text/plain")
            return
        proxy.count(refused=False)
        request = urllib.request.Request(
            proxy.upstream + self.path, data=body or None, method=self.command
        )
        if content_type := self.headers.get("Content-Type"):
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=30, context=proxy.upstream_context) as r:
                self.answer(r.status, r.read(), r.headers.get("Content-Type", "text/plain"))
        except urllib.error.HTTPError as err:
            self.answer(err.code, err.read(), err.headers.get("Content-Type", "text/plain"))

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._forward()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self._forward()


class BearerTokenProxy(ServingThread):
    """HTTPS on a free loopback port, checking a bearer token, forwarding to ``upstream``."""

    def __init__(self, upstream: str, tls: TlsFiles, token: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.upstream_context = tls.client_context()
        self.token = token
        self.accepted = 0
        self.refused = 0
        self.last_headers: dict[str, str] = {}  # of the last request, as received
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._server.socket = tls.server_context().wrap_socket(
            self._server.socket, server_side=True
        )
        self.url = f"https://127.0.0.1:{self._server.server_address[1]}"
        super().__init__(self._server, f"bearer-token-proxy-{self.url}")

    def count(self, *, refused: bool) -> None:
        with self._lock:
            if refused:
                self.refused += 1
            else:
                self.accepted += 1
