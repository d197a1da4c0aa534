"""Pod -> workload identity through a real kube-apiserver, kept current by watches.

No controllers run, so the test writes what they would: a Deployment's ReplicaSet and its
pods, a StatefulSet's pod, a CronJob's Job and its pod, each with controller owner references.
"""

from __future__ import annotations

import contextlib

import pytest
from kubernetes import client

from fracpilot_ingest.owners import KubernetesOwners
from fracpilot_libs.contracts import WorkloadRef
from helpers import wait_for

pytestmark = pytest.mark.integration


def owner_ref(kind: str, api_version: str, obj: object) -> client.V1OwnerReference:
    meta = obj.metadata  # type: ignore[attr-defined]
    return client.V1OwnerReference(
        api_version=api_version, kind=kind, name=meta.name, uid=meta.uid, controller=True
    )


def pod(namespace: str, name: str, owner: client.V1OwnerReference | None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name, namespace=namespace, owner_references=[owner] if owner else None
        ),
        spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="x")]),
    )


def selector(app: str) -> tuple[client.V1LabelSelector, dict[str, str]]:
    return client.V1LabelSelector(match_labels={"app": app}), {"app": app}


async def test_owners_resolve_through_controllers_and_follow_new_pods(
    kube_admin: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    core, apps, batch = (
        client.CoreV1Api(kube_admin),
        client.AppsV1Api(kube_admin),
        client.BatchV1Api(kube_admin),
    )
    sel, labels = selector("chat")
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels=labels),
        spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="x")]),
    )
    deploy = apps.create_namespaced_deployment(
        ns,
        client.V1Deployment(
            metadata=client.V1ObjectMeta(name="chat"),
            spec=client.V1DeploymentSpec(selector=sel, template=template),
        ),
    )
    rs = apps.create_namespaced_replica_set(
        ns,
        client.V1ReplicaSet(
            metadata=client.V1ObjectMeta(
                name="chat-6b7f9c",
                labels=labels,
                owner_references=[owner_ref("Deployment", "apps/v1", deploy)],
            ),
            spec=client.V1ReplicaSetSpec(selector=sel, template=template),
        ),
    )
    # An odd pod name: only the owner references can tell it belongs to "chat".
    core.create_namespaced_pod(ns, pod(ns, "llm-server-a", owner_ref("ReplicaSet", "apps/v1", rs)))
    ssel, slabels = selector("db")
    sts = apps.create_namespaced_stateful_set(
        ns,
        client.V1StatefulSet(
            metadata=client.V1ObjectMeta(name="vector-db"),
            spec=client.V1StatefulSetSpec(
                selector=ssel,
                service_name="db",
                template=(
                    client.V1PodTemplateSpec(
                        metadata=client.V1ObjectMeta(labels=slabels), spec=template.spec
                    )
                ),
            ),
        ),
    )
    core.create_namespaced_pod(ns, pod(ns, "vector-db-0", owner_ref("StatefulSet", "apps/v1", sts)))
    core.create_namespaced_pod(ns, pod(ns, "debug-shell", None))

    owners = KubernetesOwners(kube_admin, cluster="test", resync_s=30)
    owners.start()
    try:
        assert await owners.wait_synced(30)
        assert await owners.resolve(ns, "llm-server-a") == WorkloadRef(
            cluster="test", namespace=ns, owner_kind="Deployment", owner_name="chat"
        )
        assert (await owners.resolve(ns, "vector-db-0")).owner_name == "vector-db"
        assert (await owners.resolve(ns, "debug-shell")).owner_kind == "Pod"
        assert owners.misses == 0  # all three came from the watch cache

        # A CronJob's Job and its pod, created after the watches started.
        job_template = client.V1JobTemplateSpec(
            spec=client.V1JobSpec(
                template=(
                    client.V1PodTemplateSpec(
                        spec=client.V1PodSpec(
                            restart_policy="Never",
                            containers=[client.V1Container(name="main", image="x")],
                        )
                    )
                )
            )
        )
        cron = batch.create_namespaced_cron_job(
            ns,
            client.V1CronJob(
                metadata=client.V1ObjectMeta(name="nightly-eval"),
                spec=client.V1CronJobSpec(schedule="0 3 * * *", job_template=job_template),
            ),
        )
        job = batch.create_namespaced_job(
            ns,
            client.V1Job(
                metadata=client.V1ObjectMeta(
                    name="nightly-eval-29001",
                    owner_references=[owner_ref("CronJob", "batch/v1", cron)],
                ),
                spec=job_template.spec,
            ),
        )
        core.create_namespaced_pod(
            ns, pod(ns, "nightly-eval-29001-xk2p9", owner_ref("Job", "batch/v1", job))
        )
        pending = (ns, "nightly-eval-29001-xk2p9")
        with contextlib.suppress(TimeoutError):  # not there in time: the miss count says so
            await wait_for(lambda: owners.pods.get(pending) is not None, timeout=10)
        resolved = await owners.resolve(ns, "nightly-eval-29001-xk2p9")
        assert (resolved.owner_kind, resolved.owner_name) == ("CronJob", "nightly-eval")
        assert owners.misses == 0  # the watch delivered the new pod before it was asked for

        # A pod the API does not know falls back to the naming conventions.
        guessed = await owners.resolve(ns, "ghost-5c8d9f7b6-q2w4x")
        assert (guessed.owner_kind, guessed.owner_name) == ("Deployment", "ghost")
        assert owners.misses == 1
        again = await owners.resolve(ns, "ghost-5c8d9f7b6-q2w4x")
        assert again == guessed
        assert owners.misses == 1  # the miss is remembered: not read again
    finally:
        owners.stop()
