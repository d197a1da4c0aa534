"""KAI's BindRequests and Queues in the actuator's watch-fed cache, on a real kube-apiserver.

With KAI's CRDs applied (tests/integration/k8s/crds, vendored from NVIDIA/KAI-scheduler), a
Queue and a BindRequest created after the cache started are delivered by its watches and a
decision reads them without a list call: every HTTP request the actuator's client sends is
recorded (``ApiClient.call_api``), and the same decision without the cache shows that the
record does see the lists. A custom resource the API server does not serve (or stops serving)
is not asked for in a loop: it reads as "not served" and is asked again after a pause.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client

from factories import decision
from fracpilot_actuator.actuation import Actuation
from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.backend import KubernetesBackend
from fracpilot_actuator.kube.cache import CrdWatch
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_actuator.settings import OptInSettings
from fracpilot_actuator.stores.memory import MemoryTargetStore
from fracpilot_libs.contracts import FractionDecision, Outcome, WorkloadRef, utcnow
from helpers import wait_for
from support import kai_objects
from support.policy_crds import install_crds

pytestmark = pytest.mark.integration

KAI_PATHS = ("/apis/scheduling.run.ai/v2/queues", "/bindrequests")


@pytest.fixture(scope="module")
def kai_crds(kube_admin: client.ApiClient) -> None:
    kai_objects.install_kai_crds(kube_admin)


class RecordingClient:
    """An API client of its own that records each request's method and URL (with query)."""

    def __init__(self, admin: client.ApiClient) -> None:
        self.api = client.ApiClient(admin.configuration)
        self.requests: list[tuple[str, str]] = []
        call = self.api.call_api

        def recorded(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            self.requests.append((method, url))
            return call(method, url, *args, **kwargs)

        self.api.call_api = recorded  # type: ignore[method-assign]

    def kai_lists(self) -> list[str]:
        """GETs of BindRequests or Queues that are not watches."""
        return [
            url
            for method, url in list(self.requests)
            if method == "GET"
            and any(p in url.split("?")[0] for p in KAI_PATHS)
            and "watch=true" not in url.lower()
        ]


@pytest.fixture
def recording(kube_admin: client.ApiClient) -> Iterator[RecordingClient]:
    made = RecordingClient(kube_admin)
    yield made
    made.api.close()


def set_up(api: client.ApiClient, ns: str, queue: str) -> tuple[str, str, WorkloadRef]:
    """A full queue (0.2 GPU left), Deployment chat's two pods at 0.25 in it on one GPU group
    and a third pod KAI has chosen the group for (its BindRequest), not bound yet."""
    kai_objects.queue(api, queue, quota=1, limit=1, allocated={"gpu": "800m"})
    node, gpu, workload = kai_objects.chat_sharing_a_gpu(api, ns, queue)
    kai_objects.pending_pod(client.CoreV1Api(api), ns, "late-0")
    kai_objects.bind_request(api, ns, "late-0", node, f"g-{ns}")
    return node, gpu, workload


def grow(workload: WorkloadRef, new: float) -> FractionDecision:
    made = decision(
        0.25, new, name="chat", decision_id=f"d-{uuid.uuid4().hex[:8]}", decided_at=utcnow()
    )
    return made.model_copy(update={"workload": workload})


@pytest.mark.usefixtures("kai_crds")
@pytest.mark.parametrize("inventory_cache", [True, False])
def test_kai_objects_made_after_start_are_read_from_the_cache_without_a_list(
    kube_admin: client.ApiClient,
    kube_namespace: str,
    recording: RecordingClient,
    inventory_cache: bool,
) -> None:
    ns = kube_namespace
    queue = f"full-{ns}"
    settings = KubeBackendSettings(
        cluster="test",
        node_selector=f"fracpilot.io/test={ns}",
        inventory_cache=inventory_cache,
        opt_in=OptInSettings(default_mode="auto"),
    )

    async def report(_decision: FractionDecision, _actuation: Actuation) -> None:
        pass

    async def run() -> tuple[Any, Actuation, list[str]]:
        backend = KubernetesBackend(
            KubeApi(recording.api), MemoryTargetStore(), settings, report, instance="kai-cache"
        )
        await backend.start(utcnow())
        try:
            cache = backend.cache
            assert (cache is not None) is inventory_cache
            # Made after the watches started: only they can bring them.
            node, gpu, workload = set_up(kube_admin, ns, queue)
            if cache is not None:

                def delivered() -> bool:
                    queues = cache.kai_objects("queues")
                    requests = cache.kai_objects("bindrequests")
                    pods = {p["metadata"]["name"] for p in cache.snapshot().pods}
                    return (
                        queues is not None
                        and requests is not None
                        and any(
                            q["metadata"]["name"] == queue and q.get("status")
                            for q in queues.items or ()
                        )
                        and any(
                            r["metadata"]["name"] == "late-0" and r["metadata"]["namespace"] == ns
                            for r in requests.items or ()
                        )
                        and {"chat-0", "chat-1", "late-0"} <= pods
                    )

                await wait_for(delivered, timeout=20)
            recording.requests.clear()
            view = await backend.observe(workload)
            now = utcnow() + timedelta(minutes=10)  # past the guardrails' settle time
            held = await backend.actuate(grow(workload, 0.5), dry_run="", now=now)
            return (view, node, gpu), held, recording.kai_lists()
        finally:
            backend.close()

    (view, node, gpu), held, lists = asyncio.run(run())
    # The BindRequest counts the unbound pod on its node's GPU; the Queue holds the upsize.
    late = view.inventory.pods[f"{ns}/late-0"]
    assert (late.node, late.share.gpu_uuid if late.share else None) == (node, gpu)
    assert view.queues is not None
    assert view.queues[queue].allocated == pytest.approx(0.8)
    assert (held.outcome, held.held_back) == (Outcome.DRY_RUN, "queue_limit"), held.detail
    if inventory_cache:
        assert lists == []
    else:  # the record sees lists: one of each per read (observe, then the decision)
        assert len([u for u in lists if "/queues" in u]) == 2, lists
        assert len([u for u in lists if "/bindrequests" in u]) == 2, lists


def throwaway_crd(api: client.ApiClient, group: str) -> dict[str, Any]:
    doc = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    install_crds(api, [doc])
    return doc


def test_a_resource_not_served_is_asked_again_after_a_pause_not_in_a_loop(
    kube_admin: client.ApiClient,
) -> None:
    group = f"w{uuid.uuid4().hex[:8]}.fracpilot.test"
    custom = client.CustomObjectsApi(kube_admin)
    ext = client.ApiextensionsV1Api(kube_admin)
    lister = lambda **kw: custom.list_cluster_custom_object(group, "v1", "widgets", **kw)  # noqa: E731

    async def run() -> None:
        changes: list[None] = []

        def watch(retry_s: float) -> CrdWatch:
            made = CrdWatch(
                "widgets",
                lister,
                resync_s=60,
                timeout_s=10.0,
                retry_s=retry_s,
                retry_max_s=retry_s,
                on_change=lambda: changes.append(None),
            )
            made.start()
            return made

        # Not served: one ask, then quiet for the pause (a retrying informer would relist).
        patient = watch(retry_s=3600.0)
        await asyncio.wait_for(patient.settled.wait(), 10)
        assert (patient.state, patient.items) == ("absent", None)
        await asyncio.sleep(1.5)
        assert (patient.probes, patient.informer.relists) == (1, 0)
        patient.stop()

        # Served later: picked up at the next ask; removed again: emptied, asked again.
        eager = watch(retry_s=0.2)
        await asyncio.wait_for(eager.settled.wait(), 10)
        assert eager.state == "absent"
        await asyncio.to_thread(throwaway_crd, kube_admin, group)
        custom.create_cluster_custom_object(
            group,
            "v1",
            "widgets",
            {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "one"}},
        )
        await wait_for(
            lambda: [i["metadata"]["name"] for i in eager.items or ()] == ["one"], timeout=30
        )
        assert eager.state == "served"
        ext.delete_custom_resource_definition(f"widgets.{group}")
        await wait_for(lambda: eager.state == "absent", timeout=30)
        assert eager.items is None
        assert eager.informer.store == {}
        eager.stop()

    asyncio.run(run())
