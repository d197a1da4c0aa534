"""NATS through the kubeconfig: ``kubectl fracpilot`` (or ``fracpilot --kubeconfig ...``).

The release is found by the labels every object of the chart carries
(helm/fracpilot/templates/_helpers.tpl: ``app.kubernetes.io/part-of=fracpilot``,
``app.kubernetes.io/instance=<release>``). How to reach NATS is read from a service's own
Deployment, so the CLI connects exactly as the services do: ``FRACPILOT_NATS_URL``, the user
and password from the Secret its ``secretKeyRef`` names (nats-auth-secret.yaml, or the
``existingSecret`` of yours), and the nkey seed, creds or TLS files from the Secret volume
mounted where its ``FRACPILOT_NATS_*_FILE`` points. When the URL names a Service of the
cluster (the chart's own NATS: ``nats://<release>-fracpilot-nats.<ns>.svc:4222``), a local
loopback port is forwarded to a ready pod behind it through the API server (the kubernetes
client's ``portforward``); otherwise the URL is used as it is. Files from Secrets go to a
private temporary directory, removed when the command ends.

The identity is not the service's: when the release has one NATS identity per component
(``nats.auth.type: identities``, the chart's default), its ``nats-clients`` ConfigMap names the
Secrets of the read-only ``operator`` identity, which every command uses, and of
``policy-admin``, which only ``policy set`` asks for. So what a person may do is what
Kubernetes RBAC lets them ``get``: the operator's Secret to read, policy-admin's to change a
policy. A release with one shared identity (or none) has no such ConfigMap: the service's is
used, as before.

The lookups (:func:`nats_access_from_pod_spec`, :func:`service_of_url`) work on plain
dicts, as the API returns them, so the chart's rendered output can be checked against them.
"""

from __future__ import annotations

import base64
import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from fracpilot_cli.forwarding import Connector, Forwarder, Stream

PART_OF = "app.kubernetes.io/part-of=fracpilot"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
# The services whose environment says how to reach NATS, in order of preference.
SERVICES = ("decision", "actuator", "ingest")
DEFAULT_NAMESPACE = "fracpilot"
# FRACPILOT_NATS_* variables that name files -> the NatsSettings field they fill
FILE_SETTINGS = {
    "FRACPILOT_NATS_NKEY_SEED_FILE": "nkey_seed_file",
    "FRACPILOT_NATS_CREDS_FILE": "creds_file",
    "FRACPILOT_NATS_TLS_CA_FILE": "tls_ca_file",
    "FRACPILOT_NATS_TLS_CERT_FILE": "tls_cert_file",
    "FRACPILOT_NATS_TLS_KEY_FILE": "tls_key_file",
}
IDENTITY = ("user", "password", *FILE_SETTINGS.values())
# The settings that say who connects (the TLS CA stays the service's view).
CREDENTIALS = ("user", "password", "nkey_seed_file", "creds_file")
CLIENTS_COMPONENT = "nats-clients"
# The chart's identities a person may take.
OPERATOR = "operator"
POLICY_ADMIN = "policy-admin"


class KubeAccessError(Exception):
    """The release, its NATS or its credentials cannot be found or reached."""


@dataclass(frozen=True)
class KubeTarget:
    """Where to look: the kubeconfig options (None: the defaults)."""

    kubeconfig: str | None = None
    context: str | None = None
    release: str | None = None
    namespace: str | None = None  # the release's namespace


@dataclass(frozen=True)
class SecretKey:
    secret: str
    key: str


@dataclass(frozen=True)
class NatsAccess:
    """How a service of the release connects to NATS (its pod spec's view)."""

    url: str
    values: dict[str, str] = field(default_factory=dict)  # NatsSettings field -> value
    secrets: dict[str, SecretKey] = field(default_factory=dict)  # field -> where it is stored


@dataclass(frozen=True)
class Release:
    namespace: str
    name: str
    access: NatsAccess


# --- pure lookups ----------------------------------------------------------------------------


def release_namespaces(target: KubeTarget, context_namespace: str | None) -> list[str]:
    """Where to look for the release: the one asked for, else the context's then fracpilot."""
    if target.namespace:
        return [target.namespace]
    return list(dict.fromkeys(n for n in (context_namespace, DEFAULT_NAMESPACE) if n))


def _volume_file(spec: Mapping[str, Any], container: Mapping[str, Any], path: str) -> SecretKey:
    """The Secret key mounted at ``path`` in ``container``."""
    p = PurePosixPath(path)
    for mount in container.get("volumeMounts") or []:
        base = PurePosixPath(mount["mountPath"])
        if base not in p.parents:
            continue
        relative = str(p.relative_to(base))
        volume = next((v for v in spec.get("volumes") or [] if v["name"] == mount["name"]), None)
        secret = (volume or {}).get("secret")
        if not secret:
            raise KubeAccessError(f"{path} is not mounted from a Secret (volume {mount['name']})")
        items = secret.get("items")
        key = relative
        if items:
            key = next((i["key"] for i in items if i["path"] == relative), "")
            if not key:
                raise KubeAccessError(f"{path}: no item of Secret {secret['secretName']}")
        return SecretKey(secret["secretName"], key)
    raise KubeAccessError(f"{path} is not on a mounted volume")


def nats_access_from_pod_spec(spec: Mapping[str, Any]) -> NatsAccess:
    """How the pod's first container that sets FRACPILOT_NATS_URL connects (camelCase keys,
    as the API serves them)."""
    for container in spec.get("containers") or []:
        env = {e["name"]: e for e in container.get("env") or []}
        if "FRACPILOT_NATS_URL" not in env:
            continue
        url = env["FRACPILOT_NATS_URL"].get("value") or ""
        values: dict[str, str] = {}
        secrets: dict[str, SecretKey] = {}
        for variable, setting in (
            ("FRACPILOT_NATS_USER", "user"),
            ("FRACPILOT_NATS_PASSWORD", "password"),
        ):
            entry = env.get(variable)
            if entry is None:
                continue
            ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                secrets[setting] = SecretKey(ref["name"], ref["key"])
            elif entry.get("value"):
                values[setting] = entry["value"]
        for variable, setting in FILE_SETTINGS.items():
            entry = env.get(variable)
            if entry is not None and entry.get("value"):
                secrets[setting] = _volume_file(spec, container, entry["value"])
        return NatsAccess(url=url, values=values, secrets=secrets)
    raise KubeAccessError("no container sets FRACPILOT_NATS_URL")


def with_identity(
    access: NatsAccess, clients: Mapping[str, str] | None, identity: str
) -> NatsAccess:
    """``access`` connecting as ``identity`` (operator or policy-admin) instead of the service:
    its user and password from the Secret the ``nats-clients`` ConfigMap (``clients``) names.
    None (a release without per-component identities): ``access`` unchanged."""
    if clients is None:
        return access
    secret = clients.get(f"{identity}.secret")
    if not secret:
        raise KubeAccessError(f"the release's NATS has no {identity} identity")
    secrets = {k: v for k, v in access.secrets.items() if k not in CREDENTIALS}
    secrets["user"] = SecretKey(secret, clients.get("userKey") or "user")
    secrets["password"] = SecretKey(secret, clients.get("passwordKey") or "password")
    values = {k: v for k, v in access.values.items() if k not in CREDENTIALS}
    return NatsAccess(url=access.url, values=values, secrets=secrets)


def service_of_url(url: str, namespace: str) -> tuple[str, str, int] | None:
    """(Service, namespace, port) when the first of ``url``'s servers is a cluster Service
    name (``name``, ``name.ns``, ``name.ns.svc``, ``name.ns.svc.<domain>``); None for an IP
    address or a name outside the cluster."""
    first = url.split(",")[0].strip()
    parts = urlsplit(first if "://" in first else f"nats://{first}")
    host = parts.hostname or ""
    port = parts.port or 4222
    labels = host.split(".")
    if not host or host.replace(".", "").isdigit() or ":" in host:
        return None
    if len(labels) == 1:
        return labels[0], namespace, port
    if len(labels) == 2 or (len(labels) >= 3 and labels[2] == "svc"):
        return labels[0], labels[1], port
    return None


def target_port(service: Any, port: int, pod: Any) -> int:
    """The pod's port behind ``service``'s ``port`` (a number, or a container port's name)."""
    sp = next((p for p in service.spec.ports or [] if p.port == port), None)
    if sp is None:
        raise KubeAccessError(f"Service {service.metadata.name} has no port {port}")
    target = sp.target_port if sp.target_port is not None else port
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    for c in pod.spec.containers:
        for cp in c.ports or []:
            if cp.name == target:
                return int(cp.container_port)
    raise KubeAccessError(f"pod {pod.metadata.name} has no port named {target}")


def ready(pod: Any) -> bool:
    if pod.metadata.deletion_timestamp is not None or pod.status is None:
        return False
    conditions = pod.status.conditions or []
    is_ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    return bool(pod.status.phase == "Running" and is_ready)


# --- the API ---------------------------------------------------------------------------------


def context_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """kubectl's namespace when none is given: the namespace of ``context`` (else of the
    current context) in the kubeconfig (``kubeconfig``, else ``KUBECONFIG``, whose files are
    read in order, else ``~/.kube/config``), else ``default``. Reads the files only: no
    client, no connection."""
    import yaml

    listed = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    configs = []
    for path in listed.split(os.pathsep):
        try:
            loaded = yaml.safe_load(Path(path).expanduser().read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(loaded, dict):
            configs.append(loaded)
    current = context or next(
        (c.get("current-context") for c in configs if c.get("current-context")), None
    )
    for config in configs:
        for entry in config.get("contexts") or ():
            if isinstance(entry, dict) and entry.get("name") == current:
                namespace = (entry.get("context") or {}).get("namespace")
                return str(namespace) if namespace else "default"
    return "default"


def api_client(target: KubeTarget) -> tuple[Any, str | None]:
    """An ApiClient for the kubeconfig and context, and the context's namespace."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    path = target.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    try:
        contexts, active = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
        chosen = next((c for c in contexts if c["name"] == target.context), None)
        if target.context and chosen is None:
            raise KubeAccessError(f"no context {target.context!r} in {path}")
        namespace = ((chosen or active or {}).get("context") or {}).get("namespace")
        api = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=path, context=target.context
        )
    except (ConfigException, OSError) as exc:
        raise KubeAccessError(f"kubeconfig {path}: {exc}") from exc
    return api, namespace


def _call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    from kubernetes.client.exceptions import ApiException

    try:
        return fn(*args, **kwargs)
    except ApiException as exc:
        raise KubeAccessError(f"{what}: {exc.status} {exc.reason}") from exc
    except OSError as exc:  # urllib3's connection errors are OSErrors too
        raise KubeAccessError(f"{what}: the API server cannot be reached ({exc})") from exc


def find_release(api: Any, target: KubeTarget, context_namespace: str | None) -> Release:
    """The release's namespace, name and NATS access (from its services' Deployments)."""
    from kubernetes import client

    apps = client.AppsV1Api(api)
    selector = PART_OF + (f",{INSTANCE}={target.release}" if target.release else "")
    looked = release_namespaces(target, context_namespace)
    for namespace in looked:
        found = _call(
            f"list Deployments in {namespace}",
            apps.list_namespaced_deployment,
            namespace,
            label_selector=selector,
        ).items
        by_release: dict[str, list[Any]] = {}
        for d in found:
            by_release.setdefault(d.metadata.labels.get(INSTANCE, ""), []).append(d)
        if not by_release:
            continue
        if len(by_release) > 1:
            names = ", ".join(sorted(by_release))
            raise KubeAccessError(
                f"releases {names} in namespace {namespace}: pick one with --release"
            )
        ((name, deployments),) = by_release.items()
        rank = {c: i for i, c in enumerate(SERVICES)}
        deployments.sort(key=lambda d: rank.get(d.metadata.labels.get(COMPONENT), len(rank)))
        spec = api.sanitize_for_serialization(deployments[0].spec.template.spec)
        return Release(namespace, name, nats_access_from_pod_spec(spec))
    which = f"release {target.release}" if target.release else "release"
    raise KubeAccessError(
        f"no fracpilot {which} in namespace {' or '.join(looked)} (Deployments labelled "
        f"{selector}); say where with --release-namespace"
    )


def clients_config(api: Any, release: Release) -> dict[str, str] | None:
    """The release's ``nats-clients`` ConfigMap data (helm/fracpilot/templates/
    nats-secrets.yaml), or None when it has none."""
    from kubernetes import client

    selector = f"{PART_OF},{INSTANCE}={release.name},{COMPONENT}={CLIENTS_COMPONENT}"
    found = _call(
        f"list ConfigMaps in {release.namespace}",
        client.CoreV1Api(api).list_namespaced_config_map,
        release.namespace,
        label_selector=selector,
    ).items
    return dict(found[0].data or {}) if found else None


def read_secrets(api: Any, namespace: str, access: NatsAccess) -> dict[str, bytes]:
    """Each secret-held setting's value, read from its Secret."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    cache: dict[str, dict[str, str]] = {}
    out: dict[str, bytes] = {}
    for setting, ref in access.secrets.items():
        if ref.secret not in cache:
            secret = _call(
                f"read Secret {namespace}/{ref.secret} (this identity's credentials)",
                core.read_namespaced_secret,
                ref.secret,
                namespace,
            )
            cache[ref.secret] = secret.data or {}
        data = cache[ref.secret]
        if ref.key not in data:
            raise KubeAccessError(f"Secret {namespace}/{ref.secret} has no key {ref.key!r}")
        out[setting] = base64.b64decode(data[ref.key])
    return out


def ready_pod(api: Any, name: str, namespace: str, port: int) -> tuple[str, int]:
    """A ready pod behind Service ``name`` and the pod port its ``port`` goes to."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    service = _call(
        f"read Service {namespace}/{name}", core.read_namespaced_service, name, namespace
    )
    selector = ",".join(f"{k}={v}" for k, v in sorted((service.spec.selector or {}).items()))
    if not selector:
        raise KubeAccessError(f"Service {namespace}/{name} selects no pods")
    pods = _call(
        f"list pods of Service {namespace}/{name}",
        core.list_namespaced_pod,
        namespace,
        label_selector=selector,
    ).items
    for pod in sorted(pods, key=lambda p: p.metadata.name):
        if ready(pod):
            return pod.metadata.name, target_port(service, port, pod)
    raise KubeAccessError(f"no ready pod behind Service {namespace}/{name} ({selector})")


def pod_connector(api: Any, namespace: str, pod: str, port: int) -> Connector:
    """Opens one port-forward stream to ``pod``:``port`` per call, as ``kubectl port-forward``
    does per connection (through the API server's pods/portforward, websocket channels)."""
    from kubernetes import client
    from kubernetes.stream import portforward

    core = client.CoreV1Api(api)

    def connect() -> Stream:
        forward = portforward(
            core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(port)
        )
        stream: Stream = forward.socket(port)
        return stream

    return connect


# --- all together ----------------------------------------------------------------------------


@dataclass
class Opened:
    """What a command connects with, while :func:`open_release_nats` is open."""

    release: Release
    nats: dict[str, Any]  # NatsSettings fields to override: url and the whole identity
    forwarded_to: str | None = None  # "<namespace>/<pod>:<port>" when a port is forwarded
    forwarder: Forwarder | None = None


@contextlib.contextmanager
def open_release_nats(
    target: KubeTarget,
    connector_for: Callable[[Any, str, str, int], Connector] | None = None,
    identity: str = OPERATOR,
) -> Iterator[Opened]:
    """Find the release, read ``identity``'s credentials (:func:`with_identity`) and (for an
    in-cluster Service) forward a local port to its NATS, for as long as the block runs.
    ``connector_for`` makes the stream opener (default :func:`pod_connector`, looked up when
    called)."""
    api, context_namespace = api_client(target)
    with contextlib.closing(api), tempfile.TemporaryDirectory(prefix="fracpilot-") as tmp:
        found = find_release(api, target, context_namespace)
        access = with_identity(found.access, clients_config(api, found), identity)
        release = Release(found.namespace, found.name, access)
        values = read_secrets(api, release.namespace, release.access)
        nats: dict[str, Any] = dict.fromkeys(IDENTITY)
        nats.update(release.access.values)
        for setting, raw in values.items():
            if setting in ("user", "password"):
                nats[setting] = raw.decode()
            else:  # a file setting: the content goes to a private file
                path = Path(tmp) / setting
                path.touch(mode=0o600)
                path.write_bytes(raw)
                nats[setting] = str(path)
        service = service_of_url(release.access.url, release.namespace)
        if service is None:
            nats["url"] = release.access.url
            yield Opened(release, nats)
            return
        name, namespace, port = service
        pod, pod_port = ready_pod(api, name, namespace, port)
        connect = (connector_for or pod_connector)(api, namespace, pod, pod_port)
        with Forwarder(connect) as forwarder:
            nats["url"] = forwarder.url
            yield Opened(release, nats, f"{namespace}/{pod}:{pod_port}", forwarder)
