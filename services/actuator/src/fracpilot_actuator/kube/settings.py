"""The Kubernetes backend's settings: one value the service builds from its groups
(:mod:`fracpilot_actuator.settings`, where they are read from the environment), next to the
backend that reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fracpilot_actuator.guardrails import GuardrailSettings
from fracpilot_actuator.settings import ConsolidationSettings, EvictionSettings, OptInSettings
from fracpilot_libs.kai import KaiSettings


@dataclass(frozen=True)
class KubeBackendSettings:
    cluster: str = "default"
    """The cluster name in the WorkloadRefs of pods that no decision names."""
    node_selector: str | None = None
    """A label selector for the GPU nodes fracpilot may place pods on; None: every node."""
    default_gpu_memory_mib: int = 81920
    """GPU memory of a node without the label nvidia.com/gpu.memory (reported as a problem)."""
    hami_memory_factor: int = 1
    """HAMi's scheduler ``memoryFactor``: it reads ``nvidia.com/gpumem`` as that many MiB each."""
    eviction: EvictionSettings = field(default_factory=EvictionSettings)
    """How often and how patiently an eviction refused with 429 (a PDB allows no disruption)
    is tried again."""
    capacity_timeout_s: float = 1200.0
    """A scale-up gives up when no capacity appeared this long (longer than cluster-autoscaler's
    default max-node-provision-time, 15 minutes)."""
    placeholder_priority: int = -1
    """The placeholders' priority: above cluster-autoscaler's expendable cutoff (-10)."""
    verify_timeout_s: float = 600.0
    """A recreate is FAILED when its replacements are not bound this long after the eviction."""
    corrections: int = 1
    """How often a replacement born at the wrong share is recreated again (within the budget)."""
    capacity_namespace: str | None = None
    """Where placeholder pods go; None: the workload's namespace."""
    placeholder_image: str = "registry.k8s.io/pause:3.10"
    targets_via: Literal["webhook", "template"] = "webhook"
    """How new pods get the target: the admission webhook, or (without it) a patch of the
    workload's pod template, which starts a rollout replacing every pod."""
    guardrails: GuardrailSettings = field(default_factory=GuardrailSettings)
    inventory_cache: bool = True
    """Read nodes, pods, ReplicaSets and Jobs from a watch-fed cache; False: list them for
    every decision."""
    opt_in: OptInSettings = field(default_factory=OptInSettings)
    """The opt-in rule's settings: the default mode (recommend), the excluded namespaces."""
    kai: KaiSettings = field(default_factory=KaiSettings)
    """KAI-Scheduler's set-up (its binder's reservation flags, the queue label) and how far an
    in-place upsize may take a KAI queue."""
    cache_fence_timeout_s: float = 2.0
    """How long a decision waits for the cache to catch up with the backend's last write
    before it lists afresh."""
    consolidation: ConsolidationSettings = field(default_factory=ConsolidationSettings)
    """Emptying nodes for the autoscaler: off, recommend (the default: shown, nothing moves) or
    auto, its rate limit and quiet hours (:mod:`.consolidation_round`)."""
