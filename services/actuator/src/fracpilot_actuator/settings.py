"""Every setting of the actuator: :class:`ActuatorSettings` (read from ``FRACPILOT_*``) and its
groups, whose environment names share a prefix.

A group ``kube`` with a field ``timeout_s`` reads ``FRACPILOT_KUBE_TIMEOUT_S`` (the base
settings' nested delimiter), so every environment name is what it was when they were flat.
Each group goes whole to the component that uses it; the pure modules take them as values
(this module imports pydantic and the libs' pure settings only). ``FRACPILOT_KAI_*`` is
:class:`fracpilot_libs.kai.KaiSettings`, shared with the ingest.

Not here, because they are not read from the environment: the values the service builds from
these for one component, next to the logic that reads them
(:class:`fracpilot_actuator.guardrails.GuardrailSettings`,
:class:`fracpilot_actuator.kube.settings.KubeBackendSettings`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from fracpilot_actuator.guardrails import GuardrailSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.kai import SCALE_ADJUST_NAMESPACE as KAI_SCALE_ADJUST_NAMESPACE
from fracpilot_libs.kai import KaiSettings

ClusterKind = Literal["simulated", "kubernetes"]
"""Where decisions are carried out (``FRACPILOT_BACKEND``)."""
CLUSTER_KINDS: tuple[ClusterKind, ...] = ("simulated", "kubernetes")


class KubeApiSettings(BaseModel):
    """``FRACPILOT_KUBE_*``: how the Kubernetes API is called (backend=kubernetes)."""

    timeout_s: float = Field(default=30.0, gt=0, description="how long one API call may take")
    retry_attempts: int = Field(
        default=5,
        ge=1,
        description="tries of an API call answered 429 or 5xx or not answered, first included",
    )
    retry_backoff_s: float = Field(
        default=0.2, gt=0, description="first wait before an API call is tried again (doubles)"
    )
    retry_backoff_max_s: float = Field(
        default=5.0, gt=0, description="longest wait before an API call is tried again"
    )


class EvictionSettings(BaseModel):
    """``FRACPILOT_EVICTION_*``: how patiently an eviction a PDB refuses is tried again."""

    attempts: int = Field(
        default=8, ge=1, description="attempts of an eviction a PDB refuses (429) before failing"
    )
    backoff_s: float = Field(
        default=1.0, gt=0, description="first wait between eviction attempts (doubles), seconds"
    )
    backoff_max_s: float = Field(
        default=30.0, gt=0, description="longest wait between eviction attempts, seconds"
    )


AUTOSCALER_EXPENDABLE_CUTOFF = -10
"""cluster-autoscaler's ``--expendable-pods-priority-cutoff`` default: pods below it never
cause a scale-up."""
AUTOSCALER_MAX_NODE_PROVISION_S = 900.0
"""cluster-autoscaler's ``--max-node-provision-time`` default (15 minutes)."""


class CapacitySettings(BaseModel):
    """``FRACPILOT_CAPACITY_*``: scale-ups waiting for a GPU, and their placeholder pods."""

    timeout_s: float = Field(
        default=1200.0,
        gt=0,
        description="a scale-up gives up when no capacity came this long; longer than the "
        "autoscaler's max-node-provision-time, so a node it is still provisioning is waited for",
    )
    priority: int = Field(
        default=-1,
        description="priority of the placeholder pods' PriorityClass fracpilot-capacity: above "
        "the autoscaler's expendable cutoff (else no scale-up), below real workloads'",
    )
    autoscaler_expendable_cutoff: int = Field(
        default=AUTOSCALER_EXPENDABLE_CUTOFF,
        description="the cluster-autoscaler's --expendable-pods-priority-cutoff",
    )
    autoscaler_max_node_provision_s: float = Field(
        default=AUTOSCALER_MAX_NODE_PROVISION_S,
        gt=0,
        description="the cluster-autoscaler's --max-node-provision-time, seconds",
    )
    poll_s: float = Field(
        default=10.0, gt=0, description="how often waiting scale-ups look for capacity, seconds"
    )
    namespace: str | None = Field(
        default=None,
        description="namespace of placeholder pods; unset: the actuator's own (the RBAC in "
        "deploy/rbac/actuator.yaml allows creating pods only there); never kai-scale-adjust",
    )

    @field_validator("namespace")
    @classmethod
    def _not_kai_scale_adjust(cls, value: str | None) -> str | None:
        # KAI creates no reservation pods while a pod there is pending (its nodescaleadjuster's
        # namespace), so a placeholder there would stall every fraction pod.
        if value == KAI_SCALE_ADJUST_NAMESPACE:
            raise ValueError(f"placeholders may not go to {KAI_SCALE_ADJUST_NAMESPACE}")
        return value

    @model_validator(mode="after")
    def _safe_beside_the_autoscaler(self) -> CapacitySettings:
        if self.priority <= self.autoscaler_expendable_cutoff:
            raise ValueError(
                f"placeholder priority {self.priority} is not above the autoscaler's "
                f"expendable-pods-priority-cutoff {self.autoscaler_expendable_cutoff}: "
                "it would never cause a scale-up"
            )
        if self.timeout_s <= self.autoscaler_max_node_provision_s:
            raise ValueError(
                f"capacity timeout {self.timeout_s:g} s is not longer than the autoscaler's "
                f"max-node-provision-time {self.autoscaler_max_node_provision_s:g} s"
            )
        return self


class VerifySettings(BaseModel):
    """``FRACPILOT_VERIFY_*``: how long a recreate waits for its replacement to be bound."""

    timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="a recreate is FAILED when the evicted pods' replacements are not bound "
        "to a node this long after the eviction, seconds",
    )
    corrections: int = Field(
        default=1,
        ge=0,
        description="how often a replacement born at another share than the target (the "
        "webhook was down) is recreated again, within the disruption budget",
    )


class HamiSettings(BaseModel):
    """``FRACPILOT_HAMI_*``: how HAMi's scheduler is configured (its device ConfigMap)."""

    memory_factor: int = Field(
        default=1,
        ge=1,
        description="HAMi's memoryFactor: it reads nvidia.com/gpumem as that many MiB each",
    )


class LeaseSettings(BaseModel):
    """``FRACPILOT_LEASE_*``: leader election timing."""

    duration_s: int = Field(default=15, ge=1)
    renew_deadline_s: float = Field(default=10.0, gt=0)
    renew_period_s: float = Field(default=5.0, gt=0)
    retry_period_s: float = Field(default=2.0, gt=0)


class WebhookSettings(BaseModel):
    """``FRACPILOT_WEBHOOK_*``: the admission webhook (every replica serves it)."""

    enabled: bool = Field(
        default=False, description="serve the mutating admission webhook that sizes new pods"
    )
    host: str = "0.0.0.0"
    port: int = Field(default=8443, ge=0, le=65535)
    cert_file: str = "/etc/fracpilot/webhook/tls.crt"
    key_file: str = "/etc/fracpilot/webhook/tls.key"


class PolicySyncSettings(BaseModel):
    """``FRACPILOT_POLICYSYNC_*``: FractionPolicy objects -> the policy bucket (the leader
    actuator, backend=kubernetes)."""

    enabled: bool = Field(
        default=True,
        description="sync FractionPolicy / ClusterFractionPolicy objects into the policy "
        "bucket (needs the CRDs and the RBAC the chart installs)",
    )
    resync_s: float = Field(
        default=60.0,
        gt=0,
        description="a full pass at least this often, seconds (also notices NATS policies)",
    )
    timeout_s: float = Field(default=30.0, gt=0, description="how long one API call may take")
    recommendations: Literal["off", "opted-in", "all"] = Field(
        default="opted-in",
        description="which workloads get their last decision as a FractionRecommendation "
        "object in their namespace (kubectl get fractionrecommendations -A; needs its CRD and "
        "the RBAC the chart installs): opted-in, those of namespaces labelled "
        "fracpilot.io/mode=recommend or auto (or every namespace when the default mode is "
        "auto); all, every workload not off or opted out; off, none",
    )
    recommendations_recheck_s: float = Field(
        default=600.0,
        gt=0,
        description="when the FractionRecommendation CRD is not served, how long writes stop "
        "before it is asked again, seconds",
    )


class OptInSettings(BaseModel):
    """``FRACPILOT_OPTIN_*``: the mode of a namespace without the label ``fracpilot.io/mode``,
    and the namespaces fracpilot never changes (the webhook is not called for them either)."""

    default_mode: Literal["recommend", "auto"] = Field(
        default="recommend",
        description="the mode of workloads whose pod and namespace carry no fracpilot.io/mode "
        "label: recommend (decisions are shown, nothing is applied) or auto",
    )
    excluded_namespaces: list[str] = Field(
        default_factory=lambda: ["kube-system"],
        description="namespaces whose workloads are never changed, whatever their labels say "
        "(the chart passes webhook.excludedNamespaces and its own namespace), a JSON list",
    )


def _hour_range(text: str) -> tuple[int, int]:
    start, _, end = text.partition("-")
    hours = int(start), int(end)
    if not all(0 <= h <= 23 for h in hours):
        raise ValueError(f"{text!r}: hours are 0-23")
    return hours


class ConsolidationSettings(BaseModel):
    """``FRACPILOT_CONSOLIDATION_*``: moving pods off a node so that the autoscaler removes it
    (backend=kubernetes, :mod:`fracpilot_actuator.kube.consolidation_round`)."""

    mode: Literal["off", "recommend", "auto"] = Field(
        default="recommend",
        description="off: not planned; recommend: planned and shown (would free N GPUs / M "
        "nodes), nothing moves; auto: pods opted in to auto (fracpilot.io/mode) are moved, "
        "within the limits below",
    )
    interval_s: float = Field(
        default=300.0, gt=0, description="how often a consolidation is planned, seconds"
    )
    max_moves_per_hour: int = Field(
        default=4, ge=0, description="pods moved for consolidation in any hour, at most"
    )
    quiet_hours: str = Field(
        default="",
        description='UTC hours in which no move starts, "start-end" (end excluded, may wrap: '
        '"22-6"); several as "0-6,20-24"; empty: none',
    )
    move_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="a moved pod's replacement must be bound this long after the eviction, "
        "else the node is given up (its mark taken off)",
    )

    @field_validator("quiet_hours")
    @classmethod
    def _hours(cls, value: str) -> str:
        for part in filter(None, (p.strip() for p in value.split(","))):
            try:
                _hour_range(part.replace("-24", "-0"))
            except ValueError as exc:
                raise ValueError(f"quiet hours {part!r}: {exc}") from exc
        return value

    def quiet_at(self, hour: int) -> bool:
        """Whether no move may start in this UTC hour."""
        for part in filter(None, (p.strip() for p in self.quiet_hours.split(","))):
            start, end = _hour_range(part.replace("-24", "-0"))
            if start == end:
                return True  # the whole day
            if start < end and start <= hour < end:
                return True
            if start > end and (hour >= start or hour < end):
                return True
        return False


class SimSettings(BaseModel):
    """``FRACPILOT_SIM_*``: the simulated cluster (backend=simulated)."""

    cluster: str = "demo"
    nodes: int = Field(default=2, ge=0)
    gpus_per_node: int = Field(default=2, ge=1)
    gpu_memory_gib: int = Field(default=80, ge=1)
    pods: str = Field(default="", description="seed pods: ns/name=fraction,...")
    namespace_labels: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="the simulated namespaces' labels, a JSON object (namespace -> labels); "
        'the opt-in rule reads them: {"inference": {"fracpilot.io/mode": "auto"}} opts in',
    )


class ActuatorSettings(ServiceSettings):
    backend: str = Field(
        default="simulated",
        description="cluster backend (a ClusterKind): simulated (the demo) or kubernetes; "
        "another value is refused when the service is built",
    )
    dry_run: bool = Field(default=False, description="plan and log, change nothing")
    # kubernetes backend
    kubeconfig: str | None = Field(
        default=None, description="kubeconfig file for backend=kubernetes; in-cluster if unset"
    )
    cluster: str = Field(default="default", description="cluster name in workload keys")
    gpu_node_selector: str | None = Field(
        default=None, description="label selector of the GPU nodes to plan on; unset: all"
    )
    max_disruptions: int = Field(
        default=5, ge=0, description="disruptive actions (evictions) per window, cluster-wide"
    )
    max_disruptions_per_namespace: int = Field(
        default=2, ge=0, description="disruptive actions per window and namespace"
    )
    disruption_window_s: float = Field(
        default=600.0, gt=0, description="sliding window of the two limits above, seconds"
    )
    allow_single_replica: bool = Field(
        default=False, description="whether a workload with one pod may be recreated"
    )
    eviction: EvictionSettings = Field(default_factory=EvictionSettings)
    kube: KubeApiSettings = Field(default_factory=KubeApiSettings)
    capacity: CapacitySettings = Field(default_factory=CapacitySettings)
    verify: VerifySettings = Field(default_factory=VerifySettings)
    hami: HamiSettings = Field(default_factory=HamiSettings)
    namespace: str = Field(
        default="fracpilot", description="the actuator's own namespace (its Lease, placeholders)"
    )
    leader_election: bool = Field(
        default=True, description="backend=kubernetes: only the Lease holder acts"
    )
    identity: str | None = Field(default=None, description="leader identity; the hostname")
    lease: LeaseSettings = Field(default_factory=LeaseSettings)
    placeholder_image: str = "registry.k8s.io/pause:3.10"
    default_gpu_memory_mib: int = Field(
        default=81920, gt=0, description="GPU memory of nodes without nvidia.com/gpu.memory"
    )
    targets_via: Literal["webhook", "template"] = Field(
        default="webhook",
        description="backend=kubernetes: how new pods get a workload's target: the admission "
        "webhook, or (without it) a patch of the Deployment's / StatefulSet's pod template, "
        "which starts a rollout replacing every pod",
    )
    inventory_cache: bool = Field(
        default=True,
        description="backend=kubernetes: read nodes, pods, ReplicaSets and Jobs from caches "
        "kept current by watches; false: list them for every decision",
    )
    webhook: WebhookSettings = Field(default_factory=WebhookSettings)
    policysync: PolicySyncSettings = Field(default_factory=PolicySyncSettings)
    optin: OptInSettings = Field(
        default_factory=OptInSettings,
        description="which workloads may be changed: FRACPILOT_OPTIN_DEFAULT_MODE (recommend: "
        "only namespaces or pods labelled fracpilot.io/mode=auto), "
        "FRACPILOT_OPTIN_EXCLUDED_NAMESPACES",
    )
    sim: SimSettings = Field(default_factory=SimSettings)
    consolidation: ConsolidationSettings = Field(default_factory=ConsolidationSettings)
    kai: KaiSettings = Field(
        default_factory=KaiSettings,
        description="KAI-Scheduler's set-up: FRACPILOT_KAI_RESERVATION_NAMESPACE and "
        "FRACPILOT_KAI_RESERVATION_APP_LABEL (its binder's --resource-reservation-namespace and "
        "--resource-reservation-app-label), the queue label, FRACPILOT_KAI_QUEUE_BOUND (limit or "
        "quota: how far an in-place upsize may take a queue)",
    )

    @property
    def guardrails(self) -> GuardrailSettings:
        """The guardrails' limits (flat here: their names share no prefix)."""
        return GuardrailSettings(
            max_disruptions=self.max_disruptions,
            max_disruptions_per_namespace=self.max_disruptions_per_namespace,
            window_s=self.disruption_window_s,
            allow_single_replica=self.allow_single_replica,
        )
