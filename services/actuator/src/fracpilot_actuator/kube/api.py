"""Every Kubernetes API call the actuator makes, as awaitables over the blocking client.

Each method is one call (run in a worker thread), so this file is also the actuator's RBAC
list (verb, resource, scope):

| method | verb | resource | scope |
| --- | --- | --- | --- |
| list_nodes | list | nodes | cluster |
| list_pods | list | pods | all namespaces |
| list_owners | list | replicasets (apps), jobs (batch) | the decision's namespace |
| read_owner | get | deployments, statefulsets, replicasets, daemonsets (apps); jobs, cronjobs (batch) | namespaced |
| read_configmap | get | configmaps | namespaced (a KAI pod's GPU-sharing ConfigMap: its memory limit) |
| patch_pod_annotations | patch | pods | namespaced (in place: conditional on the pod as read) |
| patch_pod_template | patch | deployments, statefulsets (apps) | namespaced (targets_via=template) |
| evict | create | pods/eviction (policy/v1 Eviction) | namespaced |
| read_pod_version, read_pod | get | pods | namespaced (after a write: the pod as it is now) |
| create_pod / delete_pod | create / delete | pods (placeholders; KAI's stuck scaling pods) | namespaced |
| ensure_priority_class | get, create | priorityclasses (scheduling.k8s.io) | cluster |
| create_event | create | events (core/v1) | namespaced |
| list_kai_objects | list | queues, bindrequests (scheduling.run.ai) | cluster / all namespaces |

With ``inventory_cache`` on, :mod:`fracpilot_actuator.kube.cache` lists and watches nodes,
pods, ReplicaSets and Jobs (all namespaces) instead of the per-decision lists.

Lists ask for raw JSON (``_preload_content=False``): the inventory reads API dicts, and a
large pod list is not turned into client models first.

Faults (:class:`~fracpilot_actuator.kube.api_retry.ApiRetry`): a call the server answers 429 (overloaded, ``Retry-After``
honoured) or 5xx, or does not answer in ``timeout_s`` (or at all), is tried again after a
jittered, doubling wait, a bounded number of times, then the error is raised. A patch answered
409 (conflict) reads the object again and retries. Every method but :meth:`KubeApi.evict` is
safe to repeat (patches set values, creates answer 409 when the object exists, deletes and
reads are idempotent); an eviction is retried by the backend, which first checks whether an
unanswered one took effect (:meth:`KubeApi.pod_is_going`), so a pod is never evicted twice.

Errors: every client failure leaves this module as a :class:`~fracpilot_actuator.kube.errors.
TransientKubeError` (no answer, 429, 5xx) or :class:`~fracpilot_actuator.kube.errors.
PermanentKubeError` (other statuses), with the HTTP status and the server's message; the
predicates on raw client exceptions and the retry policy are in
:mod:`fracpilot_actuator.kube.api_retry`, used here only.
"""  # noqa: E501

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from fracpilot_actuator.kube.api_retry import ApiRetry, OnRetry, status_of, transient, wrapped
from fracpilot_actuator.kube.errors import KubeError

log = logging.getLogger(__name__)

T = TypeVar("T")
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


async def _run(call: Callable[[], T]) -> T:
    return await asyncio.to_thread(call)


def version_of(obj: Any) -> int | None:
    """The resourceVersion of a client object (what a write answered), as a number."""
    try:
        return int(obj.metadata.resource_version)
    except (AttributeError, TypeError, ValueError):
        return None


def _items(response: Any) -> list[dict[str, Any]]:
    body = json.loads(response.data)
    items: list[dict[str, Any]] = body.get("items") or []
    return items


class KubeApi:
    """The actuator's view of the API server; ``api`` is an authenticated ``ApiClient``."""

    def __init__(
        self,
        api: client.ApiClient,
        timeout_s: float = 30.0,
        retry: ApiRetry | None = None,
        on_retry: OnRetry | None = None,
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.scheduling = client.SchedulingV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.policy = client.PolicyV1Api(api)
        self.timeout_s = timeout_s
        self.retry = retry or ApiRetry()
        self._on_retry = on_retry

    async def _call(
        self,
        what: str,
        call: Callable[[], T],
        reread: Callable[[], Awaitable[object]] | None = None,
    ) -> T:
        """One API call, tried again on transient failures; with ``reread``, a 409 conflict
        reads the object again (``reread``) and retries as well. A failure leaves as a
        :class:`KubeError`."""
        try:
            return await self._retried(what, call, reread)
        except Exception as exc:
            raise wrapped(exc) from exc

    async def _retried(
        self,
        what: str,
        call: Callable[[], T],
        reread: Callable[[], Awaitable[object]] | None,
    ) -> T:
        conflicted = False

        def retryable(exc: BaseException) -> bool:
            return transient(exc) or (reread is not None and status_of(exc) == 409)

        def before_sleep(state: RetryCallState) -> None:
            failure = state.outcome.exception() if state.outcome else None
            reason = str(status_of(failure) or type(failure).__name__)
            log.warning(
                "API call failed, retrying",
                extra={"call": what, "reason": reason, "attempt": state.attempt_number},
            )
            if self._on_retry is not None:
                self._on_retry(what, reason)

        async for attempt in AsyncRetrying(
            retry=retry_if_exception(retryable),
            stop=stop_after_attempt(self.retry.attempts),
            wait=self.retry.wait,
            before_sleep=before_sleep,
            reraise=True,
        ):
            with attempt:
                if conflicted and reread is not None:
                    await reread()
                try:
                    return await _run(call)
                except ApiException as exc:
                    conflicted = exc.status == 409
                    raise
        raise AssertionError("unreachable: tenacity re-raises the last failure")

    # --- reads ------------------------------------------------------------------------------

    async def list_nodes(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        return _items(
            await self._call(
                "list_nodes",
                lambda: self.core.list_node(
                    label_selector=label_selector,
                    _preload_content=False,
                    _request_timeout=self.timeout_s,
                ),
            )
        )

    async def list_pods(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        return _items(
            await self._call(
                "list_pods",
                lambda: self.core.list_pod_for_all_namespaces(
                    label_selector=label_selector,
                    _preload_content=False,
                    _request_timeout=self.timeout_s,
                ),
            )
        )

    async def list_disruption_budgets(self) -> list[dict[str, Any]]:
        """Every PodDisruptionBudget (policy/v1), with its status."""
        return _items(
            await self._call(
                "list_disruption_budgets",
                lambda: self.policy.list_pod_disruption_budget_for_all_namespaces(
                    _preload_content=False, _request_timeout=self.timeout_s
                ),
            )
        )

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> int | None:
        """A merge patch of a node (consolidation's mark: a taint and an annotation), the
        patched node's resourceVersion; a ``metadata.resourceVersion`` in it makes it
        conditional (409 when the node changed)."""
        return version_of(
            await self._call(
                "patch_node",
                lambda: self.core.patch_node(
                    name, dict(patch), _content_type=MERGE_PATCH, _request_timeout=self.timeout_s
                ),
            )
        )

    async def list_owners(
        self, namespace: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The namespace's ReplicaSets and Jobs: the links from a pod to its workload."""
        replica_sets, jobs = await asyncio.gather(
            self._call(
                "list_replica_sets",
                lambda: self.apps.list_namespaced_replica_set(
                    namespace, _preload_content=False, _request_timeout=self.timeout_s
                ),
            ),
            self._call(
                "list_jobs",
                lambda: self.batch.list_namespaced_job(
                    namespace, _preload_content=False, _request_timeout=self.timeout_s
                ),
            ),
        )
        return _items(replica_sets), _items(jobs)

    async def read_owner(self, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
        """The workload object (for its opt-out label); None when it is not there or unknown."""
        readers: Mapping[str, Callable[..., Any]] = {
            "Deployment": self.apps.read_namespaced_deployment,
            "StatefulSet": self.apps.read_namespaced_stateful_set,
            "ReplicaSet": self.apps.read_namespaced_replica_set,
            "DaemonSet": self.apps.read_namespaced_daemon_set,
            "Job": self.batch.read_namespaced_job,
            "CronJob": self.batch.read_namespaced_cron_job,
        }
        reader = readers.get(kind)
        if reader is None:
            return None
        return await self._read_object("read_owner", reader, namespace, name)

    async def _read_object(
        self, what: str, reader: Callable[..., Any], namespace: str, name: str
    ) -> dict[str, Any] | None:
        """One namespaced object as API JSON; None when it is not there (404)."""
        try:
            response: Any = await self._call(
                what,
                lambda: reader(
                    name, namespace, _preload_content=False, _request_timeout=self.timeout_s
                ),
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        body: dict[str, Any] = json.loads(response.data)
        return body

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's data; None when it is not there."""
        found = await self._read_object(
            "read_configmap", self.core.read_namespaced_config_map, namespace, name
        )
        if found is None:
            return None
        data = found.get("data") or {}
        return {str(k): str(v) for k, v in data.items()}

    async def list_kai_objects(
        self, group: str, version: str, plural: str
    ) -> list[dict[str, Any]] | None:
        """KAI's Queues or BindRequests (every namespace); None when the API server does not
        serve them to us (404: KAI's CRDs are not installed; 403: no RBAC for them)."""
        try:
            return _items(
                await self._call(
                    f"list_{plural}",
                    lambda: self.custom.list_cluster_custom_object(
                        group,
                        version,
                        plural,
                        _preload_content=False,
                        _request_timeout=self.timeout_s,
                    ),
                )
            )
        except KubeError as exc:
            if exc.status in (403, 404):
                return None
            raise

    # --- writes -----------------------------------------------------------------------------

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str],
        *,
        resource_version: str = "",
        uid: str = "",
    ) -> int | None:
        """The patched pod's resourceVersion.

        With ``resource_version`` (and ``uid``) the patch is conditional: the API server
        applies it only to the pod as it was read (a merge patch that names them is checked
        against the stored object) and answers 409 otherwise; such a conflict is not retried
        here, since the caller's judgement was made on the pod as it was."""
        metadata: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        if uid:
            metadata["uid"] = uid
        conditional = bool(resource_version or uid)
        return version_of(
            await self._call(
                "patch_pod_annotations",
                lambda: self.core.patch_namespaced_pod(
                    name,
                    namespace,
                    {"metadata": metadata},
                    _content_type=MERGE_PATCH,
                    _request_timeout=self.timeout_s,
                ),
                reread=None if conditional else lambda: self.read_pod_version(namespace, name),
            )
        )

    async def patch_pod_template(
        self, namespace: str, kind: str, name: str, ops: list[dict[str, Any]]
    ) -> None:
        """Apply a JSON patch (paths under ``/spec/template``) to a Deployment or StatefulSet."""
        patchers: Mapping[str, Callable[..., Any]] = {
            "Deployment": self.apps.patch_namespaced_deployment,
            "StatefulSet": self.apps.patch_namespaced_stateful_set,
        }
        patch = patchers[kind]
        await self._call(
            "patch_pod_template",
            lambda: patch(
                name, namespace, ops, _content_type=JSON_PATCH, _request_timeout=self.timeout_s
            ),
            reread=lambda: self.read_owner(namespace, kind, name),
        )

    async def evict(self, namespace: str, name: str) -> None:
        """POST pods/<name>/eviction (policy/v1); a PDB that forbids it answers 429.

        Tried once: the backend decides about another try (:meth:`pod_is_going` first)."""
        body = client.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        )
        try:
            await _run(
                lambda: self.core.create_namespaced_pod_eviction(
                    name, namespace, body, _request_timeout=self.timeout_s
                )
            )
        except Exception as exc:
            raise wrapped(exc) from exc

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A pod as the API server holds it now (API JSON); None when it is not there."""
        return await self._read_object("read_pod", self.core.read_namespaced_pod, namespace, name)

    async def read_pod_version(self, namespace: str, name: str) -> int | None:
        """A pod's resourceVersion now; None when it is gone."""
        pod = await self._read_pod(namespace, name)
        return version_of(pod) if pod is not None else None

    async def pod_is_going(self, namespace: str, name: str, uid: str) -> bool:
        """Whether the pod (this very one: ``uid``) is gone or being deleted, as it is once an
        eviction took effect."""
        pod = await self._read_pod(namespace, name)
        if pod is None or (uid and pod.metadata.uid != uid):
            return True
        return pod.metadata.deletion_timestamp is not None

    async def _read_pod(self, namespace: str, name: str) -> Any:
        try:
            return await self._call(
                "read_pod",
                lambda: self.core.read_namespaced_pod(
                    name, namespace, _request_timeout=self.timeout_s
                ),
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def create_pod(self, namespace: str, body: Mapping[str, Any]) -> int | None:
        """The new pod's resourceVersion."""
        pod = client.V1Pod.model_validate(body)
        return version_of(
            await self._call(
                "create_pod",
                lambda: self.core.create_namespaced_pod(
                    namespace, pod, _request_timeout=self.timeout_s
                ),
            )
        )

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod (only fracpilot's placeholders); one already gone is fine."""
        try:
            await self._call(
                "delete_pod",
                lambda: self.core.delete_namespaced_pod(
                    name, namespace, grace_period_seconds=0, _request_timeout=self.timeout_s
                ),
            )
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def ensure_priority_class(self, name: str, value: int, description: str) -> None:
        """Create the PriorityClass when it is missing (a concurrent create is fine). One with
        another value (the chart's, or an older default) is kept, with a warning: a value
        cannot change, and the chart owns it where the chart made it."""
        try:
            found: Any = await self._call(
                "read_priority_class",
                lambda: self.scheduling.read_priority_class(name, _request_timeout=self.timeout_s),
            )
            if found.value != value:
                log.warning(
                    "the placeholders' PriorityClass has another value than configured",
                    extra={"priority_class": name, "value": found.value, "configured": value},
                )
            return
        except KubeError as exc:
            if exc.status != 404:
                raise
        body = client.V1PriorityClass(
            metadata=client.V1ObjectMeta(
                name=name, labels={"app.kubernetes.io/managed-by": "fracpilot"}
            ),
            value=value,
            global_default=False,
            preemption_policy="Never",
            description=description,
        )
        try:
            await self._call(
                "create_priority_class",
                lambda: self.scheduling.create_priority_class(
                    body, _request_timeout=self.timeout_s
                ),
            )
        except KubeError as exc:
            if exc.status != 409:
                raise

    async def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        event = client.CoreV1Event.model_validate(body)
        await self._call(
            "create_event",
            lambda: self.core.create_namespaced_event(
                namespace, event, _request_timeout=self.timeout_s
            ),
        )


def api_client(kubeconfig: str | None) -> client.ApiClient:
    """From a kubeconfig file, or in-cluster (the pod's ServiceAccount) when there is none."""
    from kubernetes import config

    if kubeconfig:
        api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        return api
    config.load_incluster_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()
