"""A real Kubernetes control plane for tests: etcd + kube-apiserver on loopback, as envtest runs it.

The binaries (kube-apiserver, the etcd Kubernetes pins, helm) are built from their Go modules by
``scripts/k8s-testbin.sh`` into a per-machine cache outside the repository,
``${FRACPILOT_K8S_TESTBIN:-~/.cache/fracpilot/k8s-testbin/<k8s-version>}/bin``;
:func:`ensure_testbin` runs that script when they are missing (several minutes, once).

No controllers, scheduler or kubelet run: objects are stored and validated, authentication and
RBAC authorization are real, and status is whatever a test writes. So there is no ``default``
ServiceAccount, namespaces never finish terminating, Deployments make no Pods and a
PodDisruptionBudget has no status until the test sets one. Use a fresh namespace per test.

Identities:

- admin: client certificate CN=admin O=system:masters (bypasses RBAC), :meth:`admin_client`;
- a static bearer token (:attr:`static_token` for user :attr:`static_token_user`, group
  ``testers``, no permissions until a test grants some), :meth:`token_client`;
- real ServiceAccounts: :meth:`service_account_client` mints a token with TokenRequest.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client

from fracpilot_libs.server_process import ServerProcess, free_port
from fracpilot_libs.server_process import wait_for as wait_for  # the tests take it from here

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "scripts" / "k8s-testbin.sh"
BINARIES = ("kube-apiserver", "etcd", "helm")


class ControlPlaneError(RuntimeError):
    """The binaries could not be built or a component did not start."""


# --- the cached binaries -------------------------------------------------------------------------


def _pinned(variable: str) -> str:
    """A version the build script pins: ``FRACPILOT_<variable>`` or the script's default."""
    if version := os.environ.get(f"FRACPILOT_{variable}"):
        return version
    pattern = rf"^{variable}=\$\{{FRACPILOT_{variable}:-(v[0-9.]+)\}}"
    match = re.search(pattern, BUILD_SCRIPT.read_text(), re.MULTILINE)
    if match is None:
        raise ControlPlaneError(f"no {variable} default found in {BUILD_SCRIPT}")
    return match.group(1)


def k8s_version() -> str:
    """The Kubernetes version the build script pins (``FRACPILOT_K8S_VERSION`` overrides it)."""
    return _pinned("K8S_VERSION")


def helm_version() -> str:
    """The helm version the build script pins (``FRACPILOT_HELM_VERSION`` overrides it)."""
    return _pinned("HELM_VERSION")


def cached_bin_dir() -> Path:
    """Where the build script puts the binaries (they may not be there yet)."""
    if root := os.environ.get("FRACPILOT_K8S_TESTBIN"):
        return Path(root) / "bin"
    return Path.home() / ".cache" / "fracpilot" / "k8s-testbin" / k8s_version() / "bin"


def cached_bins_complete(bin_dir: Path | None = None) -> bool:
    """True when every binary and the stamp of a finished build for this version are there."""
    bin_dir = bin_dir or cached_bin_dir()
    stamp = bin_dir / ".stamp"
    if not stamp.is_file():
        return False
    recipe = re.search(r"^RECIPE=(\d+)", BUILD_SCRIPT.read_text(), re.MULTILINE)
    wanted = {f"kubernetes={k8s_version()}", f"helm={helm_version()}"}
    wanted.add(f"recipe={recipe.group(1) if recipe else ''}")
    if not wanted <= set(stamp.read_text().splitlines()):
        return False
    return all(os.access(bin_dir / name, os.X_OK) for name in BINARIES)


def ensure_testbin(*, output: IO[str] | None = None) -> Path:
    """The bin directory, built by ``scripts/k8s-testbin.sh`` first when it is not complete.

    The script's progress goes to ``output`` (default: stderr); a cold build takes minutes.
    """
    bin_dir = cached_bin_dir()
    if cached_bins_complete(bin_dir):
        return bin_dir
    if shutil.which("go") is None:
        raise ControlPlaneError(
            f"the Kubernetes test binaries are not in {bin_dir} and building them needs Go "
            f"(https://go.dev/dl/); or point FRACPILOT_K8S_TESTBIN at a built cache"
        )
    stream = output or sys.stderr
    print(f"building Kubernetes test binaries into {bin_dir} (once per machine)", file=stream)
    try:  # stream the progress when the stream is a real file (it is not under pytest's capture)
        stream.flush()
        progress: IO[str] | int = stream if stream.fileno() >= 0 else subprocess.PIPE
    except (OSError, ValueError):
        progress = subprocess.PIPE
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=progress,
        text=True,
        check=False,
    )
    if proc.stderr:
        stream.write(proc.stderr)
    if proc.returncode != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    built = Path(proc.stdout.strip().splitlines()[-1])
    if not cached_bins_complete(built):
        raise ControlPlaneError(f"{BUILD_SCRIPT} finished but {built} is incomplete")
    return built


# --- certificates --------------------------------------------------------------------------------


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


@dataclass(frozen=True)
class _Issued:
    key: rsa.RSAPrivateKey
    cert: x509.Certificate


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _issue(
    common_name: str,
    *,
    issuer: _Issued | None = None,
    organizations: Sequence[str] = (),
    server: bool = False,
    sans: Sequence[str] = (),
) -> _Issued:
    """A CA (``issuer`` None: self-signed) or a leaf signed by ``issuer``, valid for a week."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.now(datetime.UTC)
    subject = _name(common_name, organizations)
    is_ca = issuer is None
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if issuer is None else issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=not is_ca,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=is_ca,
                crl_sign=is_ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if issuer is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()),
            critical=False,
        ).add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    if sans:
        names: list[x509.GeneralName] = []
        for san in sans:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(san)))
            except ValueError:
                names.append(x509.DNSName(san))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(key if issuer is None else issuer.key, hashes.SHA256())
    return _Issued(key, cert)


# --- the control plane ---------------------------------------------------------------------------


class ControlPlane:
    """etcd + kube-apiserver in a temporary directory; use as a context manager or start/stop.

    Logs: ``<workdir>/etcd.log`` and ``<workdir>/apiserver.log`` (set
    ``FRACPILOT_K8S_KEEP=1`` to keep the directory after :meth:`stop`).
    """

    static_token_user = "tester"
    static_token_groups = ("testers",)

    def __init__(
        self,
        bin_dir: Path | None = None,
        *,
        start_timeout: float = 90.0,
        extra_apiserver_args: Sequence[str] = (),
    ) -> None:
        self.bin_dir = bin_dir
        self.start_timeout = start_timeout
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.workdir = Path(tempfile.mkdtemp(prefix="fracpilot-k8s-"))
        self.certs_dir = self.workdir / "certs"
        self.ca_path = self.certs_dir / "serving-ca.crt"
        self.admin_cert_path = self.certs_dir / "admin.crt"
        self.admin_key_path = self.certs_dir / "admin.key"
        self.static_token = secrets.token_hex(16)
        self.etcd_url = ""
        self.url = ""
        self._etcd = ServerProcess("etcd", self.workdir / "etcd.log")
        self._apiserver = ServerProcess("kube-apiserver", self.workdir / "apiserver.log")

    # lifecycle

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        self.bin_dir = bin_dir = self.bin_dir or ensure_testbin()
        try:
            self._write_pki()
            self._start_etcd(bin_dir / "etcd")
            self._start_apiserver(bin_dir / "kube-apiserver")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd, and remove the temporary directory."""
        for server in (self._apiserver, self._etcd):
            server.stop(15.0)
        if os.environ.get("FRACPILOT_K8S_KEEP"):
            print(f"kept control plane directory {self.workdir}", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def log_paths(self) -> dict[str, Path]:
        return {s.name: s.log_path for s in (self._etcd, self._apiserver)}

    # set-up steps

    def _write_pki(self) -> None:
        self.certs_dir.mkdir(parents=True)
        serving_ca = _issue("fracpilot-test-serving-ca")
        serving = _issue(
            "kube-apiserver",
            issuer=serving_ca,
            server=True,
            sans=("127.0.0.1", "localhost", "kubernetes.default.svc"),
        )
        client_ca = _issue("fracpilot-test-client-ca")
        admin = _issue("admin", issuer=client_ca, organizations=("system:masters",))
        sa_signer = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        d = self.certs_dir
        _write_cert(self.ca_path, serving_ca.cert)
        _write_cert(d / "serving.crt", serving.cert)
        _write_key(d / "serving.key", serving.key)
        _write_cert(d / "client-ca.crt", client_ca.cert)
        _write_cert(self.admin_cert_path, admin.cert)
        _write_key(self.admin_key_path, admin.key)
        _write_key(d / "sa.key", sa_signer)
        (d / "sa.pub").write_bytes(
            sa_signer.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        groups = ",".join(self.static_token_groups)
        (d / "tokens.csv").write_text(
            f'{self.static_token},{self.static_token_user},uid-{self.static_token_user},"{groups}"\n'
        )
        (d / "tokens.csv").chmod(0o600)

    def _start_etcd(self, binary: Path) -> None:
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        argv = [
            str(binary),
            "--name=fracpilot-test",
            f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=fracpilot-test={peer_url}",
        ]
        if _supports_flag(binary, "--unsafe-no-fsync"):
            argv.append("--unsafe-no-fsync=true")

        def healthy() -> bool | None:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                return True if json.load(resp).get("health") == "true" else None

        self._etcd.start(argv, ready=healthy, timeout=self.start_timeout)

    def _start_apiserver(self, binary: Path) -> None:
        port = free_port()
        self.url = f"https://127.0.0.1:{port}"
        d = self.certs_dir
        argv = [
            str(binary),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={d / 'serving.crt'}",
            f"--tls-private-key-file={d / 'serving.key'}",
            f"--client-ca-file={d / 'client-ca.crt'}",
            f"--token-auth-file={d / 'tokens.csv'}",
            f"--service-account-issuer={self.url}",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            # No controller-manager creates the `default` ServiceAccount that this plugin wants.
            "--disable-admission-plugins=ServiceAccount",
            # The endpoints of the `kubernetes` Service would be 127.0.0.1, which is invalid.
            "--endpoint-reconciler-type=none",
            *self.extra_apiserver_args,
        ]
        context = ssl.create_default_context(cafile=str(self.ca_path))
        context.load_cert_chain(str(self.admin_cert_path), str(self.admin_key_path))

        def ready() -> bool | None:
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=5, context=context):
                    return True
            except urllib.error.HTTPError:
                return None  # 500 while post-start hooks are still running

        self._apiserver.start(argv, ready=ready, timeout=self.start_timeout)
        with self.admin_client() as api:
            core = client.CoreV1Api(api)
            self._apiserver.wait_until(
                lambda: core.read_namespace("default"),
                timeout=self.start_timeout,
                interval=0.2,
                what="namespace default",
            )

    # clients

    def _configuration(self) -> client.Configuration:
        if not self.url:
            raise ControlPlaneError("the control plane is not started")
        config = client.Configuration(host=self.url, ssl_ca_cert=str(self.ca_path))
        config.verify_ssl = True
        return config

    def admin_client(self) -> client.ApiClient:
        """An ApiClient authenticated as CN=admin O=system:masters (RBAC does not apply)."""
        config = self._configuration()
        config.cert_file = str(self.admin_cert_path)
        config.key_file = str(self.admin_key_path)
        return client.ApiClient(config)

    def token_client(self, token: str | None = None) -> client.ApiClient:
        """An ApiClient sending ``Authorization: Bearer <token>`` (default: the static token)."""
        config = self._configuration()
        config.api_key = {"BearerToken": token or self.static_token}
        config.api_key_prefix = {"BearerToken": "Bearer"}
        return client.ApiClient(config)

    def service_account_token(
        self, namespace: str, name: str, *, expiration_seconds: int = 3600
    ) -> str:
        """Mint a token for an existing ServiceAccount with the TokenRequest API."""
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds)
        )
        with self.admin_client() as api:
            response = client.CoreV1Api(api).create_namespaced_service_account_token(
                name, namespace, request
            )
        token = response.status.token if response.status else None
        if not token:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{name} returned no token")
        return str(token)

    def service_account_client(self, namespace: str, name: str) -> client.ApiClient:
        """An ApiClient that authenticates as ``system:serviceaccount:<namespace>:<name>``."""
        return self.token_client(self.service_account_token(namespace, name))

    def write_kubeconfig(self, path: Path | None = None, *, token: str | None = None) -> Path:
        """Write a kubeconfig for admin (or for ``token``) and return its path."""
        path = path or self.workdir / ("kubeconfig" if token is None else "kubeconfig-token")
        user: dict[str, str] = (
            {"token": token}
            if token is not None
            else {
                "client-certificate": str(self.admin_cert_path),
                "client-key": str(self.admin_key_path),
            }
        )
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "fracpilot-test",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca_path)},
                }
            ],
            "users": [{"name": "fracpilot-test", "user": user}],
            "contexts": [
                {
                    "name": "fracpilot-test",
                    "context": {"cluster": "fracpilot-test", "user": "fracpilot-test"},
                }
            ],
            "current-context": "fracpilot-test",
        }
        path.write_text(json.dumps(config, indent=2))  # JSON is YAML: kubectl and helm read it
        path.chmod(0o600)
        return path

    @property
    def helm(self) -> Path:
        """The cached helm binary (built with this Kubernetes version as its default)."""
        return (self.bin_dir or cached_bin_dir()) / "helm"


def _supports_flag(binary: Path, flag: str) -> bool:
    proc = subprocess.run(
        [str(binary), "--help"], capture_output=True, text=True, check=False, timeout=30
    )
    return flag in proc.stdout + proc.stderr
