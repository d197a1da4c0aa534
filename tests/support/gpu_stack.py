"""The real GPU scheduling stack on loopback, next to a test ControlPlane (kube-apiserver + etcd).

kwok fakes the nodes and the pod lifecycle; everything else is the real upstream binary, built
by ``scripts/gpu-stack-testbin.sh`` into a per-machine cache: KAI-Scheduler (scheduler, binder,
podgrouper, admission webhook, nodescaleadjuster: always, as in a production install),
kube-scheduler (KAI's scaling pods use the default scheduler), kube-controller-manager (lifts
the not-ready taint, collects pods of deleted nodes) and, on demand, cluster-autoscaler with its
kwok provider (:meth:`GpuStack.start_autoscaler`) and KAI's podgroupcontroller and
queuecontroller, which fill Queue status (:meth:`GpuStack.start_queue_controllers`).
How each is run comes from ``../shared/reference/real-gpu-scheduler.md`` and the flags in the
upstream sources named below.

Give the stack a control plane of its own: kube-controller-manager makes the controllers act
(Deployments get pods, namespaces terminate, PDBs get status) where other tests expect none.
Every component is its own process group, stopped with SIGTERM then SIGKILL; logs go to
``<workdir>/<component>.log`` (``FRACPILOT_K8S_KEEP=1`` keeps the directory).
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import ipaddress
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client, dynamic

from fracpilot_libs.server_process import ServerProcess, free_port, wait_for, wait_until_ready
from k8s_control_plane import ControlPlane

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "gpu-stack-testbin.sh"
RECIPE_DIR = REPO_ROOT / "scripts" / "gpu-stack"

KAI_SCHEDULER = "kai-scheduler"  # constants.DefaultSchedulerName (KAI pkg/common/constants)
QUEUE_LABEL = "kai.scheduler/queue"  # constants.DefaultQueueLabel
DEFAULT_QUEUE = "default-queue"  # the leaf queue of scripts/gpu-stack/manifests/kai-setup.yaml
GPU_FRACTION = "gpu-fraction"  # pod annotation (constants.GpuFraction)
GPU_GROUP = "runai-gpu-group"  # label KAI puts on a fraction pod and its reservation pod
RESERVATION_NS = "kai-resource-reservation"  # the binder's --resource-reservation-namespace
RESERVATION_APP = "kai-resource-reservation"  # the binder's --resource-reservation-app-label
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
GPU_PORTION = "GPU_PORTION"
CRD_API = "apiextensions.k8s.io/v1"  # ConfigMap key (KAI pkg/binder/common/constants.go)


class GpuStackError(RuntimeError):
    """The binaries could not be built or a component did not start."""


class GoMissingError(GpuStackError):
    """The binaries are not built and there is no Go to build them."""


def ensure_gpu_stack_testbin(*, output: IO[str] | None = None) -> Path:
    """The bin directory, built by ``scripts/gpu-stack-testbin.sh`` when not yet complete.

    The script is idempotent (well under a second when the cache is complete), so it is always
    run: it alone knows the pinned versions. Its progress goes to ``output`` (default stderr).
    """
    stream = output or sys.stderr
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if proc.stderr:
        stream.write(proc.stderr)
    if proc.returncode != 0:
        if shutil.which("go") is None:
            raise GoMissingError(
                "the GPU stack binaries (kwok, KAI-Scheduler, cluster-autoscaler, kube-scheduler,"
                " kube-controller-manager) are not built and building them needs Go >= 1.24.4"
                " (https://go.dev/dl/); then run `make gpu-stack-testbin`"
            )
        raise GpuStackError(f"{BUILD_SCRIPT} failed with exit code {proc.returncode}")
    return Path(proc.stdout.strip().splitlines()[-1])


# --- serving certificate for KAI's admission webhook ---------------------------------------------


@dataclass(frozen=True)
class ServingCert:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def issue_loopback_serving_cert(now: dt.datetime) -> ServingCert:
    """A CA and a serving certificate for 127.0.0.1 / localhost signed by it (a day long).

    Like fracpilot_actuator.admission.certificates.issue_serving_bundle, but with an IP SAN:
    the apiserver calls the webhook at https://127.0.0.1:<port>.
    """
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fracpilot-gpu-stack-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return ServingCert(
        ca_pem=ca.public_bytes(pem),
        cert_pem=cert.public_bytes(pem),
        key_pem=key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )


# --- processes -----------------------------------------------------------------------------------


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool | None:
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as resp:
            return True if resp.status == 200 else None
    except (urllib.error.URLError, OSError):
        return None


def _http_answers(url: str) -> bool | None:
    """True once anything answers HTTP at ``url``, an error status included."""
    try:
        with urllib.request.urlopen(url, timeout=3):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return None


# --- the stack -----------------------------------------------------------------------------------


class GpuStack:
    """kwok, KAI-Scheduler, kube-scheduler, kube-controller-manager (and cluster-autoscaler)."""

    def __init__(
        self,
        control_plane: ControlPlane,
        bin_dir: Path,
        *,
        start_timeout: float = 90.0,
    ) -> None:
        self.control_plane = control_plane
        self.bin_dir = bin_dir
        self.root = bin_dir.parent  # crds/ and stages/ are beside bin/
        self.start_timeout = start_timeout
        self.workdir = Path(tempfile.mkdtemp(prefix="fracpilot-gpu-stack-"))
        self.kubeconfig = control_plane.write_kubeconfig(self.workdir / "kubeconfig")
        self.webhook_port = 0
        self.components: dict[str, ServerProcess] = {}
        self._api: client.ApiClient | None = None
        self._dynamic: Any = None

    # lifecycle

    def __enter__(self) -> GpuStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def api(self) -> client.ApiClient:
        if self._api is None:
            self._api = self.control_plane.admin_client()
        return self._api

    def start(self) -> GpuStack:
        try:
            self._apply_kai_crds()
            self.apply_manifest(RECIPE_DIR / "manifests" / "kai-setup.yaml")
            self._start_kwok()
            self._start_kube_components()
            self._start_kai()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every component (newest first: CA deletes the nodes it made), then clean up."""
        for component in reversed(list(self.components.values())):
            component.stop(10.0)
        self.components.clear()
        if self._api is not None:
            self._api.close()  # type: ignore[no-untyped-call]
            self._api = self._dynamic = None
        if os.environ.get("FRACPILOT_K8S_KEEP"):
            print(f"kept GPU stack directory {self.workdir}", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tails(self, lines: int = 15) -> str:
        """The last log lines of every component, for a failing test's message."""
        return "\n".join(c.log_report(lines) for c in self.components.values())

    # objects

    def apply_manifest(self, path: Path) -> None:
        """Server-side apply every document of a YAML file (any kind, CRDs included).

        Retried for a while (apply is idempotent): a kind whose CRD was just established can
        be missing from discovery for a moment.
        """
        objects = [d for d in yaml.safe_load_all(path.read_text()) if d]

        def applied() -> bool:
            self.apply_objects(objects)
            return True

        wait_for(applied, timeout=30, what=f"apply {path}")

    @property
    def dynamic(self) -> Any:
        """A DynamicClient: objects as plain dicts, any kind (CRDs included)."""
        if self._dynamic is None:
            self._dynamic = dynamic.DynamicClient(self.api)  # type: ignore[no-untyped-call]
        return self._dynamic

    def create(self, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        created: dict[str, Any] = resource.create(body=obj, namespace=namespace).to_dict()
        return created

    def get(
        self, kind: str, name: str, namespace: str | None = None, api_version: str = "v1"
    ) -> dict[str, Any]:
        resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
        found: dict[str, Any] = resource.get(name=name, namespace=namespace).to_dict()
        return found

    def items(
        self, kind: str, namespace: str | None = None, selector: str = "", api_version: str = "v1"
    ) -> list[dict[str, Any]]:
        """Objects of ``kind`` (in ``namespace``, matching the label ``selector``)."""
        resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
        items = resource.get(namespace=namespace, label_selector=selector).to_dict()["items"]
        return list(items)

    def apply_objects(self, objects: Sequence[dict[str, Any]]) -> None:
        dyn = self.dynamic
        for obj in objects:
            resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            dyn.server_side_apply(
                resource,
                body=obj,
                name=obj["metadata"]["name"],
                namespace=obj["metadata"].get("namespace"),
                field_manager="fracpilot-tests",
                force_conflicts=True,
            )

    def create_gpu_node(
        self,
        name: str,
        *,
        gpus: int = 4,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, str]] = (),
    ) -> str:
        """A kwok node with ``gpus`` H100s (the labels KAI reads), ``labels`` and ``taints``
        added (kwok's own taint is always there); returns when it is Ready."""
        node_labels = {
            "type": "kwok",
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.memory": "81559",
            "nvidia.com/gpu.count": str(gpus),
            **(labels or {}),
        }
        resources = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": node_labels,
            },
            "spec": {"taints": [KWOK_TAINT, *(dict(t) for t in taints)]},
            "status": {"allocatable": resources, "capacity": resources},
        }
        self.create(node)
        self.wait_node_ready(name)
        return name

    def wait_node_ready(self, name: str, timeout: float = 60.0) -> None:
        """Ready (kwok) and without the not-ready taint (kube-controller-manager / kwok stage)."""

        def ready() -> bool | None:
            node = self.get("Node", name)
            conditions = {c["type"]: c["status"] for c in node["status"].get("conditions") or []}
            taints = {t["key"] for t in node["spec"].get("taints") or []}
            ok = conditions.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints
            return True if ok else None

        self.wait(ready, f"node {name} Ready and untainted", timeout)

    def wait(self, probe: Callable[[], Any], what: str, timeout: float) -> Any:
        """:func:`wait_for` that fails fast when a component died, with their logs on timeout."""
        components = list(self.components.values())
        return wait_until_ready(probe, components, timeout=timeout, interval=0.5, what=what)

    # set-up steps

    def _apply_kai_crds(self) -> None:
        crds = sorted((self.root / "crds").glob("*.yaml"))
        if not crds:
            raise GpuStackError(f"no KAI CRDs in {self.root / 'crds'}")
        for path in crds:
            self.apply_manifest(path)
        names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in crds]

        def established() -> bool | None:
            for name in names:
                crd = self.get(
                    "CustomResourceDefinition", name, api_version="apiextensions.k8s.io/v1"
                )
                conditions = crd.get("status", {}).get("conditions") or []
                if not any(
                    c["type"] == "Established" and c["status"] == "True" for c in conditions
                ):
                    return None
            return True

        wait_for(established, timeout=self.start_timeout, what="KAI CRDs established")

    def _start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready: Callable[[], bool | None] | None = None,
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        # Its own process group: stop() reaches any children.
        component = ServerProcess(name, self.workdir / f"{name}.log", process_group=True)
        self.components[name] = component
        component.start(
            [str(self.bin_dir / argv[0]), *argv[1:]],
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig), **(env or {})},
        )
        if ready is not None:
            self.wait(ready, f"{name} ready", self.start_timeout)
        return component

    def _probe_addr(self, *, checks: bool = True) -> tuple[str, Callable[[], bool | None]]:
        """A controller-runtime --health-probe-bind-address and a readiness probe on it.

        With ``checks`` the command registers a readyz check (KAI admission: the webhook server
        started), so /readyz must answer 200; without (binder, podgrouper register none, and
        /readyz is 404) the probe server answering at all means the manager has started.
        """
        addr = f"127.0.0.1:{free_port()}"
        if checks:
            return addr, functools.partial(_http_ok, f"http://{addr}/readyz")
        return addr, functools.partial(_http_answers, f"http://{addr}/readyz")

    def _start_kwok(self) -> None:
        stages = sorted((self.root / "stages").glob("*.yaml"))
        stages += sorted((RECIPE_DIR / "kwok").glob("*.yaml"))  # ours: see their comments
        self._start(
            "kwok",
            [
                "kwok",
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{free_port()}",
                *(f"--config={s}" for s in stages),
            ],
        )

    def _start_kube_components(self) -> None:
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certs; only /healthz is read
        kc = str(self.kubeconfig)
        for name in ("kube-scheduler", "kube-controller-manager"):
            port = free_port()
            argv = [
                name,
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
            ]
            if name == "kube-controller-manager":
                argv.append(f"--cert-dir={self.workdir / 'kcm-certs'}")
            else:
                argv.append(f"--cert-dir={self.workdir / 'scheduler-certs'}")
            url = f"https://127.0.0.1:{port}/healthz"
            self._start(name, argv, ready=functools.partial(_http_ok, url, insecure))

    def _start_kai(self) -> None:
        # admission: controller-runtime reads tls.crt/tls.key from $TMPDIR/k8s-webhook-server/
        # serving-certs (KAI cmd/admission/app/app.go: webhook.NewServer with only a port).
        tmpdir = self.workdir / "admission-tmp"
        certs = tmpdir / "k8s-webhook-server" / "serving-certs"
        certs.mkdir(parents=True)
        serving = issue_loopback_serving_cert(dt.datetime.now(dt.UTC))
        (certs / "tls.crt").write_bytes(serving.cert_pem)
        (certs / "tls.key").write_bytes(serving.key_pem)
        self.webhook_port = free_port()
        probe, ready = self._probe_addr()
        self._start(
            "kai-admission",
            [
                "kai-admission",
                f"--webhook-addr={self.webhook_port}",
                "--gpu-sharing-enabled=true",
                "--gpu-pod-runtime-class-name=",  # else pods ask for a `nvidia` RuntimeClass
                "--metrics-bind-address=0",
                f"--health-probe-bind-address={probe}",
            ],
            ready=ready,
            env={"TMPDIR": str(tmpdir)},
        )
        self.apply_objects(kai_webhook_configurations(self.webhook_port, serving.ca_pem))
        probe, ready = self._probe_addr(checks=False)
        self._start(
            "kai-binder",
            [
                "kai-binder",
                "--fake-gpu-nodes",  # no NVML: GPU UUIDs come from kwok's reservation stage
                "--resource-reservation-allocation-timeout=40",
                "--metrics-bind-address=0",
                f"--health-probe-bind-address={probe}",
            ],
            ready=ready,
        )
        probe, ready = self._probe_addr(checks=False)
        self._start(
            "kai-podgrouper",
            ["kai-podgrouper", "--metrics-bind-address=0", f"--health-probe-bind-address={probe}"],
            ready=ready,
        )
        metrics = f"127.0.0.1:{free_port()}"
        self._start(
            "kai-scheduler",
            [
                "kai-scheduler",
                f"--scheduler-name={KAI_SCHEDULER}",
                f"--listen-address={metrics}",
                f"--plugin-server-port={free_port()}",
            ],
            ready=lambda: _http_ok(f"http://{metrics}/metrics"),
        )
        self._start_scale_adjuster()

    def _start_scale_adjuster(self) -> None:
        """KAI's nodescaleadjuster, as a production install runs it: a pending fraction pod (no
        GPU resource request, invisible to CA) gets a 1-GPU scaling pod in kai-scale-adjust
        (KAI pkg/nodescaleadjuster/scale_adjuster/scale_adjuster.go ``getUnschedulablePods``
        checks no condition, so every fraction pod gets one until it is bound, however briefly).

        Upstream has no flag for its metrics address (controller-runtime's default :8080, as
        KAI's podgroupcontroller): ours is built from scripts/gpu-stack/kai/cmd/
        nodescaleadjuster, KAI's main plus ``--metrics-bind-address``; it has no probe server,
        so /metrics answering says the manager started.
        """
        metrics = f"127.0.0.1:{free_port()}"
        self._start(
            "kai-nodescaleadjuster",
            ["kai-nodescaleadjuster", f"--metrics-bind-address={metrics}"],
            ready=lambda: _http_ok(f"http://{metrics}/metrics"),
        )

    def start_queue_controllers(self) -> None:
        """Start KAI's podgroupcontroller and queuecontroller (stop them with
        :meth:`stop_queue_controllers`).

        A Queue's ``status.allocated`` is the sum of its PodGroups' ``status.resourcesStatus.
        allocated`` (KAI pkg/queuecontroller/controllers/resource_updater/resource_updater.go),
        which the podgroupcontroller writes; neither runs by default. Upstream's
        podgroupcontroller binds :8080 whatever ``--metrics-bind-address`` says
        (cmd/podgroupcontroller/app/app.go passes no ``Metrics`` options to the manager), as
        nodescaleadjuster does; ours (scripts/gpu-stack/kai/cmd/podgroupcontroller) makes the
        flag work, so both run beside each other. Their webhooks are not registered.
        """
        probe, ready = self._probe_addr()
        self._start(
            "kai-podgroupcontroller",
            [
                "kai-podgroupcontroller",
                "--enable-podgroup-webhook=false",
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--health-probe-bind-address={probe}",
            ],
            ready=ready,
        )
        metrics = f"127.0.0.1:{free_port()}"
        self._start(
            "kai-queuecontroller",
            [
                "kai-queuecontroller",
                "--enable-webhook=false",
                f"--metrics-listen-address={metrics}",
            ],
            ready=lambda: _http_ok(f"http://{metrics}/metrics"),
        )

    def stop_queue_controllers(self) -> None:
        for name in ("kai-queuecontroller", "kai-podgroupcontroller"):
            if component := self.components.pop(name, None):
                component.stop()

    def start_autoscaler(self, extra_args: Sequence[str] = ()) -> None:
        """Start cluster-autoscaler (node group gpu-h100, 0-3 nodes), as a production install
        runs it beside KAI's nodescaleadjuster (always running here); ``extra_args``: more
        flags (a test's short scale-down times).

        KAI's binder reserves no GPU while a scaling pod's PodScheduled is not True (KAI
        pkg/binder/binding/resourcereservation/resource_reservation.go ``isScalingUp``): see
        docs/backends.md for what fracpilot does about a scaling pod left bound but marked
        unschedulable.
        """
        self.apply_manifest(RECIPE_DIR / "manifests" / "ca-kwok-config.yaml")
        port = free_port()
        self._start(
            "cluster-autoscaler",
            [
                "cluster-autoscaler",
                "--cloud-provider=kwok",
                f"--kubeconfig={self.kubeconfig}",
                f"--address=127.0.0.1:{port}",
                "--scan-interval=5s",
                "--max-node-provision-time=4m",  # fracpilot_on_stack.py waits longer (300 s)
                "--leader-elect=false",
                *extra_args,
            ],
            ready=lambda: _http_ok(f"http://127.0.0.1:{port}/health-check"),
            env={"KWOK_PROVIDER_MODE": "local", "POD_NAMESPACE": "kube-system"},
        )

    def stop_autoscaler(self) -> None:
        """Stop it again; cluster-autoscaler's kwok provider deletes the nodes it added."""
        if component := self.components.pop("cluster-autoscaler", None):
            component.stop()


def kai_webhook_configurations(port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """KAI's admission webhooks as its operator registers them, at https://127.0.0.1:<port>.

    From KAI pkg/operator/operands/admission/resources.go (mutatingWCForKAIConfig,
    validatingWCForKAIConfig, buildWebhookSelectors with the default Config: every namespace
    but kube-system and kai-scheduler, no pod selector) and pkg/apis/kai/v1/admission (names).
    """
    ca_bundle = base64.b64encode(ca_pem).decode()
    namespaces = {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", "kai-scheduler"],
            }
        ]
    }

    def hook(path: str, operations: list[str], **extra: str) -> dict[str, Any]:
        return {
            "name": "admission.run.ai",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "clientConfig": {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": ca_bundle,
            },
            "namespaceSelector": namespaces,
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": operations,
                    "resources": ["pods"],
                    "scope": "Namespaced",
                }
            ],
            **extra,
        }

    api = "admissionregistration.k8s.io/v1"
    return [
        {
            "apiVersion": api,
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "mutating-kai-admission"},
            "webhooks": [hook("/mutate--v1-pod", ["CREATE"], reinvocationPolicy="IfNeeded")],
        },
        {
            "apiVersion": api,
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "validating-kai-admission"},
            "webhooks": [hook("/validate--v1-pod", ["CREATE", "UPDATE"])],
        },
    ]


# --- pods as tests write them --------------------------------------------------------------------


def kai_pod(
    name: str,
    *,
    fraction: str | None = None,
    gpus: int | None = None,
    queue: str = DEFAULT_QUEUE,
    cpu: str = "100m",
) -> dict[str, Any]:
    """A pod for KAI: in ``queue``, a ``gpu-fraction`` annotation or ``gpus`` whole GPUs."""
    resources: dict[str, Any] = {"requests": {"cpu": cpu}}
    if gpus is not None:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    metadata: dict[str, Any] = {"name": name, "labels": {QUEUE_LABEL: queue}}
    if fraction is not None:
        metadata["annotations"] = {GPU_FRACTION: fraction}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "schedulerName": KAI_SCHEDULER,
            "tolerations": [{**KWOK_TAINT, "operator": "Equal"}],
            "containers": [
                {"name": "main", "image": "example.invalid/gpu-job", "resources": resources}
            ],
        },
    }
