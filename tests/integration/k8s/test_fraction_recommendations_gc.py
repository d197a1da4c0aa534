"""A FractionRecommendation goes with its workload: Kubernetes' own garbage collector (the
kube-controller-manager of the GPU stack's testbin, only its garbagecollector controller)
deletes it through the ownerReference the writer sets, on a control plane of its own (the
collector would act on the session's other tests' objects, whose owners are often made up).
"""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from factories import decision
from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.policy_sync.recommendations import RecommendationWriter
from fracpilot_libs.contracts import Outcome, PlanKind, WorkloadRef, utcnow
from fracpilot_libs.kube.policy_crd import GROUP, VERSION
from fracpilot_libs.kube.recommendation_crd import PLURAL
from fracpilot_libs.server_process import ServerProcess, free_port
from k8s_control_plane import ControlPlane, wait_for
from support import kube as objects
from support.gpu_stack import ensure_gpu_stack_testbin
from support.policy_crds import install_crds

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def collected() -> Iterator[ControlPlane]:
    """A control plane with the garbage collector running against it.

    The CRDs are there before the collector starts: it watches the kinds discovery shows it
    at start, and looks again only every 30 s (kube-controller-manager v1.35.4,
    cmd/kube-controller-manager/app/core.go, ``garbageCollectorController.Run``'s
    ``syncPeriod``), which a test installing them later would wait for."""
    bin_dir = ensure_gpu_stack_testbin()
    with ControlPlane() as plane:
        with plane.admin_client() as admin:
            install_crds(admin)
        kubeconfig = plane.write_kubeconfig()
        port = free_port()
        kcm = ServerProcess(
            "kube-controller-manager", plane.workdir / "kcm.log", process_group=True
        )
        kcm.start(
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--controllers=garbagecollector",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={plane.workdir / 'kcm-certs'}",
            ]
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its self-signed serving cert; /healthz only

        def healthy() -> bool | None:
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/healthz", context=insecure, timeout=2
                ) as r:
                    return r.status == 200 or None
            except OSError:
                return None

        try:
            wait_for(healthy, timeout=60, what="kube-controller-manager healthy")
            yield plane
        finally:
            kcm.stop(15.0)


async def test_the_recommendation_is_deleted_with_its_workload(collected: ControlPlane) -> None:
    with collected.admin_client() as admin:
        core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
        ns = "gc"
        objects.ensure_namespace(core, ns)
        objects.deployment(apps, ns, "chat")
        writer = RecommendationWriter(KubeApi(admin), CollectorRegistry())
        made = decision(
            current=0.5,
            new=0.25,
            workload=WorkloadRef(cluster="test", namespace=ns, owner_name="chat"),
            decided_at=utcnow(),
        )
        held = Actuation(plan=PlanKind.IN_PLACE, outcome=Outcome.DRY_RUN, detail="recommend")
        assert await writer.write(made, held) == "created"
        custom = client.CustomObjectsApi(admin)

        def there() -> bool:
            try:
                custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "deployment-chat")
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            return True

        assert there()
        await asyncio.sleep(2.0)  # the collector leaves an owned object whose owner is there
        assert there()
        apps.delete_namespaced_deployment("chat", ns)
        wait_for(lambda: (not there()) or None, timeout=60, what="the recommendation collected")
