"""The admission webhook for real: TLS, HTTP, a NATS-fed target cache, and a kube-apiserver
that calls it while storing pods.

The webhook server runs in the test's event loop on a free loopback port with a certificate
for 127.0.0.1 from a test CA; the kube-apiserver (same machine) reaches it through a
MutatingWebhookConfiguration with ``clientConfig.url`` and that CA as ``caBundle``. Every
blocking Kubernetes call runs in a thread, or the apiserver's call back into this loop would
wait forever. Each configuration is limited to the test's own namespace, since the control
plane is shared by the whole session, and deleted at the end.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from fracpilot_actuator.admission import (
    GPU,
    HAMI_CORES,
    HAMI_MEMORY,
    KAI_CONTAINER,
    KAI_FRACTION,
    OPT_OUT,
    TARGET_ANNOTATION,
    webhook_configuration,
)
from fracpilot_actuator.settings import WebhookSettings
from fracpilot_actuator.stores.targets import TargetCache
from fracpilot_actuator.webhook import WebhookServer, start_webhook
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import GpuSharing, WorkloadRef, WorkloadTarget
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.kv import KvBucket
from helpers import reset_nats
from helpers import wait_for as until
from k8s_control_plane import _issue, _Issued, _write_cert, _write_key, wait_for
from support.admission_reviews import chat_pod_review
from support.kube import label_namespace

pytestmark = pytest.mark.integration

CLUSTER = "test"
HASH = "6b7f9c5d8"


# --- TLS ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tls:
    cert: Path
    key: Path
    ca_pem: bytes
    ca_file: Path


def issue_serving(directory: Path, name: str = "webhook") -> Tls:
    """A fresh CA and a serving certificate for 127.0.0.1 signed by it, as files."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _issue(f"fracpilot-test-{name}-ca")
    serving: _Issued = _issue(
        "fracpilot-webhook", issuer=ca, server=True, sans=("127.0.0.1", "localhost")
    )
    tls = Tls(
        cert=directory / f"{name}.crt",
        key=directory / f"{name}.key",
        ca_pem=ca.cert.public_bytes(serialization.Encoding.PEM),
        ca_file=directory / f"{name}-ca.crt",
    )
    _write_cert(tls.cert, serving.cert)
    _write_key(tls.key, serving.key)
    _write_cert(tls.ca_file, ca.cert)
    return tls


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return issue_serving(tmp_path_factory.mktemp("webhook-tls"))


# --- targets --------------------------------------------------------------------------------------


def workload(name: str, namespace: str) -> WorkloadRef:
    return WorkloadRef(
        cluster=CLUSTER, namespace=namespace, owner_kind="Deployment", owner_name=name
    )


def target(
    wl: WorkloadRef,
    fraction: float,
    decision_id: str,
    backend: GpuSharing = GpuSharing.KAI,
    memory_mib: int = 0,
) -> WorkloadTarget:
    return WorkloadTarget(
        workload=wl,
        fraction=fraction,
        memory_mib=memory_mib,
        backend=backend,
        decision_id=decision_id,
        updated_at=datetime.now(UTC),
    )


async def put(kv: KvBucket, value: WorkloadTarget) -> None:
    await kv.put(subjects.kv_key(value.workload), value.to_json())


@dataclass
class Webhook:
    server: WebhookServer
    cache: TargetCache
    kv: KvBucket
    registry: CollectorRegistry

    def count(self, outcome: str) -> float:
        value = self.registry.get_sample_value(
            "fracpilot_webhook_admissions_total", {"outcome": outcome}
        )
        return value or 0.0

    async def holds(self, wl: WorkloadRef, decision_id: str | None) -> None:
        """Wait until the cache holds the target of that decision (None: no target)."""

        def current() -> str | None:
            held = self.cache.for_workload(wl)
            return held.decision_id if held else None

        await until(lambda: current() == decision_id, timeout=10)


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    await reset_nats(nats_url)
    bus = Bus("actuator", ServiceSettings(nats={"url": nats_url}), CollectorRegistry())
    await bus.connect(retry_for_s=10)
    try:
        yield bus
    finally:
        await bus.close()


@pytest.fixture
async def webhook(bus: Bus, tls: Tls) -> AsyncIterator[Webhook]:
    """The webhook as the actuator runs it, on a free loopback port, its targets from NATS."""
    registry = CollectorRegistry()
    kv = await bus.kv(subjects.TARGET_BUCKET)
    server, cache = await start_webhook(
        bus,
        registry,
        WebhookSettings(
            enabled=True, cert_file=str(tls.cert), key_file=str(tls.key), host="127.0.0.1", port=0
        ),
        cluster=CLUSTER,
    )
    assert await cache.wait_synced(10)
    try:
        yield Webhook(server, cache, kv, registry)
    finally:
        await server.stop()


# --- the kube-apiserver calls the webhook ---------------------------------------------------------


def create_deployment(apps: client.AppsV1Api, namespace: str, name: str) -> dict[str, Any]:
    """A Deployment and its ReplicaSet ``<name>-<HASH>`` (no controller makes them here);
    returns the owner reference its pods carry."""
    labels = {"app": name}
    template = {
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "server", "image": "registry.invalid/x:1"}]},
    }
    deployment = apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels}, "template": template},
        },
    )
    rs_labels = labels | {"pod-template-hash": HASH}
    replica_set = apps.create_namespaced_replica_set(
        namespace,
        {
            "metadata": {
                "name": f"{name}-{HASH}",
                "labels": rs_labels,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": name,
                        "uid": deployment.metadata.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "selector": {"matchLabels": rs_labels},
                "template": template | {"metadata": {"labels": rs_labels}},
            },
        },
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": replica_set.metadata.name,
        "uid": replica_set.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def rs_pod(
    deployment: str,
    owner: dict[str, Any],
    *,
    annotations: dict[str, str] | None = None,
    limits: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    scheduler: str | None = "kai-scheduler",
) -> dict[str, Any]:
    """A pod as the ReplicaSet controller would create it: generateName, owner, hash label."""
    resources: dict[str, Any] = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    spec: dict[str, Any] = {
        "containers": [
            {"name": "proxy", "image": "registry.invalid/envoy:1"},
            {"name": "server", "image": "registry.invalid/vllm:1", "resources": resources},
        ]
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "metadata": {
            "generateName": f"{deployment}-{HASH}-",
            "labels": {"app": deployment, "pod-template-hash": HASH},
            "annotations": dict(annotations or {}),
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


@contextlib.contextmanager
def registered(
    admission: client.AdmissionregistrationV1Api,
    tls: Tls,
    url: str,
    namespace: str,
    *,
    opt_in: bool = True,
) -> Iterator[str]:
    """The MutatingWebhookConfiguration, limited to ``namespace``; deleted afterwards.

    ``opt_in``: label the namespace fracpilot.io/mode=auto first (the default is recommend-only:
    without it, only pods labelled so are sent)."""
    if opt_in:
        core = client.CoreV1Api(admission.api_client)
        label_namespace(core, namespace, {"fracpilot.io/mode": "auto"})
    config = webhook_configuration(
        ca_bundle=tls.ca_pem, url=url, name=f"fracpilot-targets-{namespace}"
    )
    for hook in config["webhooks"]:  # both of the opt-in rule's webhooks
        hook["namespaceSelector"]["matchLabels"] = {"kubernetes.io/metadata.name": namespace}
    admission.create_mutating_webhook_configuration(config)
    try:
        yield config["metadata"]["name"]
    finally:
        with contextlib.suppress(ApiException):
            admission.delete_mutating_webhook_configuration(config["metadata"]["name"])


def wait_until_called(core: client.CoreV1Api, namespace: str, probe: dict[str, Any]) -> None:
    """The apiserver picks a new configuration up from an informer: dry-run a pod until it
    comes back mutated (dry-run calls webhooks with sideEffects None; nothing is stored)."""

    def mutated() -> bool | None:
        pod = core.create_namespaced_pod(namespace, probe, dry_run="All")
        return True if TARGET_ANNOTATION in (pod.metadata.annotations or {}) else None

    wait_for(mutated, timeout=30, what="the apiserver to call the webhook")


def created(core: client.CoreV1Api, namespace: str, body: dict[str, Any]) -> client.V1Pod:
    """Create the pod, and read it back as stored."""
    pod = core.create_namespaced_pod(namespace, body)
    return core.read_namespaced_pod(pod.metadata.name, namespace)


def limits_of(pod: client.V1Pod, container: str = "server") -> dict[str, str]:
    (match,) = [c for c in pod.spec.containers if c.name == container]
    return dict(match.resources.limits or {})


async def test_apiserver_stores_new_pods_with_their_workloads_targets(
    kube_admin: client.ApiClient, kube_namespace: str, webhook: Webhook, tls: Tls
) -> None:
    ns = kube_namespace
    core, apps = client.CoreV1Api(kube_admin), client.AppsV1Api(kube_admin)
    admission = client.AdmissionregistrationV1Api(kube_admin)
    chat, embed = workload("chat", ns), workload("embed", ns)
    owners = {
        name: await asyncio.to_thread(create_deployment, apps, ns, name)
        for name in ("chat", "embed", "other")
    }
    await put(webhook.kv, target(chat, 0.375, "d-chat-1"))
    await put(webhook.kv, target(embed, 0.25, "d-embed-1", GpuSharing.HAMI, memory_mib=20480))
    await webhook.holds(chat, "d-chat-1")
    await webhook.holds(embed, "d-embed-1")

    def kai(deployment: str, **annotations: str) -> dict[str, Any]:
        """A KAI fractional pod whose GPU container is not the first one."""
        annotations = {KAI_FRACTION: "0.5", KAI_CONTAINER: "server", **annotations}
        return rs_pod(deployment, owners[deployment], annotations=annotations)

    with registered(admission, tls, webhook.server.url, ns):
        await asyncio.to_thread(wait_until_called, core, ns, kai("chat"))
        patched_before = webhook.count("patched")

        # KAI: the gpu-fraction annotation, as KAI writes it.
        pod = await asyncio.to_thread(created, core, ns, kai("chat", team="nlp/chat"))
        assert pod.metadata.annotations == {
            KAI_FRACTION: "0.375",
            KAI_CONTAINER: "server",
            TARGET_ANNOTATION: "d-chat-1",
            "team": "nlp/chat",
        }

        # HAMi: the GPU container's limits, requests kept equal (the apiserver checks it).
        hami = rs_pod(
            "embed",
            owners["embed"],
            limits={GPU: "1", HAMI_MEMORY: "4000", HAMI_CORES: "30"},
            requests={HAMI_MEMORY: "4000"},
            scheduler="hami-scheduler",
        )
        pod = await asyncio.to_thread(created, core, ns, hami)
        assert limits_of(pod) == {GPU: "1", HAMI_MEMORY: "20480", HAMI_CORES: "25"}
        server = next(c for c in pod.spec.containers if c.name == "server")
        assert server.resources.requests == {HAMI_MEMORY: "20480", GPU: "1", HAMI_CORES: "25"}
        assert pod.metadata.annotations == {TARGET_ANNOTATION: "d-embed-1"}
        assert limits_of(pod, "proxy") == {}

        # No target, or opted out: stored as sent.
        pod = await asyncio.to_thread(created, core, ns, kai("other"))
        assert pod.metadata.annotations == {KAI_FRACTION: "0.5", KAI_CONTAINER: "server"}
        pod = await asyncio.to_thread(created, core, ns, kai("chat", **{OPT_OUT: "true"}))
        assert pod.metadata.annotations == {
            KAI_FRACTION: "0.5",
            KAI_CONTAINER: "server",
            OPT_OUT: "true",
        }

        # A new target reaches the next pod: a whole GPU is a limit, not gpu-fraction "1".
        await put(webhook.kv, target(chat, 1.0, "d-chat-2"))
        await webhook.holds(chat, "d-chat-2")
        pod = await asyncio.to_thread(created, core, ns, kai("chat"))
        assert pod.metadata.annotations == {KAI_CONTAINER: "server", TARGET_ANNOTATION: "d-chat-2"}
        assert limits_of(pod) == {GPU: "1"}  # in the container KAI's annotation named
        assert limits_of(pod, "proxy") == {}

        # The target deleted: pods are left as the template made them.
        await webhook.kv.delete(subjects.kv_key(chat))
        await webhook.holds(chat, None)
        pod = await asyncio.to_thread(created, core, ns, kai("chat"))
        assert pod.metadata.annotations == {KAI_FRACTION: "0.5", KAI_CONTAINER: "server"}

    assert webhook.count("patched") - patched_before == 3
    assert webhook.count("no_target") == 2
    assert webhook.count("opted_out") == 1
    assert webhook.count("error") == 0
    latency = webhook.registry.get_sample_value("fracpilot_webhook_admission_seconds_count")
    assert latency is not None
    assert latency >= 6


async def test_pods_are_created_unchanged_when_the_webhook_is_down(
    kube_admin: client.ApiClient, kube_namespace: str, webhook: Webhook, tls: Tls
) -> None:
    ns = kube_namespace
    core, apps = client.CoreV1Api(kube_admin), client.AppsV1Api(kube_admin)
    admission = client.AdmissionregistrationV1Api(kube_admin)
    owner = await asyncio.to_thread(create_deployment, apps, ns, "chat")
    await put(webhook.kv, target(workload("chat", ns), 0.25, "d-1"))
    await webhook.holds(workload("chat", ns), "d-1")
    body = rs_pod("chat", owner, annotations={KAI_FRACTION: "0.5"})

    with registered(admission, tls, webhook.server.url, ns):
        await asyncio.to_thread(wait_until_called, core, ns, body)
        await webhook.server.stop()  # failurePolicy Ignore: the pod is admitted as sent

        started = time.monotonic()
        pod = await asyncio.to_thread(created, core, ns, body)
        elapsed = time.monotonic() - started
    assert pod.metadata.annotations == {KAI_FRACTION: "0.5"}
    assert elapsed < 5, f"a refused connection should not wait for the timeout ({elapsed:.1f}s)"


# --- the HTTPS server on its own ------------------------------------------------------------------


def https(tls: Tls, port: int) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=str(tls.ca_file))
    return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)


def admission_review(uid: str) -> bytes:
    return json.dumps(chat_pod_review(uid)).encode()


def call(
    conn: http.client.HTTPSConnection,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    **kwargs: Any,
) -> tuple[int, bytes, dict[str, str]]:
    conn.request(method, path, body=body, headers=headers or {}, **kwargs)
    response = conn.getresponse()
    return response.status, response.read(), dict(response.getheaders())


@dataclass
class Served:
    server: WebhookServer
    registry: CollectorRegistry
    ready: bool = False

    @property
    def port(self) -> int:
        return self.server.port

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def served(tls: Tls) -> AsyncIterator[Served]:
    """A webhook server holding one target (Deployment chat in inference: 0.375, KAI)."""
    chat = workload("chat", "inference")
    registry = CollectorRegistry()
    served = Served(server=None, registry=registry)  # type: ignore[arg-type]
    served.server = WebhookServer(
        {subjects.kv_key(chat): target(chat, 0.375, "d-7")},
        registry,
        cert_file=tls.cert,
        key_file=tls.key,
        cluster=CLUSTER,
        ready=lambda: served.ready,
    )
    await served.server.start("127.0.0.1", 0)
    try:
        yield served
    finally:
        await served.server.stop()


async def test_mutate_answers_over_a_kept_alive_connection(served: Served, tls: Tls) -> None:
    def exchange() -> list[tuple[int, bytes, dict[str, str]]]:
        conn = https(tls, served.port)
        try:
            # The apiserver appends ?timeout=5s; one connection carries several reviews.
            results = [
                call(
                    conn,
                    "POST",
                    "/mutate?timeout=5s",
                    admission_review(f"u-{i}"),
                    {"Content-Type": "application/json"},
                )
                for i in range(3)
            ]
            sock = conn.sock
            results.append(
                call(
                    conn,
                    "POST",
                    "/mutate",
                    iter([admission_review("u-chunked")]),
                    {"Content-Type": "application/json"},
                    encode_chunked=True,
                )
            )
            assert conn.sock is sock, "the connection was not kept alive"
            return results
        finally:
            conn.close()

    results = await asyncio.to_thread(exchange)
    for i, (status, body, headers) in enumerate(results):
        assert status == 200
        assert headers["Content-Type"] == "application/json"
        answer = json.loads(body)["response"]
        assert answer["uid"] == (f"u-{i}" if i < 3 else "u-chunked")
        assert answer["allowed"] is True
        ops = json.loads(base64.b64decode(answer["patch"]))
        assert {
            "op": "replace",
            "path": "/metadata/annotations/gpu-fraction",
            "value": "0.375",
        } in ops
    assert served.value("fracpilot_webhook_admissions_total", outcome="patched") == 4
    assert served.value("fracpilot_webhook_admission_seconds_count") == 4
    assert served.value("fracpilot_webhook_targets") == 1


async def test_a_vllm_pod_gets_its_memory_flag_for_its_fraction_and_is_counted(
    served: Served, tls: Tls
) -> None:
    """The served webhook rewrites vLLM's --gpu-memory-utilization for the 0.375 it writes, says
    so in the review's warnings (kubectl shows them) and counts it."""
    review = chat_pod_review("u-vllm")
    container = review["request"]["object"]["spec"]["containers"][0]
    container.update(
        image="vllm/vllm-openai:v0.9.0",
        args=["--model", "m", "--gpu-memory-utilization", "0.9"],
    )

    def exchange() -> tuple[int, bytes, dict[str, str]]:
        conn = https(tls, served.port)
        try:
            body = json.dumps(review).encode()
            return call(conn, "POST", "/mutate", body, {"Content-Type": "application/json"})
        finally:
            conn.close()

    status, body, _ = await asyncio.to_thread(exchange)
    assert status == 200
    answer = json.loads(body)["response"]
    ops = json.loads(base64.b64decode(answer["patch"]))
    args = next(op["value"] for op in ops if op["path"].endswith("/args"))
    value = float(args[args.index("--gpu-memory-utilization") + 1])
    assert 0.3 < value < 0.375  # the fraction less vLLM's margin, never more than the share
    assert any("0.9" in w for w in answer.get("warnings", [])), answer
    assert (
        served.value("fracpilot_webhook_llm_server_flags_total", server="vllm", result="rewritten")
        == 1
    )


async def test_malformed_reviews_get_400_with_the_reason(served: Served, tls: Tls) -> None:
    def exchange() -> list[tuple[int, bytes, dict[str, str]]]:
        conn = https(tls, served.port)
        try:
            json_type = {"Content-Type": "application/json"}
            return [
                call(conn, "POST", "/mutate", b"{not json", json_type),
                call(
                    conn,
                    "POST",
                    "/mutate",
                    json.dumps({"apiVersion": "v1", "kind": "Pod"}),
                    json_type,
                ),
            ]
        finally:
            conn.close()

    (status, body, _), (status2, body2, _) = await asyncio.to_thread(exchange)
    assert (status, status2) == (400, 400)
    assert body.startswith(b"malformed AdmissionReview: body is not JSON")
    assert b"expected apiVersion admission.k8s.io/v1 kind AdmissionReview" in body2
    assert served.value("fracpilot_webhook_malformed_requests_total") == 2
    assert served.value("fracpilot_webhook_admissions_total", outcome="error") == 2
    assert served.value("fracpilot_webhook_admissions_total", outcome="patched") == 0


async def test_health_readiness_and_unknown_paths(served: Served, tls: Tls) -> None:
    def exchange() -> list[tuple[int, bytes]]:
        conn = https(tls, served.port)
        try:
            out = []
            for method, path in [
                ("GET", "/healthz"),
                ("GET", "/readyz"),
                ("GET", "/mutate"),
                ("GET", "/metrics"),
                ("DELETE", "/healthz"),
            ]:
                status, body, _ = call(conn, method, path)
                out.append((status, body))
            served.ready = True
            status, body, _ = call(conn, "GET", "/readyz")
            out.append((status, body))
            return out
        finally:
            conn.close()

    assert await asyncio.to_thread(exchange) == [
        (200, b"ok\n"),
        (503, b"targets not loaded yet\n"),
        (405, b"POST an AdmissionReview\n"),
        (404, b"not found\n"),
        (405, b"GET only\n"),
        (200, b"ok\n"),
    ]


async def test_oversized_and_garbled_requests_are_refused(tls: Tls) -> None:
    registry = CollectorRegistry()
    server = WebhookServer({}, registry, cert_file=tls.cert, key_file=tls.key, max_body_bytes=100)
    await server.start("127.0.0.1", 0)

    def exchange() -> tuple[list[tuple[int, bytes]], bytes]:
        conn = https(tls, server.port)  # each refusal closes it; http.client opens another
        try:
            json_type = {"Content-Type": "application/json"}
            refused = [
                call(conn, "POST", "/mutate", b"x" * 101, json_type)[:2],
                call(conn, "POST", "/mutate", b"{}", {"Content-Type": "text/plain"})[:2],
                call(conn, "POST", "/mutate", b"{}", {**json_type, "Content-Encoding": "gzip"})[:2],
            ]
        finally:
            conn.close()
        context = ssl.create_default_context(cafile=str(tls.ca_file))
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
        ):
            sock.sendall(b"NONSENSE\r\n\r\n")
            reply = sock.recv(1000)
        return refused, reply

    try:
        refused, reply = await asyncio.to_thread(exchange)
    finally:
        await server.stop()
    assert refused == [
        (413, b"body over 100 bytes\n"),
        (415, b"an AdmissionReview is application/json, not 'text/plain'\n"),
        (400, b"unreadable body: 'Can not decode content-encoding: gzip'\n"),
    ]
    status_line = reply.split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.")
    assert status_line.endswith(b" 400 Bad Request")
    assert b"Invalid method" in reply  # the reason, from aiohttp's parser
    assert registry.get_sample_value("fracpilot_webhook_malformed_requests_total") == 3


async def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    first = issue_serving(tmp_path / "a", "first")
    server = WebhookServer(
        {}, CollectorRegistry(), cert_file=first.cert, key_file=first.key, tls_reload_interval_s=0
    )
    await server.start("127.0.0.1", 0)

    def healthz(trust: Tls) -> int:
        conn = https(trust, server.port)
        try:
            return call(conn, "GET", "/healthz")[0]
        finally:
            conn.close()

    try:
        assert await asyncio.to_thread(healthz, first) == 200
        assert server.reload_tls() is False  # nothing changed

        # cert-manager renews: a new key and certificate (here from another CA) in place.
        second = issue_serving(tmp_path / "b", "second")
        first.cert.write_bytes(second.cert.read_bytes())
        first.key.write_bytes(second.key.read_bytes())
        assert server.reload_tls() is True
        assert await asyncio.to_thread(healthz, second) == 200
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncio.to_thread(healthz, first)

        # A half-written pair does not load: the last good one is kept.
        first.key.write_bytes(b"garbage")
        assert server.reload_tls() is False
        assert await asyncio.to_thread(healthz, second) == 200
    finally:
        await server.stop()


# --- the target cache -----------------------------------------------------------------------------


async def test_target_cache_follows_the_bucket(bus: Bus) -> None:
    kv = await bus.kv(subjects.TARGET_BUCKET)
    chat, embed = workload("chat", "inference"), workload("embed", "inference")
    await put(kv, target(chat, 0.5, "d-1"))
    cache = TargetCache()
    await cache.start(bus)
    assert await cache.wait_synced(10)
    assert cache.synced
    held = cache.for_workload(chat)
    assert held is not None
    assert (held.fraction, held.decision_id) == (0.5, "d-1")

    await put(kv, target(chat, 0.25, "d-2"))
    await put(kv, target(embed, 0.75, "d-3"))
    # A target under another workload's key would be applied to the wrong pods: refused.
    await kv.put(
        subjects.kv_key(workload("rogue", "inference")), target(embed, 1.0, "d-x").to_json()
    )
    await until(lambda: len(cache) == 2 and cache[subjects.kv_key(chat)].decision_id == "d-2")
    assert cache.for_workload(embed) is not None
    await kv.delete(subjects.kv_key(chat))
    await until(lambda: cache.for_workload(chat) is None)
    assert set(cache) == {subjects.kv_key(embed)}


# --- the opt-in rule, as the apiserver applies the selectors -------------------------------------


async def test_only_opted_in_pods_are_sent_and_sized(
    kube_admin: client.ApiClient, kube_namespace: str, webhook: Webhook, tls: Tls
) -> None:
    """Recommend-only by default: the apiserver sends the webhook only pods of a namespace
    labelled fracpilot.io/mode=auto (unless the pod says recommend or off) and pods labelled
    auto themselves; labelling the namespace later, or removing the label, changes that."""
    ns = kube_namespace
    core, apps = client.CoreV1Api(kube_admin), client.AppsV1Api(kube_admin)
    admission = client.AdmissionregistrationV1Api(kube_admin)
    owner = await asyncio.to_thread(create_deployment, apps, ns, "chat")
    await put(webhook.kv, target(workload("chat", ns), 0.25, "d-1"))
    await webhook.holds(workload("chat", ns), "d-1")

    def pod(mode: str | None = None) -> dict[str, Any]:
        body = rs_pod("chat", owner, annotations={KAI_FRACTION: "0.5"})
        if mode is not None:
            body["metadata"]["labels"]["fracpilot.io/mode"] = mode
        return body

    def sized(body: dict[str, Any]) -> bool:
        made = core.create_namespaced_pod(ns, body, dry_run="All")  # webhooks run, nothing kept
        return (made.metadata.annotations or {}).get(KAI_FRACTION) == "0.25"

    def becomes(body: dict[str, Any], expected: bool) -> None:
        """The apiserver sees namespace label changes through its informer: wait for it."""
        wait_for(lambda: True if sized(body) is expected else None, timeout=30, what="labels")

    with registered(admission, tls, webhook.server.url, ns, opt_in=False):
        # A pod labelled auto opts itself in (this also waits for the configuration to load).
        await asyncio.to_thread(becomes, pod("auto"), True)
        sent = sum(webhook.count(o) for o in ("patched", "unchanged", "no_target", "not_opted_in"))
        for mode in (None, "recommend", "off", "Auto"):  # not opted in: never sent
            assert not await asyncio.to_thread(sized, pod(mode)), mode
        now = sum(webhook.count(o) for o in ("patched", "unchanged", "no_target", "not_opted_in"))
        assert now == sent, "the apiserver sent pods that are not opted in"

        label_namespace(core, ns, {"fracpilot.io/mode": "auto"})
        await asyncio.to_thread(becomes, pod(), True)
        assert not await asyncio.to_thread(sized, pod("recommend"))  # the pod's label wins
        assert not await asyncio.to_thread(sized, pod("off"))
        assert await asyncio.to_thread(sized, pod("auto"))

        label_namespace(core, ns, {"fracpilot.io/mode": None})  # back to recommendations
        await asyncio.to_thread(becomes, pod(), False)
        assert await asyncio.to_thread(sized, pod("auto"))
